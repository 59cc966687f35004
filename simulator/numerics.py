"""Values: what operators compute when their input tensors carry data.

A tensor made with :meth:`simulator.runtime.NPU.from_numpy` holds a numpy array; an operator
whose inputs all hold one computes its result here, in float32, and stores it in the output
dtype with the Ascend 910's rounding and overflow behaviour:

* ``fp16``: numpy ``float16`` (round to nearest even). A finite result too large for fp16
  (one that IEEE conversion would turn into +-Inf, i.e. ``|x| >= 65520``) is **saturated** to
  +-65504, as the 910 does in its default saturation mode, and counted. NaN and Inf that the
  computation itself produced (an Inf input, 0/0, Inf - Inf) stay NaN and Inf and are counted.
* ``bf16``: float32 rounded to bfloat16 (round to nearest even on the top 16 bits, see
  :func:`round_bf16`) and kept in a float32 array. bf16 has float32's range; an overflow
  becomes Inf (no saturation) and counts as Inf.
* ``fp32``: float32 as computed.
* ``int32``: truncated toward zero and clipped to the int32 range (NaN becomes 0).

The kernels are plain numpy references (no tiling, no kernel-specific rounding order); matmul
accumulates in float32. Everything here is a pure function of arrays and attributes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .units import FP16_MAX

#: dtypes a tensor can carry data in, with the numpy dtype the data is stored as (bf16 is
#: stored as float32 holding bfloat16-rounded values).
DATA_DTYPES: dict[str, type[np.generic]] = {
    "fp16": np.float16,
    "bf16": np.float32,
    "fp32": np.float32,
    "int32": np.int32,
}
#: Epsilon inside the square root of the normalisations (torch's LayerNorm default; Llama's
#: RMSNorm uses 1e-6, the difference is invisible at fp16).
NORM_EPS = 1e-5
#: Score elements the reference attention holds at once (2**24 float32 = 64 MiB); longer
#: sequences are computed in chunks of query rows.
ATTENTION_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Values:
    """An op's result: ``data`` in the output dtype's storage (see :data:`DATA_DTYPES`), and
    what its elements showed: ``nan_count`` and ``inf_count`` in the stored result,
    ``saturated_count`` finite fp16 overflows clamped to +-65504, ``max_abs_value`` the largest
    finite absolute value computed in float32 before the cast (``None``: no finite element)."""

    data: np.ndarray
    nan_count: int
    inf_count: int
    saturated_count: int
    max_abs_value: float | None


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as a float32 array.

    bfloat16 is the top 16 bits of a float32: add 0x7FFF plus the lowest kept bit, then drop
    the low 16 bits. NaN stays NaN; values beyond bf16's largest finite value round to Inf.
    """
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    bits = x32.view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))))
               & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(x32), x32, rounded)


def store(x: np.ndarray, dtype: str) -> Values:
    """``x`` (computed in float32) stored as ``dtype``, with its NaN, Inf and saturation counts.

    Raises:
        ValueError: ``dtype`` cannot carry data (not one of :data:`DATA_DTYPES`).
    """
    if dtype not in DATA_DTYPES:
        raise ValueError(f"dtype {dtype!r} cannot carry data; these can: {', '.join(DATA_DTYPES)}")
    with np.errstate(all="ignore"):
        x32 = np.asarray(x, dtype=np.float32)
        finite = np.isfinite(x32)
        max_abs = float(np.max(np.abs(x32[finite]))) if finite.any() else None
        saturated = 0
        if dtype == "fp16":
            data = x32.astype(np.float16)
            overflow = finite & np.isinf(data)
            saturated = int(np.count_nonzero(overflow))
            if saturated:
                data[overflow] = np.copysign(FP16_MAX, x32[overflow]).astype(np.float16)
        elif dtype == "bf16":
            data = round_bf16(x32)
        elif dtype == "int32":
            info = np.iinfo(np.int32)
            wide = np.trunc(x32.astype(np.float64))
            clipped = finite & ((wide < info.min) | (wide > info.max))  # counted as saturated
            data = np.clip(np.nan_to_num(wide, nan=0.0), info.min, info.max).astype(np.int32)
            return Values(data, int(np.count_nonzero(np.isnan(x32))), int(np.count_nonzero(np.isinf(x32))),
                          int(np.count_nonzero(clipped)), max_abs)
        else:
            data = x32
        stored = data.astype(np.float32, copy=False)
        return Values(data, int(np.count_nonzero(np.isnan(stored))), int(np.count_nonzero(np.isinf(stored))),
                      saturated, max_abs)


# -- reference kernels: float32 arrays in, a float32 array out ------------------------------------

Kernel = Callable[[Sequence[np.ndarray], Mapping[str, object]], np.ndarray]


def _matmul(inputs: Sequence[np.ndarray], attrs: Mapping[str, object]) -> np.ndarray:
    a, b = inputs
    if attrs.get("transpose_a"):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)  # float32 operands: float32 accumulation


def _softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return shifted / np.sum(shifted, axis=-1, keepdims=True)


def _flash_attention(inputs: Sequence[np.ndarray], attrs: Mapping[str, object]) -> np.ndarray:
    """softmax(Q Kᵀ / sqrt(D)) V over (B, H, S, D); K and V heads repeated for grouped-query
    attention. ``causal``: query i sees keys j <= i + (S_kv - S_q) (aligned at the bottom right,
    as FlashAttention-2 does, so decoding sees the whole cache); a row that sees no key is 0."""
    q, k, v = inputs
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s_q, s_kv = q.shape[2], k.shape[2]
    # query rows in chunks, so the score matrix held at once stays under ATTENTION_CHUNK_ELEMENTS
    rows = max(1, ATTENTION_CHUNK_ELEMENTS // max(1, q.shape[0] * q.shape[1] * s_kv))
    out = np.empty(q.shape[:-1] + (v.shape[-1],), dtype=np.float32)
    scale = np.float32(math.sqrt(q.shape[-1]))
    for start in range(0, s_q, rows):
        stop = min(s_q, start + rows)
        scores = np.matmul(q[:, :, start:stop], np.swapaxes(k, -1, -2)) / scale
        if attrs.get("causal"):
            visible = np.arange(s_kv)[None, :] <= np.arange(start, stop)[:, None] + (s_kv - s_q)
            scores = np.where(visible, scores, -np.inf)
            weights = np.where(visible.any(axis=-1, keepdims=True), _softmax(scores), 0.0)
        else:
            weights = _softmax(scores)
        out[:, :, start:stop] = np.matmul(weights.astype(np.float32), v)
    return out


def _rms_norm(inputs: Sequence[np.ndarray], attrs: Mapping[str, object]) -> np.ndarray:
    x, weight = inputs
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(NORM_EPS)) * weight


def _layer_norm(inputs: Sequence[np.ndarray], attrs: Mapping[str, object]) -> np.ndarray:
    x, weight, bias = inputs
    mean = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(NORM_EPS)) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x ** 3)))


#: Reference kernels by op type. An op type not here computes no values.
KERNELS: dict[str, Kernel] = {
    "MatMul": _matmul,
    "BatchMatMul": _matmul,
    "FlashAttention": _flash_attention,
    "Add": lambda xs, attrs: xs[0] + xs[1],
    "Mul": lambda xs, attrs: xs[0] * xs[1],
    "Relu": lambda xs, attrs: np.maximum(xs[0], 0),
    "SiLU": lambda xs, attrs: xs[0] / (1 + np.exp(-xs[0])),
    "GeLU": lambda xs, attrs: _gelu(xs[0]),
    "Softmax": lambda xs, attrs: _softmax(xs[0]),
    "RmsNorm": _rms_norm,
    "LayerNorm": _layer_norm,
    "Cast": lambda xs, attrs: xs[0],
    # every rank of the job holds the same tensor (ranks alike), so the sum is group x x
    "AllReduce": lambda xs, attrs: xs[0] * np.float32(attrs["group_size"]),
}


def evaluate(op_type: str, inputs: Sequence[np.ndarray], dtype: str,
             attrs: Mapping[str, object] | None = None) -> Values | None:
    """The result of ``op_type`` on the ``inputs`` arrays, stored as ``dtype``; ``None`` when the
    op type has no reference kernel (:data:`KERNELS`) or ``dtype`` cannot carry data.

    Inputs are read as float32 (exact for fp16 and bf16). Integer arithmetic is not modelled: an
    op other than Cast with an int32 input or output gives ``None``; a Cast to int32 truncates and
    counts values outside the int32 range as saturated. Numpy warnings
    about overflow or invalid values are silenced, the counts in :class:`Values` report them.
    """
    kernel = KERNELS.get(op_type)
    if kernel is None or dtype not in DATA_DTYPES:
        return None
    if op_type != "Cast" and (dtype == "int32" or any(np.asarray(x).dtype.kind in "iu" for x in inputs)):
        return None  # integer arithmetic is not modelled (float32 is exact only to 2**24): no values
    with np.errstate(all="ignore"):
        result = kernel([np.asarray(x, dtype=np.float32) for x in inputs], attrs or {})
    return store(result, dtype)
