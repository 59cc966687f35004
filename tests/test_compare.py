"""The pure comparison and diagnosis."""

from __future__ import annotations

import pytest

import simulator
from pytest_oam.compare import compare_run, summarize, worst_status
from pytest_oam.diagnosis import diagnose
from pytest_oam.thresholds import LimitResolver


def model(npu, block_size=128, seq_len=2048):
    q = npu.tensor((1, 8, seq_len, 128))
    npu.flash_attention(q, q, q, block_size=block_size)
    npu.matmul(npu.tensor((2048, 1024)), npu.tensor((1024, 2048)))


def compare(baseline_kwargs=None, current_kwargs=None, resolver=None, **run_kwargs):
    base = simulator.run(model, **(baseline_kwargs or {}))
    cur = simulator.run(model, **(current_kwargs or {}), **run_kwargs)
    comparison = compare_run(0, summarize(base), summarize(cur), resolver or LimitResolver.build())
    return comparison, cur


def test_identical_runs_pass() -> None:
    comparison, _ = compare()
    assert comparison.status == "pass"
    assert all(v.change_frac == 0 for v in comparison.verdicts)


def test_real_configuration_change_is_caught_and_explained() -> None:
    # A smaller FlashAttention block re-reads K and V twice as often and pays twice the DMA
    # start-ups: a genuine kernel-configuration regression, no injected slowdown.
    comparison, current = compare(current_kwargs={"block_size": 64})
    assert comparison.status == "regressed"
    assert next(v.op_type for v in comparison.regressions) == "FlashAttention"
    (finding, *_) = diagnose(comparison, current, summarize(current).ops)
    assert finding.op_type == "FlashAttention"
    moved = {c.name for c in finding.counters}
    assert {"dma_count", "hbm_bytes"} & moved
    assert any("block_size" in tip for tip in finding.advice)
    assert finding.call_sites and finding.call_sites[0][0].endswith("test_compare.py:15")


def test_faster_beyond_limit_is_improved() -> None:
    comparison, _ = compare(baseline_kwargs={"op_time_scale": {"MatMul": 1.5}})
    assert comparison.status == "improved"


def test_missing_and_new_op_types() -> None:
    def other(npu):
        npu.add(npu.tensor((1024,)), npu.tensor((1024,)))

    base = summarize(simulator.run(model))
    cur = summarize(simulator.run(other))
    comparison = compare_run(0, base, cur, LimitResolver.build(cli={"*": 1e9}))
    statuses = {v.op_type: v.status for v in comparison.verdicts}
    assert statuses["FlashAttention"] == "missing" and statuses["Add"] == "new"
    assert comparison.status == "missing-ops"
    assert any("FlashAttention" in r for r in comparison.reasons)


def test_other_hardware_is_incomparable() -> None:
    comparison, _ = compare(current_kwargs={}, hardware="ascend910b", resolver=LimitResolver.build(cli={"*": 1e9}))
    assert comparison.status == "incomparable"
    assert comparison.reasons == ["hardware differs: baseline 'ascend910', current 'ascend910b'"]


@pytest.mark.parametrize(("statuses", "worst"), [([], "pass"), (["pass", "improved"], "improved"), (["no-baseline", "regressed"], "regressed")])
def test_worst_status(statuses, worst) -> None:
    assert worst_status(statuses) == worst


def test_memory_bound_advice_only_when_the_op_became_memory_bound() -> None:
    # On the 910A the softmax keeps FlashAttention vector-bound down to block 64; at block 32
    # the K/V re-reads make it memory-bound (memory_bound 0.32 -> 2.08).
    comparison, current = compare(current_kwargs={"block_size": 32})
    (finding, *_) = diagnose(comparison, current, summarize(current).ops, summarize(simulator.run(model)).ops)
    assert any("became memory-bound" in tip for tip in finding.advice)

    def skinny(npu):  # a decode-shaped MatMul: memory-bound already in the baseline
        npu.matmul(npu.tensor((16, 4096)), npu.tensor((4096, 4096)))

    base, cur = simulator.run(skinny), simulator.run(skinny, op_time_scale={"MatMul": 1.2})
    comparison = compare_run(0, summarize(base), summarize(cur), LimitResolver.build())
    (finding, *_) = diagnose(comparison, cur, summarize(cur).ops, summarize(base).ops)
    assert not any("memory-bound" in tip for tip in finding.advice)
    assert finding.advice == [
        ("same work and traffic but slower: the kernel lost DMA/compute overlap (check pipeline_stages) "
         "or its implementation or launch cost changed")
    ]


def test_less_work_is_not_called_more_work() -> None:
    # Regression test: the advice said "does more work" for any FLOP change, up or down. (Since
    # simulator 0.2.1 causal FLOP are counted per element, so the block size no longer moves
    # them at all; a smaller block is slower for its K/V traffic alone.)
    def causal(npu, block_size=128):
        q = npu.tensor((1, 8, 2048, 128))
        npu.flash_attention(q, q, q, block_size=block_size, causal=True)

    base, cur = simulator.run(causal), simulator.run(causal, block_size=64)
    comparison = compare_run(0, summarize(base), summarize(cur), LimitResolver.build())
    (finding, *_) = diagnose(comparison, cur, summarize(cur).ops, summarize(base).ops)
    assert "flop" not in {c.name for c in finding.counters}
    assert not any("more work" in tip for tip in finding.advice)
    assert any("block_size" in tip for tip in finding.advice)


def spiky(every: int):
    """A workload whose FlashAttention runs with a slow block size every ``every``-th step."""
    state = {"step": 0}

    def work(npu):
        state["step"] += 1
        slow = every and state["step"] % every == 0
        q = npu.tensor((1, 8, 2048, 128))
        npu.flash_attention(q, q, q, block_size=32 if slow else 128)

    return work


def test_rare_spikes_fail_on_the_p99_when_median_and_mean_pass() -> None:
    # 2 slow steps in 100: median unchanged, mean +3.4% (under a 5% limit), p99 +171%.
    resolver = LimitResolver.build(cli={"*": 0.05})
    base, cur = simulator.run(spiky(0), steps=100), simulator.run(spiky(50), steps=100)
    comparison = compare_run(0, summarize(base), summarize(cur), resolver)
    fa = next(v for v in comparison.verdicts if v.op_type == "FlashAttention")
    assert (fa.status, fa.statistic) == ("regressed", "p99")
    assert summarize(cur).ops["FlashAttention"].time_s == summarize(base).ops["FlashAttention"].time_s
    mean_change = summarize(cur).ops["FlashAttention"].mean_time_s / summarize(base).ops["FlashAttention"].mean_time_s
    assert 1.0 < mean_change < 1.05
    step = next(v for v in comparison.verdicts if v.op_type == "step")
    assert (step.status, step.statistic) == ("regressed", "p99")


def test_short_runs_keep_no_p99() -> None:
    # Below JITTER_MIN_STEPS steps a p99 would be the maximum of a few samples: not kept.
    run = summarize(simulator.run(spiky(0), steps=10))
    assert run.step_time_p99_s is None and run.ops["FlashAttention"].p99_time_s is None
    assert run.step_time_max_s == pytest.approx(run.step_time_s)


def test_advice_reads_the_direction_of_the_flop_change() -> None:
    from pytest_oam.compare import CounterChange
    from pytest_oam.diagnosis import _advice

    fewer = _advice("MatMul", [CounterChange("flop", 100.0, 90.0)], None)
    more = _advice("MatMul", [CounterChange("flop", 100.0, 110.0)], None)
    assert not any("more work" in tip for tip in fewer)
    assert any("does more work" in tip for tip in more)


def test_count_advice_reads_the_direction() -> None:
    from pytest_oam.compare import CounterChange
    from pytest_oam.diagnosis import _advice

    fewer = _advice("Add", [CounterChange("count_per_step", 7.0, 4.0)], None)
    assert "now runs 4 times per step (was 7): fewer, larger calls" in fewer[0]
    assert "added" in _advice("Add", [CounterChange("count_per_step", 4.0, 7.0)], None)[0]


def test_regressions_are_graded_on_the_rules_scale() -> None:
    # One scale for every finding (pytest_oam.severity): by the share of the baseline step the
    # regression costs, serious from 5%, warning from 3%, info below (version 1 said
    # critical / major / minor). Only the FlashAttention op slows down, by op_time_scale.
    base = summarize(simulator.run(model))
    fa_share = base.ops["FlashAttention"].time_s / base.step_time_s
    for scale in (1.5, 1.03):
        cur = simulator.run(model, op_time_scale={"FlashAttention": scale})
        comparison = compare_run(0, base, summarize(cur), LimitResolver.build(cli={"FlashAttention": 0.01}))
        (finding,) = [f for f in diagnose(comparison, cur) if f.op_type == "FlashAttention"]
        share = (scale - 1) * fa_share
        assert finding.step_share_frac == pytest.approx(share, rel=1e-6)
        assert finding.severity == ("serious" if share >= 0.05 else "warning" if share >= 0.03 else "info")
    assert fa_share > 0.1  # so 1.5x costs over 5% of the step and 1.03x under 3%


def test_a_fall_in_overlap_is_a_counter_that_moved() -> None:
    # The example of a differential explanation: "overlap 83% -> 18%".
    def attention(npu, stages=2):
        q = npu.tensor((1, 32, 4096, 128))
        npu.flash_attention(q, q, q, pipeline_stages=stages)

    base, cur = simulator.run(attention), simulator.run(attention, stages=1)
    comparison = compare_run(0, summarize(base), summarize(cur), LimitResolver.build())
    (finding,) = diagnose(comparison, cur)
    overlap = {c.name: c for c in finding.counters}["overlap_frac"]
    # pipeline_stages=1: no buffer in flight, so nothing is prefetched while the units work
    assert overlap.baseline > 0.9 and overlap.current == 0.0
    assert any(tip.startswith("DMA/compute overlap fell 100% -> 0%") for tip in finding.advice)


def _mlp(npu, tokens=2048, hidden=1024):
    x = npu.tensor((tokens, hidden))
    h = npu.rms_norm(x, npu.tensor((hidden,)))
    y = npu.silu(npu.matmul(h, npu.tensor((hidden, 4 * hidden))))
    npu.add(npu.matmul(y, npu.tensor((4 * hidden, hidden))), x)


@pytest.mark.parametrize("steps", [1, 3])
def test_a_change_of_exactly_the_limit_passes_whatever_the_rounding(steps) -> None:
    # Newcomer finding: MatMul x1.10 under its 10% limit was REGRESSED ("mean over steps") over
    # 3 steps, whose summed times round up, and passed over 1 step
    base = simulator.run(_mlp, steps=steps)
    resolver = LimitResolver.build()
    at_limit = simulator.run(_mlp, steps=steps, op_time_scale={"MatMul": 1.10})
    (matmul,) = [v for v in compare_run(0, summarize(base), summarize(at_limit), resolver).verdicts
                 if v.op_type == "MatMul"]
    assert matmul.status == "pass" and matmul.limit_frac == 0.10
    past = simulator.run(_mlp, steps=steps, op_time_scale={"MatMul": 1.1001})
    (matmul,) = [v for v in compare_run(0, summarize(base), summarize(past), resolver).verdicts
                 if v.op_type == "MatMul"]
    assert matmul.status == "regressed"
