"""One typed gate result per test (:class:`pytest_oam.gate.result.GateResult`): built where the
test ran, carried as builtin types, validated once on the controller; and one judge of a run
for the plugin's gate and :func:`pytest_oam.api.compare_profiles`."""

from __future__ import annotations

import json

import pytest

import pytest_oam as oam
from pytest_oam.gate.result import GateResult
from pytest_oam.report.model import GateReport

SUITE = """
def gemm(npu, n):
    npu.matmul(npu.tensor((n, n)), npu.tensor((n, n)))

def test_one(oam_profile):
    oam_profile.run(gemm, 512)

def test_two(oam_profile):
    oam_profile.run(gemm, 1024)
"""

#: Counts, on the controller (not on a worker), the validations of a whole result and of the
#: report the summary and the report files read; written when pytest ends (after every report).
COUNTING_CONFTEST = """
import json
from pytest_oam.gate.result import GateResult
from pytest_oam.report.model import GateReport

CALLS = {"GateResult": 0, "GateReport": 0}

def counting(cls, name):
    original = cls.model_validate.__func__
    def model_validate(klass, *args, **kwargs):
        CALLS[name] += 1
        return original(klass, *args, **kwargs)
    cls.model_validate = classmethod(model_validate)

def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        for cls, name in ((GateResult, "GateResult"), (GateReport, "GateReport")):
            counting(cls, name)

def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        with open("validations.json", "w") as f:
            json.dump(CALLS, f)
"""


@pytest.mark.parametrize("workers", [None, "2"], ids=["no-xdist", "xdist-n2"])
def test_each_result_is_validated_once_on_the_controller(pytester: pytest.Pytester, workers) -> None:
    # Regression (issue 21): the result crossed as a dict that the tuned check edited, and the
    # controller validated each test's report again for the summary and for every report file.
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeconftest(COUNTING_CONFTEST)
    xdist = ["-n", workers] if workers else []
    pytester.runpytest_subprocess(*xdist, "--oam-save-baseline").assert_outcomes(passed=2)
    assert json.loads((pytester.path / "validations.json").read_text()) == {"GateResult": 2, "GateReport": 0}
    result = pytester.runpytest_subprocess(*xdist, "--oam-baseline", "--oam-report=r.json", "--oam-report=r.md")
    result.assert_outcomes(passed=2)
    # two reports and the terminal summary read the two results: still one validation each
    assert json.loads((pytester.path / "validations.json").read_text()) == {"GateResult": 2, "GateReport": 0}
    report = json.loads((pytester.path / "r.json").read_text())
    assert [(t["nodeid"], t["status"]) for t in report["tests"]] == [
        ("test_suite.py::test_one", "pass"), ("test_suite.py::test_two", "pass")]


def test_the_tuned_check_returns_a_new_result() -> None:
    gate = GateResult(report=GateReport(nodeid="t.py::t", status="pass"), op_types=["MatMul", "step"])
    noted = gate.with_tuned([], ["run 1: no record"])
    assert (noted.report.tuned_notes, noted.report.failed, noted.test_passed) == (["run 1: no record"], False, True)
    failed = gate.with_tuned(["MatMul 20% slower than tuned"], [])
    assert (failed.report.tuned_failures, failed.report.failed, failed.test_passed) == (
        ["MatMul 20% slower than tuned"], True, False)
    # the result it started from is unchanged (frozen), and the new one crosses as builtin types
    assert (gate.report.tuned_failures, gate.report.failed, gate.test_passed) == ([], False, True)
    assert GateResult.model_validate(json.loads(json.dumps(failed.model_dump(mode="json")))) == failed


def test_compare_profiles_judges_the_run_with_the_gates_judge(monkeypatch) -> None:
    # Regression (issue 21): compare_profiles had its own orchestration of the comparison and
    # the diagnosis; it now calls the function the plugin's gate judges each run with.
    import importlib

    # the module compare_profiles imports from (pytester's in-process runs may leave the package
    # attribute pointing at an earlier copy)
    evaluate = importlib.import_module("pytest_oam.gate.evaluate")
    calls = []
    judge_run = evaluate.judge_run

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return judge_run(*args, **kwargs)

    monkeypatch.setattr(evaluate, "judge_run", spy)

    def gemm(npu, n=1024):
        npu.matmul(npu.tensor((n, n)), npu.tensor((n, n)))

    base = oam.collect_profile(gemm, hardware="ascend910", steps=2)
    slower = oam.collect_profile(gemm, hardware="ascend910", steps=2, n=1100)
    report = oam.compare_profiles(base, slower)
    assert len(calls) == 1 and calls[0]["hardware"].name == "ascend910"
    assert report.status == "regressed" and [r.op_name for r in report.regressions] == ["MatMul", "step"]
