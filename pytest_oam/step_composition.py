"""Step composition: a real profile's step split into compute, exposed communication and free
time (msprof's ``step_trace_time.csv``), and the same split of the simulated step.

msprof's split of one step on one card: ``Computing`` is the time any compute kernel runs,
``Communication(Not Overlapped)`` the time a collective runs with no compute kernel beside it
(waits for the peer of a pipeline transfer included), and ``Free`` the rest of the step (the
device idle: waiting for the host, synchronisations). :func:`simulated_composition` splits a
simulated step the same way, from its op records.

:func:`infer_workload` reads the model and layout of a torch_npu Megatron-style LLM profile
from its files: ``profiler_metadata.json`` (``distributed_args``: tensor, pipeline and data
parallel sizes) and ``kernel_details.csv`` (the embedding's ``GatherV2`` gives the vocabulary and
hidden size; ``FlashAttentionScore`` the sequence and the query and key widths; the query norm's
``RmsNorm`` over ``(s, b, heads, head_dim)`` the head size; the gate/up GEMM the FFN size; the
pipeline transfers ``hcom_batchSendRecv`` the micro-batches, ``m + pp - 1`` on the first stage
of the 1F1B schedule; ``FlashAttentionScore`` kernels / micro-batches the layers per stage; a
``hcom_reduceScatter`` the distributed optimizer, ZeRO-1; an ``Overlapped`` time of 0 no
overlap of the gradient reduction with backward).

:func:`compare` simulates that workload with the host's per-kernel time of a profiled run
(``profiler.profiled_host_dispatch_s`` of the hardware file, when it has one: for the bundled
specs the median of :func:`pytest_oam.calibrate.host_intervals_s` over the two AlexNet profiles,
for a file ``oam calibrate`` wrote the same measure on its profiles) and returns both splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from simulator.hardware import HardwareSpec, load_hardware

from .files.importers import ImportError_, read_ascend_csv
from .files.step_trace import profiler_metadata, read_step_trace

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class StepCompositionError(ValueError):
    """A profile folder without what the step composition needs (the message names the file)."""


class Composition(BaseModel):
    """One step split as msprof splits it, in seconds."""

    model_config = _STRICT
    step_s: float = Field(ge=0)
    computing_s: float = Field(ge=0)
    communication_exposed_s: float = Field(ge=0)
    free_s: float = Field(ge=0)


class StepComposition(BaseModel):
    """Measured (``step_trace_time.csv``) and simulated split of rank 0's step; ``error_frac``:
    signed (simulated - measured) / measured per part."""

    model_config = _STRICT
    workload: dict[str, object]
    hardware: str
    host_dispatch_s: float = Field(ge=0, description="Host time per kernel the simulation used")
    measured: Composition
    simulated: Composition
    error_frac: dict[str, float]
    max_error_frac: float
    passed: bool


# -- the real profile ------------------------------------------------------------------------------


def _output_dir(path: Path) -> Path:
    for candidate in (path / "ASCEND_PROFILER_OUTPUT", path):
        if (candidate / "step_trace_time.csv").is_file():
            return candidate
    raise StepCompositionError(f"{path}: no step_trace_time.csv (in the folder or its ASCEND_PROFILER_OUTPUT)")


def has_step_trace(path: str | Path) -> bool:
    """Whether ``path`` is a folder with ``step_trace_time.csv`` and ``profiler_metadata.json``."""
    path = Path(path)
    if not path.is_dir():
        return False
    try:
        _output_dir(path)
    except StepCompositionError:
        return False
    return (path / "profiler_metadata.json").is_file()


def measured_composition(path: str | Path) -> Composition:
    """The first step of the profile's ``step_trace_time.csv``, in seconds (its step: Computing +
    Communication(Not Overlapped) + Free, as :mod:`.files.step_trace` reads the file).

    Raises:
        StepCompositionError: no such file, or one the step trace reader refuses (named).
    """
    trace = _step_trace(Path(path))
    return Composition(step_s=trace.computing_s + trace.communication_exposed_s + trace.free_s,
                       computing_s=trace.computing_s, communication_exposed_s=trace.communication_exposed_s,
                       free_s=trace.free_s)


def _step_trace(path: Path):
    try:
        return read_step_trace(_output_dir(path) / "step_trace_time.csv")[0][1]
    except ImportError_ as exc:
        raise StepCompositionError(str(exc)) from None


@dataclass(frozen=True)
class InferredWorkload:
    """A Megatron-style Llama-family step read from a profile (see the module docstring)."""

    vocab_size: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layers_per_stage: int
    seq_len: int
    tensor_parallel: int
    data_parallel: int
    pipeline_parallel: int
    micro_batches: int
    zero_stage: int
    qk_norm: bool
    overlap_grad_reduce: bool

    @property
    def num_layers(self) -> int:
        return self.layers_per_stage * self.pipeline_parallel


def _dims(cell: str) -> list[list[int]]:
    out = []
    for part in cell.strip().strip('"').split(";"):
        try:
            out.append([int(x) for x in part.split(",")] if part else [])
        except ValueError:
            out.append([])
    return out


def infer_workload(path: str | Path) -> InferredWorkload:
    """The model and layout of the profile at ``path`` (see the module docstring).

    Raises:
        StepCompositionError: a file is missing or lacks the kernels the inference reads (named).
    """
    path = Path(path)
    meta_file = path / "profiler_metadata.json"
    try:
        args = profiler_metadata(path)["distributed_args"]
        tp, pp, dp = (int(args[k]) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                             "data_parallel_size"))
    except ImportError_ as exc:
        raise StepCompositionError(str(exc)) from None
    except (ValueError, KeyError, TypeError):
        raise StepCompositionError(f"{meta_file}: no distributed_args with the tensor, pipeline and data parallel "
                                   "sizes") from None
    kernels = _output_dir(path) / "kernel_details.csv"
    if not kernels.is_file():
        raise StepCompositionError(f"{kernels}: missing; the workload is read from its kernels")
    rows = _kernel_rows(kernels)
    by_type: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_type.setdefault(row.get("Type", ""), []).append(row)

    def first(kind: str) -> list[list[int]]:
        if not by_type.get(kind):
            raise StepCompositionError(f"{kernels}: no {kind} kernel with input shapes; the workload cannot be read")
        return _dims(by_type[kind][0]["Input Shapes"])

    table = first("GatherV2")[0]
    vocab, hidden = table[0], table[1]
    q, k = first("FlashAttentionScore")[:2]
    seq = q[0]
    head_norms = [_dims(r["Input Shapes"])[0] for r in by_type.get("RmsNorm", [])]
    head_norms = [s for s in head_norms if len(s) == 4]
    head_dim = head_norms[0][3] if head_norms else hidden // 16
    heads, kv_heads = q[-1] // head_dim, k[-1] // head_dim
    ffn = 0
    for kind in ("MatMulV3", "MatMulV2"):
        for r in by_type.get(kind, []):
            a, b = _dims(r["Input Shapes"])[:2]
            if len(a) == 2 and len(b) == 2 and a[1] == hidden and b[1] == hidden and b[0] > ffn and b[0] != vocab:
                ffn = b[0]  # the gate/up projection: (tokens, h) x (2 ffn, h)
    ffn //= 2
    transfers = sum(1 for r in rows if r.get("Name", "").startswith("hcom_batchSendRecv"))
    micro = max(1, transfers - (pp - 1)) if pp > 1 else len(by_type.get("GatherV2", [])) or 1
    layers = len(by_type["FlashAttentionScore"]) // micro
    zero = 1 if any(r.get("Name", "").startswith("hcom_reduceScatter") for r in rows) else 0
    overlapped_s = _step_trace(path).overlapped_s
    return InferredWorkload(vocab, hidden, ffn, heads, kv_heads, head_dim, layers, seq, tp, dp, pp, micro, zero,
                            bool(head_norms), overlapped_s > 0)


def _kernel_rows(kernels: Path) -> list[dict[str, str]]:
    try:
        return read_ascend_csv(kernels).rows
    except ImportError_ as exc:
        raise StepCompositionError(str(exc)) from None


# -- the simulated step ------------------------------------------------------------------------------


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the union ``a`` outside the union ``b`` (both merged and sorted)."""
    overlap, j = 0.0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            overlap += min(end, b[k][1]) - max(start, b[k][0])
            k += 1
    return _length(a) - overlap


def simulated_composition(profile, step: int = 0) -> Composition:
    """Split step ``step`` of a simulated profile as msprof does: compute = the union of the
    compute stream's kernels, exposed communication = the HCCL stream's ops outside it, free =
    the step's span minus both (the device idle: waiting for the host or a synchronisation)."""
    ops = [op for op in profile.ops if op.step == step]
    if not ops:
        raise StepCompositionError(f"the simulated profile has no op in step {step}")
    start = min(op.start_s for op in ops)
    end = max(op.start_s + op.duration_s for op in ops)
    compute = _union([(op.start_s, op.start_s + op.duration_s) for op in ops if op.stream == "compute"])
    comm = _union([(op.start_s, op.start_s + op.duration_s) for op in ops if op.stream == "hccl"])
    computing = _length(compute)
    exposed = _minus(comm, compute)
    step_s = end - start
    return Composition(step_s=step_s, computing_s=computing, communication_exposed_s=exposed,
                       free_s=max(0.0, step_s - computing - exposed))


def profiled_hardware(hw: HardwareSpec) -> HardwareSpec:
    """``hw`` with ``launch.host_dispatch_s`` set to the host's time per kernel under torch_npu's
    profiler (``profiler.profiled_host_dispatch_s``), when the file gives one."""
    profiled = hw.profiler.profiled_host_dispatch_s
    if profiled is None:
        return hw
    return hw.model_copy(update={"launch": hw.launch.model_copy(update={"host_dispatch_s": profiled})})


def simulate_workload(work: InferredWorkload, hw: HardwareSpec, dtype: str = "bf16"):
    """Simulate one step of ``work`` on ``hw`` (rank 0; its profile)."""
    from simulator.models import ParallelLayout, training_step
    from simulator.models.llama_config import LlamaConfig
    from simulator.runtime import run

    config = LlamaConfig("inferred", work.hidden_size, work.ffn_hidden_size, work.num_heads, work.num_kv_heads,
                         work.num_layers, work.vocab_size, head_size=work.head_dim, qk_norm=work.qk_norm,
                         tie_word_embeddings=work.pipeline_parallel > 1)
    layout = ParallelLayout(tensor_parallel=work.tensor_parallel, data_parallel=work.data_parallel,
                            pipeline_parallel=work.pipeline_parallel, micro_batches=work.micro_batches,
                            zero_stage=work.zero_stage)
    return run(training_step, config, hardware=hw, devices=layout.devices, dtype=dtype, seq_len=work.seq_len,
               layout=layout, overlap_grad_reduce=work.overlap_grad_reduce,
               grad_dtype="fp32" if dtype == "bf16" else None, framework="megatron")


def compare(path: str | Path, hardware: str | HardwareSpec = "ascend910b",
            max_error_frac: float = 0.20) -> StepComposition:
    """Measured and simulated step composition of the profile folder ``path``.

    Raises:
        StepCompositionError: the folder lacks ``step_trace_time.csv``, ``profiler_metadata.json``
            or the kernels the workload is read from.
        ValueError: unknown hardware.
    """
    hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    measured = measured_composition(path)
    work = infer_workload(path)
    sim_hw = profiled_hardware(hw)
    simulated = simulated_composition(simulate_workload(work, sim_hw))
    errors = {}
    for key in ("computing_s", "communication_exposed_s", "free_s"):
        real = getattr(measured, key)
        errors[key] = (getattr(simulated, key) - real) / real if real else 0.0
    return StepComposition(workload=work.__dict__, hardware=hw.name, host_dispatch_s=sim_hw.launch.host_dispatch_s,
                           measured=measured, simulated=simulated, error_frac=errors, max_error_frac=max_error_frac,
                           passed=all(abs(e) <= max_error_frac for e in errors.values()))


def composition_text(result: StepComposition) -> str:
    """A table: part, measured, simulated, error."""
    from tabulate import tabulate

    from .format import fmt_percent, fmt_us, to_ms

    rows = []
    for key, label in (("step_s", "step"), ("computing_s", "computing"),
                       ("communication_exposed_s", "communication (not overlapped)"), ("free_s", "free")):
        real, sim = getattr(result.measured, key), getattr(result.simulated, key)
        err = result.error_frac.get(key)
        rows.append([label, f"{to_ms(real):.1f}", f"{to_ms(sim):.1f}", "" if err is None else fmt_percent(err, 1, signed=True)])
    w = result.workload
    head = (f"step composition of rank 0 (step_trace_time.csv) vs simulated on {result.hardware}, host "
            f"{fmt_us(result.host_dispatch_s, 0)} per kernel; workload inferred: vocab {w['vocab_size']}, hidden "
            f"{w['hidden_size']}, {w['layers_per_stage'] * w['pipeline_parallel']} layers, {w['num_heads']}/"
            f"{w['num_kv_heads']} heads of {w['head_dim']}, FFN {w['ffn_hidden_size']}, seq {w['seq_len']}, tp "
            f"{w['tensor_parallel']} x dp {w['data_parallel']} x pp {w['pipeline_parallel']}, {w['micro_batches']} "
            f"micro-batches, ZeRO-{w['zero_stage']}")
    verdict = f"{'PASS' if result.passed else 'FAIL'}: each part within {fmt_percent(result.max_error_frac)}"
    return "\n".join([head, tabulate(rows, headers=["part", "measured ms", "simulated ms", "error"],
                                     disable_numparse=True), verdict])

