"""Measure the peak memory of real training steps of the reference decoder on the CPU.

The harness builds the slice of the reference decoder that one rank holds for a job's parallel config
(tensor-parallel widths, the pipeline stage's layers, local experts), gives it the model-state copies its
runtime keeps, and runs real training steps: forward, backward and the optimizer step, with 1F1B's
in-flight micro-batches on pipeline stages. Under ``FakeTensorMode`` no memory is allocated, so models of
billions of parameters are measured in seconds; ``fake=False`` executes for real as a cross-check on small
models. ``torch.distributed._tools.mem_tracker.MemTracker`` records the peak of the tensor storages alive,
which is what ``torch.cuda.max_memory_allocated`` reports on a GPU less the caching allocator's rounding.

Runtime emulated: ``megatron`` (16-bit weights, one flat fp32 ``main_grad`` buffer filled by
post-accumulate hooks, an fp32 master shard and fused AdamW on it, zero_stage 0 or 1; fp32 weights serve
as their own master). The other runtimes' layouts (deepspeed, fsdp2, hf) are predicted from their published
accounting and checked against published figures in the tests, not measured here. Collectives are not
run; each rank's shapes are.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from frenzy_opt.core.enums import Precision, Runtime
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.models.reference import ReferenceDecoder, ShardSpec
from frenzy_opt.prediction.marp.stages import stage_shape

HARNESS_RUNTIMES = ("megatron",)
_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """Peak tensor memory of one rank over the measured steps, in bytes, with MemTracker's categories."""

    stage: int
    peak_bytes: int
    breakdown: dict[str, int]


def check_supported(job: JobSpec) -> None:
    """``ValueError`` for configurations the harness cannot run (MARP still predicts them)."""
    p, t = job.parallel, job.training
    if t.runtime not in HARNESS_RUNTIMES:
        raise ValueError(f"harness: training.runtime must be one of {', '.join(HARNESS_RUNTIMES)}, got {t.runtime!r}")
    if t.precision not in _TORCH_DTYPES:
        raise ValueError(f"harness: training.precision must be one of {', '.join(_TORCH_DTYPES)}, got {t.precision!r}")
    if t.optimizer != "adamw":
        raise ValueError(f"harness: training.optimizer must be adamw, got {t.optimizer!r}")
    if p.vpp != 1 or p.sequence_parallel:
        raise ValueError("harness: parallel.vpp must be 1 and parallel.sequence_parallel false")
    if t.runtime == Runtime.MEGATRON and t.precision == Precision.FP32 and p.zero_stage:
        raise ValueError("harness: megatron fp32 is measured with zero_stage 0")


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_rank(job: JobSpec, stage: int) -> tuple[ReferenceDecoder, int]:
    """The rank's module and how many micro-batches it keeps in flight."""
    p, t = job.parallel, job.training
    shape = stage_shape(job.model.num_layers, p.pp, p.vpp, stage, t.num_micro_batches(p.dp))
    shard = ShardSpec(
        tp=p.tp,
        ep=p.ep,
        first_layer=shape.first_layer,
        num_layers=shape.num_layers,
        has_embedding=shape.has_embedding,
        has_output=shape.has_output,
    )
    param_dtype = _TORCH_DTYPES[t.precision]
    with _default_dtype(param_dtype):
        model = ReferenceDecoder(
            job.model,
            shard,
            attention=p.attention,
            recompute=p.recompute,
            max_seq_len=t.seq_len // p.cp,
        )
    in_flight = round(shape.in_flight_layer_microbatches)
    return model, in_flight


def megatron_optimizer(model: nn.Module, job: JobSpec) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
    """Megatron's layout: flat fp32 main-grad buffer, fp32 master shard, fused Adam on the shard."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    main_grad = torch.zeros(total, dtype=torch.float32)
    offset = 0
    for param in params:
        param.main_grad = main_grad[offset : offset + param.numel()].view_as(param)  # type: ignore[attr-defined]
        offset += param.numel()

        def fold(p: torch.Tensor) -> None:
            assert p.grad is not None
            p.main_grad.add_(p.grad)  # type: ignore[attr-defined]
            p.grad = None

        param.register_post_accumulate_grad_hook(fold)
    if job.training.precision == Precision.FP32:
        optimizer = torch.optim.AdamW(params, fused=True)
        for param in params:
            # fp32 weights are their own master copy: Adam reads the fp32 main grads directly.
            param.grad = param.main_grad  # type: ignore[attr-defined]
        return optimizer, [main_grad]
    # The distributed optimizer shards dense parameters over dp x cp and expert parameters over their
    # expert-data-parallel group, dp x cp / ep (Megatron-core ``parallel_state`` expert groups).
    p = job.parallel
    expert = sum(param.numel() for name, param in model.named_parameters() if ".experts." in name)
    dense_ranks, expert_ranks = (p.dp * p.cp, max(p.dp * p.cp // p.ep, 1)) if p.zero_stage >= 1 else (1, 1)
    shard = math.ceil((total - expert) / dense_ranks) + math.ceil(expert / expert_ranks)
    master = nn.Parameter(torch.zeros(shard, dtype=torch.float32))
    master.grad = main_grad[:shard]
    return torch.optim.AdamW([master], fused=True), [main_grad, master]


def run_step(
    model: ReferenceDecoder,
    job: JobSpec,
    in_flight: int,
    optimizer: torch.optim.Optimizer,
    tracker: MemTracker | None = None,
) -> None:
    """One training step: ``in_flight`` forwards (1F1B's warm-up on this stage), their backwards, the
    optimizer step. Tensors are made on the default device (``with torch.device(...)`` selects it)."""
    t, p = job.training, job.parallel
    b, s = t.micro_batch_size, t.seq_len // p.cp
    vocab_local = math.ceil(job.model.vocab_size / p.tp)
    hidden_dtype = _TORCH_DTYPES[t.precision]
    outputs = []
    for _ in range(in_flight):
        if model.embed is not None:
            inputs = torch.randint(0, vocab_local, (b, s))
        else:
            # Activations received from the previous stage (a leaf that gets a gradient to send back).
            inputs = torch.zeros(b, s, job.model.hidden_size, dtype=hidden_dtype, requires_grad=True)
        targets = torch.randint(0, vocab_local, (b, s)) if model.output is not None else None
        if tracker is not None:
            # Per-module statistics are per call; the global peak MemTracker keeps is unaffected.
            tracker.reset_mod_stats()
        out = model(inputs, targets)
        if targets is None:
            # Megatron frees a sent activation's data and keeps only its autograd node
            # (``deallocate_output_tensor`` in Megatron-LM ``schedules.py``).
            out.untyped_storage().resize_(0)
        outputs.append(out)
    for out in outputs:
        if out.dim() == 0:
            out.backward()
        else:
            out.backward(torch.zeros(out.shape, dtype=out.dtype))
    if t.precision == Precision.FP32:
        # fp32 weights are their own master copy: Adam reads the fp32 main grads directly.
        for param in model.parameters():
            param.grad = param.main_grad  # type: ignore[attr-defined]
    optimizer.step()
    model.zero_grad(set_to_none=True)


def measure(job: JobSpec, *, stage: int = 0, fake: bool = True, steps: int = 1) -> Measurement:
    """Peak bytes of rank ``stage`` (tp/dp/cp rank 0) over ``steps`` training steps of ``job``.

    The optimizer takes one step on zero gradients before tracking starts, so its states exist (as from
    the second step of a real run on) and every measured step is a steady-state step.
    """
    check_supported(job)
    if not 0 <= stage < job.parallel.pp:
        raise ValueError(f"stage must be in 0..{job.parallel.pp - 1}, got {stage}")
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with mode, warnings.catch_warnings():
        # MemTracker warns for every None gradient it is handed (parameters without .grad): harmless here.
        warnings.filterwarnings("ignore", "Expected a tensor or a traceable wrapper-subclass", UserWarning)
        model, in_flight = build_rank(job, stage)
        optimizer, buffers = megatron_optimizer(model, job)
        optimizer.step()  # creates the optimizer states: steady state from the first measured step on
        model.zero_grad(set_to_none=True)
        tracker = MemTracker()
        # Buffers made outside the tracker (main grads, master shard) are registered with it explicitly.
        tracker.track_external(model, optimizer, *buffers)
        with tracker:
            for _ in range(steps):
                run_step(model, job, in_flight, optimizer, tracker)
        peak = tracker.get_tracker_snapshot("peak")
    device_peak = next(iter(peak.values()))
    breakdown = {str(getattr(k, "value", k)): int(v) for k, v in device_peak.items()}
    return Measurement(stage=stage, peak_bytes=breakdown.pop("Total"), breakdown=breakdown)
