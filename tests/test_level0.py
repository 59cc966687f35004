"""torch_npu's default level (Level0): Type and Accelerator Core are N/A in every row of
kernel_details.csv, so the op types come from the kernel names (issue 24). Real data:
tests/data/realdata/ascend-msinsight-alexnet2p-level0-rank0 (SOURCES.md, entry 11a)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest_oam as oam
from pytest_oam.api import load_any
from pytest_oam.cli import main
from pytest_oam.importers import import_profile

DATA = Path(__file__).parent / "data" / "realdata"
LEVEL0 = DATA / "ascend-msinsight-alexnet2p-level0-rank0" / "kernel_details.csv"
LEVEL1 = DATA / "ascend-msinsight-alexnet2p-level1-rank0" / "kernel_details.csv"


def slowed_matmuls(tmp_path: Path, factor: float) -> Path:
    """A copy of the Level0 file whose MatMul kernels (names ending in _MatMulV2 or _MatMulV3,
    picked by name, not by the rule under test) take ``factor`` times as long."""
    lines = LEVEL0.read_text(encoding="utf-8").splitlines(keepends=True)
    header = lines[0].rstrip("\r\n").split(",")
    name_col, dur_col = header.index("Name"), header.index("Duration(us)")
    out, slowed = [lines[0]], 0
    for line in lines[1:]:
        cells = line.split(",")
        if re.search(r"_MatMulV[23]$", cells[name_col]):
            cells[dur_col] = f"{float(cells[dur_col]) * factor:.3f}"
            slowed += 1
        out.append(",".join(cells))
    assert slowed == 9  # 8 MatMulV2 (aclnnMm, aclnnAddmm) and 1 MatMulV3 in the step
    target = tmp_path / "kernel_details.csv"
    target.write_text("".join(out), encoding="utf-8")
    return target


def test_level0_ops_get_their_types_and_cores_from_their_names() -> None:
    profile = import_profile(LEVEL0)
    assert len(profile.ops) == 191 and "N/A" not in profile.op_types
    # the same job's Level1 run records the types: the same ones, as many of each
    assert Counter(op.op_type for op in profile.ops) == Counter(op.op_type for op in import_profile(LEVEL1).ops)
    cores = {op.op_type: op.attrs.get("accelerator_core") for op in profile.ops}
    assert cores["MatMulV2"] == cores["Conv2D"] == "AI_CORE"  # Cube
    assert cores["TransData"] == cores["Relu"] == "AI_VECTOR_CORE"  # Vector
    assert cores["AllReduce"] == "HCCL"
    hccl = [op for op in profile.ops if op.stream == "hccl"]
    # the 4 allReduce tasks, on the HCCL stream, named as the simulator's collectives and as the
    # trace_view.json of the same run names them; their kernel type kept
    assert [op.op_type for op in hccl] == ["AllReduce"] * 4
    assert {op.attrs["kernel"] for op in hccl} == {"hcom_allReduce_"}
    assert {op.op_type for op in profile.ops if op.stream == "hccl"} == \
        {op.op_type for op in import_profile(LEVEL0.parent / "trace_view.json.gz").ops if op.stream == "hccl"}
    assert import_profile(LEVEL0.parent).op_types == profile.op_types  # the folder form too


def test_level0_against_itself_passes_with_per_op_rows_and_a_matmul_slowdown_fails_cli(tmp_path, capsys) -> None:
    code = main(["compare", str(LEVEL0), str(LEVEL0)])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("status: pass")
    rows = {line.split()[0] for line in out.splitlines()[3:] if line.strip()}
    assert {"MatMulV2", "MatMulV3", "Conv2D", "TransData", "AllReduce", "step"} <= rows
    assert "N/A" not in rows and "slow-op" not in out
    code = main(["compare", str(LEVEL0), str(slowed_matmuls(tmp_path, 1.2))])
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("status: regressed")
    (row,) = [line for line in out.splitlines() if line.startswith("MatMulV2 ")]
    assert "+20.0%" in row and "REGRESSED" in row


def test_level0_against_itself_passes_and_a_matmul_slowdown_fails_api(tmp_path) -> None:
    same = oam.compare_profiles(load_any(LEVEL0), load_any(LEVEL0), "10%")
    assert same.passed and same.status == "pass"
    compared = {v.op_type for v in same.comparison.verdicts}
    assert "N/A" not in compared and {"MatMulV2", "TransData", "AllReduce"} <= compared
    slow = oam.compare_profiles(load_any(LEVEL0), load_any(slowed_matmuls(tmp_path, 1.2)), "10%")
    assert not slow.passed and slow.has_regression
    # MatMulV2: 962.8 us -> +20% = +192.6 us, above the 20 us that counts for real profiles; the
    # one MatMulV3 (76.8 us, +15.4 us) is below it; the 116 ms step moves by 0.2%
    assert [r.op_name for r in slow.regressions] == ["MatMulV2"]
    assert abs(slow.regressions[0].regression_ratio - 1.2) < 1e-3


def test_an_unknown_level0_name_keeps_a_type_from_its_name_and_no_core(tmp_path) -> None:
    path = tmp_path / "kernel_details.csv"
    path.write_text("Step Id,Name,Type,Accelerator Core,Start Time(us),Duration(us),Wait Time(us),Block Dim\n"
                    "1,aclnnFoo_FooAiCore_FooBar,N/A,N/A,10.0\t,5.0,0,0\n"
                    "1,hcom_fooBar__1_0_1,N/A,N/A,20.0\t,7.0,0,0\n"
                    "1,hcom_allToAll__1_0_1,N/A,N/A,30.0\t,7.0,0,0\n", encoding="utf-8")
    foo, comm, all_to_all = import_profile(path).ops
    assert (foo.op_type, foo.stream, foo.attrs) == ("FooBar", "compute", {})
    # an hcom task the table does not know: on the HCCL stream, named by its kernel type
    assert (comm.op_type, comm.stream, comm.attrs) == ("hcom_fooBar_", "hccl", {"accelerator_core": "HCCL"})
    # the table's hcom_alltoall_, matched without regard to case
    assert (all_to_all.op_type, all_to_all.attrs) == ("AllToAll", {"accelerator_core": "HCCL",
                                                                  "kernel": "hcom_allToAll_"})
