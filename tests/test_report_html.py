"""The HTML report (``--oam-report PATH.html``): the builder's unit tests, the plugin end to end
through pytester, and the page opened in a real headless Chromium.

The browser test runs Debian's Chromium (``/usr/bin/chromium``) through Playwright, which is
never allowed to download a browser. Where Chromium or Playwright is missing it skips, unless
``OAM_REQUIRE_BROWSER=1`` (set by ``.ci/run``), where it fails: CI never silently skips it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from pathlib import Path

# pytester's in-process runs unload the modules first imported during them: load what the
# page is drawn with before any inline run (see conftest.py).
import matplotlib.backends.backend_agg
import matplotlib.figure  # noqa: F401
import pytest

import simulator
from pytest_oam.format import fmt_time
from pytest_oam.html_report import (
    RunSeries,
    html_report,
    op_time_plot,
    spike_factor_of,
    spike_steps,
)
from pytest_oam.report import GateReport, OamReport, RunReport, VerdictReport
from pytest_oam.rules import RULES
from simulator.hardware import load_hardware
from simulator.profile import StepMemory

CHROMIUM = Path("/usr/bin/chromium")
#: Chromium's flags here: no sandbox (root in a container), and nothing that reaches the network.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# -- the builder, without a browser ------------------------------------------------------------------


def verdict(op_type: str, base_s: float | None, cur_s: float | None, status: str = "pass", run: int = 0,
            limit_frac: float = 0.1, unit: str = "s") -> VerdictReport:
    change = None if base_s is None or cur_s is None else cur_s / base_s - 1
    return VerdictReport(run=run, op_type=op_type, baseline_s=base_s, current_s=cur_s, change_frac=change,
                         limit_frac=limit_frac, limit_source="default", status=status, statistic="median", unit=unit)


def gate(nodeid: str, status: str = "pass", verdicts=(), runs: int = 1, failed: bool = False,
         message: str | None = None) -> GateReport:
    return GateReport(
        nodeid=nodeid, status=status, failed=failed, message=message, verdicts=list(verdicts),
        runs=[RunReport(index=i, status=status, hardware="ascend910", devices=1, step_time_s=1e-3, top_ops=[])
              for i in range(runs)])


def oam_report(*tests: GateReport) -> OamReport:
    counts: dict[str, int] = {}
    for t in tests:
        counts[t.status] = counts.get(t.status, 0) + 1
    return OamReport(pytest_oam_version="0", baseline_dir=None, tests=list(tests), status_counts=counts)


def step_memory(step: int, reserved_bytes: int) -> StepMemory:
    return StepMemory(step=step, allocated_peak_bytes=reserved_bytes // 2, reserved_peak_bytes=reserved_bytes,
                      allocated_end_bytes=0, reserved_end_bytes=reserved_bytes, inactive_split_bytes=0,
                      largest_free_block_bytes=0, alloc_count=2, free_count=2, device_mallocs=1 if step == 0 else 0,
                      device_frees=0, alloc_retries=0, alloc_time_s=1e-6)


def plots(page: str) -> list[str]:
    """The ``data-plot`` kind of every image of the page, in order."""
    return re.findall(r'<img class="plot" data-plot="([a-z-]+)"', page)


def test_test_ids_op_types_and_messages_are_escaped() -> None:
    nodeid = "test_x.py::test_it[<script>alert(1)</script>]"
    op = "<img src=x onerror=alert(2)>"
    test = gate(nodeid, "regressed", [verdict(op, 1e-3, 2e-3, "regressed"), verdict("step", 1e-3, 2e-3)],
                failed=True, message="a <b>bold</b> & note")
    page = html_report(oam_report(test), {nodeid: [RunSeries(step_times_s=[1e-3, 1e-3])]}, spike_factor=2.0)
    assert "<script" not in page  # the page has no script at all, and no test's text becomes one
    assert "<img src=x" not in page and "<b>bold" not in page
    assert "test_it[&lt;script&gt;alert(1)&lt;/script&gt;]" in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "a &lt;b&gt;bold&lt;/b&gt; &amp; note" in page
    assert plots(page) == ["step-time", "op-time"]


def test_memory_plot_only_for_runs_that_tracked_memory() -> None:
    test = gate("t.py::test", runs=2)
    without = RunSeries(step_times_s=[1e-3] * 3)
    with_memory = RunSeries(step_times_s=[1e-3] * 3, memory=[step_memory(s, 40 << 20) for s in range(3)])
    assert plots(html_report(oam_report(test), {test.nodeid: [without, without]}, 2.0)) == ["step-time"]
    page = html_report(oam_report(test), {test.nodeid: [without, with_memory]}, 2.0)
    assert plots(page) == ["step-time", "memory"]
    assert 'data-plot="memory" data-run="1"' in page  # the second run's
    assert "reserved peak 40.00 MiB in step 0" in page


def test_a_test_without_series_gets_tables_but_no_plot() -> None:
    test = gate("t.py::test", "regressed", [verdict("MatMul", 1e-3, 2e-3, "regressed")], failed=True)
    page = html_report(oam_report(test), {}, 2.0)
    assert plots(page) == ["op-time"]  # the per-op plot comes from the verdicts alone
    assert '<tr class="regressed"><td>MatMul</td>' in page


def test_every_image_is_an_inline_png_and_nothing_is_loaded() -> None:
    test = gate("t.py::test", "regressed", [verdict("MatMul", 1e-3, 2e-3, "regressed")], failed=True)
    series = RunSeries(step_times_s=[1e-3, 3e-3, 1e-3], memory=[step_memory(s, 1 << 30) for s in range(3)])
    page = html_report(oam_report(test), {test.nodeid: [series]}, 2.0)
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == 3
    for src in sources:
        prefix, data = src.split(",", 1)
        assert prefix == "data:image/png;base64"
        assert base64.b64decode(data).startswith(PNG_SIGNATURE)
    assert not re.search(r"(href|src)=\"(https?:)?//", page) and "<link" not in page
    assert "default-src 'none'" in page  # the page may not load anything, should a later change try


def test_summary_counts_passed_failed_and_regressed() -> None:
    report = oam_report(gate("a.py::t", "pass"), gate("b.py::t", "regressed", failed=True),
                        gate("c.py::t", "no-baseline", failed=True))
    page = html_report(report, {}, 2.0)
    assert re.search(r'id="count-passed">1<.*id="count-failed">2<.*id="count-regressed">1<', page)
    assert "<title>oam performance gate: FAILED</title>" in page


@pytest.mark.parametrize(("times", "factor", "expected"), [
    ([1.0, 1.0, 3.0, 1.0, 1.0], 2.0, [2]),
    ([1.0, 1.0, 2.0, 1.0], 2.0, []),  # exactly k x median is not above it
    ([1.0, 1.0, 2.5, 1.0], 3.0, []),
    ([5.0, 1.0, 1.0], 2.0, [0]),  # a slow first step (allocator warm-up) is shown too
    ([0.0, 0.0, 0.0], 2.0, []),
    ([], 2.0, []),
])
def test_spikes_are_steps_above_k_times_the_median(times, factor, expected) -> None:
    assert spike_steps(times, factor) == expected


def test_spike_factor_is_the_slow_op_rules_with_its_ini_override() -> None:
    assert spike_factor_of(RULES, {}) == RULES["slow-op"].thresholds["factor"] == 2.0
    assert spike_factor_of(RULES, {"slow-op": {"factor": 3.5}}) == 3.5
    assert spike_factor_of({}, {}) == 2.0  # a registry without the rule falls back to the built-in


def test_spike_factor_must_be_positive() -> None:
    with pytest.raises(ValueError, match="spike_factor"):
        html_report(oam_report(), {}, spike_factor=0.0)


def test_op_plot_leaves_out_step_and_memory_rows() -> None:
    rows = [verdict("step", 1e-3, 1e-3), verdict("alloc_time", 1e-6, 1e-6),
            verdict("memory.reserved_peak", 1e6, 1e6, unit="bytes")]
    assert op_time_plot(rows, 0) is None
    plot = op_time_plot([*rows, verdict("MatMul", 1e-3, 1.5e-3, "regressed"), verdict("Add", 1e-5, None, "missing"),
                         verdict("Mul", None, 1e-5, "new")], 0)
    assert plot is not None and "run 1: 3 op types; regressed: MatMul" in plot


def test_a_dollar_in_an_op_type_is_not_math() -> None:
    # matplotlib would parse "$...$" as mathtext (and fail on a lone "$"): labels are plain text.
    plot = op_time_plot([verdict("my$op", 1e-3, 1e-3), verdict("$x^{", 1e-3, 1e-3)], 0)
    assert plot is not None


# -- the plugin, end to end ---------------------------------------------------------------------------

# One run plain, one run with memory=True; step 5 of each does 12 more MatMuls: a spike. The
# long-K MatMul has fewer blocks than the 910's 32 AI Cores (K split 15 ways): the diagnosis
# reports low AI Core utilisation, so the page has a diagnosis section.
SPIKY_TEST = """
import json, os

SCALE = json.loads(os.environ.get("OAM_TEST_SCALE", "{}"))

def workload(npu, state):
    state["step"] += 1
    q = npu.tensor((1, 8, 2048, 128))
    npu.flash_attention(q, q, q)
    npu.matmul(npu.tensor((2048, 1024)), npu.tensor((1024, 2048)))
    npu.matmul(npu.tensor((128, 40008)), npu.tensor((40008, 256)))
    if state["step"] == 6:
        for _ in range(12):
            npu.matmul(npu.tensor((2048, 1024)), npu.tensor((1024, 2048)))

def test_model(oam_profile):
    oam_profile.run(workload, {"step": 0}, steps=10, op_time_scale=SCALE)
    oam_profile.run(workload, {"step": 0}, steps=10, memory=True, op_time_scale=SCALE)
"""
SPIKY_ID = "test_model.py::test_model"


@pytest.fixture
def regressed_report(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, OamReport]:
    """A gate run whose FlashAttention got 8% slower (limit 2%), with HTML and JSON reports."""
    pytester.makepyfile(test_model=SPIKY_TEST)
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=1)
    monkeypatch.setenv("OAM_TEST_SCALE", json.dumps({"FlashAttention": 1.08}))
    result = pytester.runpytest("--oam-baseline", "--oam-report=out.html", "--oam-report=out.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["oam: wrote report out.html"])
    return pytester.path / "out.html", OamReport.model_validate_json((pytester.path / "out.json").read_text())


def test_gate_writes_the_html_report(regressed_report) -> None:
    path, report = regressed_report
    page = path.read_text()
    # one step-time plot for the test, one per-op plot per compared run, one memory plot (run 2)
    assert plots(page) == ["step-time", "op-time", "op-time", "memory"]
    # run 1's steps: the FlashAttention (8% slower, the fixture's op_time_scale) and two MatMuls,
    # each kernel longer than the host's 20 us interval (launch.host_dispatch_s), so a step is
    # their sum; step 5 adds 12 MatMuls, over twice that. Measured here, not pinned: the
    # FlashAttention cost model changes.
    namespace: dict = {}
    exec(SPIKY_TEST, namespace)
    alone = simulator.run(namespace["workload"], {"step": 0}, steps=2)
    attention, square, long_k = [op.duration_s for op in alone.ops if op.step == 1]
    assert min(attention, square, long_k) > load_hardware("ascend910").launch.host_dispatch_s
    median_s = 1.08 * attention + square + long_k
    assert median_s + 12 * square > 2 * median_s
    assert (f"run 1: 10 steps, median {fmt_time(median_s)} (no p99 under 50 steps), 1 spike above 2x the median "
            "at step 5") in page
    assert page.count('<tr class="regressed"><td>FlashAttention</td>') == 2
    (test,) = report.tests
    assert test.findings and all(tip in page for f in test.findings for tip in f.advice)
    assert "low-ai-core-utilization" in {d.rule_id for d in test.diagnosis}
    assert all(d.description in page for d in test.diagnosis)


def test_html_report_under_xdist_gets_the_workers_series(pytester, monkeypatch) -> None:
    pytester.makepyfile(test_model=SPIKY_TEST)
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=1)
    result = pytester.runpytest_subprocess("-n", "2", "--oam-baseline", "--oam-report=out.html")
    result.assert_outcomes(passed=1)
    assert plots((pytester.path / "out.html").read_text()) == ["step-time", "op-time", "op-time", "memory"]


def test_html_report_without_matplotlib_is_a_usage_error(pytester, monkeypatch) -> None:
    pytester.makepyfile(test_model=SPIKY_TEST)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without it imports
    result = pytester.runpytest("--oam-report=out.html")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("ERROR: --oam-report: an .html report draws its plots with matplotlib, which is not installed; "
            "install it with pip install 'pytest-oam[plot]'") in result.stderr.str()
    assert not (pytester.path / "out.html").exists()
    pytester.runpytest("--oam-report=out.json").assert_outcomes(passed=1)  # the others need no matplotlib


# -- the page in a real browser ------------------------------------------------------------------------


@pytest.fixture
def chromium():
    """A headless Chromium (Debian's, through Playwright); skips where there is none, unless
    OAM_REQUIRE_BROWSER=1, where it fails."""
    required = os.environ.get("OAM_REQUIRE_BROWSER") == "1"
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is not installed (apt-get install chromium)"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            missing = "playwright is not installed (pip install '.[test]')"
    if missing:
        if required:
            pytest.fail(f"OAM_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(missing)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


def test_html_report_renders_in_chromium(chromium, regressed_report) -> None:
    path, report = regressed_report
    page = chromium.new_page(viewport={"width": 1200, "height": 900})
    problems: list[str] = []
    page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}"))
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri(), wait_until="load")

    assert problems == []
    assert [url for url in requests if not url.startswith(("file:", "data:"))] == []  # nothing off the machine
    images = page.evaluate("""() => Array.from(document.querySelectorAll('img.plot'), img => {
        const box = img.getBoundingClientRect();
        return {plot: img.dataset.plot, run: img.dataset.run ?? null, complete: img.complete,
                width: img.naturalWidth, height: img.naturalHeight, shown: box.width * box.height};
    })""")
    assert [(i["plot"], i["run"]) for i in images] == [("step-time", None), ("op-time", "0"), ("op-time", "1"),
                                                       ("memory", "1")]
    for image in images:
        assert image["complete"] and image["width"] > 0 and image["height"] > 0 and image["shown"] > 0, image

    text = page.inner_text("body")
    assert "1 profiled tests: 0 passed the gate, 1 failed it, 1 regressed" in text
    regressed_rows = page.locator("tr.regressed").all_inner_texts()
    assert any(row.startswith("FlashAttention") and "REGRESSED" in row for row in regressed_rows)
    (test,) = report.tests
    assert "Findings: why it regressed" in text and "Diagnosis" in text
    for finding in test.findings:
        assert all(tip in text for tip in finding.advice)
    for item in test.diagnosis:
        assert item.rule_id in text and item.fix in text


def test_memory_timeline_from_allocator_events_is_bounded() -> None:
    import simulator
    from pytest_oam.html_report import MEMORY_POINTS, series_from_profile

    def work(npu):
        for _ in range(3):
            a = npu.tensor((1024, 1024))
            npu.add(a, a)

    profile = simulator.run(work, steps=4, memory=True)
    series = series_from_profile(profile)
    assert [p[2] for p in series.memory_timeline] == [e.reserved_bytes for e in profile.memory_events]
    assert [p[0] for p in series.memory_timeline] == [e.time_s for e in profile.memory_events]
    many = simulator.run(work, steps=MEMORY_POINTS, memory=True)  # 6 events per step
    timeline = series_from_profile(many).memory_timeline
    assert len(timeline) <= MEMORY_POINTS
    assert max(p[2] for p in timeline) == max(e.reserved_bytes for e in many.memory_events)  # peaks are kept


def test_markdown_report_escapes_test_ids_and_messages() -> None:
    # Regression (review): a parametrize id with '|' broke the Markdown table and '<script>'
    # went into the page as raw HTML.
    from pytest_oam.report import markdown_report

    nodeid = "test_x.py::test[a|b-<script>alert(1)</script>]"
    text = markdown_report(oam_report(gate(nodeid, "regressed", failed=True, message="<img src=x onerror=y>")))
    table = [line for line in text.splitlines() if line.startswith("|") and "test_x.py" in line]
    assert table and all(line.count(" | ") == table[0].count(" | ") for line in table)
    assert "a\\|b" in table[0] and table[0].count("|") - table[0].count("\\|") == 7  # 6 columns
    assert "<img" not in text and "&lt;img src=x onerror=y&gt;" in text
    # no raw HTML anywhere: a test id that is not plain text is shown in <code> with entities
    # (a code span could be closed early by backticks in the id)
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
