"""The split of a real step (torch_npu's ``step_trace_time.csv``, read into ``Profile.step_trace``)
as rows of the gate and as diagnosis findings. Pure: imports neither pytest, the reports, the
gate nor the simulator's runtime.

Rows compared (seconds per step, median over the profiled steps; limit ``*``, 10% by default, or
a threshold naming the row, e.g. ``step.free=20%`` or ``step.*=15%``):

- ``step.computing``: device compute time (``Computing``);
- ``step.communication_exposed``: communication not hidden behind compute
  (``Communication(Not Overlapped)``);
- ``step.free``: the device idle, neither computing nor communicating (``Free``): the host did
  not feed it;
- ``step.bubble``: the pipeline's receives (``Bubble``), when the baseline has any.

A part that is 0 in the baseline (no bubble, nothing overlapped) has no relative change and is
not compared; ``step`` still gates the whole step. Overlapped communication is shown by the
rules, not gated: more of it is better.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..format import fmt_ms, fmt_percent

if TYPE_CHECKING:
    from simulator.profile import Profile, StepTrace

    from ..files.baseline import RunBaseline

#: Row name -> the :class:`~simulator.profile.StepTrace` field it compares.
STEP_TRACE_ROWS = {
    "step.computing": "computing_s",
    "step.communication_exposed": "communication_exposed_s",
    "step.free": "free_s",
    "step.bubble": "bubble_s",
}
#: The key a baseline keeps each part under (``RunBaseline.step_trace_s``): the row without ``step.``.
_PART = {row: row.removeprefix("step.") for row in STEP_TRACE_ROWS}


def step_trace_medians(profile: Profile) -> dict[str, float] | None:
    """What a baseline keeps of ``profile.step_trace``: each part's median over the steps, in
    seconds, keyed ``computing``, ``communication_exposed``, ``free``, ``bubble``; ``None`` when
    the profile has no step split (simulated runs, files without ``step_trace_time.csv``)."""
    if not profile.step_trace:
        return None
    return {part: statistics.median(getattr(t, STEP_TRACE_ROWS[row]) for t in profile.step_trace)
            for row, part in _PART.items()}


def step_trace_pairs(baseline: RunBaseline, current: RunBaseline) -> tuple[list[tuple[str, float, float]], list[str]]:
    """``([(row, baseline_s, current_s)], notes)``: the rows both runs have and the baseline's
    value is above 0, and a note when only one side has the step split (so the rows are not
    silently ungated)."""
    old, new = baseline.step_trace_s, current.step_trace_s
    if old is None and new is None:
        return [], []
    if old is None:
        return [], [("the baseline has no step split (step_trace_time.csv; saved before it was imported, or without "
                    "the file): step.* rows not compared; save the baseline again to gate them")]
    if new is None:
        return [], [("the baseline has a step split (step_trace_time.csv) and this run does not: step.* rows not "
                    "compared")]
    pairs = [(row, old[part], new[part]) for row, part in _PART.items()
             if part in old and part in new and old[part] > 0]
    return pairs, []


# -- diagnosis ----------------------------------------------------------------------------------


def _median_step(profile: Profile) -> tuple[StepTrace, float] | None:
    """The step of median length (the profile's typical step) and its time."""
    if not profile.step_trace:
        return None
    ordered = sorted(profile.step_trace, key=lambda t: t.step_s)
    typical = ordered[(len(ordered) - 1) // 2]
    return (typical, typical.step_s) if typical.step_s > 0 else None


def exposed_communication(profile: Profile, share_frac: float) -> Iterable[tuple[str, str, str, float, float]]:
    """``(row, description, what to do, gain_s, step_s)`` when the typical step's communication
    not hidden behind compute (``Communication(Not Overlapped)``, less the pipeline's receives,
    which the bubble explains) is at least ``share_frac`` of the step, and its collectives carry
    no ``communication.json`` details (with them, the ``comm-share`` and ``comm-wait`` rules say
    which collective is exposed and how long it waited for other ranks)."""
    found = _median_step(profile)
    if found is None:
        return
    t, step_s = found
    if any(op.comm is not None for op in profile.ops if op.stream == "hccl" and op.step == t.step):
        return  # communication.json's collectives are there: comm-share and comm-wait judge them one by one
    exposed_s = max(0.0, t.communication_exposed_s - t.bubble_s)
    if exposed_s / step_s < share_frac:
        return
    hidden = (f"{fmt_ms(t.overlapped_s)} of its {fmt_ms(t.communication_s)} of communication is hidden behind "
              f"compute ({fmt_percent(t.overlapped_s / t.communication_s)})" if t.communication_s > 0
              else "none of it overlaps compute")
    bubble = f", besides {fmt_ms(t.bubble_s)} of pipeline receives (bubble)" if t.bubble_s > 0 else ""
    yield ("step.communication_exposed",
           (f"communication not overlapped with compute takes {fmt_ms(exposed_s)} of the {fmt_ms(step_s)} step "
           f"({fmt_percent(exposed_s / step_s)}, step_trace_time.csv){bubble}; {hidden}"),
           ("overlap communication with compute: gradient reduction during the backward pass in buckets "
           "(Megatron --overlap-grad-reduce and --overlap-param-gather, DeepSpeed overlap_comm, DDP's "
           "bucket_cap_mb), fewer and larger collectives; when other ranks expose less, this rank waits for a "
           "slower one: oam cluster on the job's cluster_step_trace_time.csv names it"),
           exposed_s, step_s)


def free_time(profile: Profile, share_frac: float) -> Iterable[tuple[str, str, str, float, float]]:
    """``(row, description, what to do, gain_s, step_s)`` when the device sits idle (``Free``:
    neither computing nor communicating) for at least ``share_frac`` of the typical step."""
    found = _median_step(profile)
    if found is None:
        return
    t, step_s = found
    if t.free_s / step_s < share_frac:
        return
    preparing = (f"; {fmt_ms(t.preparing_s)} of it passes before the step's first device task" if t.preparing_s > 0
                 else "")
    yield ("step.free",
           (f"the device is idle (free: no kernel and no communication) for {fmt_ms(t.free_s)} of the "
           f"{fmt_ms(step_s)} step ({fmt_percent(t.free_s / step_s)}, step_trace_time.csv){preparing}: the host "
           "does not feed it (host-bound)"),
           ("find what the host does in the gaps (the trace_view.json's Python and CANN lanes): data loading (more "
           "DataLoader workers, pin_memory, prefetch), synchronisation (.item(), .cpu(), torch.npu.synchronize() "
           "in the step), operator dispatch (TASK_QUEUE_ENABLE=2, fewer and fused operators, graph mode), Python "
           "garbage collection or logging between steps"),
           t.free_s, step_s)


def regressed_row_advice(row: str) -> list[str]:
    """What to do about a regressed ``step.*`` row (:data:`STEP_TRACE_ROWS`)."""
    return {
        "step.computing": [("the device computes longer: the op-type rows above say which operators grew; if none "
                           "did by itself, many small ones did, or more of them run")],
        "step.communication_exposed": [("more communication is exposed: a collective grew or lost its overlap with "
                                       "compute (its row above: AllReduce, AllGather ...), or this rank waits longer for another: "
                                       "compare the ranks with oam cluster")],
        "step.free": [("the device idles longer: the host feeds it slower (data loading, synchronisation, operator "
                      "dispatch, garbage collection): compare the two runs' host lanes in trace_view.json")],
        "step.bubble": [("the pipeline's receives wait longer: a stage before this one got slower, or the "
                        "stages' work is less even; fewer bubbles with more micro-batches per step or an "
                        "interleaved (virtual pipeline) schedule")],
    }.get(row, [])
