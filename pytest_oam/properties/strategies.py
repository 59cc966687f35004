"""Hypothesis strategies for realistic operator shapes, biased towards the boundaries where
NPU kernels fall off cliffs: multiples of the Cube fractal (16), of FlashAttention's block
(128) and of the matmul tile (256), and one past each.

    from hypothesis import given
    from pytest_oam import strategies

    @given(shape=strategies.matmul_shapes(max_dim=4096))
    def test_no_cliff(shape): ...

Shapes come as named tuples (:class:`MatmulShape`, :class:`AttentionShape`) that the helpers
of :mod:`pytest_oam.perf` and the ``oam_profile`` fixture accept directly.
"""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import strategies as st

#: Boundaries kernels care about: the Cube fractal, FlashAttention's block, the matmul tile.
BOUNDARIES = (16, 128, 256)


class MatmulShape(NamedTuple):
    """(m x k) @ (k x n)."""

    m: int
    k: int
    n: int


class AttentionShape(NamedTuple):
    """Q, K and V of shape (batch, heads, seq, head_dim)."""

    batch: int
    heads: int
    seq: int
    head_dim: int


def aligned_ints(min_value: int, max_value: int, boundaries: tuple[int, ...] = BOUNDARIES) -> st.SearchStrategy[int]:
    """Integers in [min_value, max_value], half of them on a boundary: a multiple of one of
    ``boundaries``, or one below or one past it.

    Raises:
        ValueError: an empty range or a boundary below 1.
    """
    if min_value < 1 or max_value < min_value:
        raise ValueError(f"need 1 <= min_value <= max_value, got {min_value}..{max_value}")
    if any(b < 1 for b in boundaries):
        raise ValueError(f"boundaries must be positive, got {boundaries}")

    def near(multiple: int) -> st.SearchStrategy[int]:
        low, high = max(1, min_value // multiple), max(1, (max_value + 1) // multiple)
        return st.builds(lambda q, d: q * multiple + d, st.integers(low, high), st.sampled_from((0, -1, 1)))

    on_boundary = st.sampled_from(boundaries).flatmap(near).filter(lambda v: min_value <= v <= max_value)
    return st.one_of(on_boundary, st.integers(min_value, max_value))


def matmul_shapes(min_dim: int = 16, max_dim: int = 8192) -> st.SearchStrategy[MatmulShape]:
    """Matmul shapes with every axis in [min_dim, max_dim], boundary-biased."""
    dim = aligned_ints(min_dim, max_dim)
    return st.builds(MatmulShape, dim, dim, dim)


def attention_shapes(
    *,
    batch: tuple[int, int] = (1, 8),
    heads: tuple[int, int] = (1, 64),
    seq: tuple[int, int] = (128, 16384),
    head_dims: tuple[int, ...] = (64, 80, 96, 128, 256),
) -> st.SearchStrategy[AttentionShape]:
    """FlashAttention shapes: ranges for batch, heads and sequence, head dims from a list
    (the sizes models use; 80 and 96 are not multiples of 128)."""
    return st.builds(
        AttentionShape,
        st.integers(*batch),
        st.integers(*heads),
        aligned_ints(*seq, boundaries=(128, 256)),
        st.sampled_from(head_dims),
    )


def dtypes(hardware: str = "ascend910") -> st.SearchStrategy[str]:
    """The dtypes the hardware's Cube unit has a rate for (fp16 first, so it shrinks there)."""
    from simulator.hardware import load_hardware

    rates = load_hardware(hardware).cube_unit.macs_per_cycle_per_core
    return st.sampled_from(sorted(rates, key=lambda d: (d != "fp16", d)))
