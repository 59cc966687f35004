"""Diagnosis rules: each fires on a workload built to show it, stays silent on a healthy one,
and names the rule, severity, operator and the line of user code."""

from __future__ import annotations

import itertools

import pytest

import simulator
from pytest_oam.rules import RULES, Rule, RuleFinding, parse_rule_thresholds, run_rules
from simulator.hardware import load_hardware
from simulator.models import LLAMA2_7B, training_step
from simulator.units import GiB

A910 = load_hardware("ascend910")
HERE = __file__.rsplit("/", 1)[-1]


def findings(workload, hardware="ascend910", **kwargs):
    profile = simulator.run(workload, hardware=hardware, **kwargs)
    return run_rules(profile, load_hardware(hardware)), profile


def only(found, rule_id):
    hits = [f for f in found if f.rule_id == rule_id]
    assert len(hits) == 1, found
    return hits[0]


def healthy(npu):
    npu.matmul(npu.tensor((4096, 4096)), npu.tensor((4096, 4096)))


def test_healthy_runs_are_quiet() -> None:
    assert findings(healthy)[0] == []
    # Llama-2-7B training steps, memory tracked. On 8 x 910A (TP4 x DP2, PCIe between the two
    # HCCS groups) the collectives are 50% of the step and none is hidden behind compute (the
    # timeline is serial): one finding. On 8 x 910B (TP8 in one HCCS mesh, its links at the
    # 15.7 GB/s measured on a real 910B2 profile) they are 30% (simulator 0.9.0): one too.
    expected = {"ascend910": ["comm-share"], "ascend910b": ["comm-share"]}
    for hw, rule_ids in expected.items():
        profile = simulator.run(training_step, LLAMA2_7B, devices=8, steps=2, hardware=hw, memory=True)
        assert [f.rule_id for f in run_rules(profile, load_hardware(hw))] == rule_ids


def test_slow_op() -> None:
    def work(npu):
        q = npu.tensor((1, 8, 2048, 128))
        npu.flash_attention(q, q, q)  # line asserted below

    profile = simulator.run(work, steps=6)
    ops = [op.model_copy(update={"duration_s": op.duration_s * 4}) if op.step == 3 else op for op in profile.ops]
    slow = profile.model_copy(update={"ops": ops})
    f = only(run_rules(slow, A910), "slow-op")
    assert (f.severity, f.op_type) == ("serious", "FlashAttention")
    assert f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 2}")
    # step 0 warms the caching allocator up and is left out when a run has more steps
    assert "1 of 5 calls" in f.description and "step 3" in f.description
    assert run_rules(profile, A910) == []


def test_low_ai_core_utilization_and_memory_bound() -> None:
    # Two workloads: with the device launch floor at 0.92 us (simulator 0.7.0; 11 us before) a
    # thin K = 40 product over many tiles keeps its MTE2 pipe busy (writing C), so it is
    # memory-bound but its cores do not idle; cores idle when the product has fewer tiles
    # than AI Cores.
    def few_tiles(npu):
        healthy(npu)  # 0.6 ms: the host issues the small products meanwhile, so they run back to back
        a, b = npu.tensor((128, 40)), npu.tensor((40, 2048))
        for _ in range(10):
            npu.matmul(a, b)  # K=40: padding; 128 x 256 C tiles: 8 blocks for 32 AI Cores

    found, profile = findings(few_tiles)
    low = only(found, "low-ai-core-utilization")
    assert low.severity == "warning" and low.op_type == "MatMul"
    assert low.location.endswith(f"{HERE}:{few_tiles.__code__.co_firstlineno + 4}")
    small = profile.ops[1:]
    # each call is ~2.7 us, under the rule's 20 us floor: the rule adds up the calls of one line
    assert max(op.duration_s for op in small) < 20e-6 < sum(op.duration_s for op in small)
    assert "only 8 blocks for 32 AI Cores: 24 of them idle" in low.description
    # K = 40 pads to 48 in the Cube, but the op waits for memory (writing C dominates): re-costed
    # with K aligned down to 32, its work would take no less time, so padding is not blamed
    assert "aligning it (K 40 -> 32) would save only 0.0 us per call by the cost model" in low.description

    def wide(npu):
        npu.matmul(npu.tensor((64, 40)), npu.tensor((40, 131072)))  # K=40, 512 thin tiles, one call

    found, profile = findings(wide)
    assert profile.ops[0].duration_s > 20e-6  # the memory-bound rule looks at single calls
    bound = only(found, "memory-bound")
    assert (bound.severity, bound.op_type) == ("serious", "MatMul") and "memory_bound" in bound.description
    assert bound.location.endswith(f"{HERE}:{wide.__code__.co_firstlineno + 1}")
    # its MTE2 pipe is busy (mte2_ratio above the 0.8 threshold): no pipe idles, so the cores
    # are not reported as underused
    assert profile.ops[0].mte2_ratio > 0.8
    assert "low-ai-core-utilization" not in {f.rule_id for f in found}


def test_a_host_bound_loop_claims_no_gain_from_faster_kernels() -> None:
    # Regression test: the same ten small products alone, each issued 20 us after the last (the
    # host's dispatch time) and done in 2.7 us: the device waits for the host between them, so
    # idle cores cost the step nothing and a faster kernel saves nothing. The rule claimed the
    # idle pipes' 23 us (a warning) before it asked whether the next kernel waited for the host.
    def few_tiles_alone(npu):
        a, b = npu.tensor((128, 40)), npu.tensor((40, 2048))
        for _ in range(10):
            npu.matmul(a, b)

    found, profile = findings(few_tiles_alone)
    ops = profile.ops
    assert all(b.start_s - (a.start_s + a.duration_s) > 15e-6 for a, b in itertools.pairwise(ops))  # host-bound
    assert "low-ai-core-utilization" not in {f.rule_id for f in found}


def test_a_kernel_before_a_blocking_collective_keeps_its_gain() -> None:
    # Regression test (review): a tensor-parallel all-reduce the compute stream waits for leaves
    # the device idle before the next kernel, not for the host: a faster kernel before it still
    # ends the step sooner, so it must not count as host-gated (22 of 136 compute ops were).
    import dataclasses

    from pytest_oam.judge.rules import RuleContext
    from simulator.models import ParallelLayout

    two_layers = dataclasses.replace(LLAMA2_7B, num_layers=2)
    profile = simulator.run(training_step, two_layers, devices=2, seq_len=2048, hardware="ascend910b", dtype="bf16",
                            layout=ParallelLayout(2, 1), steps=2)
    ctx = RuleContext(profile, load_hardware("ascend910b"), {})
    compute = sorted((o for o in profile.ops if o.stream == "compute"), key=lambda o: (o.step, o.start_s))
    blocking = [o for o in profile.ops if o.stream == "hccl" and not o.attrs.get("async_op")]
    before_collective = [a for a, b in itertools.pairwise(compute) if a.step == b.step and any(
        a.start_s + a.duration_s <= h.start_s and h.start_s + h.duration_s <= b.start_s for h in blocking)]
    assert before_collective  # the tensor-parallel all-reduces
    assert all(ctx.step_saving_s(a, 1e-6) == 1e-6 for a in before_collective)


def test_an_imported_profile_keeps_its_findings_where_the_device_was_busy() -> None:
    # Regression test (review): on a real profile every kernel is followed by a gap of tens of
    # nanoseconds; counting any gap as the host's silenced every rule on the LLM profile (2,447 of
    # 2,448 compute kernels). Only gaps over 1 us with no collective ending in them count.
    from pathlib import Path

    from pytest_oam.files.importers import read_ascend_csv
    from pytest_oam.judge.rules import RuleContext

    csv = (Path(__file__).parent / "data" / "realdata" / "ascend-msinsight-llm-pp2dp2-level2-rank0"
           / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv")
    profile = read_ascend_csv(csv).profile
    hw = load_hardware("ascend910b4")
    compute = [o for o in profile.ops if o.stream == "compute"]
    gated = RuleContext(profile, hw, {})._host_gated
    assert 0 < len(gated) < 0.8 * len(compute)
    assert "memory-bound" in {f.rule_id for f in run_rules(profile, hw)}


def test_low_ai_core_utilization_gain_is_recosted_with_the_shape_aligned() -> None:
    from simulator.costs import OpSpec, op_cost

    def work(npu, m=2049):
        npu.matmul(npu.tensor((m, 1024)), npu.tensor((1024, 1024)))  # line asserted below

    found, profile = findings(work)
    f = only(found, "low-ai-core-utilization")
    assert (f.severity, f.op_type) == ("serious", "MatMul")
    assert f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 1}")
    assert "M 2049 -> 2048" in f.description and "the last tile row is 0.8% full" in f.description

    def time_s(m):
        return op_cost(OpSpec("MatMul", ((1, m, 1024), (1, 1024, 1024)), "fp16"), A910).duration_s

    # The gain is the call re-costed at M = 2048, its work pro-rated (2049 rows at 2048's rate).
    assert profile.ops[0].duration_s == time_s(2049)
    assert f.gain_s == pytest.approx(time_s(2049) - time_s(2048) * 2049 / 2048, rel=1e-12)
    # By hand: C tiles are 128 x 256, so M = 2049 makes 17 x 4 = 68 blocks, 3 waves on 32 AI
    # Cores (the last keeps 4 busy), and M = 2048 makes 64 blocks, 2 full waves: aligning saves
    # about one wave of three, a third of the time after the launch floor.
    launch_s = A910.launch.kernel_launch_latency_s
    assert f.gain_s == pytest.approx((time_s(2049) - launch_s) / 3, rel=0.05)


def test_low_overlap() -> None:
    def work(npu):
        q = npu.tensor((1, 8, 4096, 128))
        npu.flash_attention(q, q, q, pipeline_stages=1)  # one buffer: DMA never runs ahead

    f = only(findings(work)[0], "low-overlap")
    assert (f.severity, f.op_type) == ("serious", "FlashAttention") and "overlap 0%" in f.description
    assert f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 2}")


def test_frequent_alloc_and_retries() -> None:
    sizes = iter([20, 25])

    def work(npu):
        big = npu.tensor((next(sizes), GiB // 2))  # 20 GiB, then 25 GiB: the cached 20 GiB must go
        small = npu.tensor((1024, 1024))
        npu.add(small, small)  # the flush stalls this op
        del big

    found, profile = findings(work, steps=2, memory=True)
    f = only(found, "frequent-alloc")
    assert "flushed the cache and retried in step 1;" in f.description and f.step_share_frac <= 1
    assert f.severity in ("serious", "warning") and f.op_type == "Add"
    assert f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 3}")
    assert [m.alloc_retries for m in profile.memory] == [0, 1]


def test_a_one_step_run_is_not_blamed_for_filling_the_cache() -> None:
    # Newcomer finding: a single memory-tracked Llama step got "1 of 1 steps spend over 10 ms in
    # the allocator", the cold start every run pays; with more steps the first is left out anyway
    found, profile = findings(lambda npu: training_step(npu, LLAMA2_7B, seq_len=2048), devices=8, memory=True)
    assert profile.memory[0].alloc_time_s > 10e-3
    assert "frequent-alloc" not in [f.rule_id for f in found]


def test_frequent_alloc_names_the_other_flushes() -> None:
    sizes = iter([20, 21, 22, 23, 24, 25])

    def work(npu):
        big = npu.tensor((next(sizes), GiB // 2))  # one more GiB every step: the cached segment must go
        small = npu.tensor((1024, 1024))
        npu.add(small, small, name="stalled")
        del big

    found, profile = findings(work, steps=6, memory=True)
    f = only(found, "frequent-alloc")
    assert [m.alloc_retries for m in profile.memory] == [0, 1, 1, 1, 1, 1]
    # the worst stall is described in full, three of the other four are named, one is counted
    assert f.description.count("stalled (Add) in step ") == 3
    assert "also waited for a flush: stalled (Add) in step " in f.description
    assert "(2 device frees, 2 device mallocs) and 1 more;" in f.description


def test_comm_share() -> None:
    def work(npu):
        npu.all_reduce(npu.tensor((64 << 20,)))  # 128 MiB over 8 cards
        npu.matmul(npu.tensor((4096, 4096)), npu.tensor((4096, 4096)))

    f = only(findings(work, devices=8)[0], "comm-share")
    assert f.op_type == "AllReduce" and f.severity == "serious" and "hierarchical-mesh-ring" in f.description
    assert f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 1}")
    assert "not a multiple of 512 B" not in f.description  # 128 MiB is aligned

    def unaligned(npu):
        npu.all_reduce(npu.tensor((64 << 20,)))
        npu.all_reduce(npu.tensor((1000,)))  # 2,000 B: small, and not a multiple of 512 B
        npu.matmul(npu.tensor((4096, 4096)), npu.tensor((4096, 4096)))

    f = only(findings(unaligned, devices=8)[0], "comm-share")
    assert "1 messages under 1 MiB" in f.description and "1 message sizes not a multiple of 512 B" in f.description


def test_cube_alignment() -> None:
    def work(npu, n=4097):
        npu.matmul(npu.tensor((4096, 4096)), npu.tensor((4096, n)))  # line asserted below

    found, profile = findings(work)
    f = only(found, "cube-alignment")  # the Cube unit is busy (mac_ratio 0.98): not low utilisation
    assert (f.severity, f.op_type) == ("serious", "MatMul")
    assert f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 1}")
    assert "N = 4097 is 1 past a multiple of 256" in f.description
    # N = 4097 needs 17 tile columns of 256 where 4096 needs 16: by hand the call takes 17/16 of
    # the aligned one after the launch floor, and the gain is that extra column minus the one
    # column of real work it holds (pro-rated by FLOP).
    aligned = simulator.run(work, n=4096).ops[0].duration_s
    launch_s = A910.launch.kernel_launch_latency_s
    assert profile.ops[0].duration_s - launch_s == pytest.approx((aligned - launch_s) * 17 / 16, rel=0.01)
    assert f.gain_s == pytest.approx(profile.ops[0].duration_s - aligned * 4097 / 4096, rel=1e-9)
    assert findings(work, n=4096)[0] == []  # aligned: silent


def communicate(npu):
    x = npu.tensor((4096, 4096))
    for _ in range(4):
        npu.matmul(x, x)
    npu.all_reduce(npu.tensor((8 << 20,)), ranks=[0, 1, 2, 3])  # 16 MiB in one HCCS mesh


COMM_LINE = communicate.__code__.co_firstlineno + 4


def test_communication_healthy_is_quiet() -> None:
    assert findings(communicate, devices=8)[0] == []


def test_comm_wait() -> None:
    # rank 2 computes 1.5x slower: the AllReduce waits for it every step
    f = only(findings(communicate, devices=8, slow_ranks={2: 1.5})[0], "comm-wait")
    assert (f.severity, f.op_type) == ("serious", "AllReduce") and f.location.endswith(f"{HERE}:{COMM_LINE}")
    assert "for other ranks to arrive" in f.description


def test_slow_link() -> None:
    # the link between ranks 0 and 1 runs at a quarter of its bandwidth
    found, _ = findings(communicate, devices=8, degraded_links={(0, 1): 0.25})
    f = only(found, "slow-link")
    assert (f.severity, f.op_type) == ("serious", "AllReduce") and f.location.endswith(f"{HERE}:{COMM_LINE}")
    assert "ranks [0, 1, 2, 3]" in f.description


def test_pipeline_bubble() -> None:
    def stage(npu, late_s):
        x = npu.tensor((4096, 4096))
        npu.matmul(x, x)
        npu.recv(npu.tensor((64, 4096)), 1, ready_s=npu.clock_s + late_s)  # the next stage sends late_s later
        npu.matmul(x, x)

    found, _ = findings(stage, devices=8, late_s=2e-3)
    f = only(found, "pipeline-bubble")
    assert (f.severity, f.op_type) == ("serious", "Receive")
    assert f.location.endswith(f"{HERE}:{stage.__code__.co_firstlineno + 3}")
    assert findings(stage, devices=8, late_s=0.0)[0] == []


def test_a_rule_that_raises_is_reported_and_the_others_still_run() -> None:
    def broken(ctx):
        raise ZeroDivisionError("boom")

    rules = {**RULES, "broken": Rule("broken", "a broken rule", broken)}

    def work(npu):
        q = npu.tensor((1, 8, 4096, 128))
        npu.flash_attention(q, q, q, pipeline_stages=1)

    found = run_rules(simulator.run(work), A910, rules=rules)
    (error,) = [f for f in found if f.rule_id == "internal-error"]
    assert "diagnosis rule 'broken' raised ZeroDivisionError: boom" in error.description
    assert any(f.rule_id == "low-overlap" for f in found)


def test_switches_and_thresholds() -> None:
    def work(npu):
        q = npu.tensor((1, 8, 4096, 128))
        npu.flash_attention(q, q, q, pipeline_stages=1)

    profile = simulator.run(work)
    assert not [f for f in run_rules(profile, A910, disabled=["low-overlap"]) if f.rule_id == "low-overlap"]
    assert not [f for f in run_rules(profile, A910, thresholds={"low-overlap": {"overlap_frac": 0.0}})
                if f.rule_id == "low-overlap"]
    with pytest.raises(ValueError, match="unknown diagnosis rule 'slow-opp'; known: "):
        run_rules(profile, A910, disabled=["slow-opp"])
    with pytest.raises(ValueError, match="rule 'slow-op' has no threshold 'factr'; its thresholds: factor, min_excess_s"):
        run_rules(profile, A910, thresholds={"slow-op": {"factr": 3}})
    assert parse_rule_thresholds(["slow-op.factor = 3", "low-overlap.overlap_frac=0.3"]) == {
        "slow-op": {"factor": 3.0}, "low-overlap": {"overlap_frac": 0.3}}
    with pytest.raises(ValueError, match="'slow-op = 3' is not of the form RULE.NAME = NUMBER"):
        parse_rule_thresholds(["slow-op = 3"])


# -- in the plugin ------------------------------------------------------------------------------

PLUGIN_SUITE = """
def work(npu):
    q = npu.tensor((1, 8, 4096, 128))
    npu.flash_attention(q, q, q, pipeline_stages=1)

def test_fa(oam_profile):
    oam_profile.run(work)

def test_healthy(oam_profile):
    oam_profile.run(lambda npu: npu.matmul(npu.tensor((4096, 4096)), npu.tensor((4096, 4096))))
"""


def test_plugin_reports_findings_everywhere(pytester) -> None:
    import json

    pytester.makepyfile(test_suite=PLUGIN_SUITE)
    result = pytester.runpytest("--oam-report=r.json", "--oam-report=r.md", "--junitxml=j.xml")
    result.assert_outcomes(passed=2)  # performance findings never fail a test by themselves
    result.stdout.fnmatch_lines([
        "*oam diagnosis*", "test_suite.py::test_fa",
        "*[[]serious[]] low-overlap: FlashAttention at test_suite.py:3: FlashAttention: DMA/compute overlap 0%*",
        "*what to do: raise pipeline_stages*",
    ])
    assert "test_suite.py::test_healthy\n" not in result.stdout.str()
    report = json.loads((pytester.path / "r.json").read_text())
    by_test = {t["nodeid"]: t["diagnosis"] for t in report["tests"]}
    assert {d["rule_id"] for d in by_test["test_suite.py::test_fa"]} >= {"low-overlap"}
    assert by_test["test_suite.py::test_healthy"] == []
    assert "### Diagnosis" in (pytester.path / "r.md").read_text()
    assert 'name="oam_finding" value="serious low-overlap FlashAttention at test_suite.py:3' in (
        pytester.path / "j.xml").read_text()


def test_ini_switches_thresholds_and_hook_rules(pytester) -> None:
    pytester.makepyfile(test_suite=PLUGIN_SUITE)
    pytester.makeini("[pytest]\noam_disable_rules = low-ai-core-utilization\n"
                     "oam_rule_thresholds =\n    low-overlap.overlap_frac = 0\n")
    pytester.makeconftest("""
from pytest_oam.rules import Rule, RuleFinding

def shout(ctx):
    yield RuleFinding("team-rule", "warning", "MatMul", "MatMul", None, "our own rule fired", "nothing", 0.0, 0.0)

def broken(ctx):
    raise RuntimeError("bad rule")

def pytest_oam_register_rules(rules):
    rules["team-rule"] = Rule("team-rule", "a team's rule", shout)
    rules["broken-rule"] = Rule("broken-rule", "a broken rule", broken)
""")
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "low-overlap" not in out and "low-ai-core-utilization" not in out
    assert "[warning] team-rule: MatMul: our own rule fired" in out
    assert "diagnosis rule 'broken-rule' raised RuntimeError: bad rule" in out


@pytest.mark.parametrize(
    ("ini", "message"),
    [
        ("oam_disable_rules = slow-opp", "unknown diagnosis rule 'slow-opp'; known: "),
        ("oam_rule_thresholds = slow-op.factr = 3", "rule 'slow-op' has no threshold 'factr'; its thresholds: "),
        ("oam_rule_thresholds = slow-op = 3", "is not of the form RULE.NAME = NUMBER"),
    ],
)
def test_bad_rule_settings_are_usage_errors(pytester, ini, message) -> None:
    pytester.makepyfile(test_suite=PLUGIN_SUITE)
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()



def test_shares_stay_below_the_step_and_one_cause_is_reported_once() -> None:
    # Regression: a stall in one step was reported by three rules with savings above 100%.
    def work(npu):
        q = npu.tensor((1, 8, 2048, 128))
        npu.flash_attention(q, q, q, pipeline_stages=1)

    found, _ = findings(work, steps=3, memory=True)
    assert all(0 <= f.step_share_frac <= 1 for f in found)
    # the unpipelined kernel is reported once, by low-overlap, not also as low utilisation
    assert [f.rule_id for f in found] == ["low-overlap"]


def test_malformed_rules_and_findings() -> None:
    from pytest_oam.rules import check_rules

    with pytest.raises(ValueError, match="must be a pytest_oam.rules.Rule"):
        check_rules({"mine": lambda ctx: []})
    rules = {"bad-severity": Rule("bad-severity", "t", lambda ctx: [RuleFinding(
        "bad-severity", "critical", "-", "-", None, "d", "f", 0.0, 0.0)]),
        "bad-type": Rule("bad-type", "t", lambda ctx: ["oops"])}
    found = run_rules(simulator.run(healthy), A910, rules=rules)
    assert sorted(f.description.split(" raised")[0] for f in found) == [
        "diagnosis rule 'bad-severity'", "diagnosis rule 'bad-type'"]


def test_every_built_in_rule_has_its_fire_and_silence_test() -> None:
    # Each built-in rule's test: it fires on a small workload built to show it (severity,
    # operator and line asserted) and stays silent on a healthy one. A new rule joins this list
    # with its test, or this fails.
    import test_correctness
    import test_step_trace

    tested = {
        "slow-op": test_slow_op, "low-ai-core-utilization": test_low_ai_core_utilization_gain_is_recosted_with_the_shape_aligned,
        "memory-bound": test_low_ai_core_utilization_and_memory_bound, "low-overlap": test_low_overlap,
        "frequent-alloc": test_frequent_alloc_and_retries, "comm-share": test_comm_share, "comm-wait": test_comm_wait,
        "slow-link": test_slow_link, "pipeline-bubble": test_pipeline_bubble, "cube-alignment": test_cube_alignment,
        "nan-inf": test_correctness.test_nan_inf_reports_the_first_op_that_produced_them,
        "fp16-overflow": test_correctness.test_fp16_overflow, "shape-mismatch": test_correctness.test_shape_mismatch,
        "out-of-bounds": test_correctness.test_out_of_bounds_copy,
        # on the real LLM step's split; silent on a healthy split
        "step-free": (test_step_trace.test_the_diagnosis_reads_the_split,
                      test_step_trace.test_a_busy_device_with_hidden_communication_gets_no_step_finding),
        "step-communication-exposed": (test_step_trace.test_the_diagnosis_reads_the_split,
                                       test_step_trace.test_a_busy_device_with_hidden_communication_gets_no_step_finding),
    }
    assert sorted(RULES) == sorted(tested)
