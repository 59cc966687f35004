"""The gate keeps pytest's own outcomes, fails what compared nothing, deletes only what is gone,
and leaves a suite that does not use it alone: each scenario with and without pytest-xdist."""

from __future__ import annotations

import json
import os

import pytest

from pytest_oam.baseline import baseline_filename
from pytest_oam.report import OamReport

pytest.importorskip("xdist")

# SKIP_HOW makes each test end before it profiles, the way a runner without cards or without
# an optional package does; unset, every test profiles one MatMul.
SUITE = """
import os, unittest
import pytest

HOW = os.environ.get("SKIP_HOW", "")

def mm(npu):
    npu.matmul(npu.tensor((256, 256)), npu.tensor((256, 256)))

def test_skip(oam_profile):
    if HOW:
        pytest.skip("no NPU on this runner")
    oam_profile.run(mm)

def test_importorskip(oam_profile):
    if HOW:
        pytest.importorskip("a_package_nobody_has")
    oam_profile.run(mm)

def test_xfail_call(oam_profile):
    if HOW:
        pytest.xfail("driver not ready")
    oam_profile.run(mm)

@pytest.mark.xfail(reason="flaky driver")
def test_xfail_marker(oam_profile):
    if HOW:
        raise RuntimeError("driver crashed")
    oam_profile.run(mm)

def test_error(oam_profile):
    if HOW:
        raise RuntimeError("device lost before profiling")
    oam_profile.run(mm)

class TestCase(unittest.TestCase):
    @pytest.fixture(autouse=True)
    def _profile(self, oam_profile):
        self.oam_profile = oam_profile

    def test_skiptest(self):
        if HOW:
            self.skipTest("no cards in this container")
        self.oam_profile.run(mm)

def test_empty(oam_profile):
    oam_profile.run(mm if not HOW else (lambda npu: None))

def test_skip_without_fixture():
    if HOW:
        pytest.skip("not profiled on this runner")
"""
IDS = [f"test_suite.py::{name}" for name in (
    "test_skip", "test_importorskip", "test_xfail_call", "test_xfail_marker", "test_error",
    "TestCase::test_skiptest", "test_empty")]
ONE = "test_skip and not skiptest and not without"  # -k: test_skip alone


@pytest.fixture(params=[None, "2"], ids=["no-xdist", "xdist-n2"])
def run(request, pytester: pytest.Pytester):
    pytester.makepyfile(test_suite=SUITE)

    def _run(*args: str) -> pytest.RunResult:
        if request.param:
            return pytester.runpytest_subprocess("-n", request.param, "-rsx", *args)
        return pytester.runpytest("-rsx", *args)

    return _run


def saved_matmul_baseline(pytester: pytest.Pytester) -> tuple:
    """A test of one MatMul, run with --oam-save-baseline: its baseline's path and contents."""
    pytester.makepyfile(test_x=(
        "def mm(npu):\n    npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64)))\n\n"
        "def test_x(oam_profile):\n    oam_profile.run(mm)\n"))
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=1)
    path = pytester.path / "baselines" / baseline_filename("test_x.py::test_x")
    return path, json.loads(path.read_text())


def baselines(pytester: pytest.Pytester) -> dict[str, bytes]:
    folder = pytester.path / "baselines"
    return {p.name: p.read_bytes() for p in folder.iterdir()} if folder.exists() else {}


def statuses(pytester: pytest.Pytester, name: str = "r.json") -> dict[str, tuple[str, str | None]]:
    parsed = OamReport.model_validate_json((pytester.path / name).read_text())
    return {t.nodeid: (t.status, t.message) for t in parsed.tests}


@pytest.mark.parametrize("saving", [False, True], ids=["gate", "gate-and-save"])
def test_own_skip_xfail_or_error_before_profiling_stands_and_keeps_the_baseline(
        run, pytester, monkeypatch, saving) -> None:
    run("--oam-save-baseline", "-k", "not empty").assert_outcomes(passed=6, xpassed=1)
    before = baselines(pytester)
    assert len(before) == 6
    monkeypatch.setenv("SKIP_HOW", "1")
    args = ["--oam-baseline", "--oam-report=r.json", "-k", "not empty"]
    result = run(*args, *(["--oam-save-baseline"] if saving else []))
    # before the fix: 6 FAILED with missing-ops, the skip reasons lost
    result.assert_outcomes(skipped=4, xfailed=2, failed=1)
    out = result.stdout.str()
    assert "missing-ops" not in out
    for reason in ("no NPU on this runner", "a_package_nobody_has", "no cards in this container",
                   "not profiled on this runner"):
        assert reason in out
    result.stdout.fnmatch_lines([
        "oam: not-gated test_suite.py::test_skip: the test skipped itself before any profiled run "
        "(no NPU on this runner): not gated; its baseline is kept",
        "oam: not-gated test_suite.py::test_xfail_marker: the test was an expected failure (xfail) before any "
        "profiled run (flaky driver): not gated; its baseline is kept",
        "*RuntimeError: device lost before profiling*",
    ])
    assert "MISSING-OPS" not in out and "FAILED (" not in out
    got = statuses(pytester)
    assert {nodeid: status for nodeid, (status, _) in got.items()} == {
        nodeid: "not-gated" for nodeid in IDS if not nodeid.endswith("empty")}
    assert "(driver not ready)" in got["test_suite.py::test_xfail_call"][1]
    assert "RuntimeError: device lost before profiling" in got["test_suite.py::test_error"][1]
    assert baselines(pytester) == before  # kept, byte for byte, also under --oam-save-baseline


def test_a_workload_that_runs_no_operator_against_a_baseline_fails(run, pytester, monkeypatch) -> None:
    run("--oam-save-baseline", "-k", "empty").assert_outcomes(passed=1)
    monkeypatch.setenv("SKIP_HOW", "1")
    result = run("--oam-baseline", "-k", "empty")
    result.assert_outcomes(failed=1)  # before the fix: passed with a yellow note
    result.stdout.fnmatch_lines([
        "oam performance gate: MISSING-OPS test_suite.py::test_empty",
        "note: run 1 ran no operator, but its baseline run had MatMul: nothing was compared",
    ])


def test_prune_deletes_only_what_is_provably_gone(run, pytester, monkeypatch) -> None:
    body = ("import os, pytest\n"
            "def mm(npu):\n    npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64)))\n"
            "PARAMS = ['cpu', 'npu'] if os.environ.get('HAS_NPU') else ['cpu']\n"
            "@pytest.mark.parametrize('device', PARAMS)\n"
            "def test_x(oam_profile, device):\n    oam_profile.run(mm)\n"
            "def test_y(oam_profile):\n    oam_profile.run(mm)\n")
    pytester.makepyfile(**{"perf/test_a": body, "perf/test_b": body, "perf/test_c": body})
    monkeypatch.setenv("HAS_NPU", "1")
    run("--oam-save-baseline", "perf").assert_outcomes(passed=9)
    monkeypatch.delenv("HAS_NPU")
    folder = pytester.path / "baselines"
    path_of = {nodeid: folder / baseline_filename(nodeid) for nodeid in (
        "perf/test_a.py::test_x[npu]", "perf/test_a.py::test_y", "perf/test_b.py::test_x[cpu]",
        "perf/test_c.py::test_y")}
    assert all(p.is_file() for p in path_of.values())
    # test_b.py is left out by a conftest (it exists: not provably gone); test_c.py is deleted
    # (gone); test_a.py loses test_y (gone) and its npu parameter (test_x is still there: kept)
    (pytester.path / "perf" / "conftest.py").write_text("collect_ignore = ['test_b.py']\n")
    (pytester.path / "perf" / "test_c.py").unlink()
    (pytester.path / "perf" / "test_a.py").write_text(body.split("def test_y")[0])
    result = run("--oam-save-baseline", "--oam-prune", "perf")
    result.assert_outcomes(passed=1)
    assert path_of["perf/test_a.py::test_x[npu]"].is_file()  # before the fix: deleted
    assert path_of["perf/test_b.py::test_x[cpu]"].is_file()  # before the fix: deleted
    assert not path_of["perf/test_a.py::test_y"].exists()
    assert not path_of["perf/test_c.py::test_y"].exists()
    out = result.stdout.str()
    for nodeid in ("perf/test_a.py::test_y", "perf/test_c.py::test_y"):
        assert f"oam: pruned stale baseline baselines/{baseline_filename(nodeid)} ({nodeid})" in out
    result.stdout.fnmatch_lines(["oam: --oam-prune kept 4 baseline files of tests this run did not collect*"])
    for nodeid in ("perf/test_a.py::test_x[npu]", "perf/test_b.py::test_x[cpu]", "perf/test_b.py::test_x[npu]",
                   "perf/test_b.py::test_y"):
        assert f"({nodeid})" in out.split("--oam-prune kept")[1]


@pytest.mark.parametrize("order", ["", "@pytest.hookimpl(tryfirst=True)\n"], ids=["plain", "tryfirst"])
def test_prune_keeps_baselines_of_tests_a_conftest_drops(run, pytester, monkeypatch, order) -> None:
    # Newcomer: a conftest that drops tests from the list (items[:] = ..., which pytest_deselected
    # never hears of) made the next --oam-prune delete their baselines, though the tests exist
    pytester.makepyfile(test_drop=(
        "def mm(npu):\n    npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64)))\n\n"
        "def test_attn(oam_profile):\n    oam_profile.run(mm)\n\n"
        "def test_mm(oam_profile):\n    oam_profile.run(mm)\n"))
    run("--oam-save-baseline", "test_drop.py").assert_outcomes(passed=2)
    pytester.makeconftest(f"import os\nimport pytest\n\n{order}def pytest_collection_modifyitems(items):\n"
                          "    if os.environ.get('NO_NPU'):\n"
                          "        items[:] = [i for i in items if 'attn' not in i.nodeid]\n")
    monkeypatch.setenv("NO_NPU", "1")
    for args in (["--oam-save-baseline", "--oam-prune"], ["--oam-baseline"]):
        result = run("test_drop.py", *args)
        result.assert_outcomes(passed=1)
        assert (pytester.path / "baselines" / baseline_filename("test_drop.py::test_attn")).is_file()
        out = result.stdout.str()
        assert "pruned" not in out and "test_attn" not in out, out  # nor reported as a baseline no test reads


@pytest.mark.parametrize("existing", [
    ("tuned/knowledge_base.json", '{"schema_version": 1, "records": []}'),
    ("summary.md", "# Release notes\n"),
    ("index.html", "<!DOCTYPE html><html><title>Our dashboard</title></html>"),
    ("data.json", "[1, 2, 3]"),
    # look-alikes (newcomer finding: they were replaced)
    ("notes.md", "## oam performance gate (meeting notes)\nkeep me\n"),
    ("slides.html", "<!DOCTYPE html><html><title>oam performance gate: my slides</title>keep me</html>"),
])
def test_a_report_never_replaces_a_file_that_is_not_a_report(pytester, existing) -> None:
    # checked at start, on the controller: the same with and without xdist
    pytester.makepyfile(test_suite=SUITE)
    run = pytester.runpytest
    name, text = existing
    (pytester.path / name).parent.mkdir(exist_ok=True)
    (pytester.path / name).write_text(text)
    result = run("-k", "skip", f"--oam-report={name}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # before the fix: the file was replaced by a report
    result.stderr.fnmatch_lines([f"ERROR: --oam-report: *{name} exists and is not a pytest-oam report*"])
    assert (pytester.path / name).read_text() == text


def test_a_report_of_ours_is_replaced(pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    run = pytester.runpytest
    for name in ("r.json", "r.md", "r.html"):
        run("-k", ONE, f"--oam-report={name}").assert_outcomes(passed=1)
        first = (pytester.path / name).read_text()
        run("-k", ONE, f"--oam-report={name}").assert_outcomes(passed=1)
        assert (pytester.path / name).read_text() == first
    (pytester.path / "empty.md").write_text("")
    run("-k", ONE, "--oam-report=empty.md").assert_outcomes(passed=1)
    assert (pytester.path / "empty.md").read_text().startswith("## oam performance gate")


def test_workload_that_is_not_a_function_is_one_clear_line(pytester) -> None:
    pytester.makepyfile(test_x="def test_x(oam_profile):\n    oam_profile.run(42)\n")
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*TypeError: oam_profile.run: the workload must be a function called as "
                                 "workload(npu, *args, **kwargs), got int 42"])


# -- a suite that does not use the plugin -------------------------------------------------------

PLAIN = """
import sys

def test_plain():
    assert 1 + 1 == 2

def test_nothing_heavy_was_imported():
    heavy = [m for m in ("simulator", "numpy", "pydantic", "pytest_oam.session", "pytest_oam.rules")
             if m in sys.modules]
    assert heavy == []
"""


@pytest.mark.parametrize("xdist", [None, "2"], ids=["no-xdist", "xdist-n2"])
def test_an_unused_plugin_imports_nothing_heavy(pytester, xdist) -> None:
    pytester.makepyfile(test_plain=PLAIN)
    result = pytester.runpytest_subprocess(*(["-n", xdist] if xdist else []))
    result.assert_outcomes(passed=2)  # before the fix: the simulator, numpy and pydantic loaded at configure


@pytest.mark.parametrize("xdist", [None, "2"], ids=["no-xdist", "xdist-n2"])
@pytest.mark.parametrize("option", [None, "--oam-baseline"])
def test_a_simulator_module_of_the_project_errors_only_the_tests_that_use_the_fixture(
        pytester, xdist, option) -> None:
    pytester.makepyfile(
        simulator="def run_my_sim():\n    return 42\n",
        test_mine=("import simulator\n\ndef test_mine():\n    assert simulator.run_my_sim() == 42\n\n"
                   "def test_oam(oam_profile):\n    oam_profile.run(lambda npu: None)\n"),
    )
    (pytester.path / "baselines").mkdir()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *(["-n", xdist] if xdist else []),
                                           *([option] if option else []))
    # before the fix: INTERNALERROR at configure, test_mine never ran
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*oam: another module named 'simulator' (*simulator.py*) hides pytest-oam's "
                                 "simulator package*rename your module*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_bad_ini_value_is_still_a_usage_error_when_a_test_uses_the_fixture(pytester) -> None:
    pytester.makeini("[pytest]\noam_hardware = ascend999\n")
    pytester.makepyfile(test_x="def test_x(oam_profile):\n    pass\n\ndef test_y():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: oam_hardware (ini): unknown hardware 'ascend999'*"])
    # ... and not an error at all in a suite that never uses it
    pytester.makepyfile(test_x="def test_x():\n    pass\n\ndef test_y():\n    pass\n")
    pytester.runpytest().assert_outcomes(passed=2)


def test_fixture_requested_at_run_time_still_gates(pytester) -> None:
    pytester.makepyfile(test_x=(
        "def mm(npu):\n    npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64)))\n\n"
        "def test_x(request):\n    request.getfixturevalue('oam_profile').run(mm)\n"))
    pytester.runpytest("--oam-save-baseline", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    result = pytester.runpytest("--oam-baseline", "--oam-report=r.json")
    result.assert_outcomes(passed=1)
    assert json.loads((pytester.path / "r.json").read_text())["tests"][0]["status"] == "pass"
    assert os.listdir(pytester.path / "baselines") == [baseline_filename("test_x.py::test_x")]


def test_a_marker_with_a_card_count_hccl_does_not_support_stops_the_run_before_any_test(pytester) -> None:
    pytester.makepyfile(test_x=(
        "import pytest\n\n@pytest.mark.oam(devices=3)\ndef test_x(oam_profile):\n    pass\n\n"
        "@pytest.mark.oam(devices=16, hardware='ascend910b')\ndef test_y(oam_profile):\n    pass\n"))
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # before the fix: test_x failed when it ran
    result.stderr.fnmatch_lines(["ERROR: test_x.py::test_x: @pytest.mark.oam: devices=3: HCCL on an ascend910 "
                                 "server (8 cards) supports 1, 2, 4 or 8 cards in one server, or a multiple of 8 "
                                 "across servers"])
    assert "test_y" not in result.stderr.str()


def test_names_from_a_baseline_cannot_forge_terminal_or_markdown_output(pytester) -> None:
    path, data = saved_matmul_baseline(pytester)
    crafted = "Softmax\x1b[32m PASSED\x1b[0m\r\n| forged | row |<script>alert(1)</script>"
    data["runs"][0]["ops"][crafted] = data["runs"][0]["ops"]["MatMul"]
    path.write_text(json.dumps(data))
    result = pytester.runpytest("--oam-baseline", "--oam-report=r.md")
    result.assert_outcomes(passed=1)  # missing-ops: an op type of the baseline is gone
    out = result.stdout.str()
    assert "\x1b" not in out and "\r" not in out  # before the fix: the escape reached the terminal
    assert not any(line.startswith("| forged") for line in out.splitlines())
    assert "not in this run: Softmax PASSED | forged | row |<script>alert(1)</script>" in out  # shown, on one line
    md = (pytester.path / "r.md").read_text()
    assert "<script>" not in md and "\x1b" not in md
    assert not any(line.startswith("| forged") for line in md.splitlines())


def test_a_workload_larger_than_the_hbm_fails_and_is_never_saved_in_default_mode(pytester) -> None:
    pytester.makepyfile(test_big=(
        "def huge(npu):\n    npu.tensor((2**40,), 'fp16')  # 2 TiB on a 32 GiB card\n\n"
        "def test_big(oam_profile):\n    oam_profile.run(huge)\n"))
    result = pytester.runpytest("--oam-save-baseline")
    result.assert_outcomes(failed=1)  # before the fix: passed, step time 8.8e41 s, and saved
    result.stdout.fnmatch_lines(["*OutOfMemoryError*"])
    assert not (pytester.path / "baselines").exists() or not list((pytester.path / "baselines").iterdir())


def test_an_implausible_baseline_value_errors_the_test_naming_the_file(pytester) -> None:
    path, data = saved_matmul_baseline(pytester)
    data["runs"][0]["ops"]["MatMul"]["time_s"] = 1e308
    path.write_text(json.dumps(data))
    result = pytester.runpytest("--oam-baseline")
    result.assert_outcomes(errors=1)  # before the fix: compared with 1e308 s and passed as improved
    result.stdout.fnmatch_lines([f"*{path.name}*time_s*1e+308 s is implausible*"])


def test_a_bad_ini_value_under_xdist_errors_the_tests_that_use_the_plugin(pytester) -> None:
    pytester.makeini("[pytest]\noam_hardware = ascend999\n")
    pytester.makepyfile(test_x="def test_x(oam_profile):\n    pass\n\ndef test_y():\n    pass\n")
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    # before the fix: INTERNALERROR (a worker raised the usage error), no test ran
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*oam: oam_hardware (ini): unknown hardware 'ascend999'*"])


def test_a_marker_added_while_the_test_runs_applies_to_its_gate(pytester, monkeypatch) -> None:
    pytester.makepyfile(test_x=(
        "import os, pytest\n\n"
        "def mm(npu):\n    npu.matmul(npu.tensor((256, 256)), npu.tensor((256, 256)))\n\n"
        "def test_x(oam_profile, request):\n"
        "    request.applymarker(pytest.mark.oam(thresholds={'*': '1%'}))\n"
        "    oam_profile.run(mm, op_time_scale={'MatMul': float(os.environ.get('SLOW', '1'))})\n"))
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=1)
    monkeypatch.setenv("SLOW", "1.05")
    result = pytester.runpytest("--oam-baseline")
    result.assert_outcomes(failed=1)  # before the fix: the marker read at setup was kept, 5% passed
    result.stdout.fnmatch_lines(["REGRESSED test_x.py::test_x: MatMul +5.0% (limit 1.0%)*"])


#: A test of two subtests, each profiling a MatMul: SLOW scales its time, FAIL fails each subtest.
SUBTESTS = (
    "import os\n\n"
    "def mm(npu, n):\n    npu.matmul(npu.tensor((n, n)), npu.tensor((n, n)))\n\n"
    "def test_sub(oam_profile, subtests):\n"
    "    for n in (256, 512):\n"
    "        with subtests.test(n=n):\n"
    "            oam_profile.run(mm, n, op_time_scale={'MatMul': float(os.environ.get('SLOW', '1'))})\n"
    "            assert not os.environ.get('FAIL')\n")


@pytest.mark.parametrize("xdist", [None, "2"], ids=["no-xdist", "xdist-n2"])
def test_a_test_with_a_failed_subtest_is_not_saved(pytester, monkeypatch, xdist) -> None:
    pytester.makepyfile(test_sub=SUBTESTS)
    args = ["-n", xdist] if xdist else []
    pytester.runpytest_subprocess(*args, "--oam-save-baseline")
    before = baselines(pytester)
    assert len(before) == 1
    monkeypatch.setenv("FAIL", "1")
    monkeypatch.setenv("SLOW", "2")
    result = pytester.runpytest_subprocess(*args, "--oam-save-baseline")
    result.stdout.fnmatch_lines(["*test_sub.py::test_sub: baseline not written: a subtest failed*"])
    assert baselines(pytester) == before  # before the fix: overwritten with the 2x slower run


@pytest.mark.parametrize(("first", "second", "slowed"), [
    ("hardware='ascend910'", "hardware='ascend910b'", "ascend910b"),
    ("devices=1", "devices=8", "8"),
    ("memory=False", "memory=True", "True"),
], ids=["hardware", "devices", "memory"])
def test_runs_of_one_workload_pair_by_hardware_devices_and_memory_whatever_their_order(
        pytester, monkeypatch, first, second, slowed) -> None:
    pytester.makepyfile(test_pair=(
        "import os\n\n"
        "def mm(npu):\n    npu.matmul(npu.tensor((512, 512)), npu.tensor((512, 512)))\n\n"
        "def test_pair(oam_profile):\n"
        f"    runs = [dict({first}), dict({second})]\n"
        "    if os.environ.get('SWAP'):\n        runs.reverse()\n"
        "    for kw in runs:\n"
        f"        scale = float(os.environ.get('SLOW', '1')) if str(list(kw.values())[0]) == {slowed!r} else 1.0\n"
        "        oam_profile.run(mm, op_time_scale={'MatMul': scale}, **kw)\n"))
    pytester.runpytest_subprocess("--oam-save-baseline").assert_outcomes(passed=1)
    monkeypatch.setenv("SWAP", "1")
    pytester.runpytest_subprocess("--oam-baseline").assert_outcomes(passed=1)  # before the fix (memory): a false REGRESSED
    monkeypatch.setenv("SLOW", "3")
    result = pytester.runpytest_subprocess("--oam-baseline")
    result.assert_outcomes(failed=1)  # before the fix (hardware, devices): incomparable, passed
    result.stdout.fnmatch_lines(["REGRESSED test_pair.py::test_pair: MatMul in run 1 +*"])  # the slowed run, paired right


@pytest.mark.parametrize("xdist", [None, "2"], ids=["no-xdist", "xdist-n2"])
def test_a_simulator_module_in_a_test_folder_is_found_with_an_option_given(pytester, xdist) -> None:
    # Reviewer finding: with --oam-baseline the options were read at configure, which imported our
    # simulator before collection put tests/ on sys.path; the project's own test then got ours.
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(**{
        "tests/simulator": "def run_my_sim():\n    return 42\n",
        "tests/test_mine": ("import simulator\n\ndef test_mine():\n    assert simulator.run_my_sim() == 42\n\n"
                            "def test_oam(oam_profile):\n    oam_profile.run(lambda npu: None)\n"),
    })
    (pytester.path / "baselines").mkdir()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *(["-n", xdist] if xdist else []),
                                           "--oam-baseline")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*oam: another module named 'simulator' *hides pytest-oam's simulator package*"])


@pytest.mark.parametrize("xdist", [None, "2"], ids=["no-xdist", "xdist-n2"])
def test_subtests_are_not_gated_one_by_one(pytester, monkeypatch, xdist) -> None:
    # pytest's subtests make each subtest's call report with pytest_runtest_makereport while the
    # test runs: the gate judged the runs made so far, so under --oam-strict the first subtest
    # failed with missing-ops against the whole test's baseline, and a regression failed twice
    pytester.makepyfile(test_sub=SUBTESTS)
    args = ["-n", xdist] if xdist else []
    pytester.runpytest_subprocess(*args, "--oam-baseline", "--oam-save-baseline", "--oam-strict")
    assert len(baselines(pytester)) == 1  # before the fix: "baseline not written: a subtest failed"
    result = pytester.runpytest_subprocess(*args, "--oam-baseline", "--oam-strict")
    result.assert_outcomes(passed=1)  # before the fix: SUBFAILED(n=256) ... MISSING-OPS
    assert "SUBFAILED" not in result.stdout.str()
    monkeypatch.setenv("SLOW", "1.5")
    result = pytester.runpytest_subprocess(*args, "--oam-baseline")
    result.assert_outcomes(failed=1)  # before the fix: failed=2, the subtest that passed included
    assert "SUBFAILED" not in result.stdout.str()
    result.stdout.fnmatch_lines(["oam: recorded 1 test in *"])


@pytest.mark.parametrize("how", ["skip", "xfail"])
@pytest.mark.parametrize("xdist", [None, "2"], ids=["no-xdist", "xdist-n2"])
def test_strict_does_not_fail_a_test_that_skipped_itself_after_profiling(pytester, how, xdist) -> None:
    # A test that skips or xfails itself is never saved, so --oam-strict failing it for want of a
    # baseline left it red for good: --oam-save-baseline could not clear it
    pytester.makepyfile(test_late=(
        "import pytest\n\n"
        "def mm(npu):\n    npu.matmul(npu.tensor((256, 256)), npu.tensor((256, 256)))\n\n"
        "def test_late(oam_profile):\n"
        "    oam_profile.run(mm)\n"
        f"    pytest.{how}('not on this runner')\n"))
    args = ["-n", xdist] if xdist else []
    for extra in ([], ["--oam-save-baseline"]):
        result = pytester.runpytest_subprocess(*args, "--oam-baseline", "--oam-strict", *extra)
        result.assert_outcomes(**{"skipped" if how == "skip" else "xfailed": 1})  # before the fix: failed=1
        assert baselines(pytester) == {}
    result.stdout.fnmatch_lines(["*no-baseline test_late.py::test_late: no baseline, and none written*"])
