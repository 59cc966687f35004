"""Eager dispatch: the host issues kernels one after another, ``launch.host_dispatch_s`` apart,
and kernels shorter than that leave the device idle (simulator 0.4.0)."""

from __future__ import annotations

import json
from importlib import resources

import pytest

import simulator
from simulator.hardware import HardwareSpec, load_hardware
from simulator.runtime import recost

B910 = load_hardware("ascend910b")
DISPATCH_S = B910.launch.host_dispatch_s


def tiny_adds(npu, count: int = 10):
    x = npu.tensor((16,), "fp16")
    for _ in range(count):
        npu.add(x, x)


def test_short_kernels_wait_for_the_host() -> None:
    assert DISPATCH_S == pytest.approx(20e-6)  # ascend910b.json, launch.host_dispatch_s (an estimate)
    profile = simulator.run(tiny_adds, hardware=B910)
    add_s = profile.ops[0].duration_s
    assert add_s < DISPATCH_S  # an Add of 16 elements is the 11 us launch floor and a little more
    # Host-bound: kernel i is issued at i x 20 us, so the device idles between kernels and the
    # step is 9 dispatch intervals plus the last Add (about 191 us), not 10 Adds back to back
    # (about 110 us, what simulator 0.3.0 gave).
    assert [op.start_s for op in profile.ops] == pytest.approx([i * DISPATCH_S for i in range(10)])
    assert profile.step_time_s == pytest.approx(9 * DISPATCH_S + add_s)
    assert profile.step_time_s > 10 * add_s * 1.5


def test_long_kernels_hide_the_host() -> None:
    def gemms(npu):
        a = npu.tensor((4096, 4096), "fp16")
        for _ in range(3):
            npu.matmul(a, a)

    profile = simulator.run(gemms, hardware=B910)
    gemm_s = profile.ops[0].duration_s
    assert gemm_s > DISPATCH_S
    # the host is ahead after the first launch: back to back, no gap
    assert [op.start_s for op in profile.ops] == pytest.approx([0.0, gemm_s, 2 * gemm_s])
    assert profile.step_time_s == pytest.approx(3 * gemm_s)


def test_a_step_starts_with_its_first_kernel_issued_and_recost_replays_the_host() -> None:
    profile = simulator.run(tiny_adds, hardware=B910, steps=2, devices=8)
    first_of_step_2 = profile.ops[10]
    end_of_step_1 = max(op.start_s + op.duration_s for op in profile.ops[:10])
    assert first_of_step_2.start_s == pytest.approx(end_of_step_1)
    assert profile.step_times_s == pytest.approx([9 * DISPATCH_S + profile.ops[0].duration_s] * 2)
    again = recost(profile, B910)
    assert [op.start_s for op in again.ops] == pytest.approx([op.start_s for op in profile.ops], rel=1e-12)


def test_collectives_are_issued_by_the_host_too() -> None:
    def work(npu):
        x = npu.tensor((16,), "fp16")
        npu.add(x, x)
        npu.all_reduce(x, async_op=True)

    profile = simulator.run(work, hardware=B910, devices=8)
    assert profile.ops[1].stream == "hccl"
    assert profile.ops[1].start_s == pytest.approx(DISPATCH_S)  # not at the Add's end (about 11 us)


def test_specs_without_the_field_model_no_dispatch() -> None:
    # Hardware specs (and the records that embed them) from before simulator 0.4.0 have no
    # host_dispatch_s; they load with 0, which is how they were simulated.
    data = json.loads((resources.files("simulator") / "hardware" / "ascend910b.json").read_text(encoding="utf-8"))
    del data["launch"]["host_dispatch_s"]
    old = HardwareSpec.model_validate(data)
    assert old.launch.host_dispatch_s == 0.0
    profile = simulator.run(tiny_adds, hardware=old)
    add_s = profile.ops[0].duration_s
    assert profile.step_time_s == pytest.approx(10 * add_s)
    with pytest.raises(ValueError):
        HardwareSpec.model_validate({**data, "launch": {**data["launch"], "host_dispatch_s": -1e-6}})


def test_recost_replays_the_device_synchronisations_of_a_pipeline_step() -> None:
    # Regression (review): NPU.device_synchronize moved the host's clock but left nothing in the
    # op records, so recost of a pipeline step (Megatron's batch_p2p_sync after each transfer)
    # came out 15% faster than the run on the same hardware
    from simulator.models import LlamaConfig, ParallelLayout, training_step

    tiny = LlamaConfig("tiny", 256, 688, 4, 4, 4, 512)
    layout = ParallelLayout(data_parallel=2, pipeline_parallel=2, micro_batches=4)
    profile = simulator.run(training_step, tiny, hardware=B910, devices=4, seq_len=256, dtype="bf16", layout=layout)
    assert any(op.attrs.get("host_synced") for op in profile.ops)
    again = recost(profile, B910)
    assert again.step_times_s == pytest.approx(profile.step_times_s, rel=1e-12)
    assert [op.start_s for op in again.ops] == pytest.approx([op.start_s for op in profile.ops], rel=1e-12)


def test_a_device_synchronisation_at_a_steps_end_does_not_reach_into_the_next() -> None:
    def work(npu):
        x = npu.tensor((16,), "fp16")
        npu.add(x, x)
        npu.device_synchronize()

    profile = simulator.run(work, hardware=B910, steps=2)
    assert not profile.ops[1].attrs.get("host_synced")  # next_step resets the host, as the run does
    assert recost(profile, B910).step_times_s == pytest.approx(profile.step_times_s, rel=1e-12)
