"""The allocation recorder: every tensor-storage allocation and free of a step, in program order.

:class:`AllocationRecorder` is a ``TorchDispatchMode``: it sees the outputs of every aten op run inside it
(under ``FakeTensorMode`` too, where nothing is allocated) and tracks their *untyped storages*, not the
tensor views: a storage seen for the first time is an ``alloc`` of its ``nbytes``, and a weak-reference
callback on the storage object emits the ``free`` when the storage dies (CPython frees storages by
reference counting, so the callback runs at the point of the program where the last tensor on it goes).
``UntypedStorage.resize_`` (FSDP2's unsharded parameters, Megatron's ``deallocate_output_tensor``) is
patched while recording, so a resize is a ``free`` of the old size followed by an ``alloc`` of the new one
(resizing to 0 is a plain free). This is how ``torch.distributed._tools.mem_tracker.MemTracker`` tracks
memory, without its module categories, but with the event list an allocator replay needs.

Ops that DTensor desugars are seen after the desugaring (``NotImplemented`` for DTensor arguments), so
their local shards are what is counted; FakeTensorMode's own nested propagation modes are skipped.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from frenzy_opt.prediction.marp.allocator.replay import MemEvent

PHASES = ("setup", "forward", "backward", "optimizer")


def base_phase(phase: str) -> str:
    """``"forward"`` of ``"forward:3"`` (a phase with its pipeline micro-batch)."""
    return phase.split(":", 1)[0]


def _active_fake_mode() -> FakeTensorMode | None:
    from torch._guards import detect_fake_mode

    return detect_fake_mode()


@dataclass(slots=True)
class Trace:
    """The events of one recording and the statistics of the live bytes they imply."""

    events: list[MemEvent] = field(default_factory=list)
    peak_bytes: int = 0
    peak_phase: str = ""
    """The phase (with its micro-batch, e.g. ``"backward:1"``) of the event that reached the peak."""
    phase_peaks: dict[str, int] = field(default_factory=dict)
    """The largest live bytes in each base phase (``"setup"``, ``"forward"``, ...)."""
    setup_bytes: int = 0
    """Live bytes when setup ended (the model states: weights, gradient buffers, optimizer states)."""
    end_bytes: int = 0
    """Live bytes when the recording stopped."""
    peak_live: dict[int, int] = field(default_factory=dict)
    """The live blocks (block -> bytes) at the peak."""
    block_phase: dict[int, str] = field(default_factory=dict)
    """The phase each block was allocated in."""

    @classmethod
    def from_events(cls, events: list[MemEvent], *, setup_end: int | None = None) -> Trace:
        """Replay ``events``: the peak and its phase, per-phase peaks, live bytes after event ``setup_end``."""
        trace = cls(events=list(events))
        live: dict[int, int] = {}
        current = 0
        for index, event in enumerate(events):
            if event.action == "alloc":
                live[event.block] = event.size
                trace.block_phase[event.block] = event.phase
                current += event.size
            else:
                current -= live.pop(event.block, 0)
            base = base_phase(event.phase)
            if current > trace.phase_peaks.get(base, -1):
                trace.phase_peaks[base] = current
            if current > trace.peak_bytes:
                trace.peak_bytes, trace.peak_phase = current, event.phase
                trace.peak_live = dict(live)
            if index + 1 == setup_end:
                trace.setup_bytes = current
        if setup_end is not None and setup_end >= len(events):
            trace.setup_bytes = current
        trace.end_bytes = current
        return trace

    def peak_by_phase_of_allocation(self) -> dict[str, int]:
        """The bytes alive at the peak grouped by the base phase they were allocated in."""
        out: dict[str, int] = {}
        for block, size in self.peak_live.items():
            key = base_phase(self.block_phase.get(block, ""))
            out[key] = out.get(key, 0) + size
        return out


class AllocationRecorder(TorchDispatchMode):  # type: ignore[misc]
    """Record tensor-storage allocations and frees while active (see the module docstring).

    ``phase`` is the label given to the events from now on; :meth:`set_phase` changes it and
    :meth:`mark_setup_end` records the live bytes of the model states. Storages that already exist when
    the recorder starts are not known to it: start it before the model is built. ``track(tensor)``
    registers a tensor made outside any op (e.g. by ``torch.Tensor._make_subclass``) explicitly.
    """

    def __init__(self, phase: str = "setup") -> None:
        super().__init__()
        self.phase = phase
        self.events: list[MemEvent] = []
        self._blocks: weakref.WeakKeyDictionary[torch.UntypedStorage, tuple[int, int]] = weakref.WeakKeyDictionary()
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._next_block = 0
        self._setup_end: int | None = None
        self._fake_on_entry: FakeTensorMode | None = None
        self._orig_resize: Any = None
        self._depth = 0
        self._suspended = 0
        self._orig_propagate: Any = None
        self._block_size: dict[int, int] = {}
        self.live_bytes = 0

    # -- phases -------------------------------------------------------------------------------------
    def set_phase(self, phase: str) -> None:
        self.phase = phase

    @contextlib.contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous

    def mark_setup_end(self) -> None:
        gc.collect()
        self._setup_end = len(self.events)

    # -- tracking -----------------------------------------------------------------------------------
    def _finalized(self, block: int, _ref: object) -> None:
        self._on_free(block)

    def _on_free(self, block: int) -> None:
        if self._refs.pop(block, None) is not None:
            self._free_block(block)

    def _free_block(self, block: int) -> None:
        size = self._block_size.pop(block, 0)
        if size:
            self.events.append(MemEvent(action="free", block=block, size=size, phase=self.phase))
            self.live_bytes -= size

    def track(self, t: torch.Tensor) -> None:
        """Register the storages of ``t`` (a no-op for storages already known). Meta-device tensors (a model
        built on ``torch.device("meta")`` before ``to_empty``) hold no memory and are not tracked."""
        if t.device.type == "meta":
            return
        for st in get_untyped_storages(t):
            entry = self._blocks.get(st)
            if entry is None:
                self._new(st)
            elif entry[1] != st.nbytes():
                self._resized(st)

    def _new(self, st: torch.UntypedStorage) -> None:
        size = int(st.nbytes())
        block = self._next_block
        self._next_block += 1
        self._blocks[st] = (block, size)
        self._block_size[block] = size
        self._refs[block] = weakref.ref(st, functools.partial(self._finalized, block))
        if size:
            self.events.append(MemEvent(action="alloc", block=block, size=size, phase=self.phase))
            self.live_bytes += size

    def _resized(self, st: torch.UntypedStorage) -> None:
        """A known storage whose size changed: free the old block, allocate a new one (same storage)."""
        entry = self._blocks.get(st)
        if entry is None:
            self._new(st)
            return
        old_block, _ = entry
        self._refs.pop(old_block, None)
        self._free_block(old_block)
        self._new(st)

    def __enter__(self) -> AllocationRecorder:
        if self._depth == 0:
            self._fake_on_entry = _active_fake_mode()
            self._orig_resize = torch.UntypedStorage.resize_
            recorder = self
            orig = self._orig_resize

            def resize_(st: torch.UntypedStorage, size: int) -> Any:
                out = orig(st, size)
                ours = _active_fake_mode() is recorder._fake_on_entry or st in recorder._blocks
                if not recorder._suspended and ours:
                    recorder._resized(st)
                return out

            torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
            # DTensor's sharding propagation runs each op once more on fake tensors of the *global* shapes
            # (in the active fake mode, which is ours): those are metadata, never allocated on a device.
            from torch.distributed.tensor._sharding_prop import ShardingPropagator

            self._orig_propagate = ShardingPropagator._propagate_tensor_meta_non_cached
            propagate = self._orig_propagate

            def propagate_meta(prop: Any, *args: Any, **kwargs: Any) -> Any:
                recorder._suspended += 1
                try:
                    return propagate(prop, *args, **kwargs)
                finally:
                    recorder._suspended -= 1

            ShardingPropagator._propagate_tensor_meta_non_cached = propagate_meta  # type: ignore[method-assign]
        self._depth += 1
        super().__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        super().__exit__(*args)
        self._depth -= 1
        if self._depth == 0:
            torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
            from torch.distributed.tensor._sharding_prop import ShardingPropagator

            ShardingPropagator._propagate_tensor_meta_non_cached = self._orig_propagate  # type: ignore[method-assign]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if any(t is DTensor or (isinstance(t, type) and issubclass(t, DTensor)) for t in types):
            return NotImplemented
        if func is torch.ops._c10d_functional.wait_tensor.default and _active_fake_mode() is not None:
            # The fake kernel of wait_tensor returns a new tensor; eagerly it returns its input.
            res = args[0]
        else:
            res = func(*args, **(kwargs or {}))
        if not self._suspended and _active_fake_mode() is self._fake_on_entry:
            tree_map_only(torch.Tensor, self.track, res)
        return res

    # -- result -------------------------------------------------------------------------------------
    def trace(self) -> Trace:
        """The :class:`Trace` of the events so far (live bytes replayed from the events)."""
        return Trace.from_events(self.events, setup_end=self._setup_end)
