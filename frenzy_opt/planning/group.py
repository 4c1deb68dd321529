"""GPU groups: the GPU types of a cluster that share one plan search, and how a candidate becomes their plans.

GPU types that run a job at the same precision, with the same node size, GPU count and attention kernel
share one search (:func:`gpu_groups`): a candidate's memory model is built once for them and only the
bound's GPU-dependent parts (workspaces, NCCL buffers, the elastic cache's cap) and the step time are
evaluated per GPU (:meth:`GpuGroup.plans_of`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from frenzy_opt.core.enums import Precision
from frenzy_opt.core.plan import Plan
from frenzy_opt.core.spec import PARALLEL_FIELDS, SPLIT_FIELDS, JobSpec, ParallelConfig, TrainingConfig
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.hardware.topology import links_for
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.planning.candidates import attention_on, describe_layout, effective_precision
from frenzy_opt.prediction.marp.bound import (
    MemoryBound,
    allocator_reserve_bytes,
    library_workspace_bytes,
    nccl_buffer_bytes,
)
from frenzy_opt.prediction.marp.fit import MemoryFit
from frenzy_opt.prediction.marp.predictor import (
    CudaTerms,
    StageModel,
    cuda_totals,
    layer_counts,
    peak_stages,
    stage_bound,
    stage_model_of,
)
from frenzy_opt.prediction.steptime import StepTimeModel, cached_step_terms, gpu_rates


class PeakCache:
    """Stage models per candidate without its dp (they do not depend on it), so the dp scan only
    re-evaluates the dp-dependent terms. Stages are built lazily: once the first stage alone exceeds the
    largest GPU, the last stage is not needed."""

    def __init__(self, arch: ModelArch, training: TrainingConfig) -> None:
        self._arch = arch
        self._training = {training.micro_batch_size: training}
        self._base = training
        self._models: dict[tuple[object, ...], dict[int, StageModel | None]] = {}

    def training(self, micro_batch_size: int) -> TrainingConfig:
        training = self._training.get(micro_batch_size)
        if training is None:
            training = self._training[micro_batch_size] = replace(self._base, micro_batch_size=micro_batch_size)
        return training

    def allocated(
        self, p: ParallelConfig, micro_batch_size: int, capacity: int
    ) -> tuple[int, list[tuple[StageModel, tuple[int, int]]]]:
        """Peak allocated bytes over the stages that can hold the peak, or a first-stage figure already
        above ``capacity`` bytes (then the candidate fits nowhere and the exact peak does not matter), and
        the stage models evaluated with their (states, rest) split at ``p.dp``."""
        key = (
            micro_batch_size,
            p.tp,
            p.pp,
            p.vpp,
            p.cp,
            p.ep,
            p.zero_stage,
            p.recompute,
            p.sequence_parallel,
            p.dp > 1,
        )
        models = self._models.get(key)
        training = self.training(micro_batch_size)
        if models is None:
            stages = peak_stages(p.pp, layer_counts(self._arch, training, p))
            models = self._models[key] = dict.fromkeys(stages)
        best = 0
        evaluated = []
        for stage, model in models.items():
            if model is None:
                model = models[stage] = shared_stage_model(self._arch, training, p, stage)
            split = model.split(p.dp)
            evaluated.append((model, split))
            best = max(best, split[0] + split[1])
            if best > capacity:
                break
        return best, evaluated


_STAGE_MODELS: dict[tuple[object, ...], StageModel] = {}
_STAGE_MODELS_MAX = 8192


def shared_stage_model(arch: ModelArch, training: TrainingConfig, p: ParallelConfig, stage: int) -> StageModel:
    """:func:`stage_model_of`, shared by every search of the process: a stage model depends on dp only
    through ``dp > 1`` (its docstring), so it is keyed on every other field. Bounded: the cache is emptied
    when it reaches :data:`_STAGE_MODELS_MAX` entries."""
    key = (arch, training, p.tp, p.pp, p.vpp, p.cp, p.ep, p.zero_stage, p.recompute, p.sequence_parallel,
           p.attention, p.first_stage_layers, p.last_stage_layers, p.dp > 1, stage)  # fmt: skip
    model = _STAGE_MODELS.get(key)
    if model is None:
        if len(_STAGE_MODELS) >= _STAGE_MODELS_MAX:
            _STAGE_MODELS.clear()
        model = _STAGE_MODELS[key] = stage_model_of(arch, training, p, stage)
    return model


def gpu_groups(job: JobSpec, cluster: ClusterSpec) -> dict[tuple[str, int, int, str], list[GpuType]]:
    """The cluster's GPU types by (precision, node size, GPU count, attention kernel): one search each."""
    groups: dict[tuple[str, int, int, str], list[GpuType]] = {}
    for gpu in cluster.gpu_types():
        # bf16 and fp16 take the same bytes everywhere, so their GPUs share one search.
        precision = effective_precision(gpu, job.training.precision).replace("fp16", "bf16")
        key = (precision, cluster.gpus_per_node_of(gpu.name), cluster.num_gpus_of(gpu.name), attention_on(gpu, job))
        groups.setdefault(key, []).append(gpu)
    return groups


@dataclass(slots=True)
class Tally:
    """What a search counts across its GPU groups: the least required bound seen, the candidates evaluated,
    and the refused candidate closest to fitting (its bound's parts explain the refusal)."""

    min_device: int | None = None
    evaluated: int = 0
    closest: tuple[float, str, MemoryBound] | None = None
    """(required bytes over the GPU's memory, "GPU at layout", bound) of the refusal with the least excess."""

    def note_refusal(self, gpu: GpuType, upper: MemoryBound, parallel: ParallelConfig, micro_batch_size: int) -> None:
        ratio = upper.required / gpu.memory_bytes
        if self.closest is None or ratio < self.closest[0]:
            where = f"{gpu.name} at {describe_layout(parallel, micro_batch_size)}"
            self.closest = (ratio, where, upper)


EXACT_BAND = 0.02
"""A candidate whose bound (with a reused reserve ratio) is within this fraction of its allocated bound of the
GPU's budget is replayed at its own dp (:meth:`GpuGroup._bound`)."""
WORKSPACE_SPREAD = 64 * 2**20
"""More than the largest difference of :func:`library_workspace_bytes` between two architectures."""


class GpuGroup:
    """GPU types that share one search (same precision, node size, GPU count and attention kernel), and how
    a candidate becomes their plans."""

    def __init__(
        self,
        job: JobSpec,
        gpus: list[GpuType],
        precision: str,
        attention: str,
        cluster: ClusterSpec,
        *,
        cuda: CudaTerms | None,
        step_model: StepTimeModel,
        fit: MemoryFit,
    ) -> None:
        self.job = job
        self.base = replace(
            job,
            training=replace(job.training, precision=Precision(precision)),
            parallel=replace(job.parallel, attention=attention),
        )
        self.cache = PeakCache(job.model, self.base.training)
        self.labels = {gpu.name: effective_precision(gpu, job.training.precision) for gpu in gpus}
        self.capacity = max(gpu.memory_bytes for gpu in gpus)
        self.by_link = by_link(gpus)
        self.links = {gpu.name: links_for(cluster, gpu.name) for gpu in gpus}
        # The step-time band's factors (StepTimeModel.band), read once per GPU instead of once per plan.
        self.bands = {gpu.name: step_model.band_factors(gpu.architecture) for gpu in gpus}
        t = self.base.training
        self.rates = {
            gpu.name: gpu_rates(gpu, step_model, precision=t.precision, runtime=t.runtime,
                                head_dim=job.model.kv_channels, seq_len=t.seq_len,
                                eager=self.base.parallel.attention == "eager")
            for gpu in gpus
        }  # fmt: skip
        self.cuda, self.step_model, self.fit = cuda, step_model, fit
        # A job that pins its whole layout is a configuration the user runs: it is refused only when its
        # predicted tensors alone (the allocated peak) exceed the GPU, and flagged ``memory_risk`` when the
        # upper bound plus headroom does not fit (MARP's bound is conservative by design, docs/marp-validation.md).
        self.user_layout = {*PARALLEL_FIELDS, "micro_batch_size"} - set(SPLIT_FIELDS) <= job.pinned
        self._ratios: dict[int, float] = {}

    def plans_of(
        self, parallel: ParallelConfig, micro_batch_size: int, limit: int, headroom: float, tally: Tally
    ) -> list[Plan]:
        """The memory-feasible plans of one candidate on the group's GPU types."""
        job = self.job
        allocated, models = self.cache.allocated(parallel, micro_batch_size, limit)
        tally.evaluated += 1
        terms = None
        out = []
        memo: dict[tuple[str, str], tuple[MemoryBound, MemoryBound | None]] = {}
        for link_gpus in self.by_link:
            for gpu in link_gpus:  # largest memory first
                upper, workspaces = self._bound(models, parallel, gpu, allocated, headroom, memo)
                required = int(headroom * gpu.memory_bytes)
                tally.min_device = upper.required if tally.min_device is None else min(tally.min_device, upper.required)
                point = allocated + workspaces
                risky = upper.required + required > gpu.memory_bytes
                if risky and not (self.user_layout and point <= gpu.memory_bytes):
                    tally.note_refusal(gpu, upper, parallel, micro_batch_size)
                    # The GPUs after this one have no more memory; only their workspaces (at most 56 MiB
                    # smaller before Hopper) can make a bound smaller.
                    if upper.required - WORKSPACE_SPREAD > gpu.memory_bytes:
                        break
                    continue
                outside = upper.rows["cuda_context"] + upper.rows["nccl_buffers"]
                reserved, used = cuda_totals(point, self.cuda, outside, gpu.memory_bytes)
                if terms is None:
                    terms = cached_step_terms(job.model, self.cache.training(micro_batch_size), parallel)
                seconds = terms.evaluate(gpu, self.links[gpu.name], self.step_model, self.rates[gpu.name]).total_s
                low, high = self.bands[gpu.name]
                out.append(
                    Plan(
                        gpu_type=gpu.name,
                        num_gpus=parallel.num_gpus,
                        parallel=parallel,
                        micro_batch_size=micro_batch_size,
                        precision=self.labels[gpu.name],
                        peak_allocated_bytes=point,
                        peak_reserved_bytes=reserved,
                        device_used_bytes=used,
                        capacity_bytes=gpu.memory_bytes,
                        step_time_s=seconds,
                        est_runtime_s=seconds * job.training.train_steps,
                        peak_allocated_upper_bytes=upper.allocated,
                        peak_reserved_upper_bytes=upper.reserved,
                        device_used_upper_bytes=upper.device_used,
                        required_upper_bytes=upper.required,
                        required_headroom_bytes=required,
                        step_time_p10_s=seconds * low,
                        step_time_p90_s=seconds * high,
                        memory_risk=risky,
                        num_micro_batches=job.training.num_micro_batches(parallel.dp, micro_batch_size),
                    )
                )
        return out

    def _bound(
        self,
        models: list[tuple[StageModel, tuple[int, int]]],
        parallel: ParallelConfig,
        gpu: GpuType,
        allocated: int,
        headroom: float,
        memo: dict[tuple[str, str], tuple[MemoryBound, MemoryBound | None]],
    ) -> tuple[MemoryBound, int]:
        """The largest required bound over the candidate's peak stages on ``gpu``, and the workspaces. The
        allocator reserve (:meth:`_reserve_ratio`) is added only when the bound without it fits: a candidate
        already refused without the reserve is refused with it. GPUs of one architecture and link share the
        bound (``memo``, per candidate); only the elastic cache's cap depends on the GPU's memory."""
        runtime = self.job.training.runtime
        workspaces = library_workspace_bytes(runtime, gpu.architecture) if self.cuda is not None else 0
        key = (gpu.architecture, gpu.intra_node)
        bare, full = memo.get(key, (None, None))
        if bare is None:
            nccl = nccl_buffer_bytes(runtime, parallel, gpu.intra_node) if self.cuda is not None else 0
            bare = max(
                (stage_bound(m, parallel.dp, runtime, self.fit, cuda=self.cuda, workspaces=workspaces, nccl=nccl,
                             with_reserve=False, split=split) for m, split in models),
                key=lambda b: b.required,
            )  # fmt: skip
            memo[key] = (bare, None)
        budget = gpu.memory_bytes - int(headroom * gpu.memory_bytes)
        upper = bare
        if bare.required <= budget and allocated <= gpu.memory_bytes and self.cuda is not None:
            if full is None:
                nccl = bare.rows["nccl_buffers"]
                bounds = []
                for m, split in models:
                    ratio = self._reserve_ratio(m, parallel.dp, runtime, workspaces)
                    bounds.append(stage_bound(m, parallel.dp, runtime, self.fit, cuda=self.cuda,
                                              workspaces=workspaces, nccl=nccl, reserve_ratio=ratio,
                                              split=split))  # fmt: skip
                full = max(bounds, key=lambda b: b.required)
                if abs(full.required - budget) <= EXACT_BAND * full.allocated:
                    # Near the GPU's edge the reused ratio could decide either way: replay this dp exactly,
                    # so the search admits what predict_memory's bound admits.
                    full = max(
                        (stage_bound(m, parallel.dp, runtime, self.fit, cuda=self.cuda, workspaces=workspaces,
                                     nccl=nccl, split=split) for m, split in models),
                        key=lambda b: b.required,
                    )  # fmt: skip
                memo[key] = (bare, full)
            upper = full
        upper = upper.within(gpu.memory_bytes)
        return upper, workspaces

    def _reserve_ratio(self, model: StageModel, dp: int, runtime: str, workspaces: int) -> float:
        """The allocator reserve over the bounded allocated peak of ``model`` (:func:`reserve_ratio`)."""
        ratio = self._ratios.get(id(model))
        if ratio is None:
            ratio = self._ratios[id(model)] = reserve_ratio(model, self.fit.margin_of(runtime), single=dp == 1)
        return ratio


@functools.lru_cache(maxsize=65536)
def reserve_ratio(model: StageModel, margin: float, *, single: bool = False) -> float:
    """The allocator reserve over the bounded allocated peak of a stage model (activations and temporaries
    times ``1 + margin``), replayed once at a canonical dp and reused at its other dp degrees: the dp scan
    changes the state shards and the micro-batch count, not the mix of sizes that fragments the cache. The
    canonical dp is the largest the micro-batches allow (the states sharded as in the searches that admit
    it), or 1 for the stage model of dp = 1 (``single``; :func:`shared_stage_model` keeps it apart: its
    states are whole, and a ratio replayed on sharded states misjudged it by about 3 % of its peak).
    Deterministic (whatever order a search meets the dp degrees in) and shared by every search of the
    process."""
    dp = 1 if single else max(1, model.training.global_batch_size // model.training.micro_batch_size)
    states, beyond = model.split(dp)
    reserve = allocator_reserve_bytes(model.step_shape(dp, 1 + margin))
    return reserve / max(states + beyond * (1 + margin), 1)


def by_link(gpus: list[GpuType]) -> list[list[GpuType]]:
    """GPUs split by intra-node link kind (NCCL's buffers depend on it, nothing else on the GPU does),
    largest memory first."""
    kinds: dict[str, list[GpuType]] = {}
    for gpu in sorted(gpus, key=lambda g: -g.memory_bytes):
        kinds.setdefault(gpu.intra_node, []).append(gpu)
    return list(kinds.values())
