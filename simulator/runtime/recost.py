"""What-if runs: a recorded op sequence costed again on other hardware (:func:`recost`)."""

from __future__ import annotations

from ..costs import OpCost, OpSpec, check_calibration, op_cost
from ..hardware import HardwareSpec, load_hardware
from ..profile import OpRecord, Profile
from ..version import SIMULATOR_VERSION
from .record import check_op_time_scale, make_record
from .timeline import dispatch


def recost(profile: Profile, hardware: str | HardwareSpec, op_time_scale: dict[str, float] | None = None) -> Profile:
    """The recorded op sequence of ``profile`` simulated again on ``hardware`` (a what-if).

    Each op is costed from its recorded type, input shapes, dtype and attributes (a collective
    from its recorded ranks) and placed on its stream as in :func:`~simulator.runtime.run`:
    compute in order, the collectives in order on the HCCL stream (blocking ones holding
    compute, asynchronous ones beside it), a compute op that followed a ``Work.wait()`` after
    the collective it waited for, and every step starting synchronised. Waits for slower ranks
    are kept as recorded. Memory is not simulated again: each op keeps its recorded allocation
    stall, and the memory statistics and events are carried over unchanged, as are the ops'
    ``checks`` (values do not depend on the hardware's speed). A profile recorded online keeps
    its per-op overhead.

    Raises:
        ValueError: unknown hardware, or a calibrated one whose op_time_scale names an op type with
            no cost model (:func:`simulator.costs.check_calibration`); a focused profile (its aggregated ops have no shapes); an
            imported profile or an op type with no cost model; an op the hardware cannot run
            (e.g. a dtype its Cube unit has no rate for), naming the op.
    """
    spec_hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    check_calibration(spec_hw)
    if profile.op_summaries:
        raise ValueError("a focused profile keeps only some op records (the rest are aggregated without shapes); "
                         "re-simulating needs the full op sequence")
    scale = check_op_time_scale(op_time_scale, profile.op_types, "an op type of this profile")
    overhead_s = spec_hw.profiler.online_callback_overhead_s if profile.collection == "online" else 0.0
    cache: dict[OpSpec, OpCost] = {}
    records: list[OpRecord] = []
    clock_s = hccl_s = host_s = 0.0
    step = profile.ops[0].step if profile.ops else 0
    for op in profile.ops:
        if op.step != step:  # steps end synchronised, as in the run
            clock_s, step = max(clock_s, hccl_s), op.step
            host_s = clock_s
        attrs = {k: v for k, v in op.attrs.items() if k != "wait_time_s"}
        if op.comm is not None and op.comm.ranks:
            attrs["ranks"] = tuple(op.comm.ranks)
        spec = OpSpec(op.op_type, tuple(tuple(s) for s in op.input_shapes), op.dtype, tuple(sorted(attrs.items())))
        cost = cache.get(spec)
        if cost is None:
            try:
                cost = cache[spec] = op_cost(spec, spec_hw)
            except (KeyError, ValueError) as exc:
                where = f" at {op.source}" if op.source else ""
                raise ValueError(f"op {op.name} ({op.op_type}, shapes {op.input_shapes}, {op.dtype}){where}: "
                                 f"cannot be simulated on {spec_hw.name}: {exc}") from None
        if op.stream == "hccl":
            ready_s = max(clock_s, hccl_s)
        else:
            waited = op.attrs.get("wait_hccl_op")
            if isinstance(waited, int) and 0 <= waited < len(records):
                done = records[waited]
                clock_s = max(clock_s, done.start_s + done.duration_s)
            if op.attrs.get("host_synced"):  # after NPU.device_synchronize: the host waited for the device
                host_s = max(host_s, clock_s + spec_hw.launch.host_dispatch_s)
            ready_s = clock_s
        start_s, host_s = dispatch(ready_s, host_s, cost, spec_hw)
        record = make_record(
            spec_hw, spec, cost, name=op.name, step=op.step, stream=op.stream, start_s=start_s,
            scale=scale.get(op.op_type, 1.0), stall_s=op.alloc_stall_s, alloc_count=op.alloc_count,
            alloc_retries=op.alloc_retries, device_frees=op.device_frees, device_mallocs=op.device_mallocs,
            source=op.source, wait_s=float(op.attrs.get("wait_time_s", 0.0)), checks=op.checks,
        )
        records.append(record)
        end_s = start_s + record.duration_s
        if op.stream == "hccl":
            hccl_s = end_s
            if not op.attrs.get("async_op"):
                clock_s = end_s
        else:
            clock_s = end_s
        host_s += overhead_s  # the host's callback delays the next issue, whatever the stream
    fields = {name: getattr(profile, name) for name in Profile.model_fields}
    # not model_copy: it would carry over the cached step times of the original
    return Profile.model_construct(**{**fields, "hardware": spec_hw.name, "simulator_version": SIMULATOR_VERSION,
                                      "ops": records})
