"""Llama-2 architectures: :class:`LlamaConfig` and the three published sizes.

From Touvron et al., "Llama 2: Open Foundation and Fine-Tuned Chat Models" (2023), Table 1 and
the released model configs (hidden size, FFN size, heads, layers, vocabulary 32000;
grouped-query attention with 8 KV heads for 70B).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family decoder. Sizes are element counts."""

    name: str
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    vocab_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def param_count(self) -> int:
        """Parameters: embedding, LM head, per layer attention + SwiGLU MLP + 2 norms, final norm."""
        h, d = self.hidden_size, self.head_dim
        attn = h * h * 2 + 2 * h * self.num_kv_heads * d
        mlp = 3 * h * self.ffn_hidden_size
        return 2 * self.vocab_size * h + self.num_layers * (attn + mlp + 2 * h) + h


LLAMA2_7B = LlamaConfig("llama-2-7b", 4096, 11008, 32, 32, 32, 32000)
LLAMA2_13B = LlamaConfig("llama-2-13b", 5120, 13824, 40, 40, 40, 32000)
LLAMA2_70B = LlamaConfig("llama-2-70b", 8192, 28672, 64, 8, 80, 32000)
