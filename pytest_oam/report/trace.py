"""Profiles as Chrome / Perfetto traces (the Trace Event Format), to open in ui.perfetto.dev
or chrome://tracing.

Tracks, per card: the compute stream and the HCCL stream with one slice per op (its shapes,
FLOP, pipe ratios, memory stall and call site in the slice's arguments); the AI Core pipes
(``mac_ratio``, ``vec_ratio``, ``mte2_ratio``) and, for runs that tracked memory, the
allocator's reserved and allocated bytes after every allocator call (or per step, for profiles
that kept only per-step statistics) as counter tracks. Collectives carry their ranks, waits
for other ranks and whether they ran asynchronously. Times are microseconds,
as the format wants.
"""

from __future__ import annotations

import json
from typing import Any

from simulator.profile import Profile
from simulator.units import GIGA, US_PER_S

_PID = 1
_TIDS = {"compute": 1, "hccl": 2}


def to_chrome_trace(profile: Profile, name: str = "oam profile") -> dict[str, Any]:
    """The trace of ``profile`` as a Trace Event Format object (``{"traceEvents": [...]}``)."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": _PID, "args": {"name": f"{profile.hardware} (rank 0 of {profile.devices})"}},
        {"ph": "M", "name": "thread_name", "pid": _PID, "tid": _TIDS["compute"], "args": {"name": "compute stream (AI Core)"}},
        {"ph": "M", "name": "thread_name", "pid": _PID, "tid": _TIDS["hccl"], "args": {"name": "HCCL stream"}},
    ]
    for op in profile.ops:
        args: dict[str, Any] = {"op_type": op.op_type, "step": op.step, "input_shapes": op.input_shapes,
                                "dtype": op.dtype, "flop": op.flop, "hbm_bytes": op.hbm_bytes, "block_dim": op.block_dim,
                                "mac_ratio": op.mac_ratio, "vec_ratio": op.vec_ratio, "mte2_ratio": op.mte2_ratio}
        if op.source:
            args["source"] = op.source
        if op.alloc_stall_s:
            # not display: a data field in the trace's time unit (microseconds, as the format wants)
            args["alloc_stall_us"] = op.alloc_stall_s * US_PER_S
        if op.overlap_frac is not None:
            args["overlap_frac"] = op.overlap_frac
        if op.comm is not None:
            # not display: a data field named with its unit, GB/s as HCCL and msprof report bus bandwidth
            args.update(bytes=op.comm.bytes, algorithm=op.comm.algorithm,
                        busbw_gb_per_s=op.comm.busbw_bytes_per_s / GIGA)
            if op.comm.ranks:
                args["ranks"] = op.comm.ranks
        for key in ("wait_time_s", "async_op", "link_bandwidth_frac"):
            if key in op.attrs:
                args[key] = op.attrs[key]
        ts = op.start_s * US_PER_S  # not display: the Trace Event Format's ts and dur are microseconds
        events.append({"ph": "X", "name": op.name, "cat": op.op_type, "pid": _PID, "tid": _TIDS[op.stream],
                       "ts": ts, "dur": op.duration_s * US_PER_S, "args": args})  # not display: microseconds
        if op.stream == "compute" and (op.mac_ratio or op.vec_ratio or op.mte2_ratio):  # not for unmeasured
            events.append({"ph": "C", "name": "AI Core pipes", "pid": _PID, "ts": ts,
                           "args": {"mac_ratio": op.mac_ratio, "vec_ratio": op.vec_ratio, "mte2_ratio": op.mte2_ratio}})
    for event in profile.memory_events:  # every allocator call: the device totals after it
        # not display: the Trace Event Format's ts is microseconds
        events.append({"ph": "C", "name": "HBM (caching allocator)", "pid": _PID, "ts": event.time_s * US_PER_S,
                       "args": {"reserved_bytes": event.reserved_bytes, "allocated_bytes": event.allocated_bytes}})
    starts = {}
    for op in profile.ops:
        starts[op.step] = min(starts.get(op.step, op.start_s), op.start_s)
    for m in ([] if profile.memory_events else profile.memory):  # per-step peaks when no events were kept
        if m.step in starts:
            # not display: the Trace Event Format's ts is microseconds
            events.append({"ph": "C", "name": "HBM (caching allocator)", "pid": _PID, "ts": starts[m.step] * US_PER_S,
                           "args": {"reserved_peak_bytes": m.reserved_peak_bytes,
                                    "allocated_peak_bytes": m.allocated_peak_bytes}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"name": name, "simulator_version": profile.simulator_version, "steps": profile.steps,
                          # a focused profile: the ops of other types are per-step sums, not slices
                          "focus": profile.focus, "summarised_ops": sum(s.count for s in profile.op_summaries)}}


def dump_chrome_trace(profile: Profile, name: str = "oam profile") -> str:
    """:func:`to_chrome_trace` as JSON text."""
    return json.dumps(to_chrome_trace(profile, name), allow_nan=False)
