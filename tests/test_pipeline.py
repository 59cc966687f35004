"""Pipeline parallelism (1F1B), micro-batches, point-to-point transfers, and 1024-card layouts."""

from __future__ import annotations

import pytest

import simulator
from simulator.costs import OpSpec, p2p_cost
from simulator.hardware import load_hardware
from simulator.models import LLAMA2_7B, LLAMA2_70B, ParallelLayout, training_step

B910 = load_hardware("ascend910b")


@pytest.fixture(scope="module")
def llama70b_1024():
    layout = ParallelLayout(tensor_parallel=8, data_parallel=16, pipeline_parallel=8, micro_batches=32)
    return simulator.run(training_step, LLAMA2_70B, devices=1024, hardware="ascend910b", dtype="bf16",
                         seq_len=4096, layout=layout), layout


def test_1024_card_llama2_70b_step(llama70b_1024) -> None:
    profile, layout = llama70b_1024
    assert profile.devices == 1024 and layout.devices == 1024
    # stage 0 holds 80 / 8 = 10 layers and runs each of the 32 micro-batches forward and backward
    assert len(profile.ops_of("FlashAttention")) == 10 * 32
    assert len(profile.ops_of("FlashAttentionGrad")) == 10 * 32
    assert len(profile.ops_of("Send")) == 32 and len(profile.ops_of("Receive")) == 32
    # 1F1B: the bubble is (pp - 1) / (m + pp - 1) of the step for uniform stages (Narayanan et
    # al., SC 2021): 7 / 39 = 17.9%; stage 0 waits for it in its gradient receives
    bubble_s = sum(op.attrs.get("wait_time_s", 0.0) for op in profile.ops_of("Receive"))
    assert bubble_s / profile.step_time_s == pytest.approx(7 / 39, abs=0.03)
    # data parallelism over 16 servers goes over RoCE; tensor parallelism stays in the HCCS mesh
    grads = [op for op in profile.ops if op.name.startswith("grads.")]
    assert grads and all(op.comm.algorithm == "halving-doubling-roce" and len(op.comm.ranks) == 16 for op in grads)
    assert {op.comm.algorithm for op in profile.ops if op.name.endswith("tp_allreduce")} == {"mesh"}
    assert {op.comm.algorithm for op in profile.ops_of("Send")} == {"p2p-roce"}  # stage 1 is 128 ranks away
    # model FLOP utilisation of the whole job stays plausible (<= 70%, issue 4's sanity bound)
    flop_per_token = 6 * LLAMA2_70B.param_count + 12 * LLAMA2_70B.num_layers * LLAMA2_70B.hidden_size * 4096
    mfu = profile.tokens_per_s * flop_per_token / (1024 * B910.peak_cube_flop_per_s("bf16"))
    assert 0.2 < mfu < 0.7


def test_more_micro_batches_shrink_the_bubble() -> None:
    def bubble_frac(micro: int) -> float:
        layout = ParallelLayout(8, 1, 1, 4, micro)
        p = simulator.run(training_step, LLAMA2_7B, devices=32, hardware="ascend910b", dtype="bf16", seq_len=2048,
                          layout=layout)
        return sum(op.attrs.get("wait_time_s", 0.0) for op in p.ops_of("Receive")) / p.step_time_s

    assert bubble_frac(4) > bubble_frac(8) > bubble_frac(16)
    assert bubble_frac(8) == pytest.approx(3 / 11, abs=0.04)


def test_gradient_accumulation_reduces_once() -> None:
    one = simulator.run(training_step, LLAMA2_7B, devices=8, seq_len=2048)
    two = simulator.run(training_step, LLAMA2_7B, devices=8, seq_len=2048,
                        layout=ParallelLayout(4, 2, micro_batches=2))
    assert len(two.ops_of("FlashAttention")) == 2 * len(one.ops_of("FlashAttention"))
    assert len(two.ops_of("ReduceScatter")) == len(one.ops_of("ReduceScatter"))
    assert two.tokens_per_step == 2 * one.tokens_per_step


def test_pipeline_layout_errors() -> None:
    with pytest.raises(ValueError, match="pipeline_parallel=3 must divide the 32 layers"):
        simulator.run(training_step, LLAMA2_7B, devices=24, layout=ParallelLayout(8, 1, 1, 3, 4))
    with pytest.raises(ValueError, match="ParallelLayout.micro_batches must be a positive integer"):
        ParallelLayout(8, 1, 1, 2, 0)
    with pytest.raises(ValueError, match="needs 128 cards, the job has 64"):
        simulator.run(training_step, LLAMA2_70B, devices=64, layout=ParallelLayout(8, 2, 1, 8, 8))
    with pytest.raises(ValueError, match=r"llama-2-70b: .* needs about .* GiB per card; ascend910b has 64.0 GiB"):
        simulator.run(training_step, LLAMA2_70B, devices=8, hardware="ascend910b", seq_len=4096)


@pytest.mark.parametrize(("peer", "algorithm", "link"), [
    (1, "p2p-hccs", "hccs"), (8, "p2p-roce", "roce"),
])
def test_p2p_cost_takes_the_link_between_the_ranks(peer, algorithm, link) -> None:
    nbytes = 64 << 20
    cost = p2p_cost(OpSpec("Send", ((nbytes // 2,),), "fp16", (("peer", peer),)), B910)
    ic = B910.interconnect
    bw = {"hccs": ic.hccs_link_bandwidth_bytes_per_s, "roce": ic.roce_bandwidth_bytes_per_s}[link]
    latency = {"hccs": ic.hccs_link_latency_s, "roce": ic.roce_latency_s}[link]
    # launch floor + link latency + bytes over the link at its efficiency
    expected = B910.launch.kernel_launch_latency_s + latency + nbytes / (bw * ic.link_efficiency_frac)
    assert cost.duration_s == pytest.approx(expected) and cost.comm.algorithm == algorithm


def test_send_and_receive_errors_and_the_receive_wait() -> None:
    def bad_peer(npu):
        npu.send(npu.tensor((16,)), 0)

    with pytest.raises(ValueError, match="Send: peer 0 must be another rank of the 2-card job"):
        simulator.run(bad_peer, devices=2)

    def late(npu):
        x = npu.tensor((1024,))
        npu.recv(x, 1, ready_s=npu.clock_s + 5e-3)

    (recv,) = simulator.run(late, devices=2).ops
    assert recv.attrs["wait_time_s"] == pytest.approx(5e-3)


def test_the_bubble_is_its_own_finding(llama70b_1024) -> None:
    from pytest_oam.rules import run_rules

    profile, _ = llama70b_1024
    found = {f.rule_id: f for f in run_rules(profile, B910)}
    assert found["pipeline-bubble"].op_type == "Receive" and "more micro-batches" in found["pipeline-bubble"].fix
    assert "comm-wait" not in found  # a pipeline bubble is not a straggler
    # the bubble's waits are not counted as communication time (a low share_frac shows the numbers)
    found = {f.rule_id: f for f in run_rules(profile, B910, thresholds={"comm-share": {"share_frac": 0.01}})}
    receive_work_s = sum(op.duration_s - op.attrs.get("wait_time_s", 0.0) for op in profile.ops_of("Receive"))
    assert f"Receive {receive_work_s * 1e3:.2f} ms" in found["comm-share"].description
