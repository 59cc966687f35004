"""A gate that cannot be fooled: each scenario with and without pytest-xdist (-n 2)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from pytest_oam.baseline import BaselineFile, baseline_filename, load_baseline
from pytest_oam.report import OamReport

pytest.importorskip("xdist")

SUITE = """
import json, os
import pytest

SCALE = json.loads(os.environ.get("OAM_TEST_SCALE", "{}"))
RENAME = os.environ.get("OAM_RENAME")

def flash(npu, seq_len):
    q = npu.tensor((1, 8, seq_len, 128))
    npu.flash_attention(q, q, q)

def gemm(npu, n):
    npu.matmul(npu.tensor((n, n)), npu.tensor((n, n)))

def model(npu):
    if RENAME:  # the same work under other op types
        q = npu.tensor((1, 8, 1024, 128))
        npu.softmax(q)
        npu.matmul(npu.tensor((2, 512, 512)), npu.tensor((2, 512, 512)))
        return
    flash(npu, 1024)
    gemm(npu, 1024)

@pytest.mark.parametrize("seq_len", [512, 1024, 2048, 4096])
def test_flash(oam_profile, seq_len):
    oam_profile.run(flash, seq_len, op_time_scale=SCALE)

@pytest.mark.parametrize("n", [256, 512, 1024, 2048])
def test_gemm(oam_profile, n):
    oam_profile.run(gemm, n, op_time_scale=SCALE)

def test_model(oam_profile):
    oam_profile.run(model, op_time_scale=SCALE)
"""
FLASH_IDS = [f"test_suite.py::test_flash[{s}]" for s in (512, 1024, 2048, 4096)]
GEMM_IDS = [f"test_suite.py::test_gemm[{n}]" for n in (256, 512, 1024, 2048)]
ALL_IDS = FLASH_IDS + GEMM_IDS + ["test_suite.py::test_model"]


@pytest.fixture(params=[None, "2"], ids=["no-xdist", "xdist-n2"])
def run(request, pytester: pytest.Pytester):
    pytester.makepyfile(test_suite=SUITE)

    def _run(*args: str) -> pytest.RunResult:
        if request.param:
            return pytester.runpytest_subprocess("-n", request.param, *args)
        return pytester.runpytest(*args)

    _run.xdist = request.param is not None
    return _run


def files(pytester: pytest.Pytester) -> dict[str, bytes]:
    folder = pytester.path / "baselines"
    return {p.name: p.read_bytes() for p in folder.iterdir()} if folder.exists() else {}


def report(pytester: pytest.Pytester, name: str = "r.json") -> dict[str, str]:
    parsed = OamReport.model_validate_json((pytester.path / name).read_text())
    return {t.nodeid: t.status for t in parsed.tests}


def slow(monkeypatch, **factors: float) -> None:
    monkeypatch.setenv("OAM_TEST_SCALE", json.dumps(factors))


def test_flash_regression_fails_is_listed_and_counted_by_junit(run, pytester, monkeypatch) -> None:
    run("--oam-save-baseline").assert_outcomes(passed=9)
    slow(monkeypatch, FlashAttention=1.05)
    result = run("--oam-baseline", "--junitxml=junit.xml", "--oam-report=r.json")
    result.assert_outcomes(passed=4, failed=5)  # the 4 flash tests and the model (it runs FlashAttention)
    result.stdout.fnmatch_lines(["REGRESSED test_suite.py::test_flash*FlashAttention +5.0% (limit 2.0%)*"] * 4)
    suite = ET.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert suite.get("failures") == "5"
    statuses = report(pytester)
    regressed = FLASH_IDS + ["test_suite.py::test_model"]
    assert {n: statuses[n] for n in regressed} == dict.fromkeys(regressed, "regressed")
    assert {statuses[n] for n in GEMM_IDS} == {"pass"}


def test_single_worker_also_fails(pytester, monkeypatch) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.runpytest_subprocess("-n", "1", "--oam-save-baseline").assert_outcomes(passed=9)
    slow(monkeypatch, FlashAttention=1.05)
    result = pytester.runpytest_subprocess("-n", "1", "--oam-baseline", "--oam-report=r.json")
    result.assert_outcomes(passed=4, failed=5)
    assert list(report(pytester).values()).count("regressed") == 5


def test_verdicts_identical_with_and_without_xdist(pytester, monkeypatch) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=9)
    slow(monkeypatch, FlashAttention=1.03, MatMul=1.2)
    pytester.runpytest("--oam-baseline", "--oam-report=plain.json")
    pytester.runpytest_subprocess("-n", "2", "--dist", "worksteal", "--oam-baseline", "--oam-report=xdist.json")

    def verdicts(name):
        parsed = OamReport.model_validate_json((pytester.path / name).read_text())
        return sorted((t.nodeid, t.status, json.dumps([v.model_dump() for v in t.verdicts])) for t in parsed.tests)

    assert verdicts("plain.json") == verdicts("xdist.json")


def test_parallel_save_writes_each_baseline_once_and_next_run_compares_all(pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-n", "4", "--oam-save-baseline", "-k", "flash or gemm")
    result.assert_outcomes(passed=8)
    saved = files(pytester)
    assert sorted(saved) == sorted(baseline_filename(n) for n in FLASH_IDS + GEMM_IDS)
    for name in saved:
        load_baseline(pytester.path / "baselines" / name)
    result = pytester.runpytest_subprocess("-n", "4", "--oam-baseline", "-k", "flash or gemm", "--oam-report=r.json")
    result.assert_outcomes(passed=8)
    assert set(report(pytester).values()) == {"pass"} and len(report(pytester)) == 8


def test_renamed_ops_fail_with_missing_ops(run, pytester, monkeypatch) -> None:
    run("--oam-save-baseline", "-k", "model").assert_outcomes(passed=1)
    monkeypatch.setenv("OAM_RENAME", "1")
    result = run("--oam-baseline", "-k", "model", "--oam-report=r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*nothing could be compared: no op type of the baseline is in this run*"])
    assert report(pytester) == {"test_suite.py::test_model": "missing-ops"}


def test_selective_save_leaves_other_files_byte_identical(run, pytester, monkeypatch) -> None:
    run("--oam-save-baseline").assert_outcomes(passed=9)
    before = files(pytester)
    slow(monkeypatch, FlashAttention=1.5, MatMul=1.5)
    run("--oam-save-baseline", "-k", "flash").assert_outcomes(passed=4)
    after = files(pytester)
    flash_files = {baseline_filename(n) for n in FLASH_IDS}
    assert {k: v for k, v in after.items() if k not in flash_files} == {k: v for k, v in before.items() if k not in flash_files}
    assert all(after[k] != before[k] for k in flash_files)
    # A later full gate still compares every test: the saved flash tests pass, the rest regress.
    result = run("--oam-baseline", "--oam-report=r.json")
    result.assert_outcomes(passed=4, failed=5)
    assert len(report(pytester)) == 9


def test_save_and_gate_in_one_run_report_against_the_old_file(run, pytester, monkeypatch) -> None:
    run("--oam-save-baseline", "-k", "model").assert_outcomes(passed=1)
    old = load_baseline(pytester.path / "baselines" / baseline_filename("test_suite.py::test_model"))
    slow(monkeypatch, FlashAttention=1.05)
    result = run("--oam-baseline", "--oam-save-baseline", "-k", "model", "--oam-report=r.json")
    result.assert_outcomes(failed=1)
    assert report(pytester) == {"test_suite.py::test_model": "regressed"}
    new = load_baseline(pytester.path / "baselines" / baseline_filename("test_suite.py::test_model"))
    assert new.runs[0].ops["FlashAttention"].time_s == pytest.approx(old.runs[0].ops["FlashAttention"].time_s * 1.05)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("NaN", "runs[[]0[]].ops.FlashAttention.time_s is nan"),
        ("Infinity", "runs[[]0[]].ops.FlashAttention.time_s is inf"),
        ("null", "runs.0.ops.FlashAttention.time_s: Input should be a valid number"),
        ("-0.001", "runs.0.ops.FlashAttention.time_s: Input should be greater than 0"),
        ("0", "runs.0.ops.FlashAttention.time_s: Input should be greater than 0"),
    ],
)
def test_malformed_value_is_invalid_baseline_naming_file_and_op(run, pytester, value, needle) -> None:
    run("--oam-save-baseline", "-k", "model").assert_outcomes(passed=1)
    path = pytester.path / "baselines" / baseline_filename("test_suite.py::test_model")
    data = json.loads(path.read_text())
    text = json.dumps(data).replace(
        '"FlashAttention": {"count_per_step"', '"FlashAttention": {"count_per_step"'
    )
    old = data["runs"][0]["ops"]["FlashAttention"]["time_s"]
    path.write_text(text.replace(f'"time_s": {json.dumps(old)}', f'"time_s": {value}', 1))
    before = path.read_bytes()
    result = run("--oam-baseline", "-k", "model", "--oam-report=r.json")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{path.name}*{needle}*"])
    assert report(pytester) == {"test_suite.py::test_model": "invalid-baseline"}
    assert path.read_bytes() == before


def test_strict_fails_no_baseline_and_improvement_flag_fails_improved(run, pytester, monkeypatch) -> None:
    run("--oam-save-baseline", "-k", "gemm").assert_outcomes(passed=4)
    result = run("--oam-baseline", "--oam-strict", "-k", "model")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["FAILED (no-baseline) test_suite.py::test_model*"])
    slow(monkeypatch, MatMul=0.5)
    run("--oam-baseline", "-k", "gemm").assert_outcomes(passed=4)
    result = run("--oam-baseline", "--oam-fail-on-improvement", "-k", "gemm")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(["FAILED (improved) test_suite.py::test_gemm*"])


def test_prune_deletes_stale_baselines_only_on_a_full_run(run, pytester) -> None:
    run("--oam-save-baseline").assert_outcomes(passed=9)
    stale = BaselineFile.model_validate(
        json.loads((pytester.path / "baselines" / baseline_filename("test_suite.py::test_model")).read_text())
        | {"nodeid": "test_suite.py::test_gone"}
    )
    stale_path = pytester.path / "baselines" / baseline_filename("test_suite.py::test_gone")
    stale_path.write_text(stale.model_dump_json())
    other_scope = pytester.path / "baselines" / baseline_filename("elsewhere/test_x.py::test_x")
    other_scope.write_text(stale.model_copy(update={"nodeid": "elsewhere/test_x.py::test_x"}).model_dump_json())
    result = run("--oam-save-baseline", "--oam-prune", "-k", "flash")
    result.stdout.fnmatch_lines(["oam: --oam-prune: not a full run (-k*); nothing deleted"])
    assert stale_path.exists()
    # a full gating run names the baseline no test read (newcomer finding: a renamed test was
    # silently no-baseline); a partial one does not, and nothing is deleted
    result = run("test_suite.py", "--oam-baseline")
    result.stdout.fnmatch_lines([
        ("oam: 1 baseline file of tests this run did not collect (renamed, moved or deleted? "
         "--oam-save-baseline --oam-prune deletes them):"),
        "    *test_suite.py::test_gone*",
    ])
    assert "elsewhere" not in result.stdout.str() and stale_path.exists()
    assert "did not collect" not in run("--oam-baseline", "-k", "flash").stdout.str()
    result = run("--oam-save-baseline", "--oam-prune", "test_suite.py")
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines(["oam: pruned stale baseline *test_suite.py::test_gone*"])
    assert not stale_path.exists() and other_scope.exists()
    assert len(files(pytester)) == 10


def test_markdown_report_for_ci_summaries(run, pytester, monkeypatch) -> None:
    run("--oam-save-baseline").assert_outcomes(passed=9)
    slow(monkeypatch, FlashAttention=1.05)
    run("--oam-baseline", "--oam-report=oam.json", "--oam-report=oam.md")
    text = (pytester.path / "oam.md").read_text()
    assert text.startswith("## oam performance gate\n\n**FAILED**: 9 profiled tests (4 pass, 5 regressed)")
    assert "### regressed: `test_suite.py::test_flash[512]`" in text
    assert "| FlashAttention |" in text
    assert report(pytester, "oam.json")["test_suite.py::test_flash[512]"] == "regressed"


NASTY = """
import pytest

def gemm(npu, n):
    npu.matmul(npu.tensor((n, n)), npu.tensor((n, n)))

IDS = ["a/b", "a_b", "A_B", "x::y", "[br]", "日本語", "CON", "nul.txt", "x" * 300, "x" * 299 + "y"]

@pytest.mark.parametrize("case", IDS, ids=IDS)
def test_nasty(oam_profile, case):
    oam_profile.run(gemm, 64 + 16 * IDS.index(case))
"""


def test_nasty_test_ids_get_distinct_files_found_again(run, pytester) -> None:
    pytester.makepyfile(test_nasty=NASTY)
    run("--oam-save-baseline", "test_nasty.py").assert_outcomes(passed=10)
    names = list(files(pytester))
    assert len(names) == 10 and all(len(n.encode()) <= 255 for n in names)
    result = run("--oam-baseline", "--oam-strict", "test_nasty.py", "--oam-report=r.json")
    result.assert_outcomes(passed=10)
    assert set(report(pytester).values()) == {"pass"}


@pytest.mark.parametrize("dist", ["load", "loadgroup", "worksteal", "loadfile"])
def test_every_dist_mode_gives_the_same_verdicts(pytester, monkeypatch, dist) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=9)
    slow(monkeypatch, FlashAttention=1.05)
    result = pytester.runpytest_subprocess("--tx", "2*popen", "--dist", dist, "--oam-baseline", "--oam-report=r.json")
    result.assert_outcomes(passed=4, failed=5)
    assert [s for s in report(pytester).values()].count("regressed") == 5


def test_baseline_identity_holds_only_stable_fields(pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.runpytest("--oam-save-baseline", "-k", "model").assert_outcomes(passed=1)
    data = json.loads((pytester.path / "baselines" / baseline_filename("test_suite.py::test_model")).read_text())
    assert set(data) == {"schema_version", "nodeid", "runs", "model", "dataset", "tag", "collection"}
    # Python API labels and collection settings
    assert (data["model"], data["dataset"], data["tag"], data["collection"]) == (None, None, None, None)
    assert set(data["runs"][0]) == {
        "hardware", "devices", "simulator_version", "workload_fingerprint", "steps", "step_time_s", "step_time_mean_s",
        "step_time_p99_s", "step_time_max_s", "tokens_per_step", "memory_reserved_peak_bytes",
        "memory_allocated_peak_bytes", "alloc_time_s", "alloc_retries_per_step", "memory_peak_live", "collection_mode",
        "ops",
    }


# -- found by a second adversarial review: each was green, lost a baseline, or crashed ---------


def test_module_class_and_function_markers_merge(run, pytester, monkeypatch) -> None:
    pytester.makepyfile(
        test_marks="""
import json, os
import pytest

pytestmark = pytest.mark.oam(thresholds={"MatMul": "1%"})
S = json.loads(os.environ.get("OAM_TEST_SCALE", "{}"))

def mm(npu):
    npu.matmul(npu.tensor((1024, 1024)), npu.tensor((1024, 1024)))

@pytest.mark.oam(devices=1)
def test_module_and_function(oam_profile):
    oam_profile.run(mm, op_time_scale=S)

@pytest.mark.oam(thresholds={"step": "1%"})
@pytest.mark.oam(devices=1)
def test_stacked(oam_profile):
    oam_profile.run(mm, op_time_scale=S)

@pytest.mark.oam(hardware="ascend910")
class TestClass:
    @pytest.mark.oam(devices=1)
    def test_method(self, oam_profile):
        oam_profile.run(mm, op_time_scale=S)
"""
    )
    run("--oam-save-baseline", "test_marks.py").assert_outcomes(passed=3)
    slow(monkeypatch, MatMul=1.05)
    run("--oam-baseline=baselines", "test_marks.py").assert_outcomes(failed=3)


def test_test_that_drops_the_fixture_fails(run, pytester, monkeypatch) -> None:
    pytester.makepyfile(test_drop="def mm(npu):\n    npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64)))\n\n"
                                  "def test_drop(oam_profile):\n    oam_profile.run(mm)\n")
    run("--oam-save-baseline", "test_drop.py").assert_outcomes(passed=1)
    pytester.makepyfile(test_drop="def test_drop():\n    pass\n")
    result = run("--oam-baseline=baselines", "test_drop.py", "--oam-report=r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the test no longer uses the oam_profile fixture, but it has a baseline*"])
    assert report(pytester) == {"test_drop.py::test_drop": "missing-ops"}


def test_slowdown_in_some_steps_is_caught_by_the_mean(run, pytester, monkeypatch) -> None:
    pytester.makepyfile(
        test_steps="""
import os

class Work:
    def __init__(self):
        self.step = 0

    def __call__(self, npu):
        x = npu.tensor((2048, 2048))
        npu.matmul(x, x)
        if os.environ.get("EXTRA") and self.step % 3 == 1:
            npu.matmul(x, x)
        self.step += 1

def test_steps(oam_profile):
    oam_profile.run(Work(), steps=3)
"""
    )
    run("--oam-save-baseline", "test_steps.py").assert_outcomes(passed=1)
    monkeypatch.setenv("EXTRA", "1")
    result = run("--oam-baseline=baselines", "test_steps.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*MatMul*REGRESSED (mean over steps)*"])


def test_xfail_after_a_regression_still_fails(run, pytester, monkeypatch) -> None:
    pytester.makepyfile(
        test_xf="""
import json, os
import pytest
S = json.loads(os.environ.get("OAM_TEST_SCALE", "{}"))

def mm(npu):
    npu.matmul(npu.tensor((512, 512)), npu.tensor((512, 512)))

def test_imperative(oam_profile):
    oam_profile.run(mm, op_time_scale=S)
    if S:
        pytest.xfail("flaky elsewhere")

@pytest.mark.xfail(reason="known functional bug")
def test_marked(oam_profile):
    oam_profile.run(mm, op_time_scale=S)
    assert not S
"""
    )
    run("--oam-save-baseline", "test_xf.py").assert_outcomes(passed=1, xpassed=1)
    slow(monkeypatch, MatMul=1.5)
    result = run("--oam-baseline=baselines", "test_xf.py")
    result.assert_outcomes(failed=2)


def test_runs_are_matched_by_workload_not_position(run, pytester, monkeypatch) -> None:
    pytester.makepyfile(
        test_order="""
import json, os
S = json.loads(os.environ.get("OAM_TEST_SCALE", "{}"))

def attn(npu, seq_len):
    q = npu.tensor((1, 8, seq_len, 128))
    npu.flash_attention(q, q, q)

def test_order(oam_profile):
    if os.environ.get("INSERT"):
        oam_profile.run(attn, 2048, op_time_scale=S)
    oam_profile.run(attn, 4096, op_time_scale=S)
"""
    )
    run("--oam-save-baseline", "test_order.py").assert_outcomes(passed=1)
    monkeypatch.setenv("INSERT", "1")
    slow(monkeypatch, FlashAttention=1.5)
    result = run("--oam-baseline=baselines", "test_order.py", "--oam-report=r.json")
    result.assert_outcomes(failed=1)
    parsed = OamReport.model_validate_json((pytester.path / "r.json").read_text())
    assert [r.status for r in parsed.tests[0].runs] == ["no-baseline", "regressed"]


def test_teardown_error_does_not_save(run, pytester, monkeypatch) -> None:
    pytester.makepyfile(
        test_td="""
import os
import pytest

@pytest.fixture
def checked():
    yield
    assert not os.environ.get("BROKEN")

def mm(npu):
    npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64)))

def test_td(oam_profile, checked):
    oam_profile.run(mm, op_time_scale={"MatMul": float(os.environ.get("S", "1"))})
"""
    )
    run("--oam-save-baseline", "test_td.py").assert_outcomes(passed=1)
    before = files(pytester)
    monkeypatch.setenv("BROKEN", "1")
    monkeypatch.setenv("S", "3")
    result = run("--oam-save-baseline", "test_td.py")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*baseline not written: the test errored in teardown*"])
    assert files(pytester) == before


@pytest.mark.parametrize(
    ("setup", "args", "why"),
    [
        ({"perf/test_broken.py": "import not_installed_module\n"}, (), "collection errors"),
        ({}, ("--ignore=perf/test_b.py",), "--ignore"),
        ({"perf/test_b.py": "import pytest\npytest.skip('no extra', allow_module_level=True)\n"}, (),
         "a module skipped at collection"),
        ({"perf/conftest.py": "def pytest_collection_modifyitems(config, items):\n"
                              "    drop = [i for i in items if 'test_b' in i.nodeid]\n"
                              "    items[:] = [i for i in items if i not in drop]\n"
                              "    config.hook.pytest_deselected(items=drop)\n"}, (), "deselected tests"),
    ],
    ids=["collection-error", "ignore", "module-skip", "conftest-deselect"],
)
def test_prune_refuses_runs_that_do_not_see_every_test(run, pytester, setup, args, why) -> None:
    body = "def mm(npu):\n    npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64)))\n\ndef test_x(oam_profile):\n    oam_profile.run(mm)\n"
    pytester.makepyfile(**{"perf/test_a": body, "perf/test_b": body})
    run("--oam-save-baseline", "perf").assert_outcomes(passed=2)
    before = files(pytester)
    for name, text in setup.items():
        (pytester.path / name).write_text(text)
    result = run("--oam-save-baseline", "--oam-prune", "perf", *args)
    result.stdout.fnmatch_lines([f"oam: --oam-prune: not a full run (*{why}*); nothing deleted"])
    assert set(files(pytester)) == set(before)


def test_deeply_nested_baseline_is_invalid_not_a_crash(run, pytester) -> None:
    run("--oam-save-baseline", "-k", "model").assert_outcomes(passed=1)
    path = pytester.path / "baselines" / baseline_filename("test_suite.py::test_model")
    path.write_text("[" * 100000 + "]" * 100000)
    result = run("--oam-baseline", "-k", "model")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*its JSON nests too deeply*"])
    result = run("--oam-save-baseline", "--oam-prune")
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
