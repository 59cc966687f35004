"""The HCCL stream beside compute: asynchronous collectives, overlap, stragglers and slow links."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from pytest_oam.rules import run_rules
from simulator.hardware import load_hardware
from simulator.models import LLAMA2_7B, training_step
from simulator.runtime import Work, _copies, recost

A910 = load_hardware("ascend910")


def _span(op) -> tuple[float, float]:
    return op.start_s, op.start_s + op.duration_s


def overlapped(npu):
    a = npu.tensor((4096, 4096))
    npu.matmul(a, a, name="first")
    work = npu.all_reduce(npu.tensor((32 << 20,)), ranks=[0, 1, 2, 3], async_op=True, name="bucket")
    npu.matmul(a, a, name="second")
    npu.matmul(a, a, name="third")
    assert isinstance(work, Work)
    work.wait()
    npu.add(a, a, name="after_wait")


def test_an_async_collective_overlaps_compute_and_wait_blocks_compute() -> None:
    profile = simulator.run(overlapped, devices=8)
    first, bucket, second, third, after = profile.ops
    assert bucket.stream == "hccl" and bucket.attrs["async_op"] is True
    assert bucket.start_s == pytest.approx(_span(first)[1])  # issued when its data is ready
    assert second.start_s == pytest.approx(_span(first)[1])  # compute does not wait for it
    assert after.start_s == pytest.approx(max(_span(third)[1], _span(bucket)[1]))  # wait()
    assert after.attrs["wait_hccl_op"] == 1  # the record index it waited for, for replays
    # the step is shorter than running everything one after the other
    assert profile.step_time_s < sum(op.duration_s for op in profile.ops)
    total, exposed = profile.comm_time_s(0)
    assert total == pytest.approx(bucket.duration_s)
    hidden = min(_span(bucket)[1], _span(third)[1]) - bucket.start_s
    assert exposed == pytest.approx(bucket.duration_s - hidden)
    assert profile.comm_overlap_frac(0) == pytest.approx(hidden / bucket.duration_s)


def test_a_blocking_collective_holds_compute() -> None:
    def work(npu):
        a = npu.tensor((4096, 4096))
        npu.matmul(a, a)
        npu.all_reduce(npu.tensor((32 << 20,)), ranks=[0, 1, 2, 3])
        npu.matmul(a, a)

    first, comm, second = simulator.run(work, devices=8).ops
    assert comm.start_s == pytest.approx(_span(first)[1]) and second.start_s == pytest.approx(_span(comm)[1])
    assert simulator.run(work, devices=8).comm_overlap_frac(0) == 0.0


def test_steps_end_synchronised_and_recost_replays_the_streams() -> None:
    def unwaited(npu):
        a = npu.tensor((1024, 1024))
        npu.matmul(a, a)
        npu.all_reduce(npu.tensor((64 << 20,)), async_op=True)  # never waited on

    profile = simulator.run(unwaited, devices=8, steps=2)
    comm0 = profile.ops[1]
    second_step_first = profile.ops[2]
    assert second_step_first.start_s >= _span(comm0)[1]  # the next step starts after it
    for p in (profile, simulator.run(overlapped, devices=8, steps=3)):
        again = recost(p, "ascend910")
        assert [o.start_s for o in again.ops] == pytest.approx([o.start_s for o in p.ops], rel=1e-12, abs=1e-15)
        assert [o.duration_s for o in again.ops] == pytest.approx([o.duration_s for o in p.ops], rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["mm", "async", "sync", "wait"]), st.integers(1, 8)), min_size=1,
                max_size=12))
def test_overlap_never_loses_time(program) -> None:
    """With any mix of compute, blocking and async collectives and waits, the step is never
    longer than running every op one after the other, each op taking at least the host's dispatch
    interval (an op shorter than that leaves the device waiting for the next launch), nor shorter
    than either stream alone, nor than the host needs to issue them all."""
    def work(npu):
        works = []
        for kind, size in program:
            if kind == "mm":
                a = npu.tensor((256 * size, 1024))
                npu.matmul(a, npu.tensor((1024, 1024)))
            elif kind == "wait" and works:
                works.pop(0).wait()
            elif kind in ("async", "sync"):
                w = npu.all_reduce(npu.tensor((size << 18,)), async_op=kind == "async")
                if kind == "async":
                    works.append(w)

    profile = simulator.run(work, devices=8)
    if profile.is_empty:
        return
    compute = sum(o.duration_s for o in profile.ops if o.stream == "compute")
    comm = sum(o.duration_s for o in profile.ops if o.stream == "hccl")
    step = profile.step_time_s
    dispatch_s = load_hardware(profile.hardware).launch.host_dispatch_s
    one_by_one = sum(max(o.duration_s, dispatch_s) for o in profile.ops)
    issue = (len(profile.ops) - 1) * dispatch_s
    assert max(compute, comm, issue) * (1 - 1e-12) <= step <= one_by_one * (1 + 1e-12)
    total, exposed = profile.comm_time_s(0)
    assert total == pytest.approx(comm) and 0 <= exposed <= total * (1 + 1e-12)


def test_group_copies() -> None:
    assert _copies((0, 1, 2, 3), 8) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert _copies((0, 4), 8) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert _copies(tuple(range(8)), 8) == [tuple(range(8))]


# -- Llama-2-7B on one 8-card server: gradient reduction overlapped with backward ---------------

@pytest.fixture(scope="module")
def llama_runs():
    kwargs = {"batch_size": 1, "seq_len": 2048}
    return {
        "overlap": simulator.run(training_step, LLAMA2_7B, devices=8, **kwargs),
        "serial": simulator.run(training_step, LLAMA2_7B, devices=8, overlap_grad_reduce=False, **kwargs),
        "slow-rank": simulator.run(training_step, LLAMA2_7B, devices=8, slow_ranks={5: 1.1}, **kwargs),
        "slow-link-own": simulator.run(training_step, LLAMA2_7B, devices=8, degraded_links={(0, 1): 0.5}, **kwargs),
        "slow-link-other": simulator.run(training_step, LLAMA2_7B, devices=8, degraded_links={(5, 6): 0.5},
                                         **kwargs),
    }


def test_llama_gradient_buckets_overlap_backward(llama_runs) -> None:
    overlap, serial = llama_runs["overlap"], llama_runs["serial"]
    buckets = overlap.ops_of("ReduceScatter")
    # tp=4, dp=2 on 8 x 910A: each layer's 50.5M local parameters fill a 40M bucket; the LM
    # head's 32.8M joins layer 31's; the embedding's is the last, blocking one: 1 + 31 + 1
    assert len(buckets) == 33 and all(b.attrs.get("async_op") for b in buckets[:-1])
    assert len(serial.ops_of("ReduceScatter")) == 1
    backward_end = max(_span(o)[1] for o in overlap.ops if o.op_type == "EmbeddingDenseGrad")
    hidden = [b for b in buckets if _span(b)[1] <= backward_end]
    assert len(hidden) >= 30  # most buckets finish while backward still runs
    assert overlap.step_time_s < serial.step_time_s - 0.5 * serial.op_time_s("ReduceScatter")
    assert overlap.comm_overlap_frac(0) > 0.2 and serial.comm_overlap_frac(0) == 0.0
    # the same op sequence otherwise: forward and backward kernels are unchanged
    assert overlap.op_time_s("MatMul") == pytest.approx(serial.op_time_s("MatMul"))


def test_a_slow_rank_makes_rank_0_wait_and_the_diagnosis_says_so(llama_runs) -> None:
    slow, healthy = llama_runs["slow-rank"], llama_runs["overlap"]
    assert slow.step_time_s > healthy.step_time_s
    assert slow.op_time_s("ReduceScatter") > 1.1 * healthy.op_time_s("ReduceScatter")
    assert slow.op_time_s("MatMul") == pytest.approx(healthy.op_time_s("MatMul"))  # rank 0 itself is fine
    ids = {f.rule_id: f for f in run_rules(slow, A910)}
    assert "comm-wait" in ids and "ReduceScatter" == ids["comm-wait"].op_type
    assert "waited" in ids["comm-wait"].description and "ranks [0, 4]" in ids["comm-wait"].description
    assert "comm-wait" not in {f.rule_id for f in run_rules(healthy, A910)}


def test_degraded_links(llama_runs) -> None:
    own, other, healthy = llama_runs["slow-link-own"], llama_runs["slow-link-other"], llama_runs["overlap"]
    # a link inside rank 0's tensor-parallel group halves its AllReduce bandwidth
    assert own.op_time_s("AllReduce") > 1.8 * healthy.op_time_s("AllReduce")
    found = {f.rule_id: f for f in run_rules(own, A910)}
    assert found["slow-link"].op_type == "AllReduce" and "ranks [0, 1, 2, 3]" in found["slow-link"].description
    assert "slow-link" not in {f.rule_id for f in run_rules(healthy, A910)}
    # a link in the other group slows that group; rank 0 waits for it at the data-parallel collectives
    assert other.op_time_s("AllReduce") == pytest.approx(healthy.op_time_s("AllReduce"))
    assert other.op_time_s("ReduceScatter") > healthy.op_time_s("ReduceScatter")
    assert "comm-wait" in {f.rule_id for f in run_rules(other, A910)}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"slow_ranks": {8: 1.5}}, "slow_ranks: rank 8 is not a rank of the 8-card job"),
    ({"slow_ranks": {3: 0.5}}, r"slow_ranks\[3\] must be a factor >= 1"),
    ({"degraded_links": {(0, 0): 0.5}}, r"degraded_links: \(0, 0\) is not a pair of two ranks"),
    ({"degraded_links": {(0, 1): 0.0}}, r"degraded_links\[\(0, 1\)\] must be a bandwidth fraction in \(0, 1\]"),
])
def test_bad_fault_settings(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        simulator.run(overlapped, devices=8, **kwargs)


# -- the gate: a straggler or a degraded link fails it and the report names communication ------

SUITE = """
import json, os
import simulator

FAULTS = json.loads(os.environ.get("OAM_FAULTS", "{}"))

def data_parallel_step(npu):
    a = npu.tensor((4096, 4096))
    works = []
    for layer in range(8):
        npu.matmul(a, a, name=f"layers.{layer}.mlp")
        npu.all_reduce(npu.tensor((4 << 20,)), ranks=[0, 1, 2, 3], name=f"layers.{layer}.tp_allreduce")
        works.append(npu.reduce_scatter(npu.tensor((16 << 20,)), ranks=[0, 4], async_op=True,
                                        name=f"grads.bucket{layer}"))
    for w in works:
        w.wait()
    npu.add(a, a, name="optimizer")

def test_dp_step(oam_profile):
    faults = {"slow_ranks": {int(k): v for k, v in FAULTS.get("slow_ranks", {}).items()},
              "degraded_links": {tuple(map(int, k.split("-"))): v for k, v in FAULTS.get("links", {}).items()}}
    oam_profile.run(data_parallel_step, devices=8, **faults)
"""


@pytest.mark.parametrize("n", ["0", "2"], ids=["in-process", "xdist-n2"])
@pytest.mark.parametrize(("faults", "regressed", "rule"), [
    ({"slow_ranks": {"6": 1.5}}, "ReduceScatter", "comm-wait"),
    ({"links": {"0-2": 0.25}}, "AllReduce", "slow-link"),
])
def test_a_straggler_or_slow_link_fails_the_gate_and_names_communication(
        pytester, monkeypatch, n, faults, regressed, rule) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_dp=SUITE)
    pytester.runpytest_subprocess("-n", n, "--oam-save-baseline").assert_outcomes(passed=1)
    monkeypatch.setenv("OAM_FAULTS", json.dumps(faults))
    result = pytester.runpytest_subprocess("-n", n, "--oam-baseline", "--oam-report=r.json")
    result.assert_outcomes(failed=1)
    report = json.loads((pytester.path / "r.json").read_text())
    (test,) = report["tests"]
    assert test["status"] == "regressed"
    assert regressed in [v["op_type"] for v in test["verdicts"] if v["status"] == "regressed"]
    assert "MatMul" not in [v["op_type"] for v in test["verdicts"] if v["status"] == "regressed"]
    assert rule in [d["rule_id"] for d in test["diagnosis"]]
    result.stdout.fnmatch_lines([f"*{rule}: {regressed} at test_dp.py:*"])


def test_a_slow_rank_0_is_slow_itself_not_waiting() -> None:
    # Regression (review): rank 0's own slowdown was counted as a wait for the others.
    from simulator.models import ParallelLayout

    def run(**kw):
        return simulator.run(training_step, LLAMA2_7B, devices=8, seq_len=2048, layout=ParallelLayout(2, 4), **kw)

    healthy, slow0, everyone = run(), run(slow_ranks={0: 1.1}), run(slow_ranks={r: 1.1 for r in range(8)})
    for slow in (slow0, everyone):
        assert slow.op_time_s("MatMul") == pytest.approx(1.1 * healthy.op_time_s("MatMul"))
        assert slow.op_time_s("AllReduce") == pytest.approx(healthy.op_time_s("AllReduce"))
        assert not any(op.attrs.get("wait_time_s") for op in slow.ops)
    assert "comm-wait" not in {f.rule_id for f in run_rules(slow0, A910)}


@pytest.mark.parametrize(("work", "error", "message"), [
    (lambda npu: npu.all_reduce(npu.tensor((8,)), async_op="yes"), TypeError, "async_op must be True or False"),
    (lambda npu: npu.recv(npu.tensor((8,)), 1, ready_s=-1.0), ValueError, "ready_s must be a finite time >= 0"),
])
def test_bad_stream_arguments(work, error, message) -> None:
    with pytest.raises(error, match=message):
        simulator.run(work, devices=8)


def test_fault_settings_must_be_dicts() -> None:
    with pytest.raises(TypeError, match=r"slow_ranks must be a dict \{rank: factor\}, got \[5\]"):
        simulator.run(overlapped, devices=8, slow_ranks=[5])
    with pytest.raises(TypeError, match="degraded_links must be a dict"):
        simulator.run(overlapped, devices=8, degraded_links=[(0, 1)])


def test_synchronize_waits_for_every_collective_issued() -> None:
    def work(npu):
        a = npu.tensor((2048, 2048))
        npu.all_reduce(npu.tensor((16 << 20,)), async_op=True)
        npu.all_reduce(npu.tensor((16 << 20,)), async_op=True)
        npu.synchronize()
        npu.add(a, a)

    first, second, add = simulator.run(work, devices=8).ops
    assert second.start_s == pytest.approx(_span(first)[1])  # the HCCL stream runs them in order
    assert add.start_s == pytest.approx(_span(second)[1]) and add.attrs["wait_hccl_op"] == 1
