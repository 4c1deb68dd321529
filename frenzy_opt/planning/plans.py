"""Plans: every memory-feasible way to run a job on one GPU type of a cluster.

A plan fixes the GPU type, the GPU count and the full parallel config (dp, tp, pp, vpp, cp, ep,
sequence parallelism, ZeRO stage, recompute, attention kernel) and the micro-batch size. Fields the job
pins are kept; the others are searched. Validity is arithmetic (Megatron-LM's argument checks): tp divides
the attention and kv heads and the ffn width and fits in one node; pp x vpp <= layers with layers divisible
by pp (and by pp x vpp when interleaving, which also needs the micro-batch count divisible by pp); cp
splits the sequence into 2 x cp chunks; ep divides the experts and dp; dp x micro-batch divides the global
batch. Recompute is part of the search (less memory for more time, as in Lynx, Zhang et al. 2024).

Two dominance rules shrink the space without losing a useful plan, and are skipped for pinned fields:
sequence parallelism is on whenever tp > 1 (it divides activations by tp at the same communication volume,
Korthikanti et al. 2022, Sec. 4.2.2), and Megatron's distributed optimizer is on whenever dp > 1 (it
shards optimizer states at the all-reduce's volume, Megatron-LM docs "Distributed Optimizer").

A GPU without bf16 (or fp8) tensor cores runs the job at the next format it has: bf16 -> fp16, fp8 ->
bf16 -> fp16, as users do on V100/T4-class GPUs; the plan records the precision it runs.
"""

from __future__ import annotations

import functools
import itertools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from frenzy_opt.core.enums import Precision, Recompute
from frenzy_opt.core.partition import chunk_layer_counts, split_rule
from frenzy_opt.core.plan import Plan as Plan  # the record moved to core; re-exported for callers
from frenzy_opt.core.runtimes import capabilities
from frenzy_opt.core.spec import (
    PARALLEL_FIELDS,
    SPLIT_FIELDS,
    ZERO_STAGES_BY_RUNTIME,
    JobSpec,
    ParallelConfig,
    TrainingConfig,
    check_headroom,
)
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.hardware.topology import links_for
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.prediction.marp.activations import activation_terms_for
from frenzy_opt.prediction.marp.bound import (
    MemoryBound,
    allocator_reserve_bytes,
    library_workspace_bytes,
    nccl_buffer_bytes,
)
from frenzy_opt.prediction.marp.fit import SHIPPED_FIT, MemoryFit
from frenzy_opt.prediction.marp.layout import fp8_param_gather, state_layout_for
from frenzy_opt.prediction.marp.predictor import (
    DEFAULT_CUDA,
    CudaTerms,
    StageModel,
    cuda_totals,
    layer_counts,
    param_terms,
    peak_stages,
    stage_bound,
    stage_model_of,
)
from frenzy_opt.prediction.marp.stages import in_flight_layer_microbatches
from frenzy_opt.prediction.stepeval import FLASH_ARCHITECTURES, gpu_rates
from frenzy_opt.prediction.stepterms import cached_step_terms
from frenzy_opt.prediction.steptime import StepTimeModel, shipped_model

MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16)
RECOMPUTE_ORDER = ("none", "selective", "full")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSearch:
    """All feasible plans of a job on a cluster, and what the search learned when none fit."""

    plans: list[Plan]
    min_device_bytes: int | None
    """Smallest required bound of any valid configuration tried (bytes), for the 'fits nowhere' error."""
    num_evaluated: int
    closest: tuple[str, MemoryBound] | None = None
    """The refused configuration that came closest to fitting (least required bound over the GPU's memory):
    the GPU type and its bound, whose parts say what breaks the budget (:meth:`refusal`)."""

    def refusal(self, capacity: dict[str, int]) -> str:
        """ "on H100-SXM5-80GB: activations 41.0 GiB (margin 3.2) + states 30.1 GiB + extras 2.3 GiB > 79.6
        GiB" for the closest refusal ('' when none was recorded); ``capacity`` maps GPU names to bytes."""
        if self.closest is None:
            return ""
        where, upper = self.closest
        return f"on {where}: {upper.explain(capacity.get(where.split(' at ')[0]))}"

    def min_gpus_per_type(self) -> dict[str, int]:
        best: dict[str, int] = {}
        for plan in self.plans:
            best[plan.gpu_type] = min(best.get(plan.gpu_type, plan.num_gpus), plan.num_gpus)
        return best


def describe_layout(parallel: ParallelConfig, micro_batch_size: int) -> str:
    """ "dp8 tp4 pp2 vpp2 zero1 selective mb2": the fields of a layout that are not at their defaults."""
    p = parallel
    parts = [f"dp{p.dp}"] + [
        f"{k}{v}" for k, v in (("tp", p.tp), ("pp", p.pp), ("vpp", p.vpp), ("cp", p.cp), ("ep", p.ep)) if v > 1
    ]
    if p.sequence_parallel:
        parts.append("sp")
    parts += [f"zero{p.zero_stage}", f"recompute {p.recompute}", f"mb{micro_batch_size}"]
    return " ".join(parts)


def effective_precision(gpu: GpuType, precision: str) -> str:
    """The format the job runs at on ``gpu`` (see module docstring)."""
    if precision == Precision.FP8 and not gpu.supports("fp8"):
        precision = "bf16"
    if precision == Precision.BF16 and not gpu.supports("bf16"):
        precision = "fp16"
    return precision


@functools.cache
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _choices(job: JobSpec, name: str, default: list[Any]) -> list[Any]:
    return [getattr(job.parallel, name)] if name in job.pinned else default


def _tp_choices(job: JobSpec, gpus_per_node: int) -> list[int]:
    arch = job.model
    ffn = arch.expert_ffn_size if arch.is_moe else arch.ffn_hidden_size
    valid = [
        tp
        for tp in _divisors(gpus_per_node)
        if arch.num_attention_heads % tp == 0 and arch.num_kv_heads % tp == 0 and ffn % tp == 0
    ]
    return _choices(job, "tp", valid if capabilities(job.training.runtime).tp else [1])


def _shape_choices(job: JobSpec) -> Iterator[tuple[int, int, int]]:
    """(pp, vpp, cp) candidates, within what the job's runtime runs (:mod:`frenzy_opt.core.runtimes`)."""
    layers, seq = job.model.num_layers, job.training.seq_len
    caps = capabilities(job.training.runtime)
    pps = _choices(job, "pp", _divisors(layers) if caps.pp else [1])
    cp_ok = [cp for cp in (1, 2, 4, 8) if cp == 1 or (seq % (2 * cp) == 0 and seq // cp >= 4096)]
    cps = _choices(job, "cp", cp_ok if caps.cp else [1])
    for pp, cp in itertools.product(pps, cps):
        vpps = [1] + ([2] if caps.vpp and pp > 1 and (layers // pp) % 2 == 0 and layers % pp == 0 else [])
        for vpp in _choices(job, "vpp", vpps):
            yield pp, vpp, cp


def _zero_choices(job: JobSpec, dp: int, cp: int = 1, *, tp: int = 1, pp: int = 1) -> list[int]:
    runtime = job.training.runtime
    default = {
        # Megatron's distributed optimizer shards over the data-parallel group with context parallelism.
        "megatron": [1] if dp * cp > 1 else [0],
        "deepspeed": [1, 2, 3] if dp > 1 else [0],
        "fsdp2": [3, 2],
        "hf": [0],
    }[runtime]
    offered = capabilities(runtime).zero_choices(tp=tp, pp=pp)
    # A pinned stage the runtime does not combine with this shape's tp or pp leaves the shape no plan.
    return [stage for stage in _choices(job, "zero_stage", default) if stage in offered]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Shape:
    """A candidate without its data-parallel degree."""

    tp: int
    pp: int
    vpp: int
    cp: int
    micro_batch_size: int
    recompute: str
    sequence_parallel: bool

    @property
    def model_gpus(self) -> int:
        return self.tp * self.pp * self.cp


def micro_batch_choices(job: JobSpec) -> list[int]:
    """The micro-batch sizes the planner tries: the spec's alone when it pins it (``training.pin_micro_batch``),
    else every size of :data:`MICRO_BATCH_CHOICES` that divides the global batch."""
    t = job.training
    if "micro_batch_size" in job.pinned:
        return [t.micro_batch_size]
    return [m for m in MICRO_BATCH_CHOICES if t.global_batch_size % m == 0]


def micro_batch_summary(job: JobSpec) -> dict[str, Any]:
    """What ``frenzy plan`` and ``POST /v1/plans`` say about the micro-batch: ``pinned`` (the spec's size kept)
    and ``searched`` (the sizes tried)."""
    return {"pinned": "micro_batch_size" in job.pinned, "searched": micro_batch_choices(job)}


def _shapes(job: JobSpec, gpus_per_node: int, max_gpus: int) -> Iterator[_Shape]:
    t = job.training
    mbs = micro_batch_choices(job)
    caps = capabilities(t.runtime)
    recomputes = [mode for mode in RECOMPUTE_ORDER if mode in caps.recompute]
    for tp in _tp_choices(job, gpus_per_node):
        sp = (
            job.parallel.sequence_parallel
            if "sequence_parallel" in job.pinned
            else (tp > 1 and caps.sequence_parallel != "never")
        )
        for pp, vpp, cp in _shape_choices(job):
            if tp * pp * cp > max_gpus:
                continue
            for mb, recompute in itertools.product(mbs, _choices(job, "recompute", recomputes)):
                yield _Shape(
                    tp=tp,
                    pp=pp,
                    vpp=vpp,
                    cp=cp,
                    micro_batch_size=mb,
                    recompute=recompute,
                    sequence_parallel=sp,
                )


def _dp_choices(job: JobSpec, shape: _Shape, max_gpus: int) -> list[int]:
    """Valid dp degrees, largest first: dp x micro-batch divides the global batch, the GPUs exist, and
    interleaving gets a micro-batch count divisible by pp."""
    gbs = job.training.global_batch_size
    valid = []
    for dp in _choices(job, "dp", _divisors(gbs)):
        if gbs % (dp * shape.micro_batch_size) or dp * shape.model_gpus > max_gpus:
            continue
        if shape.vpp > 1 and job.training.num_micro_batches(dp, shape.micro_batch_size) % shape.pp:
            continue
        valid.append(dp)
    return sorted(valid, reverse=True)


def _configs_at(job: JobSpec, shape: _Shape, dp: int) -> Iterator[ParallelConfig]:
    arch = job.model
    eps = [ep for ep in _divisors(arch.num_experts) if dp % ep == 0] if arch.is_moe else [1]
    if not capabilities(job.training.runtime).ep:
        eps = [1]
    zeros = _zero_choices(job, dp, shape.cp, tp=shape.tp, pp=shape.pp)
    for ep, zero in itertools.product(_choices(job, "ep", eps), zeros):
        if dp % ep:
            continue
        yield ParallelConfig(
            dp=dp,
            tp=shape.tp,
            pp=shape.pp,
            vpp=shape.vpp,
            cp=shape.cp,
            ep=ep,
            sequence_parallel=shape.sequence_parallel,
            zero_stage=zero,
            recompute=Recompute(shape.recompute),
            attention=job.parallel.attention,
            first_stage_layers=job.parallel.first_stage_layers if shape.pp == job.parallel.pp else None,
            last_stage_layers=job.parallel.last_stage_layers if shape.pp == job.parallel.pp else None,
        )


class _PeakCache:
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


DEFAULT_STEP_MODEL = shipped_model()


def enumerate_plans(
    job: JobSpec,
    cluster: ClusterSpec,
    *,
    cuda: CudaTerms | None = DEFAULT_CUDA,
    step_model: StepTimeModel = DEFAULT_STEP_MODEL,
    prune: bool = True,
    fit: MemoryFit = SHIPPED_FIT,
    headroom: float | None = None,
    plan_filter: Callable[[Plan], bool] | None = None,
) -> PlanSearch:
    """Every memory-feasible plan of ``job`` on each GPU type of ``cluster``, ranked (see :func:`rank_plans`).

    ``plan_filter`` (e.g. what an executor can run) keeps only the plans it accepts, and it is applied
    before the dominance rules (module docstring) discard anything: a candidate whose plans it refuses is
    replaced by the first candidate those rules set aside for it that it accepts (:func:`dominated`).

    GPU types that run the job at the same precision, with the same node size and GPU count, share one
    search. Memory never grows with dp at dp >= 2 (ZeRO shards shrink, fewer micro-batches are in flight,
    more ep choices), so the dp scan runs from the largest dp down and skips the remaining dp >= 2 after the
    first dp where nothing fits; dp = 1 (no data-parallel communicator) is checked on its own.

    A plan is feasible when the upper bound of its nvidia-smi footprint (the prediction times the fit's
    upper ratio, :func:`frenzy_opt.prediction.marp.predictor.upper_bytes`) plus the headroom (``headroom``, else
    ``training.memory_headroom``, else the fit's cross-validated default, as a fraction of GPU memory)
    fits the GPU. A shape
    whose lower bound (:func:`_lower_bound`) exceeds the group's largest GPU is skipped. When no plan fits
    anywhere, a second pass (``prune=False``) finds the least per-GPU footprint of any configuration for
    the error message, skipping shapes whose lower bound exceeds the best footprint found so far.
    """
    headroom = _headroom_of(job, headroom, fit)
    tally = _Tally()
    plans: list[Plan] = []
    for (precision, gpus_per_node, max_gpus, attention), gpus in _gpu_groups(job, cluster).items():
        group = _Group(job, gpus, precision, attention, cluster, cuda=cuda, step_model=step_model, fit=fit)
        for shape in _shapes(job, gpus_per_node, max_gpus):
            # Feasibility search: nothing above the largest GPU matters. Minimum search (no plan anywhere):
            # nothing above the least footprint found so far does (branch and bound).
            limit = group.capacity if prune else (tally.min_device if tally.min_device is not None else sys.maxsize)
            dps = _dp_choices(job, shape, max_gpus)
            if dps and _lower_bound(group.base, shape, dps[0]) <= limit:
                plans += _dp_scan(group, shape, dps, limit, headroom, tally, plan_filter)
    if not plans and prune:
        # Nothing fits: search again for the least memory per GPU any configuration needs (for the error),
        # bounding by the best footprint found instead of the GPU's capacity.
        return enumerate_plans(
            job,
            cluster,
            cuda=cuda,
            step_model=step_model,
            prune=False,
            fit=fit,
            headroom=headroom,
            plan_filter=plan_filter,
        )
    closest = (tally.closest[1], tally.closest[2]) if tally.closest is not None else None
    return PlanSearch(
        plans=rank_plans(plans), min_device_bytes=tally.min_device, num_evaluated=tally.evaluated, closest=closest
    )


def _gpu_groups(job: JobSpec, cluster: ClusterSpec) -> dict[tuple[str, int, int, str], list[GpuType]]:
    """The cluster's GPU types by (precision, node size, GPU count, attention kernel): one search each."""
    groups: dict[tuple[str, int, int, str], list[GpuType]] = {}
    for gpu in cluster.gpu_types():
        # bf16 and fp16 take the same bytes everywhere, so their GPUs share one search.
        precision = effective_precision(gpu, job.training.precision).replace("fp16", "bf16")
        key = (precision, cluster.gpus_per_node_of(gpu.name), cluster.num_gpus_of(gpu.name), attention_on(gpu, job))
        groups.setdefault(key, []).append(gpu)
    return groups


def _headroom_of(job: JobSpec, headroom: float | None, fit: MemoryFit) -> float:
    """The headroom fraction a search admits plans with: the caller's, else the job's, else the fit's."""
    if headroom is None:
        headroom = job.training.memory_headroom
    if headroom is None:
        headroom = fit.headroom_fraction
    check_headroom("headroom", headroom)
    return headroom


def _dp_scan(
    group: _Group,
    shape: _Shape,
    dps: list[int],
    limit: int,
    headroom: float,
    tally: _Tally,
    plan_filter: Callable[[Plan], bool] | None,
) -> list[Plan]:
    """The accepted plans of one shape over its dp degrees, largest first; after the first dp >= 2 where
    nothing fits, the remaining dp >= 2 are skipped (:func:`enumerate_plans`)."""
    plans: list[Plan] = []
    exhausted = False
    for dp in dps:
        if exhausted and dp >= 2:
            continue
        fitted = False
        for parallel in _configs_at(group.base, shape, dp):
            found = group.plans_of(parallel, shape.micro_batch_size, limit, headroom, tally)
            fitted = fitted or bool(found)
            plans += _accepted(found, parallel, shape.micro_batch_size, limit, headroom, tally, group, plan_filter)
        exhausted = not fitted  # memory only: a filter's refusals say nothing about smaller dp
    return plans


@dataclass(slots=True)
class _Tally:
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
GPU's budget is replayed at its own dp (:meth:`_Group._bound`)."""
WORKSPACE_SPREAD = 64 * 2**20
"""More than the largest difference of :func:`library_workspace_bytes` between two architectures."""


class _Group:
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
        self.cache = _PeakCache(job.model, self.base.training)
        self.labels = {gpu.name: effective_precision(gpu, job.training.precision) for gpu in gpus}
        self.capacity = max(gpu.memory_bytes for gpu in gpus)
        self.by_link = _by_link(gpus)
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
        self, parallel: ParallelConfig, micro_batch_size: int, limit: int, headroom: float, tally: _Tally
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


def _accepted(
    found: list[Plan],
    parallel: ParallelConfig,
    micro_batch_size: int,
    limit: int,
    headroom: float,
    tally: _Tally,
    group: _Group,
    plan_filter: Callable[[Plan], bool] | None,
) -> list[Plan]:
    """The plans of one candidate that ``plan_filter`` accepts. When it refuses every one, the candidates the
    dominance rules set aside in its favour (:func:`dominated`) are tried in order and the first one with an
    accepted plan stands in (an executor that cannot run Megatron's distributed optimizer or sequence
    parallelism with a layout still gets that layout without them)."""
    if plan_filter is None:
        return found
    accepted = [plan for plan in found if plan_filter(plan)]
    if accepted or not found:
        return accepted
    for alternative in dominated(group.job, parallel):
        accepted = [p for p in group.plans_of(alternative, micro_batch_size, limit, headroom, tally) if plan_filter(p)]
        if accepted:
            return accepted
    return []


def dominated(job: JobSpec, parallel: ParallelConfig) -> list[ParallelConfig]:
    """The configurations the two dominance rules (module docstring) set aside in favour of ``parallel``,
    closest first: sequence parallelism off, the distributed optimizer off (ZeRO 0), both. Pinned fields
    stay as pinned."""
    flips: list[dict[str, Any]] = []
    sp_optional = capabilities(job.training.runtime).sequence_parallel == "optional"
    if parallel.sequence_parallel and parallel.tp > 1 and "sequence_parallel" not in job.pinned and sp_optional:
        flips.append({"sequence_parallel": False})
    zero_allowed = 0 in ZERO_STAGES_BY_RUNTIME[job.training.runtime]
    if parallel.zero_stage == 1 and parallel.dp > 1 and "zero_stage" not in job.pinned and zero_allowed:
        flips.append({"zero_stage": 0})
    if len(flips) == 2:
        flips.append({**flips[0], **flips[1]})
    return [replace(parallel, **flip) for flip in flips]


def attention_on(gpu: GpuType, job: JobSpec) -> str:
    """The attention kernel the job runs on ``gpu``: its own choice where FlashAttention runs (Ampere and
    later, :data:`frenzy_opt.prediction.steptime.FLASH_ARCHITECTURES`), eager attention (its time and its ``b a s^2``
    scores in memory) on Volta and Turing."""
    return job.parallel.attention if gpu.architecture in FLASH_ARCHITECTURES else "eager"


def _lower_bound(job: JobSpec, shape: _Shape, dp: int) -> float:
    """Bytes no plan of this shape gets below on its first stage: model states at ``dp`` (the largest valid
    dp), sharded as far as any ZeRO stage and ep choice allows, plus the activations of the micro-batches in
    flight at that dp (the fewest), plus the loss when the first stage is also the last."""
    arch, training = job.model, job.training
    ep = max((e for e in _divisors(arch.num_experts) if dp % e == 0), default=1)
    p = job.parallel
    split = (p.first_stage_layers, p.last_stage_layers) if shape.pp == p.pp else (None, None)
    chunks = chunk_layer_counts(arch.num_layers, shape.pp, shape.vpp, split_rule(training.runtime), *split)[:: shape.pp]
    layers = sum(chunks)
    terms = param_terms(arch, shape.tp, ep, shape.pp, layers, True, shape.pp == 1)
    zero = max(ZERO_STAGES_BY_RUNTIME[training.runtime])
    layout = state_layout_for(
        training.runtime, training.precision, training.optimizer, zero, dp > 1, fp8_param_gather(training, zero)
    )
    acts = activation_terms_for(
        arch,
        training,
        micro_batch_size=shape.micro_batch_size,
        tp=shape.tp,
        cp=shape.cp,
        ep=ep,
        sp=shape.sequence_parallel,
        recompute=shape.recompute,
    )
    microbatches = training.num_micro_batches(dp, shape.micro_batch_size)
    in_flight = in_flight_layer_microbatches(chunks, 0, shape.pp, microbatches)
    loss = acts.loss + acts.loss_backward if shape.pp == 1 else 0
    # Flash attention keeps the least of the two kernels, so its activations bound any attention choice.
    dense, expert = terms.params - terms.expert_params, terms.expert_params
    states = dense * sum(layout.per_param(dp * shape.cp)) + expert * sum(layout.per_param(max(dp * shape.cp // ep, 1)))
    return states + in_flight * layers * acts.layer + loss


def _by_link(gpus: list[GpuType]) -> list[list[GpuType]]:
    """GPUs split by intra-node link kind (NCCL's buffers depend on it, nothing else on the GPU does),
    largest memory first."""
    kinds: dict[str, list[GpuType]] = {}
    for gpu in sorted(gpus, key=lambda g: -g.memory_bytes):
        kinds.setdefault(gpu.intra_node, []).append(gpu)
    return list(kinds.values())


def rank_plans(plans: list[Plan]) -> list[Plan]:
    """Best first: by predicted step time (None ranks as 0, before timed plans); then fewest GPUs, the least
    recompute (full recompute re-runs the forward pass, about a third more compute, Korthikanti et al. 2022,
    Sec. 5) and the most memory headroom. A total order: equal keys are broken on the plan's own fields."""
    return sorted(
        plans,
        key=lambda p: (
            p.step_time_s if p.step_time_s is not None else 0.0,
            p.num_gpus,
            RECOMPUTE_ORDER.index(p.parallel.recompute),
            -p.headroom_bytes,
            # Ties broken on the plan itself, so the order never depends on the search order.
            p.gpu_type,
            -p.micro_batch_size,
            (p.parallel.dp, p.parallel.tp, p.parallel.pp, p.parallel.vpp, p.parallel.cp, p.parallel.ep),
            p.parallel.zero_stage,
            p.parallel.sequence_parallel,
        ),
    )


class NoFeasiblePlan(ValueError):
    """A job fits no GPU type of the cluster, even at the largest parallelism tried."""


def search_or_fail(
    job: JobSpec, cluster: ClusterSpec, *, headroom: float | None = None, step_model: StepTimeModel | None = None
) -> PlanSearch:
    """All plans; :class:`NoFeasiblePlan` naming the memory needed and the largest GPU when none fit."""
    search = enumerate_plans(job, cluster, headroom=headroom, step_model=step_model or DEFAULT_STEP_MODEL)
    if search.plans:
        return search
    largest = max(cluster.gpu_types(), key=lambda g: g.memory_bytes)
    if search.min_device_bytes is None:
        raise NoFeasiblePlan(
            f"job {job.name}: no valid parallel configuration on cluster {cluster.name} "
            f"(the pinned parallel fields or the cluster size leave none)"
        )
    pinned = f" with the pinned parallel fields ({', '.join(sorted(job.pinned))})" if job.pinned else ""
    gib = 2**30
    why = search.refusal({g.name: g.memory_bytes for g in cluster.gpu_types()})
    raise NoFeasiblePlan(
        f"job {job.name} fits no GPU type of cluster {cluster.name}: it needs at least "
        f"{search.min_device_bytes / gib:.1f} GiB per GPU (MARP's bound) at the largest parallelism the "
        f"cluster allows{pinned}; "
        f"the largest GPU available is {largest.name} with {largest.memory_bytes / gib:.1f} GiB"
        + (f"; the closest configuration tried ({why}) breaks the budget" if why else "")
    )
