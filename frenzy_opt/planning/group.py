"""GPU groups: the GPU types of a cluster that share one plan search, and how a candidate becomes their plans.

GPU types that run a job at the same precision, with the same node size, GPU count and attention kernel
share one search (:func:`gpu_groups`): a candidate's memory model is built once for them and only the
bound's GPU-dependent parts (workspaces, NCCL buffers, the elastic cache's cap) and the step time are
evaluated per GPU (:meth:`GpuGroup.plans_of`).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from frenzy_opt.core.enums import Precision
from frenzy_opt.core.plan import Plan
from frenzy_opt.core.spec import PARALLEL_FIELDS, SPLIT_FIELDS, JobSpec, ParallelConfig, TrainingConfig
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.hardware.topology import Links, links_for
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.planning.candidates import Shape, attention_on, configs_at, describe_layout, effective_precision
from frenzy_opt.prediction.marp.bound import (
    MemoryBound,
    allocator_reserve_bytes,
    library_workspace_bytes,
    nccl_buffer_bytes,
)
from frenzy_opt.prediction.marp.cuda import CudaTerms, cuda_totals, stage_bound
from frenzy_opt.prediction.marp.fit import MemoryFit
from frenzy_opt.prediction.marp.predictor import peak_stages
from frenzy_opt.prediction.marp.stage_model import StageModel, layer_counts, stage_model_of
from frenzy_opt.prediction.stepeval import (
    GpuRates,
    MicrobatchTime,
    gpu_rates,
    link_parts,
    microbatch_time,
    parts_total,
    parts_with,
)
from frenzy_opt.prediction.stepterms import StepTerms, cached_step_terms
from frenzy_opt.prediction.steptime import StepTimeModel


class PeakCache:
    """Stage models per candidate without its dp (they do not depend on it), so the dp scan only
    re-evaluates the dp-dependent terms, and their (states, rest) splits per dp. Stages are built lazily: once
    the first stage alone exceeds the largest GPU, the last stage is not needed. The candidates' parallel
    fields beyond its key (attention kernel, pinned stage split) are the GPU group's, so one cache serves one
    group's model, training config and those fields (:func:`shared_layouts`)."""

    def __init__(self, arch: ModelArch, training: TrainingConfig) -> None:
        self._arch = arch
        self._training = {training.micro_batch_size: training}
        self._base = training
        # Per key: the peak stages' models (built lazily) and their splits per (stage, dp).
        self._models: dict[
            tuple[object, ...], tuple[dict[int, StageModel | None], dict[tuple[int, int], tuple[int, int]]]
        ] = {}

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
        entry = self._models.get(key)
        if entry is None:
            stages = peak_stages(p.pp, layer_counts(self._arch, self.training(micro_batch_size), p))
            entry = self._models[key] = (dict.fromkeys(stages), {})
        models, splits = entry
        best = 0
        evaluated = []
        dp = p.dp
        for stage, model in models.items():
            if model is None:
                model = models[stage] = shared_stage_model(self._arch, self.training(micro_batch_size), p, stage)
            split = splits.get((stage, dp))
            if split is None:
                split = splits[(stage, dp)] = model.split(dp)
            evaluated.append((model, split))
            best = max(best, split[0] + split[1])
            if best > capacity:
                break
        return best, evaluated


class SharedLayouts(NamedTuple):
    """What the GPU groups of one base job (:func:`shared_layouts`) keep of their candidates' layouts."""

    cache: PeakCache
    """Their stage models and splits."""
    configs: dict[tuple[object, ...], list[ParallelConfig]]
    """Their parallel configs per shape without its micro-batch, and dp (:meth:`GpuGroup.configs_at`)."""


_LAYOUTS: dict[tuple[object, ...], SharedLayouts] = {}
_LAYOUTS_MAX = 16


def shared_layouts(base: JobSpec) -> SharedLayouts:
    """The :class:`SharedLayouts` of the GPU groups whose base job (:attr:`GpuGroup.base`) has ``base``'s model,
    training config, parallel fields (what a candidate takes beyond its searched fields: the attention kernel,
    the pinned stage split) and pinned fields, shared by every search of the process as
    :func:`shared_stage_model` shares the stage models: a job planned again builds its candidates' configs and
    evaluates their stage splits once, and its configs are the same objects from search to search (the step-time
    pricing, :func:`shared_pricing`, finds them by identity). Bounded: emptied when it reaches
    :data:`_LAYOUTS_MAX` entries (one of the 405B catalogue-wide benchmark, ``benchmarks/plan_enumeration.py``
    at 4,096 GPUs per type, keeps about 1.5 MB beyond the stage models, measured with tracemalloc)."""
    key = (base.model, base.training, base.parallel, base.pinned)
    found = _LAYOUTS.get(key)
    if found is None:
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.clear()
        found = _LAYOUTS[key] = SharedLayouts(PeakCache(base.model, base.training), {})
    return found


_STAGE_MODELS: dict[tuple[object, ...], StageModel] = {}
_STAGE_MODELS_MAX = 8192


def clear_shared_memos() -> None:
    """Empty the process-wide memos of the plan searches (:func:`shared_stage_model`, :func:`shared_layouts`,
    :func:`shared_pricing`); tests measuring what a search retains empty them."""
    _STAGE_MODELS.clear()
    _LAYOUTS.clear()
    _PRICINGS.clear()


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


class Pricing(NamedTuple):
    """What a GPU group's step-time pricing keeps (:meth:`GpuGroup._seconds`)."""

    parts: dict[tuple[object, ...], dict[str, MicrobatchTime]]
    """Micro-batch parts per :func:`parts_key`, then per GPU name."""
    seconds: dict[tuple[ParallelConfig, int], dict[str, float]]
    """Step seconds per (parallel config, micro-batch size), then per GPU name."""


_PRICINGS: dict[tuple[object, ...], tuple[StepTimeModel, Pricing]] = {}
_PRICINGS_MAX = 16


def shared_pricing(base: JobSpec, step_model: StepTimeModel, gpus: list[tuple[GpuType, Links]]) -> Pricing:
    """The step-time pricing of a GPU group's candidates, shared by every search of the process over the same
    GPUs and links at the same model, training config and parallel fields the candidates inherit (attention
    kernel, pinned stage split) with the same step-time model: a step time (:meth:`GpuGroup._seconds`) reads
    nothing else (its terms are :func:`cached_step_terms` of those, its rates :func:`gpu_rates` of the GPU).
    A job planned again (the scheduler plans its queue at every event) prices its candidates once. The model
    is matched by identity (it is not hashable) and kept alive by the entry, so its id is not reused. Bounded:
    emptied when it reaches :data:`_PRICINGS_MAX` groups (a group of the 405B catalogue-wide benchmark,
    ``benchmarks/plan_enumeration.py`` at 4,096 GPUs per type, keeps about 1.3 MB, measured with tracemalloc)."""
    key = (base.model, base.training, base.parallel, id(step_model), tuple(gpus))
    found = _PRICINGS.get(key)
    if found is None:
        if len(_PRICINGS) >= _PRICINGS_MAX:
            _PRICINGS.clear()
        found = _PRICINGS[key] = (step_model, Pricing({}, {}))
    return found[1]


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


@dataclass(slots=True, kw_only=True, eq=False)
class Candidate:
    """A layout evaluated for a GPU group: its allocated peak and stage models, and what the group has worked
    out for it so far (bounds per GPU workspace size and link, step terms, step times per GPU)."""

    parallel: ParallelConfig
    micro_batch_size: int
    allocated: int
    models: list[tuple[StageModel, tuple[int, int]]]
    bounds: dict[tuple[object, ...], MemoryBound] = field(default_factory=dict)
    """Per (workspace bytes, intra-node link): the bound without the allocator reserve; with ``"ratio"`` or
    ``"exact"`` appended, the bound with it (:meth:`GpuGroup._bound`)."""
    terms: StepTerms | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    """Step seconds per GPU name: the group's :attr:`Pricing.seconds` of the layout (:meth:`GpuGroup.candidate`)."""
    parts: dict[str, MicrobatchTime] | None = None
    """The group's micro-batch parts per GPU for the candidate's :func:`parts_key` (:meth:`GpuGroup.seconds`)."""
    link_parts: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    """Its :func:`link_parts` per the group's link index (:attr:`GpuGroup.link_ids`)."""
    num_micro_batches: int = 0
    """Micro-batches per step and data-parallel rank (the job's :meth:`TrainingConfig.num_micro_batches`)."""
    num_gpus: int = 0
    """``parallel.num_gpus``, read once per candidate instead of once per plan (:meth:`GpuGroup._plan`)."""
    bare_stage: int | None = None
    """Which of ``models`` holds the largest bound without the allocator reserve (:meth:`GpuGroup._bare`)."""


class Admission(NamedTuple):
    """A candidate's memory figures on a GPU that admits it (:meth:`GpuGroup._admit`): all of them read of
    the GPU only its memory, workspaces and intra-node link."""

    upper: MemoryBound
    point: int
    """The allocated peak plus the workspaces, bytes."""
    reserved: int
    used: int
    required: int
    """The headroom the plan is admitted with, bytes."""
    risky: bool


class GpuRow:
    """What a search reads of one GPU of its group at one headroom, worked out once per search instead of once
    per candidate (:meth:`GpuGroup.rows`): its memory, the budget a required bound may take
    (:func:`_budget`) and the headroom a plan is admitted with, the keys its candidate bounds are shared under
    (:meth:`GpuGroup._bare`, :meth:`GpuGroup._bound`), its links and rates, its step-time band and its
    precision label, and whether it repeats the GPU before it (:func:`repeats`)."""

    __slots__ = ("budget", "exact_key", "floor", "gpu", "high", "key", "label", "link_id", "links", "low",
                 "memory", "name", "rates", "ratio_key", "repeat", "required")  # fmt: skip

    def __init__(self, group: GpuGroup, gpu: GpuType, headroom: float) -> None:
        name = gpu.name
        self.gpu, self.name, self.memory = gpu, name, gpu.memory_bytes
        self.budget = _budget(gpu, headroom)
        self.required = int(headroom * gpu.memory_bytes)
        self.repeat = name in group.repeats
        self.key = group.bound_keys[name]
        # What every bound on this GPU holds beyond the allocated peak (:meth:`GpuGroup._settled_refusal`).
        self.floor = self.key[0] + (group.cuda.context_bytes if group.cuda is not None else 0)
        self.ratio_key, self.exact_key = group._reserve_keys[name]
        self.links, self.link_id, self.rates = group.links[name], group.link_ids[name], group.rates[name]
        self.low, self.high = group.bands[name]
        self.label = group.labels[name]


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
        layouts = shared_layouts(self.base)
        self.cache = layouts.cache
        self.labels = {gpu.name: effective_precision(gpu, job.training.precision) for gpu in gpus}
        self.capacity = max(gpu.memory_bytes for gpu in gpus)
        self.by_link = by_link(gpus)
        self.links = {gpu.name: links_for(cluster, gpu.name) for gpu in gpus}
        # GPUs of equal links (e.g. every PCIe 4.0 board of one cluster) share a candidate's link_parts.
        indices: dict[Links, int] = {}
        self.link_ids = {name: indices.setdefault(links, len(indices)) for name, links in self.links.items()}
        # The step-time band's factors (StepTimeModel.band), read once per GPU instead of once per plan.
        self.bands = {gpu.name: step_model.band_factors(gpu.architecture) for gpu in gpus}
        runtime = job.training.runtime
        self.workspaces = {
            gpu.name: library_workspace_bytes(runtime, gpu.architecture) if cuda is not None else 0 for gpu in gpus
        }
        self.repeats = repeats(self.by_link, self.workspaces)
        # Per GPU: the key a candidate's bounds are shared under (workspaces, intra-node link, :meth:`_bare`),
        # and the keys of its bounds with the allocator reserve (:meth:`_bound`).
        self.bound_keys = {gpu.name: (self.workspaces[gpu.name], gpu.intra_node) for gpu in gpus}
        self._reserve_keys = {name: ((*key, "ratio"), (*key, "exact")) for name, key in self.bound_keys.items()}
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
        self.user_layout = pins_whole_layout(job)
        self._train_steps = job.training.train_steps  # read once per plan (:meth:`_plan`)
        self._ratios: dict[int, float] = {}
        self._pricing = shared_pricing(self.base, step_model, [(gpu, self.links[gpu.name]) for gpu in gpus])
        self._nccls: dict[tuple[int, int, int, int, int, str], int] = {}
        self._configs = layouts.configs
        # Whether the rows of a bound never fall below zero, so that its floor holds (:meth:`_settled_refusal`):
        # the fit's margins and the CUDA context.
        context = cuda.context_bytes if cuda is not None else 0
        self._floors = min(fit.margin_of(runtime), fit.fixed_margin_of(runtime), context) >= 0
        self._rows: dict[float, list[list[GpuRow]]] = {}
        self._row_names: dict[float, dict[str, GpuRow]] = {}

    def configs_at(self, shape: Shape, dp: int) -> list[ParallelConfig]:
        """:func:`configs_at` of the group's job: a config does not hold the micro-batch size, so the shapes that
        differ only in it share their configs (one object each, built once: :func:`shared_layouts`)."""
        key = (shape.tp, shape.pp, shape.vpp, shape.cp, shape.recompute, shape.sequence_parallel, dp)
        found = self._configs.get(key)
        if found is None:
            found = self._configs[key] = list(configs_at(self.base, shape, dp))
        return found

    def candidate(self, parallel: ParallelConfig, micro_batch_size: int, limit: int) -> Candidate:
        """One candidate's stage models at ``parallel``, evaluated up to ``limit`` bytes (:class:`PeakCache`)."""
        allocated, models = self.cache.allocated(parallel, micro_batch_size, limit)
        microbatches = self.job.training.num_micro_batches(parallel.dp, micro_batch_size)
        seconds = self._pricing.seconds.setdefault((parallel, micro_batch_size), {})
        return Candidate(parallel=parallel, micro_batch_size=micro_batch_size, allocated=allocated, models=models,
                         num_micro_batches=microbatches, seconds=seconds, num_gpus=parallel.num_gpus)  # fmt: skip

    def rows(self, headroom: float) -> list[list[GpuRow]]:
        """The group's GPUs as :class:`GpuRow` at ``headroom``, split as :attr:`by_link` splits them (built once
        per headroom)."""
        found = self._rows.get(headroom)
        if found is None:
            found = self._rows[headroom] = [[GpuRow(self, gpu, headroom) for gpu in gpus] for gpus in self.by_link]
            self._row_names[headroom] = {row.name: row for rows in found for row in rows}
        return found

    def row(self, gpu: GpuType, headroom: float) -> GpuRow:
        """``gpu``'s :class:`GpuRow` at ``headroom``."""
        names = self._row_names.get(headroom)
        if names is None:
            self.rows(headroom)
            names = self._row_names[headroom]
        return names[gpu.name]

    def plans_of(
        self, parallel: ParallelConfig, micro_batch_size: int, limit: int, headroom: float, tally: Tally
    ) -> list[Plan]:
        """The memory-feasible plans of one candidate on the group's GPU types. A GPU of the previous one's
        memory, workspaces and link (:func:`repeats`) takes that GPU's memory judgment (:meth:`_admit` reads
        nothing else of a GPU; a refusal there adds nothing to ``tally``: the same bound, the same ratio)."""
        candidate = self.candidate(parallel, micro_batch_size, limit)
        tally.evaluated += 1
        out = []
        for link_rows in self.rows(headroom):
            admitted: Admission | None = None
            for row in link_rows:  # largest memory first
                if row.repeat:
                    if admitted is not None:
                        out.append(self._plan(candidate, row, admitted))
                    continue
                if self._settled_refusal(candidate, row, tally):
                    break
                upper = self._bound(candidate, row)
                least = tally.min_device
                if least is None or upper.required < least:
                    tally.min_device = upper.required
                admitted = self._admit(candidate, row, upper)
                if admitted is None:
                    tally.note_refusal(row.gpu, upper, parallel, micro_batch_size)
                    # The GPUs after this one have no more memory; only their workspaces (at most 56 MiB
                    # smaller before Hopper) can make a bound smaller.
                    if upper.required - WORKSPACE_SPREAD > row.memory:
                        break
                    continue
                out.append(self._plan(candidate, row, admitted))
        return out

    def _settled_refusal(self, candidate: Candidate, row: GpuRow, tally: Tally) -> bool:
        """Whether :meth:`plans_of` is sure, without working out the candidate's bound on the row's GPU, that the
        GPU refuses it, that its link's scan stops there, and that ``tally`` keeps its least bound and its
        closest refusal. Every peak stage's required bound holds its allocated peak, the workspaces and the CUDA
        context, and rows that are not negative (:func:`stage_bound`), so the largest is at least the
        candidate's allocated peak plus those two (its floor): a floor more than :data:`WORKSPACE_SPREAD`
        above the GPU's memory is refused and stops the scan (a layout pinned whole aside, :meth:`_admit`), and
        one at least the least bound and whose ratio to the GPU's memory is at least the closest refusal's
        changes neither (:meth:`Tally.note_refusal` keeps the first of equal ratios). Many candidates of a
        catalogue-wide search are far too large for the smaller GPUs, whose bounds this skips."""
        closest, least = tally.closest, tally.min_device
        if closest is None or least is None or self.user_layout or not self._floors:
            return False
        floor = candidate.allocated + row.floor
        return floor - WORKSPACE_SPREAD > row.memory and floor >= least and floor / row.memory >= closest[0]

    def needs_reserve(self, candidate: Candidate, gpu: GpuType, headroom: float) -> bool:
        """Whether the candidate's bound without the allocator reserve fits ``gpu``, so that only the reserve
        (an allocator replay, :meth:`_bound`) decides whether it runs there."""
        return self.may_fit(candidate, gpu, headroom) and self.cuda is not None

    def may_fit(self, candidate: Candidate, gpu: GpuType, headroom: float) -> bool:
        """Whether the candidate's bound without the allocator reserve fits ``gpu``: when it does not,
        :meth:`resolve` has no plan there (a job that pins its whole layout aside, :meth:`_admit`)."""
        row = self.row(gpu, headroom)
        return self._bare_fits(candidate, row, self._bare(candidate, row))

    @staticmethod
    def _bare_fits(candidate: Candidate, row: GpuRow, bare: MemoryBound) -> bool:
        """Whether the bound without the reserve fits the GPU's budget (:func:`_budget`) and the allocated
        peak its memory."""
        return bare.required <= row.budget and candidate.allocated <= row.memory

    def resolve(self, candidate: Candidate, gpu: GpuType, headroom: float) -> Plan | None:
        """The candidate's plan on ``gpu``, or None when its bound does not fit (the same answer as
        :meth:`plans_of` for that GPU)."""
        row = self.row(gpu, headroom)
        admitted = self._admit(candidate, row, self._bound(candidate, row))
        return None if admitted is None else self._plan(candidate, row, admitted)

    def seconds(self, candidate: Candidate, gpu: GpuType) -> float:
        """The candidate's predicted step time on ``gpu`` (:meth:`_seconds`)."""
        found = candidate.seconds.get(gpu.name)
        return found if found is not None else self._seconds(candidate, gpu, self.links[gpu.name],
                                                             self.link_ids[gpu.name], self.rates[gpu.name])  # fmt: skip

    def _seconds(self, candidate: Candidate, gpu: GpuType, links: Links, link_id: int, rates: GpuRates) -> float:
        """The candidate's predicted step time on ``gpu`` (its step terms built once per candidate), kept in
        ``candidate.seconds``. The micro-batch parts (:func:`microbatch_time`, what :meth:`StepTerms.evaluate`
        assembles) do not read dp or the ZeRO stage (:func:`parts_key`), so the candidates of a dp scan share
        them per GPU; the links' seconds (:func:`link_parts`) do not read the GPU, so the GPUs of one link
        share them per candidate. The total is :func:`parts_total`'s: the same parts summed in the same
        order."""
        terms = candidate.terms
        if terms is None:
            training = self.cache.training(candidate.micro_batch_size)
            terms = candidate.terms = cached_step_terms(self.job.model, training, candidate.parallel)
        by_gpu = candidate.parts
        if by_gpu is None:
            key = parts_key(candidate.parallel, candidate.micro_batch_size)
            by_gpu = candidate.parts = self._pricing.parts.setdefault(key, {})
        parts = by_gpu.get(gpu.name)
        if parts is None:
            parts = by_gpu[gpu.name] = microbatch_time(terms, gpu, links, self.step_model, rates)
        shared = candidate.link_parts.get(link_id)
        if shared is None:
            shared = candidate.link_parts[link_id] = link_parts(terms, links, self.step_model)
        found = candidate.seconds[gpu.name] = parts_total(parts_with(terms, parts, shared))
        return found

    def _admit(self, candidate: Candidate, row: GpuRow, upper: MemoryBound) -> Admission | None:
        """The candidate's memory figures on the row's GPU given its bound, or None when the bound plus
        headroom does not fit (a layout the user pinned whole is refused only when its allocated peak does not
        fit, :meth:`__init__`). They read of the GPU only its memory, besides the bound and the workspaces."""
        memory = row.memory
        point = candidate.allocated + row.key[0]
        risky = upper.required + row.required > memory
        if risky and not (self.user_layout and point <= memory):
            return None
        outside = upper.rows["cuda_context"] + upper.rows["nccl_buffers"]
        reserved, used = cuda_totals(point, self.cuda, outside, memory)
        return Admission(upper, point, reserved, used, row.required, risky)

    def _plan(self, candidate: Candidate, row: GpuRow, admitted: Admission) -> Plan:
        """The candidate's plan on the row's GPU, which admits it with these memory figures (:meth:`_admit`)."""
        seconds = candidate.seconds.get(row.name)
        if seconds is None:
            seconds = self._seconds(candidate, row.gpu, row.links, row.link_id, row.rates)
        parallel = candidate.parallel
        upper = admitted.upper
        return Plan(
            gpu_type=row.name,
            num_gpus=candidate.num_gpus,
            parallel=parallel,
            micro_batch_size=candidate.micro_batch_size,
            precision=row.label,
            peak_allocated_bytes=admitted.point,
            peak_reserved_bytes=admitted.reserved,
            device_used_bytes=admitted.used,
            capacity_bytes=row.memory,
            step_time_s=seconds,
            est_runtime_s=seconds * self._train_steps,
            peak_allocated_upper_bytes=upper.allocated,
            peak_reserved_upper_bytes=upper.reserved,
            device_used_upper_bytes=upper.device_used,
            required_upper_bytes=upper.required,
            required_headroom_bytes=admitted.required,
            step_time_p10_s=seconds * row.low,
            step_time_p90_s=seconds * row.high,
            memory_risk=admitted.risky,
            num_micro_batches=candidate.num_micro_batches,
        )

    def _bare(self, candidate: Candidate, row: GpuRow) -> MemoryBound:
        """The largest required bound over the candidate's peak stages on the row's GPU without the allocator
        reserve. The bound reads of the GPU only its workspaces (by architecture) and its intra-node link
        (NCCL's channels), so the GPUs that agree on both share it (``candidate.bounds``). Those two add the
        same bytes to every stage's required bound without the reserve, so the stage that holds the largest is
        the same on every GPU (``candidate.bare_stage``): the first bound works it out over every stage, the
        others evaluate that stage alone."""
        key = row.key
        known = candidate.bounds.get(key)
        if known is not None:
            return known
        workspaces, intra_node = key
        parallel, runtime = candidate.parallel, self.job.training.runtime
        nccl = self._nccl(parallel, intra_node) if self.cuda is not None else 0
        models = candidate.models if candidate.bare_stage is None else [candidate.models[candidate.bare_stage]]
        bounds = [
            stage_bound(m, parallel.dp, runtime, self.fit, cuda=self.cuda, workspaces=workspaces, nccl=nccl,
                        with_reserve=False, split=split) for m, split in models
        ]  # fmt: skip
        if candidate.bare_stage is None:
            # max's choice: the first stage of the largest required bound
            candidate.bare_stage = max(range(len(bounds)), key=lambda i: bounds[i].required)
            bare = bounds[candidate.bare_stage]
        else:
            bare = bounds[0]
        candidate.bounds[key] = bare
        return bare

    def _nccl(self, p: ParallelConfig, intra_node: str) -> int:
        """:func:`nccl_buffer_bytes` of ``p`` on ``intra_node``, per the degrees its communicators read."""
        key = (p.tp, p.pp, p.dp, p.cp, p.ep, intra_node)
        found = self._nccls.get(key)
        if found is None:
            found = self._nccls[key] = nccl_buffer_bytes(self.job.training.runtime, p, intra_node)
        return found

    def _bound(self, candidate: Candidate, row: GpuRow) -> MemoryBound:
        """The largest required bound over the candidate's peak stages on the row's GPU. The allocator reserve
        (:meth:`_reserve_ratio`) is added only when the bound without it fits: a candidate already refused
        without the reserve is refused with it. Near the GPU's budget (:data:`EXACT_BAND`) the reserve is
        replayed at the candidate's own dp, so that the search admits what
        :func:`frenzy_opt.prediction.marp.predictor.predict_memory`'s bound admits. GPUs of one workspace size
        and link share the bounds (:meth:`_bare`, ``candidate.bounds``); whether the exact replay applies is
        decided per GPU, so the answer does not depend on the order the GPUs are asked in."""
        bare = self._bare(candidate, row)
        if self.cuda is None or not self._bare_fits(candidate, row, bare):  # the reserve decides nothing
            return bare.within(row.memory)
        workspaces = row.key[0]
        nccl = bare.rows["nccl_buffers"]
        bounds = candidate.bounds
        full = bounds.get(row.ratio_key)
        if full is None:
            full = bounds[row.ratio_key] = self._with_reserve(candidate, workspaces, nccl, exact=False)
        if abs(full.required - row.budget) <= EXACT_BAND * full.allocated:
            exact = bounds.get(row.exact_key)
            if exact is None:
                exact = bounds[row.exact_key] = self._with_reserve(candidate, workspaces, nccl, exact=True)
            full = exact
        return full.within(row.memory)

    def _with_reserve(self, candidate: Candidate, workspaces: int, nccl: int, *, exact: bool) -> MemoryBound:
        """The bound with the allocator reserve: its ratio replayed once per stage model (:func:`reserve_ratio`),
        or (``exact``) replayed at the candidate's dp."""
        runtime, dp = self.job.training.runtime, candidate.parallel.dp
        bounds = []
        for m, split in candidate.models:
            ratio = None if exact else self._reserve_ratio(m, dp, runtime, workspaces)
            bounds.append(stage_bound(m, dp, runtime, self.fit, cuda=self.cuda, workspaces=workspaces, nccl=nccl,
                                      reserve_ratio=ratio, split=split))  # fmt: skip
        return max(bounds, key=lambda b: b.required)

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


def parts_key(p: ParallelConfig, micro_batch_size: int) -> tuple[object, ...]:
    """The fields of a candidate that its micro-batch parts (:func:`microbatch_time`) depend on, within one
    GPU group (one model, training config and attention kernel): every field of
    :func:`frenzy_opt.prediction.stepterms.step_terms_of` that those parts read comes from the micro-batch,
    tp, pp, vpp, cp, ep, sequence parallelism and recompute, none from dp or the ZeRO stage (they change only
    what :func:`assemble` adds)."""
    return (micro_batch_size, p.tp, p.pp, p.vpp, p.cp, p.ep, p.sequence_parallel, p.recompute)


def _budget(gpu: GpuType, headroom: float) -> int:
    """Bytes a plan's required bound may take on ``gpu``: its memory less the headroom fraction."""
    return gpu.memory_bytes - int(headroom * gpu.memory_bytes)


def pins_whole_layout(job: JobSpec) -> bool:
    """Whether the job pins every layout field (the pipeline split aside) and its micro-batch size."""
    return {*PARALLEL_FIELDS, "micro_batch_size"} - set(SPLIT_FIELDS) <= job.pinned


def repeats(by_link: list[list[GpuType]], workspaces: dict[str, int]) -> frozenset[str]:
    """The GPUs of ``by_link``'s lists whose memory, workspaces and intra-node link are those of the GPU
    before them in their list: a candidate's bound and memory judgment there are the earlier GPU's
    (:meth:`GpuGroup._bound` and :meth:`GpuGroup._admit` read nothing else of a GPU), e.g. the A100-SXM4-80GB
    and A800-SXM4-80GB, or the H100-SXM5-80GB and H800-SXM5-80GB."""
    out = set()
    for gpus in by_link:
        for before, gpu in itertools.pairwise(gpus):
            if (gpu.memory_bytes, workspaces[gpu.name]) == (before.memory_bytes, workspaces[before.name]):
                out.add(gpu.name)
    return frozenset(out)


def by_link(gpus: list[GpuType]) -> list[list[GpuType]]:
    """GPUs split by intra-node link kind (NCCL's buffers depend on it, nothing else on the GPU does),
    largest memory first."""
    kinds: dict[str, list[GpuType]] = {}
    for gpu in sorted(gpus, key=lambda g: -g.memory_bytes):
        kinds.setdefault(gpu.intra_node, []).append(gpu)
    return list(kinds.values())
