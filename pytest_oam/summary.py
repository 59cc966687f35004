"""What the gate prints at the end of a run (pytest's terminal summary), and what it adds to
JUnit XML (``<property>`` entries of each test).

The summary reads the run's state through :class:`RunState`, the part of
:class:`pytest_oam.session.OamSession` it needs (a protocol: this module does not import the
session, which calls it).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pytest

from .format import fmt_frac, fmt_ms, fmt_percent, terminal_safe
from .judge.status import GateStatus
from .judge.thresholds import MEMORY_ROWS, STEP_ROW

if TYPE_CHECKING:
    from .report.model import GateReport
    from .settings import OamSettings


class RunState(Protocol):
    """What the terminal summary reads of a run (the controller's session): the gated tests'
    reports in test order (validated once, on arrival), and the files written, kept or refused."""

    config: pytest.Config
    settings: OamSettings
    order: dict[str, int]
    written: list[str]
    recorded: list[str]
    save_errors: list[str]
    pruned: list[str]
    prune_refused: str | None
    prune_kept: list[str]
    unused_baselines: list[str]
    op_types_seen: set[str]
    tuned_notes: dict[str, list[str]]
    report_errors: dict[Path, str]

    def tests_in_order(self) -> list[GateReport]: ...

    def display(self, path: Path) -> str: ...


def _line(tr, text: str, **markup: bool) -> None:
    """Write one summary line: test ids, op names and messages come from data files (baselines,
    real profiler output), so control characters and line breaks are taken out of it (an ANSI
    escape in an op name must not print a fake green line)."""
    tr.write_line(terminal_safe(text), **markup)


def write_summary(session: RunState, terminalreporter) -> None:
    """The gate's part of pytest's terminal summary (on the controller)."""
    _tuned_summary(session, terminalreporter)
    tests = session.tests_in_order()
    if not (tests or session.pruned or session.prune_refused or session.prune_kept or session.settings.report_paths
            or session.save_errors or session.recorded or session.unused_baselines):
        return
    from .format import fmt_value
    from .report.text import summary_table

    tr = terminalreporter
    tr.write_sep("=", "oam performance gate")
    if tests:
        tr.write_line(summary_table(tests))  # its cells are made safe
    for t in tests:
        if t.status is GateStatus.REGRESSED:
            worst = [v for v in t.verdicts if v.status == "regressed"]
            runs = " in run {}" if len(t.runs) > 1 else ""
            detail = ", ".join(
                f"{v.op_type}{runs.format(v.run + 1)} "
                # no percentage from a baseline of zero (alloc_retries): its two values
                + (f"{fmt_value(v.baseline_s, v.unit)} -> {fmt_value(v.current_s, v.unit)} ({v.limit_source})"
                   if v.change_frac is None else
                   f"{fmt_frac(v.change_frac, signed=True)} (limit {fmt_frac(v.limit_frac)})") for v in worst)
            _line(tr, f"REGRESSED {t.nodeid}: {detail}", red=True, bold=True)
        elif t.status not in (GateStatus.PASS, GateStatus.NOT_GATED) or t.message:
            color = {"red": True, "bold": True} if t.failed else {"yellow": True}
            prefix = f"FAILED ({t.status})" if t.failed else f"oam: {t.status}"
            _line(tr, f"{prefix} {t.nodeid}" + (f": {t.message}" if t.message else ""), **color)
            for run in t.runs:
                for reason in run.reasons:
                    _line(tr, f"    {reason}", **color)
    diagnosed = [t for t in tests if t.diagnosis]
    if diagnosed:
        from .report.text import diagnosis_text

        tr.write_sep("-", "oam diagnosis")
        for t in diagnosed:
            _line(tr, t.nodeid)
            tr.write_line(diagnosis_text(t.diagnosis, indent="    "))  # so are its fields
    if session.written:
        folder = session.settings.save_dir
        noun = "baseline" if len(session.written) == 1 else "baselines"
        _line(tr, f"oam: wrote {len(session.written)} {noun} to {session.display(folder)}")
        if session.config.get_verbosity() > 0:
            for path in session.written:
                _line(tr, f"    {path}")
    patterns = {**session.settings.ini_thresholds, **session.settings.cli_thresholds}
    unmatched = sorted(p for p in patterns if not any(fnmatchcase(o, p) for o in session.op_types_seen))
    if unmatched:
        _line(
            tr,
            "oam: thresholds match no op type of this run: " + ", ".join(unmatched)
            + " (op types are case-sensitive: " + ", ".join(sorted(session.op_types_seen)) + ")",
            yellow=True,
        )
    tuned = {**session.settings.ini_tuned_limits, **session.settings.cli_tuned_limits}
    operators = sorted(session.op_types_seen - {STEP_ROW, *MEMORY_ROWS})  # the gate's rows that are operators
    unmatched = sorted(p for p in tuned if not any(fnmatchcase(o, p) for o in operators))
    if unmatched and operators:
        _line(
            tr,
            "oam: tuned limits match no op type of this run, nothing was checked against them: "
            + ", ".join(unmatched) + " (op types are case-sensitive: " + ", ".join(operators) + ")",
            yellow=True,
        )
    if session.recorded:
        noun = "test" if len(session.recorded) == 1 else "tests"
        folder = session.display(session.settings.record_dir)
        _line(tr, f"oam: recorded {len(session.recorded)} {noun} in {folder} (replay: oam replay "
                      f"{session.recorded[0]})")
        if session.config.get_verbosity() > 0:
            for path in session.recorded[1:]:
                _line(tr, f"    {path}")
    for err in session.save_errors:
        _line(tr, f"oam: {err}", red=True)
    for line in session.pruned:
        _line(tr, f"oam: pruned stale baseline {line}")
    if session.prune_refused:
        _line(tr, f"oam: {session.prune_refused}", yellow=True)
    if session.prune_kept:
        n = len(session.prune_kept)
        _line(tr, f"oam: --oam-prune kept {n} baseline {'file' if n == 1 else 'files'} of tests this run did "
                      "not collect but that may still exist (their file is there and was not collected, or "
                      "their test function still is: collect_ignore, a parameter of another machine?):",
                      yellow=True)
        for line in session.prune_kept:
            _line(tr, f"    {line}", yellow=True)
    if session.unused_baselines:
        n = len(session.unused_baselines)
        _line(tr, f"oam: {n} baseline {'file' if n == 1 else 'files'} of tests this run did not collect "
                      "(renamed, moved or deleted? --oam-save-baseline --oam-prune deletes them):", yellow=True)
        for line in session.unused_baselines:
            _line(tr, f"    {line}", yellow=True)
    folder = session.settings.baseline_dir
    if (folder is not None and session.settings.save_dir is None and not folder.is_dir()
            and any(t.status is GateStatus.NO_BASELINE for t in tests)):
        # Newcomer finding: run from another folder, a project without an ini file looks for
        # ./baselines there; every test was a quiet no-baseline
        where = (f"relative to the ini file {session.config.inipath}" if session.config.inipath else
                 f"without an ini file, relative to the rootdir {session.config.rootpath}, which depends on where "
                 "pytest runs: a pytest.ini in the project fixes it")
        _line(tr, f"oam: no baseline folder {folder} ({where}): no test was compared; --oam-save-baseline "
                      "creates it", yellow=True)
    for path in session.settings.report_paths:
        if path not in session.report_errors:
            _line(tr, f"oam: wrote report {session.display(path)}")
    for error in session.report_errors.values():
        _line(tr, f"oam: {error}", red=True)


def _tuned_summary(session: RunState, tr) -> None:
    """Tuned checks skipped for want of a record, in test order: visible, never silent."""
    if not session.tuned_notes:
        return
    tr.write_sep("-", "oam tuned check")
    for nodeid in sorted(session.tuned_notes, key=lambda n: session.order.get(n, len(session.order))):
        _line(tr, f"oam: tuned check skipped in {nodeid} (--oam-strict fails it):", yellow=True)
        for note in session.tuned_notes[nodeid]:
            _line(tr, f"    {note}", yellow=True)


def outcome_reason(report: pytest.TestReport) -> str:
    """The reason a test gave for its skip or xfail, or the last line of its error (one line)."""
    if hasattr(report, "wasxfail") and report.wasxfail:
        reason = report.wasxfail
    elif report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        reason = str(report.longrepr[2])
    else:
        reason = getattr(report.longrepr, "reprcrash", None)
        reason = reason.message if reason is not None else ""
    reason = reason.removeprefix("Skipped: ").removeprefix("reason: ").strip()
    return reason.splitlines()[0] if reason else ""


def junit_properties(gate_report: GateReport) -> list[tuple[str, str]]:
    """``("oam_finding", text)`` for each diagnosis finding and each finding that explains a
    regression of a test's gate report, as JUnit XML ``<property>`` entries."""
    properties = []
    for d in gate_report.diagnosis:
        properties.append(
            ("oam_finding", (f"{d.severity} {d.rule_id} {d.op_type} at {d.location or '-'}: "
                             f"{d.description} (a fix saves about {fmt_ms(d.gain_s, 3)} per step, "
                             f"{fmt_percent(d.step_share_frac, 1)}; {d.fix})")))
    for f in gate_report.findings:  # the explanation of a regression, same scale
        sites = ", ".join(site for site, _ in f.call_sites) or "-"
        cost = ("" if f.op_type in MEMORY_ROWS else  # memory rows have no time of their own
                f": +{fmt_ms(f.delta_s, 3)} per step ({fmt_percent(f.step_share_frac, 1)} of the baseline step)")
        properties.append(
            ("oam_finding", f"{f.severity} {f.kind} {f.op_type} at {sites}{cost}; {'; '.join(f.advice)}"))
    return properties
