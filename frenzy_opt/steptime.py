"""Step-time model: seconds per training step of a job at a parallel config on a GPU type and its links.

The step of one pipeline rank is modelled after Narayanan et al. 2021 ("Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", Sec. 2-3):

* compute: model FLOPs (Sec. 5.1, Eq. 3: 2 FLOPs per multiply-add, backward twice the forward, plus the
  recomputed forward under full recompute and the attention core under selective recompute) divided over
  the tp x pp x cp x dp GPUs, at the GPU's dense peak for the precision times an achievable-efficiency
  factor per GPU type (calibratable from measured step times, :func:`fit_efficiency`);
* tensor parallelism: two all-reduces of the block's activations in forward and two in backward per block
  (Shoeybi et al. 2019, Fig. 4; the same volume as sequence parallelism's all-gathers and reduce-scatters,
  Korthikanti et al. 2022), ring all-reduce time ``2 (t-1)/t x bytes / bandwidth`` (Patarasuk & Yuan 2009)
  over the intra-node link, not overlapped;
* pipeline parallelism: the 1F1B bubble adds ``(pp - 1) / vpp`` micro-batch times (Sec. 2.2), and each
  micro-batch sends its activations forward and its gradient back between stages;
* context and expert parallelism: ring attention passes the k/v shards around the cp ring (Liu et al. 2023);
  MoE layers do two all-to-alls forward and two backward (Lepikhin et al. 2020);
* data parallelism: the gradient all-reduce (ZeRO-1/2: reduce-scatter + all-gather, the same volume; ZeRO-3
  and FSDP 1.5x, Rajbhandari et al. 2020, Sec. 7) over the slowest link of the placement, overlapped with the
  last micro-batch's backward pass (PyTorch DDP / Megatron ``overlap_grad_reduce``), the rest exposed;
* the optimizer step: memory-bound, reading and writing the fp32 states of the rank's shard at HBM speed.

Links: a GPU type's ``intra_node_gbps`` is the bidirectional aggregate its spec sheet states, so a ring
sees half of it in each direction; the cluster's ``inter_node_gbps`` is gigabits per second per node.
Collectives reach ``LINK_EFFICIENCY`` of the wire speed (nccl-tests bus bandwidth on NVLink and InfiniBand).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from frenzy_opt.gpus import GpuType
from frenzy_opt.marp.layout import DTYPE_BYTES
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.spec import JobSpec, ParallelConfig, TrainingConfig

# nccl-tests report bus bandwidths of about 80 % of the link rate for large messages (NVIDIA nccl-tests
# PERFORMANCE.md; e.g. ~235 GB/s on A100 NVLink3's 300 GB/s per direction).
LINK_EFFICIENCY = 0.8

# Achievable fraction of the dense tensor-core peak for large transformer GEMMs, by architecture. Starting
# values: Megatron-LM reaches 44-52 % of the A100 peak end to end including communication and bubbles
# (Narayanan et al. 2021, Table 1), i.e. about 60 % in the matmuls; consumer and older parts sustain less
# (Sia's and Sailor's per-GPU profiles). Refit per GPU type with :func:`fit_efficiency`.
DEFAULT_EFFICIENCY = {"volta": 0.45, "turing": 0.40, "ampere": 0.60, "ada": 0.45, "hopper": 0.55, "blackwell": 0.50}

# fp32 optimizer traffic per parameter of the shard: Adam reads and writes master weights and two moments
# and reads the gradient (4 x 2 x 3 + 4 bytes), then writes the 16-bit weight (2 bytes).
OPTIMIZER_BYTES_PER_PARAM = 30


@dataclass(frozen=True, slots=True, kw_only=True)
class Links:
    """Bandwidths one placement sees, in GB/s per direction, before ``LINK_EFFICIENCY``."""

    intra_node_gbs: float
    """GPU to GPU inside a node (NVLink or PCIe)."""
    data_parallel_gbs: float
    """The slowest link a data-parallel ring crosses (inter-node when it spans nodes)."""
    pipeline_gbs: float
    """The link between consecutive pipeline stages (inter-node when stages span nodes)."""

    @staticmethod
    def for_gpu(
        gpu: GpuType, *, inter_node_gbps: float | None = None, gpus_per_node: int = 8, intra_node: str | None = None
    ) -> Links:
        """Links of a placement on ``gpu``: tensor-parallel groups inside a node; data-parallel and pipeline
        traffic inside the node when ``inter_node_gbps`` is None, else over the network, each node's NIC
        shared by its GPUs. ``intra_node="pcie"`` overrides an NVLink part's default (a PCIe-only server)."""
        spec = gpu.pcie_gbps if intra_node == "pcie" else gpu.intra_node_gbps
        intra = spec / 2
        if inter_node_gbps is None:
            return Links(intra_node_gbs=intra, data_parallel_gbs=intra, pipeline_gbs=intra)
        network = inter_node_gbps / 8 / max(gpus_per_node, 1)
        return Links(intra_node_gbs=intra, data_parallel_gbs=min(intra, network), pipeline_gbs=min(intra, network))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    """Seconds of one step, by part; ``total_s`` is the step time."""

    compute_s: float
    bubble_s: float
    intra_node_comm_s: float
    """Tensor-, context- and expert-parallel collectives (not overlapped)."""
    pipeline_p2p_s: float
    data_parallel_exposed_s: float
    optimizer_s: float
    model_flops: float
    """Model FLOPs of the whole step over all GPUs (Narayanan et al. 2021, Eq. 3 with the recompute chosen)."""

    @property
    def total_s(self) -> float:
        return (
            self.compute_s
            + self.bubble_s
            + self.intra_node_comm_s
            + self.pipeline_p2p_s
            + self.data_parallel_exposed_s
            + self.optimizer_s
        )

    def tflops_per_gpu(self, num_gpus: int) -> float:
        """Achieved model TFLOP/s per GPU, the figure Megatron-LM reports."""
        return self.model_flops / self.total_s / num_gpus / 1e12


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimeModel:
    """The model's parameters: achievable compute efficiency per GPU type (falling back to the
    architecture default) and the collective link efficiency."""

    efficiency: dict[str, float] = field(default_factory=dict)
    """Keyed ``"GPU@precision"`` (a fit for one number format) or ``"GPU"`` (any format)."""
    link_efficiency: float = LINK_EFFICIENCY

    def efficiency_of(self, gpu: GpuType, precision: str | None = None) -> float:
        """The fitted efficiency for ``precision`` if any, else for the GPU, else its architecture's default."""
        if precision is not None and f"{gpu.name}@{precision}" in self.efficiency:
            return self.efficiency[f"{gpu.name}@{precision}"]
        return self.efficiency.get(gpu.name, DEFAULT_EFFICIENCY.get(gpu.architecture, 0.5))

    def with_efficiency(self, gpu_name: str, value: float, precision: str | None = None) -> StepTimeModel:
        if not 0 < value <= 1:
            raise ValueError(f"efficiency of {gpu_name} must be in (0, 1], got {value}")
        key = gpu_name if precision is None else f"{gpu_name}@{precision}"
        return StepTimeModel(efficiency={**self.efficiency, key: value}, link_efficiency=self.link_efficiency)

    def step_time(self, job: JobSpec, gpu: GpuType, links: Links | None = None) -> StepTime:
        return step_time(job, gpu, links or Links.for_gpu(gpu), self)


def peak_tflops(gpu: GpuType, precision: str) -> float:
    """Dense peak of ``gpu`` for ``precision`` (fp32 trains on TF32 tensor cores where they exist)."""
    if precision == "bf16":
        value = gpu.bf16_tflops
    elif precision == "fp8":
        value = gpu.fp8_tflops
    elif precision == "fp32":
        value = gpu.tf32_tflops or gpu.fp32_tflops
    else:
        value = gpu.fp16_tflops
    if value is None:  # no tensor cores for this format: run it at fp16's rate (see plans.effective_precision)
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
    if parallel.recompute == "full":
        factor += per_token
    elif parallel.recompute == "selective":
        factor += attention
    return factor * training.global_batch_size * training.seq_len


def _ring_factor(ranks: int) -> float:
    """Bytes a ring all-reduce moves per rank, per byte of buffer: 2 (n-1)/n (Patarasuk & Yuan 2009)."""
    return 2 * (ranks - 1) / ranks if ranks > 1 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTerms:
    """The GPU-independent volumes of one step of a job at one parallel config: FLOPs per GPU and bytes
    per link class. :meth:`evaluate` turns them into seconds on a GPU type and its links."""

    model_flops: float
    flops_per_gpu: float
    bubble_fraction: float
    """Bubble time over compute time: (pp - 1) / (vpp x micro-batches)."""
    microbatch_fraction: float
    """One micro-batch's share of the compute: 1 / micro-batches (the backward that hides dp traffic)."""
    intra_node_bytes: float
    """Tensor-, context- and expert-parallel traffic per GPU, bytes over the intra-node link."""
    pipeline_bytes: float
    data_parallel_bytes: float
    optimizer_bytes: float
    precision: str

    def evaluate(self, gpu: GpuType, links: Links, model: StepTimeModel) -> StepTime:
        rate = peak_tflops(gpu, self.precision) * 1e12 * model.efficiency_of(gpu, self.precision)
        compute = self.flops_per_gpu / rate
        eff = model.link_efficiency * 1e9
        data_parallel = self.data_parallel_bytes / (links.data_parallel_gbs * eff)
        # Overlapped with the last micro-batch's backward (two thirds of its compute).
        exposed = max(0.0, data_parallel - 2 / 3 * compute * self.microbatch_fraction)
        return StepTime(
            compute_s=compute,
            bubble_s=compute * self.bubble_fraction,
            intra_node_comm_s=self.intra_node_bytes / (links.intra_node_gbs * eff),
            pipeline_p2p_s=self.pipeline_bytes / (links.pipeline_gbs * eff),
            data_parallel_exposed_s=exposed,
            optimizer_s=self.optimizer_bytes / (gpu.hbm_gbps * 1e9),
            model_flops=self.model_flops,
        )


def step_terms(job: JobSpec) -> StepTerms:
    """:class:`StepTerms` of ``job`` at its parallel config and micro-batch (module docstring)."""
    return step_terms_of(job.model, job.training, job.parallel)


def step_terms_of(arch: ModelArch, t: TrainingConfig, p: ParallelConfig) -> StepTerms:
    """:func:`step_terms` from the parts of a job spec."""
    microbatches = max(t.global_batch_size // (t.micro_batch_size * p.dp), 1)
    flops = step_flops(arch, t, p)
    act_bytes = DTYPE_BYTES["bf16" if t.precision == "fp8" else t.precision]
    tokens = t.micro_batch_size * math.ceil(t.seq_len / p.cp)
    block_bytes = act_bytes * tokens * arch.hidden_size
    layers = arch.num_layers / p.pp
    # Two all-reduces forward and two backward per block (two more for a recomputed forward).
    collectives = 4 + (2 if p.recompute == "full" else 0)
    intra = microbatches * layers * collectives * _ring_factor(p.tp) * block_bytes
    if p.cp > 1:
        # Ring attention passes k and v around the ring forward, and again with their gradients backward.
        kv = 2 * act_bytes * tokens * max(arch.num_kv_heads // p.tp, 1) * arch.kv_channels
        intra += microbatches * layers * 3 * (p.cp - 1) * kv
    if arch.is_moe and p.ep > 1:
        # Dispatch and combine all-to-alls, forward and backward, of the routed copies of the tokens.
        intra += microbatches * layers * 4 * block_bytes * arch.moe_top_k * (p.ep - 1) / p.ep
    pipeline = 0.0
    if p.pp > 1:
        boundary = block_bytes / (p.tp if p.sequence_parallel else 1)
        pipeline = 2 * (microbatches + p.pp - 1) * p.vpp * boundary
    params = arch.num_params / (p.tp * p.pp * (p.ep if arch.is_moe else 1))
    sharded = p.zero_stage >= 1 or t.runtime == "fsdp2"
    grad_bytes = params * (4 if t.runtime in ("megatron", "fsdp2") and t.precision != "fp32" else act_bytes)
    data_parallel = _ring_factor(p.dp) * grad_bytes * (1.5 if p.zero_stage >= 3 or t.runtime == "fsdp2" else 1.0)
    return StepTerms(
        model_flops=flops,
        flops_per_gpu=flops / p.num_gpus,
        bubble_fraction=(p.pp - 1) / (p.vpp * microbatches),
        microbatch_fraction=1 / microbatches,
        intra_node_bytes=intra,
        pipeline_bytes=pipeline,
        data_parallel_bytes=data_parallel,
        optimizer_bytes=params / (p.dp if sharded else 1) * OPTIMIZER_BYTES_PER_PARAM,
        precision=t.precision,
    )


def step_time(job: JobSpec, gpu: GpuType, links: Links, model: StepTimeModel) -> StepTime:
    """:class:`StepTime` of ``job`` (its parallel config and micro-batch) on ``gpu`` with ``links``."""
    return step_terms(job).evaluate(gpu, links, model)


def fit_efficiency(measurements: list[tuple[JobSpec, GpuType, Links, float]], model: StepTimeModel) -> float:
    """Least-squares efficiency for one GPU type from measured step times (seconds).

    The step time is piecewise linear in ``x = 1/efficiency`` (compute, bubble and the backward that hides
    data-parallel traffic scale with ``x``; the rest does not; the exposed share switches regime at a kink),
    so ``x`` is fitted by Gauss-Newton: linearise each measurement at the current ``x``, solve the linear
    least squares, repeat until ``x`` settles (exact in one step inside one regime).
    """
    if not measurements:
        raise ValueError("fit_efficiency needs at least one measurement")
    terms = [(step_terms(job), gpu, links, measured) for job, gpu, links, measured in measurements]
    x = 1 / model.efficiency_of(terms[0][1])
    for _ in range(50):
        num = den = 0.0
        for term, gpu, links, measured in terms:
            current = term.evaluate(gpu, links, model.with_efficiency(gpu.name, 1 / x))
            ideal = term.flops_per_gpu / (peak_tflops(gpu, term.precision) * 1e12)  # compute at efficiency 1
            slope = ideal * (1 + term.bubble_fraction)
            if current.data_parallel_exposed_s > 0:
                slope -= 2 / 3 * ideal * term.microbatch_fraction
            intercept = current.total_s - slope * x
            num += slope * (measured - intercept)
            den += slope * slope
        x_new = num / den
        if x_new < 1:
            raise ValueError(f"measured step times imply efficiency {1 / x_new:.2f} > 1: check the inputs")
        if abs(x_new - x) <= 1e-12 * x:
            return 1 / x_new
        x = x_new
    return 1 / x
