"""Performance properties over shapes: strategies, helpers, shape findings and oam sweep."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_oam import strategies
from pytest_oam.cli import main
from pytest_oam.perf import (
    PropertyFailure,
    assert_efficiency,
    assert_near_best,
    assert_no_cliff,
    measure,
)
from pytest_oam.sweep import parse_axes, parse_axis_values


def test_property_finds_and_shrinks_the_tile_cliff() -> None:
    # The cost model's matmul tile is 256 columns wide: N = 256 -> 257 adds a tile column that is
    # 0.4% full but costs a whole one. Hypothesis, steered by target(), finds such a step and
    # shrinks it; the failure names the shape, its neighbour and the finding that explains it.
    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(shape=strategies.matmul_shapes(max_dim=2048))
    def no_cliff(shape):
        assert_no_cliff("MatMul", shape, axis="n")

    with pytest.raises(PropertyFailure) as info:
        no_cliff()
    text = str(info.value)
    step = re.search(r"cliff along n: n (\d+) -> (\d+)", text)
    assert step and int(step.group(1)) % 256 == 0 and int(step.group(2)) == int(step.group(1)) + 1
    # "shape:" is the shape the property was given, "grown:" the step past it (newcomer finding:
    # the grown one was labelled the shape, and the given one its neighbour)
    shrunk = re.search(r"shape: +MatMul\(m=(\d+), k=(\d+), n=(\d+)", text)
    assert shrunk and all(int(v) <= 2048 for v in shrunk.groups()) and shrunk.group(3) == step.group(1)
    assert re.search(rf"grown: +MatMul\(m={shrunk.group(1)}, k={shrunk.group(2)}, n={step.group(2)},", text)
    assert f"N = {step.group(2)} is 1 past a multiple of 256, the tile column" in text


def test_shape_findings_name_the_cause() -> None:
    # 34 blocks over 32 AI Cores: the second wave keeps 2 cores busy.
    wave = measure("MatMul", (2049, 241, 257))
    assert wave.record.block_dim == 34
    assert any(f.startswith("idle last wave: 34 blocks over 32 AI Cores run in 2 waves") for f in wave.findings)
    padded = measure("MatMul", (4096, 40, 4096))
    assert any("K = 40 is not a multiple of 16" in f and "17%" in f for f in padded.findings)
    fa = measure("FlashAttention", (1, 1, 1000, 128), hardware="ascend910b")
    assert any("seq = 1000 is not a multiple of block_size 128" in f for f in fa.findings)
    assert any("only 8 blocks for 24 AI Cores" in f for f in fa.findings)
    assert measure("MatMul", (4096, 4096, 4096)).findings == []


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 5000), st.data())
def test_aligned_ints_stay_in_range(low, span, data) -> None:
    value = data.draw(strategies.aligned_ints(low, low + span))
    assert low <= value <= low + span


def test_aligned_ints_favour_boundaries() -> None:
    values = []

    @settings(max_examples=300, derandomize=True, database=None)
    @given(strategies.aligned_ints(1, 8192))
    def collect(value):
        values.append(value)

    collect()
    near = [v for v in values if any(v % b in (0, 1, b - 1) for b in strategies.BOUNDARIES)]
    assert len(near) / len(values) > 0.4


def test_helpers_pass_on_healthy_shapes_and_explain_failures() -> None:
    m = assert_efficiency("MatMul", strategies.MatmulShape(4096, 4096, 4096), at_least=0.8)
    assert 0.8 <= m.efficiency_frac <= 0.95
    assert_no_cliff("MatMul", {"m": 4096, "k": 4096, "n": 4096}, axis="k", step=256)
    assert_near_best("MatMul", (4096, 4096, 4096))
    with pytest.raises(PropertyFailure, match=r"reaches \d+\.\d% of peak, below the required 50%") as info:
        assert_efficiency("FlashAttention", (1, 1, 1024, 128), at_least=0.5, hardware="ascend910b")
    assert info.value.args[0].count("neighbour:") >= 4


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: measure("Conv3D", (1, 2, 3)), "no shape properties for op type 'Conv3D'; known: MatMul, FlashAttention"),
        (lambda: measure("MatMul", (1, 2)), r"MatMul shape needs 3 values \(m, k, n\); got \[1, 2\]"),
        (lambda: measure("MatMul", {"m": 1, "k": 2}), "MatMul shape needs the axes m, k, n; got m, k"),
        (lambda: assert_efficiency("MatMul", (64, 64, 64), at_least=50), r"at_least must be a fraction in \(0, 1\]"),
        (lambda: assert_no_cliff("MatMul", (64, 64, 64), axis="q"), "MatMul has no axis 'q'; axes: m, k, n"),
        (lambda: parse_axis_values("256:128:0"), "axis values '256:128:0'"),
        (lambda: parse_axes("MatMul", ["m=1", "k=2"]), r"MatMul needs --axis for n \(axes: m, k, n\)"),
        (lambda: parse_axes("MatMul", ["m=1:100000", "k=1:100", "n=1"]), "at most 20,000 per sweep"),
    ],
)
def test_bad_input_is_named(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_oam_sweep_writes_table_and_plots(tmp_path, capsys) -> None:
    line = tmp_path / "line.png"
    code = main(["sweep", "MatMul", "--axis", "m=2048", "--axis", "k=1024", "--axis", "n=240:272:16",
                 "--dtype", "fp16", "--plot", str(line), "--top", "3"])
    out = capsys.readouterr().out
    assert code == 0 and line.read_bytes().startswith(b"\x89PNG")
    assert "MatMul on ascend910: 3 shapes; the 3 least efficient:" in out
    (row,) = [r for r in out.splitlines() if "n=272" in r]
    assert "N = 272 is 16 past a multiple of 256" in row
    heat = tmp_path / "heat.png"
    assert main(["sweep", "FlashAttention", "--axis", "batch=1", "--axis", "heads=8", "--axis", "seq=1024:4096:1024",
                 "--axis", "head_dim=64,128", "--hardware", "ascend910b", "--plot", str(heat)]) == 0
    assert heat.read_bytes().startswith(b"\x89PNG")
    assert main(["sweep", "MatMul", "--axis", "m=1", "--axis", "k=1", "--axis", "n=1", "--plot", str(tmp_path / "x.png")]) == 2
    assert "a plot needs one or two varying axes, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: assert_near_best("MatMul", (64, 64, 64), align=0), "align must be a positive integer, got 0"),
        (lambda: assert_near_best("MatMul", (64, 64, 64), within_frac=-0.5), r"within_frac must be a fraction in \[0, 1\)"),
        (lambda: measure("MatMul", (64, 64, 64), causal=True), "MatMul takes no attribute 'causal'; it takes: none"),
        (lambda: measure("FlashAttention", (1, 1, 128, 128), causal="maybe"),
         "FlashAttention attribute causal must be true or false, got 'maybe'"),
    ],
)
def test_review_bad_arguments(call, message) -> None:
    # Regressions from a newcomer review: each of these was accepted or crashed.
    with pytest.raises(ValueError, match=message):
        call()


def test_sweep_checks_before_running(tmp_path, capsys) -> None:
    base = ["sweep", "MatMul", "--axis", "m=64", "--axis", "k=64"]
    assert main([*base, "--axis", "n=1:100000000000"]) == 2  # no list of 1e11 values is built
    assert "100,000,000,000 values" in capsys.readouterr().err
    assert main([*base, "--axis", "n=64,128", "--plot", str(tmp_path / "p.xyz")]) == 2
    assert "write a .png, .svg, .pdf file" in capsys.readouterr().err
    (tmp_path / "p.png").write_bytes(b"keep")
    assert main([*base, "--axis", "n=64,128", "--plot", str(tmp_path / "p.png")]) == 2
    assert (tmp_path / "p.png").read_bytes() == b"keep"
    assert parse_axis_values("512,128,256") == [128, 256, 512]  # sorted, so lines do not zig-zag


def test_sweep_of_a_shape_the_card_cannot_hold_is_one_error_line(capsys) -> None:
    # before the fix: a traceback ending in simulator.allocator.OutOfMemoryError (a RuntimeError)
    code = main(["sweep", "MatMul", "--axis", "m=200000", "--axis", "k=200000", "--axis", "n=16"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("oam sweep: error: NPU out of memory") and err.count("\n") == 1
    assert "shape [200000, 200000] fp16" in err and "Traceback" not in err
