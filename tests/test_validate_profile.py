"""``oam validate --profile``: every kernel of a real profile re-costed on the simulated NPU
(issue 23). Real data: the LLM training step of
tests/data/realdata/ascend-msinsight-llm-pp2dp2-level2-rank0 (SOURCES.md, entry 10a)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from pytest_oam.cli import main
from pytest_oam.kernel_replay import NotReplayable, kernel_spec, parse_shapes, replay_profile
from simulator.costs import OpSpec, op_cost
from simulator.hardware import load_hardware

DATA = Path(__file__).parent / "data" / "realdata"
LLM = DATA / "ascend-msinsight-llm-pp2dp2-level2-rank0"
LLM_CSV = LLM / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
LEVEL0 = DATA / "ascend-msinsight-alexnet2p-level0-rank0"
#: The columns a small hand-made kernel_details.csv needs (Level2 names).
HEADER = ("Step Id,Name,Type,Accelerator Core,Start Time(us),Duration(us),Block Dim,Mix Block Dim,"
          "Input Shapes,Input Data Types,Output Shapes,Output Data Types\n")


def llm_rows() -> list[dict[str, str]]:
    with LLM_CSV.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def replayed() -> tuple[int, dict, str]:
    """``oam validate --profile LLM --format json`` run once for the module: exit code, JSON, stderr."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["validate", "--profile", str(LLM), "--format", "json"])
    return code, json.loads(out.getvalue()), err.getvalue()


def test_every_kernel_is_replayed_or_counted_and_named(replayed) -> None:
    code, data, err = replayed
    assert err == ""
    assert {"kernels", "median_abs_error_frac", "by_op_type", "unmapped"} <= set(data)  # fixed keys (issue 23)
    assert data["kernels_in_profile"] == 2463  # SOURCES.md: 2,463 device tasks
    # never silently skipped: the replayed and the named ones add up to every row
    assert data["kernels"] + sum(u["count"] for u in data["unmapped"]) == 2463
    assert sum(f["count"] for f in data["by_op_type"].values()) == data["kernels"]
    for fit in data["by_op_type"].values():
        assert {"count", "median_abs_error_frac", "measured_s", "simulated_s"} <= set(fit)
    # MatMul: the 56 MatMulV2 and 280 MatMulV3 kernels; FlashAttentionScore and its Grad: 28 each
    assert data["by_op_type"]["MatMul"]["count"] == 56 + 280
    assert data["by_op_type"]["FlashAttention"]["count"] == data["by_op_type"]["FlashAttentionGrad"]["count"] == 28
    measured_s = sum(float(r["Duration(us)"]) for r in llm_rows() if r["Type"] in ("MatMulV2", "MatMulV3")) * 1e-6
    assert data["by_op_type"]["MatMul"]["measured_s"] == pytest.approx(measured_s, rel=1e-9)
    unmapped = {u["kernel_type"]: u for u in data["unmapped"]}
    assert unmapped["LpNormV2"]["count"] == 59 and unmapped["LpNormV2"]["names"] == ["aclnnLinalgVectorNorm_LpNormV2_LpNormV2"]
    assert "p-norm" in unmapped["LpNormV2"]["reason"]
    assert data["by_op_type"]["SwiGlu"]["count"] == data["by_op_type"]["SwiGluGrad"]["count"] == 28
    assert unmapped["hcom_allReduce_"]["count"] == 7 and "HCCL" in unmapped["hcom_allReduce_"]["reason"]
    # exit 1 exactly when the median is above the default 15%
    assert code == (1 if data["median_abs_error_frac"] > 0.15 else 0)


def test_the_exit_code_follows_max_error(replayed, capsys) -> None:
    median = replayed[1]["median_abs_error_frac"]
    assert main(["validate", "--profile", str(LLM_CSV), "--max-error", f"{median * 0.9:.6f}"]) == 1
    assert main(["validate", "--profile", str(LLM_CSV), "--max-error", f"{median * 1.1:.6f}"]) == 0
    out = capsys.readouterr().out
    assert "median |error| per kernel" in out and "FAILED" in out and "pass" in out


def test_the_hardware_is_inferred_from_block_dims_and_cycles(replayed) -> None:
    check = replayed[1]["hardware_check"]
    # every Cube kernel has Block Dim 20, every full-width Vector kernel 40; msprof counted
    # aic_total_cycles / aicore_time(us) / Block Dim = 1650 cycles per us in every row
    assert (check["ai_cores_used"], check["vector_cores_used"]) == (20, 40)
    assert check["clock_hz"] == pytest.approx(1.65e9, rel=1e-3)
    # the closest bundled spec: ascend910b4 (20 + 40 cores: distance 0, and its 1650 MHz) before
    # ascend910b (24 + 48, |24-20| + |48-40| = 12) and ascend910 (32 + 32, 12 + 8 = 20)
    assert check["spec"] == replayed[1]["hardware"] == "ascend910b4" and check["matches"] is True


def test_the_910b2_spec_does_not_fit_the_llm_profile() -> None:
    check = replay_profile(LLM, "ascend910b").hardware_check
    assert (check.spec_ai_cores, check.spec_clock_hz) == (24, 1.8e9) and check.matches is False


def test_the_alexnet_profile_ran_on_the_bundled_910b2(capsys) -> None:
    """The AlexNet Level1 profile: 11 of its 23 Cube kernels use 24 blocks and 58 of its 162
    Vector kernels 48 (one launches 256 blocks: more than there are cores, so not a core count);
    msprof counted 1800 cycles per us: the bundled ascend910b (910B2: 24, 48, 1800 MHz)."""
    report = replay_profile(DATA / "ascend-msinsight-alexnet2p-level1-rank0", None)
    check = report.hardware_check
    assert (check.ai_cores_used, check.vector_cores_used, check.spec) == (24, 48, "ascend910b")
    assert check.clock_hz == pytest.approx(1.8e9, rel=1e-3) and check.matches is True


def test_text_report(capsys) -> None:
    main(["validate", "--profile", str(LLM)])
    out = capsys.readouterr().out
    assert "2,463 device kernels re-costed on ascend910b4" in out
    assert "hardware: the kernels fill 20 AI Cores and 40 Vector cores at 1650 MHz" in out
    (matmul,) = [line for line in out.splitlines() if line.startswith("MatMul ")]
    assert matmul.split()[1] == "336"
    assert "not re-costed:" in out and any(line.startswith("LpNormV2 ") for line in out.splitlines())


def row(name: str) -> dict[str, str]:
    return next(r for r in llm_rows() if r["Name"] == name and r["Input Shapes"] != "N/A")


def test_real_rows_become_the_simulators_ops() -> None:
    rows = llm_rows()
    # (4096 x 1024) @ (4096 x 1024)^T -> 4096 x 4096: M 4096, K 1024, N 4096
    first = next(r for r in rows if r["Type"] == "MatMulV3")
    assert first["Input Shapes"] == '"4096,1024;4096,1024"' and first["Output Shapes"] == '"4096,4096"'
    assert kernel_spec("MatMulV3", first) == OpSpec("MatMul", ((1, 4096, 1024), (1, 1024, 4096)), "bf16")
    # the weight gradient (4096 x 1024)^T @ (4096 x 3072) -> 1024 x 3072: a transposed first operand
    grad = next(r for r in rows if r["Type"] == "MatMulV3" and r["Output Shapes"] == '"1024,3072"')
    assert kernel_spec("MatMulV3", grad).shapes == ((1, 1024, 4096), (1, 4096, 3072))
    # FlashAttentionScore, SBH: q (4096, 1, 2048) with softmax_max (1, 16, 4096, 8) = 16 heads of
    # 128, k (4096, 1, 1024) = 8 KV heads; a 2048 x 2048 BOOL mask: causal
    fa = next(r for r in rows if r["Type"] == "FlashAttentionScore")
    spec = kernel_spec("FlashAttentionScore", fa)
    assert spec.op_type == "FlashAttention" and spec.dtype == "bf16"
    assert spec.shapes == ((1, 16, 4096, 128), (1, 8, 4096, 128), (1, 8, 4096, 128))
    assert spec.attr("causal") is True and spec.attr("fusion") is True
    bwd = kernel_spec("FlashAttentionScoreGrad", next(r for r in rows if r["Type"] == "FlashAttentionScoreGrad"))
    assert bwd.op_type == "FlashAttentionGrad" and bwd.shapes == spec.shapes + ((1, 16, 4096, 128),)
    # ApplyAdamWV2 over 3,145,728 fp32 parameters; TensorMove of 77,791,232 fp32 = 311,164,928 bytes
    adam = next(r for r in rows if r["Type"] == "ApplyAdamWV2" and r["Input Shapes"].startswith('"3145728'))
    assert kernel_spec("ApplyAdamWV2", adam) == OpSpec("ApplyAdamW", ((3145728,),), "fp32")
    move = next(r for r in rows if r["Type"] == "TensorMove" and r["Input Shapes"] == '"77791232"')
    assert kernel_spec("TensorMove", move).attr("nbytes") == 77791232 * 4
    with pytest.raises(NotReplayable, match="p-norm"):
        kernel_spec("LpNormV2", next(r for r in rows if r["Type"] == "LpNormV2"))
    # torch_npu's fused SwiGLU (npu_swiglu) and its grad: the simulator's SwiGlu / SwiGluGrad
    swiglu = kernel_spec("SwiGlu", next(r for r in rows if r["Type"] == "SwiGlu"))
    assert (swiglu.op_type, swiglu.shapes, swiglu.attr("read_bytes")) == ("SwiGlu", ((4096, 6144),), 4096 * 6144 * 2)


def test_vector_kernels_are_charged_the_bytes_their_tensors_hold() -> None:
    """Where a row gives input and output shapes and dtypes, a Vector kernel is re-costed with the
    bytes it reads and writes (vector_cost's read_bytes / write_bytes), as the table's 'reads' says."""
    rows = llm_rows()
    # Mul of (4096, 1) by (64,) broadcast into (4096, 64), FLOAT: reads (4096 + 64) x 4 bytes,
    # writes 4096 x 64 x 4; its instructions run over the largest tensor, the output
    mul = next(r for r in rows if r["Type"] == "Mul" and r["Input Shapes"] == '"4096,1;64"')
    assert kernel_spec("Mul", mul) == OpSpec("Mul", ((4096, 64),), "fp32", (("read_bytes", (4096 + 64) * 4),
                                                                          ("write_bytes", 4096 * 64 * 4)))
    # Cast FLOAT -> DT_BF16 of (4096, 1, 1, 128): reads 4 bytes and writes 2 per element
    cast = next(r for r in rows if r["Type"] == "Cast" and r["Input Shapes"] == '"4096,1,1,128"'
                and r["Output Data Types"] == "DT_BF16")
    assert kernel_spec("Cast", cast).attrs == (("read_bytes", 4096 * 128 * 4), ("write_bytes", 4096 * 128 * 2))
    # Add of FLOAT (6144, 1024) and DT_BF16 (6144, 1024) into FLOAT (a main gradient): CANN's Add
    # casts the bf16 input to fp32, one cast per element of the output (cast_elements)
    grad = next(r for r in rows if r["Type"] == "Add" and r["Input Shapes"] == '"6144,1024;6144,1024"')
    assert kernel_spec("Add", grad) == OpSpec("Add", ((6144, 1024),), "fp32", (
        ("cast_elements", 1.0), ("read_bytes", 6144 * 1024 * 6), ("write_bytes", 6144 * 1024 * 4)))
    # Slice of (4096, 8, 512) into (4096, 8, 256), DT_BF16: a StridedSlice that reads only the part it copies
    cut = next(r for r in rows if r["Type"] == "Slice" and r["Output Shapes"] == '"4096,8,256"')
    assert kernel_spec("Slice", cut) == OpSpec("StridedSlice", ((4096, 8, 256),), "bf16", (
        ("read_bytes", 4096 * 8 * 256 * 2), ("write_bytes", 4096 * 8 * 256 * 2)))
    # ZerosLike of 375,815,680 FLOAT: a Fill that writes 1,503,262,720 bytes and reads none
    zeros = next(r for r in rows if r["Type"] == "ZerosLike" and r["Input Shapes"] == '"375815680"')
    assert kernel_spec("ZerosLike", zeros) == OpSpec("Fill", ((375815680,),), "fp32", (
        ("read_bytes", 0), ("write_bytes", 375815680 * 4)))
    # ForeachAddList of the AlexNet profile (the update of its 16 parameter tensors): its instructions
    # over every element of the list; it reads both input lists and the scalar alpha (the 33rd
    # input, '' FLOAT) and writes the output list
    with (DATA / "ascend-msinsight-alexnet2p-level1-rank0" / "kernel_details.csv").open(encoding="utf-8") as f:
        foreach = next(r for r in csv.DictReader(f) if r["Type"] == "ForeachAddList")
    spec = kernel_spec("ForeachAddList", foreach)
    outputs = parse_shapes(foreach["Output Shapes"])
    elements = sum(math.prod(s) for s in outputs)
    assert spec.op_type == "ForeachAdd" and spec.shapes == ((elements,),) and spec.dtype == "fp32"
    assert spec.attr("write_bytes") == 4 * elements and spec.attr("read_bytes") == 2 * 4 * elements + 4
    # no output shapes (ApplyAdamWV2), or a dtype the simulator lacks (Greater writes BOOL): the
    # operator's own multiples of its first tensor, as before
    adam = next(r for r in rows if r["Type"] == "ApplyAdamWV2" and r["Input Shapes"].startswith('"3145728'))
    assert kernel_spec("ApplyAdamWV2", adam).attrs == ()
    greater = next(r for r in rows if r["Type"] == "Greater")
    assert kernel_spec("Greater", greater) == OpSpec("Less", ((4,),), "fp32")


def test_shapes_parse_in_order_with_empty_slots() -> None:
    assert parse_shapes('"4096,1,2048;4096,1,1024;;"') == [(4096, 1, 2048), (4096, 1, 1024), (), ()]
    assert parse_shapes('""') == [()]  # a scalar, recorded as such
    assert parse_shapes("N/A") is None
    with pytest.raises(NotReplayable, match="unparseable shapes"):
        parse_shapes('"4096,x;1"')


def test_error_of_a_kernel(tmp_path) -> None:
    """A MatMul measured at twice its simulated time: error (s - 2s) / 2s = -50%."""
    hw = load_hardware("ascend910b")
    simulated_us = op_cost(OpSpec("MatMul", ((1, 1024, 1024), (1, 1024, 1024)), "bf16"), hw).duration_s * 1e6
    measured_us = round(2 * simulated_us, 3)
    path = tmp_path / "kernel_details.csv"
    path.write_text(HEADER + f'1,aclnnMm_MatMulCommon_MatMulV2,MatMulV2,AI_CORE,100.0\t,{measured_us},24,0,'
                    '"1024,1024;1024,1024",DT_BF16;DT_BF16,"1024,1024",DT_BF16\n', encoding="utf-8")
    report = replay_profile(path, "ascend910b")
    expected = abs(simulated_us - measured_us) / measured_us  # 0.5 up to the file's 3 decimals
    assert report.kernels == 1 and report.median_abs_error_frac == pytest.approx(expected, rel=1e-9)
    assert report.by_op_type["MatMul"].median_error_frac == pytest.approx(-expected, rel=1e-9)
    assert abs(expected - 0.5) < 1e-3 and not report.passed  # 50% > 15%
    # no Vector kernel and no cycle counts: only the AI Core count is checked, and 24 of 24 fits
    assert report.hardware_check.matches is True and report.hardware_check.clock_hz is None


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    # a Level0 profile: no shapes to re-cost from
    assert main(["validate", "--profile", str(LEVEL0)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kernel_details.csv: no 'Input Shapes' column" in err and "Level0" in err
    # a folder without kernel_details.csv
    assert main(["validate", "--profile", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path}: a folder without" in err
    # a truncated file: the importer names the line
    cut = tmp_path / "cut" / "kernel_details.csv"
    cut.parent.mkdir()
    cut.write_text(LLM_CSV.read_text(encoding="utf-8")[:3000], encoding="utf-8")
    assert main(["validate", "--profile", str(cut)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line " in err and "Traceback" not in err
    # a Kineto trace given for the profile (newcomer: "line 2: more fields than the 0 columns")
    trace = next((DATA / "hta-critical-path-alexnet-run1").glob("*trace.json.gz"))
    assert main(["validate", "--profile", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds JSON, not CSV: not a torch_npu kernel_details.csv" in err
    # the same as written with an indent (review: the first line is "{", which read as one column)
    pretty = tmp_path / "trace.json"
    pretty.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "k"}]}, indent=2), encoding="utf-8")
    assert main(["validate", "--profile", str(pretty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds JSON, not CSV: not a torch_npu kernel_details.csv" in err
    blank = tmp_path / "blank" / "kernel_details.csv"
    blank.parent.mkdir()
    blank.write_text("\nName,Type\n", encoding="utf-8")
    assert main(["validate", "--profile", str(blank)]) == 2
    assert "line 1: no column names: not a torch_npu kernel_details.csv" in capsys.readouterr().err
    assert main(["validate", "--profile", str(LLM_CSV), "--max-error", "abc"]) == 2
    assert "--max-error" in capsys.readouterr().err
    assert main(["validate", "--profile", str(LLM_CSV), "--hardware", "nope"]) == 2  # not a bundled spec
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown hardware 'nope'" in err


def test_unparseable_unknown_and_zero_kernels_are_counted_and_named(tmp_path, capsys) -> None:
    path = tmp_path / "kernel_details.csv"
    path.write_text(HEADER
                    + '1,aclnnAdd_AddAiCore_Add,Add,AI_VECTOR_CORE,1.0\t,5.0,40,0,"4096,x;4096",DT_BF16;DT_BF16,"4096",DT_BF16\n'
                    + '1,aclnnEq_EqualAiCore_Equal,Equal,AI_VECTOR_CORE,2.0\t,3.0,1,0,"8;8",BOOL;BOOL,"8",BOOL\n'
                    + '1,aclnnCast_CastAiCore_Cast,Cast,AI_VECTOR_CORE,3.0\t,4.0,1,0,"8",BOOL,"8",FLOAT\n'
                    + '1,aclnnMuls_MulAiCore_Mul,Mul,AI_VECTOR_CORE,4.0\t,0,1,0,"8",FLOAT,"8",FLOAT\n'
                    + '1,Mystery3,N/A,N/A,5.0\t,2.0,1,0,"8",FLOAT,"8",FLOAT\n', encoding="utf-8")
    code = main(["validate", "--profile", str(path), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["kernels"] == 0 and data["median_abs_error_frac"] is None
    reasons = {u["kernel_type"]: (u["count"], u["names"], u["reason"]) for u in data["unmapped"]}
    assert reasons["Add"][:2] == (1, ["aclnnAdd_AddAiCore_Add"]) and "unparseable shapes" in reasons["Add"][2]
    assert "no equality comparison" in reasons["Equal"][2]
    assert "dtype BOOL" in reasons["Cast"][2]
    assert "measured duration is 0" in reasons["Mul"][2]
    assert reasons["Mystery"][:2] == (1, ["Mystery3"]) and "not in the kernel table" in reasons["Mystery"][2]


def test_validate_help_shows_the_profile_form(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--case" in out and "--profile DIR_OR_CSV" in out


def test_a_bad_hardware_option_is_one_line(capsys) -> None:
    # Regression test (newcomer): argparse printed its usage lines before the error, where the
    # docs promise one line for bad input
    from pytest_oam.cli import main

    assert main(["validate", "--profile", str(LLM), "--hardware", "./no-such-file.json"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [("oam validate: error: --hardware './no-such-file.json': "
                                         "./no-such-file.json: no such hardware file")]


def test_pipes_compare_each_units_busy_time_with_msprofs_columns(tmp_path) -> None:
    """``--pipes``: one Vector kernel (Add over 48 blocks) and one MatMul measured with msprof's
    pipe columns (per block); the table puts their sums over the blocks beside the simulator's pipe
    shares of all its cores' time (core-seconds), and says which kernels it leaves out and why."""
    hw = load_hardware("ascend910b")
    header = HEADER.rstrip("\n") + (",aic_mac_time(us),aic_mte2_time(us),aic_fixpipe_time(us),aiv_vec_time(us),"
                                    "aiv_mte2_time(us),aiv_mte3_time(us)\n")
    add = ('1,aclnnAdd_AddAiCore_Add,Add,AI_VECTOR_CORE,100.0\t,40.0,48,0,"4096,1024;4096,1024",'
           'DT_BF16;DT_BF16,"4096,1024",DT_BF16,0,0,0,{vec},30.0,9.0\n')
    path = tmp_path / "kernel_details.csv"
    path.write_text(header + add.format(vec="7.5")
                    + '1,aclnnMm_MatMulCommon_MatMulV2,MatMulV2,AI_CORE,200.0\t,90.0,24,0,"4096,1024;1024,4096",'
                      'DT_BF16;DT_BF16,"4096,4096",DT_BF16,60.0,70.0,20.0,0,0,0\n'
                    # values no unit can have: left out, counted
                    + add.format(vec="abc") + add.format(vec="-1") + add.format(vec="inf") + add.format(vec="400"),
                    encoding="utf-8")
    report = replay_profile(path, "ascend910b")
    assert set(report.pipes) == {"Add", "MatMul"}
    assert report.pipes_left_out == {"a pipe time that is not a number >= 0": 3, "a pipe time longer than the kernel": 1}
    add_pipes, mm = report.pipes["Add"], report.pipes["MatMul"]
    assert add_pipes.unit == "Vector" and add_pipes.kernels == 1
    # the row's Block Dim is 48: msprof's per-block times, 48 times
    assert (add_pipes.unit_measured_s, add_pipes.mte2_measured_s, add_pipes.write_measured_s) == pytest.approx(
        (48 * 7.5e-6, 48 * 30e-6, 48 * 9e-6))
    # the simulator's shares are of all 48 Vector cores' time
    add_cost = op_cost(kernel_spec("Add", {"Type": "Add", "Input Shapes": '"4096,1024;4096,1024"',
                                           "Input Data Types": "DT_BF16;DT_BF16", "Output Shapes": '"4096,1024"',
                                           "Output Data Types": "DT_BF16"}), hw)
    assert add_cost.block_dim == hw.ai_core.vector_core_count
    assert add_pipes.unit_simulated_s == pytest.approx(48 * add_cost.vec_ratio * add_cost.duration_s)
    assert add_pipes.dma_simulated_s == pytest.approx(48 * add_cost.mte2_ratio * add_cost.duration_s)
    assert mm.unit == "Cube"
    assert (mm.unit_measured_s, mm.mte2_measured_s, mm.write_measured_s) == pytest.approx(
        (24 * 60e-6, 24 * 70e-6, 24 * 20e-6))
    assert 0 < mm.unit_simulated_s < 24 * report.by_op_type["MatMul"].simulated_s


def test_pipes_sum_over_blocks_so_block_dims_need_not_agree(tmp_path) -> None:
    """A 64-element bf16 Add the card ran as Block Dim 1 and the simulator cuts into 4 blocks of one
    32-byte block each: both sides in core-seconds. Golden: CANN's Add casts both bf16 inputs and
    the output around one fp32 add (simulator/vector_profiles.py), 4 one-cycle instructions per
    element at the fp32 rate, so the simulated Vector work is 64 x 4 cycles over the 910B2's
    64 fp32 lanes x 1.8 GHz x its Vector efficiency, whichever core does it. Dividing by the
    simulator's 4 blocks (per block) or its 48 cores (per core) instead would give a quarter or
    1/48 of it."""
    hw = load_hardware("ascend910b")
    header = HEADER.rstrip("\n") + ",aiv_vec_time(us),aiv_mte2_time(us),aiv_mte3_time(us)\n"
    path = tmp_path / "kernel_details.csv"
    path.write_text(header + '1,aclnnAdd_AddAiCore_Add,Add,AI_VECTOR_CORE,100.0\t,2.0,1,0,"64;64",DT_BF16;DT_BF16,'
                    '"64",DT_BF16,0.05,0.4,0.2\n', encoding="utf-8")
    report = replay_profile(path, "ascend910b")
    add = report.pipes["Add"]
    assert add.unit_measured_s == pytest.approx(0.05e-6) and add.mte2_measured_s == pytest.approx(0.4e-6)
    rate = hw.vector_ops_per_cycle("fp32") * hw.ai_core.clock_hz * hw.vector_unit.efficiency_frac
    assert add.unit_simulated_s == pytest.approx(64 * 4 / rate)


def test_pipes_on_the_real_profile_and_without_pipe_columns(replayed, tmp_path, capsys) -> None:
    # the JSON always carries them; RmsNorm's Vector time is msprof's column times Block Dim, summed
    # over its 112 kernels
    pipes = replayed[1]["pipes"]
    rms_vec_s = sum(float(r["aiv_vec_time(us)"]) * int(r["Block Dim"]) for r in llm_rows() if r["Type"] == "RmsNorm") * 1e-6
    assert pipes["RmsNorm"]["kernels"] == 112 and pipes["RmsNorm"]["unit"] == "Vector"
    assert pipes["RmsNorm"]["unit_measured_s"] == pytest.approx(rms_vec_s, rel=1e-9)
    assert "FlashAttention" not in pipes and "RmsNormGrad" in pipes  # MIX_AIC out; MIX_AIV as a Vector kernel
    assert replayed[1]["pipes_left_out"] == {"MIX_AIC (fused Cube and Vector): their cores are not one to one": 56}
    assert main(["validate", "--profile", str(LLM), "--pipes"]) == 1
    out = capsys.readouterr().out
    assert "busy time per unit" in out and "simulated / measured" in out and "not in the table: 56 kernels" in out
    # a file without msprof's pipe columns: said, and every kernel counted as left out
    path = tmp_path / "kernel_details.csv"
    path.write_text(HEADER + '1,aclnnAdd_AddAiCore_Add,Add,AI_VECTOR_CORE,100.0\t,40.0,48,0,"4096,1024;4096,1024",'
                    'DT_BF16;DT_BF16,"4096,1024",DT_BF16\n', encoding="utf-8")
    main(["validate", "--profile", str(path), "--pipes", "--hardware", "ascend910b"])
    out = capsys.readouterr().out
    assert "no kernel has msprof's per-unit busy times" in out and "1 kernels: no aiv_vec_time(us) column" in out
    main(["validate", "--profile", str(path), "--format", "json", "--hardware", "ascend910b"])
    data = json.loads(capsys.readouterr().out)
    assert data["pipes"] == {} and data["pipes_left_out"] == {"no aiv_vec_time(us) column": 1}


def test_pipes_without_a_profile_says_what_it_needs(capsys) -> None:
    # argparse of the figures' form said "unrecognized arguments: --pipes"
    assert main(["validate", "--pipes"]) == 2
    err = capsys.readouterr().err
    assert err == "oam validate: error: --pipes compares a real profile's units: give it with --profile DIR\n"
