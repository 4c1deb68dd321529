"""Expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) in the caching allocator model.

With expandable segments, each pool and stream has one segment in a large virtual address range
(``ExpandableSegment`` of ``c10/cuda/CUDACachingAllocator.cpp``, 9/8 of the device memory) whose physical
pages, ``kSmallBuffer`` (2 MiB) in the small pool and ``kLargeBuffer`` (20 MiB) in the large pool, are mapped
on demand at the lowest free address able to hold the request (``find_expandable_block``,
``try_allocate_expandable_block``, ``map_block``); best fit treats a free block in front of unmapped space as
able to grow (``get_free_block``'s ``expandable_size``); freed pages stay mapped until a release unmaps every
whole free page (``unmap_block``, ``release_blocks``).
"""

from __future__ import annotations

from frenzy_opt.prediction.marp.allocator.pools import Block, BlockPools, Segment
from frenzy_opt.prediction.marp.allocator.sizes import K_LARGE_BUFFER, K_SMALL_BUFFER

__all__ = ["ExpandableSegments"]

# The address space of an expandable segment is 9/8 of the device memory (ExpandableSegment's constructor);
# without a capacity the model assumes a device of this size (only the ordering of candidates depends on it).
_DEFAULT_DEVICE_BYTES = 1 << 40


class ExpandableSegments(BlockPools):
    """The pools of :class:`BlockPools` with expandable segments' page mapping and unmapping (module
    docstring); the allocator model uses them when ``expandable_segments`` is set."""

    def __init__(self, capacity_bytes: int | None) -> None:
        super().__init__(capacity_bytes)
        self._device_bytes = capacity_bytes if capacity_bytes else _DEFAULT_DEVICE_BYTES

    @staticmethod
    def _expandable_size(blk: Block) -> int:
        nxt = blk.next
        return blk.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    def _try_allocate_expandable_block(self, key: int, rounded: int) -> Block | None:
        """``try_allocate_expandable_block``: map pages at the lowest address that can hold the request."""
        candidate = self._find_expandable_block(key, rounded)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, rounded)):
            return None
        while candidate.size < rounded:
            nxt = candidate.next
            if nxt is None or nxt.mapped or nxt.allocated:
                raise AssertionError("expandable segment: the range to grow into is not unmapped")
            if not self._map_block(nxt, min(rounded - candidate.size, nxt.size)):
                return None
            candidate = nxt  # map_block merged the free front into it
        self._remove_free(candidate)
        return candidate

    def _find_expandable_block(self, key: int, rounded: int) -> Block:
        """``find_expandable_block``: the lowest free-or-unmapped run of at least ``rounded`` bytes."""
        for addr in self._unmapped.get(key, ()):
            candidate = self._unmapped_at[addr]
            prev = candidate.prev
            if prev is not None and not prev.allocated:
                candidate = prev
            total = 0
            run: Block | None = candidate
            while total < rounded and run is not None and not run.allocated:
                total += run.size
                run = run.next
            if total >= rounded:
                return candidate
        page = K_SMALL_BUFFER if key & 1 else K_LARGE_BUFFER
        address_space = self._device_bytes + self._device_bytes // 8
        size = (address_space + page - 1) // page * page
        seg = Segment(key, self._next_addr, size, expandable=True, page=page)
        self._next_addr += size + page
        self._add_segment(seg)
        blk = Block(seg.base, size, seg, mapped=False)
        self._insert_unmapped(blk)
        return blk

    def _map_block(self, blk: Block, size: int) -> bool:
        """``map_block``: back the first ``size`` bytes (rounded up to pages) of an unmapped range."""
        seg = blk.seg
        mapped = (size + seg.page - 1) // seg.page * seg.page
        if self.capacity_bytes is not None and self.reserved_bytes + mapped > self.capacity_bytes:
            return False
        self._remove_unmapped(blk)
        blk.mapped = True
        if mapped < blk.size:
            rest = Block(blk.addr + mapped, blk.size - mapped, seg, mapped=False)
            rest.prev = blk
            rest.next = blk.next
            if blk.next is not None:
                blk.next.prev = rest
            blk.next = rest
            blk.size = mapped
            self._insert_unmapped(rest)
        self._cache_block(blk)
        self.num_device_alloc += 1
        self._grow_reserved(mapped)
        return True

    def _unmap_block(self, blk: Block) -> None:
        """``unmap_block``: unmap the whole pages inside a cached block of an expandable segment."""
        seg = blk.seg
        page = seg.page
        offset = blk.addr - seg.base
        begin = seg.base + -(-offset // page) * page
        end = seg.base + (offset + blk.size) // page * page
        if begin >= end:
            return
        self._remove_free(blk)
        if begin > blk.addr:
            before = Block(blk.addr, begin - blk.addr, seg)
            before.prev = blk.prev
            if blk.prev is not None:
                blk.prev.next = before
            before.next = blk
            blk.prev = before
            self._insert_free(before)
        if end < blk.addr + blk.size:
            after = Block(end, blk.addr + blk.size - end, seg)
            after.next = blk.next
            if blk.next is not None:
                blk.next.prev = after
            after.prev = blk
            blk.next = after
            self._insert_free(after)
        blk.addr = begin
        blk.size = end - begin
        blk.mapped = False
        prev = blk.prev
        if prev is not None and not prev.mapped:
            self._remove_unmapped(prev)
            blk.addr = prev.addr
            blk.size += prev.size
            blk.prev = prev.prev
            if blk.prev is not None:
                blk.prev.next = blk
        nxt = blk.next
        if nxt is not None and not nxt.mapped:
            self._remove_unmapped(nxt)
            blk.size += nxt.size
            blk.next = nxt.next
            if blk.next is not None:
                blk.next.prev = blk
        self._insert_unmapped(blk)
        self.reserved_bytes -= end - begin
        self.num_device_free += 1
