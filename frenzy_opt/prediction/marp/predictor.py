"""MARP: per-stage peak memory of one training step, as named components and three totals.

For each pipeline stage the step passes through three phases whose live memory we sum from named
components (bytes, one rank):

* ``loss_backward`` (last stage): model states + every in-flight micro-batch's activations + the loss's
  kept tensors + the fp32 gradients of log-probabilities and logits;
* ``block_backward``: model states + activations + the gradients alive inside one block's backward
  (plus the block being recomputed under full recompute, gathered ZeRO-3/FSDP weights and gradients);
* ``optimizer_step``: model states + the optimizer's temporaries.

``peak_allocated_bytes`` is the largest phase plus the GEMM libraries' workspaces (what
``torch.cuda.max_memory_allocated`` reports). ``peak_reserved_bytes`` adds the caching allocator's
fitted fragmentation and ``device_used_bytes`` the CUDA context and NCCL's buffers per communicator (what
nvidia-smi shows); the CUDA-only terms can be switched off, as the CPU validation does. The upper bound
that admission uses is built of parts in :mod:`frenzy_opt.prediction.marp.bound`
(:func:`frenzy_opt.prediction.marp.cuda.stage_bound`). The phases are built in
:mod:`frenzy_opt.prediction.marp.phases`, the dp-independent stage model in
:mod:`frenzy_opt.prediction.marp.stage_model`, the CUDA-only terms in :mod:`frenzy_opt.prediction.marp.cuda`;
this module assembles the public prediction.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from frenzy_opt.core.spec import JobSpec, ParallelConfig
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.prediction.marp.cuda import (
    DEFAULT_CUDA,
    CudaTerms,
    cuda_totals,
    nccl_bytes,
    stage_bound,
    workspace_bytes,
)
from frenzy_opt.prediction.marp.fit import SHIPPED_FIT, MemoryFit
from frenzy_opt.prediction.marp.stage_model import layer_counts, stage_model


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePrediction:
    stage: int
    num_layers: int
    num_params: int
    peak_phase: str
    breakdown: dict[str, int]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int
    peak_allocated_upper_bytes: int = 0
    peak_reserved_upper_bytes: int = 0
    device_used_upper_bytes: int = 0
    """Upper bounds of the three totals (:class:`bound.MemoryBound`), from the fitted margins
    (:mod:`frenzy_opt.prediction.marp.fit`; ``frenzy validate memory`` cross-validates them)."""
    required_upper_bytes: int = 0
    """What must fit the GPU (:attr:`bound.MemoryBound.required`): the planner's test."""
    bound: dict[str, int] = field(default_factory=dict)
    """The bound's named rows (:data:`bound.REQUIRED_ROWS` and ``cached_reserve``)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "stage": self.stage,
            "num_layers": self.num_layers,
            "num_params": self.num_params,
            "peak_phase": self.peak_phase,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "device_used_bytes": self.device_used_bytes,
            "peak_allocated_upper_bytes": self.peak_allocated_upper_bytes,
            "peak_reserved_upper_bytes": self.peak_reserved_upper_bytes,
            "device_used_upper_bytes": self.device_used_upper_bytes,
            "required_upper_bytes": self.required_upper_bytes,
            "breakdown": dict(self.breakdown),
            "bound": dict(self.bound),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPrediction:
    stages: tuple[StagePrediction, ...]
    capacity_bytes: int | None = None
    gpu_type: str | None = None
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    @property
    def peak_allocated_bytes(self) -> int:
        return max(s.peak_allocated_bytes for s in self.stages)

    @property
    def peak_reserved_bytes(self) -> int:
        return max(s.peak_reserved_bytes for s in self.stages)

    @property
    def device_used_bytes(self) -> int:
        return max(s.device_used_bytes for s in self.stages)

    @property
    def peak_allocated_upper_bytes(self) -> int:
        return max(s.peak_allocated_upper_bytes for s in self.stages)

    @property
    def peak_reserved_upper_bytes(self) -> int:
        return max(s.peak_reserved_upper_bytes for s in self.stages)

    @property
    def device_used_upper_bytes(self) -> int:
        return max(s.device_used_upper_bytes for s in self.stages)

    @property
    def required_upper_bytes(self) -> int:
        return max(s.required_upper_bytes for s in self.stages)

    @property
    def fits(self) -> bool | None:
        """Whether every stage's nvidia-smi footprint fits the GPU (None without a GPU)."""
        return None if self.capacity_bytes is None else self.device_used_bytes <= self.capacity_bytes

    @property
    def fits_upper(self) -> bool | None:
        """Whether every stage's required bound fits the GPU (the planner's test, without headroom)."""
        return None if self.capacity_bytes is None else self.required_upper_bytes <= self.capacity_bytes


def predict_stage(
    job: JobSpec,
    stage: int,
    cuda: CudaTerms | None,
    gpu: GpuType | None,
    fit: MemoryFit = SHIPPED_FIT,
    architecture: str | None = None,
) -> StagePrediction:
    """One stage's peak and its named breakdown (see the module docstring for the phases), and its bound."""
    model = stage_model(job, stage)
    dp = job.parallel.dp
    phase, _ = model.peak_phase(dp)
    breakdown = {
        **model.states(dp),
        "activations": model.activations(dp) if phase.holds_activations else 0,
        "logits_and_loss": phase.logits_and_loss,
        "communication_buffers": phase.communication_buffers,
        "temporaries": phase.temporaries,
    }
    workspaces = workspace_bytes(job, cuda, gpu.architecture if gpu is not None else architecture)
    if cuda is not None:
        breakdown["library_workspaces"] = workspaces
    allocated = sum(breakdown.values())
    nccl = nccl_bytes(job, cuda, gpu) if cuda is not None else 0
    outside = cuda.context_bytes + nccl if cuda is not None else 0
    reserved, used = cuda_totals(allocated, cuda, outside, gpu.memory_bytes if gpu is not None else None)
    if cuda is not None:
        breakdown |= {
            "allocator_reserve": reserved - allocated,
            "cuda_context": cuda.context_bytes,
            "nccl_buffers": nccl,
        }
    upper = stage_bound(model, dp, job.training.runtime, fit, cuda=cuda, workspaces=workspaces, nccl=nccl)
    if gpu is not None:
        upper = upper.within(gpu.memory_bytes)
    return StagePrediction(
        stage=stage,
        num_layers=model.num_layers,
        num_params=model.params.params,
        peak_phase=phase.name,
        breakdown=breakdown,
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        device_used_bytes=used,
        peak_allocated_upper_bytes=upper.allocated,
        peak_reserved_upper_bytes=upper.reserved,
        device_used_upper_bytes=upper.device_used,
        required_upper_bytes=upper.required,
        bound=dict(upper.rows),
    )


@functools.lru_cache(maxsize=4096)
def peak_stages(pp: int, counts: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The stages that can hold the peak: the first (most in-flight micro-batches, the embedding), the last
    (output layer and loss) and, when a split gives a middle stage more layers than the first
    (``counts``: layers per chunk, :func:`layer_counts`), the middle stage with the most layers (it holds
    fewer in-flight micro-batches and neither table, so only more layers can make it the peak)."""
    if pp == 1:
        return (0,)
    stages = [0, pp - 1]
    if counts is not None and pp > 2:
        per_rank = [sum(counts[r::pp]) for r in range(pp)]
        middle = max(range(1, pp - 1), key=lambda r: per_rank[r])
        if per_rank[middle] > per_rank[0]:
            stages.insert(1, middle)
    return tuple(stages)


def predict_peak(
    job: JobSpec,
    gpu: GpuType | None = None,
    *,
    cuda: CudaTerms | None = DEFAULT_CUDA,
    fit: MemoryFit = SHIPPED_FIT,
    architecture: str | None = None,
) -> MemoryPrediction:
    """Like :func:`predict_memory` but only for the stages of :func:`peak_stages`."""
    counts = layer_counts(job.model, job.training, job.parallel)
    return _prediction(job, gpu, cuda, list(peak_stages(job.parallel.pp, counts)), fit, architecture)


def predict_memory(
    job: JobSpec,
    gpu: GpuType | None = None,
    *,
    cuda: CudaTerms | None = DEFAULT_CUDA,
    fit: MemoryFit = SHIPPED_FIT,
    architecture: str | None = None,
) -> MemoryPrediction:
    """Per-stage peak memory of ``job`` at its parallel config, on ``gpu`` if given (for capacity/fit).

    ``cuda=None`` switches the CUDA-only terms off (reserved = used = allocated), as on the CPU.
    ``fit`` gives the bound's margins; ``architecture`` sizes the library workspaces when no ``gpu`` is given
    (an unknown one takes Hopper's).
    """
    return _prediction(job, gpu, cuda, list(range(job.parallel.pp)), fit, architecture)


def _prediction(
    job: JobSpec,
    gpu: GpuType | None,
    cuda: CudaTerms | None,
    stages: list[int],
    fit: MemoryFit,
    architecture: str | None,
) -> MemoryPrediction:
    layer_counts(job.model, job.training, job.parallel)  # validates pp x vpp and the split
    return MemoryPrediction(
        stages=tuple(predict_stage(job, stage, cuda, gpu, fit, architecture) for stage in stages),
        capacity_bytes=gpu.memory_bytes if gpu is not None else None,
        gpu_type=gpu.name if gpu is not None else None,
        parallel=job.parallel,
    )
