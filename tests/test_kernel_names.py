"""The kernel table (pytest_oam/data/kernel_types.json) and the Level0 naming rule of
pytest_oam.files.kernel_names, checked on the real profiles of tests/data/realdata (origins and
licences in its SOURCES.md)."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from pytest_oam.files.kernel_names import (
    KernelTable,
    KernelType,
    accelerator_core,
    bytes_read,
    collective_op_type,
    imported_op_type,
    kernel_type,
    kernel_type_from_name,
    load_kernel_table,
    simulator_dtype,
    simulator_op_type,
    why_no_op_type,
)
from simulator.costs import COST_MODELS

DATA = Path(__file__).parent / "data" / "realdata"
LEVEL0 = DATA / "ascend-msinsight-alexnet2p-level0-rank0" / "kernel_details.csv"
LEVEL1 = DATA / "ascend-msinsight-alexnet2p-level1-rank0" / "kernel_details.csv"
#: The 16-rank job's per-link matrix: its collectives' names (SOURCES.md, entry 12b).
MATRIX = DATA / "ascend-msinsight-cluster16-analysis" / "cluster_communication_matrix.json"
#: The real profiles that record a Type per row (Level1 and Level2).
TYPED = {
    "ascend-msinsight-alexnet2p-level1-rank0": LEVEL1,
    "ascend-msinsight-alexnet2p-level2-rank0": DATA / "ascend-msinsight-alexnet2p-level2-rank0" / "kernel_details.csv",
    "ascend-msinsight-llm-pp2dp2-level2-rank0":
        DATA / "ascend-msinsight-llm-pp2dp2-level2-rank0" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv",
}


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("folder", sorted(TYPED))
def test_the_rule_gives_every_real_rows_type_from_its_name(folder) -> None:
    """Rule 1 to 3 of kernel_names on every row of a Level1 / Level2 profile: the type the
    profiler wrote, from the name alone (aclnn names, graph node names, hcom tasks, MemSets)."""
    found = rows(TYPED[folder])
    assert len(found) in (191, 2463)  # SOURCES.md: 191 AlexNet tasks, 2,463 LLM tasks
    wrong = [(r["Name"], r["Type"], kernel_type_from_name(r["Name"])) for r in found
             if kernel_type_from_name(r["Name"]) != r["Type"]]
    assert wrong == []


def test_the_level0_names_give_the_types_of_the_level1_run_of_the_same_job() -> None:
    level0, level1 = rows(LEVEL0), rows(LEVEL1)
    assert {r["Type"] for r in level0} == {"N/A"}
    assert Counter(r["Accelerator Core"] for r in level0) == {"N/A": 187, "HCCL": 4}  # only HCCL tasks say where
    # the same 191 kernels of one AlexNet step, collected twice (only hcom task numbers differ)
    assert Counter(kernel_type(r["Type"], r["Name"]) for r in level0) == Counter(r["Type"] for r in level1)


@pytest.mark.parametrize(("name", "expected"), [
    ("aclnnMm_MatMulCommon_MatMulV2", "MatMulV2"),  # aclnn<API>_<kernel>_<type>: the last part
    ("trans_TransData_0", "TransData"),  # trailing node index dropped
    ("Conv2D1", "Conv2D"),  # a graph node: type + index (Conv2D is in the table)
    ("Conv2DBackpropFilter10", "Conv2DBackpropFilter"),
    ("MatMulV21", "MatMulV2"),  # the longest known type followed by digits only, not "MatMulV"
    ("Conv2DBackpropFilter6_MemSet", "MemSet"),
    ("hcom_allReduce__868_0_1", "hcom_allReduce_"),  # as Level1's Type column writes it
    ("hcom_batchSendRecv__128_3_1", "hcom_batchSendRecv_"),
    ("SomeNewKernel12", "SomeNewKernel"),  # unknown to the table: trailing digits dropped
    ("  RmsNorm ", "RmsNorm"),
    ("", ""),
])
def test_the_rule_on_names(name, expected) -> None:
    assert kernel_type_from_name(name) == expected


def test_a_recorded_type_is_kept_and_a_missing_one_comes_from_the_name() -> None:
    assert kernel_type("MatMulV2", "whatever_Foo") == "MatMulV2"
    assert kernel_type("N/A", "aclnnAdd_AddAiCore_Add") == "Add"
    assert kernel_type(" ", "trans_TransData_3") == "TransData"


def test_every_table_entry_was_seen_with_its_core_in_the_profiles_it_names() -> None:
    table = load_kernel_table().kernel_types
    seen: dict[str, dict[str, set[str]]] = {}
    for folder, path in TYPED.items():
        for r in rows(path):
            core = "HCCL" if r["Accelerator Core"] == "COMMUNICATION" else r["Accelerator Core"]  # newer msprof's word
            seen.setdefault(folder, {}).setdefault(r["Type"], set()).add(core)
    for name, entry in table.items():
        for folder in entry.seen_in:
            assert seen[folder].get(name) == {entry.accelerator_core}, (name, folder)
    # and every type of those profiles is in the table (a Level0 run of them gets its cores)
    every = {t for types in seen.values() for t in types}
    assert every - set(table) == set()


def test_the_table_maps_onto_the_simulators_op_types() -> None:
    expected = {"MatMulV2": "MatMul", "MatMulV3": "MatMul", "BatchMatMulV2": "BatchMatMul",
                "FlashAttentionScore": "FlashAttention", "FlashAttentionScoreGrad": "FlashAttentionGrad",
                "RmsNorm": "RmsNorm", "Cast": "Cast", "ApplyAdamWV2": "ApplyAdamW", "ApplyAdamW": "ApplyAdamW",
                "TensorMove": "Memcpy", "hcom_allReduce_": "AllReduce", "hcom_allGather_": "AllGather",
                "hcom_reduceScatter_": "ReduceScatter", "SwiGlu": "SwiGlu", "TransData": None,
                # CANN's vector operators the simulator has under the same name or as the same operator
                "Sin": "Sin", "Cos": "Cos", "Sub": "Sub", "ConcatD": "ConcatD", "ReduceSum": "ReduceSum",
                "LogSoftmaxV2": "LogSoftmax", "Pows": "Pow", "Greater": "Less", "Slice": "StridedSlice",
                "ZerosLike": "Fill", "ForeachAddList": "ForeachAdd", "LpNormV2": None, "Equal": None}
    assert {k: simulator_op_type(k) for k in expected} == expected
    table = load_kernel_table().kernel_types
    # every op type of the table has a cost model (checked here, not when the table loads)
    assert {e.op_type for e in table.values()} - {None} <= set(COST_MODELS)
    assert "p-norm" in why_no_op_type("LpNormV2") and "not in the kernel table" in why_no_op_type("NoSuchKernel")
    assert simulator_dtype("DT_BF16") == "bf16" and simulator_dtype("FLOAT") == "fp32" and simulator_dtype("BOOL") is None


def test_cores_come_from_the_table_where_the_column_is_missing() -> None:
    assert accelerator_core("N/A", "MatMulV2") == "AI_CORE"
    assert accelerator_core("N/A", "TransData") == "AI_VECTOR_CORE"
    assert accelerator_core("N/A", "hcom_allReduce_") == "HCCL"
    assert accelerator_core("N/A", "hcom_fooBar_") == "HCCL"  # not in the table, but an hcom task
    assert accelerator_core("N/A", "NoSuchKernel") is None
    assert accelerator_core("MIX_AIV", "MatMulV2") == "MIX_AIV"  # a recorded core is kept


def test_the_table_refuses_undocumented_or_unknown_entries() -> None:
    good = load_kernel_table().model_dump()
    with pytest.raises(ValidationError, match="seen_in"):
        KernelType(op_type="MatMul", accelerator_core="AI_CORE")
    with pytest.raises(ValidationError, match="note"):
        KernelType(op_type=None, accelerator_core="AI_CORE", source="x")
    with pytest.raises(ValidationError, match="dtypes the simulator does not have"):
        KernelTable.model_validate({**good, "dtypes": {"BOOL": "bool"}})


def test_the_collectives_of_a_real_job_are_in_the_table() -> None:
    """Every collective named in the 16-rank job's matrix (hcom_broadcast__483_0, hcom_send__822_0,
    hcom_receive__822_0; the name before '@' is the task's) has an entry by the naming rule,
    on the HCCL core, with the simulator's collective."""
    data = json.loads(MATRIX.read_text(encoding="utf-8"))
    names = {key.split("@")[0] for groups in data.values() for step in groups.values() for key in step
             if key != "Total Op Info"}
    assert {kernel_type_from_name(n) for n in names} == {"hcom_broadcast_", "hcom_send_", "hcom_receive_"}
    assert {n: collective_op_type(kernel_type_from_name(n)) for n in sorted(names)} == {
        "hcom_broadcast__483_0": "Broadcast", "hcom_broadcast__483_1": "Broadcast",
        "hcom_receive__822_0": "Receive", "hcom_send__822_0": "Send"}
    assert {accelerator_core("N/A", kernel_type_from_name(n)) for n in names} == {"HCCL"}


def test_collectives_are_named_as_the_simulator_names_them_and_other_kernels_keep_their_type() -> None:
    assert imported_op_type("hcom_allReduce_", hccl=True) == "AllReduce"
    assert imported_op_type("hcom_ALLTOALLV_", hccl=True) == "AllToAll"  # hcom types match without regard to case
    assert imported_op_type("hcom_batchSendRecv_", hccl=True) == "hcom_batchSendRecv_"  # no simulator op: kept
    assert imported_op_type("MatMulV2", hccl=False) == "MatMulV2"  # not MatMul: the gate compares kernels
    assert collective_op_type("hcom_fooBar_") == "hcom_fooBar_"


def test_what_a_kernel_reads() -> None:
    assert bytes_read("Add") == "inputs" and bytes_read("NoSuchKernel") == "inputs"
    assert bytes_read("Slice") == "outputs"  # a slice reads the part it copies
    assert bytes_read("ZerosLike") == bytes_read("MemSet") == "none"  # fills: no tensor's data read
