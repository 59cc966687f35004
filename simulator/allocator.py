"""A model of torch_npu's NPU caching allocator, with the host time of each call.

torch_npu's ``NPUCachingAllocator.cpp`` is a port of PyTorch's ``CUDACachingAllocator.cpp``.
This module reproduces its decisions on a simulated HBM: which pool a request goes to, which
cached block it reuses, when a block is split, when freed neighbours merge, when the allocator
calls ``aclrtMalloc`` / ``aclrtFree``, and what it does when the device is full. Nothing is
stored on the device: blocks are address ranges in a simulated device address space.

Rules, with the function of torch_npu's ``NPUCachingAllocator.cpp`` (github.com/Ascend/pytorch,
``torch_npu/csrc/core/npu/NPUCachingAllocator.cpp``) that each follows:

* ``round_size``: add 32 B to the request, then round up to a multiple of 512 B (at least 512 B).
  ``allocate(0)`` allocates nothing and returns a null pointer.
* ``get_pool``: rounded size <= 1 MiB goes to the small pool, the rest to the large pool.
* ``get_allocation_size``: a new segment is 2 MiB (small pool), 20 MiB (large requests under
  10 MiB), or the request rounded up to a multiple of 2 MiB.
* ``get_free_block``: best fit, the smallest cached block of the same stream that is large
  enough, ties broken by the lower address. With ``max_split_size``, a request below it never
  takes a block at or above it, and a request at or above it only takes a block less than
  20 MiB (``kLargeBuffer``) larger than itself.
* ``should_split``: small pool (and expandable segments) split when at least 512 B would remain;
  large pool when the request is below ``max_split_size`` and more than 1 MiB would remain.
* ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours of its segment
  and stays cached (reserved).
* ``malloc``: cached block, else (``garbage_collect_cached_blocks`` if a garbage-collection
  threshold and a memory fraction are set) a new segment, else
  ``release_available_cached_blocks`` (only with ``max_split_size``) and a new segment, else
  ``release_cached_blocks`` (synchronise the device, free every unsplit cached segment) and a
  retry counted in ``num_alloc_retries``; if that fails, ``num_ooms`` and an out-of-memory error
  whose message follows torch_npu's.
* Expandable segments (``find_expandable_block``, ``map_block``, ``unmap_block``,
  ``ExpandableSegment``): one virtual range per pool and stream, sized for 1 1/8 of HBM, backed
  by 2 MiB (small pool) or 20 MiB (large pool) physical pages mapped on demand; freeing the cache
  unmaps whole free pages; large blocks start on a 16 KiB boundary.

Simplified, and said so where it matters:

* ``record_stream`` and the events it creates are not modelled: a freed block is reusable at
  once by its own stream. Blocks are never shared between streams (as in torch_npu).
* The free-memory callbacks and the workspace allocator torch_npu empties before its retry are
  not modelled.
* Device addresses come from a bump allocator aligned to 2 MiB and are never reused.
* The device holds only this allocator's memory: ``aclrtMalloc`` fails exactly when the reserved
  bytes plus the new segment exceed the capacity (by default the HBM capacity).
* A failed ``aclrtMalloc`` is charged like a successful one. Synchronisations cost their fixed
  latency only; waiting for queued work is the caller's business (it drives simulated time).
* Expandable segments are off by default, as in PyTorch and recent torch_npu (some torch_npu
  releases turn them on when the driver supports virtual memory). As in torch_npu, they do not
  count in ``segment_count``, and mapping or unmapping costs per page, not per call.
* Reserved pools (:meth:`NpuCachingAllocator.reserve_pool`) are this simulator's own design,
  modelled on PyTorch's private memory pools (``PrivatePool`` / ``torch.cuda.MemPool``), but of a
  fixed size: see the method.

Every public method returns a :class:`MemoryEvent` with the host time the call took.
"""

from __future__ import annotations

import bisect
import itertools
import math
import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from .hardware import AllocatorSpec, HardwareSpec
from .units import GiB, KiB, MiB

#: First simulated device address. Arbitrary: only distinct, aligned addresses matter.
_DEVICE_ADDRESS_BASE = 0x1000_0000_0000

_STAT_TYPES = ("all", "small_pool", "large_pool")
_STAT_NAMES = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)


class OutOfMemoryError(RuntimeError):
    """The allocator could not serve a request, even after freeing its cache.

    Mirrors ``torch.OutOfMemoryError`` (a ``RuntimeError``). ``event`` holds the work done
    before giving up (synchronisations, freed segments) and its host time; it is ``None`` when
    no allocator model ran: the runtime's capacity check without memory modelling
    (:class:`simulator.runtime.NPU`, ``memory=False``) raises this error too, for a workload
    whose live tensors alone exceed the card's HBM.
    """

    def __init__(self, message: str, *, requested_bytes: int, event: MemoryEvent | None = None) -> None:
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.event = event


class AllocatorConfig(BaseModel):
    """Allocator settings, the model of ``PYTORCH_NPU_ALLOC_CONF`` plus the memory fraction.

    ``per_process_memory_frac`` is ``torch.npu.set_per_process_memory_fraction``: segments may
    not exceed this share of the capacity. As in torch_npu, the garbage collection threshold
    only acts when a memory fraction is set, and expandable segments cannot be combined with
    ``max_split_size_bytes`` or a garbage collection threshold.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    max_split_size_bytes: PositiveInt | None = Field(
        default=None, description="max_split_size_mb in bytes: larger blocks are never split"
    )
    garbage_collection_threshold_frac: float | None = Field(default=None, gt=0, lt=1)
    expandable_segments: bool = False
    per_process_memory_frac: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _expandable_alone(self) -> AllocatorConfig:
        if self.expandable_segments and (
            self.max_split_size_bytes is not None
            or self.garbage_collection_threshold_frac is not None
        ):
            raise ValueError(
                "expandable_segments cannot be combined with max_split_size_bytes or "
                "garbage_collection_threshold_frac (torch_npu refuses the combination)"
            )
        return self

    @classmethod
    def from_conf_string(cls, conf: str) -> AllocatorConfig:
        """Parse a ``PYTORCH_NPU_ALLOC_CONF`` value, e.g. ``"max_split_size_mb:128"``.

        Known keys: ``max_split_size_mb`` (MiB), ``garbage_collection_threshold``,
        ``expandable_segments`` (``True`` / ``False``).

        Raises:
            ValueError: an unknown key, a malformed entry or a value out of range.
        """
        if not isinstance(conf, str):
            raise TypeError(f"allocator settings must be a PYTORCH_NPU_ALLOC_CONF string such as "
                            f"'max_split_size_mb:128', got {conf!r}")
        values: dict[str, object] = {}
        keys = {}  # model field -> the setting that gave it, for messages
        for entry in filter(None, (part.strip() for part in conf.split(","))):
            key, sep, value = (s.strip() for s in entry.partition(":"))
            if not sep or not value:
                raise ValueError(f"allocator setting {entry!r} is not 'key:value'")
            if key in keys.values():
                raise ValueError(f"allocator setting {key!r} is given twice in {conf!r}")
            if key == "max_split_size_mb":
                if not value.isdigit():
                    raise ValueError(f"max_split_size_mb takes a whole number of MiB, got {value!r}")
                field_name, parsed = "max_split_size_bytes", int(value) * MiB
            elif key == "garbage_collection_threshold":
                try:
                    parsed = float(value)
                except ValueError:
                    raise ValueError(f"garbage_collection_threshold takes a fraction, got {value!r}") from None
                field_name = "garbage_collection_threshold_frac"
            elif key == "expandable_segments":
                if value not in ("True", "False"):
                    raise ValueError(f"expandable_segments takes True or False, got {value!r}")
                field_name, parsed = "expandable_segments", value == "True"
            else:
                raise ValueError(f"unrecognized allocator setting {key!r} (known: max_split_size_mb, "
                                 "garbage_collection_threshold, expandable_segments)")
            values[field_name], keys[field_name] = parsed, key
        try:
            return cls.model_validate(values)
        except ValidationError as exc:  # a value out of range, or a combination torch_npu refuses
            error = exc.errors()[0]
            setting = f"{keys[error['loc'][0]]}: " if error["loc"] else ""
            raise ValueError(f"allocator settings {conf!r}: {setting}{error['msg'].removeprefix('Value error, ')}") \
                from None


class Allocation(NamedTuple):
    """A live allocation, the handle :meth:`NpuCachingAllocator.free` takes back.

    ``size_bytes`` is the block handed out (the rounded request, or more when the cached block
    was not split). A zero-byte request gives the null allocation: address 0, nothing reserved.
    A named tuple (immutable), as :class:`MemoryEvent`: one is made per allocation, and a tuple
    costs a fraction of a frozen dataclass.
    """

    allocation_id: int
    address: int
    size_bytes: int
    requested_bytes: int
    stream: int
    pool: str


class MemoryEvent(NamedTuple):
    """What one allocator call did and the host time it took (a named tuple: one is made per
    call).

    ``device_mallocs`` counts ``aclrtMalloc`` calls, or pages mapped with expandable segments;
    ``device_frees`` counts ``aclrtFree`` calls or pages unmapped. ``cache_flushed`` is set when
    the call ran ``release_cached_blocks`` (synchronise, then free the unsplit cache).
    ``allocated_bytes`` and ``reserved_bytes`` are the device totals after the call.
    """

    action: Literal["alloc", "free", "empty_cache", "reserve_pool", "release_pool", "external"]
    latency_s: float
    requested_bytes: int
    rounded_bytes: int
    block_bytes: int
    address: int
    pool: str
    stream: int
    cache_hit: bool
    device_mallocs: int
    device_malloc_bytes: int
    failed_device_mallocs: int
    device_frees: int
    device_free_bytes: int
    synchronizations: int
    cache_flushed: bool
    alloc_retried: bool
    allocated_bytes: int
    reserved_bytes: int


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """One block of a segment in :meth:`NpuCachingAllocator.snapshot`."""

    address: int
    size_bytes: int
    requested_bytes: int
    allocated: bool
    mapped: bool


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One device segment and its blocks, in address order.

    For an expandable segment ``size_bytes`` is the virtual range; only ``mapped`` blocks are
    backed by HBM.
    """

    address: int
    size_bytes: int
    stream: int
    pool: str
    is_expandable: bool
    blocks: tuple[BlockInfo, ...]


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Device totals, named as in ``torch.npu.memory_stats()`` (``*.all.current`` / ``.peak``).

    ``largest_free_block_bytes`` and ``cached_free_bytes`` are ``torch.npu`` ``cacheInfo``:
    the largest and the total of the cached free blocks.
    """

    allocated_bytes: int
    allocated_bytes_peak: int
    reserved_bytes: int
    reserved_bytes_peak: int
    active_bytes: int
    active_bytes_peak: int
    requested_bytes: int
    active_count: int
    allocation_count: int
    segment_count: int
    inactive_split_count: int
    inactive_split_bytes: int
    largest_free_block_bytes: int
    cached_free_bytes: int
    num_alloc_retries: int
    num_ooms: int
    num_device_alloc: int
    num_device_free: int
    num_sync_all_streams: int
    flat: dict[str, int] = field(repr=False)

    def as_torch_dict(self) -> dict[str, int]:
        """The flat ``torch.npu.memory_stats()`` dictionary, e.g. ``allocated_bytes.all.peak``.

        Reserved pools count under ``all`` only, so ``small_pool`` + ``large_pool`` may be
        less than ``all``.
        """
        return dict(self.flat)


def round_size(size_bytes: int, spec: AllocatorSpec) -> int:
    """Block size for a request of ``size_bytes``: torch_npu ``round_size``.

    ``size_bytes + 32`` rounded up to a multiple of 512 B, at least 512 B; so 0 -> 512,
    480 -> 512, 481 -> 1024. (The tensor allocator never calls it for 0 bytes.)

    Raises:
        ValueError: ``size_bytes`` is negative.
    """
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    padded = size_bytes + spec.request_padding_bytes
    return max(spec.min_block_bytes, _round_up(padded, spec.min_block_bytes))


def pool_for_size(rounded_bytes: int, spec: AllocatorSpec) -> Literal["small", "large"]:
    """Pool of a rounded request: small up to and including 1 MiB (torch_npu ``get_pool``)."""
    return "small" if rounded_bytes <= spec.small_size_bytes else "large"


def allocation_size(rounded_bytes: int, spec: AllocatorSpec) -> int:
    """Size of the segment a rounded request makes: torch_npu ``get_allocation_size``.

    2 MiB for the small pool; 20 MiB for large requests under 10 MiB; otherwise the request
    rounded up to a multiple of 2 MiB.
    """
    if rounded_bytes <= spec.small_size_bytes:
        return spec.small_buffer_bytes
    if rounded_bytes < spec.min_large_alloc_bytes:
        return spec.large_buffer_bytes
    return _round_up(rounded_bytes, spec.round_large_bytes)


def format_size(size_bytes: int) -> str:
    """A size as torch's allocator messages print it: ``512 bytes``, ``2.00 MiB``, ``1.50 GiB``."""
    if size_bytes <= KiB:
        return f"{size_bytes} bytes"
    if size_bytes <= MiB:
        return f"{size_bytes / KiB:.2f} KiB"
    if size_bytes <= GiB:
        return f"{size_bytes / MiB:.2f} MiB"
    return f"{size_bytes / GiB:.2f} GiB"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# -- internal state -----------------------------------------------------------------------------


class _Ordered:
    """Blocks kept in the order of ``key`` (torch's ``std::set`` with a comparator).

    A sorted list of entries, ``entry(block)``: the block's sort key followed by the block
    itself. Keys are unique (they end with the block's address), so comparing entries never
    reaches the blocks, and a block's entry (``block.key``) finds it again after its size or
    address changed.
    """

    def __init__(self, entry: Callable[[_Block], tuple[int | _Block, ...]]) -> None:
        self._entry = entry
        self._entries: list[tuple[int | _Block, ...]] = []

    def add(self, block: _Block) -> None:
        entry = self._entry(block)
        bisect.insort(self._entries, entry)
        block.key = entry

    def remove(self, block: _Block) -> None:
        entry = block.key
        i = bisect.bisect_left(self._entries, entry)
        if i == len(self._entries) or self._entries[i] is not entry:
            raise RuntimeError("allocator model: block is not in the set it should be in")
        del self._entries[i]
        block.key = None

    def lower_bound(self, key: tuple[int, ...]) -> int:
        return bisect.bisect_left(self._entries, key)

    def at(self, index: int) -> _Block:
        return self._entries[index][-1]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[_Block]:
        return iter([entry[-1] for entry in self._entries])


@dataclass(eq=False)
class _BlockPool:
    name: str
    is_small: bool
    private: bool = False
    blocks: _Ordered = field(default_factory=lambda: _Ordered(lambda b: (b.stream, b.size, b.address, b)))
    unmapped: _Ordered = field(default_factory=lambda: _Ordered(lambda b: (b.stream, b.address, b)))
    #: For each statistic, the counters a change in this pool moves: ``all`` and the pool's own
    #: type (a reserved pool counts under ``all`` only). Filled by the allocator.
    stats: dict[str, tuple[_Stat, ...]] = field(default_factory=dict)
    #: The allocation and active counters, then their byte counters: they move together, as a
    #: block is active exactly while it is allocated (record_stream is not modelled).
    allocated_counts: tuple[_Stat, ...] = ()
    allocated_bytes: tuple[_Stat, ...] = ()


@dataclass(eq=False, slots=True)
class _Segment:
    address: int
    size_bytes: int
    stream: int
    pool: _BlockPool
    page_bytes: int = 0
    pages: list[bool] | None = None  # expandable segments: which pages are mapped

    @property
    def expandable(self) -> bool:
        return self.pages is not None


@dataclass(eq=False, slots=True)
class _Block:
    address: int
    size: int
    stream: int
    pool: _BlockPool
    segment: _Segment
    allocated: bool = False
    mapped: bool = True
    prev: _Block | None = None
    next: _Block | None = None
    requested_bytes: int = 0
    gc_count: int = 0
    allocation_id: int = 0
    key: tuple[int | _Block, ...] | None = None  # its entry in the _Ordered set it is in

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before: _Block | None, after: _Block | None) -> None:
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after


@dataclass(eq=False, slots=True)
class _Stat:
    """One counter of ``torch.npu.memory_stats()``: current value, peak, and the running total
    of its increases (``allocated``). The running total of its decreases, ``freed``, is
    ``allocated - current``: every change moves ``current`` and one of the two totals."""

    current: int = 0
    peak: int = 0
    allocated: int = 0

    @property
    def freed(self) -> int:
        return self.allocated - self.current


def _grow(stats: tuple[_Stat, ...], amount: int) -> None:
    """Raise the counters ``stats`` by ``amount`` (>= 0): current, peak and running total."""
    for stat in stats:
        current = stat.current + amount
        stat.current = current
        stat.allocated += amount
        if current > stat.peak:  # noqa: PLR1730 (not max(): a comparison costs less than a call here)
            stat.peak = current


def _shrink(stats: tuple[_Stat, ...], amount: int) -> None:
    """Lower the counters ``stats`` by ``amount`` (>= 0); their ``freed`` totals follow."""
    for stat in stats:
        stat.current -= amount


def _move(stats: tuple[_Stat, ...], amount: int) -> None:
    """Move the counters ``stats`` by ``amount`` of either sign."""
    if amount > 0:
        _grow(stats, amount)
    else:
        for stat in stats:
            stat.current += amount


@dataclass(slots=True)
class _Tally:
    """Work done by one public call, turned into a :class:`MemoryEvent` at the end. A call
    that does no device work (a cache hit, a free) uses the allocator's read-only tallies."""

    latency_s: float = 0.0
    device_mallocs: int = 0
    device_malloc_bytes: int = 0
    failed_device_mallocs: int = 0
    device_frees: int = 0
    device_free_bytes: int = 0
    synchronizations: int = 0
    cache_flushed: bool = False
    alloc_retried: bool = False


@dataclass(eq=False)
class _ReservedPool:
    name: str
    stream: int
    pool: _BlockPool
    segment: _Segment
    live_count: int = 0


class NpuCachingAllocator:
    """One device's caching allocator (torch_npu ``DeviceCachingAllocator``), as a model.

    ``alloc`` and ``free`` change the model's state and return what they did and their host
    time; the caller advances simulated time by ``event.latency_s``. Streams are integers.

    Args:
        hw: hardware spec; its ``allocator`` group gives the rules and costs, and its HBM
            capacity the device size.
        config: allocator settings (default: torch_npu's defaults, expandable segments off).
        capacity_bytes: device memory the allocator may use, if not the whole HBM (for example
            HBM minus what the driver and HCCL hold).
        device: device index, used in messages only.

    Raises:
        ValueError: ``max_split_size_bytes`` is not above 20 MiB (``kLargeBuffer``), as
            torch_npu requires, or ``capacity_bytes`` is not positive.
    """

    def __init__(
        self,
        hw: HardwareSpec,
        config: AllocatorConfig | None = None,
        *,
        capacity_bytes: int | None = None,
        device: int = 0,
    ) -> None:
        self._spec = hw.allocator
        self._config = config or AllocatorConfig()
        self._capacity_bytes = hw.memory.hbm_capacity_bytes if capacity_bytes is None else capacity_bytes
        if self._capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {self._capacity_bytes}")
        max_split = self._config.max_split_size_bytes
        if max_split is not None and max_split <= self._spec.large_buffer_bytes:
            raise ValueError(
                f"max_split_size_bytes must be above {format_size(self._spec.large_buffer_bytes)} "
                f"(max_split_size_mb > {self._spec.large_buffer_bytes // MiB}), got {max_split}"
            )
        self._max_split: float = math.inf if max_split is None else max_split
        frac = self._config.per_process_memory_frac
        self._allowed_bytes: int | None = None if frac is None else int(frac * self._capacity_bytes)
        self._gc_enabled = (
            self._allowed_bytes is not None
            and self._config.garbage_collection_threshold_frac is not None
        )
        self._device = device
        self._stats = {name: {t: _Stat() for t in _STAT_TYPES} for name in _STAT_NAMES}
        self._all_allocated_bytes = self._stats["allocated_bytes"]["all"]
        self._small = self._new_pool("small", is_small=True)
        self._large = self._new_pool("large", is_small=False)
        self._reserved_pools: dict[str, _ReservedPool] = {}
        self._live: dict[int, _Block] = {}
        self._segments: list[_Segment] = []
        self._reserved_total = 0  # torch's total_allocated_memory: bytes backed by HBM
        self._external_bytes = 0  # HBM other libraries took (take_device_memory)
        self._next_address = _DEVICE_ADDRESS_BASE
        self._ids = itertools.count(1)
        # moved by _grow and _shrink like a pool's counters
        self._oversize = {"oversize_allocations": (_Stat(),), "oversize_segments": (_Stat(),)}
        (self._oversize_allocations,), (self._oversize_segments,) = self._oversize.values()
        self._num_alloc_retries = 0
        self._num_ooms = 0
        self._num_device_alloc = 0
        self._num_device_free = 0
        self._num_sync_all_streams = 0
        # The tallies of the calls that do no device work: read only.
        self._cache_hit_tally = _Tally(latency_s=self._spec.cached_alloc_latency_s)
        self._cached_free_tally = _Tally(latency_s=self._spec.cached_free_latency_s)

    # -- public API -----------------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        """Device memory the allocator may reserve, in bytes."""
        return self._capacity_bytes

    @property
    def config(self) -> AllocatorConfig:
        return self._config

    def alloc(
        self, size_bytes: int, *, stream: int = 0, pool: str | None = None
    ) -> tuple[Allocation, MemoryEvent]:
        """Allocate ``size_bytes`` for use on ``stream``, from a reserved pool if ``pool`` names one.

        Returns the allocation handle and the event (host time, cache hit, device calls).

        Raises:
            ValueError: ``size_bytes`` is negative or not an integer, ``pool`` is not a reserved
                pool, or the reserved pool belongs to another stream.
            OutOfMemoryError: no cached block fits and the device cannot hold a new segment
                even after the cache is freed (or the reserved pool has no room).
        """
        if (type(size_bytes) is not int and not _is_int(size_bytes)) or size_bytes < 0:
            raise ValueError(f"size_bytes must be a non-negative integer, got {size_bytes!r}")
        size_bytes = int(size_bytes)
        if pool is not None and pool not in self._reserved_pools:
            known = ", ".join(sorted(self._reserved_pools)) or "none"
            raise ValueError(f"no reserved pool {pool!r} (reserved pools: {known})")
        if size_bytes == 0:
            # torch_npu's allocate(0) returns a null pointer without taking the lock.
            handle = Allocation(0, 0, 0, 0, stream, pool or "none")
            return handle, self._handle_event("alloc", _Tally(), handle, 0)
        if pool is not None:
            return self._alloc_reserved(size_bytes, stream, self._reserved_pools[pool])
        return self._alloc_general(size_bytes, stream)

    def free(self, allocation: Allocation) -> MemoryEvent:
        """Return ``allocation`` to the cache: the block merges with free neighbours and stays
        reserved. Freeing the null allocation does nothing.

        Raises:
            ValueError: ``allocation`` is not live (already freed, or from another allocator).
        """
        if allocation.address == 0:
            return self._handle_event("free", _Tally(), allocation, 0)
        block = self._live.get(allocation.address)
        if block is None or block.allocation_id != allocation.allocation_id:
            raise ValueError(f"invalid device pointer: {allocation.address:#x} is not allocated")
        del self._live[allocation.address]
        block.allocated = False
        _shrink(block.pool.allocated_counts, 1)
        _shrink(block.pool.allocated_bytes, block.size)
        if block.size >= self._max_split:
            _shrink(self._oversize["oversize_allocations"], 1)
        if block.pool.private:
            self._reserved_pools[block.pool.name].live_count -= 1
        self._free_block(block)
        rounded = round_size(allocation.requested_bytes, self._spec)
        return self._handle_event("free", self._cached_free_tally, allocation, rounded)

    def empty_cache(self) -> MemoryEvent:
        """``torch.npu.empty_cache()``: synchronise, free every unsplit cached segment of the
        general pools and unmap the free pages of expandable segments. Reserved pools stay."""
        tally = _Tally()
        self._release_cached_blocks(tally)
        return self._event("empty_cache", tally, rounded_bytes=0)

    def take_device_memory(self, size_bytes: int, *, what: str) -> MemoryEvent:
        """``size_bytes`` of HBM taken by another library with its own ``aclrtMalloc`` (HCCL's
        communicator buffers): it is not reserved by this allocator, but its segments and the
        outside memory share the device's capacity from now on (``external_bytes``).

        When the device has no room the unsplit cache is freed first (synchronise and free, as
        ``empty_cache``) so that memory this allocator only caches does not fail the other
        library (a simplification: whether torch_npu frees its cache for HCCL is not documented).

        Raises:
            ValueError: ``size_bytes`` is not a positive integer.
            OutOfMemoryError: it does not fit even after the cache is freed (the message names
                ``what``).
        """
        if not _is_int(size_bytes) or size_bytes <= 0:
            raise ValueError(f"size_bytes must be a positive integer, got {size_bytes!r}")
        size_bytes = int(size_bytes)
        tally = _Tally(latency_s=self._spec.device_malloc_latency_s)
        if self._reserved_total + self._external_bytes + size_bytes > self._capacity_bytes:
            self._release_cached_blocks(tally)
        if self._reserved_total + self._external_bytes + size_bytes > self._capacity_bytes:
            self._num_ooms += 1
            raise OutOfMemoryError(
                self._oom_message(size_bytes, size_bytes, size_bytes, what),
                requested_bytes=size_bytes,
                event=self._event("external", tally, rounded_bytes=size_bytes, requested_bytes=size_bytes),
            )
        self._external_bytes += size_bytes
        tally.device_mallocs += 1
        tally.device_malloc_bytes += size_bytes
        return self._event("external", tally, rounded_bytes=size_bytes, requested_bytes=size_bytes,
                           block_bytes=size_bytes)

    @property
    def external_bytes(self) -> int:
        """HBM taken outside this allocator (:meth:`take_device_memory`), in bytes."""
        return self._external_bytes

    def reserve_pool(self, name: str, size_bytes: int, *, stream: int = 0) -> MemoryEvent:
        """Reserve a fixed region of ``size_bytes`` (rounded up to 2 MiB) for ``alloc(pool=name)``.

        The region is one ``aclrtMalloc`` made now. Allocations from it use best fit and split
        whenever 512 B would remain; freed blocks merge back; it never grows, never serves the
        general pools, and ``empty_cache`` leaves it alone, so a temporary tensor allocated and
        freed every step reuses the same memory without a device call. Like PyTorch's private
        pools (``PrivatePool``, ``torch.cuda.MemPool``) it is bound to one stream, but unlike them
        it has a fixed size: a request that does not fit raises instead of growing the pool.

        Raises:
            ValueError: ``name`` is already reserved or empty, or ``size_bytes`` is not positive.
            OutOfMemoryError: the device cannot hold the region even after the cache is freed.
        """
        if not name or name in self._reserved_pools:
            raise ValueError(f"reserved pool name {name!r} is empty or already in use")
        if not _is_int(size_bytes) or size_bytes <= 0:
            raise ValueError(f"size_bytes must be a positive integer, got {size_bytes!r}")
        region_bytes = _round_up(size_bytes, self._spec.round_large_bytes)
        block_pool = self._new_pool(name, is_small=False, private=True)
        tally = _Tally()
        block = self._alloc_segment(block_pool, stream, region_bytes, tally)
        if block is None:
            self._release_cached_blocks(tally)
            self._num_alloc_retries += 1
            tally.alloc_retried = True
            block = self._alloc_segment(block_pool, stream, region_bytes, tally)
        if block is None:
            self._num_ooms += 1
            event = self._event("reserve_pool", tally, rounded_bytes=region_bytes)
            raise OutOfMemoryError(
                self._oom_message(region_bytes, size_bytes, region_bytes, f"reserved pool {name!r}"),
                requested_bytes=size_bytes,
                event=event,
            )
        block_pool.blocks.add(block)
        self._reserved_pools[name] = _ReservedPool(name, stream, block_pool, block.segment)
        return self._event(
            "reserve_pool", tally, rounded_bytes=region_bytes, pool=name, stream=stream,
            address=block.address, block_bytes=region_bytes,
        )

    def release_pool(self, name: str) -> MemoryEvent:
        """Free the region of reserved pool ``name`` (one ``aclrtFree`` after a synchronisation).

        Raises:
            ValueError: no such pool, or it still has live allocations.
        """
        reserved = self._reserved_pools.get(name)
        if reserved is None:
            raise ValueError(f"no reserved pool {name!r}")
        if reserved.live_count:
            raise ValueError(
                f"reserved pool {name!r} still has {reserved.live_count} live allocation(s)"
            )
        tally = _Tally()
        self._synchronize(tally)
        (block,) = list(reserved.pool.blocks)
        address, size = block.address, block.size
        self._release_block(block, tally)
        del self._reserved_pools[name]
        return self._event(
            "release_pool", tally, rounded_bytes=size, pool=name, stream=reserved.stream,
            address=address, block_bytes=size,
        )

    def stats(self) -> MemoryStats:
        """Current totals and peaks, like ``torch.npu.memory_stats()``."""
        free_sizes = [b.size for p in self._all_pools() for b in p.blocks]
        flat: dict[str, int] = {}
        for name, by_type in self._stats.items():
            for stat_type, stat in by_type.items():
                for part in ("current", "peak", "allocated", "freed"):
                    flat[f"{name}.{stat_type}.{part}"] = getattr(stat, part)
        for label, stat in (
            ("oversize_allocations", self._oversize_allocations),
            ("oversize_segments", self._oversize_segments),
        ):
            for part in ("current", "peak", "allocated", "freed"):
                flat[f"{label}.{part}"] = getattr(stat, part)
        flat["num_alloc_retries"] = self._num_alloc_retries
        flat["num_ooms"] = self._num_ooms
        flat["num_device_alloc"] = self._num_device_alloc
        flat["num_device_free"] = self._num_device_free
        flat["num_sync_all_streams"] = self._num_sync_all_streams
        flat["max_split_size"] = -1 if self._max_split == math.inf else int(self._max_split)
        s = self._stats
        return MemoryStats(
            allocated_bytes=s["allocated_bytes"]["all"].current,
            allocated_bytes_peak=s["allocated_bytes"]["all"].peak,
            reserved_bytes=s["reserved_bytes"]["all"].current,
            reserved_bytes_peak=s["reserved_bytes"]["all"].peak,
            active_bytes=s["active_bytes"]["all"].current,
            active_bytes_peak=s["active_bytes"]["all"].peak,
            requested_bytes=s["requested_bytes"]["all"].current,
            active_count=s["active"]["all"].current,
            allocation_count=s["allocation"]["all"].current,
            segment_count=s["segment"]["all"].current,
            inactive_split_count=s["inactive_split"]["all"].current,
            inactive_split_bytes=s["inactive_split_bytes"]["all"].current,
            largest_free_block_bytes=max(free_sizes, default=0),
            cached_free_bytes=sum(free_sizes),
            num_alloc_retries=self._num_alloc_retries,
            num_ooms=self._num_ooms,
            num_device_alloc=self._num_device_alloc,
            num_device_free=self._num_device_free,
            num_sync_all_streams=self._num_sync_all_streams,
            flat=flat,
        )

    def reset_peak_stats(self) -> None:
        """``torch.npu.reset_peak_memory_stats()``: every peak becomes the current value."""
        for by_type in self._stats.values():
            for stat in by_type.values():
                stat.peak = stat.current
        for stat in (self._oversize_allocations, self._oversize_segments):
            stat.peak = stat.current

    def snapshot(self) -> list[SegmentInfo]:
        """Every segment with its blocks, in address order (``torch.npu.memory_snapshot()``)."""
        by_segment: dict[int, list[_Block]] = {}
        for block in self._all_blocks():
            by_segment.setdefault(id(block.segment), []).append(block)
        result = []
        for segment in self._segments:
            blocks = sorted(by_segment.get(id(segment), []), key=lambda b: b.address)
            result.append(
                SegmentInfo(
                    address=segment.address,
                    size_bytes=segment.size_bytes,
                    stream=segment.stream,
                    pool=segment.pool.name,
                    is_expandable=segment.expandable,
                    blocks=tuple(
                        BlockInfo(b.address, b.size, b.requested_bytes, b.allocated, b.mapped)
                        for b in blocks
                    ),
                )
            )
        return sorted(result, key=lambda s: s.address)

    # -- allocation paths -----------------------------------------------------------------------

    def _alloc_general(self, orig_size: int, stream: int) -> tuple[Allocation, MemoryEvent]:
        spec = self._spec
        size = round_size(orig_size, spec)
        pool = self._small if size <= spec.small_size_bytes else self._large
        block = self._get_free_block(pool, stream, size)
        cache_hit = block is not None
        if cache_hit:
            tally = self._cache_hit_tally
        else:
            tally = _Tally(latency_s=spec.cached_alloc_latency_s)
            block = self._alloc_uncached(pool, stream, orig_size, size, tally)
        if self._config.expandable_segments and size >= spec.round_large_bytes:
            block = self._align_expandable(block, size)
        split = self._should_split(block, size)
        handle = self._alloc_found_block(block, size, orig_size, split)
        return handle, self._handle_event("alloc", tally, handle, size, cache_hit)

    def _alloc_uncached(
        self, pool: _BlockPool, stream: int, orig_size: int, size: int, tally: _Tally
    ) -> _Block:
        """torch_npu ``malloc`` when no cached block fits: a new segment, after freeing cache
        as the settings allow; failing that, the whole unsplit cache is freed and the segment
        tried once more.

        Raises:
            OutOfMemoryError: even that failed.
        """
        alloc_size = allocation_size(size, self._spec)
        if self._gc_enabled:
            self._garbage_collect_cached_blocks(tally)
        block = self._alloc_block(pool, stream, size, alloc_size, tally)
        if block is None and self._release_available_cached_blocks(pool, stream, size, tally):
            block = self._alloc_block(pool, stream, size, alloc_size, tally)
        if block is None:
            # Free every unsplit cached segment and retry once (torch_npu counts the retry).
            self._release_cached_blocks(tally)
            self._num_alloc_retries += 1
            tally.alloc_retried = True
            block = self._alloc_block(pool, stream, size, alloc_size, tally)
        if block is None:
            self._num_ooms += 1
            event = self._event(
                "alloc", tally, rounded_bytes=size, pool=pool.name, stream=stream,
                requested_bytes=orig_size,
            )
            raise OutOfMemoryError(
                self._oom_message(alloc_size, orig_size, size, None),
                requested_bytes=orig_size,
                event=event,
            )
        return block

    def _alloc_reserved(
        self, orig_size: int, stream: int, reserved: _ReservedPool
    ) -> tuple[Allocation, MemoryEvent]:
        if stream != reserved.stream:
            raise ValueError(
                f"reserved pool {reserved.name!r} belongs to stream {reserved.stream}, "
                f"not stream {stream}"
            )
        tally = _Tally(latency_s=self._spec.cached_alloc_latency_s)
        size = round_size(orig_size, self._spec)
        blocks = reserved.pool.blocks
        i = blocks.lower_bound((stream, size, 0))
        if i == len(blocks):
            self._num_ooms += 1
            event = self._event(
                "alloc", tally, rounded_bytes=size, pool=reserved.name, stream=stream,
                requested_bytes=orig_size,
            )
            largest = max((b.size for b in blocks), default=0)
            in_use = self._reserved_pool_allocated(reserved)
            raise OutOfMemoryError(
                f"NPU out of memory in reserved pool {reserved.name!r}. Tried to allocate "
                f"{format_size(size)} (request of {orig_size} bytes) from a "
                f"{format_size(reserved.segment.size_bytes)} pool; {format_size(in_use)} "
                f"already allocated in it; largest free block {format_size(largest)}. "
                "Reserve a larger pool or free its allocations sooner.",
                requested_bytes=orig_size,
                event=event,
            )
        block = blocks.at(i)
        blocks.remove(block)
        split = block.size - size >= self._spec.min_block_bytes
        handle = self._alloc_found_block(block, size, orig_size, split)
        reserved.live_count += 1
        return handle, self._handle_event("alloc", tally, handle, size, True)

    def _get_free_block(self, pool: _BlockPool, stream: int, size: int) -> _Block | None:
        """torch_npu ``get_free_block``: best fit by (stream, size, address)."""
        if self._gc_enabled:
            for b in pool.blocks:
                b.gc_count += 1
        blocks = pool.blocks
        i = blocks.lower_bound((stream, size, 0))
        if i == len(blocks):
            return None
        block = blocks.at(i)
        if block.stream != stream:
            return None
        if block.segment.expandable:
            # Prefer, among the larger blocks, one that can grow less into unmapped space.
            def expandable_size(b: _Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            while (
                blocks.at(i).segment.expandable
                and i + 1 < len(blocks)
                and blocks.at(i + 1).stream == stream
                and expandable_size(blocks.at(i + 1)) < expandable_size(blocks.at(i))
            ):
                i += 1
            block = blocks.at(i)
        if size < self._max_split and block.size >= self._max_split:
            return None  # an oversize block is not handed to a smaller request
        if size >= self._max_split and block.size >= size + self._spec.large_buffer_bytes:
            return None  # an oversize request takes a block at most 20 MiB too large
        block.gc_count = 0
        blocks.remove(block)
        return block

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small or self._config.expandable_segments:
            return remaining >= self._spec.min_block_bytes
        return size < self._max_split and remaining > self._spec.small_size_bytes

    def _align_expandable(self, block: _Block, size: int) -> _Block:
        """torch_npu ``malloc``: in expandable segments a large block starts on 16 KiB."""
        align = self._spec.expandable_align_bytes
        offset = -block.address % align
        if offset == 0 or offset + size > block.size:
            return block
        aligned = _Block(
            block.address + offset, block.size - offset, block.stream, block.pool, block.segment
        )
        aligned.splice(block, block.next)
        block.size = offset
        block.pool.blocks.add(block)
        return aligned

    def _alloc_found_block(self, block: _Block, size: int, orig_size: int, split: bool) -> Allocation:
        """torch_npu ``alloc_found_block``: split off the remainder, mark the block allocated."""
        pool = block.pool
        stats = pool.stats
        expandable = block.segment.expandable
        already_split = block.is_split
        if split:
            remaining = block
            block = _Block(remaining.address, size, remaining.stream, pool, remaining.segment)
            block.splice(remaining.prev, remaining)
            remaining.address += size
            remaining.size -= size
            pool.blocks.add(remaining)
            if already_split and not expandable:
                _shrink(stats["inactive_split_bytes"], block.size)
            elif not expandable:
                _grow(stats["inactive_split_bytes"], remaining.size)
                _grow(stats["inactive_split"], 1)
        elif already_split and not expandable:
            _shrink(stats["inactive_split_bytes"], block.size)
            _shrink(stats["inactive_split"], 1)

        block.allocated = True
        block.requested_bytes = orig_size
        block.allocation_id = next(self._ids)
        self._live[block.address] = block
        _grow(pool.allocated_counts, 1)
        _grow(pool.allocated_bytes, block.size)
        _grow(stats["requested_bytes"], orig_size)
        if block.size >= self._max_split:
            _grow(self._oversize["oversize_allocations"], 1)
        return Allocation(block.allocation_id, block.address, block.size, orig_size, block.stream, pool.name)

    def _free_block(self, block: _Block) -> None:
        """torch_npu ``free_block``: merge with free neighbours, return to the pool. (The caller
        moved the allocation and active counters.)"""
        pool = block.pool
        requested = block.requested_bytes
        net_blocks = 0
        net_bytes = 0
        for candidate in (block.prev, block.next):
            subsumed = self._try_merge_blocks(block, candidate)
            if subsumed:
                net_blocks -= 1
                net_bytes -= subsumed
        pool.blocks.add(block)
        if block.is_split:
            net_blocks += 1
            net_bytes += block.size
        stats = pool.stats
        if not block.segment.expandable:
            _move(stats["inactive_split"], net_blocks)
            _move(stats["inactive_split_bytes"], net_bytes)
        _shrink(stats["requested_bytes"], requested)
        block.requested_bytes = 0
        block.allocation_id = 0

    def _try_merge_blocks(self, dst: _Block, src: _Block | None) -> int:
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:
            dst.address = src.address
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        (dst.pool.blocks if src.mapped else dst.pool.unmapped).remove(src)
        dst.size += src.size
        return src.size

    # -- device memory --------------------------------------------------------------------------

    def _alloc_block(
        self, pool: _BlockPool, stream: int, size: int, alloc_size: int, tally: _Tally
    ) -> _Block | None:
        """torch_npu ``alloc_block``: a new segment (or new pages of an expandable one)."""
        if self._config.expandable_segments:
            if not self._within_fraction(alloc_size):
                return None
            return self._try_allocate_expandable_block(pool, stream, size, tally)
        return self._alloc_segment(pool, stream, alloc_size, tally)

    def _within_fraction(self, size: int) -> bool:
        """Whether ``size`` more bytes stay within the memory fraction (checked without a
        driver call)."""
        return self._allowed_bytes is None or self._reserved_total + size <= self._allowed_bytes

    def _alloc_segment(
        self, pool: _BlockPool, stream: int, size: int, tally: _Tally
    ) -> _Block | None:
        if not self._within_fraction(size):
            return None
        return self._device_malloc(pool, stream, size, tally)

    def _device_malloc(
        self, pool: _BlockPool, stream: int, size: int, tally: _Tally
    ) -> _Block | None:
        """One ``aclrtMalloc`` of a whole segment; ``None`` when HBM is full."""
        tally.latency_s += self._spec.device_malloc_latency_s
        if self._reserved_total + self._external_bytes + size > self._capacity_bytes:
            tally.failed_device_mallocs += 1
            return None
        segment = _Segment(self._reserve_address_space(size), size, stream, pool)
        self._segments.append(segment)
        self._reserved_total += size
        tally.device_mallocs += 1
        tally.device_malloc_bytes += size
        self._num_device_alloc += 1
        stats = pool.stats
        _grow(stats["segment"], 1)
        _grow(stats["reserved_bytes"], size)
        if size >= self._max_split:
            _grow(self._oversize["oversize_segments"], 1)
        return _Block(segment.address, size, stream, pool, segment)

    def _release_block(self, block: _Block, tally: _Tally) -> None:
        """torch_npu ``release_block``: ``aclrtFree`` of an unsplit cached segment."""
        pool = block.pool
        pool.blocks.remove(block)
        self._segments.remove(block.segment)
        self._reserved_total -= block.size
        tally.latency_s += self._spec.device_free_latency_s
        tally.device_frees += 1
        tally.device_free_bytes += block.size
        self._num_device_free += 1
        stats = pool.stats
        _shrink(stats["segment"], 1)
        _shrink(stats["reserved_bytes"], block.size)
        if block.size >= self._max_split:
            _shrink(self._oversize["oversize_segments"], 1)

    def _synchronize(self, tally: _Tally, *, whole_device: bool = True) -> None:
        """Device synchronisation (``npuSynchronizeDevice``), or one stream's when unmapping."""
        tally.latency_s += self._spec.device_synchronize_latency_s
        tally.synchronizations += 1
        if whole_device:
            self._num_sync_all_streams += 1

    def _release_cached_blocks(self, tally: _Tally) -> None:
        """torch_npu ``release_cached_blocks``: synchronise, then free the unsplit cache."""
        self._synchronize(tally)
        tally.cache_flushed = True
        for pool in (self._large, self._small):
            to_unmap = []
            for block in pool.blocks:
                if block.segment.expandable:
                    to_unmap.append(block)
                elif not block.is_split:
                    self._release_block(block, tally)
            for block in to_unmap:
                self._unmap_block(block, tally)
                if not block.is_split and not block.mapped:
                    pool.unmapped.remove(block)
                    self._segments.remove(block.segment)
            # An expandable segment whose pages were never mapped (its first map failed for
            # lack of memory) holds no memory; drop its virtual range too.
            for block in list(pool.unmapped):
                if block.segment.expandable and not block.is_split and block.segment in self._segments:
                    pool.unmapped.remove(block)
                    self._segments.remove(block.segment)

    def _release_available_cached_blocks(
        self, pool: _BlockPool, stream: int, size: int, tally: _Tally
    ) -> bool:
        """torch_npu ``release_available_cached_blocks``: with ``max_split_size``, free oversize
        cached blocks, the smallest single one that is large enough, else the largest first."""
        if self._max_split == math.inf:
            return False
        key_size = max(size, int(self._max_split))
        blocks = pool.blocks
        i = blocks.lower_bound((stream, key_size, 0))
        self._synchronize(tally)
        if i == len(blocks) or blocks.at(i).stream != stream:
            if i == 0:
                return False
            released = 0
            i -= 1
            while (
                i >= 0
                and released < key_size
                and blocks.at(i).size >= self._max_split
                and blocks.at(i).stream == stream
            ):
                block = blocks.at(i)
                released += block.size
                if not block.is_split:  # always true for oversize blocks; kept as a guard
                    self._release_block(block, tally)
                i -= 1
            return released >= key_size
        block = blocks.at(i)
        if block.is_split:
            return False
        self._release_block(block, tally)
        return True

    def _garbage_collect_cached_blocks(self, tally: _Tally) -> None:
        """torch_npu ``garbage_collect_cached_blocks``: above ``threshold x allowed memory``,
        free unsplit large cached blocks whose age (searches since last use) is at least the
        average, pass after pass, until the excess is reclaimed or nothing more can be freed."""
        assert self._allowed_bytes is not None  # guarded by _gc_enabled
        frac = self._config.garbage_collection_threshold_frac or 0.0
        threshold = int(frac * self._allowed_bytes)
        if self._reserved_total <= threshold:
            return
        target = self._reserved_total - threshold
        freeable = [b for b in self._large.blocks if not b.is_split]
        if not freeable:
            return
        total_age = float(sum(b.gc_count for b in freeable))
        count = len(freeable)
        self._synchronize(tally)
        reclaimed = 0
        freed_one = True
        while reclaimed < target and freed_one and count > 0:
            age_threshold = total_age / count
            freed_one = False
            for block in list(self._large.blocks):
                if not block.is_split and block.gc_count >= age_threshold:
                    freed_one = True
                    reclaimed += block.size
                    total_age -= block.gc_count
                    count -= 1
                    self._release_block(block, tally)

    # -- expandable segments --------------------------------------------------------------------

    def _try_allocate_expandable_block(
        self, pool: _BlockPool, stream: int, size: int, tally: _Tally
    ) -> _Block | None:
        candidate = self._find_expandable_block(pool, stream, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size), tally):
            return None
        while candidate.size < size:
            nxt = candidate.next
            assert nxt is not None and not nxt.mapped  # guaranteed by _find_expandable_block
            if not self._map_block(nxt, min(size - candidate.size, nxt.size), tally):
                return None
            candidate = nxt  # map_block merged the free candidate into it
        pool.blocks.remove(candidate)
        return candidate

    def _find_expandable_block(self, pool: _BlockPool, stream: int, size: int) -> _Block:
        """Lowest-address free + unmapped run of at least ``size`` in this stream's segments,
        or a new segment's whole unmapped range."""

        def allocatable(b: _Block | None) -> bool:
            return b is not None and not b.allocated

        def has_room(b: _Block | None) -> bool:
            total = 0
            while total < size and allocatable(b):
                assert b is not None
                total += b.size
                b = b.next
            return total >= size

        unmapped = pool.unmapped
        i = unmapped.lower_bound((stream, 0))
        while i < len(unmapped) and unmapped.at(i).stream == stream:
            candidate = unmapped.at(i)
            if allocatable(candidate.prev):
                assert candidate.prev is not None
                candidate = candidate.prev
            if has_room(candidate):
                return candidate
            i += 1
        page = self._spec.small_buffer_bytes if pool.is_small else self._spec.large_buffer_bytes
        capacity = self._capacity_bytes
        max_pages = -(-(capacity + capacity // 8) // page)
        address = self._reserve_address_space(page * max_pages)
        segment = _Segment(address, page * max_pages, stream, pool, page, [False] * max_pages)
        self._segments.append(segment)
        block = _Block(address, segment.size_bytes, stream, pool, segment, mapped=False)
        pool.unmapped.add(block)
        return block

    def _map_block(self, block: _Block, size: int, tally: _Tally) -> bool:
        """Map the pages under the first ``size`` bytes of unmapped ``block``; merge it with
        free mapped neighbours. All or nothing: a page that does not fit undoes the call."""
        segment = block.segment
        assert segment.pages is not None and not block.mapped
        page = segment.page_bytes
        begin = (block.address - segment.address) // page
        end = -(-(block.address + size - segment.address) // page)
        count = end - begin
        tally.latency_s += count * self._spec.page_map_latency_s
        if count == 0 or self._reserved_total + self._external_bytes + count * page > self._capacity_bytes:
            tally.failed_device_mallocs += 1
            return False
        for i in range(begin, end):
            segment.pages[i] = True
        mapped = count * page
        self._reserved_total += mapped
        tally.device_mallocs += count
        tally.device_malloc_bytes += mapped
        self._num_device_alloc += count

        pool = block.pool
        pool.unmapped.remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = _Block(
                block.address + mapped, block.size - mapped, block.stream, pool, segment,
                mapped=False,
            )
            rest.splice(block, block.next)
            pool.unmapped.add(rest)
            block.size = mapped
        self._try_merge_blocks(block, block.prev)
        self._try_merge_blocks(block, block.next)
        pool.blocks.add(block)
        _grow(pool.stats["reserved_bytes"], mapped)
        return True

    def _unmap_block(self, block: _Block, tally: _Tally) -> None:
        """Unmap the whole pages inside free ``block`` (after a stream synchronisation)."""
        segment = block.segment
        assert segment.pages is not None
        page = segment.page_bytes
        begin = -(-(block.address - segment.address) // page)
        end = (block.address + block.size - segment.address) // page
        if begin >= end:
            return
        self._synchronize(tally, whole_device=False)  # aclrtSynchronizeStream
        count = end - begin
        for i in range(begin, end):
            segment.pages[i] = False
        start = segment.address + begin * page
        unmapped = count * page
        tally.latency_s += count * self._spec.page_unmap_latency_s
        tally.device_frees += count
        tally.device_free_bytes += unmapped
        self._num_device_free += count

        pool = block.pool
        pool.blocks.remove(block)
        before = start - block.address
        if before > 0:
            head = _Block(block.address, before, block.stream, pool, segment)
            head.splice(block.prev, block)
            pool.blocks.add(head)
        after = block.size - before - unmapped
        if after > 0:
            tail = _Block(start + unmapped, after, block.stream, pool, segment)
            tail.splice(block, block.next)
            pool.blocks.add(tail)
        block.address = start
        block.size = unmapped
        block.mapped = False
        self._try_merge_blocks(block, block.prev)
        self._try_merge_blocks(block, block.next)
        pool.unmapped.add(block)
        self._reserved_total -= unmapped
        _shrink(pool.stats["reserved_bytes"], unmapped)

    # -- helpers --------------------------------------------------------------------------------

    def _reserve_address_space(self, size: int) -> int:
        address = self._next_address
        self._next_address = _round_up(address + size, self._spec.round_large_bytes)
        return address

    def _new_pool(self, name: str, *, is_small: bool, private: bool = False) -> _BlockPool:
        pool = _BlockPool(name, is_small, private)
        types = ("all",) if private else ("all", "small_pool" if is_small else "large_pool")
        pool.stats = {stat: tuple(self._stats[stat][t] for t in types) for stat in _STAT_NAMES}
        pool.allocated_counts = pool.stats["allocation"] + pool.stats["active"]
        pool.allocated_bytes = pool.stats["allocated_bytes"] + pool.stats["active_bytes"]
        return pool

    def _all_pools(self) -> list[_BlockPool]:
        return [self._small, self._large, *(r.pool for r in self._reserved_pools.values())]

    def _all_blocks(self) -> list[_Block]:
        blocks = list(self._live.values())
        for pool in self._all_pools():
            blocks.extend(pool.blocks)
            blocks.extend(pool.unmapped)
        return blocks

    def _reserved_pool_allocated(self, reserved: _ReservedPool) -> int:
        return sum(b.size for b in self._live.values() if b.pool is reserved.pool)

    def _oom_message(self, alloc_size: int, orig_size: int, size: int, what: str | None) -> str:
        s = self.stats()
        allowed = ""
        if self._allowed_bytes is not None:
            allowed = f"{format_size(self._allowed_bytes)} allowed; "
        free = self._capacity_bytes - self._reserved_total - self._external_bytes
        outside = f"{format_size(self._external_bytes)} held outside PyTorch; " if self._external_bytes else ""
        target = f" for {what}" if what else ""
        return (
            f"NPU out of memory. Tried to allocate {format_size(alloc_size)}{target} "
            f"(NPU {self._device}; {format_size(self._capacity_bytes)} total capacity; "
            f"{format_size(s.allocated_bytes)} already allocated; "
            f"{format_size(s.active_bytes)} current active; {format_size(free)} free; {allowed}"
            f"{format_size(s.reserved_bytes)} reserved in total by PyTorch; {outside}"
            f"request of {orig_size} bytes rounded to {format_size(size)}; "
            f"largest free cached block {format_size(s.largest_free_block_bytes)})"
            + ("" if self._config.expandable_segments else  # torch_npu refuses max_split with expandable
               " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")
        )

    def _event(
        self,
        action: Literal["alloc", "free", "empty_cache", "reserve_pool", "release_pool", "external"],
        tally: _Tally,
        *,
        rounded_bytes: int,
        pool: str = "none",
        stream: int = 0,
        requested_bytes: int = 0,
        address: int = 0,
        block_bytes: int = 0,
        cache_hit: bool = False,
    ) -> MemoryEvent:
        """The event of a call that did ``tally``'s work, with the device totals after it."""
        return MemoryEvent(
            action, tally.latency_s, requested_bytes, rounded_bytes, block_bytes, address, pool, stream,
            cache_hit, tally.device_mallocs, tally.device_malloc_bytes, tally.failed_device_mallocs,
            tally.device_frees, tally.device_free_bytes, tally.synchronizations, tally.cache_flushed,
            tally.alloc_retried, self._all_allocated_bytes.current, self._reserved_total,
        )

    def _handle_event(
        self, action: Literal["alloc", "free"], tally: _Tally, handle: Allocation, rounded_bytes: int,
        cache_hit: bool = False,
    ) -> MemoryEvent:
        """:meth:`_event` of an ``alloc`` or ``free`` of ``handle`` (the hot path: positional)."""
        return MemoryEvent(
            action, tally.latency_s, handle.requested_bytes, rounded_bytes, handle.size_bytes,
            handle.address, handle.pool, handle.stream,
            cache_hit, tally.device_mallocs, tally.device_malloc_bytes, tally.failed_device_mallocs,
            tally.device_frees, tally.device_free_bytes, tally.synchronizations, tally.cache_flushed,
            tally.alloc_retried, self._all_allocated_bytes.current, self._reserved_total,
        )
