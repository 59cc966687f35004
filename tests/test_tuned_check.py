"""The tuned check as a marker (``@pytest.mark.oam(tuned={...})``), an option
(``--oam-tuned-limit``) and an ini key (``oam_tuned_limits``), end to end with pytester, with
and without pytest-xdist: a configuration more than its limit slower than the tuned optimum
fails, naming the op, shapes, both times and the tuned configuration; shapes with no record
are skipped with a visible note, or fail under ``--oam-strict``; bad values are usage errors."""

from __future__ import annotations

import pytest

import simulator
from pytest_oam import OptimizationTarget, ParameterSpace, auto_tune
from pytest_oam.knowledge_base import KnowledgeBase

pytest.importorskip("xdist")

SEQ = 4096


def attention(npu, block_size=128, pipeline_stages=2, fusion=True):
    npu.set_tokens_per_step(SEQ)
    q = npu.tensor((1, 32, SEQ, 128))
    npu.flash_attention(q, q, q, block_size=block_size, pipeline_stages=pipeline_stages, fusion=fusion, causal=True)


@pytest.fixture(scope="module")
def record():
    """The tuned record of FlashAttention at SEQ (an exhaustive search of 18 configurations)."""
    space = ParameterSpace().add_discrete("block_size", [64, 128, 256]).add_int("pipeline_stages", 1, 3)
    space.add_boolean("fusion")
    result = auto_tune(target=OptimizationTarget(operator="FlashAttention", metric="latency_ms"), param_space=space,
                       workload=attention, max_iterations=50)
    from pytest_oam.knowledge_base import record_from_result

    return record_from_result(result)


SUITE = f'''
import pytest

def attention(npu, seq_len={SEQ}, block_size=128, pipeline_stages=2, fusion=True):
    q = npu.tensor((1, 32, seq_len, 128))
    npu.flash_attention(q, q, q, block_size=block_size, pipeline_stages=pipeline_stages, fusion=fusion, causal=True)

TUNED = {{TUNED}}

@pytest.mark.oam(tuned={{"FlashAttention": "2%"}})
def test_tuned_config(oam_profile):
    oam_profile.run(attention, **TUNED)

@pytest.mark.oam(tuned={{"Flash*": "2%"}})
def test_default_config(oam_profile):
    oam_profile.run(attention, block_size=128)

@pytest.mark.oam(tuned={{"FlashAttention": "2%"}})
def test_untuned_shapes(oam_profile):
    oam_profile.run(attention, seq_len=2048, **TUNED)

def test_unmarked_default(oam_profile):
    oam_profile.run(attention, block_size=128)
'''


@pytest.fixture(params=[None, "2"], ids=["no-xdist", "xdist-n2"])
def run(request, pytester: pytest.Pytester, record):
    KnowledgeBase(pytester.path / "tuned" / "knowledge_base.json", [record]).save()
    pytester.makepyfile(test_suite=SUITE.replace("{TUNED}", repr(record.config)))

    def _run(*args: str) -> pytest.RunResult:
        if request.param:
            return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", request.param, *args)
        return pytester.runpytest("-p", "no:cacheprovider", *args)

    return _run


def default_message(record, limit: str) -> str:
    """The failure line of the default configuration (block_size=128, pipeline_stages=2, fused)."""
    default_s = simulator.run(attention, block_size=128).op_time_s("FlashAttention")
    slower_frac = default_s / record.tuned.latency_s - 1
    assert slower_frac > 0.02  # the default is more than the 2% limit slower than the tuned optimum
    return (f"*FlashAttention [[]1, 32, {SEQ}, 128[]] x3 fp16 on ascend910 (simulator {simulator.SIMULATOR_VERSION}) "
            f"takes {default_s * 1e6:,.1f} us per call with block_size=128, {slower_frac * 100:.1f}% slower than the "
            f"tuned {record.tuned.latency_s * 1e6:,.1f} us (limit {limit}); use the tuned configuration {record.config}")


def test_the_marker_fails_a_slow_configuration_and_notes_missing_records(run, record) -> None:
    outcome = run()
    outcome.assert_outcomes(passed=3, failed=1)
    outcome.stdout.fnmatch_lines(["*oam tuned check: FAILED test_suite.py::test_default_config",
                                  default_message(record, "2%")])
    outcome.stdout.fnmatch_lines([
        "*oam tuned check*",
        "oam: tuned check skipped in test_suite.py::test_untuned_shapes (--oam-strict fails it):",
        "    no tuned record for FlashAttention [[]1, 32, 2048, 128[]] x3 fp16 on ascend910 *",
    ])
    assert "test_tuned_config (--oam-strict" not in outcome.stdout.str()


def test_strict_fails_a_call_with_no_record(run) -> None:
    outcome = run("--oam-strict", "-k", "untuned_shapes")
    outcome.assert_outcomes(failed=1)
    outcome.stdout.fnmatch_lines(["*oam tuned check: FAILED test_suite.py::test_untuned_shapes",
                                  "*no tuned record for FlashAttention [[]1, 32, 2048, 128[]] x3 fp16 on ascend910 *"])


def test_the_option_checks_every_profiled_test_and_the_marker_beats_it(run, record) -> None:
    outcome = run("--oam-tuned-limit", "FlashAttention=2%", "-k", "unmarked or tuned_config")
    outcome.assert_outcomes(passed=1, failed=1)
    outcome.stdout.fnmatch_lines(["*oam tuned check: FAILED test_suite.py::test_unmarked_default",
                                  default_message(record, "2%")])
    # The marker's 2% beats a lax command line limit, which passes the unmarked test.
    outcome = run("--oam-tuned-limit", "FlashAttention=90%", "-k", "default")
    outcome.assert_outcomes(passed=1, failed=1)
    outcome.stdout.fnmatch_lines(["*oam tuned check: FAILED test_suite.py::test_default_config"])


def test_the_ini_key_sets_limits_and_the_option_beats_it(pytester: pytest.Pytester, run, record) -> None:
    pytester.makeini("[pytest]\noam_tuned_limits =\n    FlashAttention=2%\n")
    outcome = run("-k", "unmarked")
    outcome.assert_outcomes(failed=1)
    outcome.stdout.fnmatch_lines([default_message(record, "2%")])
    run("-k", "unmarked", "--oam-tuned-limit", "FlashAttention=90%").assert_outcomes(passed=1)


def test_a_failing_tuned_check_saves_no_baseline(pytester: pytest.Pytester, run) -> None:
    run("--oam-save-baseline").assert_outcomes(passed=3, failed=1)
    saved = sorted(p.name for p in (pytester.path / "baselines").iterdir())
    assert len(saved) == 3 and not any("default_config" in name for name in saved)


def test_reports_and_records_carry_a_failed_tuned_check(pytester: pytest.Pytester, run) -> None:
    # Regression: pytest failed the test while the JSON, Markdown and HTML reports called it
    # passed, and --oam-record wrote no record for it.
    import json

    from pytest_oam.record import load_record

    outcome = run("--oam-baseline", "--oam-report", "r.json", "--oam-report", "r.md", "--oam-report", "r.html",
                  "--oam-record", "failed", "-k", "default_config or tuned_config or untuned")
    outcome.assert_outcomes(passed=2, failed=1)
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    default = tests["test_default_config"]
    assert default["failed"] and "slower than the tuned" in default["tuned_failures"][0]
    assert not tests["test_tuned_config"]["failed"] and tests["test_tuned_config"]["tuned_failures"] == []
    assert "no tuned record" in tests["test_untuned_shapes"]["tuned_notes"][0]
    markdown = (pytester.path / "r.md").read_text()
    assert markdown.count("**FAILED**") == 1 and "tuned check failed: `test_suite.py::test_default_config`" in markdown
    assert "tuned check failed: FlashAttention" in (pytester.path / "r.html").read_text()
    (path,) = (pytester.path / ".oam" / "records").iterdir()
    assert "test_default_config" in path.name and load_record(path).test_outcome == "passed"  # the body passed


MARKER_ERRORS = [
    ('tuned={"FlashAttention": "5"}', "tuned: FlashAttention: limit '5' is a fraction of 5 (500%)"),
    ('tuned={"FlashAttention": "fast"}', "tuned: FlashAttention: limit 'fast' is not a percentage"),
    ('tuned=["FlashAttention=5%"]', "tuned must be a dict of op type to limit"),
    ('tuned={"": "5%"}', "tuned: op type '' must be a non-empty string"),
]


@pytest.mark.parametrize(("marker", "message"), MARKER_ERRORS)
def test_a_bad_marker_value_is_a_usage_error(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(test_bad=f"""
import pytest

@pytest.mark.oam({marker})
def test_it(oam_profile):
    pass
""")
    outcome = pytester.runpytest("-p", "no:cacheprovider")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    assert f"test_bad.py::test_it: @pytest.mark.oam: {message}" in outcome.stderr.str()
    # under xdist the worker reports it as a collection error of the module, with the same message
    outcome = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    assert outcome.ret != pytest.ExitCode.OK
    assert message in outcome.stdout.str() + outcome.stderr.str()


@pytest.mark.parametrize(("args", "ini", "message"), [
    (["--oam-tuned-limit", "FlashAttention"], "",
     "--oam-tuned-limit: threshold 'FlashAttention' is not of the form OP=LIMIT"),
    (["--oam-tuned-limit", "FlashAttention=10"], "", "--oam-tuned-limit: limit '10' is a fraction of 10"),
    ([], "oam_tuned_limits = FlashAttention=fast", "oam_tuned_limits (ini): limit 'fast' is not a percentage"),
    (["--oam-tuned-limit", "FlashAttention=5%"], "oam_knowledge_base = typo.json",
     "--oam-tuned-limit: {path}/typo.json: does not exist (the oam_knowledge_base ini key names it"),
    (["--oam-tuned-limit", "FlashAttention=5%"], "oam_knowledge_base = corrupt.json",
     "--oam-tuned-limit: {path}/corrupt.json: is truncated: JSON ends early"),
])
def test_a_bad_option_is_a_usage_error(pytester: pytest.Pytester, args, ini, message) -> None:
    (pytester.path / "corrupt.json").write_text("{")
    pytester.makeini(f"[pytest]\n{ini}\n")
    # a suite that uses the plugin: options are checked at start, ini keys once a test uses it
    pytester.makepyfile(test_ok="def test_it(oam_profile):\n    pass\n")
    outcome = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    assert message.format(path=pytester.path) in outcome.stderr.str()


def test_a_marker_op_the_test_never_ran_fails_it(pytester: pytest.Pytester, record) -> None:
    KnowledgeBase(pytester.path / "tuned" / "knowledge_base.json", [record]).save()
    pytester.makepyfile(test_miss="""
import pytest

def gemm(npu):
    npu.matmul(npu.tensor((256, 256)), npu.tensor((256, 256)))

@pytest.mark.oam(tuned={"FlashAttention": "5%"})
def test_gemm(oam_profile):
    oam_profile.run(gemm)

@pytest.mark.oam(tuned={"FlashAttention": "5%"})
def test_no_profile():
    pass
""")
    outcome = pytester.runpytest("-p", "no:cacheprovider")
    outcome.assert_outcomes(failed=2)
    miss = "*@pytest.mark.oam(tuned=...): FlashAttention matches no op type of the test's profiled runs"
    outcome.stdout.fnmatch_lines([f"{miss} (op types: MatMul)", f"{miss} (op types: none: no oam_profile.run)"])


def test_a_marker_with_a_missing_knowledge_base_fails_the_test(pytester: pytest.Pytester) -> None:
    # Regression: with only the marker, a typo in oam_knowledge_base noted every call as
    # "no tuned record" and the test passed.
    pytester.makeini("[pytest]\noam_knowledge_base = typo.json\n")
    pytester.makepyfile(test_typo=SUITE.replace("{TUNED}", "{}"))
    outcome = pytester.runpytest("-p", "no:cacheprovider", "-k", "test_tuned_config")
    outcome.assert_outcomes(failed=1)
    outcome.stdout.fnmatch_lines([f"*the knowledge base cannot be used: {pytester.path}/typo.json: does not exist*"])


def test_an_option_limit_that_matches_no_op_type_is_named(run) -> None:
    # Review finding: a wrong-case --oam-tuned-limit checked nothing and said nothing.
    outcome = run("--oam-tuned-limit", "flashattention=2%", "-k", "unmarked")
    outcome.assert_outcomes(passed=1)
    outcome.stdout.fnmatch_lines([("oam: tuned limits match no op type of this run, nothing was checked against "
                                  "them: flashattention (op types are case-sensitive: FlashAttention)")])
