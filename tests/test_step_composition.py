"""Step composition of the real pp2 x dp2 LLM profile (issue 23): measured vs simulated."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

import simulator
from pytest_oam.calibrate import host_intervals_s
from pytest_oam.files.importers import read_ascend_csv
from pytest_oam.step_composition import (
    StepCompositionError,
    compare,
    infer_workload,
    measured_composition,
)
from simulator.models import QWEN3_0_6B, ParallelLayout
from simulator.models.llama_memory import stage_params
from simulator.runtime import NPU, Tensor

REAL = Path(__file__).parent / "data" / "realdata"
LLM = REAL / "ascend-msinsight-llm-pp2dp2-level2-rank0"


def test_workload_inferred_from_the_profile():
    work = infer_workload(LLM)
    # GatherV2 "151936,1024"; FlashAttentionScore q "4096,1,2048", k "4096,1,1024"; q_norm RmsNorm
    # "4096,1,16,128"; gate/up MatMulV3 "4096,1024;6144,1024"; 3 batchSendRecv = m + pp - 1 -> m = 2;
    # 28 FlashAttentionScore / 2 = 14 layers per stage; hcom_reduceScatter -> ZeRO-1; Overlapped 0
    assert (work.vocab_size, work.hidden_size, work.ffn_hidden_size) == (151936, 1024, 3072)
    assert (work.num_heads, work.num_kv_heads, work.head_dim, work.qk_norm) == (16, 8, 128, True)
    assert (work.seq_len, work.layers_per_stage, work.num_layers) == (4096, 14, 28)
    assert (work.tensor_parallel, work.data_parallel, work.pipeline_parallel, work.micro_batches) == (1, 2, 2, 2)
    assert work.zero_stage == 1 and not work.overlap_grad_reduce


def test_qwen3_config_matches_the_profiles_gradient_buffer():
    # the profile's first kernel zeroes stage 0's fp32 gradient buffer: ZerosLike of 375,815,680
    # elements = embedding 151936 x 1024 + 14 layers x 15,730,944 (q_norm and k_norm included)
    layout = ParallelLayout(1, 2, pipeline_parallel=2, micro_batches=2)
    assert stage_params(QWEN3_0_6B, layout, 0) == 375_815_680


def test_measured_composition_is_the_csv_row():
    m = measured_composition(LLM)
    assert m.step_s == pytest.approx(0.81002225)
    assert (m.computing_s, m.communication_exposed_s, m.free_s) == pytest.approx((0.2312901, 0.42017426, 0.158558))


def test_profiled_host_dispatch_is_the_alexnet_measurement():
    # the hardware files' profiled_host_dispatch_s: mean host interval of the two AlexNet profiles
    # by oam calibrate's definition (174 pairs each: 225.3 us Level1, 222.5 us Level2; pooled 223.9 us;
    # their medians 116.7 and 120.9 us)
    pooled = [s for level in (1, 2) for s in host_intervals_s(
        read_ascend_csv(REAL / f"ascend-msinsight-alexnet2p-level{level}-rank0" / "kernel_details.csv"))]
    assert len(pooled) == 348
    for name in simulator.list_hardware():
        assert simulator.load_hardware(name).profiler.profiled_host_dispatch_s == pytest.approx(
            statistics.fmean(pooled), rel=0.01)


def test_simulated_composition_against_the_profile():
    """The issue's target is each part within 20%: met for computing and exposed communication,
    NOT for free time (simulator 0.10.0: -6.6%, -1.6%, +46.5%). Exposed communication came from
    -43.5% (0.8.0) with Megatron's cross entropy on stage 1 (its pipeline waits) and the HCCS link
    rate measured on the AlexNet 910B2 profile (not this file's). Free time follows the host's
    time per kernel under the profiler: the bundled 224 us is the AlexNet profiles' mean, recorded
    with with_stack on; this run had with_stack off, and its own mean, 174 us, gives about -12%
    (in-sample: not the bundled figure). See docs/validation.md."""
    result = compare(LLM, "ascend910b4")
    s = result.simulated
    assert s.computing_s + s.communication_exposed_s + s.free_s == pytest.approx(s.step_s)
    assert result.host_dispatch_s == simulator.load_hardware("ascend910b4").profiler.profiled_host_dispatch_s
    assert abs(result.error_frac["computing_s"]) <= 0.20
    assert abs(result.error_frac["communication_exposed_s"]) <= 0.20
    assert 0.20 < result.error_frac["free_s"] <= 0.60  # the with_stack host time: see the docstring
    assert not result.passed  # the report says FAIL while one part misses; flip when all three are within 20%


def test_device_synchronize_costs_the_hosts_lead():
    """After torch.npu.synchronize() the host issues the next kernel once the device is idle; a
    stream wait (synchronize) keeps the host's lead."""
    hw = simulator.load_hardware("ascend910b")
    starts = {}
    for how in ("synchronize", "device_synchronize"):
        npu = NPU(hw, 1)
        x = Tensor((4096, 4096), "fp16")
        npu.matmul(x, x)  # long: the host runs ahead
        getattr(npu, how)()
        npu.add(x, x)
        ops = npu.profile(1).ops
        starts[how] = ops[1].start_s - (ops[0].start_s + ops[0].duration_s)
    assert starts["synchronize"] == pytest.approx(0.0, abs=1e-12)
    assert starts["device_synchronize"] == pytest.approx(hw.launch.host_dispatch_s)


def test_folder_without_step_trace(tmp_path):
    with pytest.raises(StepCompositionError, match="no step_trace_time.csv"):
        measured_composition(tmp_path)
    with pytest.raises(StepCompositionError, match="profiler_metadata.json"):
        infer_workload(tmp_path)


def test_a_damaged_step_trace_gets_the_step_trace_readers_message(tmp_path):
    # Newcomer: the step composition parsed the file again on its own and leaked Python's
    # exception names ("KeyError: 'Stage'"); it now reads it with the project's reader
    import shutil

    copy = tmp_path / "llm"
    shutil.copytree(LLM, copy)
    (copy / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv").write_text("Device_id,Step\n0,13\n", encoding="utf-8")
    with pytest.raises(StepCompositionError, match="step_trace_time.csv: no 'Computing'") as info:
        measured_composition(copy)
    assert "KeyError" not in str(info.value)
