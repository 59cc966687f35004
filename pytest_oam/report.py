"""Reports: the JSON report model and every piece of text the plugin prints.

All unit conversion for display happens here; data stays in SI units.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from tabulate import tabulate

from simulator.units import MS_PER_S, US_PER_S, GiB, KiB, MiB

from .baseline import BaselineFile
from .compare import RunComparison, Verdict
from .diagnosis import Finding
from .severity import Severity

#: 2: one severity scale (fatal / serious / warning / info) for rule findings and for the
#: explanation of regressions, which version 1 graded critical / major / minor.
REPORT_SCHEMA_VERSION = 2
_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

GateStatus = Literal[
    "pass", "regressed", "improved", "no-baseline", "invalid-baseline", "incomparable", "missing-ops",
    "not-gated",
]


class VerdictReport(BaseModel):
    model_config = _CONFIG
    run: int = Field(ge=0, description="Index of the profiled run within the test")
    op_type: str
    baseline_s: float | None
    current_s: float | None
    change_frac: float | None
    limit_frac: float = Field(ge=0)
    limit_source: str
    status: Literal["pass", "regressed", "improved", "new", "missing", "insignificant", "not-significant"]
    statistic: Literal["median", "mean", "p99"] = Field(description="The per-step statistic that decided")
    unit: Literal["s", "bytes", "count"] = Field(
        default="s", description="Unit of baseline_s and current_s ('count': events per step, e.g. alloc_retries)")


class FindingReport(BaseModel):
    model_config = _CONFIG
    run: int = Field(ge=0)
    kind: Literal["regressed", "new"]
    op_type: str
    severity: Severity = Field(description="By the share of the baseline step the regression costs: serious from "
                               "5%, warning from 3%, info below; peak memory and allocator time: warning")
    delta_s: float
    step_share_frac: float
    counters: dict[str, tuple[float, float]] = Field(description="name -> (baseline, current)")
    call_sites: list[tuple[str, float]] = Field(
        description="(file:line, seconds in the first step); memory rows: seconds waited for flushes "
        "(alloc_retries) or bytes held at the allocated peak (the peak rows)")
    advice: list[str]


class DiagnosisReport(BaseModel):
    """A diagnosis rule's finding on one profiled run (see :mod:`pytest_oam.rules`)."""

    model_config = _CONFIG
    run: int = Field(ge=0)
    rule_id: str
    severity: Severity = Field(description="fatal: a correctness problem; performance by the share of the step a fix "
                               "saves: serious from 5%, warning from 3% (built-in rules report nothing below)")
    op_type: str
    op_name: str
    location: str | None = Field(description="file:line of the user code that launched the op")
    description: str
    fix: str
    gain_s: float = Field(ge=0, description="Estimated time a fix saves per step")
    step_share_frac: float = Field(ge=0)


class TopOp(BaseModel):
    model_config = _CONFIG
    op_type: str
    time_s: float = Field(ge=0)
    share_frac: float = Field(ge=0)


class RunReport(BaseModel):
    model_config = _CONFIG
    index: int = Field(ge=0)
    status: GateStatus
    hardware: str
    devices: int = Field(ge=1)
    step_time_s: float = Field(ge=0)
    baseline_step_time_s: float | None = None
    tokens_per_s: float | None = None
    top_ops: list[TopOp]
    reasons: list[str] = Field(default_factory=list)


class GateReport(BaseModel):
    """One profiled test of the run. ``failed``: the gate (or the tuned check) failed the test."""

    model_config = _CONFIG
    nodeid: str
    status: GateStatus
    failed: bool = False
    baseline_path: str | None = None
    message: str | None = None
    runs: list[RunReport] = Field(default_factory=list)
    verdicts: list[VerdictReport] = Field(default_factory=list)
    findings: list[FindingReport] = Field(default_factory=list)
    diagnosis: list[DiagnosisReport] = Field(default_factory=list)
    tuned_failures: list[str] = Field(
        default_factory=list, description="Calls more than their tuned limit slower than the knowledge base's "
        "optimum (the tuned check, @pytest.mark.oam(tuned=...) / --oam-tuned-limit); any one fails the test")
    tuned_notes: list[str] = Field(
        default_factory=list, description="Calls the tuned check skipped: no record for their shapes")


class OamReport(BaseModel):
    """The file ``--oam-report PATH.json`` writes."""

    model_config = _CONFIG
    schema_version: Literal[2] = REPORT_SCHEMA_VERSION
    pytest_oam_version: str
    baseline_dir: str | None
    tests: list[GateReport]
    status_counts: dict[str, int]


# -- formatting ---------------------------------------------------------------------------------


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def fmt_bytes(size: float | None) -> str:
    if size is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size:.0f} B"


def time_unit(seconds: float) -> tuple[float, str]:
    """The display unit of :func:`fmt_time` for ``seconds``: (units per second, name), for the
    axes of a plot whose largest value is ``seconds``."""
    if seconds >= 1.0:
        return 1.0, "s"
    if seconds >= 1e-3:
        return MS_PER_S, "ms"
    return US_PER_S, "us"


def bytes_unit(size: float) -> tuple[float, str]:
    """The display unit of :func:`fmt_bytes` for ``size``: (bytes per unit, name)."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size >= scale:
            return scale, unit
    return 1, "B"


def fmt_frac(frac: float | None, signed: bool = False) -> str:
    if frac is None:
        return "-"
    if math.isinf(frac):
        return "new"  # from zero: no finite percentage
    percent = frac * 100 + 0.0  # + 0.0 turns -0.0 into 0.0
    if abs(percent) < 0.05:
        percent = 0.0  # a rounding-level change prints as +0.0%, not -0.0%
    return f"{percent:+.1f}%" if signed else f"{percent:.1f}%"


def fmt_rate(tokens_per_s: float | None) -> str:
    return "-" if tokens_per_s is None else f"{tokens_per_s:,.0f}"


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


def fmt_value(value: float | None, unit: str) -> str:
    """A verdict's baseline or current value in its unit: seconds, bytes, or a count per step
    (shown per 1,000 steps, since the counted events are rare)."""
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "count":
        if value is None:
            return "-"
        if value == 0:
            return "none"
        if value >= 0.1:
            return f"{value:.3g} per step"
        return f"{value * 1000:.3g} per 1,000 steps"
    return fmt_time(value)


def verdict_table(verdicts: Sequence[Verdict | VerdictReport], fmt: str = "simple") -> str:
    """The table of verdicts: op type, baseline, current, change, limit, verdict."""
    rows = [
        (table_cell(v.op_type, fmt), fmt_value(v.baseline_s, v.unit), fmt_value(v.current_s, v.unit),
         fmt_frac(v.change_frac, True), fmt_frac(v.limit_frac), _verdict_label(v.status, v.statistic))
        for v in verdicts
    ]
    return tabulate(rows, headers=("op type", "baseline", "current", "change", "limit", "verdict"),
                    colalign=("left", "right", "right", "right", "right", "left"), tablefmt=fmt)


def memory_site_value(op_type: str, value: float) -> str:
    """What a memory row's call-site number is: seconds waited for flushes (``alloc_retries``),
    or bytes held at the allocated peak (the peak rows)."""
    return f"waited {fmt_time(value)} for flushes" if op_type == "alloc_retries" else f"{fmt_bytes(value)} at the peak"


def findings_text(findings: list[Finding]) -> str:
    from .thresholds import MEMORY_ROWS

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


# -- text from data files -------------------------------------------------------------------------
# Op names, test ids, call sites and messages come from data files (profiler CSVs, traces,
# baselines, records): a crafted name must not forge a table row or a line, colour the terminal
# or put HTML into a CI job summary.

#: ANSI escape sequences: CSI (colours, cursor moves: ESC [ ... final byte, or the C1 CSI byte),
#: OSC (titles, hyperlinks: ESC ] ... BEL or ESC \\) and the two-byte ones (ESC and a final byte).
_ANSI = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?|\x1b[@-_]?")
#: Control characters (C0 but tab and newline, DEL, C1), and the Unicode format characters that
#: reorder or hide text (bidirectional overrides and isolates, marks): a right-to-left override
#: can make "DESSAP" read as PASSED.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
_LINE_BREAKS = re.compile("\r\n|[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


def terminal_safe(text: object, *, keep_newlines: bool = False) -> str:
    """``str(text)`` safe to print on a terminal, one line: ANSI escape sequences removed, line
    breaks and tabs made spaces, every other control character (C0, DEL, C1) and the Unicode
    bidirectional and invisible format characters removed. With ``keep_newlines``, line breaks
    stay (as ``\\n``): for whole texts whose fields are already safe; a field from a data file
    (op name, test id, message) is made safe with the default, so that it cannot forge a line."""
    text = _ANSI.sub("", str(text))
    text = _LINE_BREAKS.sub("\n" if keep_newlines else " ", text).replace("\t", " ")
    return _CONTROL.sub("", text)


def md_text(text: object) -> str:
    """``text`` safe in GitHub Markdown prose and table cells: control characters removed
    (:func:`terminal_safe`), HTML as entities (``<script>`` shows as text), pipes escaped (no
    column break), backticks as entities (no code span opened), brackets escaped (no link or
    image), line breaks as ``<br>`` (no new row, heading or list item)."""
    import html

    text = html.escape(terminal_safe(text, keep_newlines=True), quote=False)
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "&#96;")
    text = text.replace("[", "\\[").replace("]", "\\]")
    return text.replace("\n", "<br>")


#: What a Markdown code span can hold as it is: no backtick (it would end the span), no line
#: break, no character that is HTML-escaped elsewhere (a span shows it raw, as a literal).
_PLAIN_CODE = re.compile(r"[^`<>&\n\r]*")


def md_code(text: object, in_table: bool = False) -> str:
    """``text`` as literal code in Markdown: a code span when it holds no backtick, HTML special
    character or line break; otherwise an HTML ``<code>`` element with those as entities (a
    backtick could end a span early and let the rest through as HTML). ``in_table``: its pipes
    escaped, as a GFM table cell needs (the table parser unescapes them inside spans and
    elements alike; outside tables the backslash would show)."""
    import html

    text = terminal_safe(text, keep_newlines=True)
    if _PLAIN_CODE.fullmatch(text):
        text = text.replace("|", "\\|") if in_table else text
        return f"`{text}`"
    text = html.escape(text, quote=False).replace("`", "&#96;").replace("\n", "<br>")
    # in a table the parser unescapes \| before reading the cell; elsewhere an entity (the
    # element shows a backslash literally, and no raw pipe is left to look like a row)
    return f"<code>{text.replace('|', chr(92) + '|' if in_table else '&#124;')}</code>"


def table_cell(text: object, fmt: str) -> str:
    """A table cell from a data file: Markdown-escaped for ``github`` tables, terminal-safe otherwise."""
    return md_text(text) if fmt == "github" else terminal_safe(text)


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


def dump_report(report: OamReport) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True, allow_nan=False) + "\n"


#: Version 1's severities of the explanation of a regression, on today's scale. ``major`` (1% to
#: 5% of the step, or a peak-memory / allocator-time regression) is re-graded from its share.
_V1_SEVERITY = {"critical": "serious", "minor": "info"}


def upgrade_v1_gate(test: dict) -> dict:
    """One test's gate result (:class:`GateReport` as JSON data) of a version 1 report or record,
    on the version 2 scale: its regression findings' critical / major / minor become serious /
    warning / info, a ``major`` one re-graded from its share of the step (peak memory and
    allocator time: warning). The rule findings already used the scale."""
    from .severity import grade_share
    from .thresholds import MEMORY_ROWS

    findings = []
    for f in test.get("findings", []):
        old = f.get("severity")
        if old == "major":
            new = "warning" if f.get("op_type") in MEMORY_ROWS else grade_share(f.get("step_share_frac", 0.0))
        else:
            new = _V1_SEVERITY.get(old, old)  # an unknown value stays, and validation names it
        findings.append({**f, "severity": new})
    return {**test, "findings": findings}


def load_report(text: str) -> OamReport:
    """Read the JSON text of an ``--oam-report`` file, version 1 or 2 (version 1 is upgraded).

    Raises:
        ValueError: not JSON, another schema version, or a document the model rejects
            (pydantic's ``ValidationError`` is a ``ValueError``; it names the field).
    """
    data = json.loads(text)
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version == 1:
        data = {**data, "schema_version": 2, "tests": [upgrade_v1_gate(t) for t in data.get("tests", [])]}
    elif version != REPORT_SCHEMA_VERSION:
        raise ValueError(f"report has schema_version {version!r}; this pytest-oam reads versions 1 and "
                         f"{REPORT_SCHEMA_VERSION}")
    return OamReport.model_validate(data)


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
    from .thresholds import MEMORY_ROWS

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
             f"{s.flop / 1e9:,.1f}", f"{s.hbm_bytes / MiB:,.1f}", f"{s.mac_ratio:.2f}", f"{s.vec_ratio:.2f}",
             f"{s.mte2_ratio:.2f}")
            for op_type, s in sorted(run.ops.items(), key=lambda kv: -kv[1].time_s)
        ]
        out.append(tabulate(
            rows, headers=("op type", "time/step", "share", "calls/step", "GFLOP", "HBM MiB", "mac_ratio",
                           "vec_ratio", "mte2_ratio"),
            colalign=("left",) + ("right",) * 8, tablefmt=table_fmt))
    return "\n".join(out)
