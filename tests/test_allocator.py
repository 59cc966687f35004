"""The caching allocator model: golden values derived by hand from torch_npu's rules, and
Hypothesis properties over random alloc / free traces.

Constants used in the derivations (torch_npu NPUCachingAllocator.cpp): requests get +32 B and
round up to 512 B; small pool <= 1 MiB in 2 MiB segments; large requests under 10 MiB get
20 MiB segments, larger ones a segment rounded up to 2 MiB.
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.allocator import (
    Allocation,
    AllocatorConfig,
    MemoryEvent,
    NpuCachingAllocator,
    OutOfMemoryError,
    allocation_size,
    format_size,
    pool_for_size,
    round_size,
)
from simulator.hardware import load_hardware
from simulator.units import KiB, MiB

HW = load_hardware("ascend910")
SPEC = HW.allocator


def make(capacity_mib: int = 1024, **config: object) -> NpuCachingAllocator:
    return NpuCachingAllocator(
        HW, AllocatorConfig(**config), capacity_bytes=capacity_mib * MiB
    )


def exact(mib: float) -> int:
    """A request that rounds to exactly ``mib`` MiB (the +32 B lands on a 512 B boundary)."""
    return int(mib * MiB) - 32


def segments(alloc: NpuCachingAllocator) -> list[list[tuple[int, bool]]]:
    """Each segment's blocks as (size in bytes, allocated)."""
    return [[(b.size_bytes, b.allocated) for b in s.blocks] for s in alloc.snapshot()]


# -- rounding, pools, segment sizes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_bytes", "rounded"),
    [
        (0, 512),  # 0 + 32 = 32 < 512 -> kMinBlockSize
        (1, 512),  # 33 -> 512
        (480, 512),  # 480 + 32 = 512, already a multiple
        (481, 1024),  # 513 -> next multiple of 512
        (512, 1024),  # 544 -> 1024: a 512 B tensor takes a 1 KiB block
        (MiB - 32, MiB),  # lands exactly on 1 MiB
        (MiB, MiB + 512),  # 1 MiB + 32 -> 1 MiB + 512
        (10 * MiB - 32, 10 * MiB),
        (10 * MiB, 10 * MiB + 512),
    ],
)
def test_round_size_golden(request_bytes: int, rounded: int) -> None:
    assert round_size(request_bytes, SPEC) == rounded


def test_round_size_rejects_negative() -> None:
    with pytest.raises(ValueError, match="size_bytes"):
        round_size(-1, SPEC)


@pytest.mark.parametrize(
    ("request_bytes", "pool", "segment"),
    [
        (1, "small", 2 * MiB),  # 512 B block, small pool, packed in a 2 MiB segment
        (MiB - 32, "small", 2 * MiB),  # rounded 1 MiB: still small (<= kSmallSize)
        (MiB, "large", 20 * MiB),  # rounded 1 MiB + 512: large, under 10 MiB -> 20 MiB
        (10 * MiB - 544, "large", 20 * MiB),  # rounded 10 MiB - 512 < 10 MiB -> 20 MiB
        (10 * MiB - 32, "large", 10 * MiB),  # rounded 10 MiB: own segment, already 2 MiB multiple
        (10 * MiB, "large", 12 * MiB),  # rounded 10 MiB + 512 -> next 2 MiB multiple
        (100 * MiB, "large", 102 * MiB),  # 100 MiB + 512 -> 102 MiB
    ],
)
def test_pool_and_segment_size(request_bytes: int, pool: str, segment: int) -> None:
    rounded = round_size(request_bytes, SPEC)
    assert pool_for_size(rounded, SPEC) == pool
    assert allocation_size(rounded, SPEC) == segment
    handle, event = make().alloc(request_bytes)
    assert (handle.pool, event.pool) == (pool, pool)
    assert (event.device_mallocs, event.device_malloc_bytes) == (1, segment)
    assert event.rounded_bytes == rounded and event.requested_bytes == request_bytes


def test_zero_bytes_is_the_null_allocation() -> None:
    # torch_npu's allocate(0) returns a null pointer and never reaches the allocator.
    alloc = make()
    handle, event = alloc.alloc(0)
    assert handle.address == 0 and handle.size_bytes == 0
    assert event.latency_s == 0 and event.device_mallocs == 0
    assert alloc.stats().reserved_bytes == 0
    assert alloc.free(handle).latency_s == 0


def test_format_size_matches_torch() -> None:
    assert format_size(1024) == "1024 bytes"
    assert format_size(1536) == "1.50 KiB"
    assert format_size(MiB) == "1024.00 KiB"  # torch prints KiB up to and including 1 MiB
    assert format_size(20 * MiB) == "20.00 MiB"
    assert format_size(48 * 1024 * MiB) == "48.00 GiB"


# -- splitting, best fit, merging --------------------------------------------------------------


def test_small_pool_split_rule() -> None:
    # Small pool splits when >= 512 B remain. Rounded 1 MiB from a 2 MiB segment leaves 1 MiB:
    # split. The second 1 MiB request takes the 1 MiB remainder exactly: 0 B left, no split.
    alloc = make()
    a, first = alloc.alloc(MiB - 32)
    b, second = alloc.alloc(MiB - 32)
    assert first.device_mallocs == 1 and second.cache_hit and second.device_mallocs == 0
    assert a.size_bytes == b.size_bytes == MiB
    assert b.address == a.address + MiB
    assert segments(alloc) == [[(MiB, True), (MiB, True)]]


def test_large_pool_split_rule() -> None:
    # Large pool splits only when more than 1 MiB (kSmallSize) would remain.
    alloc = make()
    # 9 MiB -> rounded 9 MiB + 512 from a 20 MiB segment: 11 MiB - 512 remain > 1 MiB: split.
    a, _ = alloc.alloc(9 * MiB)
    assert segments(alloc) == [[(9 * MiB + 512, True), (11 * MiB - 512, False)]]
    alloc.free(a)  # merges back into one 20 MiB block
    assert segments(alloc) == [[(20 * MiB, False)]]
    # Rounded 19 MiB from the cached 20 MiB block: exactly 1 MiB would remain, not > 1 MiB, so
    # the whole 20 MiB block is handed out (allocated_bytes counts the block, 20 MiB).
    b, event = alloc.alloc(exact(19))
    assert event.cache_hit and b.size_bytes == 20 * MiB
    assert alloc.stats().allocated_bytes == 20 * MiB
    assert alloc.stats().requested_bytes == exact(19)


def test_best_fit_takes_smallest_block_then_lowest_address() -> None:
    # Requests >= 10 MiB rounding to whole 2 MiB get segments of exactly their size.
    alloc = make()
    sizes = [12, 16, 14, 14]
    handles = [alloc.alloc(exact(s))[0] for s in sizes]
    for h in handles:
        alloc.free(h)
    # Rounded 13 MiB: cached 12 is too small; the smallest that fits is 14 MiB, and of the two
    # 14 MiB blocks the one at the lower address (allocated first). 1 MiB remains: no split.
    got, event = alloc.alloc(exact(13))
    assert event.cache_hit and event.device_mallocs == 0
    assert got.address == handles[2].address and got.size_bytes == 14 * MiB


def test_merge_on_free_restores_an_unsplit_segment() -> None:
    # Three 3 MiB blocks (rounded 3 MiB + 512 each) from one 20 MiB segment, plus the remainder.
    alloc = make()
    a, b, c = (alloc.alloc(3 * MiB)[0] for _ in range(3))
    block = 3 * MiB + 512
    alloc.free(a)
    alloc.free(c)  # c merges with the free remainder after it
    assert segments(alloc) == [[(block, False), (block, True), (20 * MiB - 2 * block, False)]]
    stats = alloc.stats()
    assert stats.inactive_split_count == 2
    assert stats.inactive_split_bytes == 20 * MiB - block
    alloc.free(b)  # merges with both neighbours
    assert segments(alloc) == [[(20 * MiB, False)]]
    assert alloc.stats().inactive_split_count == alloc.stats().inactive_split_bytes == 0
    assert alloc.stats().reserved_bytes == 20 * MiB  # freed memory stays cached
    event = alloc.empty_cache()  # unsplit now, so empty_cache can free it
    assert (event.device_frees, event.device_free_bytes, event.synchronizations) == (1, 20 * MiB, 1)
    assert alloc.stats().reserved_bytes == 0


def test_blocks_are_not_shared_between_streams() -> None:
    alloc = make()
    a, _ = alloc.alloc(4 * MiB, stream=0)
    alloc.free(a)
    _, other = alloc.alloc(4 * MiB, stream=1)
    assert not other.cache_hit and other.device_mallocs == 1
    same, again = alloc.alloc(4 * MiB, stream=0)
    assert again.cache_hit and same.address == a.address


# -- max_split_size_mb -------------------------------------------------------------------------


def test_max_split_size_rules() -> None:
    alloc = make(max_split_size_bytes=32 * MiB)
    # 60 MiB -> rounded 60 MiB + 512 -> 62 MiB segment. The request is >= max_split: no split,
    # the block is the whole 62 MiB.
    big, _ = alloc.alloc(60 * MiB)
    assert big.size_bytes == 62 * MiB
    alloc.free(big)
    # Rounded 40 MiB >= max_split: the cached 62 MiB block is >= 40 + 20 (kLargeBuffer) MiB, too
    # much slack: a new 40 MiB segment.
    mid, event = alloc.alloc(exact(40))
    assert not event.cache_hit and event.device_malloc_bytes == 40 * MiB
    alloc.free(mid)
    # Rounded 44 MiB: best fit is the 62 MiB block (40 is too small); 62 < 44 + 20: taken whole.
    taken, event = alloc.alloc(exact(44))
    assert event.cache_hit and taken.address == big.address and taken.size_bytes == 62 * MiB
    # 8 MiB is below max_split: it may not take the cached 40 MiB (oversize) block.
    _, event = alloc.alloc(8 * MiB)
    assert not event.cache_hit and event.device_malloc_bytes == 20 * MiB
    assert alloc.stats().flat["oversize_allocations.current"] == 1
    # Without max_split_size the same 8 MiB request would split the cached 40 MiB block.
    plain = make()
    plain.free(plain.alloc(exact(40))[0])
    assert plain.alloc(8 * MiB)[1].cache_hit


def test_max_split_frees_oversize_blocks_before_a_full_flush() -> None:
    # Capacity 128 MiB, max_split 32 MiB. Cached oversize blocks of 62 and 40 MiB (102 reserved).
    # Rounded 30 MiB is below max_split: it may not use them; a 30 MiB segment does not fit
    # (102 + 30 > 128). release_available_cached_blocks looks for the smallest cached block of
    # at least max(30, 32) MiB, frees the 40 MiB one, and the malloc succeeds: no full flush.
    alloc = make(capacity_mib=128, max_split_size_bytes=32 * MiB)
    a, _ = alloc.alloc(60 * MiB)
    b, _ = alloc.alloc(exact(40))
    alloc.free(a)
    alloc.free(b)
    _, event = alloc.alloc(exact(30))
    assert (event.failed_device_mallocs, event.device_frees, event.device_free_bytes) == (
        1, 1, 40 * MiB
    )
    assert event.synchronizations == 1 and not event.cache_flushed and not event.alloc_retried
    assert alloc.stats().reserved_bytes == (62 + 30) * MiB


def test_max_split_must_exceed_large_buffer() -> None:
    # torch_npu: max_split_size_mb must be > kLargeBuffer / 1 MiB = 20.
    with pytest.raises(ValueError, match="max_split_size"):
        make(max_split_size_bytes=20 * MiB)
    make(max_split_size_bytes=21 * MiB)


# -- device full: retry, garbage collection, OOM ----------------------------------------------


def test_retry_frees_cached_segments_then_succeeds() -> None:
    # Capacity 64 MiB; cached unsplit 30 and 20 MiB segments (50 reserved). Rounded 40 MiB fits
    # no cached block; aclrtMalloc(40) fails (50 + 40 > 64); no max_split, so straight to
    # release_cached_blocks: synchronise, free both segments, retry: aclrtMalloc(40) succeeds.
    alloc = make(capacity_mib=64)
    for h in [alloc.alloc(exact(30))[0], alloc.alloc(exact(20))[0]]:
        alloc.free(h)
    handle, event = alloc.alloc(exact(40))
    assert handle.size_bytes == 40 * MiB
    assert event.failed_device_mallocs == 1 and event.device_mallocs == 1
    assert (event.device_frees, event.device_free_bytes) == (2, 50 * MiB)
    assert event.synchronizations == 1 and event.cache_flushed and event.alloc_retried
    # Host time: cached bookkeeping 2 us + failed malloc 50 us + sync 20 us + 2 frees x 50 us
    # + malloc 50 us = 222 us (ascend910 allocator estimates).
    expected = (
        SPEC.cached_alloc_latency_s + 2 * SPEC.device_malloc_latency_s
        + SPEC.device_synchronize_latency_s + 2 * SPEC.device_free_latency_s
    )
    assert event.latency_s == pytest.approx(expected) == pytest.approx(222e-6)
    stats = alloc.stats()
    assert (stats.num_alloc_retries, stats.num_ooms) == (1, 0)
    assert (stats.reserved_bytes, stats.num_device_free, stats.num_sync_all_streams) == (
        40 * MiB, 2, 1
    )


def test_oom_message_and_counters() -> None:
    # A 3 MiB block splits a 20 MiB segment, so release_cached_blocks cannot free it. 60 MiB
    # rounds to 60 MiB + 512 and needs a 62 MiB segment: 20 + 62 > 64 MiB, before and after.
    alloc = make(capacity_mib=64)
    alloc.alloc(3 * MiB)
    with pytest.raises(OutOfMemoryError) as info:
        alloc.alloc(60 * MiB)
    err = info.value
    assert isinstance(err, RuntimeError)
    message = str(err)
    for part in [
        "NPU out of memory. Tried to allocate 62.00 MiB",
        "64.00 MiB total capacity",
        "3.00 MiB already allocated",  # 3 MiB + 512 B prints as 3.00 MiB
        "44.00 MiB free",
        "20.00 MiB reserved in total by PyTorch",
        f"request of {60 * MiB} bytes rounded to 60.00 MiB",
        "largest free cached block 17.00 MiB",  # 20 MiB - (3 MiB + 512 B)
        "max_split_size_mb",
    ]:
        assert part in message, part
    assert err.requested_bytes == 60 * MiB
    assert err.event.cache_flushed and err.event.failed_device_mallocs == 2
    stats = alloc.stats()
    assert (stats.num_ooms, stats.num_alloc_retries) == (1, 1)
    assert stats.allocated_bytes == 3 * MiB + 512 and stats.reserved_bytes == 20 * MiB


def test_garbage_collection_frees_oldest_cached_blocks_first() -> None:
    # Fraction 1.0 of 100 MiB, threshold 0.6: GC acts above 60 MiB reserved. Ages count the
    # large-pool searches a cached block sat through since it was last handed out.
    alloc = make(
        capacity_mib=100, per_process_memory_frac=1.0, garbage_collection_threshold_frac=0.6
    )
    a, _ = alloc.alloc(exact(20))
    alloc.free(a)  # A cached, age 0
    b, _ = alloc.alloc(exact(30))  # search: A age 1; 20 reserved <= 60: no GC; malloc 30
    c, _ = alloc.alloc(exact(24))  # search: A age 2; 50 <= 60: no GC; malloc 24 -> 74 reserved
    alloc.free(b)
    alloc.free(c)
    # Rounded 40 MiB: search ages A 3, C 1, B 1; nothing fits. 74 > 60: reclaim 14 MiB. Average
    # age 5/3: only A (age 3) is at least that; freeing it reclaims 20 >= 14: stop. 54 + 40 fits.
    _, event = alloc.alloc(exact(40))
    assert (event.device_frees, event.device_free_bytes) == (1, 20 * MiB)
    assert event.synchronizations == 1 and not event.cache_flushed
    assert alloc.stats().reserved_bytes == (30 + 24 + 40) * MiB
    cached = sorted(b.size_bytes for s in alloc.snapshot() for b in s.blocks if not b.allocated)
    assert cached == [24 * MiB, 30 * MiB]


def test_memory_fraction_limits_segments() -> None:
    # Fraction 0.5 of 64 MiB allows 32 MiB of segments: 12 MiB + 20 MiB fit exactly. Rounded
    # 16 MiB fits no cached block (the 20 MiB segment has 15 MiB - 512 B left) and a 16 MiB
    # segment would pass the limit, so it is refused without calling the driver.
    alloc = make(capacity_mib=64, per_process_memory_frac=0.5)
    alloc.alloc(exact(12))
    alloc.alloc(5 * MiB)
    assert alloc.stats().reserved_bytes == 32 * MiB
    with pytest.raises(OutOfMemoryError, match="32.00 MiB allowed") as info:
        alloc.alloc(exact(16))
    assert info.value.event.failed_device_mallocs == 0


# -- expandable segments -----------------------------------------------------------------------


def _fragmenting_trace(alloc: NpuCachingAllocator) -> tuple[Allocation, MemoryEvent]:
    """Three 20 MiB tensors, freed; three 13 MiB ones; then a 24 MiB one."""
    for h in [alloc.alloc(exact(20))[0] for _ in range(3)]:
        alloc.free(h)
    for _ in range(3):
        alloc.alloc(exact(13))
    return alloc.alloc(exact(24))


def test_expandable_segments_avoid_a_fragmentation_oom() -> None:
    # Default: three 20 MiB segments; each 13 MiB tensor splits one, leaving 7 MiB slivers.
    # 24 MiB fits no sliver; a new 24 MiB segment needs 60 + 24 > 80 MiB; every segment is
    # split, so freeing the cache frees nothing: OOM, with 80 - 39 = 41 MiB actually unused.
    with pytest.raises(OutOfMemoryError):
        _fragmenting_trace(make(capacity_mib=80))
    # Expandable: one virtual segment; the three 20 MiB tensors map three 20 MiB pages and, once
    # freed, merge into one 60 MiB block. The 13 MiB tensors tile it, leaving 21 MiB free at the
    # end, next to the unmapped range: 24 MiB maps one more page (60 + 20 = 80 <= 80).
    alloc = make(capacity_mib=80, expandable_segments=True)
    handle, event = _fragmenting_trace(alloc)
    assert handle.size_bytes == 24 * MiB
    assert (event.device_mallocs, event.device_malloc_bytes) == (1, 20 * MiB)
    assert alloc.stats().reserved_bytes == 80 * MiB
    (segment,) = alloc.snapshot()
    assert segment.is_expandable
    # The virtual range is 1 1/8 of capacity rounded up to 20 MiB pages: 90 -> 100 MiB.
    assert segment.size_bytes == 100 * MiB


def test_expandable_segments_unmap_free_pages_on_empty_cache() -> None:
    alloc = make(capacity_mib=256, expandable_segments=True)
    # Large pool, 20 MiB pages: 3 MiB maps page 1; 45 MiB uses the 17 MiB left and maps two more
    # pages; 7 MiB fits in the 12 MiB left (less a 16 KiB alignment gap). Small pool: 100 B maps
    # one 2 MiB page of its own segment. 60 + 2 = 62 MiB reserved.
    handles = [alloc.alloc(s)[0] for s in (3 * MiB, 100, 45 * MiB, 7 * MiB)]
    assert alloc.stats().reserved_bytes == 62 * MiB
    assert [s.is_expandable for s in alloc.snapshot()] == [True, True]
    for h in handles:
        alloc.free(h)
    # Everything merges back to one free block per segment: all 3 + 1 pages unmap, each
    # segment after its stream synchronises, after one device synchronisation.
    event = alloc.empty_cache()
    assert (event.device_frees, event.device_free_bytes) == (4, 62 * MiB)
    assert event.synchronizations == 3
    assert alloc.stats().reserved_bytes == 0 and alloc.snapshot() == []


def test_expandable_large_blocks_start_on_16_kib() -> None:
    # 3 MiB -> 3 MiB + 512 at the segment start; the next large block would start 512 B past a
    # 16 KiB boundary, so torch_npu leaves a 16 KiB - 512 B free block in front of it.
    alloc = make(expandable_segments=True)
    a, _ = alloc.alloc(3 * MiB)
    b, _ = alloc.alloc(3 * MiB)
    assert b.address % (16 * KiB) == 0
    assert b.address - a.address == a.size_bytes + 16 * KiB - 512


def test_expandable_cannot_combine_with_max_split() -> None:
    with pytest.raises(ValueError, match="expandable_segments"):
        AllocatorConfig(expandable_segments=True, max_split_size_bytes=64 * MiB)


# -- reserved pools ----------------------------------------------------------------------------


def test_reserved_pool_reuses_memory_without_device_calls() -> None:
    alloc = make()
    reserve = alloc.reserve_pool("attn_tmp", 7 * MiB)  # rounded up to 8 MiB: one aclrtMalloc
    assert (reserve.device_mallocs, reserve.device_malloc_bytes) == (1, 8 * MiB)
    addresses = set()
    for _ in range(5):
        handle, event = alloc.alloc(6 * MiB, pool="attn_tmp")
        assert event.cache_hit and event.device_mallocs == 0
        assert event.latency_s == pytest.approx(SPEC.cached_alloc_latency_s)
        assert alloc.free(handle).device_frees == 0
        addresses.add(handle.address)
    assert len(addresses) == 1 and alloc.stats().num_device_alloc == 1
    # The general pools never touch the region, and empty_cache leaves it reserved.
    _, general = alloc.alloc(MiB)
    assert general.device_mallocs == 1 and general.pool == "large"
    alloc.empty_cache()
    assert alloc.stats().reserved_bytes == 8 * MiB + 20 * MiB


def test_reserved_pool_packs_and_refuses_overflow() -> None:
    alloc = make()
    alloc.reserve_pool("tmp", 4 * MiB, stream=1)
    a, _ = alloc.alloc(MiB - 32, pool="tmp", stream=1)  # rounded 1 MiB, split (>= 512 B left)
    b, _ = alloc.alloc(2 * MiB - 32, pool="tmp", stream=1)
    assert b.address == a.address + MiB
    with pytest.raises(OutOfMemoryError, match="reserved pool 'tmp'.*largest free block 1024.00 KiB"):
        alloc.alloc(2 * MiB, pool="tmp", stream=1)
    with pytest.raises(ValueError, match="stream 1"):
        alloc.alloc(MiB, pool="tmp", stream=0)
    with pytest.raises(ValueError, match="live allocation"):
        alloc.release_pool("tmp")
    alloc.free(a)
    alloc.free(b)
    event = alloc.release_pool("tmp")
    assert (event.device_frees, event.device_free_bytes) == (1, 4 * MiB)
    assert alloc.stats().reserved_bytes == 0
    with pytest.raises(ValueError, match="no reserved pool"):
        alloc.alloc(MiB, pool="tmp")


# -- stats, handles, configuration -------------------------------------------------------------


def test_peak_stats_and_reset() -> None:
    alloc = make()
    a, _ = alloc.alloc(exact(12))
    b, _ = alloc.alloc(exact(14))
    alloc.free(a)
    stats = alloc.stats()
    assert stats.allocated_bytes == 14 * MiB and stats.allocated_bytes_peak == 26 * MiB
    assert stats.reserved_bytes_peak == 26 * MiB
    assert stats.as_torch_dict()["allocated_bytes.all.peak"] == 26 * MiB
    assert stats.as_torch_dict()["allocated_bytes.large_pool.current"] == 14 * MiB
    alloc.reset_peak_stats()
    assert alloc.stats().allocated_bytes_peak == 14 * MiB
    alloc.free(b)


def test_double_free_is_rejected() -> None:
    alloc = make()
    a, _ = alloc.alloc(MiB)
    alloc.free(a)
    with pytest.raises(ValueError, match="invalid device pointer"):
        alloc.free(a)
    # A stale handle whose address was handed out again is still refused.
    b, _ = alloc.alloc(MiB)
    assert b.address == a.address
    with pytest.raises(ValueError, match="invalid device pointer"):
        alloc.free(a)


def test_bad_sizes_are_rejected() -> None:
    alloc = make()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="size_bytes"):
            alloc.alloc(bad)  # type: ignore[arg-type]


def test_conf_string() -> None:
    config = AllocatorConfig.from_conf_string(
        "max_split_size_mb:128, garbage_collection_threshold:0.6"
    )
    assert config.max_split_size_bytes == 128 * MiB
    assert config.garbage_collection_threshold_frac == 0.6
    assert AllocatorConfig.from_conf_string("expandable_segments:True").expandable_segments
    for bad in ("bogus:1", "expandable_segments:yes", "max_split_size_mb"):
        with pytest.raises(ValueError):
            AllocatorConfig.from_conf_string(bad)


@pytest.mark.parametrize(("conf", "message"), [
    # Regression: these gave int() or pydantic errors that did not name the setting, or were accepted.
    ("max_split_size_mb:abc", "max_split_size_mb takes a whole number of MiB, got 'abc'"),
    ("max_split_size_mb:0", "allocator settings 'max_split_size_mb:0': max_split_size_mb: Input should be greater"),
    ("garbage_collection_threshold:1.5", "garbage_collection_threshold: Input should be less than 1"),
    ("garbage_collection_threshold:x", "garbage_collection_threshold takes a fraction, got 'x'"),
    ("max_split_size_mb:128,max_split_size_mb:256", "'max_split_size_mb' is given twice"),
    ("expandable_segments:True,max_split_size_mb:128", "expandable_segments cannot be combined"),
])
def test_a_bad_conf_string_names_the_setting(conf: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        AllocatorConfig.from_conf_string(conf)


def test_max_split_size_must_be_above_the_large_buffer() -> None:
    # torch_npu requires max_split_size_mb > kLargeBuffer (20 MiB, from the hardware data)
    with pytest.raises(ValueError, match=r"max_split_size_bytes must be above 20.00 MiB \(max_split_size_mb > 20\)"):
        simulator.run(lambda npu: None, allocator="max_split_size_mb:20")


@pytest.mark.parametrize("allocator", [5, True, 1.5])
def test_an_allocator_that_is_not_a_string_is_a_type_error(allocator) -> None:
    # Regression: an AttributeError from inside the allocator
    with pytest.raises(TypeError, match="allocator must be a PYTORCH_NPU_ALLOC_CONF string"):
        simulator.run(lambda npu: None, allocator=allocator)
    with pytest.raises(TypeError, match="allocator settings must be a PYTORCH_NPU_ALLOC_CONF string"):
        AllocatorConfig.from_conf_string(allocator)


@pytest.mark.parametrize("name", ["ascend910", "ascend910b"])
def test_hardware_files_carry_the_allocator_group(name: str) -> None:
    spec = load_hardware(name).allocator
    assert (spec.min_block_bytes, spec.small_size_bytes, spec.small_buffer_bytes) == (
        512, MiB, 2 * MiB
    )
    assert (spec.large_buffer_bytes, spec.min_large_alloc_bytes, spec.round_large_bytes) == (
        20 * MiB, 10 * MiB, 2 * MiB
    )
    assert spec.request_padding_bytes == 32 and "estimate:" in spec.source


# -- properties --------------------------------------------------------------------------------

CONFIGS = {
    "default": {},
    "max_split": {"max_split_size_bytes": 24 * MiB},
    "expandable": {"expandable_segments": True},
    "gc": {"per_process_memory_frac": 0.9, "garbage_collection_threshold_frac": 0.5},
}

sizes = st.one_of(
    st.integers(0, 4 * KiB),
    st.integers(0, MiB + 1024),
    st.integers(MiB, 12 * MiB),
    st.integers(10 * MiB, 40 * MiB),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), sizes, st.integers(0, 1)),
        st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


def check_invariants(alloc: NpuCachingAllocator, live: list[Allocation]) -> None:
    stats = alloc.stats()
    limit = alloc.capacity_bytes
    if alloc.config.per_process_memory_frac is not None:
        limit = int(alloc.config.per_process_memory_frac * limit)
    assert 0 <= stats.allocated_bytes <= stats.reserved_bytes <= limit
    assert stats.reserved_bytes <= stats.reserved_bytes_peak
    snapshot = alloc.snapshot()
    mapped = allocated = inactive_split = 0
    for seg in snapshot:
        # Blocks tile the segment exactly, in address order.
        cursor = seg.address
        for block in seg.blocks:
            assert block.address == cursor and block.size_bytes > 0
            cursor += block.size_bytes
            mapped += block.size_bytes if block.mapped else 0
            allocated += block.size_bytes if block.allocated else 0
            if not seg.is_expandable and not block.allocated and len(seg.blocks) > 1:
                inactive_split += block.size_bytes
        assert cursor == seg.address + seg.size_bytes
    for left, right in itertools.pairwise(snapshot):
        assert left.address + left.size_bytes <= right.address
    assert mapped == stats.reserved_bytes
    assert allocated == stats.allocated_bytes == sum(h.size_bytes for h in live)
    assert inactive_split == stats.inactive_split_bytes
    assert stats.largest_free_block_bytes <= stats.reserved_bytes - stats.allocated_bytes
    spans = sorted((h.address, h.address + h.size_bytes) for h in live if h.size_bytes)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start  # no two live blocks overlap
    for h in live:
        assert h.size_bytes == 0 or h.size_bytes >= round_size(h.requested_bytes, SPEC)


@settings(max_examples=150, deadline=None)
@given(config=st.sampled_from(sorted(CONFIGS)), trace=ops)
def test_random_traces_keep_the_allocator_consistent(config: str, trace: list) -> None:
    alloc = make(capacity_mib=128, **CONFIGS[config])
    live: list[Allocation] = []
    for op, value, stream in trace:
        if op == "alloc":
            try:
                handle, event = alloc.alloc(value, stream=stream)
            except OutOfMemoryError as err:
                assert err.event.cache_flushed
                continue
            assert event.latency_s >= (SPEC.cached_alloc_latency_s if value else 0)
            assert not (event.cache_hit and event.device_mallocs)
            live.append(handle)
        elif op == "free" and live:
            alloc.free(live.pop(value % len(live)))
        elif op == "empty_cache":
            alloc.empty_cache()
        check_invariants(alloc, live)
    while live:
        alloc.free(live.pop())
    check_invariants(alloc, live)
    stats = alloc.stats()
    assert stats.allocated_bytes == stats.active_bytes == stats.requested_bytes == 0
    alloc.empty_cache()
    assert alloc.stats().reserved_bytes == 0 and alloc.snapshot() == []


@settings(max_examples=50, deadline=None)
@given(trace=st.lists(st.integers(1, 3 * MiB), min_size=1, max_size=30))
def test_reserved_pool_never_calls_the_device(trace: list[int]) -> None:
    alloc = make(capacity_mib=64)
    alloc.reserve_pool("tmp", 8 * MiB)
    live: list[Allocation] = []
    for size in trace:
        try:
            handle, event = alloc.alloc(size, pool="tmp")
        except OutOfMemoryError:
            alloc.free(live.pop(0))
            continue
        assert event.device_mallocs == 0 and event.synchronizations == 0
        live.append(handle)
        check_invariants(alloc, live)
    assert alloc.stats().num_device_alloc == 1
    assert alloc.stats().reserved_bytes == 8 * MiB


def test_empty_cache_drops_an_expandable_segment_that_never_mapped() -> None:
    # Regression (found by the trace property): on stream 0 a new expandable segment failed to
    # map its first pages for lack of memory; its unmapped virtual range stayed listed after
    # empty_cache although it holds no memory.
    alloc = make(capacity_mib=128, **CONFIGS["expandable"])
    live = []
    for size, stream in ((10174433, 1), (36847073, 1), (36847585, 1), (20971489, 0)):
        try:
            live.append(alloc.alloc(size, stream=stream)[0])
        except OutOfMemoryError:
            pass
    for handle in live:
        alloc.free(handle)
    alloc.empty_cache()
    assert alloc.stats().reserved_bytes == 0 and alloc.snapshot() == []
