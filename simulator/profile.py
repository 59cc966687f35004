"""The profile a simulated (or imported) run produces: versioned pydantic models.

A :class:`Profile` holds every operator record of every step. Times are seconds.
"""

from __future__ import annotations

import bisect
import fnmatch
import statistics
from collections.abc import Iterable, Sequence
from functools import cached_property
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt

_RECORD_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
#: Idle time between two kernels on one stream above which the device waited for something (the
#: host issuing the next kernel, a collective): kernels queued back to back start 0.02 us after
#: the previous one ends in the LLM Level2 profile of tests/data/realdata (the 25th percentile of
#: its gaps), and to the picosecond in a simulated profile.
DEVICE_WAIT_MIN_GAP_S = 1e-6


def any_between(sorted_times_s: list[float], start_s: float, end_s: float) -> bool:
    """Whether a time of ``sorted_times_s`` (ascending) lies in ``[start_s, end_s]``: e.g. a
    collective ending in an idle gap, so the device may have waited for it rather than the host."""
    first = bisect.bisect_left(sorted_times_s, start_s)
    return first < len(sorted_times_s) and sorted_times_s[first] <= end_s

_Record = TypeVar("_Record", bound=BaseModel)
_set = object.__setattr__


def build_record(cls: type[_Record], fields: dict[str, Any]) -> _Record:
    """``cls.model_construct(**fields)`` (no validation) when ``fields`` holds every field of
    ``cls`` in the order the class declares them, without ``model_construct``'s loop over each
    field's aliases and default.

    The simulator builds one record per op (and per allocator call, :func:`build_records`), and
    that loop was a quarter of a memory-modelled run's time. ``fields`` becomes the record's ``__dict__`` (do not reuse
    it), and its order is the order ``to_json`` writes the keys in. For the record models of
    this module, which have no aliases, private attributes, ``model_post_init`` or extra fields.
    """
    record = cls.__new__(cls)
    _set(record, "__dict__", fields)
    _set(record, "__pydantic_fields_set__", set(fields))
    _set(record, "__pydantic_extra__", None)
    _set(record, "__pydantic_private__", None)
    return record


def build_records(cls: type[_Record], names: tuple[str, ...], rows: Iterable[Sequence[Any]]) -> list[_Record]:
    """:func:`build_record` for many records of ``cls``: ``names`` are every field of ``cls`` in
    its order, and each row holds their values.

    The records share one set of field names as their ``model_fields_set``: a long
    memory-modelled run makes hundreds of thousands of records, and a set apiece doubled the
    objects they bring for the garbage collector to traverse (a record's ``__dict__`` of
    numbers and strings is not tracked). Sharing is safe for the frozen record models of this
    module: pydantic changes a model's set only when a field is assigned, and copies
    (``model_copy`` too) take their own.
    """
    fields_set = set(names)
    new = cls.__new__
    records = []
    append = records.append
    for values in rows:
        record = new(cls)
        _set(record, "__dict__", dict(zip(names, values)))
        _set(record, "__pydantic_fields_set__", fields_set)
        _set(record, "__pydantic_extra__", None)
        _set(record, "__pydantic_private__", None)
        append(record)
    return records


class CommInfo(BaseModel):
    """A collective's facts, named as nccl-tests and hccl_test report them."""

    model_config = _RECORD_CONFIG
    bytes: NonNegativeInt
    algorithm: str
    group_size: int | None = Field(default=None, ge=1, description="Ranks in the group; None when the profiler "
                                   "did not record it (imported runs)")
    algbw_bytes_per_s: NonNegativeFloat
    busbw_bytes_per_s: NonNegativeFloat
    ranks: list[NonNegativeInt] = Field(default_factory=list, description="Global ranks of the group, when known")


class OpChecks(BaseModel):
    """What an op's output showed, for the correctness rules (counts of elements).

    Values (``nan_count`` ... ``max_abs_value``) are known when the op computed on tensors
    with data (:meth:`simulator.runtime.NPU.from_numpy`); ``declared_shape`` when the workload
    declared the output's shape (:meth:`~simulator.runtime.NPU.expect_shape`);
    ``out_of_bounds_elements`` for a view (:meth:`~simulator.runtime.NPU.view`) or a copy
    (:meth:`~simulator.runtime.NPU.memcpy`).
    """

    model_config = _RECORD_CONFIG
    output_shape: list[NonNegativeInt] = Field(description="Shape of the op's output (of its last output)")
    nan_count: NonNegativeInt = Field(default=0, description="NaN elements in the stored output")
    inf_count: NonNegativeInt = Field(default=0, description="+-Inf elements in the stored output")
    saturated_count: NonNegativeInt = Field(
        default=0, description="Finite results too large for fp16, saturated to +-65504 (the 910's default mode)")
    max_abs_value: NonNegativeFloat | None = Field(
        default=None, description="Largest finite absolute value as computed in float32, before the cast to the "
        "output dtype; None when no values were computed or none is finite")
    declared_shape: list[NonNegativeInt] | None = Field(
        default=None, description="Output shape the workload declared (npu.expect_shape)")
    out_of_bounds_elements: NonNegativeInt = Field(
        default=0, description="Elements a view or a copy (Memcpy) reaches past the end of its tensor's "
        "allocation (a copy: the larger overrun of its source and destination)")


class OpRecord(BaseModel):
    """One operator execution on the device.

    ``input_shapes`` are the shapes of the operator's inputs; ``source`` is ``file:line`` of
    the user code that called it.
    """

    model_config = _RECORD_CONFIG
    op_type: str
    name: str
    step: NonNegativeInt
    stream: Literal["compute", "hccl"]
    start_s: NonNegativeFloat
    duration_s: NonNegativeFloat
    flop: NonNegativeFloat
    hbm_bytes: NonNegativeFloat
    l2_bytes: NonNegativeFloat = 0.0
    block_dim: NonNegativeInt
    dma_count: NonNegativeInt
    ai_core_util_frac: NonNegativeFloat
    hbm_bandwidth_util_frac: NonNegativeFloat
    mac_ratio: NonNegativeFloat
    vec_ratio: NonNegativeFloat
    mte2_ratio: NonNegativeFloat
    input_shapes: list[list[int]]
    dtype: str
    attrs: dict[str, bool | int | float | str] = Field(default_factory=dict)
    source: str | None = None
    comm: CommInfo | None = None
    alloc_stall_s: NonNegativeFloat = Field(
        default=0.0, description="Device stall for memory before the kernel: device mallocs, or a failed "
        "allocation's synchronise, cache flush and retry (part of duration_s)")
    alloc_count: NonNegativeInt = Field(default=0, description="Allocations made for this op")
    alloc_retries: NonNegativeInt = Field(default=0, description="Allocations that flushed the cache and retried")
    device_mallocs: NonNegativeInt = 0
    device_frees: NonNegativeInt = 0
    overlapped_s: NonNegativeFloat = Field(default=0.0, description="Time the kernel's units worked at once")
    overlappable_s: NonNegativeFloat = Field(
        default=0.0, description="The most time they could have worked at once (all but the longest unit)")
    overlap_frac: float | None = Field(
        default=None, ge=0, le=1, description="DMA/compute overlap: overlapped_s / (overlappable_s + alloc_stall_s)")
    checks: OpChecks | None = Field(
        default=None, description="Output values, declared shape or view bounds, when known (correctness rules)")


class StepMemory(BaseModel):
    """The caching allocator in one step (``torch.npu.memory_stats`` names, bytes, seconds)."""

    model_config = _RECORD_CONFIG
    step: NonNegativeInt
    allocated_peak_bytes: NonNegativeInt
    reserved_peak_bytes: NonNegativeInt
    allocated_end_bytes: NonNegativeInt
    reserved_end_bytes: NonNegativeInt
    inactive_split_bytes: NonNegativeInt = Field(description="Free bytes inside split blocks (fragmentation)")
    largest_free_block_bytes: NonNegativeInt
    alloc_count: NonNegativeInt
    free_count: NonNegativeInt
    device_mallocs: NonNegativeInt
    device_frees: NonNegativeInt
    alloc_retries: NonNegativeInt
    alloc_time_s: NonNegativeFloat = Field(description="Host time spent in the allocator")


class StepTrace(BaseModel):
    """How one step's time splits, as the torch_npu profiler's ``step_trace_time.csv`` reports it
    (its columns, read from microseconds into seconds): ``computing_s`` (device compute),
    ``communication_exposed_s`` (``Communication(Not Overlapped)``), ``overlapped_s`` (communication
    hidden behind compute), ``communication_s`` (all of it), ``free_s`` (the device idle),
    ``bubble_s`` (pipeline receives), ``preparing_s`` (step start to its first device task).
    The step lasts ``computing_s + communication_exposed_s + free_s``."""

    model_config = _RECORD_CONFIG
    step: NonNegativeInt
    computing_s: NonNegativeFloat
    communication_exposed_s: NonNegativeFloat
    overlapped_s: NonNegativeFloat = 0.0
    communication_s: NonNegativeFloat = 0.0
    free_s: NonNegativeFloat
    bubble_s: NonNegativeFloat = 0.0
    preparing_s: NonNegativeFloat = 0.0

    @property
    def step_s(self) -> float:
        """The step's time: computing, exposed communication and free time add up to it."""
        return self.computing_s + self.communication_exposed_s + self.free_s


class MemoryRecord(BaseModel):
    """One caching-allocator call of a run that tracked memory (bytes, seconds).

    ``time_s`` is the device clock when the call happened; ``allocated_bytes`` and
    ``reserved_bytes`` are the device totals after it (``torch.npu.memory_allocated`` and
    ``memory_reserved``).
    """

    model_config = _RECORD_CONFIG
    step: NonNegativeInt
    time_s: NonNegativeFloat
    action: Literal["alloc", "free", "empty_cache", "reserve_pool", "release_pool", "external"]
    requested_bytes: NonNegativeInt
    block_bytes: NonNegativeInt
    address: NonNegativeInt
    pool: str
    stream: NonNegativeInt
    latency_s: NonNegativeFloat = Field(description="Host time of the call")
    device_mallocs: NonNegativeInt
    device_frees: NonNegativeInt
    alloc_retried: bool
    allocated_bytes: NonNegativeInt
    reserved_bytes: NonNegativeInt


class LiveMemory(BaseModel):
    """Device memory one kind of tensor from one call site held at the run's allocated peak
    (block bytes, as ``torch.npu.memory_allocated`` counts them)."""

    model_config = _RECORD_CONFIG
    op_type: str | None = Field(description="The op whose outputs or workspace these are; None: tensors made "
                                "by npu.tensor or npu.from_numpy")
    kind: Literal["output", "workspace", "tensor"]
    source: str | None = Field(description="file:line of the call: the op's, or npu.tensor's")
    size_bytes: NonNegativeInt
    count: int = Field(ge=1, description="Live allocations")


class MemoryPeak(BaseModel):
    """What held device memory when the run's allocated memory first reached its peak."""

    model_config = _RECORD_CONFIG
    step: NonNegativeInt
    time_s: NonNegativeFloat = Field(description="Device clock at the allocation that reached the peak")
    allocated_bytes: NonNegativeInt
    reached_by: LiveMemory = Field(description="The allocation that reached the peak (count 1)")
    live: list[LiveMemory] = Field(description="Grouped by op type, kind and call site, largest first; the sizes "
                                   "add up to allocated_bytes")


class OpSummary(BaseModel):
    """The ops of one type on one stream in one step that a focused profile did not keep.

    Sums over the ``count`` ops it stands for; pipe ratios are time-weighted means. Enough to
    compare and to time the step, not to locate single calls.
    """

    model_config = _RECORD_CONFIG
    op_type: str
    step: NonNegativeInt
    stream: Literal["compute", "hccl"]
    count: int = Field(ge=1)
    first_start_s: NonNegativeFloat
    last_end_s: NonNegativeFloat
    duration_s: NonNegativeFloat
    flop: NonNegativeFloat
    hbm_bytes: NonNegativeFloat
    dma_count: NonNegativeInt
    mac_ratio: NonNegativeFloat
    vec_ratio: NonNegativeFloat
    mte2_ratio: NonNegativeFloat
    alloc_stall_s: NonNegativeFloat = Field(default=0.0, description="Sum over the ops it stands for")
    alloc_count: NonNegativeInt = Field(default=0, description="Sum over the ops it stands for")
    overlap_frac: float | None = Field(
        default=None, ge=0, le=1, description="Time-weighted mean over its ops that have one (compute stream)")
    overlap_time_s: NonNegativeFloat = Field(default=0.0, description="Time of the ops overlap_frac averages over")


class _CommSteps:
    """The communication and exposed communication time of each step of a list of op records.

    Built in one pass over the ops (grouped by step); a step's times are worked out when first
    asked for: its compute ops' intervals sorted and merged where they overlap or touch, with
    prefix sums of the merged lengths, so that the compute time under a collective is the sum of
    the merged intervals it covers (two bisections and a difference of prefix sums) plus its two
    partial ends. O(n log n) in the step's n ops, where a scan of every merged interval for each
    collective was O(collectives x intervals) and a scan of every op for each step.
    """

    def __init__(self, ops: list[OpRecord]) -> None:
        self._ops, self._count = ops, len(ops)
        self._compute: dict[int, list[tuple[float, float]]] = {}
        self._hccl: dict[int, list[OpRecord]] = {}
        for op in ops:
            if op.stream == "compute":
                self._compute.setdefault(op.step, []).append((op.start_s, op.start_s + op.duration_s))
            elif op.stream == "hccl":
                self._hccl.setdefault(op.step, []).append(op)
        self._times_s: dict[int, tuple[float, float]] = {}

    def covers(self, ops: list[OpRecord]) -> bool:
        """True when built from this very list, unchanged in length."""
        return ops is self._ops and len(ops) == self._count

    def times_s(self, step: int) -> tuple[float, float]:
        """``(communication, exposed)`` seconds of ``step``."""
        times = self._times_s.get(step)
        if times is None:
            times = self._times_s[step] = self._work_out(step)
        return times

    def _work_out(self, step: int) -> tuple[float, float]:
        starts: list[float] = []
        ends: list[float] = []
        for start, end in sorted(self._compute.get(step, ())):
            if starts and start <= ends[-1]:
                ends[-1] = max(ends[-1], end)
            else:
                starts.append(start)
                ends.append(end)
        covered = [0.0]  # covered[k]: total length of merged intervals 0 .. k-1
        for a, b in zip(starts, ends):
            covered.append(covered[-1] + (b - a))
        total = exposed = 0.0
        for op in self._hccl.get(step, ()):
            start, end = op.start_s, op.start_s + op.duration_s
            # merged intervals first .. last-1 overlap [start, end]: the first that ends after
            # the start, up to the first that begins at or after the end (they are disjoint and
            # sorted, so the ones between lie wholly inside)
            first = bisect.bisect_right(ends, start)
            last = bisect.bisect_left(starts, end, first)
            hidden = 0.0
            if last - first == 1:
                hidden = max(0.0, min(end, ends[first]) - max(start, starts[first]))
            elif last - first > 1:
                hidden = (max(0.0, ends[first] - max(start, starts[first]))
                          + (covered[last - 1] - covered[first + 1])
                          + max(0.0, min(end, ends[last - 1]) - starts[last - 1]))
            total += op.duration_s
            exposed += max(0.0, op.duration_s - hidden)
        return total, exposed


class Profile(BaseModel):
    """Everything one run recorded.

    ``devices`` is the number of cards of the job (one rank is simulated; all ranks alike).
    ``tokens_per_step`` is set by the workload through ``npu.set_tokens_per_step``.
    ``ops`` are the recorded operators in issue order; a focused profile (:meth:`focused`)
    keeps only some of them and aggregates the rest in ``op_summaries``. Every derived view
    (step times, op times, :func:`pytest_oam.compare.summarize`) counts both.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    schema_version: Literal[1] = 1
    simulator_version: str
    hardware: str
    devices: int = Field(ge=1)
    steps: int = Field(ge=1)
    tokens_per_step: int | None = Field(default=None, ge=1)
    workload_fingerprint: str
    ops: list[OpRecord]
    op_summaries: list[OpSummary] = Field(default_factory=list)
    memory: list[StepMemory] = Field(default_factory=list, description="Per step, when the run tracked memory")
    memory_events: list[MemoryRecord] = Field(
        default_factory=list, description="Every allocator call, when the run tracked memory")
    memory_peak: MemoryPeak | None = Field(
        default=None, description="What held the memory at the run's allocated peak, when the run tracked memory")
    collection: Literal["offline", "online"] = Field(
        default="offline", description="offline: recorded and parsed after the run; online: op records went to "
        "callbacks during the run, which charged a per-op overhead to the timeline")
    focus: str | None = Field(default=None, description="Op type pattern a focused profile kept")
    context_ops: int | None = Field(default=None, ge=0)
    measured_step_times_s: list[NonNegativeFloat] | None = Field(
        default=None, description="Step times measured by a real profiler, when the op spans do not give them")
    step_trace: list[StepTrace] = Field(
        default_factory=list, description="Per step, a real profiler's split of the step time (step_trace_time.csv)")

    # -- derived views (not serialised) ---------------------------------------------------

    @cached_property
    def step_times_s(self) -> list[float]:
        """Wall time of each step: last op end minus first op start, over all streams (or the
        importer's ``measured_step_times_s``)."""
        if self.measured_step_times_s is not None:
            return list(self.measured_step_times_s)
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        spans = [(op.step, op.start_s, op.start_s + op.duration_s) for op in self.ops]
        spans += [(s.step, s.first_start_s, s.last_end_s) for s in self.op_summaries]
        for step, start, end in spans:
            if step not in first or start < first[step]:
                first[step] = start
            if step not in last or end > last[step]:
                last[step] = end
        return [last.get(s, 0.0) - first.get(s, 0.0) for s in range(self.steps)]

    @property
    def step_time_s(self) -> float:
        """Median step time in seconds."""
        return statistics.median(self.step_times_s)

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second of the whole job (``None`` if the workload set no token count)."""
        if self.tokens_per_step is None or self.step_time_s <= 0:
            return None
        return self.tokens_per_step / self.step_time_s

    @cached_property
    def _op_time_by_step(self) -> dict[str, dict[int, float]]:
        table: dict[str, dict[int, float]] = {}
        for op in [*self.ops, *self.op_summaries]:
            steps = table.setdefault(op.op_type, {})
            steps[op.step] = steps.get(op.step, 0.0) + op.duration_s
        return table

    @property
    def is_empty(self) -> bool:
        """True when the run recorded no operator at all."""
        return not self.ops and not self.op_summaries

    def focused(self, focus: str, context_ops: int = 5) -> Profile:
        """This profile with full records only around the ops matching ``focus``.

        ``focus`` is an op type or a glob pattern over op types (``"FlashAttention*"`` takes
        the backward kernels too). Each matching op and the ``context_ops`` ops issued before
        and after it keep their full :class:`OpRecord`, and so does every op with ``checks`` (the
        correctness rules need them); the others are aggregated per step, op
        type and stream into :class:`OpSummary` rows, so step and op-type times (and the gate's
        verdicts) stay exactly those of the full profile.

        Raises:
            ValueError: ``context_ops`` is negative, or no op type matches ``focus`` (the
                message lists the op types there are).
        """
        if not isinstance(context_ops, int) or context_ops < 0:
            raise ValueError(f"context_ops must be a non-negative integer, got {context_ops!r}")
        hits = [i for i, op in enumerate(self.ops) if fnmatch.fnmatchcase(op.op_type, focus)]
        if not hits:
            raise ValueError(f"focus {focus!r} matches no op type of the profile; there are: "
                             f"{', '.join(sorted(self.op_types))}")
        keep = [op.checks is not None for op in self.ops]  # correctness facts are never aggregated away
        for i in hits:
            for j in range(max(0, i - context_ops), min(len(self.ops), i + context_ops + 1)):
                keep[j] = True
        groups: dict[tuple[int, str, str], list[OpRecord]] = {}
        for op, kept in zip(self.ops, keep):
            if not kept:
                groups.setdefault((op.step, op.op_type, op.stream), []).append(op)
        summaries = list(self.op_summaries)
        for (step, op_type, stream), ops in groups.items():
            time_s = sum(op.duration_s for op in ops)
            weight = time_s or 1.0
            overlapped = [op for op in ops if op.overlap_frac is not None]
            overlap_time_s = sum(op.duration_s for op in overlapped)
            summaries.append(OpSummary(
                op_type=op_type, step=step, stream=stream, count=len(ops),
                first_start_s=min(op.start_s for op in ops),
                last_end_s=max(op.start_s + op.duration_s for op in ops),
                duration_s=time_s,
                flop=sum(op.flop for op in ops),
                hbm_bytes=sum(op.hbm_bytes for op in ops),
                dma_count=sum(op.dma_count for op in ops),
                mac_ratio=sum(op.mac_ratio * op.duration_s for op in ops) / weight,
                vec_ratio=sum(op.vec_ratio * op.duration_s for op in ops) / weight,
                mte2_ratio=sum(op.mte2_ratio * op.duration_s for op in ops) / weight,
                alloc_stall_s=sum(op.alloc_stall_s for op in ops),
                alloc_count=sum(op.alloc_count for op in ops),
                overlap_frac=(min(1.0, sum(op.overlap_frac * op.duration_s for op in overlapped) / overlap_time_s)
                              if overlap_time_s else None),
                overlap_time_s=overlap_time_s,
            ))
        return self.model_copy(update={
            "ops": [op for op, kept in zip(self.ops, keep) if kept],
            "op_summaries": summaries,
            "focus": focus,
            "context_ops": context_ops,
        })

    @property
    def op_types(self) -> list[str]:
        """Op types in order of first appearance."""
        return list(self._op_time_by_step)

    def op_time_s(self, op_type: str) -> float:
        """Total time of ``op_type`` within a step, median over the steps it ran in, in seconds.

        Counting only the steps an op type ran in keeps periodic ops (an optimizer step every
        4th step of gradient accumulation) visible instead of a median of zero.
        Returns 0.0 for an op type the profile does not contain.
        """
        per_step = self._op_time_by_step.get(op_type)
        return statistics.median(per_step.values()) if per_step else 0.0

    def op_step_times_s(self, op_type: str) -> list[float]:
        """Total time of ``op_type`` in each step it ran in, in step order (seconds)."""
        per_step = self._op_time_by_step.get(op_type, {})
        return [per_step[s] for s in sorted(per_step)]

    def op_steps(self, op_type: str) -> int:
        """Number of steps in which ``op_type`` ran."""
        return len(self._op_time_by_step.get(op_type, ()))

    @cached_property
    def _comm_steps(self) -> _CommSteps:
        return _CommSteps(self.ops)

    def comm_time_s(self, step: int) -> tuple[float, float]:
        """``(communication, exposed)`` seconds of ``step``: the time of its collectives (HCCL
        stream), and the part of it during which no compute op ran (not hidden behind compute).

        The ops are grouped by step once per profile and each step is worked out once, in
        O(n log n) for its n ops (see :class:`_CommSteps`)."""
        index = self._comm_steps
        if not index.covers(self.ops):  # a model_copy with other ops carried the original's over
            index = _CommSteps(self.ops)
            self.__dict__["_comm_steps"] = index
        return index.times_s(step)

    def comm_overlap_frac(self, step: int) -> float | None:
        """Share of ``step``'s communication time hidden behind compute (``None``: no collective)."""
        total, exposed = self.comm_time_s(step)
        return None if total <= 0 else 1.0 - exposed / total

    def ops_of(self, op_type: str) -> list[OpRecord]:
        return [op for op in self.ops if op.op_type == op_type]

    # -- serialisation ----------------------------------------------------------------------

    def to_json(self) -> str:
        """JSON text of the profile (round-trips through :meth:`from_json`)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Profile:
        """Parse a profile written by :meth:`to_json`.

        Raises:
            pydantic.ValidationError: the text is not a valid profile.
        """
        return cls.model_validate_json(text)
