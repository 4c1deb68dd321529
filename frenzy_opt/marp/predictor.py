"""MARP: per-stage peak memory of one training step, as named components and three totals.

For each pipeline stage the step passes through three phases whose live memory we sum from named
components (bytes, one rank):

* ``loss_backward`` (last stage): model states + every in-flight micro-batch's activations + the loss's
  kept tensors + the fp32 gradients of log-probabilities and logits;
* ``block_backward``: model states + activations + the gradients alive inside one block's backward
  (plus the block being recomputed under full recompute, gathered ZeRO-3/FSDP weights and gradients);
* ``optimizer_step``: model states + the optimizer's temporaries.

``peak_allocated_bytes`` is the largest phase (what ``torch.cuda.max_memory_allocated`` reports).
``peak_reserved_bytes`` adds the caching allocator's fragmentation and ``device_used_bytes`` the CUDA
context, the cuBLAS workspace and NCCL's buffers (what nvidia-smi shows); both CUDA-only terms can be
switched off, as the CPU validation does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from frenzy_opt.gpus import GpuType
from frenzy_opt.marp import activations as act
from frenzy_opt.marp.layout import StateLayout, state_layout
from frenzy_opt.marp.stages import StageShape, stage_shapes
from frenzy_opt.models.arch import ModelArch, layer_weight_shapes, shard_param_counts
from frenzy_opt.spec import JobSpec, ParallelConfig, TrainingConfig

MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaTerms:
    """CUDA-only memory outside tensors. Defaults are public figures, calibratable from GPU runs."""

    fragmentation: float = 0.05
    """Reserved/allocated - 1. The caching allocator rounds blocks to 2 MiB and splits them (PyTorch docs,
    "CUDA memory management"); GMLake (Guo et al., ASPLOS 2024, Fig. 2) measures 5-30 % fragmentation in LLM
    training, the low end for static-shape training without offload."""
    context_bytes: int = 500 * MIB
    """CUDA context and kernel images, created at the first CUDA call (NVIDIA CUDA C++ Programming Guide,
    "Initialization"; typically 300-600 MiB with the PyTorch kernels loaded)."""
    cublas_workspace_bytes: int = 32 * MIB
    """cuBLAS workspace: PyTorch's default ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` is 8 x 4 MiB (PyTorch docs,
    "Reproducibility")."""
    nccl_buffer_bytes: int = 4 * MIB
    """``NCCL_BUFFSIZE`` default, one buffer per channel per peer direction (NCCL docs, environment vars)."""
    nccl_channels: int = 16


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

    def to_dict(self) -> dict[str, object]:
        return {
            "stage": self.stage,
            "num_layers": self.num_layers,
            "num_params": self.num_params,
            "peak_phase": self.peak_phase,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "device_used_bytes": self.device_used_bytes,
            "breakdown": dict(self.breakdown),
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
    def fits(self) -> bool | None:
        """Whether every stage's nvidia-smi footprint fits the GPU (None without a GPU)."""
        return None if self.capacity_bytes is None else self.device_used_bytes <= self.capacity_bytes


def _stage_params(arch: ModelArch, parallel: ParallelConfig, shape: StageShape) -> tuple[int, int]:
    """(parameters on this rank, parameters of the embedding table(s) on it)."""
    counts = shard_param_counts(arch, tp=parallel.tp, ep=parallel.ep)
    total = shape.num_layers * counts.per_layer
    embedding = 0
    if shape.has_embedding:
        total += counts.embedding
        embedding = counts.embedding
    if shape.has_output:
        # A tied output layer on another stage than the embedding is a separate copy (Megatron-LM keeps
        # the word embeddings on the last stage and all-reduces their gradients with the first).
        output = counts.output if parallel.pp == 1 else counts.output_if_untied
        total += counts.final_norm + output
    return total, embedding


def _adafactor_bytes(arch: ModelArch, parallel: ParallelConfig, shape: StageShape) -> int:
    """Adafactor keeps row and column second-moment factors per matrix and a full one per vector
    (Shazeer & Stern 2018, Alg. 4), fp32."""
    per_layer = sum(sum(s) if len(s) == 2 else s[0] for s in layer_weight_shapes(arch, tp=parallel.tp, ep=parallel.ep))
    return act.FP32 * shape.num_layers * per_layer


def _num_microbatches(training: TrainingConfig, parallel: ParallelConfig) -> int:
    return max(training.global_batch_size // (training.micro_batch_size * parallel.dp), 1)


def _comm_buffers(training: TrainingConfig, parallel: ParallelConfig, layout: StateLayout, params: int, layer_params: int) -> int:
    """Communication buffers held through backward: DDP buckets (hf), DeepSpeed's ZeRO-2 reduce bucket
    (``reduce_bucket_size`` default 5e8 elements, DeepSpeed config docs), gathered FSDP/ZeRO-3 weights of
    the current and the prefetched block (FSDP2 default prefetch of one, Zhao et al. 2023, Sec. 3.3), and
    the unsharded gradients of one block before its reduce-scatter."""
    buffers = int(layout.grad_buffer_bytes * params)
    if training.runtime == "deepspeed" and parallel.zero_stage == 2:
        buffers += layout.compute_bytes * min(params, 500_000_000)
    if layout.gathered_weight_bytes:
        blocks = 2 if parallel.zero_stage >= 3 else params / max(layer_params, 1)
        buffers += int(layout.gathered_weight_bytes * layer_params * blocks)
    if layout.gathered_grad_bytes and not (training.runtime == "deepspeed" and parallel.zero_stage == 2):
        buffers += layout.gathered_grad_bytes * layer_params
    return buffers


def predict_stage(job: JobSpec, shape: StageShape, cuda: CudaTerms | None, gpu: GpuType | None) -> StagePrediction:
    arch, training, parallel = job.model, job.training, job.parallel
    layout = state_layout(training, parallel)
    params, embedding_params = _stage_params(arch, parallel, shape)
    largest = max(math.prod(s) for s in layer_weight_shapes(arch, tp=parallel.tp, ep=parallel.ep))
    layer_params = shard_param_counts(arch, tp=parallel.tp, ep=parallel.ep).per_layer
    optimizer = (
        _adafactor_bytes(arch, parallel, shape) / (parallel.dp if parallel.zero_stage >= 1 else 1)
        if training.optimizer == "adafactor"
        else layout.optimizer_bytes * params
    )
    states = {
        "weights": int(layout.weight_bytes * params),
        "grads": int(layout.grad_bytes * params),
        "master_weights": int(layout.master_bytes * params),
        "optimizer_states": int(optimizer),
        "weight_cache": int(layout.weight_cache_bytes * params),
    }
    in_flight = shape.in_flight_layer_microbatches
    activations = int(in_flight * shape.num_layers * act.layer_bytes(arch, training, parallel))
    if shape.has_embedding:
        activations += math.ceil(in_flight) * act.embedding_bytes(arch, training, parallel)
    loss = act.loss_bytes(arch, training, parallel) if shape.has_output else 0
    comm = _comm_buffers(training, parallel, layout, params, layer_params)
    block_temp = (
        act.layer_backward_transient_bytes(arch, training, parallel, layout.transient_grad_bytes * largest)
        + act.recompute_bytes(arch, training, parallel)
    )
    phases = {
        "loss_backward": {"logits_and_loss": loss + act.loss_backward_transient_bytes(arch, training, parallel)}
        if shape.has_output
        else None,
        "block_backward": {"temporaries": block_temp},
        "norm_backward": {
            "logits_and_loss": act.final_norm_bytes(arch, training, parallel) if shape.has_output else 0,
            "temporaries": act.norm_backward_transient_bytes(arch, training, parallel),
        },
        # The embedding's gradient is made last, when the blocks' activations are already freed.
        "embedding_backward": {"temporaries": layout.transient_grad_bytes * embedding_params, "no_activations": 1},
        "optimizer_step": {"temporaries": 0, "no_activations": 1},
    }
    best_phase, best, best_total = "", {}, -1
    for phase, extra in phases.items():
        if extra is None:
            continue
        parts = dict(states)
        in_backward = "no_activations" not in extra
        parts["activations"] = activations if in_backward else 0
        parts["logits_and_loss"] = extra.get("logits_and_loss", 0)
        parts["communication_buffers"] = comm if in_backward else int(layout.grad_buffer_bytes * params)
        parts["temporaries"] = extra.get("temporaries", 0)
        total = sum(parts.values())
        if total > best_total:
            best_phase, best, best_total = phase, parts, total
    reserved, used = best_total, best_total
    if cuda is not None:
        reserved = int(best_total * (1 + cuda.fragmentation))
        groups = sum(1 for degree in (parallel.dp, parallel.tp, parallel.pp, parallel.cp, parallel.ep) if degree > 1)
        channels = cuda.nccl_channels if gpu is None or gpu.intra_node == "nvlink" else 2
        nccl = groups * 2 * channels * cuda.nccl_buffer_bytes
        used = reserved + cuda.context_bytes + cuda.cublas_workspace_bytes + nccl
        best = {**best, "cuda_context": cuda.context_bytes, "cublas_workspace": cuda.cublas_workspace_bytes,
                "nccl_buffers": nccl, "allocator_reserve": reserved - best_total}
    return StagePrediction(
        stage=shape.stage,
        num_layers=shape.num_layers,
        num_params=params,
        peak_phase=best_phase,
        breakdown=best,
        peak_allocated_bytes=best_total,
        peak_reserved_bytes=reserved,
        device_used_bytes=used,
    )


def predict_memory(job: JobSpec, gpu: GpuType | None = None, *, cuda: CudaTerms | None = CudaTerms()) -> MemoryPrediction:
    """Per-stage peak memory of ``job`` at its parallel config, on ``gpu`` if given (for capacity/fit).

    ``cuda=None`` switches the CUDA-only terms off (reserved = used = allocated), as on the CPU.
    """
    p, t = job.parallel, job.training
    shapes = stage_shapes(job.model.num_layers, p.pp, p.vpp, _num_microbatches(t, p))
    stages = tuple(predict_stage(job, shape, cuda, gpu) for shape in shapes)
    return MemoryPrediction(
        stages=stages,
        capacity_bytes=gpu.memory_bytes if gpu is not None else None,
        gpu_type=gpu.name if gpu is not None else None,
        parallel=p,
    )
