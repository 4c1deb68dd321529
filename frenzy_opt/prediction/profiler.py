"""``frenzy profile``: measure one transformer layer of a job's shapes on this machine's GPU.

For each micro-batch size the planner considers and each tensor-parallel degree of the GPU type's node, the
profiler builds one rank's shard of one layer (:class:`frenzy_opt.models.reference.ReferenceDecoder` with
``tp``-divided heads and MLP), and of the embedding and the output layer with its loss, in the job's number
format; it times their forward and backward passes and one optimizer step of the layer's parameters with
CUDA events (median of ``iters`` after ``warmup``), and records the layer's peak allocated memory. One GPU
measures a tensor-parallel rank's compute; its collectives stay the step-time model's
(``LayerProfile.includes_tp_comm`` is false). The result is a :class:`LayerProfile` that
:class:`frenzy_opt.prediction.calibrations.CalibrationStore` adds to a calibration profile.

Measuring needs CUDA: :func:`cuda_refusal` says why not where it is absent. The measuring function itself
runs on any torch device, so its format and its use are tested on the CPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from frenzy_opt.core.spec import JobSpec
from frenzy_opt.prediction.profiles import LayerProfile, LayerShape, ProfilePoint

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
MAX_TP = 8
"""The largest tensor-parallel degree profiled: one node's GPUs (tensor parallelism stays inside a node,
Narayanan et al. 2021, Sec. 3.3)."""


def cuda_refusal() -> str | None:
    """Why this machine cannot profile (None when it can)."""
    import torch

    if torch.cuda.is_available():
        return None
    built = torch.version.cuda or "none (a CPU-only build)"
    return (
        f"frenzy profile measures kernels on a CUDA GPU, and this machine has none: torch.cuda.is_available() is "
        f"False (torch {torch.__version__}, CUDA {built}). Run it on a machine with the GPU type to profile."
    )


def micro_batch_sizes(job: JobSpec, choices: Sequence[int]) -> list[int]:
    """The micro-batch sizes the planner considers for ``job``: its pinned one, else every one of ``choices``
    (the planner's, :data:`frenzy_opt.planning.candidates.MICRO_BATCH_CHOICES`) that divides the global batch."""
    t = job.training
    if "micro_batch_size" in job.pinned:
        return [t.micro_batch_size]
    return [m for m in choices if t.global_batch_size % m == 0]


def tp_degrees(job: JobSpec, gpus_per_node: int = MAX_TP) -> list[int]:
    """Tensor-parallel degrees up to a node whose shards are whole heads and MLP columns."""
    arch = job.model
    ffn = arch.expert_ffn_size if arch.is_moe else arch.ffn_hidden_size
    return [
        tp
        for tp in (1, 2, 4, 8)
        if tp <= gpus_per_node and arch.num_attention_heads % tp == 0 and arch.num_kv_heads % tp == 0 and ffn % tp == 0
    ]


def measure(
    job: JobSpec,
    *,
    gpu: str,
    micro_batches: Sequence[int],
    tps: Sequence[int],
    device: str = "cuda",
    warmup: int = 3,
    iters: int = 10,
    source: str = "",
    log: Callable[[str], None] | None = None,
) -> tuple[LayerProfile, list[str]]:
    """Time ``job``'s layer shapes (module docstring) on ``device``; the profile and a note per point that
    did not fit in memory."""
    precision = str(job.training.precision)
    if precision not in DTYPES:
        raise ValueError(
            f"training.precision {precision!r}: frenzy profile measures {', '.join(DTYPES)} layers "
            "(fp8 needs Transformer Engine or torchao kernels the reference layer does not run)"
        )
    if warmup < 0 or iters < 1:
        raise ValueError(f"--warmup must be >= 0 and --iters >= 1, got {warmup} and {iters}")
    import torch

    dtype = getattr(torch, DTYPES[precision])
    points: list[ProfilePoint] = []
    notes: list[str] = []
    for tp in tps:
        for mbs in micro_batches:
            try:
                points.append(_point(job, tp, mbs, dtype, torch.device(device), warmup, iters))
            except torch.cuda.OutOfMemoryError:
                notes.append(f"tp {tp} micro-batch {mbs}: one layer does not fit in the GPU's memory")
            finally:
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
            if log is not None and points and points[-1].tp == tp and points[-1].micro_batch_size == mbs:
                p = points[-1]
                log(f"tp {tp} mb {mbs}: layer {1e3 * p.layer_fwd_s:.3f} + {1e3 * p.layer_bwd_s:.3f} ms")
    if not points:
        raise ValueError(f"frenzy profile: no configuration fitted ({'; '.join(notes)})")
    profile = LayerProfile(
        gpu=gpu,
        runtime=str(job.training.runtime),
        model=job.model.name,
        source=source or f"frenzy profile on {device}",
        includes_tp_comm=False,
        shape=LayerShape.of(job.model, job.training.seq_len, precision, job.parallel.attention),
        points=tuple(points),
    )
    return profile, notes


def _point(job: JobSpec, tp: int, mbs: int, dtype: Any, device: Any, warmup: int, iters: int) -> ProfilePoint:
    import torch

    from frenzy_opt.models.reference import ReferenceDecoder, ShardSpec

    arch, seq = job.model, job.training.seq_len
    attention = job.parallel.attention

    def build(**shard: Any) -> ReferenceDecoder:
        spec = ShardSpec(tp=tp, **shard)
        module = ReferenceDecoder(arch, spec, attention=attention, max_seq_len=seq)
        module.to(device=device, dtype=dtype)  # in place: nn.Module.to returns the module itself
        return module

    cuda = device.type == "cuda"
    layer = build(num_layers=1, has_embedding=False, has_output=False)
    hidden = torch.randn(mbs, seq, arch.hidden_size, device=device, dtype=dtype)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if cuda else 0
    fwd, bwd = _fwd_bwd(lambda: layer(hidden.detach().requires_grad_()), device, warmup, iters)
    peak = torch.cuda.max_memory_allocated(device) - base if cuda else 0
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-4, fused=cuda)
    update = _timed(optimizer.step, device, warmup, iters)

    vocab = torch.randint(0, max(arch.vocab_size // tp, 1), (mbs, seq), device=device)
    embedding = build(num_layers=0, has_embedding=True, has_output=False)
    emb_fwd, emb_bwd = _fwd_bwd(lambda: embedding(vocab), device, warmup, iters)
    output = build(num_layers=0, has_embedding=False, has_output=True)
    out_fwd, out_bwd = _fwd_bwd(lambda: output(hidden.detach().requires_grad_(), vocab), device, warmup, iters)
    return ProfilePoint(
        micro_batch_size=mbs,
        tp=tp,
        layer_fwd_s=fwd,
        layer_bwd_s=bwd,
        embedding_fwd_s=emb_fwd,
        embedding_bwd_s=emb_bwd,
        output_fwd_s=out_fwd,
        output_bwd_s=out_bwd,
        update_s=update,
        layer_peak_bytes=int(peak),
    )


def _clock(device: Any) -> Callable[[], Callable[[], float]]:
    """A stopwatch factory: CUDA events on a GPU (the kernels' time, not the host's), the host clock else."""
    import torch

    if device.type == "cuda":

        def start_cuda() -> Callable[[], float]:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()

            def stop() -> float:
                end.record()
                end.synchronize()
                return float(begin.elapsed_time(end)) / 1e3

            return stop

        return start_cuda

    def start_host() -> Callable[[], float]:
        begin = time.perf_counter()
        return lambda: time.perf_counter() - begin

    return start_host


def _fwd_bwd(forward: Callable[[], Any], device: Any, warmup: int, iters: int) -> tuple[float, float]:
    """Median seconds of ``forward()`` and of the backward of its result (a loss, or an output whose gradient
    is ones)."""
    import torch

    start = _clock(device)
    fwd: list[float] = []
    bwd: list[float] = []
    for i in range(warmup + iters):
        stop = start()
        out = forward()
        f = stop()
        grad = None if out.dim() == 0 else torch.ones_like(out)
        stop = start()
        out.backward(grad)
        b = stop()
        if i >= warmup:
            fwd.append(f)
            bwd.append(b)
    return statistics.median(fwd), statistics.median(bwd)


def _timed(fn: Callable[[], Any], device: Any, warmup: int, iters: int) -> float:
    start = _clock(device)
    times = []
    for i in range(warmup + iters):
        stop = start()
        fn()
        t = stop()
        if i >= warmup:
            times.append(t)
    return statistics.median(times)
