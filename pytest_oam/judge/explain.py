"""Diagnosis of a regression: what regressed, which counters moved, where, how bad, what to do.

Pure functions over a :class:`~pytest_oam.compare.RunComparison` and the current profile.
Thresholds live in this module's constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.costs import CUBE_OP_TYPES  # derived from the cost-model registry
from simulator.hardware import HardwareSpec
from simulator.profile import LiveMemory, MemoryPeak, OpRecord, Profile

from ..files.baseline import OpStats, RunBaseline
from ..format import (
    fmt_bytes,
    fmt_frac,
    fmt_inverse_percent,
    fmt_ms,
    fmt_percent,
    fmt_us,
    fmt_value,
)
from .card import allocator_block_bytes, dma_alignment_bytes
from .compare import CounterChange, RunComparison, portable_site, site_key
from .severity import Severity, grade_share
from .step_trace import STEP_TRACE_ROWS, regressed_row_advice

#: Severity of a regressed peak memory or allocator time (no share of the step to grade by).
MEMORY_REGRESSION_SEVERITY: Severity = "warning"
#: Call sites listed per regressed op type.
MAX_CALL_SITES = 3
#: A last wave that keeps fewer than this share of the cores busy is an idle last wave...
IDLE_LAST_WAVE_FRAC = 0.5
#: ... when at least this share of the kernel's core time idles because of it.
IDLE_CORE_TIME_FRAC = 0.05
#: A last tile along an axis filled less than this share is a nearly empty tile.
NEARLY_EMPTY_TILE_FRAC = 0.25
#: Padding to the Cube fractal above this share of an axis is reported.
PADDING_WASTE_FRAC = 0.05


@dataclass(frozen=True)
class Finding:
    """One regressed op type, explained. ``severity`` on the scale of :mod:`pytest_oam.severity`:
    by the share of the baseline step the regression costs (a new op type: by its own time when
    the step regressed, else ``info``; peak memory and allocator time: ``warning``)."""

    op_type: str
    severity: Severity
    delta_s: float
    step_share_frac: float
    counters: list[CounterChange]
    call_sites: list[tuple[str, float]]
    advice: list[str]
    kind: str = "regressed"  # or "new": an op type the baseline does not have


def memory_bound(mte2_ratio: float, mac_ratio: float, vec_ratio: float) -> float:
    """msprof's ``memory_bound``: ``mte2_ratio / max(mac_ratio, vec_ratio)`` (> 1: memory-bound)."""
    compute = max(mac_ratio, vec_ratio)
    return mte2_ratio / compute if compute > 0 else float("inf")


def _advice(
    op_type: str, counters: list[CounterChange], current: OpStats | None, baseline: OpStats | None = None,
    alignment_bytes: int | None = None,
) -> list[str]:
    """What to do about a regressed op type; ``alignment_bytes``: the card's DMA alignment
    (:func:`~pytest_oam.judge.card.dma_alignment_bytes`), quoted when the op moves more DMA transfers."""
    moved = {c.name: c for c in counters}
    flash = op_type.startswith("FlashAttention")
    tips = []
    stall = moved.get("alloc_stall_s")
    if stall is not None and stall.current > stall.baseline:
        tips.append(f"{op_type} waited {fmt_ms(stall.current, 3)} per step for the caching allocator (was "
                    f"{fmt_ms(stall.baseline, 3)}): device mallocs, page mappings or a cache flush before its "
                    "calls, not the kernel; compare the allocator settings (PYTORCH_NPU_ALLOC_CONF) and memory "
                    "of the two runs, and pre-allocate the buffers that are allocated anew")
    if "count_per_step" in moved:
        count = moved["count_per_step"]
        cause = ("look for added or unfused calls" if count.current > count.baseline
                 else "fewer, larger calls: check what was fused or batched into them")
        tips.append(f"{op_type} now runs {count.current:g} times per step (was {count.baseline:g}): {cause}")
    elif "flop" in moved and moved["flop"].current > moved["flop"].baseline:
        tips.append(f"{op_type} does more work: its input shapes changed; check the shapes at the call sites")
    more_bytes = "hbm_bytes" in moved and moved["hbm_bytes"].current > moved["hbm_bytes"].baseline
    more_dma = "dma_count" in moved and moved["dma_count"].current > moved["dma_count"].baseline
    if flash and (more_bytes or more_dma):
        tips.append("more K/V traffic: a smaller block_size re-reads K and V more often in more, smaller "
                    "DMA transfers, and fusion=False round-trips the score matrix through HBM; "
                    "restore the larger block_size / fusion")
    else:
        if more_bytes:
            tips.append("more HBM traffic: check tiling and fusion of this op")
        if more_dma:
            tips.append("more DMA transfers: smaller tiles pay the MTE start-up cost more often; use larger tiles"
                        + (f" and sizes aligned to {alignment_bytes} bytes" if alignment_bytes else ""))
    overlap = moved.get("overlap_frac")
    if overlap is not None and overlap.current < overlap.baseline and stall is None:
        tips.append(f"DMA/compute overlap fell {fmt_percent(overlap.baseline)} -> {fmt_percent(overlap.current)}: "
                    "the next tiles are no longer prefetched while the Cube/Vector units work; check "
                    "pipeline_stages and the buffers in flight")
    if not tips:
        tips.append("same work and traffic but slower: the kernel lost DMA/compute overlap "
                    "(check pipeline_stages) or its implementation or launch cost changed")
    if current is not None and baseline is not None:
        bound = memory_bound(current.mte2_ratio, current.mac_ratio, current.vec_ratio)
        before = memory_bound(baseline.mte2_ratio, baseline.mac_ratio, baseline.vec_ratio)
        if bound > 1 >= before:
            tips.append(f"the op became memory-bound (memory_bound {before:.2f} -> {bound:.2f}): DMA no "
                        "longer hides behind compute")
    return tips


def _flush_sites(profile: Profile | None) -> tuple[str, list[tuple[str, float]]]:
    """Where the flushes of ``profile``'s warm steps stalled: a text naming step, op and wait of
    the first three, and the call sites with the seconds they waited in all warm steps."""
    if profile is None:
        return "", []
    from .compare import warm_steps

    warm = warm_steps(profile.steps)
    stalled = [op for op in profile.ops if op.alloc_retries and op.step in warm]
    if not stalled:
        return "", []
    named = "; ".join(f"step {op.step}: {op.name} ({op.op_type}) waited {fmt_ms(op.alloc_stall_s)}"
                      for op in stalled[:3])
    more = f"; and {len(stalled) - 3} more" if len(stalled) > 3 else ""
    sites: dict[str, float] = {}
    for op in stalled:
        if op.source:
            sites[op.source] = sites.get(op.source, 0.0) + op.alloc_stall_s
    return f"; the flushes stalled {named}{more}.", sorted(sites.items(), key=lambda kv: -kv[1])


def _holder(group: LiveMemory, root: str | None = None, count: int | None = None) -> str:
    """``MatMul outputs at model.py:12``: the group's kind and op type, and its call site as a
    baseline keeps it (:func:`pytest_oam.compare.portable_site`, relative to ``root``)."""
    s = "" if (group.count if count is None else count) == 1 else "s"
    what = {"output": f"{group.op_type} output{s}", "workspace": f"{group.op_type} workspace{s}",
            "tensor": f"tensor{s} made"}[group.kind]
    return f"{what} at {portable_site(group.source, root)}" if group.source else what


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@dataclass
class _Held:
    """The allocations of one call-site key at one peak: their bytes and count, and the group
    that stands for them in the text (the largest)."""

    size_bytes: int
    count: int
    group: LiveMemory


def _held_by_key(groups: list[LiveMemory]) -> dict[tuple, _Held]:
    out: dict[tuple, _Held] = {}
    for g in groups:
        key = (g.op_type, g.kind, site_key(g.source))
        held = out.get(key)
        if held is None:
            out[key] = _Held(g.size_bytes, g.count, g)
        else:
            held.size_bytes += g.size_bytes
            held.count += g.count
            if g.size_bytes > held.group.size_bytes:
                held.group = g
    return out


def _moved_key(key: tuple, held: _Held) -> tuple:
    """A group's identity when the user's code moved (lines added above the call): its key with
    the user's line dropped (a library line stays: the simulator's files do not move between
    comparable runs), and the same bytes and count."""
    op_type, kind, site = key
    user, sep, library = (site or "").partition(" (in ")
    return op_type, kind, user.rpartition(":")[0], sep + library, held.size_bytes, held.count


def _peak_holders(memory: PeakMemory) -> tuple[str, list[tuple[str, float]], str | None]:
    """What held more (and less) memory at the allocated peak than at the baseline's, or, when
    the baseline does not say, what held the most: a clause for the finding, the (call site,
    bytes at the peak) of the groups that grew, and the kind of the one that grew most.

    Groups match by op type, kind and :func:`pytest_oam.compare.site_key` (file names and
    lines; what meets under one key is added up); a group of the same bytes and count whose
    user line alone moved matches too (code edited above it); any other change of site counts
    as a new group and a gone one. A list cut to its largest groups (its sizes add up to less
    than its peak) cannot tell a group it lacks that is no larger than its smallest: such a
    group is not compared. Differences of allocator rounding alone (``memory.rounding_bytes`` per
    allocation) are not told.
    """
    current_live, baseline_live = memory.current_live, memory.baseline_live
    if not current_live:
        return "", [], None
    reached = memory.reached()
    if baseline_live is None:
        top = current_live[:MAX_CALL_SITES]
        held = "; ".join(f"{_holder(g, memory.root)}: {fmt_bytes(g.size_bytes)}" for g in top)
        clause = (f"; at {reached} the most was held by {held} (the baseline has no record of what held its peak: "
                  "save it again to compare)")
        return clause, [(g.source, float(g.size_bytes)) for g in top if g.source], None

    current, base = _held_by_key(current_live), _held_by_key(baseline_live)
    spare = {_moved_key(key, held): key for key, held in base.items() if key not in current}
    for key, held in current.items():
        if key not in base and _moved_key(key, held) in spare:
            base[key] = base.pop(spare.pop(_moved_key(key, held)))

    def smallest_if_cut(groups: list[LiveMemory], peak_bytes: int | None) -> int | None:
        cut = peak_bytes is not None and sum(g.size_bytes for g in groups) < peak_bytes
        return min((g.size_bytes for g in groups), default=0) if cut else None

    cut_current = smallest_if_cut(current_live, memory.current_peak_bytes)
    cut_base = smallest_if_cut(baseline_live, memory.baseline_peak_bytes)
    changes = []
    for key in current.keys() | base.keys():
        now, was = current.get(key), base.get(key)
        if was is None and cut_base is not None and now.size_bytes <= cut_base:
            continue  # may be one of the groups too small for the baseline to keep
        if now is None and cut_current is not None and was.size_bytes <= cut_current:
            continue
        delta = (now.size_bytes if now else 0) - (was.size_bytes if was else 0)
        if abs(delta) > memory.rounding_bytes * max(now.count if now else 0, was.count if was else 0):
            changes.append((delta, now, was, key))

    def order(change: tuple) -> tuple:  # largest change first, then by key: the same text every run
        return -abs(change[0]), repr(change[3])

    grew = sorted((c for c in changes if c[0] > 0), key=order)
    shrank = sorted((c for c in changes if c[0] < 0), key=order)

    def told(items: list[tuple], limit: int, sign: str) -> str:
        parts = []
        for delta, now, was, _ in items[:limit]:
            size = f"{sign}{fmt_bytes(abs(delta))}"
            if now is not None and was is not None:
                parts.append(f"{_holder(now.group, memory.root, now.count)} {size} ({fmt_bytes(was.size_bytes)} -> "
                             f"{fmt_bytes(now.size_bytes)}, {was.count} -> {_plural(now.count, 'allocation')})")
            elif now is not None:
                among = " among the groups it kept" if cut_base is not None else ""
                parts.append(f"{_holder(now.group, memory.root, now.count)} {size} (new: "
                             f"{_plural(now.count, 'allocation')}, none{among} at the baseline's peak)")
            else:
                parts.append(f"{_holder(was.group, None, was.count)} {size} (no longer live at the peak)")
        rest = items[limit:]
        if rest:
            parts.append(f"{len(rest)} more {sign}{fmt_bytes(abs(sum(c[0] for c in rest)))}")
        return "; ".join(parts)

    less = f"; held less: {told(shrank, 2, '-')}" if shrank else ""
    if not grew:
        kept = " (the baseline kept only its largest groups: smaller ones are not compared)" if cut_base else ""
        return f"; at {reached} no call site held more than at the baseline's peak{kept}{less}", [], None
    sites = [(now.group.source, float(now.size_bytes)) for _, now, _, _ in grew[:MAX_CALL_SITES] if now.group.source]
    return f"; at {reached} held more: {told(grew, MAX_CALL_SITES, '+')}{less}", sites, grew[0][1].group.kind


@dataclass(frozen=True)
class PeakMemory:
    """What a diagnosis knows of the memory at the allocated peaks: the groups live at the
    current peak (the profile's ``memory_peak.live``, or a baseline's ``memory_peak_live``) and
    at the baseline's (``None`` when unknown), both peaks in bytes (to tell a cut list), the
    current peak itself (``None`` when the profile has none), the pytest rootdir, and the
    caching allocator's rounding of one allocation in bytes (a change no larger per allocation
    is not told: :func:`~pytest_oam.judge.card.allocator_block_bytes` of the run's card)."""

    current_live: list[LiveMemory] | None = None
    baseline_live: list[LiveMemory] | None = None
    current_peak_bytes: int | None = None
    baseline_peak_bytes: int | None = None
    peak: MemoryPeak | None = None
    root: str | None = None
    rounding_bytes: int = field(default_factory=lambda: allocator_block_bytes(None) or 0)

    @classmethod
    def of(cls, current: RunBaseline, baseline: RunBaseline, profile: Profile | None = None,
           root: str | None = None, hardware: HardwareSpec | None = None) -> PeakMemory:
        """From the two runs' summaries, with the current profile's whole list and peak when
        there is a profile; ``hardware``: the card's spec (``None``: as every bundled one)."""
        peak = profile.memory_peak if profile is not None else None
        return cls(current_live=peak.live if peak is not None else current.memory_peak_live,
                   baseline_live=baseline.memory_peak_live, current_peak_bytes=current.memory_allocated_peak_bytes,
                   baseline_peak_bytes=baseline.memory_allocated_peak_bytes, peak=peak, root=root,
                   rounding_bytes=allocator_block_bytes(hardware) or 0)

    def reached(self) -> str:
        if self.peak is None:
            return "the allocated peak"
        by = self.peak.reached_by
        return f"the allocated peak (step {self.peak.step}, reached by a {fmt_bytes(by.size_bytes)} {_holder(by, self.root)})"


def _memory_finding(v, profile: Profile | None = None, memory: PeakMemory | None = None,
                    allocated=None) -> Finding:
    """A regression of peak device memory, of allocator time or of cache flushes (with the ops
    the flushes stalled, from ``profile``). A regressed allocated peak says what held more
    memory at it (``memory``); a regressed reserved peak points there when the allocated peak
    regressed too (``allocated``, its verdict), and otherwise says the growth is memory the
    cache holds that no tensor used."""
    sites: list[tuple[str, float]] = []
    memory = memory or PeakMemory()
    if v.unit == "count":
        stalled, sites = _flush_sites(profile)
        what = (f"allocations that flushed the caching allocator's cache and retried: {fmt_value(v.baseline_s, 'count')}"
                f" -> {fmt_value(v.current_s, 'count')} (each flush synchronises the device and frees every unsplit "
                f"cached segment, then the next allocations call aclrtMalloc again){stalled}")
        tip = ("the cache fragments until a new segment no longer fits: sizes that change from step to step leave "
               "cached blocks no later tensor fits; pre-allocate a pool as large as the step's allocated peak "
               "(allocate and free one tensor of that size first: the cache keeps the segment and carves every "
               "later tensor out of it), use expandable_segments, or pad sequence lengths to a few buckets")
    elif v.unit == "bytes":
        grew = (f"peak {v.op_type.split('.')[1].replace('_peak', '')} memory grew "
                f"{fmt_percent(v.change_frac, 1, signed=True)} "
                f"({fmt_bytes(v.baseline_s)} -> {fmt_bytes(v.current_s)})")
        tip = ("find the tensors that live longer or grew (activations kept across steps, a cache that is never "
               "freed); with little headroom left the caching allocator starts to flush and retry")
        if v.op_type == "memory.reserved_peak" and allocated is not None and allocated.status != "regressed":
            change = ("" if allocated.change_frac is None
                      else f" {fmt_percent(allocated.change_frac, 1, signed=True)}")
            what = (f"{grew}, the allocated peak only{change}: the rest is memory the caching allocator reserved "
                    "that no tensor held at the peak")
            tip = ("a request that no cached free block fits gets a new segment while the cached ones stay reserved "
                   "(sizes that change between allocations); pre-allocate a pool as large as the largest request, "
                   "use expandable_segments:True, or keep sizes to a few buckets")
        elif v.op_type == "memory.reserved_peak" and allocated is not None:
            what = grew + ("; what held more at the allocated peak: see memory.allocated_peak"
                           if memory.current_live else "")  # told there only when there is a list
        else:
            held, sites, kind = _peak_holders(memory)
            what = grew + held
            if kind == "workspace":
                tip = ("an op's workspace (the scratch memory CANN's kernel asks for) is sized by its shapes and "
                       "tiling: a longer sequence or another tiling can need more; " + tip)
    else:
        what = f"time in the allocator per step grew {fmt_percent(v.change_frac, 1, signed=True)}"
        tip = ("more or different-sized allocations each step, or a costlier allocator setting: reuse buffers, "
               "pre-allocate a pool for tensors whose size changes every step, or compare the allocator settings "
               "(expandable_segments maps memory page by page)")
    return Finding(op_type=v.op_type, severity=MEMORY_REGRESSION_SEVERITY, delta_s=0.0, step_share_frac=0.0, counters=[],
                   call_sites=sites, advice=[f"{what}: {tip}"])


def _call_sites(profile: Profile | None, op_type: str) -> list[tuple[str, float]]:
    if profile is None:
        return []
    times: dict[str, float] = {}
    for op in profile.ops:
        if op.op_type == op_type and op.step == 0:
            key = op.source or "<unknown>"
            times[key] = times.get(key, 0.0) + op.duration_s
    return sorted(times.items(), key=lambda kv: -kv[1])[:MAX_CALL_SITES]


def diagnose(
    comparison: RunComparison,
    profile: Profile | None = None,
    current: dict[str, OpStats] | None = None,
    baseline: dict[str, OpStats] | None = None,
    memory: PeakMemory | None = None,
    hardware: HardwareSpec | None = None,
) -> list[Finding]:
    """Findings for each regressed op type and each new one, biggest time first.

    ``current`` and ``baseline`` (op type -> stats) add the check for an op that became
    memory-bound; ``memory`` says what held the memory at a regressed allocated peak;
    ``hardware``, the current run's card, gives the figures the advice quotes (``None``: an
    imported real profile, with the figures every bundled spec shares).
    """
    alignment_bytes = dma_alignment_bytes(hardware)
    findings = []
    step_s = comparison.baseline_step_s
    allocated = next((v for v in comparison.verdicts if v.op_type == "memory.allocated_peak"), None)
    for v in comparison.verdicts:
        if v.status != "regressed" or v.baseline_s is None or v.current_s is None or v.op_type == "step":
            continue
        if v.unit in ("bytes", "count") or v.op_type == "alloc_time":
            findings.append(_memory_finding(v, profile, memory, allocated))
            continue
        delta = v.current_s - v.baseline_s
        share = delta / step_s if step_s > 0 else 0.0
        counters = comparison.counters.get(v.op_type, [])
        findings.append(
            Finding(
                op_type=v.op_type,
                severity=grade_share(share),
                delta_s=delta,
                step_share_frac=share,
                counters=counters,
                call_sites=_call_sites(profile, v.op_type),
                advice=(regressed_row_advice(v.op_type) if v.op_type in STEP_TRACE_ROWS  # step.free ...
                        else _advice(v.op_type, counters, (current or {}).get(v.op_type), (baseline or {}).get(v.op_type),
                                     alignment_bytes)),
            )
        )
    step_regressed = any(v.op_type == "step" and v.status == "regressed" for v in comparison.verdicts)
    for v in comparison.verdicts:
        if v.status != "new" or v.current_s is None:
            continue
        share = v.current_s / step_s if step_s > 0 else 0.0
        findings.append(
            Finding(
                op_type=v.op_type,
                severity=grade_share(share) if step_regressed else "info",
                delta_s=v.current_s,
                step_share_frac=share,
                counters=[],
                call_sites=_call_sites(profile, v.op_type),
                advice=[(f"{v.op_type} is new: the baseline has no such op type; remove the call if it "
                         "was not intended, or accept it by saving a new baseline (--oam-save-baseline, or "
                         "oam baseline create)")],
                kind="new",
            )
        )
    findings.sort(key=lambda f: -f.delta_s)
    return findings


# -- shape rules: why one op call runs below its shape class ----------------------------------------


def _wave_finding(record: OpRecord, cores: int, unit: str) -> str | None:
    blocks = record.block_dim
    if blocks < 1:
        return None
    waves = -(-blocks // cores)
    last = blocks - (waves - 1) * cores
    idle = (cores - last) / (waves * cores)
    if waves > 1 and last / cores < IDLE_LAST_WAVE_FRAC and idle >= IDLE_CORE_TIME_FRAC:
        return (f"idle last wave: {blocks} blocks over {cores} {unit} run in {waves} waves and the last keeps "
                f"{last} of {cores} busy, so {fmt_percent(idle)} of the kernel's core time idles; a work split "
                f"that is a multiple of {cores} blocks avoids it")
    if waves == 1 and last / cores < IDLE_LAST_WAVE_FRAC:
        noun = "block" if blocks == 1 else "blocks"
        return f"only {blocks} {noun} for {cores} {unit}: {cores - blocks} of them idle for the whole kernel"
    return None


def _tile_finding(axis: str, value: int, tile: int, what: str) -> str | None:
    rem = value % tile
    if value > tile and 0 < rem < tile * NEARLY_EMPTY_TILE_FRAC:
        return (f"{axis} = {value} is {rem} past a multiple of {tile}, the {what}: the last {what} is "
                f"{fmt_frac(rem / tile)} full but costs a whole one; {value - rem} or {value - rem + tile} "
                f"would not waste it")
    return None


def _padding_finding(axis: str, value: int, fractal: int) -> str | None:
    padded = -(-value // fractal) * fractal
    if padded != value and (padded - value) / padded > PADDING_WASTE_FRAC:
        return (f"{axis} = {value} is not a multiple of {fractal} (the Cube unit's fractal): it is padded to "
                f"{padded}, {fmt_percent((padded - value) / padded)} of the Cube work along it is padding")
    return None


def _shape_reasons(record: OpRecord, hw: HardwareSpec) -> list[tuple[str | None, int, str]]:
    """:func:`shape_findings` with, for each, the axis it is about and the multiple that axis
    wants (``(None, 0, text)`` for the wave findings, which are about the work split)."""
    from simulator.costs import matmul_tile

    cube = record.op_type in CUBE_OP_TYPES
    cores = hw.ai_core.count if cube else hw.ai_core.vector_core_count
    reasons: list[tuple[str | None, int, str | None]] = [(None, 0, _wave_finding(record, cores,
                                                                               "AI Cores" if cube else "Vector units"))]
    fractal = hw.cube_unit.fractal_k
    if record.op_type in ("MatMul", "BatchMatMul") and len(record.input_shapes) == 2:
        (*_, m, k), (*_, n) = record.input_shapes[0], record.input_shapes[1]
        m_t, n_t = matmul_tile(m, n, hw)
        reasons += [("M", m_t, _tile_finding("M", m, m_t, "tile row")), ("N", n_t, _tile_finding("N", n, n_t, "tile column"))]
        reasons += [(axis, fractal, _padding_finding(axis, v, fractal)) for axis, v in (("M", m), ("K", k), ("N", n))]
    elif record.op_type in ("FlashAttention", "FlashAttentionGrad") and record.input_shapes:
        _, _, seq, head_dim = record.input_shapes[0]
        block = int(record.attrs.get("block_size", 128))
        rem = seq % block
        if rem:
            text = (f"seq = {seq} is not a multiple of block_size {block}: each query row's last K/V block is "
                    f"{fmt_percent(rem / block)} full, and the last query block too")
            reasons.append(("seq", block, text))
        reasons.append(("head_dim", fractal, _padding_finding("head_dim", head_dim, fractal)))
    return [(axis, unit, text) for axis, unit, text in reasons if text]


def shape_findings(record: OpRecord, hw: HardwareSpec) -> list[str]:
    """Why this call's shape runs below its shape class: idle last wave, a nearly empty last
    tile, padding to the Cube fractal, a sequence that is not a multiple of the block size.

    Pure: reads the record's shapes, ``block_dim`` and attributes, and the hardware's core
    count and tiles. Thresholds: :data:`IDLE_LAST_WAVE_FRAC`, :data:`NEARLY_EMPTY_TILE_FRAC`,
    :data:`PADDING_WASTE_FRAC`.
    """
    return [text for _, _, text in _shape_reasons(record, hw)]


def misalignment_findings(record: OpRecord, hw: HardwareSpec) -> list[str]:
    """The :func:`shape_findings` about an axis that is not aligned (padding, a nearly empty
    last tile, a sequence that is not a multiple of the block), not about the work split."""
    return [text for axis, _, text in _shape_reasons(record, hw) if axis is not None]


#: Attributes of a record that say how a call ran, not what it computes; left out when re-costing.
_RUN_ATTRS = ("wait_hccl_op", "wait_time_s", "link_bandwidth_frac", "async_op")


@dataclass(frozen=True)
class AlignmentGain:
    """What aligning one call's shape would save, re-costed by the simulator's cost model.

    ``time_s`` is the call as it is and ``aligned_time_s`` the aligned call (seconds, from
    :func:`simulator.costs.op_cost`, without stalls or injected slowdowns); ``work_frac`` is the
    call's FLOP over the aligned call's. ``gain_s = max(0, time_s - aligned_time_s x work_frac)``:
    the time the call's work would take at the aligned shape's rate.
    """

    changes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    time_s: float
    aligned_time_s: float
    work_frac: float
    gain_s: float

    def describe(self) -> str:
        return (f"aligned ({', '.join(self.changes)}) the cost model gives {fmt_us(self.aligned_time_s)} for "
                f"{fmt_inverse_percent(self.work_frac)} of the work, so this call's work would take "
                f"{fmt_us(self.aligned_time_s * self.work_frac)} instead of {fmt_us(self.time_s)}")


def alignment_gain(record: OpRecord, hw: HardwareSpec) -> AlignmentGain | None:
    """Re-cost a Cube op call with the axes :func:`shape_findings` flags (padding to the Cube
    fractal, a nearly empty last tile, a sequence that is not a multiple of the block) aligned:
    each rounded down to the multiple it wants (up when it is smaller than one multiple).

    Rounding down keeps the comparison conservative: a smaller shape never gets credit for the
    higher arithmetic intensity of a larger one, so for a memory-bound op the estimate errs low.
    ``None``: no axis to align, or the cost model cannot cost the aligned call.
    """
    from simulator.costs import OpSpec, op_cost

    axes: dict[str, int] = {}
    for axis, unit, _ in _shape_reasons(record, hw):
        if axis is not None and axis not in axes:
            axes[axis] = unit  # the first reason about an axis (the tile, before the fractal) decides
    if not axes:
        return None
    shapes = [list(s) for s in record.input_shapes]
    # where each axis lives: (shape index, axis index) pairs
    if record.op_type in ("MatMul", "BatchMatMul"):
        where = {"M": [(0, -2)], "K": [(0, -1), (1, -2)], "N": [(1, -1)]}
    else:
        seq = shapes[0][2]
        where = {"seq": [(i, 2) for i, s in enumerate(shapes) if s[2] == seq],
                 "head_dim": [(i, 3) for i in range(len(shapes))]}
    changes = []
    for axis, unit in axes.items():
        i, j = where[axis][0]
        value = shapes[i][j]
        aligned = value // unit * unit if value >= unit else unit
        changes.append(f"{axis} {value} -> {aligned}")
        for i, j in where[axis]:
            shapes[i][j] = aligned
    attrs = tuple(sorted((k, v) for k, v in record.attrs.items() if k not in _RUN_ATTRS))
    as_is = OpSpec(record.op_type, tuple(tuple(s) for s in record.input_shapes), record.dtype, attrs)
    new = OpSpec(record.op_type, tuple(tuple(s) for s in shapes), record.dtype, attrs)
    try:
        cost, aligned_cost = op_cost(as_is, hw), op_cost(new, hw)
    except (KeyError, ValueError):
        return None
    if cost.flop <= 0 or aligned_cost.flop <= 0:
        return None
    work_frac = cost.flop / aligned_cost.flop
    gain_s = max(0.0, cost.duration_s - aligned_cost.duration_s * work_frac)
    return AlignmentGain(tuple(changes), new.shapes, cost.duration_s, aligned_cost.duration_s, work_frac, gain_s)
