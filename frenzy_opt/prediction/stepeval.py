"""Seconds of one training step from its terms: :func:`evaluate_terms` prices a :class:`StepTerms`
(:mod:`frenzy_opt.prediction.stepterms`) on a GPU type and its links with a step-time model's parameters.

The formulas are those of :mod:`frenzy_opt.prediction.steptime`'s docstring: matmuls by shape on the GPU
type's measured rates (:mod:`frenzy_opt.prediction.kernels`), FlashAttention or eager attention, elementwise
work at the measured bandwidth, the fixed per-layer and per-micro-batch costs, the tensor-, context- and
expert-parallel collectives and pipeline sends (:mod:`frenzy_opt.prediction.comms`), the 1F1B bubble, the
exposed data-parallel traffic (``RuntimeProfile.dp_overlap``) and the optimizer step. :class:`GpuRates` is
what it reads of a GPU type for one job, read once per GPU type by a plan search (:func:`gpu_rates`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from frenzy_opt.core.enums import Precision
from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.hardware.throughput import achievable
from frenzy_opt.hardware.topology import NETWORK_LATENCY_S, Links
from frenzy_opt.prediction import kernels
from frenzy_opt.prediction.comms import all_to_all_s, collective_s, latency_s, p2p_s
from frenzy_opt.prediction.profiles import ProfilePoint

if TYPE_CHECKING:  # the terms and the parameters import this module (StepTerms.evaluate, StepTimeModel.step_time)
    from frenzy_opt.prediction.stepterms import StepTerms
    from frenzy_opt.prediction.steptime import StepTimeModel

__all__ = [
    "FLASH_ARCHITECTURES",
    "DpTerms",
    "GpuRates",
    "MicrobatchTime",
    "StepTime",
    "assemble",
    "evaluate_terms",
    "gpu_rates",
    "link_parts",
    "microbatch_time",
    "parts_total",
    "parts_with",
    "per_microbatch_s",
    "profiled_point",
    "step_parts",
]


# GPU architectures FlashAttention runs on: Ampere, Ada and Hopper (FlashAttention-2 README, "Requirements":
# Ampere, Ada, or Hopper GPUs) and Blackwell (cuDNN's fused attention); Volta and Turing fall back to eager.
FLASH_ARCHITECTURES = frozenset({"ampere", "ada", "hopper", "blackwell"})


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    """Seconds of one step, by part; ``total_s`` is the step time."""

    compute_s: float
    """The micro-batches' matmuls, attention, elementwise work and fixed per-layer costs."""
    bubble_s: float
    intra_node_comm_s: float
    """Tensor-, context- and expert-parallel collectives (exposed)."""
    pipeline_p2p_s: float
    data_parallel_exposed_s: float
    optimizer_s: float
    model_flops: float
    """Model FLOPs of the whole step over all GPUs (Narayanan et al. 2021, Eq. 3 with the recompute chosen)."""
    overhead_s: float = 0.0
    """Per-micro-batch scheduling cost of the runtime."""

    @property
    def total_s(self) -> float:
        return (
            self.compute_s
            + self.bubble_s
            + self.intra_node_comm_s
            + self.pipeline_p2p_s
            + self.data_parallel_exposed_s
            + self.optimizer_s
            + self.overhead_s
        )

    def tflops_per_gpu(self, num_gpus: int) -> float:
        """Achieved model TFLOP/s per GPU, the figure Megatron-LM reports."""
        return self.model_flops / self.total_s / num_gpus / 1e12


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuRates:
    """What :func:`evaluate_terms` reads of a GPU type and the model for one job (its format, runtime, head
    dimension, sequence length and attention choice), whatever the parallel config: a plan search reads it
    once per GPU type (:func:`gpu_rates`) instead of once per candidate."""

    job: tuple[str, str, int, int, bool]
    """(precision, runtime, head_dim, seq_len, eager) of the job it was read for."""
    sixteen_tflops: float
    """16-bit GEMM TFLOP/s at the fitted efficiency (eager attention, the output layer)."""
    linear_tflops: float
    """TFLOP/s of the linear layers' GEMMs (the fp8 rate where the job and the GPU run fp8)."""
    fp8: bool
    """The linear layers run fp8 (and pay its casts)."""
    hbm_gbyte_s: float
    out_bytes: float
    flash: bool
    """FlashAttention runs (the GPU has it and the job does not ask for eager attention)."""
    flash_rate: float
    """FLOP/s of FlashAttention at the fitted efficiencies (0 where it does not run)."""
    elementwise_passes3: float
    """Three times the fitted elementwise passes (forward and backward)."""
    layer_overhead_s: float
    microbatch_overhead_s: float


def gpu_rates(
    gpu: GpuType, model: StepTimeModel, *, precision: str, runtime: str, head_dim: int, seq_len: int, eager: bool
) -> GpuRates:
    """:class:`GpuRates` of ``gpu`` for a job (kernels by :mod:`frenzy_opt.prediction.kernels` on the GPU type's
    measured throughput)."""
    rates = achievable(gpu)
    efficiency = model.efficiency_of(gpu, precision) * model.per_runtime("gemm_efficiency", runtime)
    sixteen_format = ("bf16" if gpu.bf16_tflops else "fp16") if precision == Precision.FP8 else precision
    sixteen_tflops = rates.matmul(sixteen_format) * efficiency
    fp8 = bool(precision == Precision.FP8 and gpu.fp8_tflops)
    linear_tflops = rates.matmul("fp8") * efficiency * model.fp8_efficiency if fp8 else sixteen_tflops
    flash = gpu.architecture in FLASH_ARCHITECTURES and not eager
    flash_rate = 0.0
    if flash:
        rate = kernels.flash_tflops(gpu, runtime, head_dim, seq_len, precision) * 1e12
        flash_rate = rate * efficiency * model.per_runtime("attention_efficiency", runtime)
    return GpuRates(
        job=(precision, runtime, head_dim, seq_len, eager),
        sixteen_tflops=sixteen_tflops,
        linear_tflops=linear_tflops,
        fp8=fp8,
        hbm_gbyte_s=rates.hbm_gbyte_s,
        out_bytes=4.0 if precision == Precision.FP32 else 2.0,
        flash=flash,
        flash_rate=flash_rate,
        elementwise_passes3=3 * model.per_runtime("elementwise_passes", runtime),
        layer_overhead_s=model.per_runtime("layer_overhead_s", runtime),
        microbatch_overhead_s=model.per_runtime("microbatch_overhead_s", runtime),
    )


class DpTerms(Protocol):
    """What :func:`assemble` reads of a step's terms besides its :class:`MicrobatchTime`: the fields that
    depend on the data-parallel degree or the pipeline depth (a :class:`StepTerms` has them all)."""

    @property
    def microbatches(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def vpp(self) -> int: ...
    @property
    def balanced(self) -> bool: ...
    @property
    def num_gpus(self) -> int: ...
    @property
    def pp_stride(self) -> int: ...
    @property
    def pipeline_bytes(self) -> float: ...
    @property
    def collective_calls(self) -> tuple[float, float, float, float]: ...
    @property
    def dp_group(self) -> int: ...
    @property
    def dp_stride(self) -> int: ...
    @property
    def dp_allreduce_bytes(self) -> float: ...
    @property
    def dp_microbatch_bytes(self) -> float: ...
    @property
    def optimizer_bytes(self) -> float: ...
    @property
    def optimizer_share(self) -> float: ...
    @property
    def stage_layers(self) -> float: ...
    @property
    def runtime(self) -> str: ...
    @property
    def model_flops(self) -> float: ...


@dataclass(frozen=True, slots=True)
class MicrobatchTime:
    """The seconds of one micro-batch on the bottleneck stage that do not depend on the data-parallel degree
    (:func:`microbatch_time`). Its layer and collective parts are proportional to the stage's layers (every
    GEMM count, FLOP and byte volume of them is), its output part does not depend on the pipeline depth:
    :func:`frenzy_opt.planning.bestfirst` prices the other depths of a layout from one."""

    layers_s: float
    """The stage's layers, forward and backward with their recompute."""
    output_s: float
    """The output layer and loss (with the embedding where a measured profile of one stage gives it)."""
    comm_s: float
    """Exposed tensor-, context- and expert-parallel collectives, once per pipeline slot."""
    overhead_s: float
    """The runtime's fixed cost per micro-batch and chunk."""
    hbm_bytes_s: float
    update_s: float
    """Measured optimizer seconds per layer of the stage on one rank unsharded (0: priced from the bytes)."""


def evaluate_terms(
    t: StepTerms, gpu: GpuType, links: Links, model: StepTimeModel, rates: GpuRates | None = None
) -> StepTime:
    """Seconds of ``t`` on ``gpu`` with ``links`` (:mod:`frenzy_opt.prediction.steptime`'s docstring);
    ``rates``: :func:`gpu_rates` of ``gpu`` for ``t``'s job, read here when not given."""
    if rates is None:
        rates = gpu_rates(gpu, model, precision=t.precision, runtime=t.runtime, head_dim=t.head_dim,
                          seq_len=t.seq_len, eager=t.eager)  # fmt: skip
    return assemble(t, microbatch_time(t, gpu, links, model, rates), links, model)


def microbatch_time(t: StepTerms, gpu: GpuType, links: Links, model: StepTimeModel, rates: GpuRates) -> MicrobatchTime:
    """The parts of :func:`evaluate_terms` that do not depend on the data-parallel degree."""
    assert rates.job == (t.precision, t.runtime, t.head_dim, t.seq_len, t.eager), "rates read for another job"
    sixteen_tflops = rates.sixteen_tflops
    sixteen = sixteen_tflops * 1e12
    linear_tflops = rates.linear_tflops
    if rates.fp8:
        casts, operand = t.fp8_cast_bytes, t.operand_bytes
    else:
        casts, operand = 0.0, max(t.operand_bytes, 2.0)
    hbm = rates.hbm_gbyte_s * 1e9
    out_bytes = rates.out_bytes
    flash = rates.flash
    if flash:
        attention = t.flash_flops / rates.flash_rate
    else:
        attention = t.eager_flops / sixteen + t.eager_attention_bytes / hbm
    gemms = kernels.gemms_s(t.linear_gemms, gpu, linear_tflops, rates.hbm_gbyte_s, operand, out_bytes)
    layers = gemms + attention
    layers += (rates.elementwise_passes3 * t.elementwise_bytes + casts) / hbm
    # The host's dispatch cost per layer adds to the GPU's work: letting it overlap (a max of the two) fitted
    # worse, 28.2 % against 26.4 % leave one source out (measured with `frenzy calibrate`).
    layers += t.layers * rates.layer_overhead_s
    output = kernels.gemms_s(t.output_gemms, gpu, sixteen_tflops, rates.hbm_gbyte_s, out_bytes, out_bytes)
    output += t.output_bytes / hbm
    update = 0.0
    tp_in_layers = False
    point = profiled_point(t, gpu, model)
    if point is not None:  # measured layer times replace the kernel model's (module profiles' docstring)
        layers = t.stage_layers * point.layer_s(t.recompute_full)
        output = point.output_fwd_s + point.output_bwd_s
        if t.pp == 1:
            output += point.embedding_fwd_s + point.embedding_bwd_s
        update = point.update_s
        tp_in_layers = t.shape is not None and model.profiles.includes_tp_comm(gpu.name, t.runtime, t.shape)
    eff = model.link_efficiency
    tp_calls, cp_calls, ep_calls, _ = t.collective_calls
    tp = collective_s(links, t.tp_bytes, t.tp, 1, eff) + tp_calls * latency_s(links, t.tp, 1)
    if tp_in_layers:  # measured inside the profiled layer times
        tp = 0.0
    elif t.tp_overlap:  # hidden behind the GEMMs it is pipelined with (Wang et al. 2023, "Overlap communication
        # with dependent computation via decomposition"; Megatron's userbuffers and torchtitan's async TP)
        tp = max(0.0, tp - gemms)
    cp = max(0.0, collective_s(links, t.cp_bytes, t.cp, t.tp, eff) / 2 - (attention if flash else 0))
    cp += cp_calls * latency_s(links, t.cp, t.tp)
    ep = all_to_all_s(links, t.ep_bytes, t.ep, t.tp, eff) + ep_calls * latency_s(links, t.ep, t.tp)
    return MicrobatchTime(
        layers_s=layers,
        output_s=output,
        comm_s=tp + cp + ep,
        overhead_s=rates.microbatch_overhead_s,
        hbm_bytes_s=hbm,
        update_s=update,
    )


def per_microbatch_s(mb: MicrobatchTime, pp: int, *, balanced: bool) -> float:
    """Seconds the bottleneck stage spends on one micro-batch, forward and backward."""
    if balanced:  # stages balanced by cost: the output layer's time spread over the stages
        return (mb.layers_s * pp + mb.output_s) / pp
    return mb.layers_s + mb.output_s  # equal layers per stage, the output layer on the last one


def assemble(t: DpTerms, mb: MicrobatchTime, links: Links, model: StepTimeModel) -> StepTime:
    """The step time from its micro-batch parts and the fields of ``t`` that depend on the data-parallel
    degree and the pipeline depth: the 1F1B slots, the pipeline sends, the exposed data-parallel traffic and
    the optimizer step (:func:`step_parts`)."""
    compute, bubble, intra, p2p, exposed, optimizer, overhead = step_parts(t, mb, links, model)
    return StepTime(
        compute_s=compute,
        bubble_s=bubble,
        intra_node_comm_s=intra,
        pipeline_p2p_s=p2p,
        data_parallel_exposed_s=exposed,
        optimizer_s=optimizer,
        model_flops=t.model_flops,
        overhead_s=overhead,
    )


def parts_total(parts: tuple[float, float, float, float, float, float, float]) -> float:
    """``assemble(...).total_s`` from :func:`step_parts` (or :func:`parts_with`) without building the
    :class:`StepTime` (a plan search needs only the total, once per plan): the same parts, summed in
    :attr:`StepTime.total_s`'s order, so the same float bit for bit."""
    compute, bubble, intra, p2p, exposed, optimizer, overhead = parts
    return compute + bubble + intra + p2p + exposed + optimizer + overhead


def step_parts(
    t: DpTerms, mb: MicrobatchTime, links: Links, model: StepTimeModel
) -> tuple[float, float, float, float, float, float, float]:
    """The seconds of :func:`assemble`'s parts, in :attr:`StepTime.total_s`'s order: compute, bubble,
    intra-node collectives, pipeline sends, exposed data-parallel traffic, optimizer, fixed overhead."""
    return parts_with(t, mb, link_parts(t, links, model))


def link_parts(t: DpTerms, links: Links, model: StepTimeModel) -> tuple[float, float, float]:
    """What :func:`step_parts` reads of the links: the seconds of one pipeline send with its latency, of the
    data-parallel traffic once per step and once per micro-batch. They read neither the GPU nor its
    micro-batch parts, so the GPU types of one link share them (:meth:`frenzy_opt.planning.group.GpuGroup.seconds`)."""
    eff = model.link_efficiency
    sends = t.collective_calls[3]
    # Consecutive stages sit on different nodes when one stage fills a node or more.
    crosses = t.num_gpus > links.domain and t.pp_stride >= links.gpus_per_node
    p2p = p2p_s(links, t.pipeline_bytes, crosses, eff)
    if t.pp > 1:
        p2p += sends * (NETWORK_LATENCY_S if crosses else links.intra_node_latency_s)
    dp_step = collective_s(links, t.dp_allreduce_bytes, t.dp_group, t.dp_stride, eff)
    dp_mb = collective_s(links, t.dp_microbatch_bytes, t.dp_group, t.dp_stride, eff)
    return p2p, dp_step, dp_mb


def parts_with(
    t: DpTerms, mb: MicrobatchTime, links: tuple[float, float, float]
) -> tuple[float, float, float, float, float, float, float]:
    """:func:`step_parts` given its :func:`link_parts`."""
    p2p, dp_step, dp_mb = links
    per_microbatch = per_microbatch_s(mb, t.pp, balanced=t.balanced)
    if mb.update_s > 0:
        optimizer = t.stage_layers * mb.update_s * t.optimizer_share
    else:
        optimizer = t.optimizer_bytes / mb.hbm_bytes_s
    slots = t.microbatches + (t.pp - 1) / t.vpp
    row = profile(t.runtime)
    mode = row.dp_overlap if t.pp == 1 else row.dp_overlap_with_pp
    if mode == "every_microbatch":
        exposed = t.microbatches * max(0.0, dp_mb - per_microbatch) + max(0.0, dp_step - per_microbatch)
    elif mode == "last_microbatch":
        exposed = t.microbatches * dp_mb + max(0.0, dp_step - per_microbatch)
    else:
        exposed = t.microbatches * dp_mb + dp_step
    return (
        t.microbatches * per_microbatch,
        (t.pp - 1) / t.vpp * per_microbatch,
        slots * mb.comm_s,
        slots * p2p if t.pp > 1 else 0.0,
        exposed,
        optimizer,
        slots * mb.overhead_s * (t.vpp if t.pp > 1 else 1),
    )


def profiled_point(t: StepTerms, gpu: GpuType, model: StepTimeModel) -> ProfilePoint | None:
    """The measured layer times of ``t``'s shape on ``gpu`` at its tp and micro-batch, if profiled."""
    if not model.profiles or t.shape is None:
        return None
    return model.profiles.point(gpu.name, t.runtime, t.shape, t.tp, t.micro_batch_size)
