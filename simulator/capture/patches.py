"""PyTorch behaviour the capture changes for its duration, each for a stated reason, undone
after it."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def fused_attention_with_dropout(recorder: object) -> Iterator[None]:
    """``torch.nn.functional.scaled_dot_product_attention`` with ``dropout_p > 0`` runs fused.

    On the CPU the capture runs on, PyTorch has no fused attention kernel with dropout and
    falls back to its math path (separate matmuls and softmax in fp32), while on an Ascend card
    torch_npu runs the fused kernel (``npu_fusion_attention``) with dropout. During the capture
    the call runs with ``dropout_p=0`` so the fused kernel is taken, and the simulated
    ``FlashAttention`` op carries the probability as attribute ``dropout_p``. The cost of
    generating the dropout mask is not modelled. Callers that bound the function before the
    capture (``from torch.nn.functional import scaled_dot_product_attention`` at import) keep
    the original.
    """
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    @functools.wraps(original)
    def fused(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs):
        if not dropout_p:
            return original(query, key, value, attn_mask, dropout_p, *args, **kwargs)
        with recorder.attention_dropout(float(dropout_p)):
            return original(query, key, value, attn_mask, 0.0, *args, **kwargs)

    functional.scaled_dot_product_attention = fused
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original
