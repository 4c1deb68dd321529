"""The GPU-independent volumes of one training step: :class:`StepTerms` of a job at one parallel config.

:func:`step_terms_of` counts, for the pipeline rank that limits the step (the last stage), the linear layers'
GEMM shapes, attention FLOPs and eager attention's score traffic, elementwise and fp8-cast bytes, layer
executions, tensor-, context-, expert- and pipeline-parallel bytes and calls per micro-batch, data-parallel
bytes per step or per micro-batch and optimizer bytes (:mod:`frenzy_opt.prediction.steptime`'s docstring
gives the model and its sources); :meth:`StepTerms.evaluate` (:mod:`frenzy_opt.prediction.stepeval`) turns
them into seconds. :func:`cached_step_terms` shares them between the plan searches of a process.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from frenzy_opt.core.enums import Precision, Recompute
from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.hardware.topology import Links
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.prediction.flops import step_flops
from frenzy_opt.prediction.marp.layout import DTYPE_BYTES
from frenzy_opt.prediction.profiles import LayerShape
from frenzy_opt.prediction.stepeval import GpuRates, StepTime, evaluate_terms

if TYPE_CHECKING:  # the parameters import this module (StepTimeModel.step_time)
    from frenzy_opt.prediction.steptime import StepTimeModel

__all__ = ["STEP_TERMS_CACHE", "StepTerms", "cached_step_terms", "step_terms", "step_terms_of"]


# fp32 optimizer traffic per parameter of the shard: Adam reads and writes master weights and two moments
# and reads the gradient (4 x 2 x 3 + 4 bytes), then writes the 16-bit weight (2 bytes).
OPTIMIZER_BYTES_PER_PARAM = 30


# fp8 casting: each element quantised is read in bf16 (2 bytes) and written in fp8 (1 byte).
FP8_CAST_BYTES = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTerms:
    """The GPU-independent volumes of one step of a job at one parallel config, on its bottleneck rank.
    Per-micro-batch figures are for one micro-batch forward and backward (with its recompute).
    :meth:`evaluate` turns them into seconds on a GPU type and its links."""

    model_flops: float
    flops_per_gpu: float
    precision: str
    runtime: str
    microbatches: int
    pp: int
    vpp: int
    linear_flops: float
    """Linear-layer FLOPs per micro-batch (run at the fp8 rate under fp8)."""
    flash_flops: float
    """FlashAttention FLOPs per micro-batch (used only where the GPU runs FlashAttention)."""
    eager_flops: float
    """Eager attention's QK^T and attention x V FLOPs per micro-batch (where FlashAttention is not run)."""
    eager: bool
    """The job asks for eager attention (``parallel.attention``)."""
    eager_attention_bytes: float
    """Score-matrix HBM traffic per micro-batch of eager attention (where FlashAttention is not run)."""
    linear_gemms: tuple[tuple[float, float, float, float], ...] = ()
    """The stage's linear-layer GEMMs per micro-batch as ``(m, n, k, count)``: each linear's forward (and
    recomputed forward), input-gradient and weight-gradient GEMM (:func:`_gemms`)."""
    output_gemms: tuple[tuple[float, float, float, float], ...] = ()
    """The output layer's GEMMs per micro-batch on the last stage, ``(m, n, k, count)``."""
    head_dim: int = 128
    seq_len: int = 2048
    operand_bytes: float = 2.0
    """Bytes per GEMM operand element of the linear layers (1 under fp8)."""
    output_bytes: float
    """The output layer's and loss's HBM traffic per micro-batch (fp32 logits)."""
    balanced: bool
    """Stages balanced by cost (the runtime profile's ``balanced_pipeline_stages``)."""
    elementwise_bytes: float
    """Bytes of one pass over the layers' activations per micro-batch, forward (times 3 with backward)."""
    fp8_cast_bytes: float
    layers: float
    """Layer executions per micro-batch (layers of the stage, x 4/3 under full recompute)."""
    tp_bytes: float
    """Tensor-parallel all-reduce bytes per micro-batch (ring over ``tp``)."""
    tp_overlap: bool
    """Tensor-parallel collectives overlap the linear layers' GEMMs (``training.tp_comm_overlap``)."""
    tp: int
    cp_bytes: float
    cp: int
    ep_bytes: float
    ep: int
    collective_calls: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """Collective calls per micro-batch of the tensor-, context- and expert-parallel groups and the pipeline's
    sends (all chunks): each pays a small-message latency (:func:`~frenzy_opt.prediction.comms.latency_s`)
    besides its bytes."""
    pipeline_bytes: float
    """Point-to-point bytes per micro-batch between stages (all chunks)."""
    dp_group: int
    dp_stride: int
    dp_allreduce_bytes: float
    """Per step: the all-reduce-equivalent bytes of the data-parallel reduction (ZeRO-1/2: RS + AG)."""
    dp_microbatch_bytes: float
    """Per micro-batch (ZeRO-3/FSDP): all-reduce-equivalent bytes of the parameter gathers and gradient
    reduce-scatter."""
    optimizer_bytes: float
    num_gpus: int
    pp_stride: int
    """GPUs between consecutive pipeline stages in the rank order (tp x cp x dp)."""
    shape: LayerShape | None = None
    """The layer's shape, to find a measured layer profile (:mod:`frenzy_opt.prediction.profiles`)."""
    micro_batch_size: int = 1
    stage_layers: float = 0.0
    """Layers of the bottleneck stage (without recompute's extra forward)."""
    recompute_full: bool = False
    optimizer_share: float = 1.0
    """The share of a stage's optimizer step one rank runs (1 over the sharding group under ZeRO/FSDP)."""
    sharded: bool = False
    """Optimizer states sharded over the data-parallel (and context-parallel) group (ZeRO >= 1 or FSDP)."""

    @property
    def bubble_fraction(self) -> float:
        return (self.pp - 1) / (self.vpp * self.microbatches)

    def evaluate(self, gpu: GpuType, links: Links, model: StepTimeModel, rates: GpuRates | None = None) -> StepTime:
        return evaluate_terms(self, gpu, links, model, rates)


STEP_TERMS_CACHE = 8192
"""Entries of :func:`cached_step_terms` (a design choice: more than the candidates with a plan in the largest
benchmarked search, ``benchmarks/plan_enumeration.py`` at 4,096 GPUs per type; a few kB each)."""


def step_terms(job: JobSpec) -> StepTerms:
    """:class:`StepTerms` of ``job`` at its parallel config and micro-batch
    (:mod:`frenzy_opt.prediction.steptime`'s docstring)."""
    return step_terms_of(job.model, job.training, job.parallel)


@functools.lru_cache(maxsize=1024)
def _layer_linear_dims(arch: ModelArch, tp: int) -> tuple[float, float]:
    """(linear weights per layer on one tp rank, the sum of the linears' input and output widths) for the
    active path of one token: the linears of :func:`_layer_linears` weighted by the share of a token that
    passes each (an MoE layer's routed experts ``moe_top_k`` times in all); the router counts among the
    weights, not the widths. Cached: :func:`step_terms_of` reads it once per candidate a plan search prices,
    for a handful of tp degrees."""
    linears = _layer_linears(arch, tp, 1, 1.0)
    weights = sum(share * alike * fan_in * fan_out for share, fan_in, fan_out, alike in linears + _router(arch, 1.0))
    widths = sum(share * alike * (fan_in + fan_out) for share, fan_in, fan_out, alike in linears)
    return weights, widths


def _layer_linears(arch: ModelArch, tp: int, ep: int, tokens: float) -> list[tuple[float, float, float, float]]:
    """(tokens through it, input width, output width, how many alike) of the linears of one layer on one tp
    rank: the fused q/k/v and the output projection, then the MLP (an MoE layer's local experts, each seeing
    ``tokens x top_k x ep / experts`` tokens of the ep group; its router is :func:`_router`)."""
    h, d = arch.hidden_size, arch.kv_channels
    q = arch.num_attention_heads * d / tp
    kv = max(arch.num_kv_heads // tp, 1) * d
    up = 2 if arch.mlp == "swiglu" else 1
    out = [(tokens, h, q + 2 * kv, 1.0), (tokens, q, h, 1.0)]
    if arch.is_moe:
        per_expert = tokens * arch.moe_top_k * ep / arch.num_experts
        ffn = arch.expert_ffn_size / tp
        local = float(max(arch.num_experts // ep, 1))
        out += [(per_expert, h, up * ffn, local), (per_expert, ffn, h, local)]
    else:
        ffn = arch.ffn_hidden_size / tp
        out += [(tokens, h, up * ffn, 1.0), (tokens, ffn, h, 1.0)]
    return out


def _router(arch: ModelArch, tokens: float) -> list[tuple[float, float, float, float]]:
    """An MoE layer's router as a linear of :func:`_layer_linears`'s form (none for a dense layer)."""
    return [(tokens, arch.hidden_size, arch.num_experts, 1.0)] if arch.is_moe else []


Gemm = tuple[float, float, float, float]


def _gemms(linears: list[tuple[float, float, float, float]], layers: float, forwards: float) -> tuple[Gemm, ...]:
    """Each linear's GEMMs ``(m, n, k, count)``: the forward ``forwards`` times per layer (2 under full
    recompute), the input gradient and the weight gradient once (Narayanan et al. 2021, Sec. 3.5: forward,
    then two backward GEMMs of the same size), times the number of alike linears (an MoE layer's experts)."""
    out: list[Gemm] = []
    for tokens, fan_in, fan_out, alike in linears:
        n = layers * alike
        out += [(tokens, fan_out, fan_in, n * forwards), (tokens, fan_in, fan_out, n), (fan_in, fan_out, tokens, n)]
    return tuple(out)


@functools.lru_cache(maxsize=STEP_TERMS_CACHE)
def cached_step_terms(arch: ModelArch, t: TrainingConfig, p: ParallelConfig) -> StepTerms:
    """:func:`step_terms_of`, shared by every plan search of the process: the GPU groups of one search price
    the same candidates (GPU types that differ only in their count or memory), and a search repeated for
    the same job shape prices them again."""
    return step_terms_of(arch, t, p)


def step_terms_of(arch: ModelArch, t: TrainingConfig, p: ParallelConfig) -> StepTerms:
    """:func:`step_terms` from the parts of a job spec."""
    microbatches = t.num_micro_batches(p.dp)
    row = profile(t.runtime)
    act = DTYPE_BYTES["bf16" if t.precision == Precision.FP8 else t.precision]
    seq = t.seq_len
    tokens = t.micro_batch_size * math.ceil(seq / p.cp)
    h, tp = arch.hidden_size, p.tp
    layers = arch.num_layers / p.pp
    recompute = 4 / 3 if p.recompute == Recompute.FULL else 1.0
    weights, widths = _layer_linear_dims(arch, tp)
    # Matmul FLOPs: 2 per multiply-add, forward + 2x backward (+ the recomputed forward).
    linear = 6 * tokens * weights * layers * recompute
    heads = arch.num_attention_heads / tp
    core = 4.0 * tokens * seq * heads * arch.kv_channels  # QK^T and attention x V, one forward
    core_passes = 3 + (1 if p.recompute in ("full", "selective") else 0)
    # FlashAttention: causal masking skips half the blocks; backward 2.5x the forward (Dao 2023).
    flash = core / 2 * (1 + 2.5 + (1 if p.recompute != Recompute.NONE else 0)) * layers
    eager_flops = core * core_passes * layers
    # Eager attention: the b x a x s x s score matrix written by QK^T, read and written by mask, softmax and
    # dropout, read by attention x V (about 8 passes forward, twice that backward).
    eager = act * tokens * seq * heads * 8 * core_passes * layers
    vocab = arch.vocab_size / tp
    logits_bytes = 4 * tokens * vocab * 4  # fp32 logits: written, softmax read and written, gradient
    sp = tp if p.sequence_parallel else 1
    up = 2 if arch.mlp == "swiglu" else 1
    ffn = (arch.expert_ffn_size * up * (arch.moe_top_k if arch.is_moe else 1)) / tp
    elementwise = act * tokens * (h / sp + ffn / 4) * layers * recompute
    casts = 0.0
    if t.precision == Precision.FP8:
        # Each fp8 GEMM casts its input (forward), its weight and its output gradient (backward). Transformer
        # Engine (Megatron) fuses the input casts of the QKV and first MLP GEMMs into the preceding norm
        # (LayerNormLinear, LayerNormMLP) and casts the weights once per step, reusing them over the
        # micro-batches (TE docs, "is_first_microbatch"); torchao's float8 casts everything each time.
        if row.fp8_weight_casts_per_step:
            casts = FP8_CAST_BYTES * tokens * widths / 2 * layers * recompute
        else:
            casts = FP8_CAST_BYTES * (tokens * widths + weights) * layers * recompute
    block_bytes = act * tokens * h
    collectives = 4 + (2 if p.recompute == Recompute.FULL else 0)
    tp_bytes = layers * collectives / 2 * block_bytes  # all-reduce equivalents (collective_s prices a ring)
    cp_bytes = 0.0
    if p.cp > 1:
        kv = 2 * act * tokens * max(arch.num_kv_heads // tp, 1) * arch.kv_channels
        cp_bytes = layers * 3 * kv  # k/v forward and with gradients backward, as an all-gather volume
    ep_bytes = 0.0
    if arch.is_moe and p.ep > 1:
        ep_bytes = layers * 4 * block_bytes * arch.moe_top_k
    pipeline = 0.0
    if p.pp > 1:
        pipeline = 2 * p.vpp * block_bytes / (tp if p.sequence_parallel else 1)
    params = arch.num_params / (tp * p.pp * (p.ep if arch.is_moe else 1))
    grad = 4 if row.grad_reduce_fp32 or t.precision == Precision.FP32 else act
    fsdp = p.zero_stage >= 3 or row.fully_shard
    dp_step = dp_mb = 0.0
    if fsdp:
        # Two parameter all-gathers (forward, backward) and a gradient reduce-scatter per micro-batch:
        # each half an all-reduce's volume.
        dp_mb = (2 * act + grad) / 2 * params
    elif p.zero_stage >= 1:
        dp_step = (grad + act) / 2 * params  # reduce-scatter gradients, all-gather parameters
    else:
        dp_step = grad * params
    sharded = p.zero_stage >= 1 or row.fully_shard
    flops = step_flops(arch, t, p)
    linears = _layer_linears(arch, tp, p.ep, tokens) + _router(arch, tokens)
    linear_gemms = _gemms(linears, layers, 2.0 if p.recompute == Recompute.FULL else 1.0)
    output_gemms = _gemms([(tokens, h, math.ceil(arch.vocab_size / tp), 1.0)], 1.0, 1.0)
    return StepTerms(
        model_flops=flops,
        linear_gemms=linear_gemms,
        output_gemms=output_gemms,
        head_dim=arch.kv_channels,
        seq_len=seq,
        operand_bytes=1.0 if t.precision == Precision.FP8 else float(act),
        flops_per_gpu=flops / p.num_gpus,
        precision=t.precision,
        runtime=t.runtime,
        microbatches=microbatches,
        pp=p.pp,
        vpp=p.vpp,
        linear_flops=linear,
        flash_flops=flash,
        eager_flops=eager_flops,
        eager=p.attention == "eager",
        eager_attention_bytes=eager,
        output_bytes=logits_bytes,
        balanced=row.balanced_pipeline_stages,
        elementwise_bytes=elementwise,
        fp8_cast_bytes=casts,
        layers=layers * recompute,
        tp_bytes=tp_bytes if tp > 1 else 0.0,
        collective_calls=(
            layers * collectives if tp > 1 else 0.0,
            layers * 2 * (p.cp - 1),  # ring attention: cp - 1 k/v exchanges forward and again backward
            layers * 4 if arch.is_moe and p.ep > 1 else 0.0,  # dispatch and combine, forward and backward
            2.0 * p.vpp,
        ),
        tp_overlap=t.tp_comm_overlap,
        tp=tp,
        cp_bytes=cp_bytes,
        cp=p.cp,
        ep_bytes=ep_bytes,
        ep=p.ep,
        pipeline_bytes=pipeline,
        dp_group=p.dp * p.cp,
        dp_stride=tp,
        dp_allreduce_bytes=dp_step,
        dp_microbatch_bytes=dp_mb,
        optimizer_bytes=params / (p.dp * p.cp if sharded else 1) * OPTIMIZER_BYTES_PER_PARAM,
        num_gpus=p.num_gpus,
        pp_stride=tp * p.cp * p.dp,
        # A profile is measured without context parallelism or experts spread over ranks.
        shape=LayerShape.of(arch, seq, t.precision, p.attention) if p.cp == 1 and p.ep == 1 else None,
        micro_batch_size=t.micro_batch_size,
        stage_layers=layers,
        recompute_full=p.recompute == Recompute.FULL,
        optimizer_share=1 / (p.dp * p.cp) if sharded else 1.0,
        sharded=sharded,
    )
