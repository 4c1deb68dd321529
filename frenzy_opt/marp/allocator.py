"""A model of PyTorch's CUDA caching allocator, replaying an allocation trace (work in progress).

The trace format is shared by the trace path (:mod:`frenzy_opt.marp.trace`) and the allocator model.
"""

from __future__ import annotations

from dataclasses import dataclass


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
