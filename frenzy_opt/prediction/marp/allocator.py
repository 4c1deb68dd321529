"""A model of PyTorch's CUDA caching allocator, replaying an allocation trace.

:func:`replay` feeds a sequence of :class:`MemEvent` (tensor-storage allocations and frees in program order) to
:class:`CachingAllocatorModel`, a re-implementation of the native backend of
``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``), and reports what the real allocator's
statistics would say: ``requested_bytes`` / ``allocated_bytes`` / ``reserved_bytes`` peaks (the numbers behind
``torch.cuda.max_memory_allocated`` and ``torch.cuda.max_memory_reserved``), segment and ``cudaMalloc`` counts,
and, under a capacity, the retries and out-of-memory failures.

The rules, with the constant or function of ``c10/cuda/CUDACachingAllocator.cpp`` each one comes from:

* a request is rounded up to a multiple of ``kMinBlockSize`` (512 B), or to the next power-of-two division
  when ``roundup_power2_divisions`` is configured (``round_size``, ``roundup_power2_next_division``; the
  per-size-interval table of ``c10/core/AllocatorConfig.cpp``, 16 intervals starting at 1 MiB);
* rounded requests of at most ``kSmallSize`` (1 MiB) use the small pool, larger ones the large pool
  (``get_pool``); each pool caches blocks per stream (``BlockComparatorSize`` orders by stream first);
* a free block is looked up best-fit: the smallest cached block of the pool and stream whose size is at
  least the request, ties broken by address (``get_free_block``, ``BlockComparatorSize``);
* with ``max_split_size``, a request below it never takes a block at or above it, and a request at or above
  it only takes a block smaller than request + ``max_non_split_rounding_size`` (default ``kLargeBuffer``,
  20 MiB) (``get_free_block``);
* when no block fits, a new segment is ``cudaMalloc``-ed: ``kSmallBuffer`` (2 MiB) for the small pool,
  ``kLargeBuffer`` (20 MiB) for large requests below ``kMinLargeAlloc`` (10 MiB), else the request rounded
  up to ``kRoundLarge`` (2 MiB) (``get_allocation_size``);
* the block found is split when the remainder is at least ``kMinBlockSize`` in the small pool (and in both
  pools with expandable segments), and in the large pool when the request is below ``max_split_size`` and
  the remainder exceeds ``kSmallSize`` (``should_split``); the allocated stat counts the whole block;
* a freed block merges with its free neighbours in the same segment (``free_block``, ``try_merge_blocks``)
  and stays cached: reserved memory only shrinks on an out-of-memory retry or ``empty_cache``;
* when ``cudaMalloc`` fails (``capacity_bytes`` exceeded), the allocator first frees cached oversize
  blocks (``release_available_cached_blocks``, only with ``max_split_size``), retries, then frees every
  cached block that is a whole segment (``release_cached_blocks``), retries once more (counted in
  ``num_alloc_retries``) and otherwise reports out of memory (``num_ooms``);
* with ``expandable_segments``, each pool and stream has one segment in a large virtual address range
  (``ExpandableSegment``, 9/8 of the device memory) whose physical pages, ``kSmallBuffer`` (2 MiB) in the
  small pool and ``kLargeBuffer`` (20 MiB) in the large pool, are mapped on demand at the lowest free
  address able to hold the request (``find_expandable_block``, ``try_allocate_expandable_block``,
  ``map_block``); best fit treats a free block in front of unmapped space as able to grow
  (``get_free_block``'s ``expandable_size``); freed pages stay mapped until a release unmaps every whole
  free page (``unmap_block``, ``release_blocks``).

Not modelled: the ``cudaMallocAsync`` backend, ``garbage_collection_threshold`` (it only acts under
``set_per_process_memory_fraction``), CUDA-graph private pools, ``record_stream`` (a block used on another
stream returns to its pool only when that stream's work completes), free-memory callbacks and IPC.
Non-expandable segments get increasing synthetic addresses; the real ``cudaMalloc`` picks its own, which only
matters when two cached blocks of equal size tie in the best-fit search.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "AllocatorConfig",
    "AllocatorOutOfMemoryError",
    "AllocatorStats",
    "CachingAllocatorModel",
    "MemEvent",
    "allocation_size",
    "replay",
    "round_size",
]


@dataclass(frozen=True, slots=True)
class MemEvent:
    """One allocation or free of a tensor storage, in program order.

    ``block`` identifies the allocation (unique among the live ones; a free names the block it frees),
    ``size`` is the bytes the caller asked for (``nbytes`` of the storage, before any rounding), ``phase``
    the part of the step it falls in (e.g. ``"setup"``, ``"forward"``, ``"backward"``, ``"optimizer"``),
    ``stream`` the CUDA stream it is made on (0 = the default stream; blocks are cached per stream).
    """

    action: str
    """``"alloc"`` or ``"free"``."""
    block: int
    size: int
    phase: str = ""
    stream: int = 0


# Constants of c10/cuda/CUDACachingAllocator.cpp (same names there, with a ``k`` prefix).
MiB = 1024 * 1024
K_MIN_BLOCK_SIZE = 512
"""``kMinBlockSize``: all sizes are rounded to at least 512 bytes."""
K_SMALL_SIZE = 1 * MiB
"""``kSmallSize``: the largest small-pool request."""
K_SMALL_BUFFER = 2 * MiB
"""``kSmallBuffer``: small-pool segments; also the page of a small-pool expandable segment."""
K_LARGE_BUFFER = 20 * MiB
"""``kLargeBuffer``: the segment of a large request below ``kMinLargeAlloc``; the page of a large-pool
expandable segment; the default ``max_non_split_rounding_size`` and the least ``max_split_size``."""
K_MIN_LARGE_ALLOC = 10 * MiB
"""``kMinLargeAlloc``: large requests below it get a ``kLargeBuffer`` segment."""
K_ROUND_LARGE = 2 * MiB
"""``kRoundLarge``: larger requests get a segment of their size rounded up to it."""

# c10/core/AllocatorConfig.cpp: roundup_power2_divisions keeps one value per power-of-two size interval,
# kRoundUpPowerOfTwoIntervals = 16 of them from kRoundUpPowerOfTwoStart = 1 MiB (the last is open-ended).
ROUNDUP_INTERVALS = 16
_ROUNDUP_START_LOG2 = 20

# The address space of an expandable segment is 9/8 of the device memory (ExpandableSegment's constructor);
# without a capacity the model assumes a device of this size (only the ordering of candidates depends on it).
_DEFAULT_DEVICE_BYTES = 1 << 40
_UNLIMITED = 1 << 64

_MODELLED_KEYS = ("expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions")
# Keys PyTorch accepts that do not change device-memory accounting (host pinned memory, locking, graphs).
_IGNORED_KEYS = (
    "backend",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
)
_UNMODELLED_KEYS = {
    "garbage_collection_threshold": "it frees cached segments only under set_per_process_memory_fraction, which "
    "this model does not implement; drop the key to predict without it",
}


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` settings the model honours (defaults = PyTorch's defaults)."""

    expandable_segments: bool = False
    max_split_size_bytes: int | None = None
    """``max_split_size_mb`` in bytes; ``None`` = unlimited (every block may be split). At least 20 MiB."""
    max_non_split_rounding_bytes: int = K_LARGE_BUFFER
    """``max_non_split_rounding_mb`` in bytes: how much larger than an oversize request a reused oversize
    block may be. At least 20 MiB."""
    roundup_power2_divisions: int | tuple[int, ...] | None = None
    """One division count for all sizes (a power of two), or one per size interval: 16 values, 0 or a power
    of two, for sizes below 2 MiB, then [2^k, 2^(k+1)) MiB for k = 1 .. 14, then 32 GiB and above.
    ``None``, 0 and 1 round to 512-byte multiples only."""

    def __post_init__(self) -> None:
        if self.max_split_size_bytes is not None and self.max_split_size_bytes < K_LARGE_BUFFER:
            raise ValueError(f"max_split_size_bytes must be >= {K_LARGE_BUFFER} (20 MiB), as PyTorch requires")
        if self.max_non_split_rounding_bytes < K_LARGE_BUFFER:
            raise ValueError(f"max_non_split_rounding_bytes must be >= {K_LARGE_BUFFER} (20 MiB), as PyTorch requires")
        divisions = self.roundup_power2_divisions
        if isinstance(divisions, int) and not _is_power_of_two(divisions):
            raise ValueError(f"roundup_power2_divisions must be a power of two, got {divisions}")
        if isinstance(divisions, tuple) and (
            len(divisions) != ROUNDUP_INTERVALS or any(d != 0 and not _is_power_of_two(d) for d in divisions)
        ):
            raise ValueError(f"roundup_power2_divisions needs {ROUNDUP_INTERVALS} values, each 0 or a power of two")

    def divisions_table(self) -> tuple[int, ...] | None:
        """The per-interval division counts, or ``None`` when no interval rounds beyond 512 bytes."""
        divisions = self.roundup_power2_divisions
        table = (divisions,) * ROUNDUP_INTERVALS if isinstance(divisions, int) else divisions
        return table if table is not None and any(d > 1 for d in table) else None

    @classmethod
    def from_env_string(cls, text: str) -> AllocatorConfig:
        """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` value such as ``"expandable_segments:True,max_split_size_mb:128"``.

        The syntax and checks follow ``c10/core/AllocatorConfig.cpp`` (``parseArgs``): ``key:value`` pairs
        separated by commas, ``roundup_power2_divisions`` either one power of two or a list
        ``[64:8,256:4,>:1]`` of size-in-MiB intervals. Keys that do not change device memory (pinned-memory
        and locking options, ``backend:native``) are accepted and ignored; unknown or unmodelled keys raise
        :class:`ValueError` naming the key and the keys allowed.
        """
        tokens = _lex(text)
        expandable = False
        max_split: int | None = None
        rounding = K_LARGE_BUFFER
        divisions: int | tuple[int, ...] | None = None
        allowed = ", ".join((*_MODELLED_KEYS, *_IGNORED_KEYS))
        i = 0
        while i < len(tokens):
            key = tokens[i]
            if key in _UNMODELLED_KEYS:
                raise ValueError(f"allocator option {key!r} is not modelled: {_UNMODELLED_KEYS[key]}")
            if key not in _MODELLED_KEYS and key not in _IGNORED_KEYS:
                raise ValueError(f"unknown allocator option {key!r}; allowed keys: {allowed}")
            i = _expect(tokens, i + 1, ":", key)
            if key == "roundup_power2_divisions" and i < len(tokens) and tokens[i] == "[":
                divisions, i = _parse_divisions_list(tokens, i + 1)
            else:
                if i >= len(tokens) or tokens[i] in ",:[]":
                    raise ValueError(f"allocator option {key!r} needs a value")
                value = tokens[i]
                i += 1
                if key == "expandable_segments":
                    if value not in ("True", "False"):
                        raise ValueError(f"allocator option {key!r} needs True or False, got {value!r}")
                    expandable = value == "True"
                elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                    megabytes = _parse_int(key, value)
                    if megabytes < K_LARGE_BUFFER // MiB:
                        raise ValueError(
                            f"allocator option {key!r} must be >= {K_LARGE_BUFFER // MiB}, got {megabytes}"
                        )
                    if key == "max_split_size_mb":
                        max_split = megabytes * MiB
                    else:
                        rounding = megabytes * MiB
                elif key == "roundup_power2_divisions":
                    divisions = _parse_int(key, value)
                    if not _is_power_of_two(divisions):
                        raise ValueError(f"allocator option {key!r} must be a power of two, got {divisions}")
                elif key == "backend" and value != "native":
                    raise ValueError(f"allocator backend {value!r} is not modelled; only 'native' is")
            if i < len(tokens):
                i = _expect(tokens, i, ",", key)
        return cls(expandable, max_split, rounding, divisions)

    def to_env_string(self) -> str:
        """The ``PYTORCH_CUDA_ALLOC_CONF`` value that sets this configuration (``""`` for the defaults)."""
        parts: list[str] = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        for key, value in (
            ("max_split_size_mb", self.max_split_size_bytes),
            ("max_non_split_rounding_mb", self.max_non_split_rounding_bytes),
        ):
            if value is None or (key == "max_non_split_rounding_mb" and value == K_LARGE_BUFFER):
                continue
            if value % MiB:
                raise ValueError(f"{key} is set in whole MiB; {value} bytes is not a multiple of {MiB}")
            parts.append(f"{key}:{value // MiB}")
        divisions = self.roundup_power2_divisions
        if isinstance(divisions, int):
            parts.append(f"roundup_power2_divisions:{divisions}")
        elif divisions is not None:
            listed = ",".join(f"{1 << index}:{d}" for index, d in enumerate(divisions))
            parts.append(f"roundup_power2_divisions:[{listed}]")
        return ",".join(parts)


def _lex(text: str) -> list[str]:
    """Split on ``, : [ ]`` (kept as tokens), dropping spaces (``AllocatorConfig::lexArgs``)."""
    tokens: list[str] = []
    word: list[str] = []
    for char in text:
        if char in ",:[]":
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(char)
        elif not char.isspace():
            word.append(char)
    if word:
        tokens.append("".join(word))
    return tokens


def _expect(tokens: list[str], i: int, token: str, key: str) -> int:
    if i >= len(tokens) or tokens[i] != token:
        found = tokens[i] if i < len(tokens) else "the end"
        raise ValueError(f"allocator option {key!r}: expected {token!r}, found {found!r}")
    return i + 1


def _parse_int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"allocator option {key!r} needs an integer, got {text!r}") from None


def _parse_divisions_list(tokens: list[str], i: int) -> tuple[tuple[int, ...], int]:
    """``[interval_mb:divisions, ..., >:divisions]`` after the ``[`` (``parseRoundUpPower2Divisions``).

    An interval ``m`` (a power of two, in MiB) sets the divisions of sizes in ``[m, 2m)`` MiB; the first
    entry also covers every smaller size; ``>`` covers every interval after the last one named.
    """
    key = "roundup_power2_divisions"
    table = [0] * ROUNDUP_INTERVALS
    first = True
    last_index = 0
    while True:
        if i >= len(tokens):
            raise ValueError(f"allocator option {key!r}: missing ']'")
        if tokens[i] == "]":
            return tuple(table), i + 1
        interval = tokens[i]
        i = _expect(tokens, i + 1, ":", key)
        if i >= len(tokens):
            raise ValueError(f"allocator option {key!r}: missing a division count")
        divisions = _parse_int(key, tokens[i])
        i += 1
        if divisions != 0 and not _is_power_of_two(divisions):
            raise ValueError(f"allocator option {key!r}: divisions must be 0 or a power of two, got {divisions}")
        if interval == ">":
            for index in range(last_index + 1, ROUNDUP_INTERVALS):
                table[index] = divisions
        else:
            megabytes = _parse_int(key, interval)
            if not _is_power_of_two(megabytes):
                raise ValueError(f"allocator option {key!r}: intervals must be powers of two, got {megabytes}")
            index = min(megabytes.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                for lower in range(index):
                    table[lower] = divisions
                first = False
            table[index] = divisions
            last_index = index
        if i < len(tokens) and tokens[i] == ",":
            i += 1


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: round up to the next of ``divisions`` steps between powers of two."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def round_size(size: int, config: AllocatorConfig | None = None) -> int:
    """The block size the allocator hands out for a request of ``size`` bytes (``round_size``)."""
    table = config.divisions_table() if config is not None else None
    return _round_with_table(size, table)


def _round_with_table(size: int, table: tuple[int, ...] | None) -> int:
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if table is not None:
        index = min(max(size.bit_length() - 1 - _ROUNDUP_START_LOG2, 0), ROUNDUP_INTERVALS - 1)
        divisions = table[index]
        if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
            return _roundup_power2_next_division(size, divisions)
    return (size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE * K_MIN_BLOCK_SIZE


def allocation_size(rounded: int) -> int:
    """The ``cudaMalloc`` size of a new segment for a rounded request (``get_allocation_size``)."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (rounded + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


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


class _Segment:
    """One ``cudaMalloc`` allocation, or one expandable segment's virtual range."""

    __slots__ = ("base", "expandable", "key", "page", "size")

    def __init__(self, key: int, base: int, size: int, expandable: bool, page: int) -> None:
        self.key = key
        self.base = base
        self.size = size
        self.expandable = expandable
        self.page = page


class _Block:
    """A contiguous range of a segment: allocated, cached (free and mapped) or unmapped."""

    __slots__ = ("addr", "allocated", "key", "mapped", "next", "prev", "requested", "seg", "size")

    def __init__(self, addr: int, size: int, seg: _Segment, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.seg = seg
        self.key = seg.key
        self.mapped = mapped
        self.allocated = False
        self.requested = 0
        self.prev: _Block | None = None
        self.next: _Block | None = None


class CachingAllocatorModel:
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
        self.capacity_bytes = capacity_bytes
        self.raise_on_oom = raise_on_oom
        self._table = self.config.divisions_table()
        self._expandable = self.config.expandable_segments
        mss = self.config.max_split_size_bytes
        self._mss = mss if mss is not None else _UNLIMITED
        self._mnsr = self.config.max_non_split_rounding_bytes
        self._device_bytes = capacity_bytes if capacity_bytes else _DEFAULT_DEVICE_BYTES
        # Pools are keyed by stream * 2 + (1 for the small pool, 0 for the large one).
        # Cached (free, mapped) blocks: per pool, sorted (size, address) pairs; and by address.
        self._free: dict[int, list[tuple[int, int]]] = {}
        self._free_at: dict[int, _Block] = {}
        # Unmapped ranges of expandable segments: per pool, sorted addresses; and by address.
        self._unmapped: dict[int, list[int]] = {}
        self._unmapped_at: dict[int, _Block] = {}
        self._segments: set[_Segment] = set()
        self._live: dict[int, _Block] = {}
        self._empty: set[int] = set()
        self._next_addr = 1 << 40
        self._phase: str | None = None
        self._run_reserved = 0  # the most reserved / allocated since the current phase began
        self._run_allocated = 0
        self.requested_bytes = 0
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_requested_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_num_segments = 0
        self.peak_phase_reserved: dict[str, int] = {}
        self.peak_phase_allocated: dict[str, int] = {}
        self.num_cudamalloc_calls = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
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
        rounded = _round_with_table(size, self._table)
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
            taken = _Block(found.addr, rounded, found.seg)
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
            insort(entries, (remaining, found.addr))
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
        entries = self._free.get(freed.key)
        if entries is None:
            entries = self._free[freed.key] = []
        free_at = self._free_at
        prev = freed.prev
        if prev is not None and not prev.allocated and prev.mapped:
            del entries[bisect_left(entries, (prev.size, prev.addr))]
            del free_at[prev.addr]
            freed.addr = prev.addr
            freed.size += prev.size
            freed.prev = prev.prev
            if freed.prev is not None:
                freed.prev.next = freed
        nxt = freed.next
        if nxt is not None and not nxt.allocated and nxt.mapped:
            del entries[bisect_left(entries, (nxt.size, nxt.addr))]
            del free_at[nxt.addr]
            freed.size += nxt.size
            freed.next = nxt.next
            if freed.next is not None:
                freed.next.prev = freed
        insort(entries, (freed.size, freed.addr))
        free_at[freed.addr] = freed

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

    # -- the cache index -------------------------------------------------------------------------------

    def _insert_free(self, blk: _Block) -> None:
        key = blk.key
        entries = self._free.get(key)
        if entries is None:
            entries = self._free[key] = []
        insort(entries, (blk.size, blk.addr))
        self._free_at[blk.addr] = blk

    def _remove_free(self, blk: _Block) -> None:
        entries = self._free[blk.key]
        del entries[bisect_left(entries, (blk.size, blk.addr))]
        del self._free_at[blk.addr]

    def _insert_unmapped(self, blk: _Block) -> None:
        key = blk.key
        entries = self._unmapped.get(key)
        if entries is None:
            entries = self._unmapped[key] = []
        insort(entries, blk.addr)
        self._unmapped_at[blk.addr] = blk

    def _remove_unmapped(self, blk: _Block) -> None:
        entries = self._unmapped[blk.key]
        del entries[bisect_left(entries, blk.addr)]
        del self._unmapped_at[blk.addr]

    def _grow_reserved(self, amount: int) -> None:
        self.reserved_bytes += amount
        if self.reserved_bytes > self._run_reserved:
            self._run_reserved = self.reserved_bytes
            if self.reserved_bytes > self.peak_reserved_bytes:
                self.peak_reserved_bytes = self.reserved_bytes

    # -- finding and getting memory --------------------------------------------------------------------

    def _get_free_block(self, key: int, rounded: int) -> _Block | None:
        """``get_free_block``: best fit in the pool and stream, with the oversize rules."""
        entries = self._free.get(key)
        if not entries:
            return None
        i = bisect_left(entries, (rounded, 0))
        count = len(entries)
        if i == count:
            return None
        size, addr = entries[i]
        if self._expandable:
            # A block in front of unmapped space counts as the size it can grow to; prefer smaller ones.
            grow = self._expandable_size(self._free_at[addr])
            while i + 1 < count:
                next_size, next_addr = entries[i + 1]
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

    @staticmethod
    def _expandable_size(blk: _Block) -> int:
        nxt = blk.next
        return blk.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    def _alloc_block(self, key: int, rounded: int) -> _Block | None:
        """``alloc_block``: a new segment (or newly mapped pages) holding at least ``rounded`` bytes."""
        if self._expandable:
            return self._try_allocate_expandable_block(key, rounded)
        size = allocation_size(rounded)
        if self.capacity_bytes is not None and self.reserved_bytes + size > self.capacity_bytes:
            return None
        seg = _Segment(key, self._next_addr, size, expandable=False, page=0)
        self._next_addr += (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE
        self._add_segment(seg)
        self.num_cudamalloc_calls += 1
        self.num_device_alloc += 1
        self._grow_reserved(size)
        return _Block(seg.base, size, seg)

    def _add_segment(self, seg: _Segment) -> None:
        self._segments.add(seg)
        if len(self._segments) > self.peak_num_segments:
            self.peak_num_segments = len(self._segments)

    def _try_allocate_expandable_block(self, key: int, rounded: int) -> _Block | None:
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

    def _find_expandable_block(self, key: int, rounded: int) -> _Block:
        """``find_expandable_block``: the lowest free-or-unmapped run of at least ``rounded`` bytes."""
        for addr in self._unmapped.get(key, ()):
            candidate = self._unmapped_at[addr]
            prev = candidate.prev
            if prev is not None and not prev.allocated:
                candidate = prev
            total = 0
            run: _Block | None = candidate
            while total < rounded and run is not None and not run.allocated:
                total += run.size
                run = run.next
            if total >= rounded:
                return candidate
        page = K_SMALL_BUFFER if key & 1 else K_LARGE_BUFFER
        address_space = self._device_bytes + self._device_bytes // 8
        size = (address_space + page - 1) // page * page
        seg = _Segment(key, self._next_addr, size, expandable=True, page=page)
        self._next_addr += size + page
        self._add_segment(seg)
        blk = _Block(seg.base, size, seg, mapped=False)
        self._insert_unmapped(blk)
        return blk

    def _map_block(self, blk: _Block, size: int) -> bool:
        """``map_block``: back the first ``size`` bytes (rounded up to pages) of an unmapped range."""
        seg = blk.seg
        mapped = (size + seg.page - 1) // seg.page * seg.page
        if self.capacity_bytes is not None and self.reserved_bytes + mapped > self.capacity_bytes:
            return False
        self._remove_unmapped(blk)
        blk.mapped = True
        if mapped < blk.size:
            rest = _Block(blk.addr + mapped, blk.size - mapped, seg, mapped=False)
            rest.prev = blk
            rest.next = blk.next
            if blk.next is not None:
                blk.next.prev = rest
            blk.next = rest
            blk.size = mapped
            self._insert_unmapped(rest)
        prev = blk.prev
        if prev is not None and not prev.allocated and prev.mapped:
            self._remove_free(prev)
            blk.addr = prev.addr
            blk.size += prev.size
            blk.prev = prev.prev
            if blk.prev is not None:
                blk.prev.next = blk
        nxt = blk.next
        if nxt is not None and not nxt.allocated and nxt.mapped:
            self._remove_free(nxt)
            blk.size += nxt.size
            blk.next = nxt.next
            if blk.next is not None:
                blk.next.prev = blk
        self._insert_free(blk)
        self.num_device_alloc += 1
        self._grow_reserved(mapped)
        return True

    # -- giving memory back ----------------------------------------------------------------------------

    def _release_available_cached_blocks(self, key: int, rounded: int) -> bool:
        """``release_available_cached_blocks``: free cached oversize segments, just enough for the request."""
        if self._mss == _UNLIMITED:
            return False
        entries = self._free.get(key, [])
        target = max(rounded, self._mss)
        i = bisect_left(entries, (target, 0))
        if i < len(entries) and not self._free_at[entries[i][1]].seg.expandable:
            self._release_block(self._free_at[entries[i][1]])
            return True
        released = 0
        j = i - 1
        while released < target and j >= 0 and entries[j][0] >= self._mss:
            blk = self._free_at[entries[j][1]]
            if not blk.seg.expandable:
                self._release_block(blk)  # removes entries[j]; the ones below keep their index
                released += blk.size
            j -= 1
        return released >= target

    def _release_block(self, blk: _Block) -> None:
        """``release_block``: ``cudaFree`` a cached block that is a whole segment."""
        if blk.prev is not None or blk.next is not None:
            raise AssertionError("release_block on a block that is not a whole segment")
        self._remove_free(blk)
        self._segments.discard(blk.seg)
        self.reserved_bytes -= blk.size
        self.num_device_free += 1

    def _release_cached_blocks(self) -> None:
        """``release_cached_blocks``: free every cached whole segment, unmap every whole free page."""
        whole: list[_Block] = []
        expandable: list[_Block] = []
        for entries in self._free.values():
            for _, addr in entries:
                blk = self._free_at[addr]
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

    def _unmap_block(self, blk: _Block) -> None:
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
            before = _Block(blk.addr, begin - blk.addr, seg)
            before.prev = blk.prev
            if blk.prev is not None:
                blk.prev.next = before
            before.next = blk
            blk.prev = before
            self._insert_free(before)
        if end < blk.addr + blk.size:
            after = _Block(end, blk.addr + blk.size - end, seg)
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

    # -- consistency -----------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError if the block lists, the cache index or the counters disagree (for tests)."""
        blocks = [*self._live.values(), *self._free_at.values(), *self._unmapped_at.values()]
        ids = {id(b) for b in blocks}
        assert len(ids) == len(blocks), "a block is both live and cached"
        heads: dict[_Segment, _Block] = {}
        for one in blocks:
            assert one.seg in self._segments, "a block of a released segment"
            if one.prev is None:
                assert one.seg not in heads, "a segment with two heads"
                heads[one.seg] = one
        reserved = 0
        seen = 0
        for seg in self._segments:
            blk: _Block | None = heads[seg]
            addr = seg.base
            prev: _Block | None = None
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
            for size, addr in entries:
                assert self._free_at[addr].size == size and not self._free_at[addr].allocated
        assert sum(len(e) for e in self._free.values()) == len(self._free_at)
        assert reserved == self.reserved_bytes, f"reserved {self.reserved_bytes} but segments hold {reserved}"
        assert self.allocated_bytes == sum(b.size for b in self._live.values())
        assert self.requested_bytes == sum(b.requested for b in self._live.values())
        assert self.reserved_bytes >= self.allocated_bytes >= self.requested_bytes


def replay(
    events: Iterable[MemEvent],
    config: AllocatorConfig = AllocatorConfig(),
    *,
    capacity_bytes: int | None = None,
    raise_on_oom: bool = False,
) -> AllocatorStats:
    """Replay an allocation trace through :class:`CachingAllocatorModel` and return its statistics.

    ``capacity_bytes`` is the memory the allocator may obtain from CUDA (free device memory, or the
    ``set_per_process_memory_fraction`` limit); without it segments are never refused. An allocation that
    does not fit even after the cache is freed is counted in ``num_ooms`` (its later free is ignored), or
    raises :class:`AllocatorOutOfMemoryError` with ``raise_on_oom``.
    """
    model = CachingAllocatorModel(config, capacity_bytes=capacity_bytes, raise_on_oom=raise_on_oom)
    malloc = model.malloc
    free = model.free
    ooms: list[int] = []
    phase: str | None = None
    for index, event in enumerate(events):
        if event.phase != phase:
            phase = event.phase
            model.set_phase(phase)
        action = event.action
        if action == "alloc":
            if not malloc(event.block, event.size, event.stream):
                ooms.append(index)
        elif action == "free":
            free(event.block)
        else:
            raise ValueError(f"event {index}: action must be 'alloc' or 'free', got {action!r}")
    return model.stats(tuple(ooms))
