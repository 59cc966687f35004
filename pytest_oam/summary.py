"""What the gate prints at the end of a run (pytest's terminal summary), and what it adds to
JUnit XML (``<property>`` entries of each test)."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

import pytest

from .format import fmt_frac, fmt_ms, fmt_percent, terminal_safe
from .judge.thresholds import MEMORY_ROWS, STEP_ROW

if TYPE_CHECKING:
    from .session import OamSession


def _line(tr, text: str, **markup: bool) -> None:
    """Write one summary line: test ids, op names and messages come from data files (baselines,
    real profiler output), so control characters and line breaks are taken out of it (an ANSI
    escape in an op name must not print a fake green line)."""
    tr.write_line(terminal_safe(text), **markup)


def write_summary(self: OamSession, terminalreporter) -> None:
    """The gate's part of pytest's terminal summary (on the controller)."""
    _tuned_summary(self, terminalreporter)
    if not (self.results or self.pruned or self.prune_refused or self.prune_kept or self.settings.report_paths
            or self.save_errors or self.recorded or self.unused_baselines):
        return
    from .format import fmt_value
    from .report.text import summary_table

    tests = self.tests_in_order()
    tr = terminalreporter
    tr.write_sep("=", "oam performance gate")
    if tests:
        tr.write_line(summary_table(tests))  # its cells are made safe
    for t in tests:
        if t.status == "regressed":
            worst = [v for v in t.verdicts if v.status == "regressed"]
            runs = " in run {}" if len(t.runs) > 1 else ""
            detail = ", ".join(
                f"{v.op_type}{runs.format(v.run + 1)} "
                # no percentage from a baseline of zero (alloc_retries): its two values
                + (f"{fmt_value(v.baseline_s, v.unit)} -> {fmt_value(v.current_s, v.unit)} ({v.limit_source})"
                   if v.change_frac is None else
                   f"{fmt_frac(v.change_frac, signed=True)} (limit {fmt_frac(v.limit_frac)})") for v in worst)
            _line(tr, f"REGRESSED {t.nodeid}: {detail}", red=True, bold=True)
        elif t.status not in ("pass", "not-gated") or t.message:
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
    if self.written:
        folder = self.settings.save_dir
        noun = "baseline" if len(self.written) == 1 else "baselines"
        _line(tr, f"oam: wrote {len(self.written)} {noun} to {self.display(folder)}")
        if self.config.get_verbosity() > 0:
            for path in self.written:
                _line(tr, f"    {path}")
    patterns = {**self.settings.ini_thresholds, **self.settings.cli_thresholds}
    unmatched = sorted(p for p in patterns if not any(fnmatchcase(o, p) for o in self.op_types_seen))
    if unmatched:
        _line(
            tr,
            "oam: thresholds match no op type of this run: " + ", ".join(unmatched)
            + " (op types are case-sensitive: " + ", ".join(sorted(self.op_types_seen)) + ")",
            yellow=True,
        )
    tuned = {**self.settings.ini_tuned_limits, **self.settings.cli_tuned_limits}
    operators = sorted(self.op_types_seen - {STEP_ROW, *MEMORY_ROWS})  # the gate's rows that are operators
    unmatched = sorted(p for p in tuned if not any(fnmatchcase(o, p) for o in operators))
    if unmatched and operators:
        _line(
            tr,
            "oam: tuned limits match no op type of this run, nothing was checked against them: "
            + ", ".join(unmatched) + " (op types are case-sensitive: " + ", ".join(operators) + ")",
            yellow=True,
        )
    if self.recorded:
        noun = "test" if len(self.recorded) == 1 else "tests"
        folder = self.display(self.settings.record_dir)
        _line(tr, f"oam: recorded {len(self.recorded)} {noun} in {folder} (replay: oam replay "
                      f"{self.recorded[0]})")
        if self.config.get_verbosity() > 0:
            for path in self.recorded[1:]:
                _line(tr, f"    {path}")
    for err in self.save_errors:
        _line(tr, f"oam: {err}", red=True)
    for line in self.pruned:
        _line(tr, f"oam: pruned stale baseline {line}")
    if self.prune_refused:
        _line(tr, f"oam: {self.prune_refused}", yellow=True)
    if self.prune_kept:
        n = len(self.prune_kept)
        _line(tr, f"oam: --oam-prune kept {n} baseline {'file' if n == 1 else 'files'} of tests this run did "
                      "not collect but that may still exist (their file is there and was not collected, or "
                      "their test function still is: collect_ignore, a parameter of another machine?):",
                      yellow=True)
        for line in self.prune_kept:
            _line(tr, f"    {line}", yellow=True)
    if self.unused_baselines:
        n = len(self.unused_baselines)
        _line(tr, f"oam: {n} baseline {'file' if n == 1 else 'files'} of tests this run did not collect "
                      "(renamed, moved or deleted? --oam-save-baseline --oam-prune deletes them):", yellow=True)
        for line in self.unused_baselines:
            _line(tr, f"    {line}", yellow=True)
    folder = self.settings.baseline_dir
    if (folder is not None and self.settings.save_dir is None and not folder.is_dir()
            and any(t.status == "no-baseline" for t in tests)):
        # Newcomer finding: run from another folder, a project without an ini file looks for
        # ./baselines there; every test was a quiet no-baseline
        where = (f"relative to the ini file {self.config.inipath}" if self.config.inipath else
                 f"without an ini file, relative to the rootdir {self.config.rootpath}, which depends on where "
                 "pytest runs: a pytest.ini in the project fixes it")
        _line(tr, f"oam: no baseline folder {folder} ({where}): no test was compared; --oam-save-baseline "
                      "creates it", yellow=True)
    for path in self.settings.report_paths:
        if path not in self.report_errors:
            _line(tr, f"oam: wrote report {self.display(path)}")
    for error in self.report_errors.values():
        _line(tr, f"oam: {error}", red=True)


def _tuned_summary(self: OamSession, tr) -> None:
    """Tuned checks skipped for want of a record, in test order: visible, never silent."""
    if not self.tuned_notes:
        return
    tr.write_sep("-", "oam tuned check")
    for nodeid in sorted(self.tuned_notes, key=lambda n: self.order.get(n, len(self.order))):
        _line(tr, f"oam: tuned check skipped in {nodeid} (--oam-strict fails it):", yellow=True)
        for note in self.tuned_notes[nodeid]:
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


def junit_properties(gate_report: dict[str, Any]) -> list[tuple[str, str]]:
    """``("oam_finding", text)`` for each diagnosis finding and each finding that explains a
    regression of a test's gate report (builtin types), as JUnit XML ``<property>`` entries."""
    properties = []
    for d in gate_report.get("diagnosis", []):
        properties.append(
            ("oam_finding", (f"{d['severity']} {d['rule_id']} {d['op_type']} at {d['location'] or '-'}: "
                             f"{d['description']} (a fix saves about {fmt_ms(d['gain_s'], 3)} per step, "
                             f"{fmt_percent(d['step_share_frac'], 1)}; {d['fix']})")))
    for f in gate_report.get("findings", []):  # the explanation of a regression, same scale
        sites = ", ".join(site for site, _ in f["call_sites"]) or "-"
        cost = ("" if f["op_type"] in MEMORY_ROWS else  # memory rows have no time of their own
                f": +{fmt_ms(f['delta_s'], 3)} per step ({fmt_percent(f['step_share_frac'], 1)} of the baseline step)")
        properties.append(
            ("oam_finding", f"{f['severity']} {f['kind']} {f['op_type']} at {sites}{cost}; {'; '.join(f['advice'])}"))
    return properties
