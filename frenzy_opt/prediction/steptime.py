"""Step-time model: seconds per training step of a job at a parallel config on a GPU type and its links.

The step is priced on the pipeline rank that limits it (the last stage: its layers plus the output layer and
loss), after Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", Sec. 2-3). One micro-batch on that rank costs

* **matmuls**: every linear layer's forward, input-gradient and weight-gradient GEMM by its shape (a
  recomputed forward under full recompute; Narayanan et al. 2021, Sec. 5.1), each priced by
  :func:`frenzy_opt.prediction.kernels.gemm_s` on the GPU type's *measured* large-GEMM rate for the format
  (data/kernel-throughput.yaml: maximum-achievable-matmul tables, each figure cited) with tile and wave
  quantization over its SMs, split-K for few tiles, the roofline's memory side (Williams et al. 2009) and a
  launch floor per kernel -- so a small hidden size or micro-batch reaches a smaller fraction of the rate,
  and a GPU type the calibration runs never used is priced by its own measurements. The runtime's share of
  those rates (its libraries) is the one fitted factor (``gemm_efficiency``);
* **attention core**: FlashAttention where the GPU supports it (Ampere and later, Dao 2023, "FlashAttention-2",
  Sec. 1; causal masking skips half the blocks, backward 2.5x the forward with its recompute) at the rate
  FlashAttention's benchmark tables measured for the runtime's kernel and the head dimension
  (:func:`frenzy_opt.prediction.kernels.flash_tflops`), else eager
  attention: QK^T and attention x V as matmuls plus the score matrix ``b a s^2`` written and read by the
  mask, softmax and dropout at HBM speed (Dao et al. 2022, "FlashAttention", Sec. 2.2: standard attention
  is memory-bound on that matrix);
* **fp8** (Transformer Engine, torchao float8): only the linear layers run at the measured fp8 rate (times
  a fitted ratio, 1 when fp8 GEMMs reach the same share of their rate as bf16 ones); the attention core, the
  output layer and every elementwise op stay in bf16, and each fp8 GEMM first casts its input, its weight and
  (backward) its output gradient -- a read of
  2 bytes and a write of 1 per element at HBM speed (NVIDIA Transformer Engine docs, "Using FP8 with
  Transformer Engine": inputs and weights are quantised per GEMM; Micikevicius et al. 2022, "FP8 Formats for
  Deep Learning", Sec. 4);
* **elementwise work** (norms, residual adds, activation functions, dropout, rotary, bias): a fitted number
  of passes over the layer's activations at the measured device-memory bandwidth, and a fitted fixed cost
  per layer (kernel launches, ~5-10 us each for some 20-40 kernels per layer forward and
  backward; NVIDIA CUDA C++ Best Practices Guide, "Kernel launch overhead") -- what makes 1B-class models
  far slower than their FLOPs;
* **tensor, context and expert parallelism**: two all-reduces of the block's activations forward and two
  backward per block (Shoeybi et al. 2019, Fig. 4; the volume of sequence parallelism's all-gathers and
  reduce-scatters, Korthikanti et al. 2022), exposed unless ``training.tp_comm_overlap`` (Megatron's
  ``--tp-comm-overlap``, torchtitan's async TP) hides them behind the linear layers' GEMMs; ring
  attention's k/v passes around the cp ring, hidden behind the attention core where it is long enough
  (Liu et al. 2023); MoE dispatch and combine all-to-alls (Lepikhin et al. 2020);
* **pipeline parallelism**: the 1F1B bubble adds ``(pp - 1) / vpp`` micro-batch times (Sec. 2.2), each
  micro-batch sends its activations forward and gradient back (``vpp`` times with interleaving), and each
  pipeline slot pays a fitted per-micro-batch scheduling cost of the runtime.

Per step, after the micro-batches:

* **data parallelism** (:func:`~frenzy_opt.prediction.comms.collective_s` over the placement's topology): DDP
  all-reduces the gradients; ZeRO-1/2 and Megatron's distributed optimizer reduce-scatter the gradients and
  all-gather the updated parameters (the same bytes, Rajbhandari et al. 2020, Sec. 7); ZeRO-3/FSDP all-gather the
  parameters for the forward and again for the backward and reduce-scatter the gradients, every micro-batch. Overlap
  per runtime (``RuntimeProfile.dp_overlap``): Megatron's overlapped grad reduce and param gather
  hide behind the last micro-batch's backward and the first one's forward; PyTorch DDP's bucketed all-reduce behind
  the last backward; FSDP2's prefetch behind each micro-batch's compute; DeepSpeed's pipeline engine reduces after
  the flush, exposed;
* **the optimizer step**: memory-bound, reading and writing the fp32 states of the rank's shard at the
  measured device-memory bandwidth.

**Links** (:class:`~frenzy_opt.hardware.topology.Links`, built by :func:`frenzy_opt.hardware.topology.links_for`
from the topology graph): a GPU's intra-node bandwidth is half the bidirectional aggregate its spec sheet states; a
node's NICs together carry ``nics x nic_gbps / 8`` GB/s per direction. A collective inside one NVLink domain (a
node, or a GB200 NVL72 rack) runs a ring over NVLink; one across nodes runs as NCCL would pick, the faster of a flat
ring and a hierarchical all-reduce (intra-node reduce-scatter, inter-node ring, intra-node all-gather; NCCL's
"NVLS/tree" family) -- in both a node pushes about ``2 (N - 1) / N`` times the buffer through its NICs for each of
the groups it hosts (Patarasuk & Yuan 2009; NVIDIA nccl-tests PERFORMANCE.md, "bus bandwidth"). Every link carries
bytes at the share of its wire rate that nccl-tests measured for its link class -- the large-message all-reduce bus
bandwidth over the per-direction rate (data/collectives.yaml, :mod:`frenzy_opt.hardware.collectives`: 0.78 on A100
NVLink3, 0.82 on H100 NVLink4 with NVLink SHARP off, 0.25 on PCIe boards without peer-to-peer, where NCCL stages
through host memory, 0.96-0.98 on InfiniBand; a class without a measurement takes its nearest measured sibling's) --
times ``link_efficiency`` (1 unless a profile sets it); and every tensor-, context- or expert-parallel call and
pipeline send first pays the link's measured small-message latency (:func:`~frenzy_opt.prediction.comms.latency_s`;
nccl-tests figures in data/collectives.yaml), so the many small collectives of a small model or an MoE layer are not
free.

Fitted parameters (:class:`StepTimeModel`) ship in ``data/steptime-fit.json``, refitted from measured runs
by ``frenzy calibrate FILE.csv`` (:mod:`frenzy_opt.validation.steptime_validation`).

This module holds those parameters (:class:`StepTimeModel`, :func:`shipped_model`) and :func:`step_time`, a
job's step time. The model's parts: the step's volumes (:mod:`frenzy_opt.prediction.stepterms`), their
seconds on a GPU type (:mod:`frenzy_opt.prediction.stepeval`), collectives and sends
(:mod:`frenzy_opt.prediction.comms`), model FLOPs (:mod:`frenzy_opt.prediction.flops`).
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from typing import Any

from frenzy_opt.core.spec import JobSpec
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.hardware.topology import Links
from frenzy_opt.prediction.profiles import LayerProfile, ProfileIndex
from frenzy_opt.prediction.stepeval import StepTime
from frenzy_opt.prediction.stepterms import step_terms

__all__ = ["StepTimeModel", "cv_log_residuals", "shipped_model", "step_time"]


# A multiplier on the measured bus-bandwidth shares of the links (Links.intra_node_share, Links.nic_share,
# from the nccl-tests figures of data/collectives.yaml): 1 = collectives run as nccl-tests measured them.
LINK_EFFICIENCY = 1.0

# The fraction of the kernel model's time a runtime's GEMMs reach (module docstring): 1 = as measured by
# the throughput tables (data/kernel-throughput.yaml, :mod:`frenzy_opt.prediction.kernels`). The fit keeps
# one value for every GPU (key "*"), so a GPU type the fit never saw is priced by its own measurements.
DEFAULT_EFFICIENCY = 1.0
# The most an efficiency may be: the measured maxima are a shape search's at the benchmark's clocks, and a
# tuned runtime or a higher-clocked part can beat them somewhat; a fit that ends here is a finding.
MAX_RELATIVE_EFFICIENCY = 1.5


# Starting value of the elementwise HBM passes per layer forward: LayerNorm (read, write), bias-dropout-add
# twice (read 3, write 2), the activation function (read, write), rotary or bias and the residual stream --
# about 12 passes over the hidden activations (Korthikanti et al. 2022, Sec. 4.1 counts the same tensors).
ELEMENTWISE_PASSES = 12.0
# Starting value of the fixed cost per layer and micro-batch: some 40 kernels forward and backward at about
# 5 us of launch each (CUDA C++ Best Practices Guide, "Kernel launch overhead").
LAYER_OVERHEAD_S = 2e-4
# FlashAttention runs at the rate measured for its kernel (:func:`kernels.flash_tflops`); this multiplier
# stays 1 unless a calibration sets it.
ATTENTION_EFFICIENCY = 1.0
PER_RUNTIME_DEFAULTS = {
    "elementwise_passes": ELEMENTWISE_PASSES,
    "attention_efficiency": ATTENTION_EFFICIENCY,
    "layer_overhead_s": LAYER_OVERHEAD_S,
    "microbatch_overhead_s": 0.0,
    "gemm_efficiency": DEFAULT_EFFICIENCY,
}


FIT_PATH = "data/steptime-fit.json"
# The fewest cross-validated runs of one architecture that give it a band of its own.
MIN_BAND_RUNS = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimeModel:
    """The model's fitted parameters (module docstring)."""

    efficiency: dict[str, float] = field(default_factory=dict)
    """The fraction of the kernel model's GEMM rate reached, keyed by GPU type and number format
    (``"T4@fp16"``), GPU type (``"H100-SXM5-80GB"``), architecture (``"hopper"``) or ``"*"`` (every GPU);
    the most specific key wins, else :data:`DEFAULT_EFFICIENCY`."""
    link_efficiency: float = LINK_EFFICIENCY
    """A multiplier on every link's measured bus-bandwidth share (:data:`LINK_EFFICIENCY`, 1: as nccl-tests
    measured it); not fitted. Kept so stored profiles load: one written before the measured shares holds 0.8,
    then the share of the wire itself, which read now discounts the measured share again -- refit it with
    ``frenzy calibrate``."""
    fp8_efficiency: float = 1.0
    """fp8 GEMMs' fraction of the measured fp8 rate over the bf16 GEMMs' fraction of the bf16 rate."""
    elementwise_passes: dict[str, float] = field(default_factory=dict)
    """HBM passes over a layer's activations (``tokens x (hidden + ffn/4)`` elements per tp rank) per
    forward, by runtime (fused kernels in Megatron and Transformer Engine, one kernel per op in eager
    PyTorch); the backward makes twice as many. A runtime without a fit takes the mean of the fitted ones,
    else :data:`ELEMENTWISE_PASSES`."""
    attention_efficiency: dict[str, float] = field(default_factory=dict)
    """FlashAttention's fraction of the GEMM efficiency, by runtime: the kernels differ (FlashAttention-2,
    which PyTorch's SDPA runs, reaches about 35 % of the H100 peak, cuDNN's and FlashAttention-3's Hopper
    kernels about 75 %: Shah et al. 2024, Sec. 1); a runtime without a fit takes the mean of the fitted
    ones, else :data:`ATTENTION_EFFICIENCY`."""
    layer_overhead_s: dict[str, float] = field(default_factory=dict)
    """Fixed seconds per layer and micro-batch, forward and backward (kernel launches and framework work),
    by runtime; a runtime without a fit takes the mean of the fitted ones, else :data:`LAYER_OVERHEAD_S`."""
    microbatch_overhead_s: dict[str, float] = field(default_factory=dict)
    """Per-micro-batch, per-pipeline-slot scheduling seconds by runtime (absent: 0)."""
    gemm_efficiency: dict[str, float] = field(default_factory=dict)
    """The fraction of the measured kernel rates a runtime's GEMMs and attention reach, by runtime (its
    libraries: Transformer Engine and cuBLASLt with tuned epilogues in Megatron, PyTorch's eager kernels
    elsewhere); a property of the software, not of the GPU, so it transfers to GPU types the fit never saw.
    A runtime without a fit takes the mean of the fitted ones, else :data:`DEFAULT_EFFICIENCY`."""
    residuals: tuple[float, ...] = ()
    """Cross-validated ``log(measured / predicted)`` of the runs the parameters were fitted on: the
    prediction band (:meth:`band`) and the simulator's noisy truth draw from them."""
    residuals_by_architecture: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """The same residuals split by the runs' GPU architecture (a T4's errors say little about an H100's)."""
    layer_profiles: tuple[LayerProfile, ...] = ()
    """Measured layer times (``frenzy profile``; :mod:`frenzy_opt.prediction.profiles`): a job whose GPU type,
    runtime and layer shape match one is priced from it instead of the kernel model."""
    profiles: ProfileIndex = field(init=False, repr=False, compare=False)
    """``layer_profiles`` indexed for lookup."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "profiles", ProfileIndex(self.layer_profiles))

    def efficiency_of(self, gpu: GpuType, precision: str | None = None) -> float:
        """The most specific fitted efficiency (GPU and format, GPU, architecture), else the default."""
        if precision is not None and f"{gpu.name}@{precision}" in self.efficiency:
            return self.efficiency[f"{gpu.name}@{precision}"]
        if gpu.name in self.efficiency:
            return self.efficiency[gpu.name]
        if gpu.architecture in self.efficiency:
            return self.efficiency[gpu.architecture]
        return self.efficiency.get("*", DEFAULT_EFFICIENCY)

    def per_runtime(self, name: str, runtime: str) -> float:
        """``runtime``'s entry of the per-runtime table ``name`` (``elementwise_passes``,
        ``attention_efficiency``, ``layer_overhead_s``, ``microbatch_overhead_s``, ``gemm_efficiency``); else the
        entry for every runtime (key ``"*"``); else the mean of the fitted entries; else the starting value
        (:data:`PER_RUNTIME_DEFAULTS`)."""
        table: dict[str, float] = getattr(self, name)
        if runtime in table:
            return table[runtime]
        if "*" in table:
            return table["*"]
        if table:
            return statistics.fmean(table.values())
        return PER_RUNTIME_DEFAULTS[name]

    def with_efficiency(self, key: str, value: float, precision: str | None = None) -> StepTimeModel:
        if not 0 < value <= MAX_RELATIVE_EFFICIENCY:
            raise ValueError(f"efficiency of {key} must be in (0, {MAX_RELATIVE_EFFICIENCY:g}], got {value}")
        name = key if precision is None else f"{key}@{precision}"
        return replace(self, efficiency={**self.efficiency, name: value})

    def step_time(self, job: JobSpec, gpu: GpuType, links: Links | None = None) -> StepTime:
        return step_time(job, gpu, links or Links.for_gpu(gpu), self)

    def band(self, seconds: float, architecture: str | None = None) -> tuple[float, float]:
        """(p10, p90) of the step time given the point prediction, from the cross-validated residuals of
        the GPU's architecture when there are at least :data:`MIN_BAND_RUNS` of them, else of every run."""
        low, high = self.band_factors(architecture)
        return seconds * low, seconds * high

    def band_factors(self, architecture: str | None = None) -> tuple[float, float]:
        """The factors :meth:`band` multiplies the point prediction by, (p10, p90); (1.0, 1.0) without
        residuals (a plan search reads them once per architecture instead of sorting the pool per plan)."""
        pool = self.residuals_by_architecture.get(architecture or "", ())
        if len(pool) < MIN_BAND_RUNS:
            pool = self.residuals
        if not pool:
            return 1.0, 1.0
        ordered = sorted(pool)
        return math.exp(_quantile(ordered, 0.1)), math.exp(_quantile(ordered, 0.9))

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        out["layer_profiles"] = [p.to_dict() for p in self.layer_profiles]
        out["residuals"] = [round(r, 6) for r in self.residuals]
        out["residuals_by_architecture"] = {
            k: [round(r, 6) for r in v] for k, v in sorted(self.residuals_by_architecture.items())
        }
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> StepTimeModel:
        known = {f.name for f in fields(StepTimeModel) if f.init}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"step-time parameters: unknown field(s) {', '.join(unknown)}; allowed: {sorted(known)}")
        values = dict(data)
        if "residuals" in values:
            values["residuals"] = tuple(float(r) for r in values["residuals"])
        if "residuals_by_architecture" in values:
            values["residuals_by_architecture"] = {
                str(k): tuple(float(r) for r in v) for k, v in values["residuals_by_architecture"].items()
            }
        if "layer_profiles" in values:
            values["layer_profiles"] = tuple(LayerProfile.from_dict(p) for p in values["layer_profiles"] or ())
        return StepTimeModel(**values)


def _quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolation quantile of sorted values (numpy's default "linear" method)."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@functools.cache
def shipped_model() -> StepTimeModel:
    """The parameters fitted on the published measured runs (``data/steptime-fit.json``); the defaults when
    the file is absent."""
    path = resources.files("frenzy_opt").joinpath(FIT_PATH)
    if not path.is_file():
        return StepTimeModel()
    data = json.loads(path.read_text(encoding="utf-8"))
    return StepTimeModel.from_dict(data["parameters"])


def cv_log_residuals() -> tuple[float, ...]:
    """The shipped fit's leave-one-source-out ``log(measured / predicted)`` per calibration run."""
    return shipped_model().residuals


def step_time(job: JobSpec, gpu: GpuType, links: Links, model: StepTimeModel) -> StepTime:
    """:class:`StepTime` of ``job`` (its parallel config and micro-batch) on ``gpu`` with ``links``."""
    return step_terms(job).evaluate(gpu, links, model)
