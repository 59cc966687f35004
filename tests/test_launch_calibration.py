"""The device launch floors of the 910B specs are what the AlexNet Level1 profile's smallest kernels
say (ascend910b.json, launch.source): recomputed here, so that a change of the cost model that
moves the calibration shows up, and so that the figures cannot drift from their derivation."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from pytest_oam import kernel_replay as kr
from pytest_oam.files.importers import read_ascend_csv
from simulator.costs import op_cost
from simulator.hardware import load_hardware

ALEXNET_L1 = Path(__file__).parent / "data" / "realdata" / "ascend-msinsight-alexnet2p-level1-rank0"
#: The JSON rounds the medians to two significant figures.
ROUNDING_FRAC = 0.05


def _floors(core: str) -> list[float]:
    """Measured duration minus the model's busy time (its duration less the floor it charged) of
    every replayable Block Dim 1 kernel of ``core`` in the AlexNet Level1 profile."""
    hw = load_hardware("ascend910b")
    read = read_ascend_csv(kr.kernel_details_path(ALEXNET_L1))
    found = []
    for op, row in zip(read.profile.ops, read.rows, strict=True):
        if row["Block Dim"] != "1" or row["Accelerator Core"] != core:
            continue
        try:
            cost = op_cost(kr.kernel_spec(str(op.attrs.get("kernel", op.op_type)), row), hw)
        except (kr.NotReplayable, ValueError):
            continue
        # the replayed ops are Vector kernels of the model (ReduceSum too), charged the Vector floor
        found.append(op.duration_s - (cost.duration_s - hw.launch.kernel_launch_latency_s))
    return found


def test_vector_kernel_floor_is_the_alexnet_level1_median():
    floors = _floors("AI_VECTOR_CORE")
    assert len(floors) == 18  # the replayable Block Dim 1 Vector kernels (launch.source says 18)
    assert load_hardware("ascend910b").launch.kernel_launch_latency_s == pytest.approx(
        statistics.median(floors), rel=ROUNDING_FRAC)


def test_mix_kernel_floor_is_the_alexnet_level1_median():
    floors = _floors("MIX_AIV")
    assert len(floors) == 2  # two ReduceSum kernels of 32 and 160 fp32 elements
    assert load_hardware("ascend910b").launch.mix_kernel_launch_latency_s == pytest.approx(
        statistics.median(floors), rel=ROUNDING_FRAC)


@pytest.mark.parametrize("name", ["ascend910b", "ascend910b4"])
def test_device_floors_lie_under_the_smallest_real_kernels(name):
    # The smallest kernel of the three bundled real profiles takes 1.06 us (a Vector kernel of the
    # LLM profile); a device floor above it could not be a device figure.
    launch = load_hardware(name).launch
    assert launch.kernel_launch_latency_s < 1.06e-6
    assert launch.host_s(mix=False) == launch.host_dispatch_s
    assert launch.host_s(mix=True) == launch.attention_host_dispatch_s > launch.host_dispatch_s
