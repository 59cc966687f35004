"""Per-kernel replay of a real profile: ``oam validate --profile DIR_OR_kernel_details.csv``.

Every device kernel of a torch_npu ``kernel_details.csv`` (Level1 or Level2, recorded with
``record_shapes``) is re-costed from its input shapes and dtypes by the simulator's cost model
for its op type (:data:`simulator.costs.COST_MODELS`, the kernel type mapped by the table of
:mod:`pytest_oam.files.kernel_names`) on a simulated NPU, and compared with its measured
duration. The error of a kernel is ``(simulated - measured) / measured``; the report gives, per
simulator op type, the count, the measured and simulated totals and the median and 90th
percentile of ``|error|``, the median ``|error|`` over all replayed kernels, and every kernel it
could not replay, counted and named per kernel type with the reason.

How a row becomes the simulator's op (what the profile records; what it does not is taken from
the simulator's own defaults):

* matrix products (``MatMulV2``, ``MatMulV3``, ``BatchMatMul*``): M, K and N from the two
  inputs and the output (transposed operands are recognised by which dimensions match the
  output), batch from the leading dimensions;
* ``FlashAttentionScore`` / ``Grad``: q, k, v in BSH, SBH, BNSD or BSND layout, told apart by the
  head count and sequence length of the softmax statistics (``softmax_max``, shape
  (B, N, S, 8): an output of the forward, an input of the backward); causal when a 2-D boolean
  attention mask is given (the compressed causal mask Megatron-style training passes); block
  size, pipeline stages and fusion are the defaults of the simulator's ``npu.flash_attention``;
* Vector kernels (``Add``, ``Cast``, ``Sin``, ``ConcatD``, ``ReduceSum``, ``ForeachAddList`` ...):
  where the row gives the shapes and dtypes of its inputs *and* outputs, the bytes it really
  reads and writes (the attributes ``read_bytes`` / ``write_bytes`` of
  :func:`simulator.costs.vector_cost`: every input tensor read once, every output written once;
  as the kernel table's ``reads`` says, a slice reads only what it writes and a ``ZerosLike``
  reads no input's data), with the operator's instruction mix over its largest tensor (every
  element of the list of a multi-tensor ``Foreach*`` kernel), in that tensor's dtype (with mixed dtypes,
  the elements not in fp32, ``cast_elements``, which an ``Add`` casts); else the larger
  of the first input and the first output, in the first input's dtype, with the operator's own
  multiples of it. ``TensorMove``: a ``Memcpy`` of its input's bytes; ``GatherV2`` of a 2-D
  table: an ``Embedding``; ``EmbeddingDenseGradV2``: an ``EmbeddingDenseGrad`` into its output
  table.

Not replayed, each counted and named with its reason: kernel types without a simulator op type
(``LpNormV2``, ``TransData``, ...), HCCL tasks (no message size or group in the file, and their
time includes waiting for the other ranks), convolutions (no stride or padding in the file),
rows without shapes, with shapes that do not parse or do not fit the op, dtypes the simulator
does not have, and rows whose measured duration is 0.

The hardware: ``--hardware NAME``, or else the bundled spec whose AI Core and Vector core
counts are closest to the cores the profile's Cube and Vector kernels fill (their ``Block Dim``,
:func:`profile_hardware`, which also measures the clock as ``aic_total_cycles`` over
``aicore_time(us)`` per core); the report says how well the spec fits.
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from simulator.costs import OpCost, OpSpec
from simulator.vector_profiles import VECTOR_PROFILES

from .files.importers import AscendCsv, ImportError_, read_ascend_csv
from .files.kernel_names import bytes_read, simulator_dtype, simulator_op_type, why_no_op_type
from .files.realfile import Shape, number_or_none
from .files.realfile import parse_shapes as _parse_shapes
from .kernel_pipes import PipeTimes, pipe_times, pipes_text

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
#: Default ``--max-error``: the bound issue 23 sets for per-kernel fidelity.
DEFAULT_MAX_ERROR_FRAC = 0.15
#: Names of a kernel kept in the report of the kernels it could not replay.
NAMES_SHOWN = 3
#: Share of a profile's Cube (or Vector) kernels that must use a Block Dim for it to count as the
#: number of cores: large kernels fill every core, while an odd kernel may launch more blocks
#: than there are cores (the AlexNet Level1 profile has one Vector kernel of 256 blocks on 48
#: Vector cores, and 58 of its 162 Vector kernels use 48).
CORE_SHARE_FRAC = 0.05
#: How close the profile's clock must be to the spec's to fit: msprof's counts give the clock to
#: 0.1% on the bundled profiles, whose two NPUs run at 1650 and 1800 MHz.
CLOCK_TOLERANCE_FRAC = 0.01
#: The simulator's multi-tensor op types (``ForeachAdd`` ...), whose instruction mix is per element
#: of all the tensors of their list (:data:`simulator.vector_profiles.VECTOR_PROFILES`).
FOREACH_PREFIX = "Foreach"
#: Last dimension of FlashAttentionScore's softmax statistics (softmax_max, softmax_sum):
#: (B, N, S, 8), CANN's layout for them.
SOFTMAX_STAT_WIDTH = 8


class ReplayError(ValueError):
    """A profile that cannot be replayed; the message names the file and what is wrong."""


class NotReplayable(Exception):
    """One kernel that cannot be re-costed (counted and named in the report, never an error)."""


class OpTypeFit(BaseModel):
    """The replayed kernels of one simulator op type."""

    model_config = _STRICT
    count: int = Field(description="Kernels replayed")
    measured_s: float = Field(description="Their measured time, summed")
    simulated_s: float = Field(description="Their simulated time, summed")
    median_abs_error_frac: float = Field(description="Median of |simulated - measured| / measured per kernel")
    p90_abs_error_frac: float = Field(description="90th percentile of the same")
    median_error_frac: float = Field(description="Median of the signed error: above 0, the simulator is slower")


class UnmappedKernels(BaseModel):
    """Kernels of one type not replayed for one reason."""

    model_config = _STRICT
    kernel_type: str
    reason: str
    count: int
    measured_s: float
    names: list[str] = Field(description=f"Up to {NAMES_SHOWN} of their kernel names")


class ProfileHardware(BaseModel):
    """What the profile shows of the NPU it ran on, beside the simulated spec."""

    model_config = _STRICT
    ai_cores_used: int | None = Field(description="Cores the Cube kernels (AI_CORE, MIX_AIC) fill: the largest "
                                      "Block Dim that at least CORE_SHARE_FRAC of them use")
    vector_cores_used: int | None = Field(description="The same for the Vector kernels (AI_VECTOR_CORE, MIX_AIV; "
                                          "the Mix Block Dim of MIX_AIC)")
    clock_hz: float | None = Field(description="Median of aic_total_cycles / aicore_time / Block Dim (or the "
                                   "aiv_ columns): the clock msprof counted cycles at")
    spec: str
    spec_ai_cores: int
    spec_vector_cores: int
    spec_clock_hz: float
    matches: bool = Field(description="The spec has the core counts the kernels used (and the clock, when known)")


class ReplayReport(BaseModel):
    """``oam validate --profile``'s result; its JSON keys are fixed (issue 23)."""

    model_config = _STRICT
    profile: str
    hardware: str
    kernels: int = Field(description="Kernels re-costed and compared")
    kernels_in_profile: int = Field(description="Device kernels (rows) in the file")
    median_abs_error_frac: float | None = Field(description="Median |error| over the replayed kernels; None if none")
    p90_abs_error_frac: float | None
    max_error_frac: float
    passed: bool = Field(description="median_abs_error_frac <= max_error_frac")
    by_op_type: dict[str, OpTypeFit]
    unmapped: list[UnmappedKernels]
    hardware_check: ProfileHardware
    pipes: dict[str, PipeTimes] = Field(default_factory=dict, description="Op type -> its units' busy time, "
                                        "measured and simulated (a key 'op type (Cube)' where an op type ran on both)")
    pipes_left_out: dict[str, int] = Field(default_factory=dict, description="Why replayed kernels are not in "
                                           "pipes -> how many")


# -- the file --------------------------------------------------------------------------------------


def kernel_details_path(path: str | Path) -> Path:
    """The ``kernel_details.csv`` that ``path`` is or holds (a torch_npu output folder, its
    ``ASCEND_PROFILER_OUTPUT``, or the file).

    Raises:
        ReplayError: a folder without one, or nothing at ``path``.
    """
    path = Path(path)
    if path.is_dir():
        for candidate in (path / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", path / "kernel_details.csv"):
            if candidate.is_file():
                return candidate
        raise ReplayError(f"{path}: a folder without ASCEND_PROFILER_OUTPUT/kernel_details.csv or kernel_details.csv; "
                          "give a torch_npu profiler output folder (*_ascend_pt) or the CSV")
    if not path.exists():
        raise ReplayError(f"{path}: no such file or folder")
    return path


def parse_shapes(cell: str) -> list[Shape] | None:
    """:func:`pytest_oam.files.realfile.parse_shapes`, for one kernel of the replay.

    Raises:
        NotReplayable: a dimension that is not a non-negative whole number.
    """
    try:
        return _parse_shapes(cell)
    except ValueError as exc:
        raise NotReplayable(str(exc)) from None


def _dtypes(cell: str) -> list[str]:
    text = cell.strip().strip('"')
    return [] if text.upper() in ("", "N/A", "NA") else [d.strip() for d in text.split(";")]


# -- one kernel onto the simulator's op ------------------------------------------------------------


class _Row:
    """What the adapters read of one kernel row; ``reads`` is its kernel type's ``reads`` in the
    kernel table (:func:`~pytest_oam.files.kernel_names.bytes_read`)."""

    __slots__ = ("in_dtypes", "inputs", "out_dtypes", "outputs", "reads")

    def __init__(self, row: dict[str, str], reads: str = "inputs") -> None:
        self.inputs = parse_shapes(row.get("Input Shapes", ""))
        self.outputs = parse_shapes(row.get("Output Shapes", "")) or []
        self.in_dtypes = _dtypes(row.get("Input Data Types", ""))
        self.out_dtypes = _dtypes(row.get("Output Data Types", ""))
        self.reads = reads

    def moved_bytes(self) -> tuple[int, int] | None:
        """(bytes read, bytes written) by the kernel: each input tensor read once (as many bytes
        as it writes, or none, as :attr:`reads` says), each output written once; a scalar is one
        element. None unless every tensor counted has a shape and a dtype of the simulator's."""
        from simulator.units import DTYPE_BYTES

        def total(shapes: list[Shape], names: list[str]) -> int | None:
            if len(shapes) != len(names):
                return None
            dtypes = [simulator_dtype(n) for n in names]
            if None in dtypes:
                return None
            return sum(_numel(s) * DTYPE_BYTES[d] for s, d in zip(shapes, dtypes, strict=True))

        if not self.inputs or not self.outputs:
            return None
        written = total(self.outputs, self.out_dtypes)
        read = {"inputs": lambda: total(self.inputs or [], self.in_dtypes), "outputs": lambda: written,
                "none": lambda: 0}[self.reads]()
        return None if read is None or written is None or read + written == 0 else (read, written)

    def dtype(self, index: int = 0) -> str:
        """The simulator's dtype of input ``index``."""
        names = self.in_dtypes
        if index >= len(names):
            raise NotReplayable("no data type recorded")
        dtype = simulator_dtype(names[index])
        if dtype is None:
            raise NotReplayable(f"dtype {names[index]} is not one of the simulator's")
        return dtype


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _matmul_mkn(a: Shape, b: Shape, out: Shape | None) -> tuple[int, int, int]:
    """(M, K, N) of ``a @ b`` with either operand possibly transposed; the output says which."""
    (a0, a1), (b0, b1) = a[-2:], b[-2:]
    if out is not None and len(out) >= 2:
        m, n = out[-2:]
        for k_a, m_a in ((a1, a0), (a0, a1)):  # a as (M, K), then a transposed
            if m_a == m and ((b0, b1) == (k_a, n) or (b1, b0) == (k_a, n)):
                return m, k_a, n
    else:
        for (m, k_a), (k_b, n) in (((a0, a1), (b0, b1)), ((a0, a1), (b1, b0)), ((a1, a0), (b0, b1))):
            if k_a == k_b:
                return m, k_a, n
    raise NotReplayable(f"shapes {list(a)} and {list(b)} do not make a matrix product"
                        + (f" of {list(out)}" if out is not None else ""))


def _matmul_spec(op_type: str, row: _Row) -> OpSpec:

    inputs = row.inputs or []
    if len(inputs) < 2 or len(inputs[0]) < 2 or len(inputs[1]) < 2:
        raise NotReplayable("fewer than two matrix inputs")
    a, b = inputs[0], inputs[1]
    out = row.outputs[0] if row.outputs else None
    m, k, n = _matmul_mkn(a, b, out)
    batch = _numel(out[:-2]) if out is not None and len(out) > 2 else _numel(a[:-2])
    return OpSpec(op_type, ((batch, m, k), (batch, k, n)), row.dtype(0))


def _attention_layout(q: Shape, batch: int, heads: int | None, seq: int | None) -> Shape | None:
    """(B, N, S, D) of a q, k or v tensor given the batch, one of its head counts or None, its
    sequence length or None: BSH, SBH (3-D, N heads of D = H / N), BNSD, BSND (4-D)."""
    if len(q) == 3:
        for b, s, h in ((q[0], q[1], q[2]), (q[1], q[0], q[2])):  # BSH, SBH
            if b == batch and (seq is None or s == seq) and heads and h % heads == 0:
                return b, heads, s, h // heads
    elif len(q) == 4:
        for b, n, s, d in ((q[0], q[1], q[2], q[3]), (q[0], q[2], q[1], q[3])):  # BNSD, BSND
            if b == batch and (heads is None or n == heads) and (seq is None or s == seq):
                return b, n, s, d
    return None


def _attention_spec(op_type: str, row: _Row) -> OpSpec:
    from simulator.runtime.cube_ops import CubeOps

    backward = op_type == "FlashAttentionGrad"
    inputs = row.inputs or []
    if len(inputs) < (4 if backward else 3):
        raise NotReplayable("fewer inputs than q, k, v" + (" and dy" if backward else ""))
    q, k = inputs[0], inputs[1]
    stats = [s for s in (inputs[3:] if backward else row.outputs)
             if len(s) == 4 and s[3] == SOFTMAX_STAT_WIDTH]
    if not stats:
        raise NotReplayable("no softmax statistics (B, N, S, 8) to read the head count from")
    batch, heads, seq_q = stats[0][0], stats[0][1], stats[0][2]
    q_bnsd = _attention_layout(q, batch, heads, seq_q)
    if q_bnsd is None:
        raise NotReplayable(f"q {list(q)} is not BSH, SBH, BNSD or BSND for batch {batch}, {heads} heads, "
                            f"sequence {seq_q}")
    head_dim = q_bnsd[3]
    if len(k) == 3:  # H_kv = N_kv x D: the head count follows from q's head dim
        kv_heads = k[2] // head_dim if k[2] % head_dim == 0 else 0
        k_bnsd = _attention_layout(k, batch, kv_heads, None)
    else:
        k_bnsd = _attention_layout(k, batch, None, None)
    if k_bnsd is None or k_bnsd[3] != head_dim or heads % k_bnsd[1]:
        raise NotReplayable(f"k {list(k)} does not fit q {list(q)} ({heads} heads of {head_dim})")
    causal = any(len(s) == 2 and i < len(row.in_dtypes) and row.in_dtypes[i].upper() == "BOOL"
                 for i, s in enumerate(inputs[3:], start=3))
    defaults = inspect.signature(CubeOps.flash_attention).parameters
    attrs = tuple(sorted({"block_size": defaults["block_size"].default,
                          "pipeline_stages": defaults["pipeline_stages"].default,
                          "fusion": defaults["fusion"].default, "causal": causal}.items()))
    shapes = (q_bnsd, k_bnsd, k_bnsd) + ((q_bnsd,) if backward else ())
    return OpSpec(op_type, shapes, row.dtype(0), attrs)


def _vector_spec(op_type: str, row: _Row) -> OpSpec:
    moved = row.moved_bytes()
    if moved is None:  # the operator's own multiples of its main tensor
        candidates = (row.inputs or [])[:1] + row.outputs[:1]
        if not candidates:
            raise NotReplayable("no input shapes recorded")
        return OpSpec(op_type, (max(candidates, key=_numel),), row.dtype(0))
    # the bytes it moved, and its instructions over the largest tensor of those it moves
    read_bytes, write_bytes = moved
    tensors = list(zip(row.outputs, row.out_dtypes, strict=True))
    if row.reads == "inputs":
        tensors = list(zip(row.inputs or [], row.in_dtypes, strict=True)) + tensors
    main, dtype_name = max(tensors, key=lambda t: _numel(t[0]))
    if op_type.startswith(FOREACH_PREFIX):  # a multi-tensor kernel: every element of its list
        main = (sum(_numel(s) for s in row.outputs),)
    attrs = (("read_bytes", read_bytes), ("write_bytes", write_bytes))
    profile = VECTOR_PROFILES.get(op_type)
    if profile is not None and profile.casts_to_fp32 and len({simulator_dtype(d) for _, d in tensors}) > 1:
        # mixed dtypes (fp32 + bf16 -> fp32): the elements the kernel casts, those not in fp32
        cast = sum(_numel(s) for s, d in tensors if simulator_dtype(d) != "fp32")
        attrs = (("cast_elements", cast / max(1, _numel(main))),) + attrs
    return OpSpec(op_type, (main,), simulator_dtype(dtype_name), attrs)


def _memcpy_spec(op_type: str, row: _Row) -> OpSpec:
    from simulator.units import DTYPE_BYTES

    if not row.inputs:
        raise NotReplayable("no input shapes recorded")
    dtype = row.dtype(0)
    return OpSpec(op_type, (row.inputs[0], row.inputs[0]), dtype,
                  (("nbytes", _numel(row.inputs[0]) * DTYPE_BYTES[dtype]),))


def _embedding_spec(op_type: str, row: _Row) -> OpSpec:

    inputs = row.inputs or []
    if op_type == "Embedding":  # GatherV2 of aclnnEmbedding: table (vocab, hidden), ids
        if len(inputs) < 2 or len(inputs[0]) != 2:
            raise NotReplayable("not a lookup in a 2-D table")
        return OpSpec(op_type, ((_numel(inputs[1]),), inputs[0]), row.dtype(0))
    # EmbeddingDenseGrad: grad (..., hidden), indices; the output is the table's gradient
    if len(inputs) < 2 or not row.outputs or len(row.outputs[0]) != 2:
        raise NotReplayable("no 2-D table gradient among the outputs")
    return OpSpec(op_type, ((_numel(inputs[1]),), row.outputs[0]), row.dtype(0))


def _adapter(op_type: str):
    """How to read a row for ``op_type``'s cost model, or the reason it cannot be read."""
    from simulator import costs

    model = costs.COST_MODELS.get(op_type)
    if model is None:
        raise NotReplayable(f"the simulator has no cost model for {op_type}")
    adapters = {
        costs.matmul_cost: _matmul_spec,
        costs.flash_attention_cost: _attention_spec,
        costs.flash_attention_grad_cost: _attention_spec,
        costs.vector_cost: _vector_spec,
        costs.memcpy_cost: _memcpy_spec,
        costs.embedding_cost: _embedding_spec,
    }
    if model in adapters:
        return adapters[model]
    if model in (costs.collective_cost, costs.p2p_cost):
        raise NotReplayable("an HCCL task: the file records no message size or group, and its time "
                            "includes waiting for the other ranks")
    if model is costs.conv2d_cost:
        raise NotReplayable("the profile records neither stride nor padding")
    raise NotReplayable(f"no replay for the simulator's {op_type}")


def kernel_spec(kernel_type: str, row: dict[str, str]) -> OpSpec:
    """The simulator's :class:`~simulator.costs.OpSpec` for one row of a kernel_details.csv.

    Raises:
        NotReplayable: why the row cannot be re-costed (see the module docstring).
    """
    op_type = simulator_op_type(kernel_type)
    if op_type is None:
        raise NotReplayable(why_no_op_type(kernel_type))
    adapter = _adapter(op_type)
    parsed = _Row(row, bytes_read(kernel_type))
    if parsed.inputs is None:
        raise NotReplayable("no input shapes recorded")
    return adapter(op_type, parsed)


# -- the hardware ----------------------------------------------------------------------------------


def _int(text: str | None) -> int | None:
    try:
        return int(float((text or "").strip()))
    except ValueError:
        return None


def _filled(block_dims: list[int]) -> int | None:
    """The largest Block Dim that at least :data:`CORE_SHARE_FRAC` of the kernels use (the
    largest one when none does)."""
    if not block_dims:
        return None
    counts = Counter(block_dims)
    common = [b for b, n in counts.items() if n >= max(2, CORE_SHARE_FRAC * len(block_dims))]
    return max(common or block_dims)


def _used_cores(rows: list[dict[str, str]]) -> tuple[int | None, int | None, float | None]:
    """The cores the Cube and the Vector kernels fill (:func:`_filled`), and the median clock:
    the cycles msprof counted on a kernel's cores over its time on them, per core."""
    from simulator.units import S_PER_US

    cube, vector, clocks = [], [], []
    for row in rows:
        core = (row.get("Accelerator Core") or row.get("Task Type") or "").strip().upper()  # torch_npu, msprof
        block, mix = _int(row.get("Block Dim")), _int(row.get("Mix Block Dim"))
        if not block:
            continue
        if core in ("AI_CORE", "MIX_AIC"):
            cube.append(block)
            if core == "MIX_AIC" and mix:
                vector.append(mix)
            cycles, time_us = number_or_none(row.get("aic_total_cycles")), number_or_none(row.get("aicore_time(us)"))
        elif core in ("AI_VECTOR_CORE", "MIX_AIV"):
            vector.append(block)
            cycles, time_us = number_or_none(row.get("aiv_total_cycles")), number_or_none(row.get("aiv_time(us)"))
        else:
            continue
        if cycles and time_us:
            clocks.append(cycles / (time_us * S_PER_US) / block)  # not display: the file's us read into seconds
    return _filled(cube), _filled(vector), statistics.median(clocks) if clocks else None


def require_shapes(csv_path: Path, header: list[str]) -> None:
    """Refuse a profile that records no input shapes (Level0).

    Raises:
        ReplayError: no ``Input Shapes`` column in ``header``, naming ``csv_path``.
    """
    if "Input Shapes" not in header:
        raise ReplayError(f"{csv_path}: no 'Input Shapes' column, so no kernel can be re-costed: a Level0 profile "
                          "(torch_npu's default level records no shapes); profile with "
                          "experimental_config profiler_level Level1 or Level2 and record_shapes=True")


def profile_hardware(rows: list[dict[str, str]], hardware: str | None) -> ProfileHardware:
    """The NPU the rows ran on against the spec ``hardware``, or, when None, against the bundled
    spec whose AI Core and Vector core counts are closest to the cores the kernels fill.

    Raises:
        ReplayError: ``hardware`` is None and no row says which cores it filled.
    """
    from simulator.hardware import list_hardware, load_hardware

    cube, vector, clock_hz = _used_cores(rows)
    if hardware is None and cube is None and vector is None:
        raise ReplayError("the profile does not say which NPU it ran on (no row with an Accelerator Core and a "
                          "Block Dim above 0): give --hardware NAME_OR_FILE")

    def distance(name: str) -> tuple[int, str]:
        spec = load_hardware(name).ai_core
        return (abs(spec.count - (cube or spec.count)) + abs(spec.vector_core_count - (vector or spec.vector_core_count)),
                name)

    name = hardware or min(list_hardware(), key=distance)
    spec = load_hardware(name).ai_core
    matches = ((cube is None or cube == spec.count) and (vector is None or vector == spec.vector_core_count)
               and (clock_hz is None or math.isclose(clock_hz, spec.clock_hz, rel_tol=CLOCK_TOLERANCE_FRAC)))
    return ProfileHardware(ai_cores_used=cube, vector_cores_used=vector, clock_hz=clock_hz, spec=name,
                           spec_ai_cores=spec.count, spec_vector_cores=spec.vector_core_count,
                           spec_clock_hz=spec.clock_hz, matches=matches)


# -- the replay ------------------------------------------------------------------------------------


def _p90(values: list[float]) -> float:
    import numpy as np

    return float(np.percentile(values, 90))


class ReplayedKernel(NamedTuple):
    """One re-costed kernel of a profile."""

    index: int  #: its row in the file, from 0, in file order
    kernel_type: str
    op_type: str  #: the simulator's op type
    measured_s: float
    cost: OpCost  #: the simulator's cost of it (its pipe shares: :func:`pipe_times`)

    @property
    def simulated_s(self) -> float:
        """The simulated duration."""
        return self.cost.duration_s

    @property
    def error_frac(self) -> float:
        """(simulated - measured) / measured."""
        return (self.simulated_s - self.measured_s) / self.measured_s


class ReplayedKernels(NamedTuple):
    """Every kernel of a profile, re-costed (:func:`replay_kernels`) or not, with why."""

    csv_path: Path
    read: AscendCsv  #: the importer's profile, header and rows of the file
    check: ProfileHardware
    kernels: list[ReplayedKernel]
    skipped: dict[tuple[str, str], list]  #: (kernel type, reason) -> the op records not re-costed


def _hardware_or_error(hardware: str | None) -> None:
    from simulator.hardware import load_hardware

    if hardware is not None:
        try:
            load_hardware(hardware)
        except ValueError as exc:
            raise ReplayError(f"--hardware {hardware!r}: {exc}") from None


def replay_kernels(path: str | Path, hardware: str | None = None) -> ReplayedKernels:
    """Re-cost every device kernel of the ``kernel_details.csv`` at ``path`` (or in the torch_npu
    output folder ``path``) on ``hardware`` (a bundled spec name or a hardware file's path; None:
    the bundled spec closest to the profile, :func:`profile_hardware`), kernel by kernel.

    Raises:
        ReplayError: as :func:`replay_profile`.
    """
    from simulator.costs import check_calibration, op_cost
    from simulator.hardware import load_hardware

    csv_path = kernel_details_path(path)
    _hardware_or_error(hardware)
    try:
        read = read_ascend_csv(csv_path)
    except ImportError_ as exc:
        raise ReplayError(str(exc)) from None
    profile, header, rows = read.profile, read.header, read.rows
    require_shapes(csv_path, header)
    try:
        check = profile_hardware(rows, hardware)
    except ReplayError as exc:
        raise ReplayError(f"{csv_path}: {exc}") from None
    hw = load_hardware(check.spec)
    try:
        check_calibration(hw)  # a typo in op_time_scale would scale nothing
    except ValueError as exc:
        raise ReplayError(str(exc)) from None
    kernels: list[ReplayedKernel] = []
    skipped: dict[tuple[str, str], list] = defaultdict(list)  # (kernel type, reason) -> ops
    costs: dict[OpSpec, OpCost] = {}  # one cost per distinct op
    for index, (op, row) in enumerate(zip(profile.ops, rows, strict=True)):
        kernel = str(op.attrs.get("kernel", op.op_type))  # the kernel type (a collective is named AllReduce ...)
        try:
            if op.duration_s <= 0:
                raise NotReplayable("measured duration is 0")
            spec = kernel_spec(kernel, row)
            if spec not in costs:
                try:
                    costs[spec] = op_cost(spec, hw)
                except (ValueError, KeyError, ZeroDivisionError) as exc:
                    raise NotReplayable(f"the cost model refused it: {str(exc).strip(chr(34))}") from None
            cost = costs[spec]
        except NotReplayable as why:
            skipped[(kernel, str(why))].append(op)
            continue
        kernels.append(ReplayedKernel(index, kernel, spec.op_type, op.duration_s, cost))
    return ReplayedKernels(csv_path, read, check, kernels, dict(skipped))


def replay_profile(path: str | Path, hardware: str | None = None,
                   max_error_frac: float = DEFAULT_MAX_ERROR_FRAC) -> ReplayReport:
    """Re-cost every device kernel of the ``kernel_details.csv`` at ``path`` (or in the torch_npu
    output folder ``path``) on ``hardware`` (a bundled spec name or a hardware file's path, e.g.
    one ``oam calibrate`` wrote; None: the closest bundled spec to the profile,
    :func:`profile_hardware`) and compare each with its measured duration.

    Raises:
        ReplayError: no kernel_details.csv there, a file the importer refuses (naming the line),
            a profile without an ``Input Shapes`` column (torch_npu's Level0), an unknown
            hardware name or an unusable hardware file.
    """
    replayed = replay_kernels(path, hardware)
    check, rows = replayed.check, replayed.read.rows
    pipes, left_out = pipe_times(replayed.kernels, rows, check.spec)
    errors: dict[str, list[tuple[float, float, float]]] = defaultdict(list)  # op type -> (measured, simulated, error)
    for k in replayed.kernels:
        errors[k.op_type].append((k.measured_s, k.simulated_s, k.error_frac))
    by_type = {}
    for op_type, found in sorted(errors.items()):
        abs_errors = [abs(e) for _, _, e in found]
        by_type[op_type] = OpTypeFit(count=len(found), measured_s=sum(m for m, _, _ in found),
                                     simulated_s=sum(s for _, s, _ in found),
                                     median_abs_error_frac=statistics.median(abs_errors),
                                     p90_abs_error_frac=_p90(abs_errors),
                                     median_error_frac=statistics.median(e for _, _, e in found))
    every = [abs(e) for found in errors.values() for _, _, e in found]
    median = statistics.median(every) if every else None
    unmapped = [UnmappedKernels(kernel_type=kind, reason=reason, count=len(ops), measured_s=sum(o.duration_s for o in ops),
                                names=list(dict.fromkeys(o.name for o in ops))[:NAMES_SHOWN])
                for (kind, reason), ops in sorted(replayed.skipped.items(),
                                                  key=lambda kv: -sum(o.duration_s for o in kv[1]))]
    return ReplayReport(profile=str(replayed.csv_path), hardware=check.spec, kernels=len(every),
                        kernels_in_profile=len(rows),
                        median_abs_error_frac=median, p90_abs_error_frac=_p90(every) if every else None,
                        max_error_frac=max_error_frac, passed=median is not None and median <= max_error_frac,
                        by_op_type=by_type, unmapped=unmapped, hardware_check=check, pipes=pipes, pipes_left_out=left_out)


# -- the command -----------------------------------------------------------------------------------


def hardware_text(check: ProfileHardware) -> str:
    """One paragraph: the cores (and clock) the profile used beside the spec's."""
    from .format import fmt_mhz

    used = []
    if check.ai_cores_used is not None:
        used.append(f"{check.ai_cores_used} AI Cores")
    if check.vector_cores_used is not None:
        used.append(f"{check.vector_cores_used} Vector cores")
    spec = (f"{check.spec} has {check.spec_ai_cores} and {check.spec_vector_cores} at {fmt_mhz(check.spec_clock_hz)}")
    if not used and check.clock_hz is None:
        return f"hardware: the profile records no Block Dim or cycle counts to check {check.spec} against"
    clock = f" at {fmt_mhz(check.clock_hz)}" if check.clock_hz is not None else ""
    verdict = "it fits" if check.matches else "a different NPU: expect a systematic error from the difference"
    return f"hardware: the kernels fill {' and '.join(used) or 'cores not recorded'}{clock}; {spec}: {verdict}"


def report_text(report: ReplayReport, fmt: str = "simple") -> str:
    """The report as text: ``fmt`` is a tabulate format (``simple``; ``github`` for Markdown)."""
    from tabulate import tabulate

    from .format import fmt_percent, fmt_time, table_cell

    title = (f"{table_cell(report.profile, fmt)}: {report.kernels:,} of {report.kernels_in_profile:,} device kernels "
             f"re-costed on {report.hardware}")
    lines = [title, hardware_text(report.hardware_check), ""]
    rows = [(table_cell(t, fmt), f.count, fmt_time(f.measured_s), fmt_time(f.simulated_s),
             fmt_percent(f.median_abs_error_frac, 1), fmt_percent(f.p90_abs_error_frac, 1),
             fmt_percent(f.median_error_frac, 1, signed=True))
            for t, f in report.by_op_type.items()]
    headers = [table_cell(h, fmt) for h in ("op type", "kernels", "measured", "simulated", "median |error|",
                                            "p90 |error|", "median error")]
    lines.append(tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True))
    if report.median_abs_error_frac is None:
        lines.append("\nno kernel could be re-costed")
    else:
        verdict = "pass" if report.passed else "FAILED"
        lines.append(f"\nmedian |error| per kernel: {fmt_percent(report.median_abs_error_frac, 1)} "
                     f"(p90 {fmt_percent(report.p90_abs_error_frac, 1)}; limit {fmt_percent(report.max_error_frac, 1)}): "
                     f"{verdict}")
    if report.unmapped:
        total = sum(u.count for u in report.unmapped)
        lines.append(f"\nnot re-costed: {total:,} kernels")
        rows = [(table_cell(u.kernel_type, fmt), u.count, fmt_time(u.measured_s), table_cell(u.reason, fmt))
                for u in report.unmapped]
        lines.append(tabulate(rows, headers=("kernel type", "kernels", "measured", "why"), tablefmt=fmt,
                              disable_numparse=True))
    return "\n".join(lines)


def wants_profile(argv: list[str]) -> bool:
    """``oam validate`` arguments that ask for a profile's replay (``--profile``)."""
    return any(a == "--profile" or a.startswith("--profile=") for a in argv)


def _parser():
    import argparse

    from simulator.hardware import list_hardware

    parser = argparse.ArgumentParser(
        prog="oam validate",
        description="Re-cost every device kernel of a real torch_npu profile (Level1 or Level2, with record_shapes) "
                    "on the simulated NPU and compare with its measured duration, per op type.")
    parser.add_argument("--profile", required=True, type=Path, metavar="DIR_OR_CSV",
                        help="a torch_npu output folder (*_ascend_pt) or its kernel_details.csv")
    parser.add_argument("--hardware", metavar="NAME_OR_FILE",
                        help="the simulated NPU (default: the bundled spec closest to the profile's core counts; "
                             f"one of {', '.join(list_hardware())}, or a hardware file such as one oam calibrate "
                             "wrote, e.g. ./my-910b.json)")
    parser.add_argument("--max-error", default="15%", metavar="LIMIT",
                        help="largest median |error| per kernel that passes, 15%% or 0.15 (default: %(default)s)")
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                        help="output format (default: %(default)s)")
    parser.add_argument("--pipes", action="store_true",
                        help="also compare each op type's Cube, Vector and DMA busy time with msprof's pipe "
                             "columns (the JSON always has them, under pipes)")
    return parser


def profile_help() -> str:
    """The help of ``oam validate --profile`` (``oam validate --help`` shows it after its own)."""
    return _parser().format_help()


def main(argv: list[str]) -> int:
    """``oam validate --profile ...``: print the replay; exit 0 when the median |error| is within
    ``--max-error``, 1 when above it (or nothing could be re-costed), 2 for bad input."""
    import sys

    from .format import terminal_safe
    from .judge.thresholds import ThresholdError, parse_limit

    args = _parser().parse_args(argv)
    try:
        limit = parse_limit(args.max_error)
        report = replay_profile(args.profile, args.hardware, limit)
    except ThresholdError as exc:
        print(f"oam validate: error: --max-error: {terminal_safe(exc)}", file=sys.stderr)
        return 2
    except (ReplayError, OSError) as exc:
        print(f"oam validate: error: {terminal_safe(exc)}", file=sys.stderr)
        return 2
    composition = _step_composition(args.profile, args.hardware or report.hardware_check.spec)
    if args.format == "json":
        if composition is None:
            print(report.model_dump_json(indent=2))
        else:
            import json

            data = json.loads(report.model_dump_json())
            data["step_composition"] = composition if isinstance(composition, str) else composition.model_dump()
            print(json.dumps(data, indent=2))
    else:
        fmt = "github" if args.format == "markdown" else "simple"
        print(terminal_safe(report_text(report, fmt), keep_newlines=True))
        if args.pipes:
            print("\n" + terminal_safe(pipes_text(report.pipes, report.pipes_left_out, fmt), keep_newlines=True))
        if composition is not None:
            from pytest_oam.step_composition import composition_text

            text = composition if isinstance(composition, str) else composition_text(composition)
            print("\n" + terminal_safe(text, keep_newlines=True))
    return 0 if report.passed else 1


def _step_composition(path: Path, hardware: str):
    """With ``step_trace_time.csv`` and ``profiler_metadata.json`` in the folder: the measured and
    simulated step composition (:mod:`pytest_oam.step_composition`), or the one-line
    reason it could not be made; ``None`` without those files. Reported, not gated on."""
    from pytest_oam.step_composition import StepCompositionError, compare, has_step_trace

    if not has_step_trace(path):
        return None
    try:
        return compare(path, hardware)
    except (StepCompositionError, ValueError) as exc:
        return f"step composition: not made: {exc}"
