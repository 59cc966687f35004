"""The eager runtime, the profile, and the Llama model builder."""

from __future__ import annotations

import pytest

import simulator
from simulator import Profile, ShapeError
from simulator.hardware import load_hardware
from simulator.models import LLAMA2_7B, LLAMA2_70B, ParallelLayout, training_step
from simulator.models.llama import memory_per_card_bytes
from simulator.runtime import recost


def two_ops(npu, n=1024):
    a = npu.tensor((n, n))
    npu.matmul(a, a, name="proj")
    npu.add(a, a)


def test_profile_views_and_json_round_trip() -> None:
    profile = simulator.run(two_ops, steps=3)
    assert profile.op_types == ["MatMul", "Add"]
    assert len(profile.ops) == 6 and [op.step for op in profile.ops] == [0, 0, 1, 1, 2, 2]
    # Eager dispatch: the host issues one kernel every launch.host_dispatch_s (20 us on
    # ascend910); the 1024^3 fp16 MatMul takes ~10.7 us of device time, less than that, so the
    # Add starts when the host issues it, not when the MatMul ends (simulator/runtime/timeline.py,
    # dispatch). A step is its first op's start to its last op's end: 20 us + the Add.
    matmul, add = profile.ops[0], profile.ops[1]
    host_s = load_hardware(profile.hardware).launch.host_dispatch_s
    assert matmul.start_s == 0.0 and matmul.duration_s < host_s
    assert add.start_s == pytest.approx(host_s)
    assert profile.step_time_s == pytest.approx(max(matmul.duration_s, host_s) + add.duration_s)
    # each step starts when the last one ends (the host issues its first kernel then)
    assert profile.ops[2].start_s == pytest.approx(add.start_s + add.duration_s)
    assert profile.op_time_s("MatMul") == pytest.approx(profile.ops[0].duration_s)
    assert profile.op_time_s("Nothing") == 0.0
    again = Profile.from_json(profile.to_json())
    assert again == profile and again.step_time_s == profile.step_time_s
    assert profile.ops[0].name == "proj" and profile.ops[1].name == "Add"


def test_ops_record_the_callers_source_line() -> None:
    profile = simulator.run(two_ops)
    assert profile.ops[0].source == f"{__file__}:{two_ops.__code__.co_firstlineno + 2}"


def test_fingerprint_depends_on_shapes_not_on_timing() -> None:
    base = simulator.run(two_ops).workload_fingerprint
    assert simulator.run(two_ops, op_time_scale={"MatMul": 2.0}).workload_fingerprint == base
    assert simulator.run(two_ops, n=2048).workload_fingerprint != base


def test_op_time_scale_names_an_unknown_op_type() -> None:
    # Regression (newcomer): a mistyped op type scaled nothing, so a gate test passed for the
    # wrong reason
    with pytest.raises(ValueError, match=r"op_time_scale: 'Matmul' is not an op type \(did you mean 'MatMul'\?"):
        simulator.run(two_ops, op_time_scale={"Matmul": 1.5})
    profile = simulator.run(two_ops)
    with pytest.raises(ValueError, match=r"op_time_scale: 'Conv2D' is not an op type of this profile"):
        recost(profile, "ascend910b", op_time_scale={"Conv2D": 2.0})  # not in this profile


def test_op_time_scale_warns_when_the_workload_never_ran_the_op_and_refuses_booleans() -> None:
    # Newcomer finding: {"MatMul": 2.0} on a workload without MatMul injected nothing, silently
    def attention(npu):
        q = npu.tensor((1, 8, 1024, 128))
        npu.flash_attention(q, q, q)

    with pytest.warns(UserWarning, match=r"op_time_scale: the workload ran no op of type 'MatMul', so nothing"):
        simulator.run(attention, op_time_scale={"MatMul": 2.0})
    with pytest.raises(ValueError, match=r"op_time_scale\['FlashAttention'\] must be a positive number, got True"):
        simulator.run(attention, op_time_scale={"FlashAttention": True})


def test_ops_of_a_bundled_builder_point_at_the_users_call() -> None:
    # Regression (newcomer): findings pointed into the installed simulator/models/llama.py only
    def step(npu):
        training_step(npu, LLAMA2_7B, seq_len=1024)  # the line every op should name first

    profile = simulator.run(step, devices=8)
    line = step.__code__.co_firstlineno + 1
    assert profile.ops[0].source.startswith(f"{__file__}:{line} (in ")
    from simulator.models import llama

    assert f"(in {llama.__file__}:" in profile.ops[0].source
    # ops issued from the user's own code keep their one location
    assert simulator.run(two_ops).ops[0].source.startswith(__file__)


def test_a_builder_run_from_the_command_line_names_the_builder_line(tmp_path) -> None:
    # Review: `python -m pytest_oam collect` named pytest_oam/__main__.py as the user's code
    import json
    import subprocess
    import sys

    out = tmp_path / "p.json"
    subprocess.run([sys.executable, "-m", "pytest_oam", "collect", "--model", "llama-7b", "--steps", "1", "-o", str(out)],
                   check=True, capture_output=True)
    source = json.loads(out.read_text())["ops"][0]["source"]
    assert " (in " not in source and "llama.py:" in source


def test_display_site_shortens_both_parts() -> None:
    from pytest_oam.evaluate import display_site

    assert display_site("/p/tests/t.py:12 (in /p/simulator/models/llama.py:379)", "/p") == \
        "tests/t.py:12 (in simulator/models/llama.py:379)"
    assert display_site("/p/tests/t.py:12", "/p") == "tests/t.py:12"


def test_op_time_scale_slows_only_that_op() -> None:
    base = simulator.run(two_ops)
    slow = simulator.run(two_ops, op_time_scale={"MatMul": 1.05})
    assert slow.op_time_s("MatMul") == pytest.approx(base.op_time_s("MatMul") * 1.05)
    assert slow.op_time_s("Add") == base.op_time_s("Add")
    assert slow.ops[0].mac_ratio == pytest.approx(base.ops[0].mac_ratio / 1.05)


@pytest.mark.parametrize(
    ("workload", "error", "message"),
    [
        (lambda npu: npu.matmul(npu.tensor((4, 8)), npu.tensor((4, 8))), ShapeError,
         r"matmul: inner dimensions differ: a \[4, 8\] and b \[4, 8\] \(K=8 vs 4\)"),
        (lambda npu: npu.tensor((4, -1)), ShapeError, r"tensor: shape \[4, -1\] must hold positive integers"),
        (lambda npu: npu.tensor((4, 0)), ShapeError, r"tensor: shape \[4, 0\] must hold positive integers"),
        (lambda npu: npu.tensor((4, 2.5)), ShapeError, r"tensor: shape \[4, 2.5\] must hold positive integers"),
        (lambda npu: npu.tensor((4,), "fp8"), ShapeError, r"tensor: unknown dtype 'fp8'"),
        (lambda npu: npu.matmul(npu.tensor((4,)), npu.tensor((4, 4))), ShapeError,
         r"matmul: a must have at least 2 dimensions, got \[4\]"),
        (lambda npu: npu.matmul(npu.tensor((2, 4, 4)), npu.tensor((3, 4, 4))), ShapeError,
         r"matmul: batch dimensions differ"),
        (lambda npu: npu.flash_attention(*(npu.tensor((1, 8, 64)),) * 3), ShapeError,
         r"flash_attention: q must be \(B, H, S, D\), got \[1, 8, 64\]"),
        (lambda npu: npu.flash_attention(npu.tensor((1, 8, 64, 64)), *(npu.tensor((1, 3, 64, 64)),) * 2),
         ShapeError, r"q heads \(8\) must be a multiple of k/v heads \(3\)"),
        (lambda npu: npu.flash_attention(*(npu.tensor((1, 8, 64, 64)),) * 3, block_size=100), ShapeError,
         r"block_size must be a positive multiple of 16, got 100"),
        (lambda npu: npu.add(npu.tensor((4, 8)), npu.tensor((3, 8))), ShapeError,
         r"Add: shapes \[4, 8\] and \[3, 8\] do not broadcast"),
        (lambda npu: npu.rms_norm(npu.tensor((4, 8)), npu.tensor((4,))), ShapeError,
         r"RmsNorm: parameter shape \[4\] must be \(8,\)"),
        (lambda npu: npu.tensor((True, 64)), ShapeError, r"tensor: shape \[True, 64\] must hold positive integers"),
        (lambda npu: npu.add(npu.tensor((64, 64)), npu.tensor((8, 8))), ShapeError,
         r"Add: shapes \[64, 64\] and \[8, 8\] do not broadcast"),
        (lambda npu: npu.matmul((64, 64), npu.tensor((64, 64))), ShapeError,
         r"matmul: a must be a Tensor \(made with npu.tensor\(shape, dtype\)\), got tuple"),
        (lambda npu: npu.all_reduce(npu.tensor((4,)), ranks=[0, 9]), ValueError,
         r"AllReduce: ranks \[0, 9\] must be distinct integers in \[0, 1\)"),
        (lambda npu: npu.conv2d(npu.tensor((8, 3, 32)), npu.tensor((16, 3, 3, 3))), ShapeError,
         r"Conv2D: x must be \(N, C, H, W\), got \[8, 3, 32\]"),
        (lambda npu: npu.conv2d(npu.tensor((8, 3, 32, 32)), npu.tensor((16, 4, 3, 3))), ShapeError,
         r"Conv2D: x has 3 channels, weight \[16, 4, 3, 3\] expects 4"),
        (lambda npu: npu.conv2d(npu.tensor((8, 3, 4, 4)), npu.tensor((16, 3, 7, 7))), ShapeError,
         r"Conv2D: a 7x7 window does not fit input \[8, 3, 4, 4\] with padding 0"),
        (lambda npu: npu.conv2d(npu.tensor((8, 3, 32, 32)), npu.tensor((16, 3, 3, 3)), stride=0), ShapeError,
         r"Conv2D: stride must be an integer >= 1, got 0"),
        (lambda npu: npu.conv2d_backward(npu.tensor((8, 16, 30, 31)), npu.tensor((8, 3, 32, 32)),
                                         npu.tensor((16, 3, 3, 3))), ShapeError,
         r"Conv2DBackpropFilter: dy \[8, 16, 30, 31\] must be \[8, 16, 30, 30\]"),
    ],
)
def test_bad_shapes_name_the_op(workload, error, message) -> None:
    with pytest.raises(error, match=message):
        simulator.run(workload)


def test_broadcasting_follows_numpy_rules() -> None:
    def work(npu):
        npu.add(npu.tensor((8, 64, 64)), npu.tensor((64,)))
        npu.mul(npu.tensor((8, 1, 64)), npu.tensor((8, 64, 1)))

    profile = simulator.run(work)
    assert [op.input_shapes[0] for op in profile.ops] == [[8, 64, 64], [8, 64, 64]]


def test_bad_run_arguments() -> None:
    with pytest.raises(ValueError, match="unknown hardware 'ascend999'; known: ascend910, ascend910b, ascend910b4"):
        simulator.run(two_ops, hardware="ascend999")
    with pytest.raises(ValueError, match="steps must be a positive integer, got 0"):
        simulator.run(two_ops, steps=0)
    with pytest.raises(ValueError, match="devices must be a positive integer"):
        simulator.run(two_ops, devices=0)
    with pytest.raises(ValueError, match=r"op_time_scale\['MatMul'\] must be a positive number"):
        simulator.run(two_ops, op_time_scale={"MatMul": float("nan")})


def test_llama2_7b_parameters_match_the_paper() -> None:
    # Touvron et al. (2023) report 6.7B parameters for Llama-2-7B (6,738,415,616 in the release).
    assert LLAMA2_7B.param_count == 6_738_415_616


def test_llama2_7b_step_on_8_cards() -> None:
    profile = simulator.run(training_step, LLAMA2_7B, devices=8, seq_len=2048)
    layout = ParallelLayout.default_for(LLAMA2_7B, 8, 4)
    assert (layout.tensor_parallel, layout.data_parallel) == (4, 2)
    assert len(profile.ops_of("FlashAttention")) == len(profile.ops_of("FlashAttentionGrad")) == 32
    assert {"AllReduce", "ReduceScatter", "AllGather", "ApplyAdamW"} <= set(profile.op_types)
    assert profile.tokens_per_step == 2 * 2048
    # Forward + backward MatMul work is 6 x params x tokens per data-parallel replica, split
    # over 4 tensor-parallel cards (plus the attention matmuls in FlashAttention).
    matmul_flop = sum(op.flop for op in profile.ops_of("MatMul"))
    assert matmul_flop == pytest.approx(6 * (LLAMA2_7B.param_count - LLAMA2_7B.vocab_size * 4096) * 2048 / 4, rel=0.01)
    assert memory_per_card_bytes(LLAMA2_7B, layout, 1, 2048) < 32 * 2**30


def test_llama_that_does_not_fit_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"llama-2-70b: .* needs about .* GiB per card; ascend910 has 32.0 GiB"):
        simulator.run(training_step, LLAMA2_70B, devices=8)
    with pytest.raises(ValueError, match=r"layout tp=2 x dp=2 x pp=1 needs 4 cards, the job has 8"):
        simulator.run(training_step, devices=8, layout=ParallelLayout(2, 2))


def test_resnet50_parameters_and_step() -> None:
    from simulator.models.resnet import resnet50_param_count, resnet50_training_step

    # 25,557,032 weights: the figure torchvision's resnet50 reports (He et al., 2016, Table 1).
    assert resnet50_param_count() == 25_557_032
    profile = simulator.run(resnet50_training_step, batch_size=32)
    counts = {t: len(profile.ops_of(t)) for t in ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput")}
    # 53 convolutions (stem, 16 blocks x 3, 4 projection shortcuts); the stem needs no dx.
    assert counts == {"Conv2D": 53, "Conv2DBackpropFilter": 53, "Conv2DBackpropInput": 52}
    unfused = simulator.run(resnet50_training_step, batch_size=32, fusion=False)
    assert unfused.step_time_s > profile.step_time_s  # graph-mode fusion saves passes over HBM
    with pytest.raises(ShapeError, match="resnet50: batch_size must be a positive integer, got 0"):
        simulator.run(resnet50_training_step, batch_size=0)
