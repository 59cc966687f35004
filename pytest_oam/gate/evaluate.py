"""The gate of one test as a pure function: profiles + baseline + settings -> verdicts, findings.

The plugin calls :func:`evaluate_gate` after each profiled test; ``oam replay`` calls it again
on a recorded test (:mod:`pytest_oam.record`), offline, and gets the same result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from ..judge.status import GateStatus

if TYPE_CHECKING:
    from simulator.hardware import HardwareSpec
    from simulator.profile import Profile

    from ..files.baseline import BaselineFile, RunBaseline
    from ..judge.compare import RunComparison
    from ..judge.explain import Finding
    from ..judge.thresholds import LimitResolver
    from .result import GateResult

TOP_OPS = 3


def gate_fails(status: str, compared_nothing: bool, strict: bool, fail_on_improvement: bool) -> bool:
    """Does a test with this gate status fail? (:meth:`GateStatus.fails`; a test where nothing
    could be compared fails whatever its status.)"""
    return compared_nothing or GateStatus(status).fails(strict=strict, fail_on_improvement=fail_on_improvement)


@dataclass(frozen=True)
class GateInputs:
    """Everything about one test's gate that is not a profile or the baseline (JSON-able).

    ``gating``: compared with a baseline (``--oam-baseline``); ``saving``: ``--oam-save-baseline``.
    Thresholds are fractions by op type or glob, from the marker, the command line and the ini
    file (closest first). ``baseline_path`` is shown as given; ``invocation_dir`` is the folder
    call sites are shown relative to; ``root_dir`` (the pytest rootdir) the one a baseline keeps
    them relative to.
    """

    nodeid: str
    gating: bool
    saving: bool = False
    marker_thresholds: dict[str, float] = field(default_factory=dict)
    cli_thresholds: dict[str, float] = field(default_factory=dict)
    ini_thresholds: dict[str, float] = field(default_factory=dict)
    strict: bool = False
    fail_on_improvement: bool = False
    disabled_rules: tuple[str, ...] = ()
    rule_thresholds: dict[str, dict[str, float]] = field(default_factory=dict)
    baseline_path: str | None = None
    baseline_error: str | None = None
    invocation_dir: str | None = None
    root_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["disabled_rules"] = list(self.disabled_rules)
        return data


def display_site(site: str, invocation_dir: str | None) -> str:
    """A ``file:line`` call site (or ``file:line (in file:line)``, an op a library builder
    issued for the user's call) with each file relative to ``invocation_dir`` when inside it."""
    from pathlib import Path

    from ..judge.compare import map_site_files

    if invocation_dir is None:
        return site

    def relative(file: str) -> str:
        try:
            return str(Path(file).relative_to(invocation_dir))
        except ValueError:
            return file

    return map_site_files(site, relative)


def card_spec(name: str, lookup: Callable[[str], HardwareSpec | None]) -> HardwareSpec | None:
    """The spec of the card a run names, from ``lookup``; ``None`` for an imported real profile
    (``real:*`` hardware), which has none (the rules that need a spec, and the figures a spec
    holds, are then left out or taken as every bundled spec has them)."""
    return None if name.startswith("real:") else lookup(name)


def judge_run(
    index: int,
    baseline: RunBaseline,
    current: RunBaseline,
    resolver: LimitResolver,
    *,
    profile: Profile | None = None,
    baseline_profile: Profile | None = None,
    hardware: HardwareSpec | None = None,
    min_delta_s: float | None = None,
    alpha: float | None = None,
    root: str | None = None,
) -> tuple[RunComparison, list[Finding]]:
    """One run against its baseline run: the gate's comparison and the explanation of each
    regression. The plugin's gate (:func:`evaluate_gate`, per run) and
    :func:`pytest_oam.api.compare_profiles` both judge a run with this function.

    Args:
        index: the run's position in its test (numbered from 0).
        baseline, current: the two runs' summaries (:func:`pytest_oam.judge.compare.summarize`).
        resolver: the limits by op type.
        profile: the current run's profile (call sites, memory at the peak); ``None`` for a
            baseline file compared as the current run.
        baseline_profile: the baseline run's profile: with both profiles and ``alpha``, a
            change above its limit counts only if the per-step samples support it
            (:func:`pytest_oam.judge.compare.apply_significance`).
        hardware: the current run's card (:func:`card_spec`), for the figures of its spec.
        min_delta_s: the smallest change that counts, in seconds (default:
            :data:`~pytest_oam.judge.compare.REAL_MIN_DELTA_S` for an imported real run,
            whose times are noisy; 0 for a simulated one).
        alpha: the significance level; ``None``: no significance test.
        root: the pytest rootdir (call sites of the memory at the peak are kept relative to it).

    Returns:
        ``(comparison, findings)``: the :class:`~pytest_oam.judge.compare.RunComparison` and the
        :class:`~pytest_oam.judge.explain.Finding` of each regressed or new row.
    """
    from ..judge.compare import REAL_MIN_DELTA_S, apply_significance, compare_run
    from ..judge.explain import PeakMemory, diagnose

    if min_delta_s is None:
        min_delta_s = REAL_MIN_DELTA_S if current.hardware.startswith("real:") else 0.0
    comparison = compare_run(index, baseline, current, resolver, min_delta_s)
    if alpha is not None and profile is not None and baseline_profile is not None:
        comparison = apply_significance(comparison, baseline_profile, profile, alpha)
    memory = PeakMemory.of(current, baseline, profile, root, hardware)
    return comparison, diagnose(comparison, profile, current.ops, baseline.ops, memory, hardware)


def evaluate_gate(
    inputs: GateInputs,
    profiles: Sequence[Profile],
    baseline: BaselineFile | None,
    rules: Mapping[str, Any] | None = None,
    test_passed: bool = True,
    hardware: Callable[[str], HardwareSpec] | None = None,
) -> tuple[GateResult, str | None]:
    """Compare a test's profiled runs with its baseline and run the diagnosis rules.

    Args:
        inputs: the test's settings.
        profiles: its runs, in order.
        baseline: its baseline file (``None``: none exists).
        rules: diagnosis rules by id (default: the built-in :data:`pytest_oam.rules.RULES`).
        test_passed: whether the test body passed (a failing test's baseline is not saved, and
            ``strict`` / ``fail_on_improvement`` do not fail it).
        hardware: spec lookup by name for the rules (default: the bundled specs).

    Returns:
        ``(result, failure_text)``: the :class:`~pytest_oam.gate.result.GateResult` (its
        ``report``, the op types seen, the baseline to save with ``inputs.saving``, and
        ``test_passed``); ``failure_text`` is ``None`` when the gate passes.
    """
    from simulator.hardware import load_hardware

    from ..files.baseline import BaselineFile
    from ..judge.compare import summarize, worst_status
    from ..judge.pairing import match_runs, run_identity
    from ..judge.rules import RULES, run_rules
    from ..judge.thresholds import MEMORY_ROWS, STEP_ROW, LimitResolver
    from ..report.model import (
        DiagnosisReport,
        FindingReport,
        GateReport,
        RunReport,
        TopOp,
        VerdictReport,
    )
    from ..report.text import diagnosis_text, failure_text
    from .result import GateResult

    rules = RULES if rules is None else rules
    hardware = hardware or load_hardware

    def site(s: str) -> str:
        return display_site(s, inputs.invocation_dir)

    resolver = LimitResolver.build(inputs.marker_thresholds, inputs.cli_thresholds, inputs.ini_thresholds)
    gating = inputs.gating
    n_base = len(baseline.runs) if baseline is not None else 0
    runs, verdicts, findings, statuses, parts, notes, summaries = [], [], [], [], [], [], []
    diagnosis: list[DiagnosisReport] = []
    op_types: set[str] = {STEP_ROW}
    empty: dict[int, str] = {}  # run -> why it has no summary (the workload ran no operator)
    ran_nothing: list[int] = []  # runs that ran no operator where their baseline run had some
    for i, profile in enumerate(profiles):
        try:
            summaries.append(summarize(profile, inputs.root_dir))
        except ValueError as exc:
            summaries.append(None)
            empty[i] = str(exc)
    matched = match_runs(baseline.runs if baseline is not None else [], [p.workload_fingerprint for p in profiles],
                         [{} if s is None else s.ops for s in summaries],
                         [None if s is None else run_identity(s) for s in summaries])
    for i, profile in enumerate(profiles):
        # an imported real profile (oam_profile.load, real:* hardware) has no spec
        spec = card_spec(profile.hardware, hardware)
        base_run = baseline.runs[matched[i]] if matched[i] is not None else None
        status, reasons, base_step, top_ops = GateStatus.NOT_GATED, [], None, []
        current = summaries[i]
        if i in empty:
            reasons = [empty[i]]
            if gating:
                status = GateStatus.MISSING_OPS
            if gating and base_run is not None:  # its baseline run had operators: nothing to compare
                ran_nothing.append(i)
                had = sorted(base_run.ops)
                notes.append(f"run {i + 1} ran no operator, but its baseline run had {', '.join(had[:3])}"
                             + (f" and {len(had) - 3} more op types" if len(had) > 3 else "") + ": nothing was compared")
        diagnosis += [
            DiagnosisReport(run=i, rule_id=f.rule_id, severity=f.severity, op_type=f.op_type, op_name=f.op_name,
                            location=site(f.location) if f.location else None,
                            description=f.description, fix=f.fix, gain_s=f.gain_s,
                            step_share_frac=f.step_share_frac)
            # without a spec (a real profile) the rules that need none run
            for f in run_rules(profile, spec, disabled=inputs.disabled_rules,
                               thresholds=inputs.rule_thresholds, rules=rules)
        ]
        step_s = profile.step_time_s if not profile.is_empty else 0.0
        if current is not None:
            op_types.update(current.ops)
            if current.memory_reserved_peak_bytes is not None:
                op_types.update(MEMORY_ROWS)
            op_types.update(f"step.{part}" for part in current.step_trace_s or {})
            top = sorted(current.ops.items(), key=lambda kv: -kv[1].time_s)[:TOP_OPS]
            top_ops = [TopOp(op_type=k, time_s=v.time_s, share_frac=v.time_s / step_s if step_s else 0.0)
                       for k, v in top]
            if gating and base_run is None:
                status = GateStatus.NO_BASELINE
            elif gating:
                # real runs are noisy: a change must also exceed REAL_MIN_DELTA_S to count (judge_run)
                comparison, explained = judge_run(i, base_run, current, resolver, profile=profile, hardware=spec,
                                                  root=inputs.root_dir)
                status, reasons, base_step = comparison.status, comparison.reasons, comparison.baseline_step_s
                run_findings = [dataclasses.replace(f, call_sites=[(site(s), t) for s, t in f.call_sites])
                                for f in explained]
                verdicts += [VerdictReport(run=i, **vars(v)) for v in comparison.verdicts]
                findings += [
                    FindingReport(run=i, kind=f.kind, op_type=f.op_type, severity=f.severity, delta_s=f.delta_s,
                                  step_share_frac=f.step_share_frac,
                                  counters={c.name: (c.baseline, c.current) for c in f.counters},
                                  call_sites=f.call_sites, advice=f.advice)
                    for f in run_findings
                ]
                parts.append((comparison, run_findings, profile.hardware, profile.devices))
        statuses.append(status)
        runs.append(RunReport(index=i, status=status, hardware=profile.hardware, devices=profile.devices,
                              step_time_s=step_s, baseline_step_time_s=base_step,
                              tokens_per_s=profile.tokens_per_s if not profile.is_empty else None,
                              top_ops=top_ops, reasons=reasons))
    unmatched_base = n_base - sum(m is not None for m in matched)
    if gating and unmatched_base:
        statuses.append(GateStatus.MISSING_OPS)
        made = f"{len(profiles)} profiled runs" if profiles else "no profiled run"
        notes.append(f"the test made {made}; {unmatched_base} of the {n_base} runs of its baseline "
                     "were not compared")
    if gating and inputs.baseline_error:
        statuses.append(GateStatus.INVALID_BASELINE)
        notes.append(f"{inputs.baseline_error} (replaced by --oam-save-baseline)")
    status = worst_status(statuses)
    fatal = [d for d in diagnosis if d.severity == "fatal"]
    if inputs.saving and fatal:
        notes.append("baseline not written: the run has fatal diagnosis findings")
    if status == GateStatus.NO_BASELINE:
        if not inputs.saving:
            notes.append("no baseline: run with --oam-save-baseline to create one" if test_passed
                         else "no baseline: only tests that pass are saved")
        elif fatal:
            pass
        elif test_passed:
            notes.append("no baseline yet: written by --oam-save-baseline")
        else:
            notes.append("no baseline, and none written: only tests that pass are saved")
    if inputs.saving and empty and not fatal:
        which = ", ".join(str(i + 1) for i in sorted(empty))
        notes.append(f"baseline not written: run{'s' if len(empty) > 1 else ''} {which} of {len(profiles)} ran no "
                     "operator, so there is nothing to compare a later run with")
    unmatched = [p for p in inputs.marker_thresholds if not any(fnmatchcase(o, p) for o in op_types)]
    if unmatched:
        notes.append("@pytest.mark.oam thresholds match no op type of this test: " + ", ".join(unmatched)
                     + " (op types are case-sensitive: " + ", ".join(sorted(op_types)) + ")")
    path = inputs.baseline_path
    compared_nothing = (any(c.compared_nothing for c, *_ in parts) or (bool(n_base) and not profiles)
                        or bool(ran_nothing))
    # --oam-strict and --oam-fail-on-improvement fail only a test whose own code passed: one that
    # skipped itself, was an expected failure or failed is never saved, so failing it for a
    # status only a save can clear (no baseline, a stale one) would leave it red for good
    gate_failed = gate_fails(status, compared_nothing, inputs.strict and test_passed,
                             inputs.fail_on_improvement and test_passed)
    failed = gate_failed or bool(fatal)
    report = GateReport(nodeid=inputs.nodeid, status=status, failed=failed, baseline_path=path,
                        message="; ".join(notes) or None, runs=runs, verdicts=verdicts, findings=findings,
                        diagnosis=diagnosis)
    save = None
    if inputs.saving and summaries and all(s is not None for s in summaries) and not fatal:
        # a run with a correctness failure (NaN, overflow, ...) is no reference to compare with
        save = BaselineFile(nodeid=inputs.nodeid, runs=summaries)
    result = GateResult(report=report, op_types=sorted(op_types), baseline=save, test_passed=test_passed)
    text = failure_text(inputs.nodeid, status, path, parts, notes) if gate_failed else None
    if fatal:  # correctness: fails the test whatever the gate says, baseline or not
        header = f"oam diagnosis: {len(fatal)} fatal finding{'s' if len(fatal) > 1 else ''} in {inputs.nodeid}"
        text = (text + "\n\n" if text else "") + header + "\n" + diagnosis_text(fatal)
    return result, text
