"""The eager runtime: a simulated NPU that workloads call like torch_npu code calls kernels.

A workload is a plain function ``workload(npu, *args, **kwargs)``. Each operator call builds
an :class:`~simulator.costs.OpSpec`, costs it through :func:`~simulator.costs.op_cost`, and
appends an op record to the device timeline. Tensors carry shape and dtype only, unless made
with :meth:`NPU.from_numpy`: those carry data, and operators on them compute their result
(:mod:`simulator.numerics`) and record what its values showed (``OpRecord.checks``).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.util
import math
import numbers
import operator
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import __version__ as SIMULATOR_VERSION
from . import callbacks as _callbacks
from . import numerics
from .allocator import Allocation, AllocatorConfig, MemoryEvent, NpuCachingAllocator, OutOfMemoryError, format_size
from .costs import COST_MODELS, OpCost, OpSpec, conv_output_hw, op_cost, op_workspace_bytes
from .hardware import HardwareSpec, load_hardware
from .profile import (
    CommInfo,
    LiveMemory,
    MemoryPeak,
    MemoryRecord,
    OpChecks,
    OpRecord,
    Profile,
    StepMemory,
    build_record,
    build_records,
)
from .units import DTYPE_BYTES

_RUNTIME_FILE = os.path.normcase(os.path.abspath(__file__))


class ShapeError(ValueError):
    """An operator was called with shapes or arguments it cannot work with."""


@dataclass(frozen=True, eq=False, init=False)
class Tensor:
    """A device tensor: shape (elements per axis) and dtype name.

    Tensors made by an :class:`NPU` hold device memory from its caching allocator until the
    Python object is garbage-collected (or :meth:`NPU.free` is called). Two tensors are equal
    only if they are the same object, as device buffers are.

    ``data`` is ``None`` (shape only, the default and the fast path) unless the tensor was made
    with :meth:`NPU.from_numpy` or computed from such tensors: then it is a numpy array of
    ``shape`` in the storage of :data:`simulator.numerics.DATA_DTYPES` (read it with
    :meth:`NPU.to_numpy`). ``producer_index`` is the index of the op record that produced the
    tensor (``None``: made by :meth:`NPU.tensor` or :meth:`NPU.from_numpy`).
    """

    shape: tuple[int, ...]
    dtype: str = "fp16"
    data: np.ndarray | None = field(default=None, repr=False)
    producer_index: int | None = field(default=None, repr=False)

    def __init__(self, shape: tuple[int, ...], dtype: str = "fp16", data: np.ndarray | None = None,
                 producer_index: int | None = None) -> None:
        # Written into __dict__: the generated __init__ of a frozen dataclass pays one
        # object.__setattr__ per field, and every op makes tensors (the simulator's hot path).
        fields = self.__dict__
        fields["shape"] = shape
        fields["dtype"] = dtype
        fields["data"] = data
        fields["producer_index"] = producer_index

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    def __repr__(self) -> str:
        return f"Tensor({list(self.shape)}, {self.dtype})"


def _check_shape(op: str, shape: Sequence[int]) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(f"{op}: shape {shape!r} is not a sequence of integers") from None
    if not dims or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) or d <= 0 for d in dims):
        raise ShapeError(f"{op}: shape {list(dims)} must hold positive integers")
    return tuple(int(d) for d in dims)


def _check_tensors(op: str, **tensors: object) -> None:
    for label, value in tensors.items():
        if not isinstance(value, Tensor):
            raise ShapeError(
                f"{op}: {label} must be a Tensor (made with npu.tensor(shape, dtype)), got {type(value).__name__}"
            )
        if "_freed" in value.__dict__:
            raise ValueError(f"{op}: {label} {list(value.shape)} was given back with npu.free() before this op: "
                             "a use after free")


def _check_dtype(op: str, dtype: str) -> str:
    if dtype not in DTYPE_BYTES:
        raise ShapeError(f"{op}: unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return dtype


def _checks(values: numerics.Values, out_shape: Sequence[int]) -> OpChecks:
    """The correctness checks of an op whose result has ``values``."""
    return OpChecks.model_construct(
        output_shape=list(out_shape), nan_count=values.nan_count, inf_count=values.inf_count,
        saturated_count=values.saturated_count, max_abs_value=values.max_abs_value,
        declared_shape=None, out_of_bounds_elements=0)


def _keep_alive(*_: object) -> None:
    """Finalizer of a view: holding its base tensor as an argument keeps the base alive."""


def _package_dir(name: str) -> str | None:
    """The folder of installed package ``name`` (found without importing it), normalised."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return os.path.normcase(os.path.abspath(locations[0])) + os.sep if locations else None


#: Folders whose frames are library code, not the user's: the simulator and the pytest plugin.
_LIBRARY_DIRS = tuple(d for d in (os.path.dirname(_RUNTIME_FILE) + os.sep, _package_dir("pytest_oam")) if d)
#: Folders of the interpreter (standard library, site-packages, the environment's scripts): a
#: frame there is no user's line either (``python -m pytest_oam``, a thread, the ``oam`` script).
_INTERPRETER_DIRS = tuple({os.path.normcase(os.path.abspath(p)) + os.sep for p in (sys.prefix, sys.base_prefix)})


@functools.cache
def _frame_kind(filename: str) -> str:
    """Whose code a frame of ``filename`` runs, decided once per file: ``"runtime"`` (this
    module), ``"library"`` (the simulator, the pytest plugin), ``"interpreter"`` (standard
    library, site-packages, frozen modules) or ``"user"``."""
    path = os.path.normcase(filename)
    if path == _RUNTIME_FILE:
        return "runtime"
    if path.startswith(_LIBRARY_DIRS):
        return "library"
    if filename.startswith("<frozen") or os.path.normcase(os.path.abspath(filename)).startswith(_INTERPRETER_DIRS):
        return "interpreter"
    return "user"


def _call_site() -> str | None:
    """``file:line`` of the first frame outside this module (the call that issued the op). When
    that frame is library code (a bundled model builder such as ``training_step``), the first
    frame of the user's code that led to it comes first: ``user.py:12 (in .../llama.py:379)``;
    when the code that led to it is the interpreter's (``python -m pytest_oam``, the ``oam``
    script), the builder's line alone."""
    frame = sys._getframe(2)
    while frame is not None and _frame_kind(frame.f_code.co_filename) == "runtime":
        frame = frame.f_back
    if frame is None:
        return None
    site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    if _frame_kind(frame.f_code.co_filename) != "library":
        return site
    user = frame.f_back
    while user is not None and _frame_kind(user.f_code.co_filename) in ("library", "runtime"):
        user = user.f_back
    if user is None or _frame_kind(user.f_code.co_filename) == "interpreter":
        return site
    return f"{user.f_code.co_filename}:{user.f_lineno} (in {site})"


def _overlap(overlapped_s: float, overlappable_s: float, stall_s: float) -> float:
    """Share of the time an op could have overlapped DMA with compute in which it did: a stall
    waiting for memory counts as time in which nothing could be prefetched."""
    denominator = overlappable_s + stall_s
    return 1.0 if denominator <= 0 else min(1.0, overlapped_s / denominator)


def dispatch(ready_s: float, host_s: float, cost: OpCost, hw: HardwareSpec) -> tuple[float, float]:
    """Eager dispatch: when a kernel starts, and when the host can issue the next one.

    The host issues kernels one after another, ``hw.launch.host_dispatch_s`` apart (Python,
    ATen dispatch and torch_npu's aclnn call through its task queue); the device runs a kernel
    once its stream is free (``ready_s``) and the host has issued it (``host_s``). While kernels
    are longer than the host's interval the host runs ahead and costs nothing; shorter kernels
    leave the device idle between them (a host-bound run). The first kernel of a step is taken
    as issued when the step starts (``host_s`` = the step's start): its dispatch overlaps the end
    of the previous step, as in any timed loop, so a single kernel's time is the device's alone.
    An op that launches no kernel (a view) costs the host nothing here.

    Returns:
        ``(start_s, next_host_s)`` in seconds.
    """
    start_s = max(ready_s, host_s)
    return start_s, (host_s + hw.launch.host_dispatch_s if cost.kernel_count else host_s)


def _make_record(
    hw: HardwareSpec, spec: OpSpec, cost: OpCost, *, name: str, step: int, stream: str, start_s: float,
    scale: float, stall_s: float, alloc_count: int, alloc_retries: int, device_frees: int, device_mallocs: int,
    source: str | None, wait_s: float = 0.0, checks: OpChecks | None = None,
) -> OpRecord:
    """The record of one op: its cost on ``hw``, scaled by ``scale`` (fault injection), plus the
    memory stall ``stall_s`` that preceded the kernel and, for a collective, the time
    ``wait_s`` it waited for a slower rank (``attrs["wait_time_s"]``)."""
    duration_s = cost.duration_s * scale + stall_s + wait_s
    hbm_util = (
        cost.hbm_bytes / duration_s / hw.memory.hbm_bandwidth_bytes_per_s
        if duration_s > 0 and stream == "compute"
        else 0.0
    )
    comm = None
    if cost.comm is not None:
        comm = build_record(CommInfo, {
            "bytes": cost.comm.bytes,
            "algorithm": cost.comm.algorithm,
            "group_size": cost.comm.group_size,
            "algbw_bytes_per_s": cost.comm.algbw_bytes_per_s,
            "busbw_bytes_per_s": cost.comm.busbw_bytes_per_s,
            "ranks": list(spec.attr("ranks", ())),
        })
    attrs = {k: v for k, v in spec.attrs if isinstance(v, (bool, int, float, str))}
    if wait_s:
        attrs["wait_time_s"] = wait_s
    compute = stream == "compute"
    return build_record(OpRecord, {  # every field, in OpRecord's order
        "op_type": spec.op_type,
        "name": name,
        "step": step,
        "stream": stream,
        "start_s": start_s,
        "duration_s": duration_s,
        "flop": cost.flop,
        "hbm_bytes": cost.hbm_bytes,
        "l2_bytes": cost.l2_bytes,
        "block_dim": cost.block_dim,
        "dma_count": cost.dma_count,
        "ai_core_util_frac": cost.ai_core_util_frac / scale,
        "hbm_bandwidth_util_frac": hbm_util,
        "mac_ratio": cost.mac_ratio / scale,
        "vec_ratio": cost.vec_ratio / scale,
        "mte2_ratio": cost.mte2_ratio / scale,
        "input_shapes": [list(shape) for shape in spec.shapes],
        "dtype": spec.dtype,
        "attrs": attrs,
        "source": source,
        "comm": comm,
        "alloc_stall_s": stall_s,
        "alloc_count": alloc_count,
        "alloc_retries": alloc_retries,
        "device_mallocs": device_mallocs,
        "device_frees": device_frees,
        "overlapped_s": cost.overlapped_s * scale,
        "overlappable_s": cost.overlappable_s * scale,
        "overlap_frac": _overlap(cost.overlapped_s, cost.overlappable_s, stall_s) if compute else None,
        "checks": checks,
    })


def _check_scale(op_time_scale: dict[str, float] | None, known: Collection[str],
                 known_as: str = "an op type") -> dict[str, float]:
    """``op_time_scale`` checked: every factor positive and finite, every key an op type in
    ``known`` (a typo would otherwise scale nothing, and a gate test would pass for the wrong
    reason).

    Raises:
        ValueError: a factor that is not a positive number, or an unknown op type.
    """
    scale = dict(op_time_scale or {})
    for op_type, factor in scale.items():
        if op_type not in known:
            near = difflib.get_close_matches(str(op_type), sorted(known), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]!r}? op types are case-sensitive)" if near else ""
            raise ValueError(f"op_time_scale: {op_type!r} is not {known_as}{hint} (exact op type names, no patterns)")
        if isinstance(factor, bool) or not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"op_time_scale[{op_type!r}] must be a positive number, got {factor!r}")
    return scale


def recost(profile: Profile, hardware: str | HardwareSpec, op_time_scale: dict[str, float] | None = None) -> Profile:
    """The recorded op sequence of ``profile`` simulated again on ``hardware`` (a what-if).

    Each op is costed from its recorded type, input shapes, dtype and attributes (a collective
    from its recorded ranks) and placed on its stream as in :func:`run`: compute in order, the
    collectives in order on the HCCL stream (blocking ones holding compute, asynchronous ones
    beside it), a compute op that followed a ``Work.wait()`` after the collective it waited
    for, and every step starting synchronised. Waits for slower ranks are kept as recorded.
    Memory is not
    simulated again: each op keeps its recorded allocation stall, and the memory statistics
    and events are carried over unchanged, as are the ops' ``checks`` (values do not depend on
    the hardware's speed). A profile recorded online keeps its per-op overhead.

    Raises:
        ValueError: unknown hardware; a focused profile (its aggregated ops have no shapes); an
            imported profile or an op type with no cost model; an op the hardware cannot run
            (e.g. a dtype its Cube unit has no rate for), naming the op.
    """
    spec_hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    if profile.op_summaries:
        raise ValueError("a focused profile keeps only some op records (the rest are aggregated without shapes); "
                         "re-simulating needs the full op sequence")
    scale = _check_scale(op_time_scale, profile.op_types, "an op type of this profile")
    overhead_s = spec_hw.profiler.online_callback_overhead_s if profile.collection == "online" else 0.0
    cache: dict[OpSpec, OpCost] = {}
    records: list[OpRecord] = []
    clock_s = hccl_s = host_s = 0.0
    step = profile.ops[0].step if profile.ops else 0
    for op in profile.ops:
        if op.step != step:  # steps end synchronised, as in the run
            clock_s, step = max(clock_s, hccl_s), op.step
            host_s = clock_s
        attrs = {k: v for k, v in op.attrs.items() if k != "wait_time_s"}
        if op.comm is not None and op.comm.ranks:
            attrs["ranks"] = tuple(op.comm.ranks)
        spec = OpSpec(op.op_type, tuple(tuple(s) for s in op.input_shapes), op.dtype, tuple(sorted(attrs.items())))
        cost = cache.get(spec)
        if cost is None:
            try:
                cost = cache[spec] = op_cost(spec, spec_hw)
            except (KeyError, ValueError) as exc:
                where = f" at {op.source}" if op.source else ""
                raise ValueError(f"op {op.name} ({op.op_type}, shapes {op.input_shapes}, {op.dtype}){where}: "
                                 f"cannot be simulated on {spec_hw.name}: {exc}") from None
        if op.stream == "hccl":
            ready_s = max(clock_s, hccl_s)
        else:
            waited = op.attrs.get("wait_hccl_op")
            if isinstance(waited, int) and 0 <= waited < len(records):
                done = records[waited]
                clock_s = max(clock_s, done.start_s + done.duration_s)
            ready_s = clock_s
        start_s, host_s = dispatch(ready_s, host_s, cost, spec_hw)
        record = _make_record(
            spec_hw, spec, cost, name=op.name, step=op.step, stream=op.stream, start_s=start_s,
            scale=scale.get(op.op_type, 1.0), stall_s=op.alloc_stall_s, alloc_count=op.alloc_count,
            alloc_retries=op.alloc_retries, device_frees=op.device_frees, device_mallocs=op.device_mallocs,
            source=op.source, wait_s=float(op.attrs.get("wait_time_s", 0.0)), checks=op.checks,
        )
        records.append(record)
        end_s = start_s + record.duration_s
        if op.stream == "hccl":
            hccl_s = end_s
            if not op.attrs.get("async_op"):
                clock_s = end_s
        else:
            clock_s = end_s
        clock_s += overhead_s  # the host's callback delays the next issue, whatever the stream
    fields = {name: getattr(profile, name) for name in Profile.model_fields}
    # not model_copy: it would carry over the cached step times of the original
    return Profile.model_construct(**{**fields, "hardware": spec_hw.name, "simulator_version": SIMULATOR_VERSION,
                                      "ops": records})


class Work:
    """An asynchronous collective (``async_op=True``), as ``torch.distributed`` returns one.

    The collective runs on the HCCL stream while the compute stream goes on; :meth:`wait`
    makes the compute stream wait for it (and, the HCCL stream being in order, for every
    collective issued before it).
    """

    def __init__(self, npu: NPU, index: int, end_s: float, result: Tensor) -> None:
        self._npu, self._index, self._end_s, self.result = npu, index, end_s, result

    def wait(self) -> Tensor:
        """Block the compute stream until the collective is done; returns its result tensor."""
        self._npu._wait_for(self._index, self._end_s)
        return self.result


def _copies(group: tuple[int, ...], devices: int) -> list[tuple[int, ...]]:
    """The groups that run the same collective at the same time: ``group`` shifted over the
    ranks (a tensor-parallel group 0-3 of 8 cards has the copy 4-7; a data-parallel group
    0, 4 has 1, 5 and 2, 6 and 3, 7), as long as the copies stay disjoint."""
    copies, covered = [], set()
    for offset in range(devices):
        shifted = tuple(r + offset for r in group)
        if max(shifted) < devices and covered.isdisjoint(shifted):
            copies.append(shifted)
            covered.update(shifted)
    return copies


#: Where each field of a :class:`MemoryEvent` sits in a noted allocator call: ``(step, device
#: clock) + event``, a plain tuple of numbers and strings (see :meth:`NPU._note_memory`).
_CALL_INDEX = {name: 2 + i for i, name in enumerate(MemoryEvent._fields)}
#: Without memory modelling: references of tensors that went, queued before they are settled.
_SETTLE_BATCH = 1024
_MEMORY_RECORD_FIELDS = tuple(MemoryRecord.model_fields)  # step, time_s, then fields of the event
_memory_record_values = operator.itemgetter(0, 1, *(_CALL_INDEX[name] for name in _MEMORY_RECORD_FIELDS[2:]))


class _HeldMemory(weakref.ref):
    """A weak reference to a tensor that holds device memory: the allocation, and the tensor's
    id (its key in ``NPU._finalizers``). Its callback, :meth:`NPU._release`, gives the memory
    back when the tensor goes; one object per tensor, where a plain reference took a partial of
    a bound method too."""

    __slots__ = ("handle", "key")

    def __new__(cls, tensor: Tensor, callback: Callable[[_HeldMemory], None], handle: Allocation):
        return super().__new__(cls, tensor, callback)  # weakref.ref takes the referent and the callback only

    def __init__(self, tensor: Tensor, callback: Callable[[_HeldMemory], None], handle: Allocation) -> None:
        super().__init__(tensor, callback)
        self.handle = handle
        self.key = id(tensor)


class _StepMemoryTally:
    """Allocator activity within one step, summed over its noted calls when the step closes."""

    def __init__(self, calls: Iterable[tuple]) -> None:
        self.allocs = self.frees = self.device_mallocs = self.device_frees = self.retries = 0
        self.alloc_time_s = 0.0
        action, mallocs, frees, retried, latency = (
            _CALL_INDEX[name] for name in ("action", "device_mallocs", "device_frees", "alloc_retried", "latency_s"))
        for call in calls:
            if call[action] == "alloc":
                self.allocs += 1
            elif call[action] == "free":
                self.frees += 1
            self.device_mallocs += call[mallocs]
            self.device_frees += call[frees]
            self.retries += int(call[retried])
            self.alloc_time_s += call[latency]


class NPU:
    """One simulated Ascend card of a ``devices``-card job (this card is rank 0).

    Operators return new :class:`Tensor` objects and advance the device clock by their cost.

    Args:
        hardware: the spec of the card.
        devices: number of cards in the job; collectives default to all of them. A count HCCL
            does not support on the hardware's servers (``interconnect.hccl_server_device_counts``
            in one server, else whole servers) raises ``ValueError``.
        op_time_scale: fault injection for testing gates: multiply the duration of the named
            op types (e.g. ``{"FlashAttention": 1.05}``). Factors must be positive.
        collection: ``"offline"`` or ``"online"``, see :mod:`simulator.callbacks`.
        slow_ranks: stragglers, ``{rank: factor}``: that rank's compute takes ``factor`` times
            as long (>= 1); every rank of a collective waits for the slowest member, so rank 0
            (the simulated one) sees the wait in its collectives (``attrs["wait_time_s"]``), or,
            when rank 0 itself is slow, in its own kernels.
        degraded_links: ``{(rank_a, rank_b): frac}``: the link between two cards works at
            ``frac`` (0 < frac <= 1) of its bandwidth; a collective over a group holding both
            is bounded by it (``attrs["link_bandwidth_frac"]``).
    """

    def __init__(
        self,
        hardware: HardwareSpec,
        devices: int = 1,
        op_time_scale: dict[str, float] | None = None,
        allocator: AllocatorConfig | str | None = None,
        memory: bool = False,
        collection: str = "offline",
        slow_ranks: dict[int, float] | None = None,
        degraded_links: dict[tuple[int, int], float] | None = None,
    ) -> None:
        self.collection = _callbacks.check_collection(collection)
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be a positive integer, got {devices!r}")
        hardware.interconnect.check_device_count(devices, hardware.name)
        self.hardware = hardware
        self.devices = devices
        self.rank = 0
        self._scale = _check_scale(op_time_scale, COST_MODELS)
        self._records: list[OpRecord] = []
        self._cost_cache: dict[OpSpec, OpCost] = {}
        self._workspace_cache: dict[OpSpec, int] = {}
        self._clock_s = 0.0
        self._step = 0
        self.tokens_per_step: int | None = None
        if isinstance(allocator, str):
            allocator = AllocatorConfig.from_conf_string(allocator)
        elif allocator is not None and not isinstance(allocator, AllocatorConfig):
            raise TypeError(f"allocator must be a PYTORCH_NPU_ALLOC_CONF string such as 'max_split_size_mb:128' "
                            f"or an AllocatorConfig, got {allocator!r}")
        self.memory = bool(memory or allocator is not None)
        self.allocator = NpuCachingAllocator(hardware, allocator) if self.memory else None
        #: Without memory modelling: the bytes of the tensors this NPU made (and of its HCCL
        #: communicators' buffers), a lower bound of what the caching allocator would hold once
        #: the tensors that went are settled (_settle), so that a workload past the card's HBM is
        #: out of memory in every mode (see _allocate). Each tracked tensor has a weak reference
        #: in _tracked, to its bytes, whose callback is _gone.append: a C call that queues the
        #: reference when the tensor goes, settled in batches (and whenever the total would pass
        #: the capacity). No Python call per tensor: a _HeldMemory (its __init__) and a Python
        #: callback cost twice as much. All told the tracking costs a default Llama-2-7B run
        #: about 4 to 6 % more interpreter instructions (callgrind, issue 20).
        self._live_bytes = 0
        self._hbm_capacity_bytes = hardware.memory.hbm_capacity_bytes
        self._tracked: dict[weakref.ref, int] = {}
        self._gone: list[weakref.ref] = []
        self._gone_callback = self._gone.append
        self._pending_stall_s = 0.0
        self._pending_allocs = self._pending_retries = self._pending_device_frees = self._pending_device_mallocs = 0
        self._memory_steps: list[StepMemory] = []
        #: For each live tensor holding memory (by id): a weak reference whose callback gives
        #: the memory back when the tensor goes. Held here, not in weakref.finalize's registry,
        #: whose strong references to this NPU kept every memory-modelling NPU alive as long as
        #: one of its tensors was (the job-long tensors of simulator.models: for ever).
        self._finalizers: dict[int, _HeldMemory] = {}
        self._release_callback = self._release  # one bound method for every tensor's reference
        self._communicators: set[frozenset[int]] = set()  # HCCL groups used so far
        #: Every allocator call, as ``(step, device clock) + event`` (:meth:`_note_memory`).
        self._memory_calls: list[tuple] = []
        self._step_first_call = 0  # index in _memory_calls of the open step's first call
        #: For each view: the tensor that owns its allocation, and the view's offset in it.
        self._views: weakref.WeakKeyDictionary[Tensor, tuple[Tensor, int]] = weakref.WeakKeyDictionary()
        self._delivered = 0  # online collection: records handed to the callbacks so far
        self._hccl_clock_s = 0.0  # the HCCL stream: collectives run in order, beside compute
        self._host_s = 0.0  # when the host can issue the next kernel (see dispatch())
        self._last_hccl: int | None = None  # index of the last collective's record
        self._recv_ready_s: float | None = None  # the peer's send time of the Receive being issued
        self._pending_wait: int | None = None  # a Work.wait() the next compute op records
        self._slow = self._check_slow_ranks(slow_ranks or {})
        self._links = self._check_links(degraded_links or {})
        # Straggler model: each rank's lag behind rank 0, in seconds (only with slow ranks or links).
        # A rank's lag is _lag_base + _lag[rank] (rank 0's is 0 by definition); the shared base
        # keeps the per-op update O(slow ranks) when rank 0 itself is slow.
        self._lag: list[float] | None = [0.0] * devices if (self._slow or self._links) else None
        self._lag_base = 0.0
        self._own_factor = self._slow.get(0, 1.0)  # rank 0's own compute slowdown

    # -- bookkeeping -----------------------------------------------------------------------

    def set_tokens_per_step(self, tokens: int) -> None:
        """Declare how many tokens one step processes (for tokens/s in reports)."""
        if not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"tokens per step must be a positive integer, got {tokens!r}")
        self.tokens_per_step = tokens

    def tensor(self, shape: Sequence[int], dtype: str = "fp16") -> Tensor:
        """A tensor of ``shape`` and ``dtype`` on the device (its memory comes from the caching
        allocator; a device stall that allocation causes is charged to the next op).

        Raises:
            ShapeError: a bad shape or dtype.
            OutOfMemoryError: the card's HBM cannot hold it even after the cache is freed
                (without memory modelling: with the live tensors it would exceed the HBM).
        """
        tensor = Tensor(_check_shape("tensor", shape), _check_dtype("tensor", dtype))
        self._allocate(tensor, charge_last=False)
        return tensor

    def from_numpy(self, array: object, dtype: str = "fp16") -> Tensor:
        """A device tensor holding a copy of ``array``'s values converted to ``dtype``.

        The conversion is the host's, as ``torch.from_numpy(a).to(dtype)``: fp16 through numpy
        ``float16`` (round to nearest even; a value beyond +-65504 becomes +-Inf, no
        saturation here), bf16 by rounding float32 to bfloat16 with round-to-nearest-even on
        the top 16 bits (:func:`simulator.numerics.round_bf16`, kept in a float32 array), fp32
        as float32, int32 by numpy's ``astype`` (floats truncated toward zero). Operators on
        tensors with data compute their results (see :mod:`simulator.numerics`); the shape is
        ``array``'s, memory is allocated as :meth:`tensor` does, and no op is recorded.

        Raises:
            ShapeError: ``dtype`` is not fp16, bf16, fp32 or int32; ``array`` is not numeric
                (bool, int, float) or has no elements or no axis.
            OutOfMemoryError: as :meth:`tensor`.
        """
        if dtype not in numerics.DATA_DTYPES:
            raise ShapeError(f"from_numpy: dtype {dtype!r} cannot carry data; use one of "
                             f"{', '.join(numerics.DATA_DTYPES)}")
        source = np.asarray(array)
        if source.dtype.kind not in "biuf":
            raise ShapeError(f"from_numpy: array must hold numbers, got numpy dtype {source.dtype}")
        shape = _check_shape("from_numpy", source.shape)
        if dtype == "int32":
            info = np.iinfo(np.int32)
            with np.errstate(all="ignore"):
                wide = source.astype(np.float64) if source.dtype.kind == "f" else source
                outside = int(np.count_nonzero(~np.isfinite(wide) | (wide < info.min) | (wide > info.max))) \
                    if source.dtype.kind == "f" else int(np.count_nonzero((wide < info.min) | (wide > info.max)))
            if outside:
                raise ShapeError(f"from_numpy: {outside} values do not fit in int32 ({info.min}..{info.max})")
        if dtype == "bf16":
            data = numerics.round_bf16(source.astype(np.float32))
        else:
            with np.errstate(all="ignore"):
                data = source.astype(numerics.DATA_DTYPES[dtype])  # astype copies
        tensor = Tensor(shape, dtype, data)
        self._allocate(tensor, charge_last=False)
        return tensor

    @staticmethod
    def to_numpy(tensor: Tensor) -> np.ndarray:
        """A copy of ``tensor``'s data (numpy float16 for fp16, float32 for bf16 and fp32, int32).

        Raises:
            ShapeError: ``tensor`` is not a Tensor.
            ValueError: ``tensor`` carries no data: only tensors made with :meth:`from_numpy`
                and the results of ops computed on them do (op types with a reference kernel in
                :data:`simulator.numerics.KERNELS`, every input carrying data).
        """
        _check_tensors("to_numpy", tensor=tensor)
        if tensor.data is None:
            raise ValueError(
                f"to_numpy: {tensor!r} carries no data: only tensors made with npu.from_numpy and the results "
                f"of ops whose inputs all carry data do (op types that compute: {', '.join(numerics.KERNELS)})")
        return tensor.data.copy()

    def expect_shape(self, tensor: Tensor, shape: Sequence[int]) -> Tensor:
        """Declare that ``tensor``, an operator's output, should have ``shape``; returns ``tensor``.

        A mismatch is recorded, not raised: the record of the op that produced ``tensor`` gets
        ``checks.declared_shape`` and ``checks.output_shape``, and the ``shape-mismatch`` rule
        reports that op at its call site. When several outputs of one op are checked, a
        mismatch stays recorded over later matches.

        Raises:
            ShapeError: ``tensor`` is not a Tensor, ``shape`` is not a shape.
            ValueError: ``tensor`` was not produced by an operator of this NPU (made by
                :meth:`tensor` or :meth:`from_numpy`).
        """
        _check_tensors("expect_shape", tensor=tensor)
        declared = _check_shape("expect_shape", shape)
        index = tensor.producer_index
        if index is None or index >= len(self._records):
            raise ValueError(f"expect_shape: {tensor!r} was not produced by an operator of this NPU "
                             "(tensors made with npu.tensor or npu.from_numpy have the shape they were given)")
        record = self._records[index]
        old = record.checks
        if old is not None and old.declared_shape is not None and old.declared_shape != old.output_shape:
            return tensor  # keep the mismatch already recorded
        update = {"output_shape": list(tensor.shape), "declared_shape": list(declared)}
        checks = old.model_copy(update=update) if old is not None else OpChecks.model_construct(
            nan_count=0, inf_count=0, saturated_count=0, max_abs_value=None, out_of_bounds_elements=0, **update)
        self._records[index] = record.model_copy(update={"checks": checks})
        return tensor

    def view(self, tensor: Tensor, offset_elements: int, shape: Sequence[int], *, name: str | None = None) -> Tensor:
        """A tensor of ``shape`` over ``tensor``'s allocation from element ``offset_elements``
        (op type ``View``: host metadata, no kernel, zero device time).

        A view that reaches past the allocation (``offset_elements + numel(shape) >
        tensor.numel``; for a view of a view, past the allocation underneath) is recorded, not
        raised: its record has
        ``checks.out_of_bounds_elements``, and the ``out-of-bounds`` rule reports it. The view
        shares ``tensor``'s memory (and keeps it alive); it carries ``tensor``'s values when
        ``tensor`` has data and the view stays in bounds (past the end there are no values).

        Raises:
            ShapeError: ``tensor`` is not a Tensor, ``shape`` is not a shape, or
                ``offset_elements`` is not an integer >= 0.
        """
        _check_tensors("View", tensor=tensor)
        dims = _check_shape("View", shape)
        if isinstance(offset_elements, bool) or not isinstance(offset_elements, numbers.Integral) or offset_elements < 0:
            raise ShapeError(f"View: offset_elements must be an integer >= 0, got {offset_elements!r}")
        offset = int(offset_elements)
        numel = math.prod(dims)
        # a view of a view is bounded by the allocation underneath, not by the outer view
        root, root_offset = self._views.get(tensor, (tensor, 0))
        absolute = root_offset + offset
        past = max(0, absolute + numel - root.numel)
        checks = OpChecks.model_construct(
            output_shape=list(dims), nan_count=0, inf_count=0, saturated_count=0, max_abs_value=None,
            declared_shape=None, out_of_bounds_elements=past)
        attrs = {"offset_elements": offset}
        if root is not tensor:
            attrs.update(allocation_offset_elements=absolute, allocation_elements=root.numel)
        self._emit("View", (tensor,), tensor.dtype, name, attrs, checks=checks)
        data = None
        if root.data is not None and not past:
            data = root.data.reshape(-1)[absolute:absolute + numel].reshape(dims)
        out = Tensor(dims, tensor.dtype, data, len(self._records) - 1)
        self._views[out] = (root, absolute)
        if self.allocator is not None:
            weakref.finalize(out, _keep_alive, tensor)  # the base's memory lives as long as the view
        return out

    def memcpy(self, dst: Tensor, src: Tensor, nbytes: int, *, dst_offset_bytes: int = 0, src_offset_bytes: int = 0,
               name: str | None = None) -> Tensor:
        """Copy ``nbytes`` bytes from ``src`` (from byte ``src_offset_bytes``) into ``dst`` (from
        byte ``dst_offset_bytes``) on the device, as ``aclrtMemcpy(dst + dst_offset, ...,
        src + src_offset, nbytes, ACL_MEMCPY_DEVICE_TO_DEVICE)`` or
        ``dst.view(-1)[a:b].copy_(src.view(-1)[c:d])`` do; returns ``dst``.

        Op type ``Memcpy``, costed as a DMA data move (:func:`simulator.costs.memcpy_cost`). The
        offsets count from the start of the tensor; for a view (:meth:`view`) the allocation
        underneath bounds the copy. A copy that reads past ``src``'s allocation or writes past
        ``dst``'s is recorded, not raised: its record has ``checks.out_of_bounds_elements``
        (the larger overrun of the two sides, in elements) and attributes
        ``src_past_bytes`` / ``dst_past_bytes``, and the ``out-of-bounds`` rule reports it.
        When both tensors carry data (:meth:`from_numpy`) and the copy stays in bounds, ``dst``'s
        values (and those of views sharing its memory) are overwritten with ``src``'s, and the
        record's checks count NaN and Inf among the copied values; an in-bounds copy from a
        ``src`` without values leaves ``dst`` and its views without values; an out-of-bounds
        copy changes no values (what lies past an allocation is not modelled).

        Raises:
            ShapeError: ``dst`` or ``src`` is not a Tensor, their dtypes differ (a byte copy
                between dtypes reinterprets bits, which is not modelled: :meth:`cast` first), or
                ``nbytes`` and the offsets are not integers, whole elements of the dtype, with
                ``nbytes`` > 0 and the offsets >= 0.
        """
        _check_tensors("Memcpy", dst=dst, src=src)
        if dst.dtype != src.dtype:
            raise ShapeError(f"Memcpy: src is {src.dtype} but dst is {dst.dtype}; a byte copy between dtypes "
                             "reinterprets the bits: npu.cast the source first")
        elt = DTYPE_BYTES[dst.dtype]
        sizes = {"nbytes": nbytes, "dst_offset_bytes": dst_offset_bytes, "src_offset_bytes": src_offset_bytes}
        for label, value in sizes.items():
            if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < (label == "nbytes")
                    or value % elt):
                raise ShapeError(f"Memcpy: {label} must be an integer {'> 0' if label == 'nbytes' else '>= 0'} "
                                 f"and a multiple of {elt} ({dst.dtype} elements), got {value!r}")
        nbytes, dst_offset, src_offset = int(nbytes), int(dst_offset_bytes), int(src_offset_bytes)
        sides = {}
        for label, tensor, offset in (("dst", dst, dst_offset), ("src", src, src_offset)):
            root, root_offset = self._views.get(tensor, (tensor, 0))
            start = root_offset * elt + offset  # byte offset into the allocation underneath
            sides[label] = (root, start, max(0, start + nbytes - root.nbytes))
        attrs: dict[str, object] = {"nbytes": nbytes, "dst_offset_bytes": dst_offset, "src_offset_bytes": src_offset}
        past_bytes = max(past for _, _, past in sides.values())
        checks = None
        if past_bytes:
            for label, (root, start, past) in sides.items():
                attrs.update({f"{label}_allocation_bytes": root.nbytes, f"{label}_allocation_offset_bytes": start,
                              f"{label}_past_bytes": past})
            checks = OpChecks.model_construct(
                output_shape=list(dst.shape), nan_count=0, inf_count=0, saturated_count=0, max_abs_value=None,
                declared_shape=None, out_of_bounds_elements=-(-past_bytes // elt))
        (dst_root, dst_start, _), (src_root, src_start, _) = sides["dst"], sides["src"]
        values = None
        if not past_bytes and dst_root.data is not None and src_root.data is not None:
            values = src_root.data.reshape(-1)[src_start // elt:(src_start + nbytes) // elt].copy()
            checks = _checks(numerics.store(values, dst.dtype), [values.size])  # the copied values' NaN, Inf
        self._emit("Memcpy", (dst, src), dst.dtype, name, attrs, checks=checks)
        if values is not None:
            dst_root.data.flat[dst_start // elt:dst_start // elt + values.size] = values  # in place: views see it
        elif not past_bytes and dst_root.data is not None:
            # a copy from a tensor without values: what dst now holds is unknown, so dst and the
            # views of its memory carry no values any more (as an op's output would not)
            for tensor in [dst_root, *(v for v, (root, _) in self._views.items() if root is dst_root)]:
                tensor.__dict__["data"] = None
        return dst

    def free(self, tensor: Tensor) -> None:
        """Give ``tensor``'s memory back to the caching allocator now (as ``del`` does when the
        last reference goes; without memory modelling its bytes leave the live total). An op
        that is later given ``tensor`` raises ``ValueError`` (a use after free), in either mode."""
        held = self._finalizers.get(id(tensor))
        if held is not None:
            self._release(held)  # the reference, no longer registered, then gives nothing back
            tensor.__dict__["_freed"] = True  # a later op that reads or writes it is a use after free
        elif self.allocator is None and isinstance(tensor, Tensor):
            nbytes = self._tracked.pop(weakref.ref(tensor), None)  # equal to the tracking reference
            if nbytes is not None:
                self._live_bytes -= nbytes
                tensor.__dict__["_freed"] = True

    # -- memory --------------------------------------------------------------------------------

    def _allocate(self, tensor: Tensor, *, charge_last: bool = True) -> Tensor:
        """Give ``tensor`` device memory; free it when the object goes away. A device-visible
        stall (a device malloc, or a failed allocation's synchronise, cache flush and retry)
        lengthens the op that produced the tensor (``charge_last``) or the next op.

        Without memory modelling the tensor's bytes count in the live total until it goes.

        Raises:
            OutOfMemoryError: the card's HBM cannot hold it (with memory modelled: as the caching
                allocator decides; without: the live tensors' bytes would exceed the capacity).
        """
        if self.allocator is None:
            nbytes = math.prod(tensor.shape) * DTYPE_BYTES[tensor.dtype]
            if self._live_bytes + nbytes > self._hbm_capacity_bytes or len(self._gone) > _SETTLE_BATCH:
                self._settle()
                if self._live_bytes + nbytes > self._hbm_capacity_bytes:
                    self._check_capacity(nbytes, self._tensor_what(tensor))
            self._live_bytes += nbytes
            self._tracked[weakref.ref(tensor, self._gone_callback)] = nbytes
            return tensor
        handle, event = self.allocator.alloc(tensor.nbytes)
        producer = tensor.producer_index
        if producer is None:
            self._note_memory(event, "tensor", _call_site())
        else:
            self._note_memory(event, "output", producer)
        held = _HeldMemory(tensor, self._release_callback, handle)
        self._finalizers[held.key] = held
        self._charge(event, charge_last)
        return tensor

    def _charge(self, event: MemoryEvent, charge_last: bool = True) -> None:
        """Charge a device-visible allocation stall to the op just emitted (``charge_last``, when
        it belongs to this step) or to the next op."""
        device_visible = event.device_mallocs or event.device_frees or event.synchronizations or event.alloc_retried
        stall = event.latency_s if device_visible else 0.0
        if not device_visible:
            pass  # a cache hit: host bookkeeping, hidden behind the device's queue
        elif charge_last and self._records and self._records[-1].step == self._step:
            record = self._records[-1]
            compute = record.stream == "compute"
            self._records[-1] = record.model_copy(update={
                "duration_s": record.duration_s + stall,
                "alloc_stall_s": record.alloc_stall_s + stall,
                "alloc_count": record.alloc_count + 1,
                "alloc_retries": record.alloc_retries + int(event.alloc_retried),
                "device_frees": record.device_frees + event.device_frees,
                "device_mallocs": record.device_mallocs + event.device_mallocs,
                "overlap_frac": (_overlap(record.overlapped_s, record.overlappable_s, record.alloc_stall_s + stall)
                                 if compute else record.overlap_frac),
            })
            if compute:
                self._clock_s += stall
            else:
                # a collective's output: the collective (and a blocking caller) waited for it,
                # rather than the next step's first op
                self._hccl_clock_s += stall
                if not record.attrs.get("async_op"):
                    self._clock_s = max(self._clock_s, self._hccl_clock_s)
        else:
            self._pending_stall_s += stall
            self._pending_allocs += 1
            self._pending_retries += int(event.alloc_retried)
            self._pending_device_frees += event.device_frees
            self._pending_device_mallocs += event.device_mallocs

    def _workspace(self, op_type: str, inputs: Sequence[Tensor], dtype: str, fusion: bool) -> None:
        """The kernel's workspace (:func:`simulator.costs.op_workspace_bytes`), as torch_npu's
        default task queue takes it: a caching-allocator block allocated after the op's outputs,
        right before the kernel is queued, and freed once it is. Its stall (a device malloc, or a
        flush and retry) is charged to the op just emitted."""
        spec = OpSpec(op_type, tuple(t.shape for t in inputs), dtype, (("fusion", bool(fusion)),))
        size = self._workspace_cache.get(spec)
        if size is None:
            size = self._workspace_cache[spec] = op_workspace_bytes(spec, self.hardware)
        if not size:
            return
        if self.allocator is None:  # taken and given back around the kernel
            if self._live_bytes + size > self._hbm_capacity_bytes:
                self._settle()
                record = self._records[-1]
                self._check_capacity(size, f"the workspace of {record.op_type} {record.name!r} (at {record.source})")
            return
        handle, event = self.allocator.alloc(size)
        self._note_memory(event, "workspace", len(self._records) - 1)
        self._charge(event)
        self._note_memory(self.allocator.free(handle))

    def _release(self, held: _HeldMemory) -> None:
        """Give ``held``'s memory back: called by :meth:`free` or by the weak reference itself
        when the tensor goes. A reference that is no longer the registered one (the tensor was
        freed explicitly, or its id now belongs to another tensor) gives nothing back."""
        if self._finalizers.get(held.key) is not held:
            return
        del self._finalizers[held.key]
        self._note_memory(self.allocator.free(held.handle))

    def _settle(self) -> None:
        """Without memory modelling: the bytes of the tracked tensors that went since the last
        call leave the live total (a reference no longer tracked, of a tensor given back by
        :meth:`free`, takes nothing)."""
        tracked, gone = self._tracked, self._gone
        freed = 0
        for ref in gone:
            freed += tracked.pop(ref, 0)
        gone.clear()
        self._live_bytes -= freed

    def _tensor_what(self, tensor: Tensor) -> str:
        """What made ``tensor``, for an out-of-memory message: the op (type, name, call site) or
        the call of :meth:`tensor` / :meth:`from_numpy`; with its shape and dtype."""
        index = tensor.producer_index
        if index is None:
            made = f"a tensor made at {_call_site()}"
        else:
            record = self._records[index]
            made = f"the output of {record.op_type} {record.name!r} (at {record.source})"
        return f"{made}, shape {list(tensor.shape)} {tensor.dtype}"

    def _check_capacity(self, nbytes: int, what: str) -> None:
        """Without memory modelling: raise when ``nbytes`` more (for ``what``) would take the
        live bytes past the card's HBM capacity.

        Raises:
            OutOfMemoryError: they would; the message names ``what``, the bytes and the capacity.
        """
        live, capacity = self._live_bytes, self._hbm_capacity_bytes
        if live + nbytes <= capacity:
            return
        held = (f"{format_size(live)} ({live} bytes) already held by live tensors and HCCL buffers, "
                f"{format_size(max(0, capacity - live))} free" if live else "nothing else held")
        raise OutOfMemoryError(
            f"NPU out of memory. Tried to allocate {format_size(nbytes)} ({nbytes} bytes) for {what}; "
            f"{self.hardware.name} has {format_size(capacity)} ({capacity} bytes) of HBM, {held}. Checked "
            "without memory modelling (memory=False): live tensors only, a lower bound of what the caching "
            "allocator needs (memory=True models it)",
            requested_bytes=nbytes)

    def _check_inputs_fit(self, op_type: str, name: str | None, inputs: Sequence[Tensor]) -> None:
        """An op cannot read an input larger than the card's HBM, wherever the tensor came from
        (a ``Tensor`` made directly holds no memory of this NPU). Checked once per op spec.

        Raises:
            OutOfMemoryError: an input is larger than the HBM capacity.
        """
        capacity = self._hbm_capacity_bytes
        for i, t in enumerate(inputs):
            nbytes = math.prod(t.shape) * DTYPE_BYTES.get(t.dtype, 0)  # an unknown dtype: op_cost says so
            if nbytes > capacity:
                raise OutOfMemoryError(
                    f"NPU out of memory. {op_type} {name or op_type!r} (at {_call_site()}) reads input {i + 1}, "
                    f"shape {list(t.shape)} {t.dtype}, of {format_size(nbytes)} ({nbytes} bytes); "
                    f"{self.hardware.name} has {format_size(capacity)} ({capacity} bytes) of HBM",
                    requested_bytes=nbytes)

    def _note_memory(self, event: MemoryEvent, kind: str | None = None, owner: int | str | None = None) -> None:
        """Keep an allocator call for the step's tally and the profile's memory records, as a
        plain tuple: one of numbers and strings only, which the garbage collector stops
        tracking (a long run keeps hundreds of thousands of them; records, each a model and a
        set, are made once, in :meth:`profile`). An allocation says what it is for: ``kind``
        ``"output"`` or ``"workspace"`` of the op record at index ``owner``, or ``"tensor"``
        made by :meth:`tensor` / :meth:`from_numpy` at the call site ``owner``."""
        self._memory_calls.append((self._step, self._clock_s) + event + (kind, owner))

    def _memory_peak(self) -> MemoryPeak | None:
        """What held device memory when the allocated bytes first reached the run's peak: the
        live allocations then, grouped by op type, kind and call site (one replay of the
        allocator calls up to that one)."""
        calls = self._memory_calls
        allocated = _CALL_INDEX["allocated_bytes"]
        peak = max(range(len(calls)), key=lambda i: calls[i][allocated], default=None)
        if peak is None or calls[peak][_CALL_INDEX["action"]] != "alloc":
            return None  # no allocation, or nothing allocated yet
        action, address, size = (_CALL_INDEX[name] for name in ("action", "address", "block_bytes"))
        live: dict[int, tuple] = {}
        for call in calls[:peak + 1]:
            if call[action] == "alloc":
                if call[size]:
                    live[call[address]] = call
            elif call[action] == "free":
                live.pop(call[address], None)

        def owner(call: tuple) -> tuple[str | None, str, str | None]:
            kind, ref = call[-2], call[-1]
            if kind == "tensor":
                return None, kind, ref
            record = self._records[ref]
            return record.op_type, kind, record.source

        groups: dict[tuple, list[int]] = {}
        for call in live.values():
            group = groups.setdefault(owner(call), [0, 0])
            group[0] += call[size]
            group[1] += 1
        op_type, kind, source = owner(calls[peak])
        return MemoryPeak(
            step=calls[peak][0], time_s=calls[peak][1], allocated_bytes=calls[peak][allocated],
            reached_by=LiveMemory(op_type=op_type, kind=kind, source=source, size_bytes=calls[peak][size], count=1),
            live=[LiveMemory(op_type=k[0], kind=k[1], source=k[2], size_bytes=b, count=n)
                  for k, (b, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])],
        )

    def _memory_records(self) -> list[MemoryRecord]:
        """The profile's record of every allocator call."""
        return build_records(MemoryRecord, _MEMORY_RECORD_FIELDS, map(_memory_record_values, self._memory_calls))

    def _out(self, shape: Sequence[int], dtype: str, values: numerics.Values | None = None) -> Tensor:
        """An op's output tensor, allocated (and its stall charged to the op just emitted), with
        the op's computed ``values`` as data when there are any."""
        return self._allocate(Tensor(tuple(shape), dtype, None if values is None else values.data,
                                     len(self._records) - 1))

    @staticmethod
    def _compute(op_type: str, inputs: Sequence[Tensor], dtype: str, out_shape: Sequence[int],
                 attrs: dict[str, object] | None = None) -> tuple[numerics.Values | None, OpChecks | None]:
        """The op's result when every input carries data and the op type has a reference kernel
        (:data:`simulator.numerics.KERNELS`), with the checks its record gets; ``(None, None)``
        otherwise. Callers test the first input's ``data`` before calling (the shape-only fast
        path pays nothing)."""
        if any(t.data is None for t in inputs):
            return None, None
        values = numerics.evaluate(op_type, [t.data for t in inputs], dtype, attrs)
        if values is None:
            return None, None
        return values, _checks(values, out_shape)

    def _emit(
        self,
        op_type: str,
        inputs: Sequence[Tensor],
        dtype: str,
        name: str | None,
        attrs: dict[str, object] | None = None,
        stream: str = "compute",
        async_op: bool = False,
        checks: OpChecks | None = None,
    ) -> OpCost:
        attrs = dict(attrs or {})
        wait_s = 0.0
        if stream == "hccl":
            group = attrs["ranks"]
            if self._links:
                frac = self._slow_copies(op_type, inputs, dtype, attrs, group)
                if frac < 1.0:
                    attrs["link_bandwidth_frac"] = frac
            if async_op:
                attrs["async_op"] = True
        elif self._pending_wait is not None:
            attrs["wait_hccl_op"] = self._pending_wait  # this op started after a Work.wait()
            self._pending_wait = None
        attr_items = tuple(sorted(attrs.items()))
        spec = OpSpec(op_type, tuple(t.shape for t in inputs), dtype, attr_items)
        cost = self._cost_cache.get(spec)
        if cost is None:
            self._check_inputs_fit(op_type, name, inputs)
            cost = op_cost(spec, self.hardware)
            self._cost_cache[spec] = cost
        start_s, self._host_s = dispatch(
            max(self._clock_s, self._hccl_clock_s) if stream == "hccl" else self._clock_s, self._host_s, cost,
            self.hardware)
        if stream == "hccl":
            if self._lag is not None:
                wait_s = self._collective_wait(attrs["ranks"])
            if self._recv_ready_s is not None:
                wait_s = max(wait_s, self._recv_ready_s - start_s)
        record = _make_record(
            self.hardware, spec, cost, name=name or op_type, step=self._step, stream=stream, start_s=start_s,
            scale=self._scale.get(op_type, 1.0) * (self._own_factor if stream == "compute" else 1.0),
            stall_s=self._pending_stall_s, alloc_count=self._pending_allocs,
            alloc_retries=self._pending_retries, device_frees=self._pending_device_frees,
            device_mallocs=self._pending_device_mallocs, source=_call_site(), wait_s=wait_s, checks=checks,
        )
        self._pending_stall_s = 0.0
        self._pending_allocs = self._pending_retries = self._pending_device_frees = self._pending_device_mallocs = 0
        if self.collection == "online":
            self._deliver_final()  # the previous op can no longer change
        self._records.append(record)
        end_s = start_s + record.duration_s
        if stream == "hccl":
            self._hccl_clock_s = end_s
            self._last_hccl = len(self._records) - 1
            if not async_op:
                self._clock_s = end_s  # a blocking collective: compute waits for it
        else:
            self._clock_s = end_s
            if self._lag is not None:
                # each rank r computes base x factor_r; relative to rank 0 it falls behind by
                # (factor_r - factor_0) x base
                base_s = (record.duration_s - record.alloc_stall_s) / self._own_factor
                self._lag_base += (1.0 - self._own_factor) * base_s
                for rank, factor in self._slow.items():
                    if rank:
                        self._lag[rank] += (factor - 1.0) * base_s
        if self.collection == "online":
            self._clock_s += self.hardware.profiler.online_callback_overhead_s
        return cost

    # -- streams and stragglers ------------------------------------------------------------------

    def _wait_for(self, index: int, end_s: float) -> None:
        self._clock_s = max(self._clock_s, end_s)
        self._pending_wait = index if self._pending_wait is None else max(self._pending_wait, index)

    def synchronize(self) -> None:
        """Block the compute stream until every collective issued so far is done."""
        if self._last_hccl is not None:
            self._wait_for(self._last_hccl, self._hccl_clock_s)

    def _check_slow_ranks(self, slow: dict[int, float]) -> dict[int, float]:
        if not isinstance(slow, dict):
            raise TypeError(f"slow_ranks must be a dict {{rank: factor}}, got {slow!r}")
        for rank, factor in slow.items():
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.devices:
                raise ValueError(f"slow_ranks: rank {rank!r} is not a rank of the {self.devices}-card job")
            if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 1):
                raise ValueError(f"slow_ranks[{rank}] must be a factor >= 1 (how many times slower), got {factor!r}")
        return {r: float(f) for r, f in slow.items() if f > 1}

    def _check_links(self, links: dict[tuple[int, int], float]) -> dict[frozenset[int], float]:
        if not isinstance(links, dict):
            raise TypeError(f"degraded_links must be a dict {{(rank_a, rank_b): fraction}}, got {links!r}")
        checked = {}
        for pair, frac in links.items():
            if (not isinstance(pair, tuple) or len(pair) != 2 or pair[0] == pair[1]
                    or any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.devices for r in pair)):
                raise ValueError(f"degraded_links: {pair!r} is not a pair of two ranks of the {self.devices}-card job")
            if not (isinstance(frac, (int, float)) and math.isfinite(frac) and 0 < frac <= 1):
                raise ValueError(f"degraded_links[{pair}] must be a bandwidth fraction in (0, 1], got {frac!r}")
            checked[frozenset(pair)] = float(frac)
        return checked

    def _slow_copies(self, op_type: str, inputs: Sequence[Tensor], dtype: str, attrs: dict[str, object],
                     group: tuple[int, ...]) -> float:
        """Degraded links: the bandwidth fraction of rank 0's copy of the collective; the other
        copies that run over a degraded link finish later, and their ranks fall behind by the
        difference (rank 0 waits for them at the next collective they share)."""
        def frac_of(copy: tuple[int, ...]) -> float:
            members = set(copy)
            return min((f for pair, f in self._links.items() if pair <= members), default=1.0)

        own = 1.0
        shapes = tuple(t.shape for t in inputs)
        base_s = None
        for copy in _copies(group, self.devices):
            frac = frac_of(copy)
            if 0 in copy:
                own = frac
            elif frac < 1.0:
                if base_s is None:
                    base_s = op_cost(OpSpec(op_type, shapes, dtype, tuple(sorted(attrs.items()))), self.hardware).duration_s
                slow = {**attrs, "link_bandwidth_frac": frac}
                extra_s = op_cost(OpSpec(op_type, shapes, dtype, tuple(sorted(slow.items()))), self.hardware).duration_s
                for r in copy:
                    self._lag[r] += extra_s - base_s
        return own

    def _collective_wait(self, group: tuple[int, ...]) -> float:
        """Straggler model: every copy of the collective starts when its slowest member gets
        there; returns how long rank 0 waits, and re-bases every rank's lag on rank 0."""
        lag, base = self._lag, self._lag_base
        wait_s = 0.0
        for copy in _copies(group, self.devices):
            latest = max(0.0 if r == 0 else base + lag[r] for r in copy)
            for r in copy:
                lag[r] = latest - base
            if 0 in copy:
                wait_s = latest  # >= 0: rank 0's own lag is 0
        self._lag_base -= wait_s  # rank 0's clock moved on by the wait
        return wait_s

    def _deliver_final(self) -> None:
        """Online collection: hand every finished op record to the callbacks."""
        while self._delivered < len(self._records):
            record = self._records[self._delivered]
            self._delivered += 1
            _callbacks.deliver(record)

    # -- Cube unit ---------------------------------------------------------------------------

    def matmul(
        self,
        a: Tensor,
        b: Tensor,
        *,
        transpose_a: bool = False,
        transpose_b: bool = False,
        name: str | None = None,
    ) -> Tensor:
        """Matrix product on the Cube unit; batched over leading dimensions.

        Shapes: ``a`` (..., M, K), ``b`` (..., K, N) or (K, N) (broadcast); with the transpose
        flags, the last two axes of that operand are swapped first. Returns (..., M, N).
        2-D products are op type ``MatMul``, batched ones ``BatchMatMul``.

        Raises:
            ShapeError: fewer than 2 dimensions, inner dimensions differ, batch mismatch,
                or dtypes differ.
        """
        _check_tensors("matmul", a=a, b=b)
        for t, label in ((a, "a"), (b, "b")):
            if len(t.shape) < 2:
                raise ShapeError(f"matmul: {label} must have at least 2 dimensions, got {list(t.shape)}")
        if a.dtype != b.dtype:
            raise ShapeError(f"matmul: dtypes differ: a is {a.dtype}, b is {b.dtype}")
        m, k = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
        kb, n = (b.shape[-1], b.shape[-2]) if transpose_b else (b.shape[-2], b.shape[-1])
        if k != kb:
            raise ShapeError(
                f"matmul: inner dimensions differ: a {list(a.shape)} and b {list(b.shape)} "
                f"(K={k} vs {kb})"
            )
        batch_a, batch_b = a.shape[:-2], b.shape[:-2]
        if batch_b and batch_b != batch_a:
            raise ShapeError(
                f"matmul: batch dimensions differ: a {list(a.shape)} and b {list(b.shape)}"
            )
        batch = math.prod(batch_a)
        op_type = "BatchMatMul" if batch_a else "MatMul"
        spec_a = Tensor((batch, m, k), a.dtype)
        spec_b = Tensor((batch, k, n), b.dtype)
        out_shape = (*batch_a, m, n)
        values = checks = None
        if a.data is not None:
            values, checks = self._compute(op_type, (a, b), a.dtype, out_shape,
                                           {"transpose_a": transpose_a, "transpose_b": transpose_b})
        self._emit(op_type, (spec_a, spec_b), a.dtype, name, checks=checks)
        return self._out(out_shape, a.dtype, values)

    def flash_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        block_size: int = 128,
        pipeline_stages: int = 2,
        fusion: bool = True,
        causal: bool = False,
        name: str | None = None,
    ) -> Tensor:
        """Fused attention (op type ``FlashAttention``): softmax(Q Kᵀ / sqrt(D)) V.

        Shapes: q (B, H, S_q, D); k and v (B, H_kv, S_kv, D) with H divisible by H_kv
        (grouped-query attention). Returns (B, H, S_q, D).

        Raises:
            ShapeError: wrong ranks or mismatched dimensions, or a non-positive
                ``block_size`` / ``pipeline_stages``.
            ValueError: the blocks in flight do not fit in an AI Core's L1.
        """
        self._check_attention("flash_attention", q, k, v, block_size, pipeline_stages)
        attrs = {"block_size": block_size, "pipeline_stages": pipeline_stages, "fusion": bool(fusion), "causal": bool(causal)}
        values = checks = None
        if q.data is not None:
            values, checks = self._compute("FlashAttention", (q, k, v), q.dtype, q.shape, attrs)
        self._emit("FlashAttention", (q, k, v), q.dtype, name, attrs, checks=checks)
        out = self._out(q.shape, q.dtype, values)
        self._workspace("FlashAttention", (q, k, v), q.dtype, fusion)
        return out

    def flash_attention_grad(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        dout: Tensor,
        *,
        block_size: int = 128,
        pipeline_stages: int = 2,
        fusion: bool = True,
        causal: bool = False,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Backward of :meth:`flash_attention` (op type ``FlashAttentionGrad``).

        Shapes as the forward; ``dout`` has q's shape. Returns (dq, dk, dv).
        """
        self._check_attention("flash_attention_grad", q, k, v, block_size, pipeline_stages)
        _check_tensors("flash_attention_grad", dout=dout)
        if dout.shape != q.shape:
            raise ShapeError(f"flash_attention_grad: dout {list(dout.shape)} must match q {list(q.shape)}")
        attrs = {"block_size": block_size, "pipeline_stages": pipeline_stages, "fusion": bool(fusion), "causal": bool(causal)}
        self._emit("FlashAttentionGrad", (q, k, v, dout), q.dtype, name, attrs)
        grads = self._out(q.shape, q.dtype), self._out(k.shape, k.dtype), self._out(v.shape, v.dtype)
        self._workspace("FlashAttentionGrad", (q, k, v, dout), q.dtype, fusion)
        return grads

    @staticmethod
    def _check_attention(op: str, q: Tensor, k: Tensor, v: Tensor, block_size: int, stages: int) -> None:
        _check_tensors(op, q=q, k=k, v=v)
        for t, label in ((q, "q"), (k, "k"), (v, "v")):
            if len(t.shape) != 4:
                raise ShapeError(f"{op}: {label} must be (B, H, S, D), got {list(t.shape)}")
        if k.shape != v.shape:
            raise ShapeError(f"{op}: k {list(k.shape)} and v {list(v.shape)} must match")
        if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
            raise ShapeError(f"{op}: batch and head_dim of q {list(q.shape)} and k {list(k.shape)} must match")
        if q.shape[1] % k.shape[1]:
            raise ShapeError(f"{op}: q heads ({q.shape[1]}) must be a multiple of k/v heads ({k.shape[1]})")
        if len({q.dtype, k.dtype, v.dtype}) != 1:
            raise ShapeError(f"{op}: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
        if not isinstance(block_size, int) or block_size < 16 or block_size % 16:
            raise ShapeError(f"{op}: block_size must be a positive multiple of 16, got {block_size!r}")
        if not isinstance(stages, int) or stages < 1:
            raise ShapeError(f"{op}: pipeline_stages must be a positive integer, got {stages!r}")

    # -- convolution (Cube unit) and its companions -------------------------------------------

    def _conv_check(self, op: str, x: Tensor, weight_shape: tuple[int, ...], stride: int, padding: int) -> tuple[int, int]:
        if len(x.shape) != 4:
            raise ShapeError(f"{op}: x must be (N, C, H, W), got {list(x.shape)}")
        if len(weight_shape) != 4:
            raise ShapeError(f"{op}: weight must be (Cout, Cin, kh, kw), got {list(weight_shape)}")
        if x.shape[1] != weight_shape[1]:
            raise ShapeError(f"{op}: x has {x.shape[1]} channels, weight {list(weight_shape)} expects {weight_shape[1]}")
        for label, value, low in (("stride", stride, 1), ("padding", padding, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ShapeError(f"{op}: {label} must be an integer >= {low}, got {value!r}")
        ho, wo = conv_output_hw(x.shape[2], x.shape[3], weight_shape[2], weight_shape[3], stride, padding)
        if ho < 1 or wo < 1:
            raise ShapeError(f"{op}: a {weight_shape[2]}x{weight_shape[3]} window does not fit input {list(x.shape)} "
                             f"with padding {padding}")
        return ho, wo

    def conv2d(self, x: Tensor, weight: Tensor, *, stride: int = 1, padding: int = 0,
               name: str | None = None) -> Tensor:
        """2-D convolution (op type ``Conv2D``), NCHW. x (N, Cin, H, W), weight (Cout, Cin, kh, kw).

        Returns (N, Cout, Ho, Wo) with ``Ho = (H + 2 padding - kh) // stride + 1``.

        Raises:
            ShapeError: not 4-D, channel mismatch, bad stride or padding, or a window larger
                than the padded input.
        """
        _check_tensors("Conv2D", x=x, weight=weight)
        ho, wo = self._conv_check("Conv2D", x, weight.shape, stride, padding)
        self._emit("Conv2D", (x, weight), x.dtype, name, {"stride": stride, "padding": padding})
        return self._out((x.shape[0], weight.shape[0], ho, wo), x.dtype)

    def conv2d_backward(self, dy: Tensor, x: Tensor, weight: Tensor, *, stride: int = 1, padding: int = 0,
                        input_grad: bool = True, name: str | None = None) -> Tensor | None:
        """Gradients of :meth:`conv2d`: ``Conv2DBackpropFilter`` (dW), then, with
        ``input_grad``, ``Conv2DBackpropInput`` (dx, returned). dy is (N, Cout, Ho, Wo).

        Raises:
            ShapeError: as :meth:`conv2d`, or dy not the convolution's output shape.
        """
        _check_tensors("Conv2DBackpropFilter", dy=dy, x=x, weight=weight)
        ho, wo = self._conv_check("Conv2DBackpropFilter", x, weight.shape, stride, padding)
        expected = (x.shape[0], weight.shape[0], ho, wo)
        if dy.shape != expected:
            raise ShapeError(f"Conv2DBackpropFilter: dy {list(dy.shape)} must be {list(expected)}")
        attrs = {"stride": stride, "padding": padding}
        self._emit("Conv2DBackpropFilter", (x, dy), x.dtype, name, {**attrs, "kernel_hw": weight.shape[2:]})
        if not input_grad:
            return None
        self._emit("Conv2DBackpropInput", (dy, weight), x.dtype, name, {**attrs, "input_hw": x.shape[2:]})
        return self._out(x.shape, x.dtype)

    def batch_norm(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Training batch normalisation over (N, H, W) per channel (op type ``BatchNorm``)."""
        return self._elementwise("BatchNorm", x, name=name)

    def batch_norm_grad(self, dy: Tensor, x: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`batch_norm` (op type ``BatchNormGrad``); returns dx."""
        if dy.shape != x.shape:
            raise ShapeError(f"BatchNormGrad: dy {list(dy.shape)} must match x {list(x.shape)}")
        return self._elementwise("BatchNormGrad", dy, name=name)

    def batch_norm_relu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Batch norm fused with the ReLU after it, sums taken in the producing convolution's
        epilogue, as graph-mode fusion builds it (op type ``BatchNormRelu``)."""
        return self._elementwise("BatchNormRelu", x, name=name)

    def batch_norm_update(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Batch norm whose sums the producing convolution took (op type ``BatchNormUpdate``)."""
        return self._elementwise("BatchNormUpdate", x, name=name)

    def batch_norm_add_relu(self, x: Tensor, residual: Tensor, *, name: str | None = None) -> Tensor:
        """relu(batch_norm(x) + residual) in one pass (op type ``BatchNormAddRelu``)."""
        if residual.shape != x.shape:
            raise ShapeError(f"BatchNormAddRelu: residual {list(residual.shape)} must match x {list(x.shape)}")
        return self._elementwise("BatchNormAddRelu", x, residual, name=name)

    def batch_norm_relu_grad(self, dy: Tensor, x: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`batch_norm_relu` (op type ``BatchNormReluGrad``); returns dx."""
        if dy.shape != x.shape:
            raise ShapeError(f"BatchNormReluGrad: dy {list(dy.shape)} must match x {list(x.shape)}")
        return self._elementwise("BatchNormReluGrad", dy, name=name)

    def relu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """max(x, 0) (op type ``Relu``)."""
        return self._elementwise("Relu", x, name=name)

    def relu_grad(self, dy: Tensor, y: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`relu` (op type ``ReluGrad``)."""
        return self._elementwise("ReluGrad", dy, y, name=name)

    def max_pool(self, x: Tensor, *, kernel: int = 3, stride: int = 2, padding: int = 1,
                 name: str | None = None) -> Tensor:
        """Max pooling over ``kernel x kernel`` windows (op type ``MaxPool``), NCHW."""
        _check_tensors("MaxPool", x=x)
        ho, wo = self._conv_check("MaxPool", x, (x.shape[1], x.shape[1], kernel, kernel), stride, padding)
        self._emit("MaxPool", (x,), x.dtype, name, {"kernel": kernel, "stride": stride})
        return self._out((*x.shape[:2], ho, wo), x.dtype)

    def max_pool_grad(self, dy: Tensor, x: Tensor, *, kernel: int = 3, stride: int = 2,
                      name: str | None = None) -> Tensor:
        """Backward of :meth:`max_pool` (op type ``MaxPoolGrad``); returns dx."""
        _check_tensors("MaxPoolGrad", dy=dy, x=x)
        self._emit("MaxPoolGrad", (x, dy), x.dtype, name, {"kernel": kernel, "stride": stride})
        return self._out(x.shape, x.dtype)

    def global_avg_pool(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Mean over H and W (op type ``GlobalAvgPool``): (N, C, H, W) -> (N, C)."""
        _check_tensors("GlobalAvgPool", x=x)
        if len(x.shape) != 4:
            raise ShapeError(f"GlobalAvgPool: x must be (N, C, H, W), got {list(x.shape)}")
        self._emit("GlobalAvgPool", (x,), x.dtype, name)
        return self._out(x.shape[:2], x.dtype)

    def global_avg_pool_grad(self, dy: Tensor, x: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`global_avg_pool` (op type ``GlobalAvgPoolGrad``); returns dx."""
        _check_tensors("GlobalAvgPoolGrad", dy=dy, x=x)
        self._emit("GlobalAvgPoolGrad", (x, dy), x.dtype, name)
        return self._out(x.shape, x.dtype)

    # -- Vector unit ---------------------------------------------------------------------------

    def _elementwise(self, op_type: str, x: Tensor, *others: Tensor, name: str | None) -> Tensor:
        _check_tensors(op_type, x=x, **{f"input {i + 2}": t for i, t in enumerate(others)})
        try:
            if all(t.shape == x.shape for t in others):
                out_shape = x.shape
            else:
                out_shape = np.broadcast_shapes(x.shape, *(t.shape for t in others))
        except ValueError:
            shapes = " and ".join(str(list(t.shape)) for t in (x, *others))
            raise ShapeError(f"{op_type}: shapes {shapes} do not broadcast") from None
        values = checks = None
        if x.data is not None:
            values, checks = self._compute(op_type, (x, *others), x.dtype, out_shape)
        # the output costs the op (it is the largest operand); its record is the next one
        out = Tensor(tuple(out_shape), x.dtype, None if values is None else values.data, len(self._records))
        self._emit(op_type, (out, *others), x.dtype, name, checks=checks)
        return self._allocate(out)

    def add(self, a: Tensor, b: Tensor, *, name: str | None = None) -> Tensor:
        """a + b (op type ``Add``); b may be a's shape or its last axis."""
        return self._elementwise("Add", a, b, name=name)

    def mul(self, a: Tensor, b: Tensor, *, name: str | None = None) -> Tensor:
        """a * b (op type ``Mul``); b may be a's shape or its last axis."""
        return self._elementwise("Mul", a, b, name=name)

    def silu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """x * sigmoid(x) (op type ``SiLU``)."""
        return self._elementwise("SiLU", x, name=name)

    def silu_grad(self, dy: Tensor, x: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`silu` (op type ``SiLUGrad``)."""
        return self._elementwise("SiLUGrad", dy, x, name=name)

    def gelu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """GeLU, tanh approximation (op type ``GeLU``)."""
        return self._elementwise("GeLU", x, name=name)

    def gelu_grad(self, dy: Tensor, x: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`gelu` (op type ``GeLUGrad``)."""
        return self._elementwise("GeLUGrad", dy, x, name=name)

    def softmax(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Softmax over the last axis (op type ``Softmax``)."""
        return self._elementwise("Softmax", x, name=name)

    def softmax_grad(self, dy: Tensor, y: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`softmax` (op type ``SoftmaxGrad``)."""
        return self._elementwise("SoftmaxGrad", dy, y, name=name)

    def rotary_embedding(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Rotary position embedding applied to q or k (op type ``RotaryPositionEmbedding``)."""
        return self._elementwise("RotaryPositionEmbedding", x, name=name)

    def cast(self, x: Tensor, dtype: str, *, name: str | None = None) -> Tensor:
        """Convert to ``dtype`` (op type ``Cast``)."""
        _check_tensors("cast", x=x)
        _check_dtype("cast", dtype)
        values = checks = None
        if x.data is not None:
            values, checks = self._compute("Cast", (x,), dtype, x.shape)
        self._emit("Cast", (x,), x.dtype, name, {"to": dtype}, checks=checks)
        return self._out(x.shape, dtype, values)

    def _norm(self, op_type: str, x: Tensor, params: Sequence[Tensor], name: str | None) -> Tensor:
        _check_tensors(op_type, x=x, **{f"parameter {i + 1}": p for i, p in enumerate(params)})
        for p in params:
            if p.shape != (x.shape[-1],):
                raise ShapeError(
                    f"{op_type}: parameter shape {list(p.shape)} must be ({x.shape[-1]},) for input {list(x.shape)}"
                )
        values = checks = None
        if x.data is not None:
            values, checks = self._compute(op_type, (x, *params), x.dtype, x.shape)
        self._emit(op_type, (x, *params), x.dtype, name, checks=checks)
        return self._out(x.shape, x.dtype, values)

    def rms_norm(self, x: Tensor, weight: Tensor, *, name: str | None = None) -> Tensor:
        """RMS normalisation over the last axis (op type ``RmsNorm``). weight: (hidden,)."""
        return self._norm("RmsNorm", x, (weight,), name)

    def rms_norm_grad(self, dy: Tensor, x: Tensor, weight: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`rms_norm` (op type ``RmsNormGrad``); returns dx."""
        if dy.shape != x.shape:
            raise ShapeError(f"RmsNormGrad: dy {list(dy.shape)} must match x {list(x.shape)}")
        return self._norm("RmsNormGrad", dy, (weight,), name)

    def layer_norm(self, x: Tensor, weight: Tensor, bias: Tensor, *, name: str | None = None) -> Tensor:
        """Layer normalisation over the last axis (op type ``LayerNorm``)."""
        return self._norm("LayerNorm", x, (weight, bias), name)

    def layer_norm_grad(self, dy: Tensor, x: Tensor, weight: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`layer_norm` (op type ``LayerNormGrad``); returns dx."""
        if dy.shape != x.shape:
            raise ShapeError(f"LayerNormGrad: dy {list(dy.shape)} must match x {list(x.shape)}")
        return self._norm("LayerNormGrad", dy, (weight,), name)

    def embedding(self, ids: Tensor, table: Tensor, *, name: str | None = None) -> Tensor:
        """Row lookup (op type ``Embedding``). ids: any shape of int; table: (vocab, hidden)."""
        _check_tensors("Embedding", ids=ids, table=table)
        if len(table.shape) != 2:
            raise ShapeError(f"Embedding: table must be (vocab, hidden), got {list(table.shape)}")
        if ids.dtype not in ("int32", "int64"):
            raise ShapeError(f"Embedding: ids must be int32 or int64, got {ids.dtype}")
        self._emit("Embedding", (Tensor((ids.numel,), ids.dtype), table), table.dtype, name)
        return self._out((*ids.shape, table.shape[1]), table.dtype)

    def embedding_grad(self, dy: Tensor, ids: Tensor, table: Tensor, *, name: str | None = None) -> Tensor:
        """Scatter-add of row gradients into the table (op type ``EmbeddingDenseGrad``)."""
        _check_tensors("EmbeddingDenseGrad", dy=dy, ids=ids, table=table)
        if dy.shape != (*ids.shape, table.shape[1]):
            raise ShapeError(f"EmbeddingDenseGrad: dy {list(dy.shape)} must be ids shape + (hidden,)")
        self._emit("EmbeddingDenseGrad", (Tensor((ids.numel,), ids.dtype), table), table.dtype, name)
        return self._out(table.shape, table.dtype)

    def cross_entropy(self, logits: Tensor, *, name: str | None = None) -> Tensor:
        """Softmax cross entropy over the last axis (op type ``CrossEntropy``); returns the loss."""
        _check_tensors("CrossEntropy", logits=logits)
        self._emit("CrossEntropy", (logits,), logits.dtype, name)
        return self._out((1,), "fp32")

    def cross_entropy_grad(self, logits: Tensor, *, name: str | None = None) -> Tensor:
        """Gradient of :meth:`cross_entropy` with respect to the logits (``CrossEntropyGrad``)."""
        _check_tensors("CrossEntropyGrad", logits=logits)
        self._emit("CrossEntropyGrad", (logits,), logits.dtype, name)
        return self._out(logits.shape, logits.dtype)

    def adamw(self, param_numel: int, *, name: str | None = None) -> None:
        """AdamW update of ``param_numel`` fp32 master weights (op type ``ApplyAdamW``)."""
        if not isinstance(param_numel, int) or param_numel < 1:
            raise ShapeError(f"ApplyAdamW: param_numel must be a positive integer, got {param_numel!r}")
        self._emit("ApplyAdamW", (Tensor((param_numel,), "fp32"),), "fp32", name)

    def momentum(self, param_numel: int, *, name: str | None = None) -> None:
        """SGD-with-momentum update of ``param_numel`` fp32 weights (op type ``ApplyMomentum``)."""
        if not isinstance(param_numel, int) or param_numel < 1:
            raise ShapeError(f"ApplyMomentum: param_numel must be a positive integer, got {param_numel!r}")
        self._emit("ApplyMomentum", (Tensor((param_numel,), "fp32"),), "fp32", name)

    # -- HCCL collectives ---------------------------------------------------------------------

    def _group(self, op: str, ranks: Sequence[int] | None, x: object) -> tuple[int, ...]:
        _check_tensors(op, x=x)
        group = tuple(range(self.devices)) if ranks is None else tuple(ranks)
        if not group or len(set(group)) != len(group) or any(
            isinstance(r, bool) or not isinstance(r, int) or r < 0 or r >= self.devices for r in group
        ):
            raise ValueError(
                f"{op}: ranks {list(group)} must be distinct integers in [0, {self.devices})"
            )
        if self.rank not in group:
            raise ValueError(f"{op}: ranks {list(group)} must include the simulated rank {self.rank}")
        return group

    def _collective(self, op_type: str, costed: Tensor, out_shape: tuple[int, ...], dtype: str, group: tuple[int, ...],
                    name: str | None, async_op: bool, data_input: Tensor | None = None) -> Tensor | Work:
        if not isinstance(async_op, bool):
            raise TypeError(f"{op_type}: async_op must be True or False, got {async_op!r}")
        values = checks = None
        if data_input is not None and data_input.data is not None:
            values, checks = self._compute(op_type, (data_input,), dtype, out_shape, {"group_size": len(group)})
        self._communicator(group)
        self._emit(op_type, (costed,), dtype, name, {"ranks": group}, stream="hccl", async_op=async_op, checks=checks)
        index = len(self._records) - 1
        out = self._out(out_shape, dtype, values)  # its allocation may lengthen the collective
        end_s = self._hccl_clock_s
        return Work(self, index, end_s, out) if async_op else out

    def _communicator(self, group: tuple[int, ...]) -> None:
        """HCCL makes a communicator for each new group at its first collective and takes
        ``interconnect.hccl_buffer_bytes`` of HBM for it outside the caching allocator (with
        memory modelled; the device malloc stalls that first collective). Point-to-point
        communicators are not modelled."""
        size = self.hardware.interconnect.hccl_buffer_bytes
        if len(group) < 2 or not size:
            return
        key = frozenset(group)
        if key in self._communicators:
            return
        self._communicators.add(key)
        what = f"the HCCL communicator of ranks {sorted(group)}"
        if self.allocator is None:  # without memory modelled a collective pays nothing here
            self._settle()
            self._check_capacity(size, what)
            self._live_bytes += size  # held for the rest of the job
            return
        event = self.allocator.take_device_memory(size, what=what)
        self._note_memory(event)
        self._pending_stall_s += event.latency_s
        self._pending_device_mallocs += event.device_mallocs
        self._pending_device_frees += event.device_frees

    def all_reduce(self, x: Tensor, *, ranks: Sequence[int] | None = None, name: str | None = None,
                   async_op: bool = False) -> Tensor | Work:
        """Sum ``x`` over the ranks (op type ``AllReduce``); default group: every card.

        Collectives run on the HCCL stream. A blocking one (the default) holds the compute
        stream until it is done; with ``async_op=True`` compute goes on and the call returns a
        :class:`Work` to ``wait()`` on (as ``torch.distributed`` does). With data, every rank is
        taken to hold the same ``x`` (ranks alike), so the result is ``len(ranks) * x``.
        """
        group = self._group("AllReduce", ranks, x)
        return self._collective("AllReduce", x, x.shape, x.dtype, group, name, async_op, data_input=x)

    def all_gather(self, x: Tensor, *, ranks: Sequence[int] | None = None, name: str | None = None,
                   async_op: bool = False) -> Tensor | Work:
        """Concatenate each rank's ``x`` along axis 0 (op type ``AllGather``); ``async_op`` as
        in :meth:`all_reduce`."""
        group = self._group("AllGather", ranks, x)
        out_shape = (x.shape[0] * len(group), *x.shape[1:])
        return self._collective("AllGather", Tensor(out_shape, x.dtype), out_shape, x.dtype, group, name, async_op)

    def reduce_scatter(self, x: Tensor, *, ranks: Sequence[int] | None = None, name: str | None = None,
                       async_op: bool = False) -> Tensor | Work:
        """Sum ``x`` over the ranks and keep this rank's 1/p slice of axis 0 (``ReduceScatter``);
        ``async_op`` as in :meth:`all_reduce`.

        Raises:
            ShapeError: axis 0 is not divisible by the group size.
        """
        group = self._group("ReduceScatter", ranks, x)
        if x.shape[0] % len(group):
            raise ShapeError(f"ReduceScatter: axis 0 of {list(x.shape)} is not divisible by {len(group)} ranks")
        return self._collective("ReduceScatter", x, (x.shape[0] // len(group), *x.shape[1:]), x.dtype, group, name,
                                async_op)

    def broadcast(self, x: Tensor, *, src: int = 0, ranks: Sequence[int] | None = None, name: str | None = None,
                  async_op: bool = False) -> Tensor | Work:
        """Copy rank ``src``'s ``x`` to every rank of the group (op type ``Broadcast``);
        ``async_op`` as in :meth:`all_reduce`.

        Raises:
            ValueError: ``src`` is not in the group.
        """
        group = self._group("Broadcast", ranks, x)
        if src not in group:
            raise ValueError(f"Broadcast: src {src!r} is not in the group {list(group)}")
        return self._collective("Broadcast", x, x.shape, x.dtype, group, name, async_op)

    def all_to_all(self, x: Tensor, *, ranks: Sequence[int] | None = None, name: str | None = None,
                   async_op: bool = False) -> Tensor | Work:
        """Each rank sends the p-th slice of axis 0 of ``x`` to rank p (op type ``AllToAll``, as
        expert parallelism does); ``async_op`` as in :meth:`all_reduce`.

        Raises:
            ShapeError: axis 0 is not divisible by the group size.
        """
        group = self._group("AllToAll", ranks, x)
        if x.shape[0] % len(group):
            raise ShapeError(f"AllToAll: axis 0 of {list(x.shape)} is not divisible by {len(group)} ranks")
        return self._collective("AllToAll", x, x.shape, x.dtype, group, name, async_op)

    def _peer(self, op: str, peer: object, x: object) -> int:
        _check_tensors(op, x=x)
        if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < self.devices or peer == self.rank:
            raise ValueError(f"{op}: peer {peer!r} must be another rank of the {self.devices}-card job")
        return peer

    def send(self, x: Tensor, dst: int, *, name: str | None = None) -> None:
        """Send ``x`` to rank ``dst`` (op type ``Send``, on the HCCL stream, blocking)."""
        peer = self._peer("Send", dst, x)
        self._emit("Send", (x,), x.dtype, name, {"ranks": (self.rank, peer), "peer": peer}, stream="hccl")

    def recv(self, x: Tensor, src: int, *, ready_s: float | None = None, name: str | None = None) -> Tensor:
        """Receive a tensor shaped like ``x`` from rank ``src`` (op type ``Receive``, blocking).

        ``ready_s``: when the peer sends it, on this device's clock (:attr:`clock_s`); a
        receive posted earlier waits (``attrs["wait_time_s"]``), e.g. for the stages after it
        in a pipeline.
        """
        peer = self._peer("Receive", src, x)
        if ready_s is not None and not (isinstance(ready_s, (int, float)) and math.isfinite(ready_s) and ready_s >= 0):
            raise ValueError(f"Receive: ready_s must be a finite time >= 0 in seconds, got {ready_s!r}")
        self._recv_ready_s = ready_s
        try:
            self._emit("Receive", (x,), x.dtype, name, {"ranks": (self.rank, peer), "peer": peer}, stream="hccl")
        finally:
            self._recv_ready_s = None
        return self._out(x.shape, x.dtype)

    @property
    def clock_s(self) -> float:
        """The compute stream's clock: when the next compute op can start, in seconds."""
        return self._clock_s

    # -- profile -------------------------------------------------------------------------------

    def _close_step(self) -> None:
        if self.collection == "online":
            self._deliver_final()
        if self.allocator is None:
            self._memory_steps.append(None)
            return
        stats = self.allocator.stats()
        t = _StepMemoryTally(self._memory_calls[self._step_first_call:])
        self._memory_steps.append(StepMemory.model_construct(
            step=self._step, allocated_peak_bytes=stats.allocated_bytes_peak, reserved_peak_bytes=stats.reserved_bytes_peak,
            allocated_end_bytes=stats.allocated_bytes, reserved_end_bytes=stats.reserved_bytes,
            inactive_split_bytes=stats.inactive_split_bytes, largest_free_block_bytes=stats.largest_free_block_bytes,
            alloc_count=t.allocs, free_count=t.frees, device_mallocs=t.device_mallocs, device_frees=t.device_frees,
            alloc_retries=t.retries, alloc_time_s=t.alloc_time_s,
        ))
        self.allocator.reset_peak_stats()
        self._step_first_call = len(self._memory_calls)

    def _next_step(self) -> None:
        self._close_step()
        self._step += 1
        # a training step ends synchronised (the optimizer and the loss read finished tensors)
        self._clock_s = max(self._clock_s, self._hccl_clock_s)
        self._host_s = self._clock_s  # the host issues the step's first kernel as it starts
        self._pending_wait = None

    def profile(self, steps: int) -> Profile:
        if len(self._memory_steps) < steps:
            self._close_step()
        if self.collection == "offline" and _callbacks.has_callbacks():
            for record in self._records:  # the trace is parsed after the run
                _callbacks.deliver(record)
        digest = hashlib.sha256()
        for op in self._records:  # every step: a workload whose later steps change is another workload
            digest.update(f"{op.step}|{op.op_type}|{op.input_shapes}|{op.dtype};".encode())
        return Profile.model_construct(
            schema_version=1,
            simulator_version=SIMULATOR_VERSION,
            hardware=self.hardware.name,
            devices=self.devices,
            steps=steps,
            tokens_per_step=self.tokens_per_step,
            workload_fingerprint=digest.hexdigest()[:16],
            ops=self._records,
            memory=[m for m in self._memory_steps if m is not None],
            memory_events=self._memory_records(),
            memory_peak=self._memory_peak(),
            collection=self.collection,
        )


def run(
    workload: Callable[..., object],
    *args,
    steps: int = 1,
    hardware: str | HardwareSpec = "ascend910",
    devices: int = 1,
    op_time_scale: dict[str, float] | None = None,
    allocator: AllocatorConfig | str | None = None,
    memory: bool = False,
    collection: str = "offline",
    slow_ranks: dict[int, float] | None = None,
    degraded_links: dict[tuple[int, int], float] | None = None,
    **kwargs,
) -> Profile:
    """Run ``workload(npu, *args, **kwargs)`` ``steps`` times on a simulated card.

    Args:
        workload: the user function; it calls operators on ``npu``.
        steps: training or inference steps to run (>= 1).
        hardware: a bundled spec name (see :func:`simulator.list_hardware`) or a spec.
        devices: cards in the job (one is simulated, all ranks alike): a count HCCL supports on
            the hardware's servers (1, 2, 4 or 8 cards in one 910 server, or whole servers).
        op_time_scale: fault injection, see :class:`NPU`; an op type the workload never ran
            gives a ``UserWarning`` after the run (one scale may serve a whole suite).
        memory: model device memory: every tensor takes HBM from a model of torch_npu's
            caching allocator (:mod:`simulator.allocator`) when it is made and gives it back
            when the Python object goes; device mallocs and failed allocations stall the op
            that needed the memory, and the profile gets per-step memory statistics. Off by
            default: it makes the simulation's own run about 2 to 2.7 times slower
            (``benchmarks/bench_memory_steps.py``). Without it the live tensors' bytes are still
            counted against the card's HBM: a workload they alone do not fit is out of memory
            too (a lower bound: the caching allocator's rounding, cache and fragmentation are not
            modelled, so a workload that fails only because of them still passes).
        allocator: the caching allocator's settings (implies ``memory``), as an
            :class:`AllocatorConfig` or a ``PYTORCH_NPU_ALLOC_CONF`` string
            (``"expandable_segments:True"``).
        collection: how op records reach callbacks registered with
            :func:`simulator.callbacks.register_op_callback`: ``"offline"`` (after the run, no
            overhead) or ``"online"`` (during the run, charging the hardware's
            ``profiler.online_callback_overhead_s`` per op to the timeline).
        slow_ranks, degraded_links: stragglers and slow links, see :class:`NPU`.

    Returns:
        The :class:`~simulator.profile.Profile` of the run.

    Raises:
        ValueError: unknown hardware, ``steps`` < 1, bad ``devices``, ``collection``,
            ``slow_ranks`` or ``degraded_links`` values, or any operator error.
        TypeError: ``slow_ranks`` or ``degraded_links`` is not a dict.
        OutOfMemoryError: the workload does not fit in the card's HBM (see ``memory``), or an
            op reads an input larger than the HBM.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    spec = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    npu = NPU(spec, devices, op_time_scale, allocator, memory, collection, slow_ranks, degraded_links)
    for step in range(steps):
        if step:
            npu._next_step()
        workload(npu, *args, **kwargs)
    profile = npu.profile(steps)
    if op_time_scale:
        ran = profile.op_types
        unused = sorted(set(op_time_scale) - set(ran))
        if unused:  # a fault that was never injected must not pass unnoticed for a gate that caught it
            warnings.warn(f"op_time_scale: the workload ran no op of type {', '.join(map(repr, unused))}, so "
                          f"nothing of it was scaled; its op types: {', '.join(sorted(ran))}", UserWarning, stacklevel=2)
    return profile
