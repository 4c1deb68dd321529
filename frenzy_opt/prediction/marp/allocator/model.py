"""A model of PyTorch's CUDA caching allocator: the allocator state machine of one device.

:class:`CachingAllocatorModel` re-implements the native backend of ``c10/cuda/CUDACachingAllocator.cpp``
(``DeviceCachingAllocator``): :meth:`~CachingAllocatorModel.malloc`, :meth:`~CachingAllocatorModel.free` and
:meth:`~CachingAllocatorModel.empty_cache` over the pools of :mod:`~frenzy_opt.prediction.marp.allocator.pools`
(with the page mapping of :mod:`~frenzy_opt.prediction.marp.allocator.expandable`), and reports what the real
allocator's statistics would say (:class:`AllocatorStats`): ``requested_bytes`` / ``allocated_bytes`` /
``reserved_bytes`` peaks (the numbers behind ``torch.cuda.max_memory_allocated`` and
``torch.cuda.max_memory_reserved``), segment and ``cudaMalloc`` counts, and, under a capacity, the retries and
out-of-memory failures.

The rules it owns, with the constant or function of ``c10/cuda/CUDACachingAllocator.cpp`` each one comes from
(request rounding and segment sizes: :mod:`~frenzy_opt.prediction.marp.allocator.sizes`; merging freed
blocks: :mod:`~frenzy_opt.prediction.marp.allocator.pools`; expandable segments:
:mod:`~frenzy_opt.prediction.marp.allocator.expandable`):

* rounded requests of at most ``kSmallSize`` (1 MiB) use the small pool, larger ones the large pool
  (``get_pool``), per stream;
* a free block is looked up best-fit: the smallest cached block of the pool and stream whose size is at
  least the request, ties broken by address (``get_free_block``, ``BlockComparatorSize``);
* with ``max_split_size``, a request below it never takes a block at or above it, and a request at or above
  it only takes a block smaller than request + ``max_non_split_rounding_size`` (default ``kLargeBuffer``,
  20 MiB) (``get_free_block``);
* when no block fits, a new segment is ``cudaMalloc``-ed (``alloc_block``);
* the block found is split when the remainder is at least ``kMinBlockSize`` in the small pool (and in both
  pools with expandable segments), and in the large pool when the request is below ``max_split_size`` and
  the remainder exceeds ``kSmallSize`` (``should_split``); the allocated stat counts the whole block;
* a freed block merges with its free neighbours in the same segment (``free_block``, ``try_merge_blocks``)
  and stays cached: reserved memory only shrinks on an out-of-memory retry or ``empty_cache``;
* when ``cudaMalloc`` fails (``capacity_bytes`` exceeded), the allocator first frees cached oversize
  blocks (``release_available_cached_blocks``, only with ``max_split_size``), retries, then frees every
  cached block that is a whole segment (``release_cached_blocks``), retries once more (counted in
  ``num_alloc_retries``) and otherwise reports out of memory (``num_ooms``).

Not modelled: the ``cudaMallocAsync`` backend, ``garbage_collection_threshold`` (it only acts under
``set_per_process_memory_fraction``), CUDA-graph private pools, ``record_stream`` (a block used on another
stream returns to its pool only when that stream's work completes), free-memory callbacks and IPC.
Non-expandable segments get increasing synthetic addresses; the real ``cudaMalloc`` picks its own, which only
matters when two cached blocks of equal size tie in the best-fit search.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping
from dataclasses import dataclass, field

from frenzy_opt.prediction.marp.allocator.config import AllocatorConfig
from frenzy_opt.prediction.marp.allocator.expandable import ExpandableSegments
from frenzy_opt.prediction.marp.allocator.pools import ADDR_BITS, ADDR_MASK, Block, Segment
from frenzy_opt.prediction.marp.allocator.sizes import (
    K_MIN_BLOCK_SIZE,
    K_ROUND_LARGE,
    K_SMALL_SIZE,
    allocation_size,
    round_with_table,
)

__all__ = ["AllocatorOutOfMemoryError", "AllocatorStats", "CachingAllocatorModel"]

# No limit: ``max_split_size`` unset (PyTorch keeps SIZE_MAX, c10/core/AllocatorConfig.cpp) or no capacity.
_UNLIMITED = 1 << 64


@dataclass(frozen=True, slots=True)
class AllocatorStats:
    """What the allocator's statistics (``torch.cuda.memory_stats``) would report after the trace."""

    peak_requested_bytes: int
    """Live requested sizes, at their maximum (``requested_bytes.all.peak``)."""
    peak_allocated_bytes: int
    """Live blocks as the allocator sized them (``allocated_bytes.all.peak``, ``max_memory_allocated``)."""
    peak_reserved_bytes: int
    """Segments held, cached or not (``reserved_bytes.all.peak``, ``max_memory_reserved``)."""
    peak_phase_reserved: Mapping[str, int]
    """Per phase, the most reserved while (or right after) that phase's events ran."""
    peak_phase_allocated: Mapping[str, int]
    """Per phase, the most allocated right after that phase's events."""
    requested_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    """The three current values at the end of the trace."""
    num_segments: int
    """Segments held at the end: ``cudaMalloc`` segments, or expandable segments (one per pool and stream)."""
    peak_num_segments: int
    num_cudamalloc_calls: int
    """Successful ``cudaMalloc`` calls (0 with expandable segments, which map pages instead)."""
    num_device_alloc: int
    """``cudaMalloc`` calls plus page-mapping calls (``num_device_alloc``)."""
    num_device_free: int
    """``cudaFree`` calls plus page-unmapping calls (``num_device_free``)."""
    num_alloc_retries: int
    """Allocations that freed every cached segment and retried (``num_alloc_retries``)."""
    num_ooms: int
    """Allocations that still did not fit (``num_ooms``); only with a capacity."""
    oom_events: tuple[int, ...] = field(default=())
    """Indices (in the trace) of the events that ran out of memory."""


class AllocatorOutOfMemoryError(MemoryError):
    """An allocation did not fit in ``capacity_bytes`` even after freeing the cache (``raise_on_oom``)."""

    def __init__(self, block: int, size: int, reserved: int, allocated: int, capacity: int) -> None:
        super().__init__(
            f"out of memory allocating block {block} ({size} bytes): {allocated} allocated, "
            f"{reserved} reserved, capacity {capacity}"
        )
        self.block = block
        self.size = size


class CachingAllocatorModel(ExpandableSegments):
    """The native CUDA caching allocator of one device, driven by :meth:`malloc`, :meth:`free` and
    :meth:`empty_cache`. ``capacity_bytes`` is the memory ``cudaMalloc`` may hand out (None = unlimited).
    """

    def __init__(
        self,
        config: AllocatorConfig | None = None,
        *,
        capacity_bytes: int | None = None,
        raise_on_oom: bool = False,
    ) -> None:
        self.config = config if config is not None else AllocatorConfig()
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        super().__init__(capacity_bytes)
        self.raise_on_oom = raise_on_oom
        self._table = self.config.divisions_table()
        self._expandable = self.config.expandable_segments
        mss = self.config.max_split_size_bytes
        self._mss = mss if mss is not None else _UNLIMITED
        self._mnsr = self.config.max_non_split_rounding_bytes
        self._live: dict[int, Block] = {}
        self._empty: set[int] = set()
        self._phase: str | None = None
        self._run_allocated = 0  # the most allocated since the current phase began
        self.requested_bytes = 0
        self.allocated_bytes = 0
        self.peak_requested_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_phase_reserved: dict[str, int] = {}
        self.peak_phase_allocated: dict[str, int] = {}
        self.num_cudamalloc_calls = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0

    # -- the public operations -------------------------------------------------------------------------

    def malloc(self, block: int, size: int, stream: int = 0) -> bool:
        """Allocate ``size`` bytes as ``block`` on ``stream``; False (or raise) when it runs out of memory."""
        if block in self._live or block in self._empty:
            raise ValueError(f"block {block} is allocated twice without a free")
        if size <= 0:
            if size < 0:
                raise ValueError(f"block {block} has a negative size {size}")
            self._empty.add(block)  # a zero-byte storage never reaches the allocator
            return True
        rounded = round_with_table(size, self._table)
        small = rounded <= K_SMALL_SIZE
        key = stream * 2 + small
        found = self._get_free_block(key, rounded)
        if found is None:
            found = self._alloc_block(key, rounded)
            if found is None and self._release_available_cached_blocks(key, rounded):
                found = self._alloc_block(key, rounded)
            if found is None:
                self._release_cached_blocks()
                self.num_alloc_retries += 1
                found = self._alloc_block(key, rounded)
            if found is None:
                self.num_ooms += 1
                self._empty.add(block)  # the program would have raised; its later free is ignored
                if self.raise_on_oom:
                    capacity = self.capacity_bytes if self.capacity_bytes is not None else _UNLIMITED
                    raise AllocatorOutOfMemoryError(block, size, self.reserved_bytes, self.allocated_bytes, capacity)
                return False
        remaining = found.size - rounded
        if small or self._expandable:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = rounded < self._mss and remaining > K_SMALL_SIZE
        if split:
            # alloc_found_block: the front becomes the allocation, the remainder stays cached.
            taken = Block(found.addr, rounded, found.seg)
            prev = found.prev
            taken.prev = prev
            if prev is not None:
                prev.next = taken
            taken.next = found
            found.prev = taken
            found.addr += rounded
            found.size = remaining
            entries = self._free.get(key)
            if entries is None:
                entries = self._free[key] = []
            insort(entries, remaining << ADDR_BITS | found.addr)
            self._free_at[found.addr] = found
            found = taken
        found.allocated = True
        found.requested = size
        self._live[block] = found
        self.requested_bytes += size
        if self.requested_bytes > self.peak_requested_bytes:
            self.peak_requested_bytes = self.requested_bytes
        allocated = self.allocated_bytes = self.allocated_bytes + found.size
        if allocated > self._run_allocated:
            self._run_allocated = allocated
            if allocated > self.peak_allocated_bytes:
                self.peak_allocated_bytes = allocated
        return True

    def free(self, block: int) -> None:
        """Free ``block``: its memory returns to the pool of its stream and merges with free neighbours."""
        freed = self._live.pop(block, None)
        if freed is None:
            if block in self._empty:
                self._empty.discard(block)
                return
            raise ValueError(f"block {block} is freed but not allocated")
        self.requested_bytes -= freed.requested
        self.allocated_bytes -= freed.size
        freed.allocated = False
        freed.requested = 0
        self._cache_block(freed)

    def set_phase(self, phase: str) -> None:
        """Name the phase the next operations belong to (for ``peak_phase_reserved`` / ``_allocated``)."""
        self._flush_phase()
        self._phase = phase
        self._run_reserved = self.reserved_bytes
        self._run_allocated = self.allocated_bytes

    def _flush_phase(self) -> None:
        phase = self._phase
        if phase is None:
            return
        if self._run_reserved >= self.peak_phase_reserved.get(phase, 0):
            self.peak_phase_reserved[phase] = self._run_reserved
        if self._run_allocated >= self.peak_phase_allocated.get(phase, 0):
            self.peak_phase_allocated[phase] = self._run_allocated

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache``: release every cached segment and unmap every whole free page."""
        self._release_cached_blocks()

    def stats(self, oom_events: tuple[int, ...] = ()) -> AllocatorStats:
        """The statistics so far."""
        self._flush_phase()
        return AllocatorStats(
            peak_requested_bytes=self.peak_requested_bytes,
            peak_allocated_bytes=self.peak_allocated_bytes,
            peak_reserved_bytes=self.peak_reserved_bytes,
            peak_phase_reserved=dict(self.peak_phase_reserved),
            peak_phase_allocated=dict(self.peak_phase_allocated),
            requested_bytes=self.requested_bytes,
            allocated_bytes=self.allocated_bytes,
            reserved_bytes=self.reserved_bytes,
            num_segments=len(self._segments),
            peak_num_segments=self.peak_num_segments,
            num_cudamalloc_calls=self.num_cudamalloc_calls,
            num_device_alloc=self.num_device_alloc,
            num_device_free=self.num_device_free,
            num_alloc_retries=self.num_alloc_retries,
            num_ooms=self.num_ooms,
            oom_events=oom_events,
        )

    # -- finding and getting memory --------------------------------------------------------------------

    def _get_free_block(self, key: int, rounded: int) -> Block | None:
        """``get_free_block``: best fit in the pool and stream, with the oversize rules."""
        entries = self._free.get(key)
        if not entries:
            return None
        i = bisect_left(entries, rounded << ADDR_BITS)
        count = len(entries)
        if i == count:
            return None
        size, addr = entries[i] >> ADDR_BITS, entries[i] & ADDR_MASK
        if self._expandable:
            # A block in front of unmapped space counts as the size it can grow to; prefer smaller ones.
            grow = self._expandable_size(self._free_at[addr])
            while i + 1 < count:
                next_size, next_addr = entries[i + 1] >> ADDR_BITS, entries[i + 1] & ADDR_MASK
                next_grow = self._expandable_size(self._free_at[next_addr])
                if next_grow >= grow:
                    break
                i, size, addr, grow = i + 1, next_size, next_addr, next_grow
        if rounded < self._mss and size >= self._mss:
            return None  # do not hand out an oversize block for a smaller request
        if rounded >= self._mss and size >= rounded + self._mnsr:
            return None  # an oversize block may exceed an oversize request by less than the rounding limit
        del entries[i]
        return self._free_at.pop(addr)

    def _alloc_block(self, key: int, rounded: int) -> Block | None:
        """``alloc_block``: a new segment (or newly mapped pages) holding at least ``rounded`` bytes."""
        if self._expandable:
            return self._try_allocate_expandable_block(key, rounded)
        size = allocation_size(rounded)
        if self.capacity_bytes is not None and self.reserved_bytes + size > self.capacity_bytes:
            return None
        seg = Segment(key, self._next_addr, size, False, 0)  # not expandable, no pages
        self._next_addr += (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE
        self._add_segment(seg)
        self.num_cudamalloc_calls += 1
        self.num_device_alloc += 1
        self._grow_reserved(size)
        return Block(seg.base, size, seg)

    # -- giving memory back ----------------------------------------------------------------------------

    def _release_available_cached_blocks(self, key: int, rounded: int) -> bool:
        """``release_available_cached_blocks``: free cached oversize segments, just enough for the request."""
        if self._mss == _UNLIMITED:
            return False
        entries = self._free.get(key, [])
        target = max(rounded, self._mss)
        i = bisect_left(entries, target << ADDR_BITS)
        if i < len(entries) and not self._free_at[entries[i] & ADDR_MASK].seg.expandable:
            self._release_block(self._free_at[entries[i] & ADDR_MASK])
            return True
        released = 0
        j = i - 1
        while released < target and j >= 0 and entries[j] >> ADDR_BITS >= self._mss:
            blk = self._free_at[entries[j] & ADDR_MASK]
            if not blk.seg.expandable:
                self._release_block(blk)  # removes entries[j]; the ones below keep their index
                released += blk.size
            j -= 1
        return released >= target

    def _release_cached_blocks(self) -> None:
        """``release_cached_blocks``: free every cached whole segment, unmap every whole free page."""
        whole: list[Block] = []
        expandable: list[Block] = []
        for entries in self._free.values():
            for item in entries:
                blk = self._free_at[item & ADDR_MASK]
                if blk.seg.expandable:
                    expandable.append(blk)
                elif blk.prev is None and blk.next is None:
                    whole.append(blk)
        for blk in whole:
            self._release_block(blk)
        for blk in expandable:
            self._unmap_block(blk)
            if blk.prev is None and blk.next is None and not blk.mapped:
                self._remove_unmapped(blk)  # release_expandable_segment: nothing of it is used any more
                self._segments.discard(blk.seg)

    # -- consistency -----------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError if the block lists, the cache index or the counters disagree (for tests)."""
        blocks = [*self._live.values(), *self._free_at.values(), *self._unmapped_at.values()]
        ids = {id(b) for b in blocks}
        assert len(ids) == len(blocks), "a block is both live and cached"
        heads: dict[Segment, Block] = {}
        for one in blocks:
            assert one.seg in self._segments, "a block of a released segment"
            if one.prev is None:
                assert one.seg not in heads, "a segment with two heads"
                heads[one.seg] = one
        reserved = 0
        seen = 0
        for seg in self._segments:
            blk: Block | None = heads[seg]
            addr = seg.base
            prev: Block | None = None
            while blk is not None:
                assert id(blk) in ids, "a block in a segment but in no index"
                assert blk.seg is seg and blk.addr == addr and blk.size > 0, "blocks do not tile the segment"
                assert blk.prev is prev, "broken prev link"
                if prev is not None and not blk.allocated and not prev.allocated:
                    assert blk.mapped != prev.mapped, "two free neighbours were not merged"
                if blk.mapped:
                    reserved += blk.size
                else:
                    assert seg.expandable and (blk.addr - seg.base) % seg.page == 0 and blk.size % seg.page == 0
                addr += blk.size
                seen += 1
                prev, blk = blk, blk.next
            assert addr == seg.base + seg.size, "blocks do not cover the segment"
        assert seen == len(blocks), "a block outside every segment"
        for entries in self._free.values():
            assert entries == sorted(entries)
            for item in entries:
                size, addr = item >> ADDR_BITS, item & ADDR_MASK
                assert self._free_at[addr].size == size and not self._free_at[addr].allocated
        assert sum(len(e) for e in self._free.values()) == len(self._free_at)
        assert reserved == self.reserved_bytes, f"reserved {self.reserved_bytes} but segments hold {reserved}"
        assert self.allocated_bytes == sum(b.size for b in self._live.values())
        assert self.requested_bytes == sum(b.requested for b in self._live.values())
        assert self.reserved_bytes >= self.allocated_bytes >= self.requested_bytes
