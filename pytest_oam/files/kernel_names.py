"""Real Ascend kernel names and types onto the simulator's op types: one table, one naming rule.

The table is ``pytest_oam/data/kernel_types.json``: for each kernel type as torch_npu's
``kernel_details.csv`` writes it in its ``Type`` column (``MatMulV2``, ``FlashAttentionScore``,
``hcom_allReduce_`` ...), the simulator's op type doing the same computation (``MatMul``,
``FlashAttention``, ``AllReduce``; or none, with the reason) and the ``Accelerator Core`` it runs
on, with the real profile each entry was seen in. Three features read it: the import of
torch_npu's default level (Level0), whose ``Type`` and ``Accelerator Core`` columns are ``N/A`` in
every row; the names imported profiles give their collectives (:func:`imported_op_type`, for the
``kernel_details.csv`` and the ``trace_view.json`` alike); and the per-kernel replay of
``oam validate --profile`` (:mod:`pytest_oam.kernel_replay`).

The Level0 rule (:func:`kernel_type_from_name`), one rule for every kernel name:

1. ``hcom_<collective>_...`` is an HCCL task: its type is ``hcom_<collective>_``
   (``hcom_allReduce__868_0_1`` -> ``hcom_allReduce_``, as Level1 writes it).
2. Otherwise the name is cut at ``_`` and trailing numbers are dropped (task and node
   indices); the type is the last part: ``aclnnMm_MatMulCommon_MatMulV2`` -> ``MatMulV2``
   (aclnn names are ``aclnn<API>_<kernel>_<type>``), ``trans_TransData_0`` -> ``TransData``,
   ``Conv2DBackpropFilter6_MemSet`` -> ``MemSet``.
3. A name of one part is a graph node's name, the type followed by the node's index
   (``Conv2D1``, ``ReduceSum7``): the longest type of the table it starts with, the rest being
   digits; a type the table does not know loses its trailing digits.

Every name of the real Level1 and Level2 profiles under ``tests/data/realdata`` gives its row's
``Type`` by this rule (tests/test_kernel_names.py), and the AlexNet Level0 profile gives the types
its Level1 twin records.

Collectives in imported profiles (:func:`imported_op_type`): an HCCL task is named as the
simulator names its collectives, the table's op type of its kernel type (``hcom_allReduce_`` ->
``AllReduce``, ``hcom_alltoallv_`` -> ``AllToAll``), so that a real profile's collectives line up
with a simulated one's; its kernel type stays in the op's name (``hcom_allReduce__868_0_1``) and
attribute ``kernel``. A collective the simulator has no op for keeps its kernel type
(``hcom_batchSendRecv_``). Other kernels keep their kernel type (``MatMulV2``, not ``MatMul``):
the gate compares the kernels the profiler ran, and ``MatMulV2`` and ``MatMulV3`` differ.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

#: ``Accelerator Core`` values as msprof writes them (newer versions write ``COMMUNICATION``
#: for HCCL tasks; this table says ``HCCL``).
AcceleratorCore = Literal["AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV", "HCCL", "DSA_SQE", "AI_CPU"]
#: What a ``Type`` / ``Accelerator Core`` cell holds when the profiler level did not record it.
NOT_RECORDED = ("", "N/A", "NA")


class KernelType(BaseModel):
    """One kernel type of the table."""

    model_config = _STRICT
    op_type: str | None = Field(description="The simulator's op type (a key of simulator.costs.COST_MODELS) "
                                "doing the same computation; None when it has none (see note)")
    accelerator_core: AcceleratorCore = Field(description="Where the kernel runs, in msprof's words")
    seen_in: list[str] = Field(default_factory=list, description="Folders under tests/data/realdata whose "
                               "profiles hold this type on this core")
    source: str | None = Field(default=None, description="Where the name comes from when no bundled profile has it")
    note: str | None = Field(default=None, description="Why there is no op type, or what the mapping leaves out")
    reads: Literal["inputs", "outputs", "none"] = Field(
        default="inputs", description="What the kernel reads, for the bytes its replay moves: every input tensor "
        "once; as many bytes as it writes (a slice reads only the part it copies); or no tensor's data (a fill "
        "from another tensor's shape, such as ZerosLike)")

    @model_validator(mode="after")
    def _documented(self) -> KernelType:
        if not self.seen_in and not self.source:
            raise ValueError("an entry needs seen_in (a real profile) or a source")
        if self.op_type is None and not self.note:
            raise ValueError("an entry without op_type needs a note saying why")
        return self


class KernelTable(BaseModel):
    """``pytest_oam/data/kernel_types.json``."""

    model_config = _STRICT
    schema_version: Literal[1]
    source: str = Field(min_length=1)
    dtypes_source: str = Field(min_length=1)
    dtypes: dict[str, str] = Field(description="msprof's data type names onto the simulator's dtypes")
    kernel_types: dict[str, KernelType]

    @model_validator(mode="after")
    def _known_dtypes(self) -> KernelTable:
        # Op types are checked against simulator.costs.COST_MODELS by tests/test_kernel_names.py,
        # not here: an op type the cost models lose must not stop real profiles from importing
        # (the replay reports such kernels as not re-costed).
        from simulator.units import DTYPE_BYTES

        unknown = sorted(f"{k} -> {v}" for k, v in self.dtypes.items() if v not in DTYPE_BYTES)
        if unknown:
            raise ValueError(f"dtypes the simulator does not have: {', '.join(unknown)}")
        return self


@functools.cache
def load_kernel_table() -> KernelTable:
    """The bundled table (read once).

    Raises:
        ValueError: the bundled file does not validate (a broken installation).
    """
    text = (resources.files("pytest_oam") / "data" / "kernel_types.json").read_text(encoding="utf-8")
    try:
        return KernelTable.model_validate(json.loads(text))
    except ValidationError as exc:
        raise ValueError(f"pytest_oam/data/kernel_types.json: {exc}") from None


@functools.cache
def _hcom_types() -> dict[str, KernelType]:
    """The table's ``hcom_*`` entries by their lower-case names."""
    return {k.lower(): v for k, v in load_kernel_table().kernel_types.items() if k.startswith("hcom_")}


def table_entry(kernel_type_name: str) -> KernelType | None:
    """The table's entry for a kernel type; an ``hcom_*`` type matches without regard to case
    (CANN versions write ``hcom_alltoallv_`` and ``hcom_allToAllV_``). None when the table does
    not know it."""
    entry = load_kernel_table().kernel_types.get(kernel_type_name)
    if entry is None and kernel_type_name.startswith("hcom_"):
        entry = _hcom_types().get(kernel_type_name.lower())
    return entry


def kernel_type_from_name(name: str) -> str:
    """The kernel type in a kernel's name, by the rule in this module's docstring:
    ``aclnnMm_MatMulCommon_MatMulV2`` -> ``MatMulV2``, ``trans_TransData_0`` -> ``TransData``,
    ``Conv2D1`` -> ``Conv2D``, ``hcom_allReduce__868_0_1`` -> ``hcom_allReduce_``.

    Returns the stripped name itself when no part of it is left (an empty name gives ``""``).
    """
    text = name.strip()
    parts = text.split("_")
    if parts[0] == "hcom" and len(parts) > 1 and parts[1]:
        return f"hcom_{parts[1]}_"
    while len(parts) > 1 and (not parts[-1] or parts[-1].isdigit()):
        parts.pop()
    last = parts[-1]
    if len(parts) > 1 or not last:
        return last or text
    known = load_kernel_table().kernel_types
    if last in known:
        return last
    prefixes = [k for k in known if last.startswith(k) and last[len(k):].isdigit()]
    if prefixes:
        return max(prefixes, key=len)
    return last.rstrip("0123456789") or last


def kernel_type(type_cell: str, name: str) -> str:
    """A row's kernel type: its ``Type`` cell, or, where the profiler level did not record one
    (``N/A`` or empty: torch_npu's Level0), the type in its ``Name``
    (:func:`kernel_type_from_name`); the name itself when neither gives one."""
    recorded = type_cell.strip()
    if recorded.upper() not in NOT_RECORDED:
        return recorded
    return kernel_type_from_name(name) or name.strip()


def accelerator_core(core_cell: str, kernel_type_name: str) -> str | None:
    """A row's ``Accelerator Core``: its cell, or, where the profiler level did not record it,
    the core of its kernel type in the table (``HCCL`` for any ``hcom_*`` type); None when
    neither says (a kernel type the table does not know)."""
    recorded = core_cell.strip()
    if recorded.upper() not in NOT_RECORDED:
        return recorded
    entry = table_entry(kernel_type_name)
    if entry is not None:
        return entry.accelerator_core
    return "HCCL" if kernel_type_name.startswith("hcom_") else None


def is_hccl(core: str | None, kernel_type_name: str) -> bool:
    """An HCCL (communication) task: its core says so (``HCCL``, or ``COMMUNICATION`` as newer
    msprof writes it), or its type is an ``hcom_*`` one."""
    return (core or "").upper().startswith(("HCCL", "COMMUNICATION")) or kernel_type_name.startswith("hcom")


def collective_op_type(kernel_type_name: str) -> str:
    """The op type of an HCCL task of kernel type ``kernel_type_name`` in an imported profile: the
    simulator's collective the table gives it (``hcom_allReduce_`` -> ``AllReduce``), else the
    kernel type itself (``hcom_batchSendRecv_``, which the simulator has no op for, or an
    ``hcom_*`` type the table does not know)."""
    return simulator_op_type(kernel_type_name) or kernel_type_name


def imported_op_type(kernel_type_name: str, hccl: bool) -> str:
    """The op type of a device task in an imported profile: for an HCCL task (``hccl``, see
    :func:`is_hccl`) :func:`collective_op_type`, for any other kernel its kernel type."""
    return collective_op_type(kernel_type_name) if hccl else kernel_type_name


def simulator_op_type(kernel_type_name: str) -> str | None:
    """The simulator's op type for a kernel type; None when the table has none for it or does
    not know the type (:func:`why_no_op_type` says which)."""
    entry = table_entry(kernel_type_name)
    return None if entry is None else entry.op_type


def simulator_dtype(profiler_dtype: str) -> str | None:
    """The simulator's dtype for one of msprof's data type names (``DT_BF16`` -> ``bf16``,
    ``FLOAT`` -> ``fp32``); None for one the simulator does not have (``BOOL``, ``DOUBLE`` ...)."""
    return load_kernel_table().dtypes.get(profiler_dtype.strip().upper())


def bytes_read(kernel_type_name: str) -> str:
    """What a kernel of this type reads (the table's ``reads``: ``inputs``, ``outputs`` or
    ``none``); ``inputs`` for a type the table does not know."""
    entry = table_entry(kernel_type_name)
    return "inputs" if entry is None else entry.reads


def why_no_op_type(kernel_type_name: str) -> str:
    """Why a kernel type has no simulator op type, in a few words for a report."""
    entry = table_entry(kernel_type_name)
    if entry is None:
        return "not in the kernel table (pytest_oam/data/kernel_types.json)"
    return entry.note or "no op type in the kernel table"
