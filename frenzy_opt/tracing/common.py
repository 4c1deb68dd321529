"""What both runtimes' tracers share: the result types, fake process groups, phase hooks, micro-batch counts."""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from frenzy_opt.core.partition import chunk_layer_counts
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.tracing.recorder import AllocationRecorder, Trace


@dataclass(slots=True, kw_only=True)
class StageTrace:
    """One pipeline stage's rank (dp/tp/cp/ep rank 0): its peak and the events that led to it."""

    stage: int
    rank: int
    world_size: int
    peak_allocated_bytes: int
    peak_phase: str
    model_state_bytes: int
    """Live bytes after the last optimizer step (weights, gradients/grad buffers, master weights, optimizer
    states, and whatever else a runtime keeps between steps)."""
    setup_bytes: int
    """Live bytes when setup ended (model built, parallelized, optimizer built; lazily made optimizer
    states not yet there)."""
    phase_peaks: dict[str, int]
    components: dict[str, int]
    """The live bytes at the peak split by where they were made (see :func:`peak_components`)."""
    microbatches: int
    """Micro-batches per step that were run (capped: see ``trace_job``)."""
    in_flight: int
    """Micro-batches whose activations a 1F1B stage holds at once."""
    notes: list[str] = field(default_factory=list)
    trace: Trace | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "rank": self.rank,
            "world_size": self.world_size,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_phase": self.peak_phase,
            "model_state_bytes": self.model_state_bytes,
            "setup_bytes": self.setup_bytes,
            "phase_peaks": dict(self.phase_peaks),
            "components": dict(self.components),
            "microbatches": self.microbatches,
            "in_flight": self.in_flight,
            "notes": list(self.notes),
        }


@dataclass(slots=True, kw_only=True)
class TraceResult:
    """The trace path's answer for one job: one :class:`StageTrace` per traced pipeline stage."""

    job_name: str
    runtime: str
    stages: tuple[StageTrace, ...]

    @property
    def peak_allocated_bytes(self) -> int:
        return max(s.peak_allocated_bytes for s in self.stages)

    def stage(self, index: int) -> StageTrace:
        for s in self.stages:
            if s.stage == index:
                return s
        raise KeyError(index)

    def to_dict(self) -> dict[str, Any]:
        """Everything but the event lists."""
        return {
            "job": self.job_name,
            "runtime": self.runtime,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "stages": [s.to_dict() for s in self.stages],
        }


def peak_components(trace: Trace, state_blocks: set[int], comm_blocks: set[int] | None = None) -> dict[str, int]:
    """The peak's live bytes as ``model_states`` (blocks alive at the end of the last step that were made
    in setup or an optimizer step), ``communication_buffers`` (blocks the tracer marked), and the rest by the
    phase they were made in (``forward`` = activations and loss, ``backward`` = gradients and temporaries)."""
    comm_blocks = comm_blocks or set()
    out = {"model_states": 0, "communication_buffers": 0, "forward": 0, "backward": 0, "other": 0}
    for block, size in trace.peak_live.items():
        if block in comm_blocks:
            out["communication_buffers"] += size
        elif block in state_blocks:
            out["model_states"] += size
        else:
            phase = trace.block_phase.get(block, "").split(":", 1)[0]
            out[phase if phase in ("forward", "backward") else "other"] += size
    return out


def stage_trace(
    trace: Trace,
    job: JobSpec,
    *,
    stage: int,
    rank: int,
    world_size: int,
    microbatches: int,
    total_microbatches: int,
    notes: list[str] | None = None,
) -> StageTrace:
    """The :class:`StageTrace` of one traced rank (both runtimes' tracers end with it)."""
    ran = [f"ran {microbatches} of {total_microbatches} micro-batches per step"]
    return StageTrace(
        stage=stage,
        rank=rank,
        world_size=world_size,
        peak_allocated_bytes=trace.peak_bytes,
        peak_phase=trace.peak_phase,
        model_state_bytes=trace.end_bytes,
        setup_bytes=trace.setup_bytes,
        phase_peaks=dict(trace.phase_peaks),
        components=peak_components(trace, live_blocks_at_end(trace)),
        microbatches=microbatches,
        in_flight=in_flight(job, stage, microbatches) if job.parallel.pp > 1 else 1,
        notes=(notes or []) + (ran if microbatches < total_microbatches else []),
        trace=trace,
    )


def live_blocks_at_end(trace: Trace) -> set[int]:
    live: set[int] = set()
    for event in trace.events:
        if event.action == "alloc":
            live.add(event.block)
        else:
            live.discard(event.block)
    return live


@contextlib.contextmanager
def fake_process_group(rank: int, world_size: int) -> Iterator[None]:
    """``torch.distributed`` on the "fake" backend: collectives return at once, shapes stay right."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    original = dist.all_gather_object

    def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
        # Object collectives pickle through real tensors, which fake tensor mode cannot read: every rank
        # of a traced layout has the same structure, so each peer "sends" this rank's object.
        object_list[:] = [obj] * len(object_list)

    dist.all_gather_object = all_gather_object
    try:
        yield
    finally:
        dist.all_gather_object = original
        dist.destroy_process_group()
        gc.collect()


@contextlib.contextmanager
def phase_hooks(recorder: AllocationRecorder) -> Iterator[Callable[[str], None]]:
    """Label events: ``torch.autograd.backward`` calls start ``backward:<i>``, optimizer steps start
    ``optimizer``. Returns the setter the tracer uses for ``forward:<i>``."""
    original_backward = torch.autograd.backward

    def backward(*args: Any, **kwargs: Any) -> Any:
        # The backward of the micro-batch whose forward ran last (a pipeline tracer sets "backward:<i>"
        # itself before its backward calls; chunked losses call backward once per chunk).
        if not recorder.phase.startswith("backward"):
            _, _, mb = recorder.phase.partition(":")
            recorder.set_phase(f"backward:{mb or 0}")
        return original_backward(*args, **kwargs)

    def pre_step(*_: Any) -> None:
        recorder.set_phase("optimizer")

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(pre_step)
    torch.autograd.backward = backward  # type: ignore[assignment]
    try:
        yield recorder.set_phase
    finally:
        torch.autograd.backward = original_backward
        handle.remove()


def step_microbatches(job: JobSpec, cap: int | None) -> tuple[int, int]:
    """(micro-batches per step on one data-parallel rank, the number run): the peak of a step repeats after
    the first micro-batch of a non-pipelined step and after 1F1B's warm-up, so ``cap`` (default pp + 1)
    bounds the run without changing the peak."""
    t, p = job.training, job.parallel
    total = t.num_micro_batches(p.dp)
    limit = cap if cap is not None else p.pp + 1
    return total, max(1, min(total, max(limit, 2 if total >= 2 else 1)))


def stage_layers(job: JobSpec, stage: int) -> tuple[int, int]:
    """(first layer, number of layers) of pipeline stage ``stage`` (MARP's split: remainder to the first)."""
    counts = chunk_layer_counts(job.model.num_layers, job.parallel.pp, 1)
    return sum(counts[:stage]), counts[stage]


def in_flight(job: JobSpec, stage: int, microbatches: int) -> int:
    return max(1, min(job.parallel.pp - stage, microbatches))


def one_f_one_b(pp: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    """The order of 1F1B (PipeDream-Flush) on ``stage``: warm-up forwards, steady 1F1B, cool-down backwards."""
    warmup = min(pp - stage - 1, microbatches)
    order: list[tuple[str, int]] = [("F", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(microbatches - warmup, microbatches)]
    return order


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)


class FakeScalars(TorchDispatchMode):  # type: ignore[misc]
    """Answer ``Tensor.item()`` on fake tensors (``aten._local_scalar_dense``), which FakeTensorMode
    refuses (data-dependent): 1 for integer and bool tensors, 1.0 for floating ones. The runtimes read such
    scalars only for logging and token counts (torchtitan's ``int(local_valid_tokens)``, Megatron's
    loss reporting), never to choose shapes."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten._local_scalar_dense.default:
            t = args[0]
            if t.dtype.is_floating_point or t.dtype.is_complex:
                return 1.0
            return True if t.dtype == torch.bool else 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def real_device_meshes() -> Iterator[None]:
    """Build ``DeviceMesh`` objects (host-side rank tables) from real tensors even inside FakeTensorMode:
    FSDP2 concatenates meshes lazily (``_init_sharding_spec_tp``), and a fake rank table cannot be read."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        with unset_fake_temporarily():
            original(self, *args, **kwargs)

    DeviceMesh.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        DeviceMesh.__init__ = original  # type: ignore[method-assign]


class _FusedRMSNorm(torch.autograd.Function):  # type: ignore[misc]
    """RMSNorm keeping what a fused kernel keeps for backward (apex/TE ``FusedRMSNorm``, torch's CUDA
    ``_fused_rms_norm``): the input and the fp32 reciprocal RMS. On the CPU ``F.rms_norm`` decomposes into
    ``x.float()``, ``x²``, ``x·rstd`` and ``·weight`` and autograd keeps those intermediates."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, eps: float, ndim: int) -> torch.Tensor:
        dims = tuple(range(x.dim() - ndim, x.dim()))
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)
        y = xf * rstd
        if weight is not None:
            y = y * weight.float()
        ctx.save_for_backward(x, weight, rstd)
        ctx.dims = dims
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        x_hat = x.float() * rstd
        g = grad.float()
        grad_w = None
        if weight is not None:
            reduce = tuple(range(x.dim() - len(ctx.dims)))
            grad_w = (g * x_hat).sum(reduce).to(weight.dtype)
            g = g * weight.float()
        grad_x = rstd * (g - x_hat * (g * x_hat).mean(ctx.dims, keepdim=True))
        return grad_x.to(x.dtype), grad_w, None, None


@contextlib.contextmanager
def fused_rms_norm() -> Iterator[None]:
    """``torch.nn.functional.rms_norm`` (what ``torch.nn.RMSNorm`` calls) as a fused kernel saves it."""
    import torch.nn.functional as F

    original = F.rms_norm

    def rms_norm(x: torch.Tensor, normalized_shape: Any, weight: torch.Tensor | None = None,
                 eps: float | None = None) -> torch.Tensor:  # fmt: skip
        ndim = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
        if eps is None:
            eps = torch.finfo(x.dtype).eps
        return _FusedRMSNorm.apply(x, weight, eps, ndim)  # type: ignore[no-any-return]

    F.rms_norm = rms_norm  # type: ignore[assignment]
    try:
        yield
    finally:
        F.rms_norm = original
