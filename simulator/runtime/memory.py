"""Device memory of one card: the runtime's glue to the caching allocator.

With memory modelled (``memory=True``) every tensor takes a block of
:class:`~simulator.allocator.NpuCachingAllocator` when it is made and gives it back when the
Python object goes (or on ``npu.free``); a device-visible stall of an allocation (a device
malloc, a failed allocation's flush and retry) lengthens the op that needed the memory, and
every allocator call is kept for the profile's memory records. Without it the live tensors'
bytes (and the HCCL buffers') still count against the card's HBM, a lower bound of what the
caching allocator would need.
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable, Iterable, Sequence

from ..allocator import Allocation, MemoryEvent, NpuCachingAllocator, OutOfMemoryError, format_size
from ..hardware import HardwareSpec
from ..profile import LiveMemory, MemoryPeak, MemoryRecord, OpRecord, StepMemory, build_records
from ..units import DTYPE_BYTES
from .callsite import call_site
from .record import overlap
from .tensor import Tensor, mark_freed
from .timeline import Timeline

#: Where each field of a :class:`MemoryEvent` sits in a noted allocator call: ``(step, device
#: clock) + event``, a plain tuple of numbers and strings (see :meth:`MemoryTracker.note`).
_CALL_INDEX = {name: 2 + i for i, name in enumerate(MemoryEvent._fields)}
#: Without memory modelling: references of tensors that went, queued before they are settled.
_SETTLE_BATCH = 1024
_MEMORY_RECORD_FIELDS = tuple(MemoryRecord.model_fields)  # step, time_s, then fields of the event
_memory_record_values = operator.itemgetter(0, 1, *(_CALL_INDEX[name] for name in _MEMORY_RECORD_FIELDS[2:]))


def _keep_alive(*_: object) -> None:
    """Finalizer of a view: holding its base tensor as an argument keeps the base alive."""


class _Tracked(weakref.ref):
    """Without memory modelling: a weak reference to a tensor whose bytes count as live, the
    key of its bytes in ``MemoryTracker._tracked``. Its callback, a C call (``list.append``),
    queues it when the tensor goes; made without a Python call (no ``__init__`` of its own).

    Hashed and compared as itself (both C slots of ``object``), where a plain weak reference
    hashes as its tensor: a dead tensor's address is soon another's, and the queued references
    of dead tensors then made long probe chains in the dictionary (a loop of one op whose
    output dies at once ran half as long again)."""

    __slots__ = ()
    __hash__ = object.__hash__
    __eq__ = object.__eq__
    __ne__ = object.__ne__


class _HeldMemory(weakref.ref):
    """A weak reference to a tensor that holds device memory: the allocation, and the tensor's
    id (its key in ``MemoryTracker.finalizers``). Its callback, :meth:`MemoryTracker.release`,
    gives the memory back when the tensor goes; one object per tensor, where a plain reference
    took a partial of a bound method too."""

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


class MemoryTracker:
    """Who holds the card's memory, and what allocating it costs the timeline.

    Args:
        hardware: the card.
        allocator: the caching allocator (memory modelled), or ``None``: live bytes only.
        records: the run's op records (the same list the collector keeps): a stall is charged
            to the last one, and an allocation names the op it is for.
        timeline: the card's streams, lengthened by the stalls charged to an op already placed.
    """

    def __init__(self, hardware: HardwareSpec, allocator: NpuCachingAllocator | None, records: list[OpRecord],
                 timeline: Timeline) -> None:
        self.hardware = hardware
        self.allocator = allocator
        self._records = records
        self._timeline = timeline
        #: Without memory modelling: the bytes of the tensors this NPU made (and of its HCCL
        #: communicators' buffers), a lower bound of what the caching allocator would hold once
        #: the tensors that went are settled (settle), so that a workload past the card's HBM is
        #: out of memory in every mode (see allocate). Each tracked tensor has a weak reference
        #: (a _Tracked) in _tracked, to its bytes, whose callback is _gone.append: a C call that
        #: queues the reference when the tensor goes, settled in batches (and whenever the total
        #: would pass the capacity). No Python call per tensor: a _HeldMemory (its __init__) and
        #: a Python callback cost twice as much. All told the tracking costs a default
        #: Llama-2-7B run about 4 to 6 % more interpreter instructions (callgrind, issue 20).
        self.live_bytes = 0
        self.capacity_bytes = hardware.memory.hbm_capacity_bytes
        self._tracked: dict[_Tracked, int] = {}
        self._gone: list[_Tracked] = []
        self._gone_callback = self._gone.append
        #: A stall not charged to an op yet, and its allocator counts: the next op's record takes them.
        self.pending_stall_s = 0.0
        self.pending_allocs = self.pending_retries = self.pending_device_frees = self.pending_device_mallocs = 0
        #: For each live tensor holding memory (by id): a weak reference whose callback gives
        #: the memory back when the tensor goes. Held here, not in weakref.finalize's registry,
        #: whose strong references to the NPU kept every memory-modelling NPU alive as long as
        #: one of its tensors was (the job-long tensors of simulator.models: for ever).
        self.finalizers: dict[int, _HeldMemory] = {}
        self._release_callback = self.release  # one bound method for every tensor's reference
        self._communicators: set[frozenset[int]] = set()  # HCCL groups used so far
        #: Every allocator call, as ``(step, device clock) + event`` (:meth:`note`).
        self.calls: list[tuple] = []
        self._step_first_call = 0  # index in calls of the open step's first call
        #: For each view: the tensor that owns its allocation, and the view's offset in it.
        self.views: weakref.WeakKeyDictionary[Tensor, tuple[Tensor, int]] = weakref.WeakKeyDictionary()

    # -- tensors -------------------------------------------------------------------------------

    def allocate(self, tensor: Tensor, charge_last: bool = True, source: str | None = None) -> Tensor:
        """Give ``tensor`` device memory; free it when the object goes away. A device-visible
        stall (a device malloc, or a failed allocation's synchronise, cache flush and retry)
        lengthens the op that produced the tensor (``charge_last``) or the next op. ``source``:
        the user's line that made a tensor no op produced (default: found on the stack).

        Without memory modelling the tensor's bytes count in the live total until it goes.

        Raises:
            OutOfMemoryError: the card's HBM cannot hold it (with memory modelled: as the caching
                allocator decides; without: the live tensors' bytes would exceed the capacity).
        """
        if self.allocator is None:
            nbytes = math.prod(tensor.shape) * DTYPE_BYTES[tensor.dtype]
            if self.live_bytes + nbytes > self.capacity_bytes or len(self._gone) > _SETTLE_BATCH:
                self.settle()
                if self.live_bytes + nbytes > self.capacity_bytes:
                    self.check_capacity(nbytes, self._tensor_what(tensor, source))
            self.live_bytes += nbytes
            self._tracked[_Tracked(tensor, self._gone_callback)] = nbytes
            return tensor
        handle, event = self.allocator.alloc(tensor.nbytes)
        producer = tensor.producer_index
        if producer is None:
            self.note(event, "tensor", source or call_site())
        else:
            self.note(event, "output", producer)
        held = _HeldMemory(tensor, self._release_callback, handle)
        self.finalizers[held.key] = held
        self.charge(event, charge_last)
        return tensor

    def free(self, tensor: Tensor) -> None:
        """Give ``tensor``'s memory back now (without memory modelling its bytes leave the live
        total); an op later given ``tensor`` raises (a use after free)."""
        held = self.finalizers.get(id(tensor))
        if held is not None:
            self.release(held)  # the reference, no longer registered, then gives nothing back
            mark_freed(tensor)  # a later op that reads or writes it is a use after free
        elif self.allocator is None and isinstance(tensor, Tensor):
            for ref in weakref.getweakrefs(tensor):  # its tracking reference, if any
                nbytes = self._tracked.pop(ref, None) if type(ref) is _Tracked else None
                if nbytes is not None:
                    self.live_bytes -= nbytes
                    mark_freed(tensor)
                    break

    def allocation_of(self, tensor: Tensor) -> tuple[Tensor, int]:
        """The tensor that owns ``tensor``'s allocation (itself, unless it is a view) and
        ``tensor``'s offset in it, in elements."""
        return self.views.get(tensor, (tensor, 0))

    def add_view(self, view: Tensor, base: Tensor, root: Tensor, offset_elements: int) -> None:
        """``view``, made from ``base``, lies in ``root``'s allocation from element
        ``offset_elements``; with memory modelled it keeps ``base`` (and so the memory) alive."""
        self.views[view] = (root, offset_elements)
        if self.allocator is not None:
            weakref.finalize(view, _keep_alive, base)  # the base's memory lives as long as the view

    def views_of(self, root: Tensor) -> list[Tensor]:
        """The live views of ``root``'s allocation."""
        return [view for view, (owner, _) in self.views.items() if owner is root]

    def release(self, held: _HeldMemory) -> None:
        """Give ``held``'s memory back: called by :meth:`free` or by the weak reference itself
        when the tensor goes. A reference that is no longer the registered one (the tensor was
        freed explicitly, or its id now belongs to another tensor) gives nothing back."""
        if self.finalizers.get(held.key) is not held:
            return
        del self.finalizers[held.key]
        self.note(self.allocator.free(held.handle))

    def settle(self) -> None:
        """Without memory modelling: the bytes of the tracked tensors that went since the last
        call leave the live total (a reference no longer tracked, of a tensor given back by
        :meth:`free`, takes nothing)."""
        tracked, gone = self._tracked, self._gone
        freed = 0
        for ref in gone:
            freed += tracked.pop(ref, 0)
        gone.clear()
        self.live_bytes -= freed

    # -- stalls --------------------------------------------------------------------------------

    def charge(self, event: MemoryEvent, charge_last: bool = True) -> None:
        """Charge a device-visible allocation stall to the op just emitted (``charge_last``, when
        it belongs to this step) or to the next op."""
        device_visible = event.device_mallocs or event.device_frees or event.synchronizations or event.alloc_retried
        stall = event.latency_s if device_visible else 0.0
        records = self._records
        if not device_visible:
            pass  # a cache hit: host bookkeeping, hidden behind the device's queue
        elif charge_last and records and records[-1].step == self._timeline.step:
            record = records[-1]
            compute = record.stream == "compute"
            records[-1] = record.model_copy(update={
                "duration_s": record.duration_s + stall,
                "alloc_stall_s": record.alloc_stall_s + stall,
                "alloc_count": record.alloc_count + 1,
                "alloc_retries": record.alloc_retries + int(event.alloc_retried),
                "device_frees": record.device_frees + event.device_frees,
                "device_mallocs": record.device_mallocs + event.device_mallocs,
                "overlap_frac": (overlap(record.overlapped_s, record.overlappable_s, record.alloc_stall_s + stall)
                                 if compute else record.overlap_frac),
            })
            self._timeline.lengthen(compute, not record.attrs.get("async_op"), stall)
        else:
            self.pending_stall_s += stall
            self.pending_allocs += 1
            self.pending_retries += int(event.alloc_retried)
            self.pending_device_frees += event.device_frees
            self.pending_device_mallocs += event.device_mallocs

    def workspace(self, size: int) -> None:
        """The kernel's workspace of ``size`` bytes (:func:`simulator.costs.op_workspace_bytes`)
        for the op just emitted, as torch_npu's default task queue takes it: a caching-allocator
        block allocated after the op's outputs, right before the kernel is queued, and freed once
        it is. Its stall (a device malloc, or a flush and retry) is charged to that op."""
        if self.allocator is None:  # taken and given back around the kernel
            if self.live_bytes + size > self.capacity_bytes:
                self.settle()
                record = self._records[-1]
                self.check_capacity(size, f"the workspace of {record.op_type} {record.name!r} (at {record.source})")
            return
        handle, event = self.allocator.alloc(size)
        self.note(event, "workspace", len(self._records) - 1)
        self.charge(event)
        self.note(self.allocator.free(handle))

    def communicator(self, group: tuple[int, ...]) -> None:
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
            self.settle()
            self.check_capacity(size, what)
            self.live_bytes += size  # held for the rest of the job
            return
        event = self.allocator.take_device_memory(size, what=what)
        self.note(event)
        self.pending_stall_s += event.latency_s
        self.pending_device_mallocs += event.device_mallocs
        self.pending_device_frees += event.device_frees

    # -- out of memory -------------------------------------------------------------------------

    def _tensor_what(self, tensor: Tensor, source: str | None = None) -> str:
        """What made ``tensor``, for an out-of-memory message: the op (type, name, call site) or
        the call of ``npu.tensor`` / ``npu.from_numpy`` (``source``: the user's line a front end
        gave, as :meth:`allocate` takes it); with its shape and dtype."""
        index = tensor.producer_index
        if index is None:
            made = f"a tensor made at {source or call_site()}"
        else:
            record = self._records[index]
            made = f"the output of {record.op_type} {record.name!r} (at {record.source})"
        return f"{made}, shape {list(tensor.shape)} {tensor.dtype}"

    def check_capacity(self, nbytes: int, what: str) -> None:
        """Without memory modelling: raise when ``nbytes`` more (for ``what``) would take the
        live bytes past the card's HBM capacity.

        Raises:
            OutOfMemoryError: they would; the message names ``what``, the bytes and the capacity.
        """
        live, capacity = self.live_bytes, self.capacity_bytes
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

    def check_inputs_fit(self, op_type: str, name: str | None, inputs: Sequence[Tensor]) -> None:
        """An op cannot read an input larger than the card's HBM, wherever the tensor came from
        (a ``Tensor`` made directly holds no memory of this NPU). Checked once per op spec.

        Raises:
            OutOfMemoryError: an input is larger than the HBM capacity.
        """
        capacity = self.capacity_bytes
        for i, t in enumerate(inputs):
            nbytes = math.prod(t.shape) * DTYPE_BYTES.get(t.dtype, 0)  # an unknown dtype: op_cost says so
            if nbytes > capacity:
                raise OutOfMemoryError(
                    f"NPU out of memory. {op_type} {name or op_type!r} (at {call_site()}) reads input {i + 1}, "
                    f"shape {list(t.shape)} {t.dtype}, of {format_size(nbytes)} ({nbytes} bytes); "
                    f"{self.hardware.name} has {format_size(capacity)} ({capacity} bytes) of HBM",
                    requested_bytes=nbytes)

    # -- what the profile gets -----------------------------------------------------------------

    def note(self, event: MemoryEvent, kind: str | None = None, owner: int | str | None = None) -> None:
        """Keep an allocator call for the step's tally and the profile's memory records, as a
        plain tuple: one of numbers and strings only, which the garbage collector stops
        tracking (a long run keeps hundreds of thousands of them; records, each a model and a
        set, are made once, in :meth:`memory_records`). An allocation says what it is for:
        ``kind`` ``"output"`` or ``"workspace"`` of the op record at index ``owner``, or
        ``"tensor"`` made by ``npu.tensor`` / ``npu.from_numpy`` at the call site ``owner``."""
        timeline = self._timeline
        self.calls.append((timeline.step, timeline.clock_s) + event + (kind, owner))

    def close_step(self, step: int) -> StepMemory | None:
        """The statistics of step ``step``, now over (``None`` without memory modelling); the
        allocator's peaks start again for the next step."""
        if self.allocator is None:
            return None
        stats = self.allocator.stats()
        t = _StepMemoryTally(self.calls[self._step_first_call:])
        step_memory = StepMemory.model_construct(
            step=step, allocated_peak_bytes=stats.allocated_bytes_peak, reserved_peak_bytes=stats.reserved_bytes_peak,
            allocated_end_bytes=stats.allocated_bytes, reserved_end_bytes=stats.reserved_bytes,
            inactive_split_bytes=stats.inactive_split_bytes, largest_free_block_bytes=stats.largest_free_block_bytes,
            alloc_count=t.allocs, free_count=t.frees, device_mallocs=t.device_mallocs, device_frees=t.device_frees,
            alloc_retries=t.retries, alloc_time_s=t.alloc_time_s,
        )
        self.allocator.reset_peak_stats()
        self._step_first_call = len(self.calls)
        return step_memory

    def peak(self) -> MemoryPeak | None:
        """What held device memory when the allocated bytes first reached the run's peak: the
        live allocations then, grouped by op type, kind and call site (one replay of the
        allocator calls up to that one)."""
        calls = self.calls
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

    def memory_records(self) -> list[MemoryRecord]:
        """The profile's record of every allocator call."""
        return build_records(MemoryRecord, _MEMORY_RECORD_FIELDS, map(_memory_record_values, self.calls))
