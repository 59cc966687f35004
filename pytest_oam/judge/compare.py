"""Comparison of a profiled run with its baseline: pure functions over profiles.

Per op type, the compared value is the op type's total time within a step, median over steps;
the whole step time is compared too, as the row ``step``. A current value above
``baseline * (1 + limit)`` is a regression; below ``baseline * (1 - limit)`` an improvement.
This module imports neither pytest nor the simulator runtime.
"""

from __future__ import annotations

import dataclasses
import numbers
import posixpath
import statistics
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath

from simulator.profile import LiveMemory, Profile

from ..files.baseline import PEAK_LIVE_GROUPS, OpStats, PeakHolder, RunBaseline
from .status import STATUS_ORDER, GateStatus  # noqa: F401 - STATUS_ORDER kept importable here
from .step_trace import step_trace_medians, step_trace_pairs
from .thresholds import MEMORY_ROWS, STEP_ROW, LimitResolver

#: Relative changes below this are floating-point noise (sums taken in another order), never
#: a regression or an improvement, even under a 0% limit.
FLOAT_NOISE_FRAC = 1e-9
#: Smallest change that counts between imported real profiles (``real:*`` hardware), in the
#: plugin's gate and in ``compare_profiles``: run-to-run noise of a few microseconds on tiny ops
#: (the two real torch_npu AlexNet runs in the tests differ by up to 4 us on ops of 3-12 us) is
#: not a regression. Simulated runs are deterministic: 0 for them.
REAL_MIN_DELTA_S = 20e-6
#: Runs shorter than this have no p99: with fewer steps it is just the maximum, one sample.
JITTER_MIN_STEPS = 50
#: The percentile a jitter baseline keeps and compares.
TAIL_PERCENTILE = 99

#: Counters compared for a regressed op type, with the share of change that counts as moved.
COUNTER_FIELDS = ("count_per_step", "flop", "hbm_bytes", "dma_count", "mac_ratio", "vec_ratio", "mte2_ratio",
                  "overlap_frac", "alloc_count", "alloc_stall_s")
COUNTER_MOVED_FRAC = 0.01


def tail_s(values: list[float], steps: int) -> float | None:
    """The :data:`TAIL_PERCENTILE` of ``values`` (numpy's linear interpolation), or ``None``
    for a run of fewer than :data:`JITTER_MIN_STEPS` steps."""
    if steps < JITTER_MIN_STEPS or not values:
        return None
    import numpy as np

    return float(np.percentile(values, TAIL_PERCENTILE))


def warm_steps(steps: int) -> range:
    """The steps after the first when a run has several, else its only step: the first fills
    the caching allocator's cache (its device mallocs and flushes are expected), so the
    diagnosis rules and the flush count skip it."""
    return range(1, steps) if steps > 1 else range(1)


def _alloc_retries_per_step(profile: Profile) -> float | None:
    """Allocations that flushed the cache and retried, per warm step (:func:`warm_steps`, as
    the frequent-alloc rule counts them): a mean, not a median (flushes that recur every few
    hundred steps are what it must see); ``None`` without memory tracking, and for imported
    profiles (``real:*`` hardware), whose memory records do not say whether an allocation retried."""
    if not profile.memory or profile.hardware.startswith("real:"):
        return None
    warm = warm_steps(profile.steps)
    return sum(m.alloc_retries for m in profile.memory if m.step in warm) / len(warm)


def summarize(profile: Profile, root: str | None = None) -> RunBaseline:
    """Reduce a profile to what a baseline stores: per-op-type statistics, and what held the
    memory at its allocated peak (call sites relative to ``root``, the pytest rootdir).

    ``time_s`` is :meth:`Profile.op_time_s` (median over the steps the op type ran in);
    counters are per step in which it ran; pipe ratios are time-weighted means.

    Raises:
        ValueError: the profile holds no operator, so there is nothing to compare.
    """
    if profile.is_empty:
        raise ValueError("the workload ran no operator: there is nothing to profile")
    totals: dict[str, dict[str, float]] = {}
    for op in [*profile.ops, *profile.op_summaries]:
        t = totals.setdefault(
            op.op_type,
            {"count": 0.0, "flop": 0.0, "hbm_bytes": 0.0, "dma_count": 0.0, "time": 0.0, "mac": 0.0, "vec": 0.0, "mte2": 0.0,
             "stall": 0.0, "allocs": 0.0, "overlap": 0.0, "overlap_time": 0.0},
        )
        t["count"] += getattr(op, "count", 1)
        t["flop"] += op.flop
        t["hbm_bytes"] += op.hbm_bytes
        t["dma_count"] += op.dma_count
        t["time"] += op.duration_s
        t["mac"] += op.mac_ratio * op.duration_s
        t["vec"] += op.vec_ratio * op.duration_s
        t["mte2"] += op.mte2_ratio * op.duration_s
        t["stall"] += op.alloc_stall_s
        t["allocs"] += op.alloc_count
        if op.overlap_frac is not None:  # a summary row averages over the time of its ops that have one
            weight_s = getattr(op, "overlap_time_s", op.duration_s)
            t["overlap"] += op.overlap_frac * weight_s
            t["overlap_time"] += weight_s
    ops: dict[str, OpStats] = {}
    for op_type, t in totals.items():
        time_s = profile.op_time_s(op_type)
        if time_s <= 0:
            continue
        steps = profile.op_steps(op_type)
        weight = t["time"] or 1.0
        per_step = profile.op_step_times_s(op_type)
        ops[op_type] = OpStats(
            time_s=time_s,
            mean_time_s=t["time"] / profile.steps,
            p99_time_s=tail_s(per_step, profile.steps),
            max_time_s=max(per_step),
            count_per_step=t["count"] / steps,
            flop=t["flop"] / steps,
            hbm_bytes=t["hbm_bytes"] / steps,
            dma_count=t["dma_count"] / steps,
            mac_ratio=t["mac"] / weight,
            vec_ratio=t["vec"] / weight,
            mte2_ratio=t["mte2"] / weight,
            alloc_stall_s=t["stall"] / steps,
            alloc_count=t["allocs"] / steps,
            overlap_frac=min(1.0, t["overlap"] / t["overlap_time"]) if t["overlap_time"] else None,
        )
    return RunBaseline(
        hardware=profile.hardware,
        devices=profile.devices,
        simulator_version=profile.simulator_version,
        workload_fingerprint=profile.workload_fingerprint,
        steps=profile.steps,
        collection_mode=profile.collection,
        step_time_s=profile.step_time_s,
        step_time_mean_s=statistics.fmean(profile.step_times_s),
        step_time_p99_s=tail_s(profile.step_times_s, profile.steps),
        step_time_max_s=max(profile.step_times_s),
        memory_reserved_peak_bytes=max((m.reserved_peak_bytes for m in profile.memory), default=None),
        memory_allocated_peak_bytes=max((m.allocated_peak_bytes for m in profile.memory), default=None),
        alloc_time_s=statistics.median(m.alloc_time_s for m in profile.memory) if profile.memory else None,
        alloc_retries_per_step=_alloc_retries_per_step(profile),
        memory_peak_live=None if profile.memory_peak is None else peak_holders(profile.memory_peak.live, root),
        tokens_per_step=profile.tokens_per_step,
        step_trace_s=step_trace_medians(profile),
        ops=ops,
    )


def peak_holders(live: list[LiveMemory], root: str | None = None) -> list[PeakHolder]:
    """The groups of a profile's ``memory_peak`` as a baseline keeps them: call sites made
    portable (:func:`portable_site`), groups that then share a site added up, the
    :data:`PEAK_LIVE_GROUPS` largest, largest first."""
    merged: dict[tuple, list[int]] = {}
    for g in live:
        total = merged.setdefault((g.op_type, g.kind, portable_site(g.source, root)), [0, 0])
        total[0] += g.size_bytes
        total[1] += g.count
    groups = sorted(merged.items(), key=lambda kv: -kv[1][0])[:PEAK_LIVE_GROUPS]
    return [PeakHolder(op_type=op_type, kind=kind, source=source, size_bytes=size, count=count)
            for (op_type, kind, source), (size, count) in groups]


def portable_site(site: str | None, root: str | None = None) -> str | None:
    """A call site as a baseline keeps it, readable in another checkout: each ``file:line``
    part (``user.py:12 (in .../llama.py:379)``) with an absolute file relative to ``root`` (the
    pytest rootdir) when inside it and not in an installed package, else without its folders;
    a relative file as it is, normalised. Baselines match call sites by :func:`site_key`, so the
    form kept here is for reading."""
    return map_site_files(site, lambda file: _portable_file(file, root))


def site_key(site: str | None) -> str | None:
    """The part of a call site that matches across runs, checkouts and installs: each part's
    file name without folders, and its line (``test_x.py:12 (in llama.py:379)``). Two files of
    one name in two folders meet under one key; callers add up what meets."""
    return map_site_files(site, lambda file: file.replace("\\", "/").rpartition("/")[2])


def map_site_files(site: str | None, file_of) -> str | None:
    """``site`` with ``file_of`` applied to the file of each ``file:line`` part (``user.py:12 (in
    .../llama.py:379)`` has two: an op a library builder issued for the user's call)."""
    if site is None:
        return None
    if site.endswith(")") and " (in " in site:
        user, _, library = site[:-1].partition(" (in ")
        return f"{map_site_files(user, file_of)} (in {map_site_files(library, file_of)})"
    file, sep, line = site.rpartition(":")
    return f"{file_of(file)}{sep}{line}" if sep else site


def _portable_file(file: str, root: str | None) -> str:
    path = PurePosixPath(file.replace("\\", "/"))
    if not path.is_absolute() and not PureWindowsPath(file).is_absolute():
        return posixpath.normpath(path.as_posix())
    if root is not None and "site-packages" not in path.parts:
        try:
            return posixpath.normpath(Path(file).relative_to(root).as_posix())
        except ValueError:
            pass
    return path.name


@dataclass(frozen=True)
class Verdict:
    """One row of the comparison. ``status``: pass, regressed, improved, new, missing,
    insignificant (above the limit but by less than the minimum time that counts), or
    not-significant (above the limit, but the per-step samples do not show a change: see
    :func:`apply_significance`; ``statistic`` then holds the p-value, e.g. ``p=0.31``)."""

    op_type: str
    baseline_s: float | None
    current_s: float | None
    change_frac: float | None
    limit_frac: float
    limit_source: str
    status: str
    statistic: str = "median"  # which per-step statistic decided: median, mean over all steps, or p99
    unit: str = "s"  # of baseline_s and current_s: "s", or "bytes" / "count" (per step) for the memory rows


@dataclass(frozen=True)
class CounterChange:
    name: str
    baseline: float
    current: float

    @property
    def change_frac(self) -> float:
        return (self.current - self.baseline) / self.baseline if self.baseline else float("inf")


@dataclass(frozen=True)
class RunComparison:
    """The comparison of one profiled run. ``status`` is one of :data:`STATUS_ORDER`."""

    index: int
    status: str
    verdicts: list[Verdict]
    baseline_step_s: float
    current_step_s: float
    reasons: list[str] = field(default_factory=list)
    counters: dict[str, list[CounterChange]] = field(default_factory=dict)
    compared_nothing: bool = False
    workload_changed: bool = False

    @property
    def regressions(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == "regressed"]


#: Fields that make two runs incomparable: another device, job size or simulator, or an online
#: collection (its per-op overhead) against an offline one.
HARD_IDENTITY = ("hardware", "devices", "simulator_version", "collection_mode")


def _identity_mismatches(baseline: RunBaseline, current: RunBaseline) -> tuple[list[str], list[str]]:
    """(hard mismatches, workload mismatches), each as human-readable reasons."""
    hard = []
    for name in HARD_IDENTITY:
        old, new = getattr(baseline, name), getattr(current, name)
        if old != new:
            hard.append(f"{name} differs: baseline {old!r}, current {new!r}")
    workload = []
    if baseline.workload_fingerprint != current.workload_fingerprint:
        workload.append(
            "workload_fingerprint differs: the op sequence or shapes changed since the baseline "
            f"({baseline.workload_fingerprint} -> {current.workload_fingerprint})"
        )
    return hard, workload


def _verdict(
    op_type: str,
    base: tuple[float, float, float | None] | None,
    cur: tuple[float, float, float | None] | None,
    resolver: LimitResolver,
) -> Verdict:
    """``base`` and ``cur`` are (median, mean, p99 or ``None``) seconds per step.

    The median (robust to a rare slow step) decides, except that a mean over all steps above
    the limit is a regression too: it catches ops that got slower in only some steps, or began
    to run in more of them; and when both runs are long enough to have a p99, a p99 above the
    limit is a jitter regression (the median can stay put while rare spikes grow).
    """
    limit = resolver.resolve(op_type)
    if base is None:
        return Verdict(op_type, None, cur[0], None, limit.frac, limit.source, "new")
    if cur is None:
        return Verdict(op_type, base[0], None, None, limit.frac, limit.source, "missing")
    checks = [("median", base[0], cur[0]), ("mean", base[1], cur[1])]
    if base[2] is not None and cur[2] is not None:
        checks.append(("p99", base[2], cur[2]))
    # Past the limit by more than floating-point noise: a change of exactly the limit (x1.10
    # under 10%) passes whether its sums round up or down (newcomer finding: it was REGRESSED
    # over 3 steps and passed over 1)
    for statistic, b, c in checks:
        if c > b * (1.0 + limit.frac + FLOAT_NOISE_FRAC):
            return Verdict(op_type, b, c, c / b - 1.0, limit.frac, limit.source, "regressed", statistic)
    b, c = base[0], cur[0]
    status = "improved" if c < b * (1.0 - limit.frac - FLOAT_NOISE_FRAC) else "pass"
    return Verdict(op_type, b, c, c / b - 1.0, limit.frac, limit.source, status)


def _memory_verdicts(baseline: RunBaseline, current: RunBaseline, resolver: LimitResolver) -> list[Verdict]:
    """Peak memory and allocator time, when both runs tracked device memory."""
    pairs = {
        "memory.reserved_peak": (baseline.memory_reserved_peak_bytes, current.memory_reserved_peak_bytes, "bytes"),
        "memory.allocated_peak": (baseline.memory_allocated_peak_bytes, current.memory_allocated_peak_bytes, "bytes"),
        "alloc_time": (baseline.alloc_time_s, current.alloc_time_s, "s"),
        "alloc_retries": (baseline.alloc_retries_per_step, current.alloc_retries_per_step, "count"),
    }
    out = []
    for row in MEMORY_ROWS:
        b, c, unit = pairs[row]
        if row == "alloc_retries" and not b:
            if b is None:
                if c:  # a baseline saved before flushes were recorded: shown, not judged (re-save it)
                    out.append(Verdict(row, None, float(c), None, 0.0, "not in the baseline", "new", "mean", unit))
                continue
            # The baseline never flushed the cache: any flush is a new device synchronisation
            # and a burst of aclrtFree / aclrtMalloc calls, whatever its estimated cost, so no
            # threshold loosens this (a baseline that flushes is compared under its limit).
            # Shown when neither run flushed too, so that the row is seen to be gated.
            status = "missing" if c is None else ("regressed" if c else "pass")
            out.append(Verdict(row, 0.0, None if c is None else float(c), None if c else 0.0, 0.0,
                               "any flush from none", status, "mean", unit))
            continue
        if b is None or b <= 0:
            continue
        if c is None:  # the baseline tracked memory, this run did not: not silently ungated
            limit = resolver.resolve(row)
            out.append(Verdict(row, float(b), None, None, limit.frac, limit.source, "missing", unit=unit))
            continue
        v = _verdict(row, (float(b), float(b), None), (float(c), float(c), None), resolver)
        out.append(dataclasses.replace(v, unit=unit, statistic="mean" if unit == "count" else v.statistic))
    return out


#: Per-step samples each run needs before a change is tested for significance.
SIGNIFICANCE_MIN_SAMPLES = 5
#: A change counts when the one-sided Mann-Whitney U test gives a p-value below this.
SIGNIFICANCE_ALPHA = 0.05


def check_alpha(alpha: object) -> None:
    """Raise ``ValueError`` unless ``alpha`` is a significance level strictly between 0 and 1."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be strictly between 0 and 1, got {alpha!r}")


def apply_significance(comparison: RunComparison, baseline: Profile, current: Profile,
                       alpha: float = SIGNIFICANCE_ALPHA,
                       min_samples: int = SIGNIFICANCE_MIN_SAMPLES) -> RunComparison:
    """Demote regressions and improvements that the per-step samples do not support.

    For each time row (an op type, or ``step``) that is ``regressed`` or ``improved`` and
    that both profiles ran in at least ``min_samples`` steps, a one-sided Mann-Whitney U test
    (``scipy.stats.mannwhitneyu``: no normality assumed, robust to a slow outlier step)
    compares the per-step times; with a p-value of ``alpha`` or more the row becomes
    ``not-significant`` and no longer fails. Rows with fewer samples keep their verdict: a
    single real step cannot be tested, only limited (and ``min_delta_s`` still applies).
    The run's status is recomputed.

    Raises:
        ValueError: ``alpha`` not in (0, 1) or ``min_samples`` < 2.
    """
    check_alpha(alpha)
    if not isinstance(min_samples, int) or min_samples < 2:
        raise ValueError(f"min_samples must be an integer >= 2, got {min_samples!r}")
    from scipy.stats import mannwhitneyu

    def samples(profile: Profile, row: str) -> list[float]:
        return list(profile.step_times_s) if row == STEP_ROW else profile.op_step_times_s(row)

    verdicts = []
    for v in comparison.verdicts:
        if v.status in ("regressed", "improved") and v.unit == "s":
            a, b = samples(baseline, v.op_type), samples(current, v.op_type)
            if len(a) >= min_samples and len(b) >= min_samples:
                side = "greater" if v.status == "regressed" else "less"
                p_value = float(mannwhitneyu(b, a, alternative=side).pvalue)
                if p_value >= alpha:
                    v = dataclasses.replace(v, status="not-significant", statistic=f"p={p_value:.2g}")
        verdicts.append(v)
    status = comparison.status
    if status in ("regressed", "improved"):
        if any(v.status == "regressed" for v in verdicts):
            status = "regressed"
        elif any(v.status == "missing" for v in verdicts):
            status = "missing-ops"
        elif comparison.workload_changed:
            status = "incomparable"
        elif any(v.status == "improved" for v in verdicts):
            status = "improved"
        else:
            status = "pass"
    return dataclasses.replace(comparison, status=status, verdicts=verdicts)


def compare_run(index: int, baseline: RunBaseline, current: RunBaseline, resolver: LimitResolver,
                min_delta_s: float = 0.0) -> RunComparison:
    """Compare one run with its baseline under the limits of ``resolver``.

    ``min_delta_s``: a change above its limit but smaller than this many seconds is not a
    regression (or an improvement) but ``insignificant``, shown as such: tiny ops of real,
    noisy runs would otherwise flap. 0 for simulated runs, which are deterministic.
    """
    def stats(run: RunBaseline, op_type: str) -> tuple[float, float] | None:
        op = run.ops.get(op_type)
        return None if op is None else (op.time_s, op.mean_time_s, op.p99_time_s)

    verdicts = [
        _verdict(op_type, stats(baseline, op_type), stats(current, op_type), resolver)
        for op_type in sorted(set(baseline.ops) | set(current.ops))
    ]
    verdicts.append(_verdict(STEP_ROW, (baseline.step_time_s, baseline.step_time_mean_s, baseline.step_time_p99_s),
                             (current.step_time_s, current.step_time_mean_s, current.step_time_p99_s), resolver))
    verdicts += _memory_verdicts(baseline, current, resolver)
    trace_pairs, trace_notes = step_trace_pairs(baseline, current)  # step.computing, step.free ... (real runs)
    verdicts += [_verdict(row, (b, b, None), (c, c, None), resolver) for row, b, c in trace_pairs]
    if min_delta_s > 0:
        verdicts = [
            dataclasses.replace(v, status="insignificant")
            if v.status in ("regressed", "improved") and v.unit == "s" and v.baseline_s is not None
            and v.current_s is not None and abs(v.current_s - v.baseline_s) < min_delta_s else v
            for v in verdicts
        ]
    hard, workload = _identity_mismatches(baseline, current)
    reasons = hard + workload + trace_notes
    counters = {}
    for v in verdicts:
        if v.status == "regressed" and v.op_type in baseline.ops and v.op_type in current.ops:
            counters[v.op_type] = moved_counters(baseline.ops[v.op_type], current.ops[v.op_type])
    missing = [v.op_type for v in verdicts if v.status == "missing"]
    # Memory rows are missing when the run stopped tracking memory; they are not op types, so
    # they do not make "nothing could be compared" (which fails the gate even without --oam-strict).
    missing_ops = [op_type for op_type in missing if op_type in baseline.ops]
    missing_rows = [row for row in missing if row not in baseline.ops]
    compared_nothing = bool(baseline.ops) and len(missing_ops) == len(baseline.ops)
    if compared_nothing:
        reasons.append("nothing could be compared: no op type of the baseline is in this run ("
                       + ", ".join(missing_ops) + ")")
    elif missing_ops:
        reasons.append("op types in the baseline but not in this run: " + ", ".join(missing_ops))
    if missing_rows:
        reasons.append("the baseline tracked device memory and this run did not (memory=True): "
                       + ", ".join(missing_rows) + " not compared")
    if any(v.op_type == "alloc_retries" and v.status == "new" for v in verdicts):
        reasons.append("the baseline has no count of cache flushes (saved before alloc_retries was compared): "
                       "this run's flushes are shown, not judged; save the baseline again to gate them")
    if hard:
        # Another device, job size or simulator: the numbers are not comparable, so they
        # neither fail nor pass the gate (the verdicts are kept for information).
        status = "incomparable"
    elif any(v.status == "regressed" for v in verdicts):
        # A changed workload that got slower is still a regression of the code under test.
        status = "regressed"
    elif missing:
        status = "missing-ops"
    elif workload:
        status = "incomparable"
    elif any(v.status == "improved" for v in verdicts):
        status = "improved"
    else:
        status = "pass"
    return RunComparison(
        index, status, verdicts, baseline.step_time_s, current.step_time_s, reasons, counters, compared_nothing,
        bool(workload),
    )


def moved_counters(baseline: OpStats, current: OpStats) -> list[CounterChange]:
    """Counters of one op type that moved by more than :data:`COUNTER_MOVED_FRAC`."""
    moved = []
    for name in COUNTER_FIELDS:
        old, new = getattr(baseline, name), getattr(current, name)
        if old is None or new is None:  # overlap of an op with no compute-stream call
            continue
        scale = max(abs(old), abs(new))
        if scale and abs(new - old) > COUNTER_MOVED_FRAC * scale:
            moved.append(CounterChange(name, old, new))
    return moved


def worst_status(statuses: list[str]) -> str:
    """The most severe of ``statuses`` (``pass`` for none): :meth:`GateStatus.worst`, as text."""
    return GateStatus.worst(statuses).value
