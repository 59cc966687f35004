"""Real profiles gated inside pytest: ``oam_profile.load(path)`` keeps a real profile for the
gate like a simulated run (baselines, thresholds, markers, statuses, reports, records, and the
noise-aware rule for real data), end to end through pytester, with and without pytest-xdist.

The profile is the real LLM training step of tests/data/realdata (SOURCES.md 10a, 10b: rank 0
of a pipeline 2 x data 2 job, 2,463 device tasks, FlashAttentionScore 24.7 ms of an 810 ms step).
"""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from pathlib import Path

import pytest

from pytest_oam.report import OamReport

LLM = Path(__file__).parent / "data" / "realdata" / "ascend-msinsight-llm-pp2dp2-level2-rank0"
SUITE = """
def attention(npu, seq_len):
    q = npu.tensor((1, 8, seq_len, 128), "fp16")
    npu.flash_attention(q, q, q)

def test_llm_step(oam_profile):
    profile = oam_profile.load("llm")
    assert "FlashAttentionScore" in profile.op_types

def test_simulated_and_real(oam_profile):
    oam_profile.run(attention, seq_len=1024)
    oam_profile.load("llm/ASCEND_PROFILER_OUTPUT/kernel_details.csv")
"""


def copy_llm(folder: Path, scale: dict[str, float] | None = None) -> None:
    """The LLM profile at ``folder``, with the Duration(us) of each op type in ``scale`` times its
    factor (the kernels' start times and the step split left as they were)."""
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(LLM, folder)
    if not scale:
        return
    kernels = folder / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    with kernels.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    kind, duration = header.index("Type"), header.index("Duration(us)")
    for row in rows[1:]:
        if row[kind] in scale:
            row[duration] = f"{float(row[duration]) * scale[row[kind]]:.3f}"
    with kernels.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)


@pytest.fixture(params=[None, "2"], ids=["no-xdist", "xdist-n2"])
def run(request, pytester: pytest.Pytester):
    pytester.makepyfile(test_real=SUITE)
    copy_llm(pytester.path / "llm")

    def _run(*args: str) -> pytest.RunResult:
        if request.param:
            return pytester.runpytest_subprocess("-n", request.param, *args)
        return pytester.runpytest(*args)

    return _run


def test_a_real_profile_is_saved_passes_and_a_slower_flash_attention_fails(run, pytester, capsys) -> None:
    result = run("--oam-save-baseline")
    result.assert_outcomes(passed=2)
    baselines = sorted((pytester.path / "baselines").iterdir())
    assert len(baselines) == 2
    saved = json.loads(baselines[0].read_text())
    assert [r["hardware"] for r in saved["runs"]] == ["real:torch_npu"]
    # the step split of step_trace_time.csv is kept: Computing 231,290.1 us, Free 158,558.0 us
    assert saved["runs"][0]["step_trace_s"]["computing"] == pytest.approx(0.2312901)
    assert saved["runs"][0]["step_trace_s"]["free"] == pytest.approx(0.158558)

    result = run("--oam-baseline", "--oam-report=r.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_real.py::test_llm_step*real:torch_npu x1*pass*hcom_batchSendRecv_*"])
    report = OamReport.model_validate_json((pytester.path / "r.json").read_text())
    assert {t.status for t in report.tests} == {"pass"}
    rows = {v.op_type for v in report.tests[0].verdicts}
    assert {"FlashAttentionScore", "step", "step.computing", "step.communication_exposed", "step.free"} <= rows

    copy_llm(pytester.path / "llm", {"FlashAttentionScore": 1.10})  # 24.72 ms -> 27.19 ms per step
    result = run("--oam-baseline", "--oam-report=r.json")
    result.assert_outcomes(failed=2)
    # the 2% limit of FlashAttention*: +10.0% is over it; the step itself moves 0.3%, under 10%
    result.stdout.fnmatch_lines(["*REGRESSED test_real.py::test_llm_step: FlashAttentionScore +10.0% (limit 2.0%)*"])
    result.stdout.fnmatch_lines([("*REGRESSED test_real.py::test_simulated_and_real: FlashAttentionScore in run 2 "
                                 "+10.0% (limit 2.0%)*")])
    report = OamReport.model_validate_json((pytester.path / "r.json").read_text())
    regressed = {(t.nodeid, v.run, v.op_type) for t in report.tests for v in t.verdicts if v.status == "regressed"}
    # in the mixed test, run 1 (simulated FlashAttention) passes and run 2 (the real profile) regresses
    assert regressed == {("test_real.py::test_llm_step", 0, "FlashAttentionScore"),
                         ("test_real.py::test_simulated_and_real", 1, "FlashAttentionScore")}

    from pytest_oam.cli import main

    records = sorted((pytester.path / ".oam" / "records").glob("*.oam.json.gz"))
    assert len(records) == 2  # --oam-record=failed by default
    record = json.loads(gzip.decompress(records[0].read_bytes()))
    assert record["runs"][0]["config"]["workload"] == "oam_profile.load"
    capsys.readouterr()
    assert main(["replay", str(records[0])]) == 1  # the gate failed when recorded
    assert "same verdicts and findings as recorded" in capsys.readouterr().out


MARKED = """
import pytest

@pytest.mark.oam(thresholds={"FlashAttentionScore": "15%"})
def test_llm_step(oam_profile):
    oam_profile.load("llm")
"""


def test_marker_thresholds_apply_to_a_real_profile(pytester) -> None:
    pytester.makepyfile(test_real=MARKED)
    copy_llm(pytester.path / "llm")
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=1)
    copy_llm(pytester.path / "llm", {"FlashAttentionScore": 1.10})
    result = pytester.runpytest("--oam-baseline", "--oam-report=r.json")
    result.assert_outcomes(passed=1)  # +10.0% under the marker's 15%
    report = OamReport.model_validate_json((pytester.path / "r.json").read_text())
    flash = next(v for v in report.tests[0].verdicts if v.op_type == "FlashAttentionScore")
    assert (flash.status, flash.limit_frac, flash.limit_source) == ("pass", 0.15, "marker")
    result = pytester.runpytest("--oam-baseline", "--oam-threshold", "step.free=1%")  # a step-split row by name
    result.assert_outcomes(passed=1)  # the free time did not move: 0.0% is within any limit


def test_tiny_real_changes_are_noise_not_regressions(pytester) -> None:
    """Muls runs 4 times for 54.3 us per step in the LLM step; 30% slower is +16.3 us, above its
    10% limit but under the 20 us that counts between real runs (REAL_MIN_DELTA_S)."""
    pytester.makepyfile(test_real=MARKED.replace('"FlashAttentionScore": "15%"', '"Xyz": "1%"'))
    copy_llm(pytester.path / "llm")
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=1)
    copy_llm(pytester.path / "llm", {"Muls": 1.30})
    result = pytester.runpytest("--oam-baseline", "--oam-report=r.json")
    result.assert_outcomes(passed=1)
    report = OamReport.model_validate_json((pytester.path / "r.json").read_text())
    verdict = next(v for v in report.tests[0].verdicts if v.op_type == "Muls")
    assert verdict.status == "insignificant"
    assert verdict.change_frac == pytest.approx(0.30, abs=1e-3)
    assert verdict.current_s - verdict.baseline_s == pytest.approx(16.3e-6, abs=0.1e-6)


def test_loading_what_is_not_a_profile_fails_the_test_with_one_line(pytester) -> None:
    pytester.makepyfile(test_real="def test_it(oam_profile):\n    oam_profile.load('nothing.csv')\n")
    (pytester.path / "nothing.csv").write_text("")
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["oam_profile.load: nothing.csv: a file that is empty (0 bytes)*"])
    assert "Traceback" not in result.stdout.str() and "api.py" not in result.stdout.str()
    pytester.makepyfile(test_real="def test_it(oam_profile):\n    oam_profile.load('baselines/b.json')\n")
    pytester.makepyfile(test_saved="def test_it(oam_profile):\n    oam_profile.load('llm')\n")
    copy_llm(pytester.path / "llm")
    pytester.runpytest("test_saved.py", "--oam-save-baseline").assert_outcomes(passed=1)
    saved = next((pytester.path / "baselines").iterdir())
    shutil.copy(saved, pytester.path / "baselines" / "b.json")
    result = pytester.runpytest("test_real.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["oam_profile.load: baselines/b.json: is a baseline file; load a profile*"])


def test_report_passed_is_false_for_every_failing_status(tmp_path) -> None:
    import pytest_oam as oam

    data = LLM.parent
    run1 = oam.load_any(data / "ascend-msinsight-alexnet2p-level1-rank0" / "kernel_details.csv")
    run2 = oam.load_any(data / "ascend-msinsight-alexnet2p-level2-rank0" / "kernel_details.csv")
    assert oam.compare_profiles(run1, run2).passed  # status pass: two real runs of one job at 10%
    # a folder's memory rows missing from the current kernel file: missing-ops, and nothing regressed
    missing = oam.compare_profiles(oam.load_any(data / "ascend-msinsight-alexnet2p-level1-rank0"), run2)
    assert (missing.status, missing.regressions, missing.passed) == ("missing-ops", [], False)
    other = run2.model_copy(update={"workload_fingerprint": "another-workload"})
    incomparable = oam.compare_profiles(run1, other)
    assert (incomparable.status, incomparable.regressions, incomparable.passed) == ("incomparable", [], False)
    copy_llm(tmp_path / "slow", {"FlashAttentionScore": 1.10})
    regressed = oam.compare_profiles(oam.load_any(LLM), oam.load_any(tmp_path / "slow"))
    assert (regressed.status, regressed.passed) == ("regressed", False)
