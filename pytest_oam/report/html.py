"""The gate's report as one self-contained HTML page (``--oam-report PATH.html``).

Built from the same :class:`~pytest_oam.report.OamReport` the JSON report holds, plus each
profiled run's per-step series (:class:`RunSeries`, taken from its profile where the test ran,
on an xdist worker or in-process). The plots are matplotlib PNG images inlined as base64
``data:`` URIs, the CSS is inline, and a Content-Security-Policy forbids every other source:
the file opens offline and loads nothing. Every piece of text that comes from the tests (test
ids, op types, messages, findings) goes through :func:`html.escape`.

Like the comparison, this module imports neither pytest nor the simulator runtime; matplotlib
(the ``plot`` extra) is imported only when a page is built. Units are converted for display
only, with the units of :mod:`pytest_oam.report`.
"""

from __future__ import annotations

import base64
import html
import io
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

from simulator.profile import Profile, StepMemory

from ..format import (
    bytes_unit,
    fmt_bytes,
    fmt_frac,
    fmt_rate,
    fmt_time,
    fmt_value,
    memory_site_value,
    terminal_safe,
    time_unit,
    to_ms,
)
from ..judge.compare import JITTER_MIN_STEPS, tail_s
from ..judge.thresholds import MEMORY_ROWS, STEP_ROW
from .model import DiagnosisReport, FindingReport, GateReport, OamReport, VerdictReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The diagnosis rule whose ``factor`` defines a spike: a step slower than ``factor`` times
#: the run's median step, as ``slow-op`` flags an op call slower than ``factor`` times the
#: median of its kind.
SPIKE_RULE = "slow-op"
#: At most this many op types in a per-op plot: the slowest ones, plus every regressed one.
MAX_PLOTTED_OPS = 25
#: Plot size in inches, at :data:`PLOT_DPI` pixels per inch.
PLOT_WIDTH_IN = 9.0
PLOT_HEIGHT_IN = 3.4
PLOT_DPI = 100
#: Colours of the page and the plots (matplotlib's tab10, with grey for the baseline).
BASELINE_COLOUR = "#8c8c8c"
CURRENT_COLOUR = "#1f77b4"
REGRESSED_COLOUR = "#d62728"
IMPROVED_COLOUR = "#2ca02c"
RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5em auto; max-width: 1100px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; }
h2 code { font-size: 0.9em; word-break: break-all; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.regressed td { background: #fde8e8; } tr.improved td { background: #e8f6e8; }
.badge { display: inline-block; padding: 0.05em 0.5em; border-radius: 0.8em; font-size: 0.8em; font-weight: 600;
         color: #fff; background: #777; vertical-align: middle; }
.badge.failed, .badge.regressed { background: #c62828; } .badge.pass, .badge.passed { background: #2e7d32; }
.badge.improved { background: #558b2f; } .badge.not-gated { background: #777; }
.summary { font-size: 1.1em; } .summary .count { font-weight: 700; }
.message { background: #fff8e1; border-left: 4px solid #f9a825; padding: 0.4em 0.8em; }
figure { margin: 0.8em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.88em; color: #555; }
ul.advice { margin: 0.2em 0 0.6em 1em; }
"""


#: Points of a memory timeline in the page: longer runs keep the largest values per slice.
MEMORY_POINTS = 2000


class RunSeries(BaseModel):
    """What the page plots of one profiled run beyond the JSON report: its per-step values."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    step_times_s: list[NonNegativeFloat] = Field(description="Wall time of each step")
    memory: list[StepMemory] = Field(default_factory=list, description="Per step, when the run tracked memory")
    memory_timeline: list[tuple[NonNegativeFloat, int, int]] = Field(
        default_factory=list, description="(time_s, allocated_bytes, reserved_bytes) after allocator calls, "
        f"at most {MEMORY_POINTS} points (each the largest values of its slice of the run)")


def series_from_profile(profile: Profile) -> RunSeries:
    """The per-step series of ``profile`` (step times; memory when the run tracked it)."""
    times = [] if profile.is_empty else profile.step_times_s
    events = profile.memory_events
    timeline = [(e.time_s, e.allocated_bytes, e.reserved_bytes) for e in events]
    if len(timeline) > MEMORY_POINTS:
        size = -(-len(timeline) // MEMORY_POINTS)
        timeline = [(chunk[-1][0], max(c[1] for c in chunk), max(c[2] for c in chunk))
                    for chunk in (timeline[i:i + size] for i in range(0, len(timeline), size))]
    return RunSeries(step_times_s=times, memory=list(profile.memory), memory_timeline=timeline)


def spike_factor_of(rules: Mapping[str, object], overrides: Mapping[str, Mapping[str, float]]) -> float:
    """The ``factor`` threshold of the :data:`SPIKE_RULE` rule, with the ini's override.

    ``rules`` is the session's rule registry (it may have replaced the built-in); ``overrides``
    the ``oam_rule_thresholds`` values.
    """
    from ..judge.rules import RULES

    spec = rules.get(SPIKE_RULE) or RULES[SPIKE_RULE]
    default = spec.thresholds.get("factor", RULES[SPIKE_RULE].thresholds["factor"])
    return float(overrides.get(SPIKE_RULE, {}).get("factor", default))


def spike_steps(step_times_s: Sequence[float], factor: float) -> list[int]:
    """Indices of the steps slower than ``factor`` times the median step time."""
    if not step_times_s:
        return []
    median_s = statistics.median(step_times_s)
    if median_s <= 0:
        return []
    return [i for i, t in enumerate(step_times_s) if t > factor * median_s]


# -- plots ---------------------------------------------------------------------------------------


def _figure(height_in: float = PLOT_HEIGHT_IN) -> Figure:
    """A figure not registered with pyplot, so the user's pyplot state is left alone."""
    from matplotlib.figure import Figure

    return Figure(figsize=(PLOT_WIDTH_IN, height_in), dpi=PLOT_DPI, layout="constrained")


def _png_uri(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=PLOT_DPI)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _img(kind: str, uri: str, alt: str, caption: str, run: int | None = None) -> str:
    run_attr = f' data-run="{run}"' if run is not None else ""
    return (f'<figure><img class="plot" data-plot="{kind}"{run_attr} src="{uri}" alt="{_e(alt)}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def step_time_plot(test: GateReport, series: Sequence[RunSeries], factor: float) -> str:
    """Step time over steps, one line per run, with the median, the baseline's median step time
    and (for runs long enough to have one) the p99; spikes are marked with red crosses."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure()
    ax = fig.add_subplot()
    peak_s = max((max(s.step_times_s) for s in series if s.step_times_s), default=0.0)
    scale, unit = time_unit(peak_s)
    notes = []
    for i, run in enumerate(series):
        if not run.step_times_s:
            continue
        colour = RUN_COLOURS[i % len(RUN_COLOURS)]
        steps = range(len(run.step_times_s))
        ax.plot(steps, [t * scale for t in run.step_times_s], marker="o", markersize=3, linewidth=1.2,
                color=colour, label=f"run {i + 1}")
        median_s = statistics.median(run.step_times_s)
        ax.axhline(median_s * scale, color=colour, linestyle="--", linewidth=0.8, alpha=0.7)
        base_s = test.runs[i].baseline_step_time_s if i < len(test.runs) else None
        if base_s is not None:
            ax.axhline(base_s * scale, color=colour, linestyle=":", linewidth=1.2,
                       label=f"run {i + 1} baseline median")
        p99_s = tail_s(run.step_times_s, len(run.step_times_s))
        if p99_s is not None:
            ax.axhline(p99_s * scale, color=colour, linestyle="-.", linewidth=0.8, alpha=0.7,
                       label=f"run {i + 1} p99")
        spikes = spike_steps(run.step_times_s, factor)
        if spikes:
            ax.scatter(spikes, [run.step_times_s[s] * scale for s in spikes], marker="x", s=60, linewidths=2,
                       color=REGRESSED_COLOUR, zorder=3, label="spike" if "spike" not in notes else None)
            notes.append("spike")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_ylabel(f"step time ({unit})")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title("step time per step (dashed: median of the run)", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    uri = _png_uri(fig)
    caption = "; ".join(_spike_caption(i, run, factor) for i, run in enumerate(series) if run.step_times_s)
    return _img("step-time", uri, f"step time per step of {test.nodeid}", caption)


def _spike_caption(index: int, run: RunSeries, factor: float) -> str:
    spikes = spike_steps(run.step_times_s, factor)
    n = len(run.step_times_s)
    median = f"median {fmt_time(statistics.median(run.step_times_s))}"
    p99_s = tail_s(run.step_times_s, n)
    tail = f", p99 {fmt_time(p99_s)}" if p99_s is not None else f" (no p99 under {JITTER_MIN_STEPS} steps)"
    if not spikes:
        found = f"no spike (a step above {factor:g}x the median)"
    else:
        shown = ", ".join(map(str, spikes[:8])) + (" ..." if len(spikes) > 8 else "")
        noun = "spike" if len(spikes) == 1 else "spikes"
        found = f"{len(spikes)} {noun} above {factor:g}x the median at step {shown}"
    return f"run {index + 1}: {n} steps, {median}{tail}, {found}"


def _plotted_ops(verdicts: Sequence[VerdictReport]) -> list[VerdictReport]:
    """The op-type rows of a run worth a bar: time rows only (no step or memory rows), the
    slowest :data:`MAX_PLOTTED_OPS`, plus every regressed one; slowest at the top."""
    rows = [v for v in verdicts if v.unit == "s" and v.op_type != STEP_ROW and v.op_type not in MEMORY_ROWS]

    def size(v: VerdictReport) -> float:
        return max(v.baseline_s or 0.0, v.current_s or 0.0)

    rows.sort(key=size, reverse=True)
    kept = rows[:MAX_PLOTTED_OPS] + [v for v in rows[MAX_PLOTTED_OPS:] if v.status == "regressed"]
    return sorted(kept, key=size)


def op_time_plot(verdicts: Sequence[VerdictReport], run: int) -> str | None:
    """Per op type, baseline against current time per step, the limit as a black tick at
    ``baseline * (1 + limit)``, regressed ops in red; ``None`` when the run has no op rows."""
    rows = _plotted_ops(verdicts)
    if not rows:
        return None
    fig = _figure(1.2 + 0.45 * len(rows))
    ax = fig.add_subplot()
    peak_s = max(max(v.baseline_s or 0.0, v.current_s or 0.0) for v in rows)
    scale, unit = time_unit(peak_s)
    height = 0.38
    for y, v in enumerate(rows):
        colour = {"regressed": REGRESSED_COLOUR, "improved": IMPROVED_COLOUR}.get(v.status, CURRENT_COLOUR)
        if v.baseline_s is not None:
            ax.barh(y + height / 2, v.baseline_s * scale, height, color=BASELINE_COLOUR)
            ax.plot([v.baseline_s * (1 + v.limit_frac) * scale] * 2, [y - height, y + height], color="black",
                    linewidth=1.5)
        if v.current_s is not None:
            ax.barh(y - height / 2, v.current_s * scale, height, color=colour)
        note = v.status if v.change_frac is None else fmt_frac(v.change_frac, signed=True)
        if v.status == "regressed":
            note += " REGRESSED" + ("" if v.statistic == "median" else f" ({v.statistic})")
        end = max(v.baseline_s or 0.0, v.current_s or 0.0, (v.baseline_s or 0.0) * (1 + v.limit_frac))
        ax.annotate(note, (end * scale, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8,
                    color=REGRESSED_COLOUR if v.status == "regressed" else "#333", parse_math=False)
    ax.set_yticks(range(len(rows)), [terminal_safe(v.op_type) for v in rows], fontsize=8, parse_math=False)
    ax.set_xlabel(f"time per step ({unit})")
    ax.set_xlim(0, peak_s * scale * 1.25)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"run {run + 1}: time per op type against the baseline", fontsize=10)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=BASELINE_COLOUR, label="baseline"), Patch(color=CURRENT_COLOUR, label="current"),
                       Patch(color=REGRESSED_COLOUR, label="current, regressed"),
                       Line2D([], [], color="black", label="limit")], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    regressed = [v.op_type for v in rows if v.status == "regressed"]
    caption = (f"run {run + 1}: {len(rows)} op types; regressed: {', '.join(regressed)}" if regressed
               else f"run {run + 1}: {len(rows)} op types; none regressed")
    # the rows not plotted here still say so (review finding: "none regressed" under a failed gate)
    others = [v.op_type for v in verdicts if v.status == "regressed" and v not in rows]
    if others:
        caption += f"; regressed outside this plot: {', '.join(others)}"
    return _img("op-time", _png_uri(fig), f"time per op type of run {run + 1} against the baseline", caption, run)


def memory_plot(series: RunSeries, run: int) -> str | None:
    """Reserved and allocated device memory per step (peak and end of step); ``None`` when the
    run did not track memory."""
    from matplotlib.ticker import MaxNLocator

    if not series.memory:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    memory = sorted(series.memory, key=lambda m: m.step)
    divisor, unit = bytes_unit(max(m.reserved_peak_bytes for m in memory))
    if series.memory_timeline:  # over time, after every allocator call
        t = [to_ms(point[0]) for point in series.memory_timeline]
        ax.step(t, [point[2] / divisor for point in series.memory_timeline], where="post", color="#1f77b4",
                label="reserved")
        ax.step(t, [point[1] / divisor for point in series.memory_timeline], where="post", color="#ff7f0e",
                label="allocated")
        ax.set_xlabel("time (ms)")
    else:
        steps = [m.step for m in memory]
        for name, colour, style in (("reserved_peak_bytes", "#1f77b4", "-"), ("reserved_end_bytes", "#1f77b4", "--"),
                                    ("allocated_peak_bytes", "#ff7f0e", "-"),
                                    ("allocated_end_bytes", "#ff7f0e", "--")):
            ax.plot(steps, [getattr(m, name) / divisor for m in memory], style, marker="o", markersize=3,
                    color=colour, label=name.removesuffix("_bytes").replace("_", " "))
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"HBM ({unit})")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"run {run + 1}: caching allocator memory "
                 + ("over time" if series.memory_timeline else "per step"), fontsize=10)
    peak = max(memory, key=lambda m: m.reserved_peak_bytes)
    caption = (f"run {run + 1}: reserved peak {fmt_bytes(peak.reserved_peak_bytes)} in step {peak.step}, "
               f"allocated peak {fmt_bytes(max(m.allocated_peak_bytes for m in memory))}, "
               f"{sum(m.device_mallocs for m in memory)} device mallocs, "
               f"{sum(m.alloc_retries for m in memory)} allocation retries")
    return _img("memory", _png_uri(fig), f"device memory per step of run {run + 1}", caption, run)


# -- tables --------------------------------------------------------------------------------------


def _e(value: object) -> str:
    """Text (often from a data file) for the page: control characters and escape sequences
    removed (:func:`~pytest_oam.report.terminal_safe`, line breaks kept), HTML as entities."""
    return html.escape(terminal_safe(value, keep_newlines=True))


def _table(headers: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]], numeric: Sequence[int] = ()) -> str:
    """An HTML table; ``rows`` are (row class, cells already escaped); ``numeric`` columns align right."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for cls, cells in rows:
        tds = "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(cells))
        body.append(f'<tr class="{_e(cls)}">{tds}</tr>' if cls else f"<tr>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _badge(status: str) -> str:
    return f'<span class="badge {_e(status)}">{_e(status)}</span>'


def summary_html(report: OamReport) -> str:
    """The counts (passed, failed, regressed, per gate status) and one row per profiled run."""
    failed = sum(t.failed for t in report.tests)
    regressed = sum(t.status == "regressed" for t in report.tests)
    passed = len(report.tests) - failed
    verdict = _badge("failed") if failed else _badge("passed")
    counts = ", ".join(f"{n} {_e(s)}" for s, n in sorted(report.status_counts.items())) or "none"
    # the gate's verdicts only: a test can fail on its own (an assert) and still pass the gate
    head = (f'<p class="summary">{verdict} {len(report.tests)} profiled tests: '
            f'<span class="count" id="count-passed">{passed}</span> passed the gate, '
            f'<span class="count" id="count-failed">{failed}</span> failed it, '
            f'<span class="count" id="count-regressed">{regressed}</span> regressed '
            f"(gate statuses: {counts}; a test's own failures are in pytest's summary)</p>")
    rows = []
    for i, t in enumerate(report.tests):
        link = f'<a href="#test-{i}"><code>{_e(t.nodeid)}</code></a>'
        if not t.runs:
            rows.append((t.status, (link, "-", "-", "-", "-", _badge(t.status), "-")))
        for r in t.runs:
            top = ", ".join(f"{_e(o.op_type)} {fmt_frac(o.share_frac)}" for o in r.top_ops)
            rows.append((r.status, (link if r.index == 0 else "", str(r.index + 1), _e(f"{r.hardware} x{r.devices}"),
                                    fmt_time(r.step_time_s), fmt_rate(r.tokens_per_s), _badge(r.status), top)))
    return head + _table(("test", "run", "hardware", "step time", "tokens/s", "gate", "top operators"), rows,
                         numeric=(1, 3, 4))


def verdict_html(verdicts: Sequence[VerdictReport]) -> str:
    """The verdict table: op type, baseline, current, change, limit (and its source), verdict."""
    rows = []
    for v in verdicts:
        label = v.status.upper() if v.status == "regressed" else v.status
        if v.status == "regressed" and v.statistic != "median":
            label += f" ({v.statistic})"
        rows.append((v.status, (_e(v.op_type), fmt_value(v.baseline_s, v.unit), fmt_value(v.current_s, v.unit),
                                fmt_frac(v.change_frac, True), fmt_frac(v.limit_frac), _e(v.limit_source), _e(label))))
    return _table(("op type", "baseline", "current", "change", "limit", "limit from", "verdict"), rows,
                  numeric=(1, 2, 3, 4))


def findings_html(findings: Sequence[FindingReport]) -> str:
    """The diagnosis of the regressions: per finding its cost, the counters that moved, where
    the op was called, and what to do."""
    rows = []
    for f in findings:
        moved = "; ".join(f"{_e(name)} {b:.4g} &rarr; {c:.4g}" for name, (b, c) in f.counters.items()) or "none"
        memory = f.op_type in MEMORY_ROWS  # no time of its own, as in the Markdown report
        sites = "<br>".join(f"<code>{_e(site)}</code> ({_e(memory_site_value(f.op_type, t) if memory else fmt_time(t))})"
                            for site, t in f.call_sites) or "-"
        advice = "".join(f"<li>{_e(tip)}</li>" for tip in f.advice)
        rows.append((f.kind, (str(f.run + 1), _e(f.severity), _e(f.op_type), "-" if memory else f"+{fmt_time(f.delta_s)}",
                              "-" if memory else fmt_frac(f.step_share_frac), moved, sites,
                              f'<ul class="advice">{advice}</ul>' if advice else "-")))
    return _table(("run", "severity", "op type", "cost per step", "of the step", "counters moved", "called at",
                   "what to do"), rows, numeric=(0, 3, 4))


def diagnosis_html(items: Sequence[DiagnosisReport]) -> str:
    """The diagnosis rules' findings: severity, rule, op, where, evidence, fix, gain."""
    rows = [
        (d.severity, (str(d.run + 1), _e(d.severity), _e(d.rule_id), _e(d.op_type),
                      f"<code>{_e(d.location)}</code>" if d.location else "-", _e(d.description), _e(d.fix),
                      f"{fmt_time(d.gain_s)} ({fmt_frac(d.step_share_frac)})" if d.gain_s else "-"))
        for d in items
    ]
    return _table(("run", "severity", "rule", "op type", "called at", "evidence", "what to do", "a fix saves"), rows,
                  numeric=(0,))


# -- the page ------------------------------------------------------------------------------------


def _test_section(index: int, test: GateReport, series: Sequence[RunSeries], factor: float) -> str:
    failed = f" {_badge('failed')}" if test.failed else ""
    parts = [f'<section class="test" id="test-{index}">',
             f"<h2><code>{_e(test.nodeid)}</code> {_badge(test.status)}{failed}</h2>"]
    if test.baseline_path:
        parts.append(f"<p>baseline: <code>{_e(test.baseline_path)}</code></p>")
    if test.message:
        parts.append(f'<p class="message">{_e(test.message)}</p>')
    for line in test.tuned_failures:
        parts.append(f'<p class="message tuned">tuned check failed: {_e(line)}</p>')
    for line in test.tuned_notes:
        parts.append(f'<p class="tuned-note">tuned check skipped: {_e(line)}</p>')
    for run in test.runs:
        for reason in run.reasons:
            parts.append(f'<p class="message">run {run.index + 1}: {_e(reason)}</p>')
    if any(s.step_times_s for s in series):
        parts.append(step_time_plot(test, series, factor))
    for run in sorted({v.run for v in test.verdicts}):
        plot = op_time_plot([v for v in test.verdicts if v.run == run], run)
        if plot:
            parts.append(plot)
    for i, run_series in enumerate(series):
        plot = memory_plot(run_series, i)
        if plot:
            parts.append(plot)
    if test.verdicts:
        parts.append("<h3>Verdicts</h3>")
        for run in sorted({v.run for v in test.verdicts}):
            if len(test.runs) > 1:
                parts.append(f"<h4>run {run + 1}</h4>")
            parts.append(verdict_html([v for v in test.verdicts if v.run == run]))
    if test.findings:
        parts += ["<h3>Findings: why it regressed</h3>", findings_html(test.findings)]
    if test.diagnosis:
        parts += ["<h3>Diagnosis</h3>", diagnosis_html(test.diagnosis)]
    parts.append("</section>")
    return "\n".join(parts)


def html_report(report: OamReport, series: Mapping[str, Sequence[RunSeries | dict]], spike_factor: float) -> str:
    """The report as a self-contained HTML page.

    ``series`` maps a test id to the :class:`RunSeries` of its runs, in run order (dicts are
    validated); a test without series gets tables but no step-time or memory plot.
    ``spike_factor``: a step above this many times its run's median is marked as a spike.

    Raises:
        ValueError: a series that does not validate, or a ``spike_factor`` that is not positive.
    """
    if not spike_factor > 0:
        raise ValueError(f"spike_factor must be positive, got {spike_factor!r}")
    failed = any(t.failed for t in report.tests)
    sections = []
    for i, test in enumerate(report.tests):
        runs = [s if isinstance(s, RunSeries) else RunSeries.model_validate(s) for s in series.get(test.nodeid, ())]
        sections.append(_test_section(i, test, runs, spike_factor))
    baseline = f"<p>baselines: <code>{_e(report.baseline_dir)}</code></p>" if report.baseline_dir else ""
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>oam performance gate: {'FAILED' if failed else 'passed'}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>oam performance gate</h1>",
        f"<p>pytest-oam {_e(report.pytest_oam_version)}, report schema {report.schema_version}</p>",
        baseline,
        summary_html(report),
        *sections,
        "</body></html>",
    ]) + "\n"
