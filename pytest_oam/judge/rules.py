"""Diagnosis rules: pure functions over a profile that find problems without a baseline.

Each rule reads a :class:`RuleContext` (the profile, the hardware, the rule's thresholds) and
returns :class:`RuleFinding` objects: rule id, severity, op, location in the user's code,
evidence, what to do and the time a fix would save. Performance findings are graded by that
gain as a share of the step time on the one scale of :mod:`pytest_oam.severity`;
``info`` ones (below 3%) are not reported, so a healthy run stays quiet. Correctness findings (NaN/Inf,
fp16 overflow, shape mismatch, out-of-bounds views and copies, read from ``OpRecord.checks``) are
``fatal``: they fail the test even without a baseline. Every threshold lives in its
rule's ``thresholds`` and can be changed per project (ini ``oam_rule_thresholds``); rules can
be switched off (``oam_disable_rules``); projects add their own with :func:`rule` or the
``pytest_oam_register_rules`` hook. A rule that raises becomes an ``internal-error`` finding
naming it, and the other rules still run.

Like the comparison, this module imports neither pytest nor the simulator runtime.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from simulator.hardware import HardwareSpec
from simulator.profile import DEVICE_WAIT_MIN_GAP_S, OpRecord, Profile, any_between
from simulator.units import FP16_MAX

from ..format import fmt_bytes_in, fmt_frac, fmt_gb_per_s, fmt_ms, fmt_percent, fmt_us
from .card import dma_alignment_bytes
from .compare import warm_steps
from .explain import (
    CUBE_OP_TYPES,
    AlignmentGain,
    alignment_gain,
    memory_bound,
    misalignment_findings,
    shape_findings,
)
from .severity import SERIOUS_STEP_FRAC, SEVERITY_ORDER, WARNING_STEP_FRAC, Severity, grade_share
from .step_trace import exposed_communication, free_time

__all__ = ["RULES", "SERIOUS_STEP_FRAC", "SEVERITY_ORDER", "WARNING_STEP_FRAC", "Rule", "RuleContext",
           "RuleFinding", "Severity", "check_rules", "grade", "parse_rule_thresholds", "rule", "run_rules"]


@dataclass(frozen=True)
class RuleFinding:
    """One problem a rule found. Times in seconds per step."""

    rule_id: str
    severity: Severity
    op_type: str
    op_name: str
    location: str | None
    description: str
    fix: str
    gain_s: float
    step_share_frac: float


@dataclass(frozen=True)
class RuleContext:
    """What a rule reads: the profile, the card, and the rule's thresholds."""

    profile: Profile
    hardware: HardwareSpec
    thresholds: Mapping[str, float]

    @property
    def step_time_s(self) -> float:
        """Mean time of the warm steps (:attr:`warm_steps`): gains are averaged over the same
        steps, so a gain's share of the step stays at most 100%."""
        if self.profile.is_empty:
            return 0.0
        times = [t for step, t in enumerate(self.profile.step_times_s) if step in self.warm_steps]
        return sum(times) / len(times) if times else 0.0

    @property
    def warm_steps(self) -> range:
        """:func:`pytest_oam.compare.warm_steps` of the profile: stall rules skip the first step."""
        return warm_steps(self.profile.steps)

    @cached_property
    def _host_gated(self) -> frozenset[int]:
        """``id`` of every compute op whose successor on the compute stream (same step) started
        after the device sat idle longer than :data:`DEVICE_WAIT_MIN_GAP_S`, with no collective
        ending in that gap (a blocking collective or a pipeline transfer the compute stream waited
        for) and the successor neither waiting for a collective (``wait_hccl_op``) nor issued after
        a device synchronisation (``host_synced``): the host issued that successor late
        (:func:`simulator.runtime.timeline.dispatch`), so the op ending sooner starts nothing
        sooner. The same reading as ``oam calibrate``'s host intervals, for simulated and
        imported profiles alike."""
        gated = set()
        by_step: dict[int, list[OpRecord]] = defaultdict(list)
        collective_ends: list[float] = []
        for op in self.profile.ops:
            if op.stream == "compute":
                by_step[op.step].append(op)
            else:
                collective_ends.append(op.start_s + op.duration_s)
        collective_ends.sort()
        for ops in by_step.values():
            ops.sort(key=lambda o: o.start_s)
            for before, after in itertools.pairwise(ops):
                idle_from = before.start_s + before.duration_s
                if (after.start_s - idle_from <= DEVICE_WAIT_MIN_GAP_S or "wait_hccl_op" in after.attrs
                        or after.attrs.get("host_synced")):
                    continue
                if any_between(collective_ends, idle_from, after.start_s):
                    continue  # the device may have waited for that collective
                gated.add(id(before))
        return frozenset(gated)

    def step_saving_s(self, op: OpRecord, saved_s: float) -> float:
        """What saving ``saved_s`` of ``op``'s device time saves of the step: nothing when the
        next kernel waited for the host anyway (:attr:`_host_gated`), else all of it."""
        return 0.0 if id(op) in self._host_gated else saved_s

    def step0_ops(self) -> list[OpRecord]:
        """The records of one representative step (the last, after any warm-up)."""
        last = self.profile.steps - 1
        return [op for op in self.profile.ops if op.step == last]


RuleFunction = Callable[[RuleContext], Iterable[RuleFinding]]
#: Ops whose overlap is below this are left to ``low-overlap`` by ``low-ai-core-utilization``.
LOW_OVERLAP_FRAC = 0.5


@dataclass(frozen=True)
class Rule:
    """A registered rule. ``needs_hardware``: it reads ``ctx.hardware`` (a spec of a simulated
    card), so it does not run on imported real profiles, which have none."""

    id: str
    title: str
    function: RuleFunction
    thresholds: dict[str, float] = field(default_factory=dict)
    needs_hardware: bool = True


#: Every rule by id. Add to it with :func:`rule` (or the ``pytest_oam_register_rules`` hook).
RULES: dict[str, Rule] = {}


def rule(rule_id: str, title: str, *, needs_hardware: bool = True,
         **thresholds: float) -> Callable[[RuleFunction], RuleFunction]:
    """Register a rule function under ``rule_id`` with its default thresholds; a rule that does
    not read ``ctx.hardware`` says ``needs_hardware=False`` and then also runs on real profiles.

    Raises:
        ValueError: the id is taken.
    """

    def register(function: RuleFunction) -> RuleFunction:
        if rule_id in RULES:
            raise ValueError(f"a diagnosis rule {rule_id!r} is already registered")
        RULES[rule_id] = Rule(rule_id, title, function, dict(thresholds), needs_hardware)
        return function

    return register


def grade(gain_s: float, step_s: float) -> Severity | None:
    """Severity of a performance finding by its gain's share of the step (:func:`grade_share`);
    ``None`` for ``info`` (below :data:`WARNING_STEP_FRAC`), which the rules do not report."""
    severity = grade_share(gain_s / step_s if step_s > 0 else 0.0)
    return None if severity == "info" else severity


def _finding(ctx: RuleContext, rule_id: str, op: OpRecord, gain_s: float, description: str,
             fix: str) -> RuleFinding | None:
    severity = grade(gain_s, ctx.step_time_s)
    if severity is None:
        return None
    return RuleFinding(rule_id, severity, op.op_type, op.name, op.source, description, fix, gain_s,
                       gain_s / ctx.step_time_s)


def _steps_text(steps: list[int]) -> str:
    """``step 3`` or ``steps 3, 5, 9 ...`` (the first eight)."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"steps {', '.join(map(str, steps[:8]))}{' ...' if len(steps) > 8 else ''}"


def _by_call_site(ops: Iterable[OpRecord]) -> dict[tuple[str, str | None], list[OpRecord]]:
    groups: dict[tuple[str, str | None], list[OpRecord]] = defaultdict(list)
    for op in ops:
        groups[(op.op_type, op.source)].append(op)
    return groups


# -- performance rules ----------------------------------------------------------------------------


@rule("slow-op", "Operator abnormally slow against others of its type and shape", factor=2.0, min_excess_s=20e-6,
      needs_hardware=False)
def slow_op(ctx: RuleContext) -> Iterable[RuleFinding]:
    """An op call much slower than the median of the calls with the same type, shapes, dtype
    and attributes in the same run (a straggling kernel, a stall before it)."""
    groups: dict[tuple, list[OpRecord]] = defaultdict(list)
    warm = ctx.warm_steps
    for op in ctx.profile.ops:
        if op.stream == "compute" and op.step in warm:
            attrs = {k: v for k, v in op.attrs.items() if k != "wait_hccl_op"}  # where it waited, not what it is
            key = (op.op_type, str(op.input_shapes), op.dtype, str(sorted(attrs.items())))
            groups[key].append(op)
    for ops in groups.values():
        if len(ops) < 3:
            continue
        typical = statistics.median(op.duration_s for op in ops)
        slow = [op for op in ops if op.duration_s > ctx.thresholds["factor"] * typical
                and op.duration_s - typical >= ctx.thresholds["min_excess_s"]]
        if not slow:
            continue
        worst = max(slow, key=lambda op: op.duration_s)
        steps = sorted({op.step for op in slow})
        excess_per_step = sum(ctx.step_saving_s(op, op.duration_s - typical) for op in slow) / len(warm)
        stall = f"; it waited {fmt_ms(worst.alloc_stall_s)} for memory" if worst.alloc_stall_s else ""
        found = _finding(
            ctx, "slow-op", worst, excess_per_step,
            f"{len(slow)} of {len(ops)} calls take more than {ctx.thresholds['factor']:g}x the median "
            f"{fmt_ms(typical, 3)} (worst {fmt_ms(worst.duration_s, 3)} in step {worst.step}{stall}); "
            f"{_steps_text(steps)}",
            "look at what runs just before the slow calls (memory allocation, synchronisation, "
            "another stream) and compare a slow step with a normal one",
        )
        if found:
            yield found


@rule("low-ai-core-utilization", "Low AI Core utilisation: no pipe busy", busy_frac=0.8, min_duration_s=20e-6)
def low_ai_core_utilization(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Compute ops longer than ``min_duration_s`` whose busiest pipe (mac, vec, mte2 ratios)
    stays at or below ``busy_frac``: the cores wait; the shape findings say why.

    Gain: when the shape is misaligned (padding to the Cube fractal, a nearly empty last tile,
    a sequence that is not a multiple of the block) and re-costing the calls with the axes
    aligned (:func:`~pytest_oam.diagnosis.alignment_gain`) saves at least the warning share
    of the step, that saving; otherwise the time the busiest pipe idles (an upper bound)."""
    for ops in _by_call_site(op for op in ctx.step0_ops() if op.stream == "compute").values():
        op = max(ops, key=lambda o: o.duration_s)
        busiest = max(op.mac_ratio, op.vec_ratio, op.mte2_ratio)
        if sum(o.duration_s for o in ops) < ctx.thresholds["min_duration_s"] or busiest > ctx.thresholds["busy_frac"]:
            continue
        if op.overlap_frac is not None and op.overlap_frac < LOW_OVERLAP_FRAC:
            continue  # the pipeline does not overlap: low-overlap reports this op, with the cause
        aligned = _alignment_gains(ops, ctx.hardware)
        align_gain_s = _aligned_saving_s(ctx, ops, aligned)
        this = aligned[_shape_key(op)][0]  # aligning the longest call: what the evidence shows
        if this is not None and grade(align_gain_s, ctx.step_time_s):
            gain = align_gain_s
            why = "; ".join([*misalignment_findings(op, ctx.hardware), this.describe()])
        else:
            gain = sum(ctx.step_saving_s(o, o.duration_s * (1 - max(o.mac_ratio, o.vec_ratio, o.mte2_ratio)))
                       for o in ops)
            misaligned = misalignment_findings(op, ctx.hardware)
            reasons = [text for text in shape_findings(op, ctx.hardware) if text not in misaligned][:1]
            if this is not None:  # misaligned, but re-costing shows aligning would not help much
                reasons.append(f"aligning it ({', '.join(this.changes)}) would save only {fmt_us(this.gain_s)} "
                               "per call by the cost model")
            why = "; ".join(reasons)
        found = _finding(
            ctx, "low-ai-core-utilization", op, gain,
            f"{op.op_type} {op.input_shapes}: busiest pipe {fmt_percent(busiest)} (mac_ratio {op.mac_ratio:.2f}, "
            f"vec_ratio {op.vec_ratio:.2f}, mte2_ratio {op.mte2_ratio:.2f}) over {len(ops)} calls"
            + (f"; {why}" if why else ""),
            "give the kernel more, better-shaped work: align the axes to the Cube tiles (16/128/256) "
            "and size the work as a multiple of the AI Cores, or fuse it with its neighbours",
        )
        if found:
            yield found


@rule("cube-alignment", "Cube op with a misaligned shape while its pipes are busy", busy_frac=0.8,
      min_duration_s=20e-6)
def cube_alignment(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Cube ops (MatMul, FlashAttention, ...) longer than ``min_duration_s`` whose shape is not
    aligned to what the Cube unit wants (padding to the 16 x 16 fractal, a nearly empty last
    tile, a FlashAttention sequence or head dim that is not a multiple of its block), while
    their busiest pipe is above ``busy_frac``: the Cube unit is busy, partly with padding. The
    calls whose pipes idle are low-ai-core-utilization's. Gain: the calls re-costed with the
    axes aligned (:func:`~pytest_oam.diagnosis.alignment_gain`)."""
    for ops in _by_call_site(op for op in ctx.step0_ops()
                             if op.stream == "compute" and op.op_type in CUBE_OP_TYPES).values():
        op = max(ops, key=lambda o: o.duration_s)
        busiest = max(op.mac_ratio, op.vec_ratio, op.mte2_ratio)
        if sum(o.duration_s for o in ops) < ctx.thresholds["min_duration_s"] or busiest <= ctx.thresholds["busy_frac"]:
            continue
        aligned = _alignment_gains(ops, ctx.hardware)
        this = aligned[_shape_key(op)][0]
        if this is None:
            continue
        gain = _aligned_saving_s(ctx, ops, aligned)
        found = _finding(
            ctx, "cube-alignment", op, gain,
            f"{op.op_type} {op.input_shapes}: busiest pipe {fmt_percent(busiest)} (mac_ratio {op.mac_ratio:.2f}) over "
            f"{len(ops)} calls, but {'; '.join([*misalignment_findings(op, ctx.hardware), this.describe()])}",
            "pad or reshape the axes to the Cube unit's multiples (16 for the fractal, the tile or block size "
            "for the last tile; 128 for FlashAttention's sequence and head dim), e.g. pad the vocabulary or "
            "the hidden size when you choose them",
        )
        if found:
            yield found


def _shape_key(op: OpRecord) -> tuple:
    return op.op_type, str(op.input_shapes), op.dtype, str(sorted(op.attrs.items()))


def _aligned_saving_s(ctx: RuleContext, ops: list[OpRecord], aligned: dict) -> float:
    """The step time aligning the calls ``ops`` saves: each call's re-costed gain
    (:func:`_alignment_gains`), where its next kernel did not wait for the host anyway."""
    total = 0.0
    for o in ops:
        gain = aligned[_shape_key(o)][0]
        if gain is not None:
            total += ctx.step_saving_s(o, gain.gain_s)
    return total


def _alignment_gains(ops: list[OpRecord], hw: HardwareSpec) -> dict[tuple, tuple[AlignmentGain | None, int]]:
    """Per shape of the calls ``ops`` (keyed by :func:`_shape_key`): the re-costed gain of
    aligning one such call (:func:`~pytest_oam.diagnosis.alignment_gain`) and the number of calls."""
    out: dict[tuple, tuple[AlignmentGain | None, int]] = {}
    for o in ops:
        key = _shape_key(o)
        gain, calls = out[key] if key in out else (alignment_gain(o, hw), 0)
        out[key] = (gain, calls + 1)
    return out


def _memory_util_frac(op: OpRecord, hw: HardwareSpec) -> float:
    """The busier of HBM and L2 as a share of its bandwidth (every read crosses L2)."""
    if op.duration_s <= 0:
        return 0.0
    l2 = (op.hbm_bytes + op.l2_bytes) / op.duration_s / hw.memory.l2_bandwidth_bytes_per_s
    return max(op.hbm_bandwidth_util_frac, l2)


@rule("memory-bound", "Memory-bound op with memory bandwidth to spare", bandwidth_util_frac=0.6,
      min_duration_s=20e-6)
def memory_bound_op(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Ops with ``memory_bound`` > 1 (msprof: mte2_ratio / max(mac_ratio, vec_ratio)) whose
    busier memory level (HBM or L2) still runs below ``bandwidth_util_frac`` of its bandwidth:
    the DMA queue is busy with small or unaligned transfers, not with bytes."""
    target = ctx.thresholds["bandwidth_util_frac"]
    for ops in _by_call_site(op for op in ctx.step0_ops() if op.stream == "compute").values():
        op = max(ops, key=lambda o: o.duration_s)
        bound = memory_bound(op.mte2_ratio, op.mac_ratio, op.vec_ratio)
        util = _memory_util_frac(op, ctx.hardware)
        if op.duration_s < ctx.thresholds["min_duration_s"] or bound <= 1 or util >= target:
            continue
        gain = sum(ctx.step_saving_s(o, o.duration_s * (1 - _memory_util_frac(o, ctx.hardware) / target)) for o in ops)
        found = _finding(
            ctx, "memory-bound", op, gain,
            f"{op.op_type} {op.input_shapes}: memory_bound {bound:.2f} but memory bandwidth at "
            f"{fmt_percent(util)} of peak, {op.dma_count} DMA transfers over {len(ops)} calls",
            f"move more bytes per DMA transfer (larger tiles, {dma_alignment_bytes(ctx.hardware)}-byte aligned "
            "rows) or fuse the op with its producer so the data stays on chip",
        )
        if found:
            yield found


@rule("low-overlap", "DMA and compute not overlapped", overlap_frac=0.5, min_duration_s=20e-6,
      needs_hardware=False)
def low_overlap(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Ops whose DMA/compute overlap (``overlap_frac``: the share of the time the kernel's units
    could have worked at once in which they did, stalls for memory counting as lost) is below
    ``overlap_frac``."""
    warm = ctx.warm_steps
    for ops in _by_call_site(op for op in ctx.profile.ops if op.overlap_frac is not None and op.step in warm).values():
        low = [o for o in ops if o.overlap_frac < ctx.thresholds["overlap_frac"]
               and o.duration_s >= ctx.thresholds["min_duration_s"]]
        if not low:
            continue
        op = min(low, key=lambda o: o.overlap_frac)
        steps = sorted({o.step for o in low})
        lost = sum(o.alloc_stall_s + ctx.step_saving_s(o, o.overlappable_s - o.overlapped_s) for o in low) / len(warm)
        normal = [o.overlap_frac for o in ops if o not in low]
        was = f" (other calls {fmt_percent(statistics.median(normal))})" if normal else ""
        found = _finding(
            ctx, "low-overlap", op, lost,
            f"{op.op_type}: DMA/compute overlap {fmt_percent(op.overlap_frac)}{was} in {_steps_text(steps)}"
            + (f"; it waited {fmt_ms(op.alloc_stall_s)} for memory ({op.device_frees} device frees, "
               f"{op.device_mallocs} mallocs, {op.alloc_retries} allocation retries)" if op.alloc_stall_s else ""),
            ("pre-allocate the buffers of the op that waited for memory (a reserved pool), or use "
             "expandable_segments if the run does not already" if op.alloc_stall_s else
             "raise pipeline_stages so DMA runs ahead of compute"),
        )
        if found:
            yield found


def _device_calls(op: OpRecord) -> str:
    return (f"{op.device_frees} device {'free' if op.device_frees == 1 else 'frees'}, {op.device_mallocs} device "
            f"{'malloc' if op.device_mallocs == 1 else 'mallocs'}")


def _stall_evidence(ctx: RuleContext, op: OpRecord) -> str:
    """What the flush did to the op that waited for it, against the same call in the other
    warm steps: its time and, on the compute stream, its DMA/compute overlap."""
    others = [o for o in ctx.profile.ops
              if o.name == op.name and o.step in ctx.warm_steps and not o.alloc_retries]
    text = f"in step {op.step} {op.name} ({op.op_type}) waited {fmt_ms(op.alloc_stall_s)} for it ({_device_calls(op)})"
    if others:
        text += (f" and took {fmt_ms(op.duration_s)} against "
                 f"{fmt_ms(statistics.median(o.duration_s for o in others))} in the other steps")
        normal = [o.overlap_frac for o in others if o.overlap_frac is not None]
        if op.overlap_frac is not None and normal:
            text += (f"; its DMA/compute overlap fell from {fmt_percent(statistics.median(normal))} to "
                     f"{fmt_percent(op.overlap_frac)}")
    return text


@rule("frequent-alloc", "Frequent allocation and free, allocation retries", alloc_time_s=10e-3,
      needs_hardware=False)
def frequent_alloc(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Steps whose allocator time exceeds ``alloc_time_s`` (msprof-analyze advisor's 10 ms mark)
    or that retried an allocation after flushing the cache (a device synchronisation)."""
    memory = [m for m in ctx.profile.memory if m.step in ctx.warm_steps]
    # A run of one step has only the step that fills the cache: its allocator time is the cold
    # start every run pays, not a pattern to fix (its flushes still count).
    limit_s = ctx.thresholds["alloc_time_s"] if ctx.profile.steps > 1 else math.inf
    bad = [m for m in memory if m.alloc_time_s > limit_s or m.alloc_retries]
    if not bad:
        return
    stalled = [op for op in ctx.profile.ops if op.alloc_retries and op.step in ctx.warm_steps]
    worst_op = max(stalled, key=lambda o: o.alloc_stall_s) if stalled else None
    # Host time in the allocator overlaps the device's queue; what a fix saves on the device
    # timeline is the stall of the ops that waited for memory.
    gain = sum(o.alloc_stall_s for o in ctx.profile.ops if o.step in ctx.warm_steps) / len(memory)
    retry_steps = [m.step for m in bad if m.alloc_retries]
    evidence = []
    slow = [m.step for m in bad if m.alloc_time_s > limit_s]
    if slow:
        evidence.append(f"{len(slow)} of {len(memory)} steps spend over {fmt_ms(ctx.thresholds['alloc_time_s'], None)} "
                        "in the allocator")
    if retry_steps:
        period = ""
        if len(retry_steps) > 1:
            period = f", about every {statistics.median(b - a for a, b in itertools.pairwise(retry_steps)):g} steps"
        evidence.append(f"allocations flushed the cache and retried in {_steps_text(retry_steps)}{period}")
    if worst_op is not None:
        evidence.append(_stall_evidence(ctx, worst_op))
        rest = sorted((o for o in stalled if o is not worst_op), key=lambda o: (o.step, o.start_s))
        if rest:
            named = ", ".join(f"{o.name} ({o.op_type}) in step {o.step}, {fmt_ms(o.alloc_stall_s)} "
                              f"({_device_calls(o)})" for o in rest[:3])
            more = f" and {len(rest) - 3} more" if len(rest) > 3 else ""
            evidence.append(f"also waited for a flush: {named}{more}")
    evidence.append(f"peak reserved {fmt_bytes_in(max(m.reserved_peak_bytes for m in memory), 'GiB')}, up to "
                    f"{fmt_bytes_in(max(m.inactive_split_bytes for m in memory), 'MiB', 0)} free inside split blocks")
    severity = grade(gain, ctx.step_time_s) or ("warning" if retry_steps else None)
    if severity is None:
        return
    yield RuleFinding(
        "frequent-alloc", severity, worst_op.op_type if worst_op else "-", worst_op.name if worst_op else "-",
        worst_op.source if worst_op else None, "; ".join(evidence),
        "reuse buffers across steps: pre-allocate a pool for tensors whose size changes every step, "
        "use expandable_segments if the run does not already, or pad sizes to a few buckets",
        gain, gain / ctx.step_time_s if ctx.step_time_s else 0.0,
    )


@rule("comm-share", "Communication not overlapped with compute", share_frac=0.2, small_message_bytes=1 << 20,
      align_bytes=0, needs_hardware=False)
def comm_share(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Collectives whose exposed time (on the HCCL stream while no compute op runs, not counting
    waits for other ranks) takes more than ``share_frac`` of the step, with their overlap,
    algorithm and bus bandwidth, how many messages are small (below ``small_message_bytes``) and
    how many sizes are not a multiple of ``align_bytes`` (msprof-analyze advisor's byte-alignment
    check of communication operators). ``align_bytes`` 0 (the default): the card's DMA alignment,
    ``dma.min_efficient_transfer_bytes`` of its hardware spec
    (:func:`~pytest_oam.judge.card.dma_alignment_bytes`; a real profile: that of the bundled
    specs, when they agree)."""
    step = ctx.profile.steps - 1
    comm = [op for op in ctx.step0_ops() if op.stream == "hccl" and op.comm is not None]
    total_s, exposed_s = ctx.profile.comm_time_s(step)
    # time spent waiting for other ranks is exposed too, but belongs to comm-wait / pipeline-bubble
    waited_s = sum(float(op.attrs.get("wait_time_s", 0.0)) for op in comm)
    total_s, exposed_s = total_s - waited_s, max(0.0, exposed_s - waited_s)
    step_s = ctx.profile.step_times_s[step] if ctx.profile.steps else 0.0
    if not comm or step_s <= 0 or total_s <= 0 or exposed_s / step_s < ctx.thresholds["share_frac"]:
        return
    by_type: dict[str, float] = defaultdict(float)
    for o in comm:
        by_type[o.op_type] += o.duration_s - float(o.attrs.get("wait_time_s", 0.0))
    op = max(comm, key=lambda o: o.duration_s)
    small = sum(1 for o in comm if o.comm.bytes < ctx.thresholds["small_message_bytes"])
    align = int(ctx.thresholds["align_bytes"]) or dma_alignment_bytes(ctx.hardware)
    unaligned = sum(1 for o in comm if o.comm.bytes % align) if align else 0
    parts = ", ".join(f"{t} {fmt_ms(d)}" for t, d in sorted(by_type.items(), key=lambda kv: -kv[1]))
    found = _finding(
        ctx, "comm-share", op, exposed_s,
        f"{len(comm)} collectives take {fmt_ms(total_s)} per step ({parts}); {fmt_ms(exposed_s)} of it "
        f"({fmt_percent(exposed_s / step_s)} of the step) is exposed, not hidden behind compute "
        f"(overlap {fmt_percent(1 - exposed_s / total_s)}); the largest, {op.op_type}, runs {op.comm.algorithm} at "
        f"{fmt_gb_per_s(op.comm.busbw_bytes_per_s)} bus bandwidth"
        + (f"; {small} messages under {fmt_bytes_in(ctx.thresholds['small_message_bytes'], 'MiB', None)}"
           if small else "")
        + (f"; {unaligned} message sizes not a multiple of {align} B" if unaligned else ""),
        "overlap communication with compute (asynchronous gradient buckets during backward), fuse small "
        "messages into larger buckets, or keep the group inside one HCCS mesh",
    )
    if found:
        yield found


_P2P_TYPES = ("Send", "Receive")


def _waits(ctx: RuleContext, p2p: bool) -> tuple[list[OpRecord], float, float] | None:
    """The last step's HCCL-stream ops that waited for other ranks (``attrs["wait_time_s"]``),
    point-to-point ones or collectives, with their total wait and the step time; ``None`` when
    the waits stay under the rule's ``share_frac`` of the step."""
    ops = [op for op in ctx.step0_ops() if op.stream == "hccl" and op.attrs.get("wait_time_s")
           and (op.op_type in _P2P_TYPES) == p2p]
    step_s = ctx.profile.step_times_s[-1] if ctx.profile.steps else 0.0
    wait_s = sum(float(op.attrs["wait_time_s"]) for op in ops)
    if not ops or step_s <= 0 or wait_s / step_s < ctx.thresholds["share_frac"]:
        return None
    return ops, wait_s, step_s


@rule("pipeline-bubble", "Pipeline stages idle waiting for each other", share_frac=0.1, needs_hardware=False)
def pipeline_bubble(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Point-to-point receives that waited (the 1F1B pipeline bubble: a stage waiting for the
    activations or gradients of its neighbours) for more than ``share_frac`` of the step."""
    found = _waits(ctx, p2p=True)
    if found is None:
        return
    waits, wait_s, step_s = found
    op = max(waits, key=lambda o: float(o.attrs["wait_time_s"]))
    found = _finding(
        ctx, "pipeline-bubble", op, wait_s,
        f"{len(waits)} receives waited {fmt_ms(wait_s)} per step ({fmt_frac(wait_s / step_s)} of the step) "
        f"for neighbouring pipeline stages; the longest, {fmt_ms(float(op.attrs['wait_time_s']))}, in {op.name}",
        "more micro-batches per step (1F1B idles (pp - 1) / (m + pp - 1) of the step), an interleaved "
        "(virtual pipeline) schedule, or fewer pipeline stages",
    )
    if found:
        yield found


@rule("comm-wait", "Collectives waiting for a slower rank", share_frac=0.03, needs_hardware=False)
def comm_wait(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Collectives that waited for other ranks to arrive (``attrs["wait_time_s"]``: simulated
    stragglers, or a real profile's communication.json Wait Time) for more than ``share_frac``
    of the step: one rank (or the link to it) is slower than the others."""
    found = _waits(ctx, p2p=False)  # a Receive's wait is the pipeline bubble (its own rule)
    if found is None:
        return
    comm, wait_s, step_s = found
    op = max(comm, key=lambda o: float(o.attrs["wait_time_s"]))
    found = _finding(
        ctx, "comm-wait", op, wait_s,
        f"{len(comm)} collectives waited {fmt_ms(wait_s)} per step ({fmt_frac(wait_s / step_s)} of the step) "
        f"for other ranks to arrive; the longest wait, {fmt_ms(float(op.attrs['wait_time_s']))}, in {op.name} "
        f"({op.op_type})" + (f" over ranks {op.comm.ranks}" if op.comm and op.comm.ranks else ""),
        "a slow rank or a slow link holds the others back: compare the ranks' step and compute times "
        "(msprof-analyze cluster analysis), check that card's HBM and AI Core clock, its load and its links",
    )
    if found:
        yield found


@rule("slow-link", "Collective slower than its links allow", factor=1.2)
def slow_link(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Collectives (simulated, with their ranks recorded) that took more than ``factor`` times
    what the hardware's links allow for their size and group, after any wait for other ranks:
    a degraded link (``attrs["link_bandwidth_frac"]``) or a congested one."""
    from simulator.costs import OpSpec, op_cost

    slow: list[tuple[OpRecord, float]] = []
    for op in ctx.step0_ops():
        if op.stream != "hccl" or op.comm is None or not op.comm.ranks:
            continue
        attrs = {k: v for k, v in op.attrs.items() if k not in ("link_bandwidth_frac", "wait_time_s", "async_op")}
        attrs["ranks"] = tuple(op.comm.ranks)
        spec = OpSpec(op.op_type, tuple(tuple(s) for s in op.input_shapes), op.dtype, tuple(sorted(attrs.items())))
        try:
            expected_s = op_cost(spec, ctx.hardware).duration_s
        except (KeyError, ValueError):
            continue
        actual_s = op.duration_s - float(op.attrs.get("wait_time_s", 0.0)) - op.alloc_stall_s
        if actual_s > ctx.thresholds["factor"] * expected_s:
            slow.append((op, actual_s - expected_s))
    if not slow:
        return
    excess_s = sum(extra for _, extra in slow)
    op, extra = max(slow, key=lambda pair: pair[1])
    found = _finding(
        ctx, "slow-link", op, excess_s,
        f"{len(slow)} collectives run slower than their links allow, {fmt_ms(excess_s)} per step in all; "
        f"{op.name} ({op.op_type}, {fmt_bytes_in(op.comm.bytes, 'MiB', 1)} over ranks {op.comm.ranks}) takes "
        f"{fmt_ms(op.duration_s - float(op.attrs.get('wait_time_s', 0.0)))} against "
        f"{fmt_ms(op.duration_s - extra - float(op.attrs.get('wait_time_s', 0.0)))} expected, "
        f"at {fmt_gb_per_s(op.comm.busbw_bytes_per_s)} bus bandwidth",
        "a degraded or congested HCCS/PCIe/RoCE link between these ranks: check the link (hccn_tool, "
        "npu-smi), or keep the group off it",
    )
    if found:
        yield found


def _step_split_findings(rule_id: str, found: Iterable[tuple[str, str, str, float, float]]) -> Iterable[RuleFinding]:
    """Findings from :mod:`.step_trace`'s rules over a real profile's step split, graded by the
    share of the step they cost."""
    for row, description, fix, gain_s, step_s in found:
        severity = grade(gain_s, step_s)
        if severity is not None:
            yield RuleFinding(rule_id, severity, row, "", None, description, fix, gain_s, gain_s / step_s)


@rule("step-communication-exposed", "Exposed communication in a real step's split (step_trace_time.csv)",
      share_frac=0.2, needs_hardware=False)
def step_communication_exposed(ctx: RuleContext) -> Iterable[RuleFinding]:
    """A real profile whose typical step spends ``share_frac`` or more in communication not
    overlapped with compute (torch_npu's step_trace_time.csv, less the pipeline's receives)."""
    return _step_split_findings("step-communication-exposed", exposed_communication(ctx.profile, ctx.thresholds["share_frac"]))


@rule("step-free", "Device idle in a real step's split: host-bound (step_trace_time.csv)", share_frac=0.1,
      needs_hardware=False)
def step_free(ctx: RuleContext) -> Iterable[RuleFinding]:
    """A real profile whose typical step leaves the device idle (``Free``) for ``share_frac``
    or more of it (msprof-analyze's advisor flags free time as host-bound too)."""
    return _step_split_findings("step-free", free_time(ctx.profile, ctx.thresholds["share_frac"]))


# -- correctness rules (fatal) ---------------------------------------------------------------------


def _fatal(rule_id: str, op: OpRecord, description: str, fix: str) -> RuleFinding:
    return RuleFinding(rule_id, "fatal", op.op_type, op.name, op.source, description, fix, 0.0, 0.0)


def _calls(ops: list[OpRecord]) -> str:
    return f"; {len(ops)} calls at this line" if len(ops) > 1 else ""


@rule("nan-inf", "NaN or Inf in an operator's output")
def nan_inf(ctx: RuleContext) -> Iterable[RuleFinding]:
    """The first op (in issue order) whose computed output holds NaN or Inf: where they appear.
    The ops after it that carry them on are counted, not reported one by one."""
    bad = [op for op in ctx.profile.ops if op.checks is not None and (op.checks.nan_count or op.checks.inf_count)]
    if not bad:
        return
    first, later = bad[0], bad[1:]
    c = first.checks
    largest = f", largest finite |value| {c.max_abs_value:.6g}" if c.max_abs_value is not None else ""
    description = (
        f"{first.name} ({first.dtype}, output {c.output_shape}) produced {c.nan_count} NaN and {c.inf_count} Inf "
        f"of {math.prod(c.output_shape)} elements{largest} in step {first.step}, the first op of the run whose "
        "output holds them")
    if later:
        sites = len({(op.op_type, op.source) for op in later})
        description += f"; later op calls that carry them on: {len(later)}, at {sites} call sites"
    yield _fatal(
        "nan-inf", first, description,
        "find what makes them here: Inf - Inf, 0/0, exp or products of large values, an Inf input (fp16 holds "
        "no |x| above 65504: check data given to npu.from_numpy); subtract the row max before exp, keep sums "
        "and normalisations in fp32, add an epsilon to divisions",
    )


@rule("fp16-overflow", "fp16 overflow: results saturated to +-65504")
def fp16_overflow(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Call sites whose fp16 results overflowed: the 910 saturates them to +-65504 (its default
    mode) instead of producing Inf, so the run goes on with wrong values."""
    sites = _by_call_site(op for op in ctx.profile.ops if op.checks is not None and op.checks.saturated_count)
    for ops in sites.values():
        op = max(ops, key=lambda o: o.checks.saturated_count)
        c = op.checks
        largest = (f" (largest |value| {c.max_abs_value:.6g} before the cast, {c.max_abs_value / FP16_MAX:.3g}x "
                   f"the fp16 limit)" if c.max_abs_value is not None else "")
        yield _fatal(
            "fp16-overflow", op,
            f"{op.name}: {c.saturated_count} of {math.prod(c.output_shape)} elements of its fp16 output "
            f"{c.output_shape} overflowed and were saturated to +-{FP16_MAX:g}{largest} in step {op.step}{_calls(ops)}",
            "compute this op in bf16 or fp32 (npu.cast its inputs), or scale its inputs down (loss scaling, "
            "normalise before the matmul, smaller initial weights)",
        )


@rule("shape-mismatch", "Operator output shape differs from the declared shape")
def shape_mismatch(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Call sites whose output shape differs from the shape the workload declared for it
    (``npu.expect_shape``)."""
    sites = _by_call_site(op for op in ctx.profile.ops if op.checks is not None
                          and op.checks.declared_shape is not None
                          and op.checks.declared_shape != op.checks.output_shape)
    for ops in sites.values():
        op = ops[0]
        c = op.checks
        yield _fatal(
            "shape-mismatch", op,
            f"{op.name} returns {c.output_shape} ({math.prod(c.output_shape)} elements) but the workload declared "
            f"{c.declared_shape} ({math.prod(c.declared_shape)} elements); inputs {op.input_shapes}{_calls(ops)}",
            "check the operands: a transpose flag, the order of the axes, a reshape that is missing or wrong, "
            "the weight's layout (out_features, in_features) against (in_features, out_features)",
        )


@rule("out-of-bounds", "View or DMA reaching past its allocation")
def out_of_bounds(ctx: RuleContext) -> Iterable[RuleFinding]:
    """Call sites of views (``npu.view``) and copies (``npu.memcpy``, op type ``Memcpy``) that
    reach past the end of their tensor's allocation: on the device they read or overwrite
    whatever lies beyond it."""
    sites = _by_call_site(op for op in ctx.profile.ops if op.checks is not None and op.checks.out_of_bounds_elements)
    for ops in sites.values():
        op = max(ops, key=lambda o: o.checks.out_of_bounds_elements)
        c = op.checks
        if op.op_type == "Memcpy":
            yield _fatal("out-of-bounds", op, _copy_overrun(op) + _calls(ops),
                         "fix the copy's size or offsets: offset + nbytes must stay within each tensor's allocation "
                         "(aclrtMemcpy returns ACL_ERROR_INVALID_PARAM, torch raises on mismatched slices; on the "
                         "device it corrupts or reads whatever lies beyond)")
            continue
        base = op.input_shapes[0] if op.input_shapes else []
        offset = op.attrs.get("offset_elements", 0)
        where = f"at offset {offset} into a {base} tensor of {math.prod(base)} elements"
        if "allocation_elements" in op.attrs:  # a view of a view: the allocation underneath bounds it
            where = (f"at offset {offset} into a {base} view, element {op.attrs['allocation_offset_elements']} of "
                     f"an allocation of {op.attrs['allocation_elements']} elements,")
        yield _fatal(
            "out-of-bounds", op,
            f"{op.name}: a {c.output_shape} view ({math.prod(c.output_shape)} elements) {where} reaches "
            f"{c.out_of_bounds_elements} elements past its allocation{_calls(ops)}",
            "fix the view's offset or shape: offset + elements must stay within the tensor (torch raises "
            "'setStorage: ... out of bounds'); slice with the tensor's own strides instead of raw offsets",
        )


def _copy_overrun(op: OpRecord) -> str:
    """The evidence of an out-of-bounds ``Memcpy`` record, from its attributes."""
    a = op.attrs
    parts = []
    for label, verb, noun in (("src", "reads", "source"), ("dst", "writes", "destination")):
        past = a.get(f"{label}_past_bytes", 0)
        if past:
            start = a[f"{label}_allocation_offset_bytes"]
            within = f", from its byte {start}" if start != a[f"{label}_offset_bytes"] else ""  # a view
            parts.append(f"{verb} {past} bytes past the end of the {noun}'s allocation of "
                         f"{a[f'{label}_allocation_bytes']} bytes{within}")
    shapes = op.input_shapes
    return (f"{op.name}: a copy of {a['nbytes']} bytes ({op.dtype}) from byte {a['src_offset_bytes']} of a {shapes[1]} "
            f"source into byte {a['dst_offset_bytes']} of a {shapes[0]} destination {' and '.join(parts)}")


# -- running the rules ---------------------------------------------------------------------------


def run_rules(
    profile: Profile,
    hardware: HardwareSpec | None,
    *,
    disabled: Iterable[str] = (),
    thresholds: Mapping[str, Mapping[str, float]] | None = None,
    rules: Mapping[str, Rule] | None = None,
) -> list[RuleFinding]:
    """Every enabled rule over ``profile``, findings ordered by gain (fatal first).

    ``thresholds`` overrides defaults per rule id (``{"slow-op": {"factor": 3}}``). A rule
    that raises yields an ``internal-error`` finding naming it; the others still run. Without
    ``hardware`` (an imported real profile) the rules that need a hardware spec are skipped.

    Raises:
        ValueError: an unknown rule id in ``disabled`` or ``thresholds``, or an unknown
            threshold name (the message lists the choices).
    """
    registry = RULES if rules is None else rules
    off = set(disabled)
    overrides = dict(thresholds or {})
    unknown = sorted((off | set(overrides)) - set(registry))
    if unknown:
        raise ValueError(f"unknown diagnosis rule {', '.join(map(repr, unknown))}; known: {', '.join(sorted(registry))}")
    findings: list[RuleFinding] = []
    if profile.is_empty:
        return findings
    for rule_id, spec in registry.items():
        if rule_id in off or (hardware is None and getattr(spec, "needs_hardware", True)):
            continue
        values = dict(spec.thresholds)
        for name, value in overrides.get(rule_id, {}).items():
            if name not in values:
                raise ValueError(f"rule {rule_id!r} has no threshold {name!r}; its thresholds: "
                                 f"{', '.join(sorted(values)) or 'none'}")
            values[name] = float(value)
        try:
            produced = [f for f in spec.function(RuleContext(profile, hardware, values)) if f is not None]
            for f in produced:
                if not isinstance(f, RuleFinding) or f.severity not in SEVERITY_ORDER:
                    raise TypeError(f"it yielded {f!r}; a rule yields RuleFinding objects with severity "
                                    f"{', '.join(SEVERITY_ORDER)}")
            findings.extend(produced)
        except Exception as exc:  # noqa: BLE001 - a broken rule must not take the session down
            findings.append(_internal_error(rule_id, f"raised {type(exc).__name__}: {exc}"))
    findings.sort(key=lambda f: (SEVERITY_ORDER.index(f.severity), -f.gain_s))
    return findings


def _internal_error(rule_id: str, problem: str) -> RuleFinding:
    return RuleFinding("internal-error", "warning", "-", "-", None, f"diagnosis rule {rule_id!r} {problem}",
                       f"report this rule's failure to its author, or switch it off with oam_disable_rules = {rule_id}",
                       0.0, 0.0)


def check_rules(rules: Mapping[str, object]) -> None:
    """Check a registry after the ``pytest_oam_register_rules`` hook.

    Raises:
        ValueError: an entry that is not a :class:`Rule` with a callable function, or whose id
            differs from its key.
    """
    for key, value in rules.items():
        if not isinstance(value, Rule) or not callable(value.function) or not isinstance(value.thresholds, dict):
            raise ValueError(  # noqa: TRY004 - reported as a usage error like the others
                f"diagnosis rule {key!r} must be a pytest_oam.rules.Rule(id, title, function, thresholds), "
                f"got {value!r}")
        if value.id != key:
            raise ValueError(f"diagnosis rule registered as {key!r} has id {value.id!r}")


def parse_rule_thresholds(lines: Iterable[str]) -> dict[str, dict[str, float]]:
    """ini ``oam_rule_thresholds`` lines ``slow-op.factor = 3`` -> ``{"slow-op": {"factor": 3.0}}``.

    Raises:
        ValueError: a line not of the form RULE.NAME = NUMBER.
    """
    out: dict[str, dict[str, float]] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        rule_id, dot, name = key.strip().rpartition(".")
        try:
            number = float(value)
        except ValueError:
            number = None
        if number is not None and (not math.isfinite(number) or number < 0):
            raise ValueError(f"oam_rule_thresholds: {line!r}: a threshold must be a finite number >= 0")
        if name.strip() in out.get(rule_id.strip(), {}):
            raise ValueError(f"oam_rule_thresholds: {key.strip()} is given twice")
        if not sep or not dot or not rule_id or not name or number is None:
            raise ValueError(f"oam_rule_thresholds: {line!r} is not of the form RULE.NAME = NUMBER "
                             "(e.g. slow-op.factor = 3)")
        out.setdefault(rule_id.strip(), {})[name.strip()] = number
    return out
