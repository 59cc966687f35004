"""What tuning and the knowledge base share: the error of bad tuning input, and the calls of an
operator in a profile grouped by shapes, dtype and attributes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class TuneError(ValueError):
    """Bad tuning input, found before any evaluation."""


@dataclass(frozen=True)
class OpCall:
    """The calls of the target operator with one set of input shapes, dtype and attributes in
    a step: their input shapes (one list per input), dtype, calls per step, mean time of one call
    (seconds) and the op attributes (``causal``, ``block_size``, ...)."""

    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    calls_per_step: float
    latency_s: float
    attrs: tuple[tuple[str, Any], ...] = ()


#: Op attributes that say where a call waited, not what it computes.
_RUN_ATTRS = ("wait_hccl_op", "wait_time_s", "async_op", "link_bandwidth_frac")


def calls_of(records: list, steps: int, *, kernel_only: bool = False) -> tuple[OpCall, ...]:
    """Group an operator's records by input shapes, dtype and attributes, in order of first call.
    ``kernel_only``: leave out the time each call waited for the caching allocator."""
    groups: dict[tuple, list[float]] = {}
    for op in records:
        attrs = tuple(sorted((k, v) for k, v in op.attrs.items() if k not in _RUN_ATTRS))
        key = (tuple(tuple(s) for s in op.input_shapes), op.dtype, attrs)
        groups.setdefault(key, []).append(op.duration_s - op.alloc_stall_s if kernel_only else op.duration_s)
    return tuple(OpCall(shapes, dtype, len(times) / steps, sum(times) / len(times), attrs)
                 for (shapes, dtype, attrs), times in groups.items())
