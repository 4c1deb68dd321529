"""The caching allocator's sizes: its constants, how a request is rounded, and how large a new segment is.

The rules, with the constant or function of ``c10/cuda/CUDACachingAllocator.cpp`` each one comes from:

* a request is rounded up to a multiple of ``kMinBlockSize`` (512 B), or to the next power-of-two division
  when ``roundup_power2_divisions`` is configured (``round_size``, ``roundup_power2_next_division``; the
  per-size-interval table of ``c10/core/AllocatorConfig.cpp``, 16 intervals starting at 1 MiB);
* when no cached block fits, a new segment is ``cudaMalloc``-ed: ``kSmallBuffer`` (2 MiB) for the small pool,
  ``kLargeBuffer`` (20 MiB) for large requests below ``kMinLargeAlloc`` (10 MiB), else the request rounded
  up to ``kRoundLarge`` (2 MiB) (``get_allocation_size``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from frenzy_opt.prediction.marp.allocator.config import AllocatorConfig

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "ROUNDUP_INTERVALS",
    "MiB",
    "allocation_size",
    "round_size",
    "round_with_table",
]

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
    return round_with_table(size, table)


def round_with_table(size: int, table: tuple[int, ...] | None) -> int:
    """:func:`round_size` with the configuration's division table already read
    (``AllocatorConfig.divisions_table``): what the model calls on every request."""
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
