"""The segments of one device's caching allocator, the blocks they are cut into, and the pools of cached blocks.

:class:`Segment` is one ``cudaMalloc`` allocation (or one expandable segment's virtual range), :class:`Block`
a contiguous range of it, linked to its neighbours in address order (``Block`` of
``c10/cuda/CUDACachingAllocator.cpp``). :class:`BlockPools` keeps the segments and indexes the cached blocks:

* rounded requests of at most ``kSmallSize`` (1 MiB) use the small pool, larger ones the large pool
  (``get_pool``); each pool caches blocks per stream (``BlockComparatorSize`` orders by stream first), so a
  pool here is keyed by ``stream * 2 + (1 for the small pool, 0 for the large one)``;
* within a pool, cached blocks are ordered by (size, address), the order best fit searches
  (``BlockComparatorSize``), each as one int (:data:`ADDR_BITS`);
* a block that becomes free merges with its free neighbours in the same segment before it is cached
  (``free_block`` and ``map_block``, both through ``try_merge_blocks``): :meth:`BlockPools._cache_block`;
* it also keeps the bytes reserved (segments held, or pages mapped) and their peaks.
"""

from __future__ import annotations

from bisect import bisect_left, insort

__all__ = ["ADDR_BITS", "ADDR_MASK", "Block", "BlockPools", "Segment"]

ADDR_BITS = 64
"""A cached block's index entry is the int ``size << ADDR_BITS | addr``: such ints order as the (size, address)
pairs do while every address is below ``2**ADDR_BITS`` (:meth:`BlockPools._add_segment` refuses a segment
reaching past it), and one int compares and sorts faster than a pair (a plan search's replays,
:func:`frenzy_opt.prediction.marp.bound.allocator_reserve_bytes`, spend much of their time in these lists)."""
ADDR_MASK = (1 << ADDR_BITS) - 1
"""``entry & ADDR_MASK`` is an index entry's address, ``entry >> ADDR_BITS`` its size."""


class Segment:
    """One ``cudaMalloc`` allocation, or one expandable segment's virtual range."""

    __slots__ = ("base", "expandable", "key", "page", "size")

    def __init__(self, key: int, base: int, size: int, expandable: bool, page: int) -> None:
        self.key = key
        self.base = base
        self.size = size
        self.expandable = expandable
        self.page = page


class Block:
    """A contiguous range of a segment: allocated, cached (free and mapped) or unmapped."""

    __slots__ = ("addr", "allocated", "key", "mapped", "next", "prev", "requested", "seg", "size")

    def __init__(self, addr: int, size: int, seg: Segment, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.seg = seg
        self.key = seg.key
        self.mapped = mapped
        self.allocated = False
        self.requested = 0
        self.prev: Block | None = None
        self.next: Block | None = None


class BlockPools:
    """The segments held, the index of cached blocks per pool and stream (module docstring), the unmapped
    ranges of expandable segments, and the reserved bytes. ``capacity_bytes`` is the memory ``cudaMalloc``
    may hand out (None = unlimited)."""

    def __init__(self, capacity_bytes: int | None) -> None:
        self.capacity_bytes = capacity_bytes
        # Cached (free, mapped) blocks: per pool, sorted (size, address) entries (:data:`ADDR_BITS`); and by address.
        self._free: dict[int, list[int]] = {}
        self._free_at: dict[int, Block] = {}
        # Unmapped ranges of expandable segments: per pool, sorted addresses; and by address.
        self._unmapped: dict[int, list[int]] = {}
        self._unmapped_at: dict[int, Block] = {}
        self._segments: set[Segment] = set()
        self._next_addr = 1 << 40
        self._run_reserved = 0  # the most reserved since the current phase began
        self.reserved_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_num_segments = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    # -- the cache index -------------------------------------------------------------------------------

    def _insert_free(self, blk: Block) -> None:
        key = blk.key
        entries = self._free.get(key)
        if entries is None:
            entries = self._free[key] = []
        insort(entries, blk.size << ADDR_BITS | blk.addr)
        self._free_at[blk.addr] = blk

    def _remove_free(self, blk: Block) -> None:
        entries = self._free[blk.key]
        del entries[bisect_left(entries, blk.size << ADDR_BITS | blk.addr)]
        del self._free_at[blk.addr]

    def _insert_unmapped(self, blk: Block) -> None:
        key = blk.key
        entries = self._unmapped.get(key)
        if entries is None:
            entries = self._unmapped[key] = []
        insort(entries, blk.addr)
        self._unmapped_at[blk.addr] = blk

    def _remove_unmapped(self, blk: Block) -> None:
        entries = self._unmapped[blk.key]
        del entries[bisect_left(entries, blk.addr)]
        del self._unmapped_at[blk.addr]

    def _grow_reserved(self, amount: int) -> None:
        self.reserved_bytes += amount
        if self.reserved_bytes > self._run_reserved:
            self._run_reserved = self.reserved_bytes
            if self.reserved_bytes > self.peak_reserved_bytes:
                self.peak_reserved_bytes = self.reserved_bytes

    def _add_segment(self, seg: Segment) -> None:
        if seg.base + seg.size > ADDR_MASK:
            raise OverflowError("segment addresses reached 2**ADDR_BITS: the cache index entries would collide")
        self._segments.add(seg)
        if len(self._segments) > self.peak_num_segments:
            self.peak_num_segments = len(self._segments)

    def _release_block(self, blk: Block) -> None:
        """``release_block``: ``cudaFree`` a cached block that is a whole segment."""
        if blk.prev is not None or blk.next is not None:
            raise AssertionError("release_block on a block that is not a whole segment")
        self._remove_free(blk)
        self._segments.discard(blk.seg)
        self.reserved_bytes -= blk.size
        self.num_device_free += 1

    # -- merging on free -------------------------------------------------------------------------------

    def _cache_block(self, blk: Block) -> None:
        """Merge a free, mapped block with its free, mapped neighbours and cache the result (``free_block``
        and ``map_block``: ``try_merge_blocks`` with the previous and the next block, then
        ``insert_into_blocks``)."""
        entries = self._free.get(blk.key)
        if entries is None:
            entries = self._free[blk.key] = []
        free_at = self._free_at
        prev = blk.prev
        if prev is not None and not prev.allocated and prev.mapped:
            del entries[bisect_left(entries, prev.size << ADDR_BITS | prev.addr)]
            del free_at[prev.addr]
            blk.addr = prev.addr
            blk.size += prev.size
            blk.prev = prev.prev
            if blk.prev is not None:
                blk.prev.next = blk
        nxt = blk.next
        if nxt is not None and not nxt.allocated and nxt.mapped:
            del entries[bisect_left(entries, nxt.size << ADDR_BITS | nxt.addr)]
            del free_at[nxt.addr]
            blk.size += nxt.size
            blk.next = nxt.next
            if blk.next is not None:
                blk.next.prev = blk
        insort(entries, blk.size << ADDR_BITS | blk.addr)
        free_at[blk.addr] = blk
