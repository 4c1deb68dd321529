"""Replaying an allocation trace through the caching allocator model.

A trace is a sequence of :class:`MemEvent` (tensor-storage allocations and frees in program order), from the
trace path (:mod:`frenzy_opt.tracing.recorder`) or predicted (:mod:`frenzy_opt.prediction.marp.bound`);
:func:`replay` feeds it to :class:`~frenzy_opt.prediction.marp.allocator.model.CachingAllocatorModel` and
returns the statistics the real allocator would report.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from frenzy_opt.prediction.marp.allocator.config import AllocatorConfig
from frenzy_opt.prediction.marp.allocator.model import AllocatorStats, CachingAllocatorModel

__all__ = ["MemEvent", "replay"]

_PYTORCH_DEFAULTS = AllocatorConfig()


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


def replay(
    events: Iterable[MemEvent],
    config: AllocatorConfig = _PYTORCH_DEFAULTS,
    *,
    capacity_bytes: int | None = None,
    raise_on_oom: bool = False,
) -> AllocatorStats:
    """Replay an allocation trace through :class:`CachingAllocatorModel` and return its statistics.

    ``capacity_bytes`` is the memory the allocator may obtain from CUDA (free device memory, or the
    ``set_per_process_memory_fraction`` limit); without it segments are never refused. An allocation that
    does not fit even after the cache is freed is counted in ``num_ooms`` (its later free is ignored), or
    raises :class:`~frenzy_opt.prediction.marp.allocator.model.AllocatorOutOfMemoryError` with ``raise_on_oom``.
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
