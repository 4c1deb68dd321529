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

* **data parallelism** (:func:`collective_s` over the placement's topology): DDP all-reduces the gradients;
  ZeRO-1/2 and Megatron's distributed optimizer reduce-scatter the gradients and all-gather the updated
  parameters (the same bytes, Rajbhandari et al. 2020, Sec. 7); ZeRO-3/FSDP all-gather the parameters for the
  forward and again for the backward and reduce-scatter the gradients, every micro-batch. Overlap per runtime
  (:data:`OVERLAP`): Megatron's overlapped grad reduce and param gather hide behind the last micro-batch's
  backward and the first one's forward; PyTorch DDP's bucketed all-reduce behind the last backward; FSDP2's
  prefetch behind each micro-batch's compute; DeepSpeed's pipeline engine reduces after the flush, exposed;
* **the optimizer step**: memory-bound, reading and writing the fp32 states of the rank's shard at the
  measured device-memory bandwidth.

**Links** (:class:`Links`, built by :func:`frenzy_opt.hardware.topology.links_for` from the topology graph): a GPU's
intra-node bandwidth is half the bidirectional aggregate its spec sheet states; a node's NICs together carry
``nics x nic_gbps / 8`` GB/s per direction. A collective inside one NVLink domain (a node, or a GB200 NVL72
rack) runs a ring over NVLink; one across nodes runs as NCCL would pick, the faster of a flat ring and a
hierarchical all-reduce (intra-node reduce-scatter, inter-node ring, intra-node all-gather; NCCL's "NVLS/tree"
family) -- in both a node pushes about ``2 (N - 1) / N`` times the buffer through its NICs for each of the
groups it hosts (Patarasuk & Yuan 2009; NVIDIA nccl-tests PERFORMANCE.md, "bus bandwidth"). Every link
carries bytes at the share of its wire rate that nccl-tests measured for its link class -- the large-message
all-reduce bus bandwidth over the per-direction rate (data/collectives.yaml, :mod:`frenzy_opt.hardware.
collectives`: 0.78 on A100 NVLink3, 0.82 on H100 NVLink4 with NVLink SHARP off, 0.25 on PCIe boards without
peer-to-peer, where NCCL stages through host memory, 0.96-0.98 on InfiniBand; a class without a measurement
takes its nearest measured sibling's) -- times ``link_efficiency`` (1 unless a profile sets it); and every
tensor-, context- or expert-parallel call and pipeline send first pays the link's measured small-message
latency (:func:`latency_s`; nccl-tests figures in data/collectives.yaml), so the many small collectives of a
small model or an MoE layer are not free.

Fitted parameters (:class:`StepTimeModel`) ship in ``data/steptime-fit.json``, refitted from measured runs
by ``frenzy calibrate FILE.csv`` (:mod:`frenzy_opt.validation.steptime`).
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from typing import Any

from frenzy_opt.core.enums import Precision, Recompute, Runtime
from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.hardware.throughput import achievable
from frenzy_opt.hardware.topology import NETWORK_LATENCY_S, Links
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.prediction import kernels
from frenzy_opt.prediction.marp.layout import DTYPE_BYTES
from frenzy_opt.prediction.profiles import LayerProfile, LayerShape, ProfileIndex, ProfilePoint

__all__ = ["Links", "StepTerms", "StepTime", "StepTimeModel", "collective_s", "step_terms_of", "step_time"]

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

# GPU architectures FlashAttention runs on: Ampere, Ada and Hopper (FlashAttention-2 README, "Requirements":
# Ampere, Ada, or Hopper GPUs) and Blackwell (cuDNN's fused attention); Volta and Turing fall back to eager.
FLASH_ARCHITECTURES = frozenset({"ampere", "ada", "hopper", "blackwell"})

# fp32 optimizer traffic per parameter of the shard: Adam reads and writes master weights and two moments
# and reads the gradient (4 x 2 x 3 + 4 bytes), then writes the 16-bit weight (2 bytes).
OPTIMIZER_BYTES_PER_PARAM = 30

# Bytes per gradient element in the data-parallel reduction, by runtime: Megatron-core reduces in the
# training precision unless --grad-reduce-in-fp32 (Megatron-core DDP config, grad_reduce_in_fp32=False);
# DeepSpeed's fp16 engine all-reduces fp32 gradients ("fp32_allreduce", as the AMP runs state); torchtitan's
# FSDP2 mixed precision reduces in fp32 (torchtitan config, mixed_precision_reduce = "float32").
GRAD_REDUCE_FP32 = {"megatron": False, "deepspeed": True, "fsdp2": True, "hf": False}

# Which part of the data-parallel traffic each runtime hides behind compute (module docstring):
# "last_microbatch" = the last micro-batch's backward (and the first one's forward for the parameter
# all-gather); "every_microbatch" = each micro-batch's own compute (FSDP2 prefetch); "none" = exposed.
# DeepSpeed overlaps its ZeRO reduction with the backward (overlap_comm) but its pipeline engine reduces
# after the flush (DeepSpeed docs, "Pipeline Parallelism": the gradient all-reduce follows the schedule).
OVERLAP = {
    "megatron": "last_microbatch",
    "hf": "last_microbatch",
    "fsdp2": "every_microbatch",
    "deepspeed": "last_microbatch",
}

# DeepSpeed's pipeline engine partitions layers by parameter count, the embedding and output layer
# included (DeepSpeed docs, PipelineModule partition_method="parameters"), so its stages are balanced;
# Megatron and torchtitan give every stage the same number of transformer layers.
BALANCED_STAGES = frozenset({"deepspeed"})

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

# fp8 casting: each element quantised is read in bf16 (2 bytes) and written in fp8 (1 byte).
FP8_CAST_BYTES = 3


def _ring_factor(ranks: int) -> float:
    """Bytes a ring all-reduce moves per rank, per byte of buffer: 2 (n-1)/n (Patarasuk & Yuan 2009)."""
    return 2 * (ranks - 1) / ranks if ranks > 1 else 0.0


def collective_s(links: Links, nbytes: float, group: int, stride: int, efficiency: float) -> float:
    """Seconds of an all-reduce of ``nbytes`` per rank over ``group`` ranks whose consecutive members are
    ``stride`` GPUs apart in the rank order (a reduce-scatter or all-gather is half of it), each link at its
    measured bus-bandwidth share times ``efficiency`` (``StepTimeModel.link_efficiency``).

    Inside one NVLink domain: a ring over the intra-node link. Across nodes: the faster of a flat ring (every
    ring link carries ``2 (n-1)/n`` of the buffer; a node's NICs carry that for each group it hosts) and a
    hierarchical all-reduce (reduce-scatter among the ``k`` members of a node, a ring of the ``1/k`` shards
    across the ``N`` nodes, all-gather back), each node's NICs shared by all its GPUs' groups."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    intra = links.intra_node_bytes_s(efficiency)
    if group * stride <= links.domain or links.nic_gbyte_s <= 0:
        return _ring_factor(group) * nbytes / intra
    nic = links.nic_bytes_s(efficiency)
    per_node = max(1, min(group, links.gpus_per_node // max(stride, 1)))
    nodes = max(group // per_node, 1)
    groups_per_node = links.gpus_per_node / per_node
    ring = max(_ring_factor(group) * nbytes / intra, groups_per_node * _ring_factor(group) * nbytes / nic)
    hierarchical = _ring_factor(per_node) * nbytes / intra + (
        links.gpus_per_node * _ring_factor(nodes) * nbytes / per_node / nic
    )
    return min(ring, hierarchical)


def latency_s(links: Links, group: int, stride: int) -> float:
    """The fixed time of one collective call over ``group`` ranks ``stride`` apart: the intra-node link's
    small-message latency inside one NVLink domain or node, the network's across nodes (topology's measured
    nccl-tests figures)."""
    if group <= 1:
        return 0.0
    if group * stride <= links.domain or links.nic_gbyte_s <= 0:
        return links.intra_node_latency_s
    return NETWORK_LATENCY_S


def p2p_s(links: Links, nbytes: float, crosses_nodes: bool, efficiency: float) -> float:
    """A point-to-point send: over NVLink/PCIe inside a node, else over the node's NICs, which every GPU of
    the node uses at once in the pipeline's steady state."""
    if nbytes <= 0:
        return 0.0
    if crosses_nodes and links.nic_gbyte_s > 0:
        return nbytes / (links.nic_bytes_s(efficiency) / links.gpus_per_node)
    return nbytes / links.intra_node_bytes_s(efficiency)


def all_to_all_s(links: Links, nbytes: float, group: int, stride: int, efficiency: float) -> float:
    """An all-to-all of ``nbytes`` per rank: ``(n-1)/n`` of it leaves the GPU, the share whose peers sit on
    other nodes through the NICs (shared by the node's GPUs)."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    out = nbytes * (group - 1) / group
    intra = out / links.intra_node_bytes_s(efficiency)
    if group * stride <= links.domain or links.nic_gbyte_s <= 0:
        return intra
    per_node = max(1, min(group, links.gpus_per_node // max(stride, 1)))
    off_node = nbytes * (group - per_node) / group
    return max(intra, off_node * links.gpus_per_node / links.nic_bytes_s(efficiency))


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


def peak_tflops(gpu: GpuType, precision: str) -> float:
    """Dense peak of ``gpu`` for ``precision`` (fp32 trains on TF32 tensor cores where they exist)."""
    if precision == Precision.BF16:
        value = gpu.bf16_tflops
    elif precision == Precision.FP8:
        value = gpu.fp8_tflops
    elif precision == Precision.FP32:
        value = gpu.tf32_tflops or gpu.fp32_tflops
    else:
        value = gpu.fp16_tflops
    if value is None:  # no tensor cores for this format: run it at fp16's rate (see candidates.effective_precision)
        value = gpu.fp16_tflops
    return float(value)


def forward_flops_per_token(arch: ModelArch, seq_len: int) -> tuple[float, float]:
    """(dense forward FLOPs per token, the attention core's share), Narayanan et al. 2021, Eq. 3: two FLOPs
    per multiply-add over the active matmul weights (output layer included, embedding lookup not) and
    ``4 s (heads x head_dim)`` per layer for QK^T and attention x V."""
    # Active parameters less the embedding table(s); an untied output layer is among them, a tied one
    # shares the table's weights but multiplies all the same.
    matmul_params = arch.num_active_params - _embedding_params(arch)
    if arch.tied_embeddings:
        matmul_params += arch.vocab_size * arch.hidden_size
    attention = 4.0 * seq_len * arch.num_attention_heads * arch.kv_channels * arch.num_layers
    return 2.0 * matmul_params + attention, attention


def _embedding_params(arch: ModelArch) -> int:
    positions = arch.max_position_embeddings * arch.hidden_size if arch.position_embedding == "learned" else 0
    return arch.vocab_size * arch.hidden_size + positions


def step_flops(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> float:
    """Model FLOPs of one step: forward + 2x backward (+ recomputed forward or attention core)."""
    per_token, attention = forward_flops_per_token(arch, training.seq_len)
    factor = 3.0 * per_token
    if parallel.recompute == Recompute.FULL:
        factor += per_token
    elif parallel.recompute == Recompute.SELECTIVE:
        factor += attention
    return factor * training.global_batch_size * training.seq_len


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
    recomputed forward), input-gradient and weight-gradient GEMM (:func:`_linear_gemms`)."""
    output_gemms: tuple[tuple[float, float, float, float], ...] = ()
    """The output layer's GEMMs per micro-batch on the last stage, ``(m, n, k, count)``."""
    head_dim: int = 128
    seq_len: int = 2048
    operand_bytes: float = 2.0
    """Bytes per GEMM operand element of the linear layers (1 under fp8)."""
    output_bytes: float
    """The output layer's and loss's HBM traffic per micro-batch (fp32 logits)."""
    balanced: bool
    """Stages balanced by cost (:data:`BALANCED_STAGES`)."""
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
    sends (all chunks): each pays a small-message latency (:func:`latency_s`) besides its bytes."""
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

    @property
    def bubble_fraction(self) -> float:
        return (self.pp - 1) / (self.vpp * self.microbatches)

    def evaluate(self, gpu: GpuType, links: Links, model: StepTimeModel, rates: GpuRates | None = None) -> StepTime:
        return evaluate_terms(self, gpu, links, model, rates)


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


def evaluate_terms(
    t: StepTerms, gpu: GpuType, links: Links, model: StepTimeModel, rates: GpuRates | None = None
) -> StepTime:
    """Seconds of ``t`` on ``gpu`` with ``links`` (module docstring); ``rates``: :func:`gpu_rates` of ``gpu``
    for ``t``'s job, read here when not given."""
    if rates is None:
        rates = gpu_rates(gpu, model, precision=t.precision, runtime=t.runtime, head_dim=t.head_dim,
                          seq_len=t.seq_len, eager=t.eager)  # fmt: skip
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
    optimizer = t.optimizer_bytes / hbm
    tp_in_layers = False
    point = profiled_point(t, gpu, model)
    if point is not None:  # measured layer times replace the kernel model's (module profiles' docstring)
        layers = t.stage_layers * point.layer_s(t.recompute_full)
        output = point.output_fwd_s + point.output_bwd_s
        if t.pp == 1:
            output += point.embedding_fwd_s + point.embedding_bwd_s
        if point.update_s > 0:
            optimizer = t.stage_layers * point.update_s * t.optimizer_share
        tp_in_layers = t.shape is not None and model.profiles.includes_tp_comm(gpu.name, t.runtime, t.shape)
    if t.balanced:  # stages balanced by cost: the output layer's time spread over the stages
        per_microbatch = (layers * t.pp + output) / t.pp
    else:  # equal layers per stage, the output layer on the last one
        per_microbatch = layers + output
    eff = model.link_efficiency
    tp_calls, cp_calls, ep_calls, sends = t.collective_calls
    tp = collective_s(links, t.tp_bytes, t.tp, 1, eff) + tp_calls * latency_s(links, t.tp, 1)
    if tp_in_layers:  # measured inside the profiled layer times
        tp = 0.0
    elif t.tp_overlap:  # hidden behind the GEMMs it is pipelined with (Wang et al. 2023, "Overlap communication
        # with dependent computation via decomposition"; Megatron's userbuffers and torchtitan's async TP)
        tp = max(0.0, tp - gemms)
    cp = max(0.0, collective_s(links, t.cp_bytes, t.cp, t.tp, eff) / 2 - (attention if flash else 0))
    cp += cp_calls * latency_s(links, t.cp, t.tp)
    ep = all_to_all_s(links, t.ep_bytes, t.ep, t.tp, eff) + ep_calls * latency_s(links, t.ep, t.tp)
    # Consecutive stages sit on different nodes when one stage fills a node or more.
    crosses = t.num_gpus > links.domain and t.pp_stride >= links.gpus_per_node
    p2p = p2p_s(links, t.pipeline_bytes, crosses, eff)
    if t.pp > 1:
        p2p += sends * (NETWORK_LATENCY_S if crosses else links.intra_node_latency_s)
    overhead = rates.microbatch_overhead_s
    slots = t.microbatches + (t.pp - 1) / t.vpp
    dp_step = collective_s(links, t.dp_allreduce_bytes, t.dp_group, t.dp_stride, eff)
    dp_mb = collective_s(links, t.dp_microbatch_bytes, t.dp_group, t.dp_stride, eff)
    mode = OVERLAP.get(t.runtime, "last_microbatch") if t.pp == 1 or t.runtime != Runtime.DEEPSPEED else "none"
    if mode == "every_microbatch":
        exposed = t.microbatches * max(0.0, dp_mb - per_microbatch) + max(0.0, dp_step - per_microbatch)
    elif mode == "last_microbatch":
        exposed = t.microbatches * dp_mb + max(0.0, dp_step - per_microbatch)
    else:
        exposed = t.microbatches * dp_mb + dp_step
    return StepTime(
        compute_s=t.microbatches * per_microbatch,
        bubble_s=(t.pp - 1) / t.vpp * per_microbatch,
        intra_node_comm_s=slots * (tp + cp + ep),
        pipeline_p2p_s=slots * p2p if t.pp > 1 else 0.0,
        data_parallel_exposed_s=exposed,
        optimizer_s=optimizer,
        model_flops=t.model_flops,
        overhead_s=slots * overhead * (t.vpp if t.pp > 1 else 1),
    )


def profiled_point(t: StepTerms, gpu: GpuType, model: StepTimeModel) -> ProfilePoint | None:
    """The measured layer times of ``t``'s shape on ``gpu`` at its tp and micro-batch, if profiled."""
    if not model.profiles or t.shape is None:
        return None
    return model.profiles.point(gpu.name, t.runtime, t.shape, t.tp, t.micro_batch_size)


STEP_TERMS_CACHE = 8192
"""Entries of :func:`cached_step_terms` (a design choice: more than the candidates with a plan in the largest
benchmarked search, ``benchmarks/plan_enumeration.py`` at 4,096 GPUs per type; a few kB each)."""


def step_terms(job: JobSpec) -> StepTerms:
    """:class:`StepTerms` of ``job`` at its parallel config and micro-batch (module docstring)."""
    return step_terms_of(job.model, job.training, job.parallel)


def _layer_linear_dims(arch: ModelArch, tp: int) -> tuple[float, float]:
    """(linear weights per layer on one tp rank, the sum of the linears' input and output widths) for the
    active path of one token: the linears of :func:`_layer_linears` weighted by the share of a token that
    passes each (an MoE layer's routed experts ``moe_top_k`` times in all); the router counts among the
    weights, not the widths."""
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
        if t.runtime == Runtime.MEGATRON:
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
    grad = 4 if GRAD_REDUCE_FP32.get(t.runtime, False) or t.precision == Precision.FP32 else act
    fsdp = p.zero_stage >= 3 or t.runtime == Runtime.FSDP2
    dp_step = dp_mb = 0.0
    if fsdp:
        # Two parameter all-gathers (forward, backward) and a gradient reduce-scatter per micro-batch:
        # each half an all-reduce's volume.
        dp_mb = (2 * act + grad) / 2 * params
    elif p.zero_stage >= 1:
        dp_step = (grad + act) / 2 * params  # reduce-scatter gradients, all-gather parameters
    else:
        dp_step = grad * params
    sharded = p.zero_stage >= 1 or t.runtime == Runtime.FSDP2
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
        balanced=t.runtime in BALANCED_STAGES,
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
    )


def step_time(job: JobSpec, gpu: GpuType, links: Links, model: StepTimeModel) -> StepTime:
    """:class:`StepTime` of ``job`` (its parallel config and micro-batch) on ``gpu`` with ``links``."""
    return step_terms(job).evaluate(gpu, links, model)
