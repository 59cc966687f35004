"""Every piece of text the gate prints: tables of verdicts and tests, the failure text of a
test, findings and diagnosis, the Markdown job summary, a baseline shown as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tabulate import tabulate

from ..format import (
    fmt_frac,
    fmt_gflop,
    fmt_mib,
    fmt_rate,
    fmt_time,
    fmt_value,
    md_code,
    md_text,
    memory_site_value,
    table_cell,
    terminal_safe,
)
from .model import DiagnosisReport, FindingReport, GateReport, OamReport, VerdictReport

if TYPE_CHECKING:
    from ..files.baseline import BaselineFile
    from ..judge.compare import RunComparison, Verdict
    from ..judge.explain import Finding


def _verdict_label(status: str, statistic: str) -> str:
    if status == "insignificant":
        return "above limit, below min time"
    if status == "not-significant":
        return f"above limit, not significant ({statistic})"
    if status != "regressed":
        return status
    return {"median": "REGRESSED", "mean": "REGRESSED (mean over steps)"}.get(
        statistic, f"REGRESSED ({statistic} over steps)"
    )


def verdict_table(verdicts: Sequence[Verdict | VerdictReport], fmt: str = "simple") -> str:
    """The table of verdicts: op type, baseline, current, change, limit, verdict."""
    rows = [
        (table_cell(v.op_type, fmt), fmt_value(v.baseline_s, v.unit), fmt_value(v.current_s, v.unit),
         fmt_frac(v.change_frac, True), fmt_frac(v.limit_frac), _verdict_label(v.status, v.statistic))
        for v in verdicts
    ]
    return tabulate(rows, headers=("op type", "baseline", "current", "change", "limit", "verdict"),
                    colalign=("left", "right", "right", "right", "right", "left"), tablefmt=fmt)


def findings_text(findings: list[Finding]) -> str:
    from ..judge.thresholds import MEMORY_ROWS

    safe = terminal_safe
    lines = []
    for f in findings:
        if f.op_type in MEMORY_ROWS:  # memory rows have no time of their own
            lines.append(f"[{f.severity}] {f.op_type}")
            lines.extend(f"    where: {safe(site)} ({memory_site_value(f.op_type, value)})"
                         for site, value in f.call_sites)
            lines.extend(f"    what to do: {safe(tip)}" for tip in f.advice)
            continue
        lines.append(
            f"[{f.severity}] {safe(f.op_type)}: +{fmt_time(f.delta_s)} per step "
            f"({fmt_frac(f.step_share_frac)} of the baseline step time)"
        )
        if f.kind == "new":
            pass
        elif f.counters:
            moved = ", ".join(
                f"{safe(c.name)} {c.baseline:.4g} -> {c.current:.4g} ({fmt_frac(c.change_frac, True)})"
                for c in f.counters
            )
            lines.append(f"    counters moved: {moved}")
        else:
            lines.append("    counters moved: none (same work, same traffic)")
        for site, seconds in f.call_sites:
            lines.append(f"    where: {safe(site)} ({fmt_time(seconds)} in the first step)")
        for tip in f.advice:
            lines.append(f"    what to do: {safe(tip)}")
    return "\n".join(lines)


def failure_text(
    nodeid: str,
    status: str,
    baseline_path: str | None,
    parts: list[tuple[RunComparison, list[Finding], str, int]],
    notes: list[str],
) -> str:
    """The report of a failed gate: why, then per compared run the verdicts and the diagnosis
    (text from data files made :func:`terminal_safe`)."""
    safe = terminal_safe
    out = [f"oam performance gate: {status.upper()} {safe(nodeid)}"]
    if baseline_path:
        out.append(f"baseline: {safe(baseline_path)}")
    out.extend(f"note: {safe(note)}" for note in notes)
    for comparison, findings, hardware, devices in parts:
        out.append("")
        out.append(f"run {comparison.index + 1}: {safe(hardware)} x {devices}, status {comparison.status}")
        out.append(verdict_table(comparison.verdicts))
        for reason in comparison.reasons:
            out.append(f"note: {safe(reason)}")
        if findings:
            out.append("diagnosis:")
            out.append(findings_text(findings))
    return "\n".join(out)


def summary_table(tests: list[GateReport], fmt: str = "simple") -> str:
    """One row per profiled run: test, hardware, step time, tokens/s, gate status, top operators.
    ``github``: Markdown-escaped (:func:`md_code`, :func:`md_text`); otherwise terminal-safe."""
    markdown = fmt == "github"
    rows = []
    for t in tests:
        nodeid = md_code(t.nodeid, in_table=True) if markdown else terminal_safe(t.nodeid)
        if not t.runs:
            rows.append((nodeid, "-", "-", "-", t.status, "-"))
            continue
        for r in t.runs:
            top = table_cell(", ".join(f"{o.op_type} {fmt_frac(o.share_frac)}" for o in r.top_ops), fmt)
            label = nodeid if r.index == 0 else f"  run {r.index + 1}"
            hardware = f"{table_cell(r.hardware, fmt)} x{r.devices}"
            rows.append((label, hardware, fmt_time(r.step_time_s), fmt_rate(r.tokens_per_s),
                         r.status if len(t.runs) > 1 else t.status, top))
    return tabulate(rows, headers=("test", "hardware", "step time", "tokens/s", "gate", "top operators"),
                    tablefmt=fmt)


def markdown_report(report: OamReport) -> str:
    """The report as GitHub-flavoured Markdown (for a CI job summary)."""
    counts = ", ".join(f"{n} {md_text(s)}" for s, n in sorted(report.status_counts.items()))
    failed = [t for t in report.tests if t.failed]
    lines = [
        "## oam performance gate",
        "",
        f"**{'FAILED' if failed else 'passed'}**: {len(report.tests)} profiled tests ({counts or 'none'})",
        "",
        summary_table(report.tests, fmt="github"),
    ]
    for t in failed:
        lines += ["", f"### {t.status}{', tuned check failed' if t.tuned_failures else ''}: {md_code(t.nodeid)}"]
        if t.message:
            lines += ["", md_text(t.message)]
        if t.tuned_failures:
            lines += ["", *(f"- tuned check: {md_text(line)}" for line in t.tuned_failures)]
        if t.verdicts:
            lines += ["", verdict_table(t.verdicts, fmt="github")]
        lines += findings_markdown(t.findings)
    diagnosed = [t for t in report.tests if t.diagnosis]
    if diagnosed:
        lines += ["", "### Diagnosis", ""]
        for t in diagnosed:
            for d in t.diagnosis:
                where = f" at {md_code(d.location)}" if d.location else ""
                gain = f"; a fix saves about {fmt_time(d.gain_s)} per step ({fmt_frac(d.step_share_frac)})" if d.gain_s else ""
                lines.append(f"- **{d.severity}** {md_code(d.rule_id)} {md_text(d.op_type)}{where} ({md_code(t.nodeid)}): "
                             f"{md_text(d.description)}{gain}")
                lines.append(f"  - {md_text(d.fix)}")
    return "\n".join(lines) + "\n"


def diagnosis_text(items: Sequence[DiagnosisReport], indent: str = "") -> str:
    """Diagnosis findings for the terminal: severity, rule, op, where, evidence, fix, gain (text
    from data files made :func:`terminal_safe`, one line each)."""
    safe = terminal_safe
    lines = []
    for d in items:
        where = f" at {safe(d.location)}" if d.location else ""
        gain = f"; a fix saves about {fmt_time(d.gain_s)} per step ({fmt_frac(d.step_share_frac)})" if d.gain_s else ""
        lines.append(f"{indent}[{d.severity}] {safe(d.rule_id)}: {safe(d.op_type)}{where}: {safe(d.description)}{gain}")
        lines.append(f"{indent}    what to do: {safe(d.fix)}")
    return "\n".join(lines)


def findings_markdown(findings: Sequence[Finding | FindingReport]) -> list[str]:
    """One Markdown list item per finding, its advice nested under it."""
    from ..judge.thresholds import MEMORY_ROWS

    lines = []
    for f in findings:
        where = "; ".join(md_code(site) for site, _ in f.call_sites)
        cost = "" if f.op_type in MEMORY_ROWS else f": +{fmt_time(f.delta_s)} per step"  # memory has no time of its own
        lines += [f"- **{f.severity}** {md_text(f.op_type)}{cost}" + (f", at {where}" if where else "")]
        lines += [f"  - {md_text(tip)}" for tip in f.advice]
    return lines


def baseline_text(file: BaselineFile, fmt: str = "text") -> str:
    """A baseline file for people: its labels, then per run the per-op statistics table."""
    table_fmt = "github" if fmt == "markdown" else "simple"
    text = md_text if fmt == "markdown" else terminal_safe
    labels = [f"nodeid: {text(file.nodeid)}"]
    labels += [f"{name}: {text(getattr(file, name))}" for name in ("model", "dataset", "tag") if getattr(file, name)]
    out = ["  \n".join(labels) if fmt == "markdown" else "\n".join(labels)]
    for i, run in enumerate(file.runs):
        rate = "" if not run.tokens_per_step else f", {fmt_rate(run.tokens_per_step / run.step_time_s)} tokens/s (job)"
        out += ["", (f"run {i + 1}: {text(run.hardware)} x {run.devices}, simulator {text(run.simulator_version)}, "
                     f"{run.steps} steps, step time {fmt_time(run.step_time_s)} median{rate}")]
        rows = [
            (table_cell(op_type, table_fmt), fmt_time(s.time_s), fmt_frac(s.time_s / run.step_time_s),
             f"{s.count_per_step:g}",
             fmt_gflop(s.flop), fmt_mib(s.hbm_bytes), f"{s.mac_ratio:.2f}", f"{s.vec_ratio:.2f}",
             f"{s.mte2_ratio:.2f}")
            for op_type, s in sorted(run.ops.items(), key=lambda kv: -kv[1].time_s)
        ]
        out.append(tabulate(
            rows, headers=("op type", "time/step", "share", "calls/step", "GFLOP", "HBM MiB", "mac_ratio",
                           "vec_ratio", "mte2_ratio"),
            colalign=("left",) + ("right",) * 8, tablefmt=table_fmt))
    return "\n".join(out)

