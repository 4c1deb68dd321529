"""MARP's upper bound, built of parts: what is certain stays exact, what is not gets its own margin.

One pipeline rank's bound is a sum of named rows (bytes), each shown by ``frenzy predict``:

* ``states``: weights, gradients, master weights, optimizer states and fp8 weight caches. They follow from
  the layout alone (:mod:`frenzy_opt.prediction.marp.layout`), so they carry **no margin**.
* ``activations``: everything else the peak phase holds in tensors (activations of the in-flight
  micro-batches, logits and loss, communication buffers, temporaries), as predicted.
* ``activation_margin``: ``a x activations + F``, the fitted proportional and fixed margins of the job's
  runtime (:class:`frenzy_opt.prediction.marp.fit.MemoryFit`; the least ``(a, F)`` under which every
  calibration row that measured ``max_allocated`` stays within ``states + activations + library_workspaces
  + margin``, cross-validated leaving one source out; a runtime without such rows takes the largest).
* ``library_workspaces``: the GEMM workspaces that the libraries take from PyTorch's caching allocator and
  keep for the process's life, so they count in ``max_memory_allocated``: PyTorch's cuBLAS workspace and,
  under Megatron-core, Transformer Engine's (:func:`library_workspace_bytes`).
* ``allocator_reserve``: what the caching allocator must hold beyond the live blocks. It is **not a
  constant**: :func:`stage_events` writes the rank's step as an allocation trace (states, then two steps
  of forward activations, the peak phase's temporaries, the backward that frees them) at the bounded sizes,
  and :func:`frenzy_opt.prediction.marp.allocator.replay.replay` runs it through the model of PyTorch's caching
  allocator; the reserve is its peak reserved minus its peak allocated.
* ``cuda_context`` and ``nccl_buffers``: device memory outside the allocator, seen by nvidia-smi: the CUDA
  context (fitted per GPU architecture) and NCCL's buffers, one set per communicator the layout creates
  (:func:`communicators`).

``required`` (the sum of all the above) is what must fit: the planner admits a plan when ``required`` plus
the headroom fits the GPU. What a run *shows* can be more: a caching allocator keeps freed segments for
reuse and only returns them when a ``cudaMalloc`` fails (``release_cached_blocks``, then a retry:
:mod:`frenzy_opt.prediction.marp.allocator`), so ``max_memory_reserved`` and nvidia-smi may grow into
memory the job does not need. ``cached_reserve`` (the fitted ``cached_fraction`` of the bounded allocated
peak) bounds that part for the ``max_reserved`` and nvidia-smi bounds; it never decides admission.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.core.spec import ParallelConfig
from frenzy_opt.prediction.marp.allocator.model import CachingAllocatorModel
from frenzy_opt.prediction.marp.allocator.replay import MemEvent

MIB = 2**20

# --- library workspaces (in max_memory_allocated) --------------------------------------------------------

LARGE_WORKSPACE_ARCHITECTURES = frozenset({"hopper", "blackwell"})
"""Architectures (compute capability 9.x and 10.x) for which PyTorch and Transformer Engine size their GEMM
workspaces at 32 MiB."""
TORCH_CUBLAS_WORKSPACE = {True: 32 * MIB, False: 2 * 4096 * 1024 + 8 * 16 * 1024}
"""PyTorch's default cuBLAS workspace per (handle, stream): ``CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8``
(2 x 4 MiB + 8 x 16 KiB), 32 MiB on Hopper and Blackwell (``aten/src/ATen/cuda/CublasHandlePool.cpp``,
``parseChosenWorkspaceSize``), allocated through the caching allocator (``getNewWorkspace``)."""
TE_WORKSPACE = {True: 33_554_432, False: 4_194_304}
"""Transformer Engine's cuBLASLt workspace: 32 MiB on compute capability >= 9, 4 MiB otherwise
(``transformer_engine/pytorch/module/base.py``, ``get_cublas_workspace_size_bytes``), a ``torch.empty``
kept for the process's life."""


def library_workspace_bytes(runtime: str, architecture: str | None) -> int:
    """GEMM workspaces in the allocator: PyTorch's cuBLAS workspace on the compute stream, plus Transformer
    Engine's under Megatron-core. An unknown architecture takes the larger (Hopper) sizes."""
    large = architecture is None or architecture in LARGE_WORKSPACE_ARCHITECTURES
    total = TORCH_CUBLAS_WORKSPACE[large]
    if profile(runtime).transformer_engine_workspace:
        total += TE_WORKSPACE[large]
    return total


# --- NCCL buffers (outside the allocator) ------------------------------------------------------------------

NCCL_BUFFSIZE = 4 * MIB
"""``NCCL_BUFFSIZE`` default: 4 MiB per channel and peer for the Simple protocol (NCCL docs, "Environment
Variables")."""
NCCL_CHANNELS = {"nvlink": 16, "pcie": 2}
"""Channels NCCL opens per communicator: up to 16 on NVLink nodes (``NCCL_MAX_NCHANNELS``' usual reach on
DGX-class systems), 2 on PCIe-only nodes (NCCL docs, "Environment Variables": ``NCCL_MIN_NCHANNELS`` /
``NCCL_MAX_NCHANNELS``)."""


def communicators(runtime: str, parallel: ParallelConfig) -> tuple[int, ...]:
    """Sizes of the NCCL communicators one rank joins (those of size 1 make no NCCL buffers).

    Megatron-core (``megatron/core/parallel_state.py``): tensor, pipeline, data, context, the data x context
    group its distributed optimizer and gradient reduction use, the model-parallel (tp x pp) group of the
    gradient norm, the embedding group (first and last stage) when pp > 1, and the expert groups under MoE.
    torchtitan (``ParallelDims.build_mesh``): one per mesh dimension plus the flattened dp x cp mesh.
    DeepSpeed and DDP: the data-parallel group, plus tp and pp when used."""
    p, row = parallel, profile(runtime)
    sizes = [p.tp, p.pp, p.dp, p.cp]
    if row.dp_cp_communicator and p.cp > 1 and p.dp > 1:
        sizes.append(p.dp * p.cp)
    if row.model_parallel_communicators:
        sizes.append(p.tp * p.pp)
        if p.pp > 1:
            sizes.append(2)  # the embedding group: first and last stage
    if p.ep > 1:
        sizes += [p.ep, max(p.dp * p.cp // p.ep, 1)]
    return tuple(s for s in sizes if s > 1)


def nccl_buffer_bytes(runtime: str, parallel: ParallelConfig, intra_node: str | None) -> int:
    """One send and one receive buffer per channel for each communicator (:func:`communicators`)."""
    channels = NCCL_CHANNELS.get(intra_node or "nvlink", NCCL_CHANNELS["nvlink"])
    return len(communicators(runtime, parallel)) * 2 * channels * NCCL_BUFFSIZE


# --- the allocator reserve, from an allocation trace ----------------------------------------------------

MAX_SLOTS = 16
"""Most activation events per micro-batch and state tensors per copy in :func:`stage_events`: above it,
neighbouring layers are merged into one event (the sizes' mix is kept, their number is not), so a replay
stays within about a thousand events and a plan search can afford one per stage model."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepShape:
    """What :func:`stage_events` needs of one rank's step, in bytes (already bounded)."""

    state_tensors: tuple[int, ...]
    """Persistent tensors: each state copy split per layer."""
    layer_parts: tuple[int, ...]
    """One layer's saved activations of one micro-batch, as the tensors it is made of."""
    num_layers: int
    in_flight: float
    """Micro-batches' worth of the rank's activations alive at the peak."""
    peak_temporaries: tuple[int, ...]
    """The peak phase's temporaries beyond the activations (logits, loss, buffers)."""
    backward_transient: int
    """A layer's backward temporaries (incoming gradient, weight gradient) made and freed per layer."""


def split_sizes(total: int, parts: int) -> list[int]:
    """``total`` bytes as ``parts`` near-equal tensors (at most :data:`MAX_SLOTS`), the larger ones first. Built
    by list repetition: a plan search splits every stage model's states this way (:meth:`StageModel.step_shape`)."""
    parts = max(1, min(parts, MAX_SLOTS))
    base, extra = divmod(max(total, 0), parts)
    return [base + 1] * extra + [base] * (parts - extra)


def stage_events(shape: StepShape, steps: int = 2) -> list[MemEvent]:
    """The rank's allocation trace: states once, then ``steps`` steps of: the in-flight micro-batches'
    forward (each layer's parts), the peak phase's temporaries, and the backward (a transient per layer,
    the layer's activations freed), in that order. Layers beyond :data:`MAX_SLOTS` per micro-batch are
    merged into one event, which keeps the sizes' mix but not their number."""
    events: list[MemEvent] = []
    phase = [""]

    def alloc(block: int, size: int) -> None:
        events.append(MemEvent("alloc", block, size, phase[0]))

    def free(block: int) -> None:
        events.append(MemEvent("free", block, 0, phase[0]))

    def enter(name: str) -> None:
        phase[0] = name

    walk_stage(shape, steps, alloc, free, enter)
    return events


def walk_stage(
    shape: StepShape,
    steps: int,
    alloc: Callable[[int, int], object],
    free: Callable[[int], object],
    enter: Callable[[str], object],
) -> None:
    """Call ``alloc(block, size)`` and ``free(block)`` for each event of :func:`stage_events`, in its order, and
    ``enter(phase)`` before the first event of each run of one phase (as :func:`replay` calls ``set_phase``):
    the one description of the trace, which :func:`allocator_reserve_bytes` feeds to the allocator model
    without building the event list."""
    current = ""

    def phase(name: str) -> None:
        nonlocal current
        if name != current:
            current = name
            enter(name)

    block = 0
    if shape.state_tensors:
        phase("setup")
    for size in shape.state_tensors:
        block += 1
        alloc(block, size)
    whole = math.floor(shape.in_flight)
    fractions = [1.0] * whole + ([shape.in_flight - whole] if shape.in_flight > whole else [])
    merge = max(1, math.ceil(shape.num_layers / MAX_SLOTS))
    slots = math.ceil(shape.num_layers / merge)
    parts = [part * merge for part in shape.layer_parts if part > 0]
    temporaries = [size for size in shape.peak_temporaries if size > 0]
    transient = shape.backward_transient
    for _ in range(steps):
        live: list[list[int]] = []
        for fraction in fractions:
            layers = max(1, round(slots * fraction))
            for _layer in range(layers):
                blocks = []
                if parts:
                    phase("forward")
                for size in parts:
                    block += 1
                    alloc(block, size)
                    blocks.append(block)
                live.append(blocks)
        temps = []
        if temporaries:
            phase("peak")
        for size in temporaries:
            block += 1
            alloc(block, size)
            temps.append(block)
        for b in temps:
            free(b)
        for blocks in reversed(live):
            if transient > 0 or blocks:
                phase("backward")
            if transient > 0:
                block += 1
                alloc(block, transient)
            for b in blocks:
                free(b)
            if transient > 0:
                free(block)


@functools.lru_cache(maxsize=4096)
def allocator_reserve_bytes(shape: StepShape) -> int:
    """Peak reserved minus peak allocated when the caching allocator model replays :func:`stage_events`;
    the trace goes straight into the model (:func:`walk_stage`), as :func:`replay` would feed it."""
    model = CachingAllocatorModel()
    walk_stage(shape, 2, model.malloc, model.free, model.set_phase)
    stats = model.stats()
    return max(0, stats.peak_reserved_bytes - stats.peak_allocated_bytes)


REQUIRED_ROWS = (
    "states",
    "activations",
    "activation_margin",
    "library_workspaces",
    "allocator_reserve",
    "cuda_context",
    "nccl_buffers",
)
"""The rows whose sum must fit the GPU (module docstring); ``cached_reserve`` is shown after them."""


class MemoryBound:
    """One rank's bound as named rows (bytes): :data:`REQUIRED_ROWS` plus ``cached_reserve``. The totals are
    summed once (a plan search reads them many times)."""

    __slots__ = ("allocated", "device_used", "required", "reserved", "rows")

    def __init__(self, rows: dict[str, int]) -> None:
        self.rows = rows
        self.allocated = rows["states"] + rows["activations"] + rows["activation_margin"] + rows["library_workspaces"]
        """Bound on ``max_memory_allocated``."""
        outside = rows["cuda_context"] + rows["nccl_buffers"]
        self.required = self.allocated + rows["allocator_reserve"] + outside
        """What must fit the GPU: every row but the elastic cache."""
        self.reserved = self.allocated + rows["allocator_reserve"] + rows["cached_reserve"]
        """Bound on ``max_memory_reserved``."""
        self.device_used = self.reserved + outside
        """Bound on nvidia-smi's used memory."""

    def within(self, capacity: int) -> MemoryBound:
        """This bound on a GPU of ``capacity`` bytes: the elastic cache ends where the device does (the
        allocator frees it and retries before it fails), so ``cached_reserve`` is cut to the room left."""
        room = max(0, capacity - self.required)
        if self.rows["cached_reserve"] <= room:
            return self
        return MemoryBound(self.rows | {"cached_reserve": room})

    def explain(self, capacity: int | None = None) -> str:
        """ "activations 41.0 GiB + states 30.1 GiB + extras 2.3 GiB > 79.6 GiB": the required rows, grouped
        into what the model states, the activations (with their margin) and the rest take."""
        gib = 2**30
        r = self.rows
        acts = r["activations"] + r["activation_margin"]
        extras = self.required - acts - r["states"]
        text = (
            f"activations {acts / gib:.1f} GiB (margin {r['activation_margin'] / gib:.1f}) + states "
            f"{r['states'] / gib:.1f} GiB + extras {extras / gib:.1f} GiB"
        )
        if capacity is not None:
            text += f" {'>' if self.required > capacity else '<='} {capacity / gib:.1f} GiB"
        return text
