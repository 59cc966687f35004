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
    #: Attention head size when it is not ``hidden_size // num_heads`` (Qwen3's ``head_dim``).
    head_size: int | None = None
    #: RMSNorm over each query and key head before RoPE (Qwen3's ``q_norm``/``k_norm``).
    qk_norm: bool = False
    #: The LM head shares the embedding's weights (``tie_word_embeddings``). With pipeline
    #: parallelism the last stage keeps a copy and Megatron all-reduces the two copies'
    #: gradients over its embedding group each step; the parameter counts count both copies.
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.head_size if self.head_size is not None else self.hidden_size // self.num_heads

    @property
    def param_count(self) -> int:
        """Parameters: embedding, LM head, per layer attention + SwiGLU MLP + 2 norms (+ the query
        and key norms), final norm."""
        h, d = self.hidden_size, self.head_dim
        attn = 2 * h * self.num_heads * d + 2 * h * self.num_kv_heads * d
        mlp = 3 * h * self.ffn_hidden_size
        norms = 2 * h + (2 * d if self.qk_norm else 0)
        return 2 * self.vocab_size * h + self.num_layers * (attn + mlp + norms) + h


LLAMA2_7B = LlamaConfig("llama-2-7b", 4096, 11008, 32, 32, 32, 32000)
LLAMA2_13B = LlamaConfig("llama-2-13b", 5120, 13824, 40, 40, 40, 32000)
LLAMA2_70B = LlamaConfig("llama-2-70b", 8192, 28672, 64, 8, 80, 32000)
#: Qwen3-0.6B (huggingface.co/Qwen/Qwen3-0.6B config.json: hidden_size 1024, intermediate_size
#: 3072, 16 heads, 8 KV heads, head_dim 128, 28 layers, vocab_size 151936, tie_word_embeddings
#: true; Qwen3's q_norm/k_norm in transformers' modeling_qwen3.py). The model of the real
#: pp2 x dp2 Level2 profile (tests/data/realdata/ascend-msinsight-llm-pp2dp2-level2-rank0).
QWEN3_0_6B = LlamaConfig("qwen3-0.6b", 1024, 3072, 16, 8, 28, 151936, head_size=128, qk_norm=True,
                         tie_word_embeddings=True)

# Llama-family decoders of other published 910B training runs (simulator/data/published_layouts.json),
# sizes as the runs' launch scripts set them (--hidden-size, --ffn-hidden-size, --num-attention-heads,
# --num-query-groups, --num-layers, the padded vocabulary), which are those of the released config.json.
#: Meta-Llama-3-8B (huggingface.co/meta-llama/Meta-Llama-3-8B config.json: hidden_size 4096,
#: intermediate_size 14336, 32 heads, 8 KV heads, 32 layers, vocab_size 128256; ModelLink's
#: examples/llama3/pretrain_llama3_8b_ptd.sh pads the vocabulary to a multiple of 16032 = 128256).
LLAMA3_8B = LlamaConfig("llama-3-8b", 4096, 14336, 32, 8, 32, 128256)
#: Qwen2-7B (huggingface.co/Qwen/Qwen2-7B config.json: hidden_size 3584, intermediate_size 18944,
#: 28 heads, 4 KV heads, 28 layers, vocab_size 152064). Qwen2 adds a bias to the Q, K and V
#: projections (--add-qkv-bias), which this config leaves out: 3584 + 2 x 512 values per layer,
#: 4,608 bias additions per token and layer against its 2 x 233M multiply-adds.
QWEN2_7B = LlamaConfig("qwen2-7b", 3584, 18944, 28, 4, 28, 152064)
#: Qwen2-72B (huggingface.co/Qwen/Qwen2-72B config.json: hidden_size 8192, intermediate_size 29568,
#: 64 heads, 8 KV heads, 80 layers, vocab_size 152064); the Q, K, V bias left out as for Qwen2-7B.
QWEN2_72B = LlamaConfig("qwen2-72b", 8192, 29568, 64, 8, 80, 152064)
