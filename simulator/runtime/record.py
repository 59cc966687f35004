"""One op's record: its cost on the hardware, scaled by fault injection, plus the stalls and
waits around it (:func:`make_record`), shared by the live run and :func:`~simulator.runtime.recost`."""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection

from ..costs import OpCost, OpSpec
from ..hardware import HardwareSpec
from ..profile import CommInfo, OpChecks, OpRecord, build_record


def overlap(overlapped_s: float, overlappable_s: float, stall_s: float) -> float:
    """Share of the time an op could have overlapped DMA with compute in which it did: a stall
    waiting for memory counts as time in which nothing could be prefetched."""
    denominator = overlappable_s + stall_s
    return 1.0 if denominator <= 0 else min(1.0, overlapped_s / denominator)


def make_record(
    hw: HardwareSpec, spec: OpSpec, cost: OpCost, *, name: str, step: int, stream: str, start_s: float,
    scale: float, stall_s: float, alloc_count: int, alloc_retries: int, device_frees: int, device_mallocs: int,
    source: str | None, wait_s: float = 0.0, checks: OpChecks | None = None,
) -> OpRecord:
    """The record of one op: its cost on ``hw``, scaled by ``scale`` (fault injection), plus the
    memory stall ``stall_s`` that preceded the kernel and, for a collective, the time
    ``wait_s`` it waited for a slower rank (``attrs["wait_time_s"]``)."""
    duration_s = cost.duration_s * scale + stall_s + wait_s
    hbm_util = (
        cost.hbm_bytes / duration_s / hw.memory.hbm_bandwidth_bytes_per_s
        if duration_s > 0 and stream == "compute"
        else 0.0
    )
    comm = None
    if cost.comm is not None:
        comm = build_record(CommInfo, {
            "bytes": cost.comm.bytes,
            "algorithm": cost.comm.algorithm,
            "group_size": cost.comm.group_size,
            "algbw_bytes_per_s": cost.comm.algbw_bytes_per_s,
            "busbw_bytes_per_s": cost.comm.busbw_bytes_per_s,
            "ranks": list(spec.attr("ranks", ())),
        })
    attrs = {k: v for k, v in spec.attrs if isinstance(v, (bool, int, float, str))}
    if wait_s:
        attrs["wait_time_s"] = wait_s
    compute = stream == "compute"
    return build_record(OpRecord, {  # every field, in OpRecord's order
        "op_type": spec.op_type,
        "name": name,
        "step": step,
        "stream": stream,
        "start_s": start_s,
        "duration_s": duration_s,
        "flop": cost.flop,
        "hbm_bytes": cost.hbm_bytes,
        "l2_bytes": cost.l2_bytes,
        "block_dim": cost.block_dim,
        "dma_count": cost.dma_count,
        "ai_core_util_frac": cost.ai_core_util_frac / scale,
        "hbm_bandwidth_util_frac": hbm_util,
        "mac_ratio": cost.mac_ratio / scale,
        "vec_ratio": cost.vec_ratio / scale,
        "mte2_ratio": cost.mte2_ratio / scale,
        "input_shapes": [list(shape) for shape in spec.shapes],
        "dtype": spec.dtype,
        "attrs": attrs,
        "source": source,
        "comm": comm,
        "alloc_stall_s": stall_s,
        "alloc_count": alloc_count,
        "alloc_retries": alloc_retries,
        "device_mallocs": device_mallocs,
        "device_frees": device_frees,
        "overlapped_s": cost.overlapped_s * scale,
        "overlappable_s": cost.overlappable_s * scale,
        "overlap_frac": overlap(cost.overlapped_s, cost.overlappable_s, stall_s) if compute else None,
        "checks": checks,
    })


def check_op_time_scale(op_time_scale: dict[str, float] | None, known: Collection[str],
                        known_as: str = "an op type") -> dict[str, float]:
    """``op_time_scale`` checked: every factor positive and finite, every key an op type in
    ``known`` (a typo would otherwise scale nothing, and a gate test would pass for the wrong
    reason).

    Raises:
        ValueError: a factor that is not a positive number, or an unknown op type.
    """
    scale = dict(op_time_scale or {})
    for op_type, factor in scale.items():
        if op_type not in known:
            near = difflib.get_close_matches(str(op_type), sorted(known), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]!r}? op types are case-sensitive)" if near else ""
            raise ValueError(f"op_time_scale: {op_type!r} is not {known_as}{hint} (exact op type names, no patterns)")
        if isinstance(factor, bool) or not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"op_time_scale[{op_type!r}] must be a positive number, got {factor!r}")
    return scale
