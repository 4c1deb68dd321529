"""Plans: every memory-feasible way to run a job on one GPU type of a cluster.

A plan is a candidate layout (:mod:`frenzy_opt.planning.candidates`: what is tried, and the dominance rules
that shrink the space) on a GPU type and count, with MARP's memory figures and the predicted step time
(:mod:`frenzy_opt.planning.group`: how a candidate becomes the plans of the GPU types sharing a search).
:func:`enumerate_plans` walks the candidates and ranks what fits; the plan records the precision it runs.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from frenzy_opt.core.plan import Plan as Plan  # the record moved to core; re-exported for callers
from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig, check_headroom
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.planning.candidates import (
    RECOMPUTE_ORDER,
    Shape,
    ShapeFloors,
    dominated,
    dp_choices_of,
    shapes,
)
from frenzy_opt.planning.group import GpuGroup, Tally, gpu_groups
from frenzy_opt.prediction.marp.bound import MemoryBound
from frenzy_opt.prediction.marp.cuda import DEFAULT_CUDA, CudaTerms
from frenzy_opt.prediction.marp.fit import SHIPPED_FIT, MemoryFit
from frenzy_opt.prediction.steptime import StepTimeModel, shipped_model


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


DEFAULT_STEP_MODEL = shipped_model()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a plan search. A search allocates tens of thousands of
    short-lived objects, and each allocation burst past the collector's threshold (700 by default) starts
    a collection that walks the young generations, and every tenth of those the older ones, with the
    process's long-lived memos in them (Python docs, ``gc``: "Automatic collection can be disabled ... if
    you are sure your program does not create reference cycles"); the search's objects die by reference
    counting, and the few cycles it makes are collected once the collector runs again. The collector's
    state before is restored (a caller that had it off keeps it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@collector_paused()
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

    A plan is feasible when MARP's required bound (:func:`frenzy_opt.prediction.marp.cuda.stage_bound`: the
    model states as predicted, the activations and temporaries with the fit's margin, the allocator's
    replayed reserve, and what lies outside the allocator) plus the headroom (``headroom``, else
    ``training.memory_headroom``, else the fit's cross-validated default, as a fraction of GPU memory)
    fits the GPU (:mod:`frenzy_opt.prediction.marp.bound`). A shape
    whose lower bound (:func:`frenzy_opt.planning.candidates.lower_bound`, worked out by one
    :class:`ShapeFloors` per training config) exceeds the group's largest GPU is skipped. When no plan fits
    anywhere, a second pass (``prune=False``) finds the least per-GPU footprint of any configuration for
    the error message, skipping shapes whose lower bound exceeds the best footprint found so far.
    """
    headroom = headroom_of(job, headroom, fit)
    tally = Tally()
    plans: list[Plan] = []
    floors: dict[TrainingConfig, ShapeFloors] = {}  # the groups' shared memory floors, per training config
    spaces: dict[tuple[int, int], list[tuple[Shape, list[int]]]] = {}  # shapes, dp choices per node size, count
    for (precision, gpus_per_node, max_gpus, attention), gpus in gpu_groups(job, cluster).items():
        group = GpuGroup(job, gpus, precision, attention, cluster, cuda=cuda, step_model=step_model, fit=fit)
        shared = floors.setdefault(group.base.training, ShapeFloors(group.base))
        space = spaces.get((gpus_per_node, max_gpus))
        if space is None:
            found = list(shapes(job, gpus_per_node, max_gpus))
            dps_of = dp_choices_of(job, found, max_gpus)
            space = spaces[(gpus_per_node, max_gpus)] = list(zip(found, dps_of, strict=True))
        for shape, dps in space:
            # Feasibility search: nothing above the largest GPU matters. Minimum search (no plan anywhere):
            # nothing above the least footprint found so far does (branch and bound).
            limit = group.capacity if prune else (tally.min_device if tally.min_device is not None else sys.maxsize)
            if dps and shared.lower_bound(shape, dps[0]) <= limit:
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


def headroom_of(job: JobSpec, headroom: float | None, fit: MemoryFit) -> float:
    """The headroom fraction a search admits plans with: the caller's, else the job's, else the fit's."""
    if headroom is None:
        headroom = job.training.memory_headroom
    if headroom is None:
        headroom = fit.headroom_fraction
    check_headroom("headroom", headroom)
    return headroom


def _dp_scan(
    group: GpuGroup,
    shape: Shape,
    dps: list[int],
    limit: int,
    headroom: float,
    tally: Tally,
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
        for parallel in group.configs_at(shape, dp):
            found = group.plans_of(parallel, shape.micro_batch_size, limit, headroom, tally)
            fitted = fitted or bool(found)
            plans += accepted_plans(found, parallel, shape.micro_batch_size, limit, headroom, tally, group, plan_filter)
        exhausted = not fitted  # memory only: a filter's refusals say nothing about smaller dp
    return plans


def accepted_plans(
    found: list[Plan],
    parallel: ParallelConfig,
    micro_batch_size: int,
    limit: int,
    headroom: float,
    tally: Tally,
    group: GpuGroup,
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


def rank_plans(plans: list[Plan]) -> list[Plan]:
    """Best first (:func:`rank_key`). The key's first field, the step time, decides almost every comparison,
    so the plans are sorted on it alone (a float compares several times faster than the key's tuple) and only
    the runs of equal step times are sorted again on the whole key: the same order as one sort on
    :func:`rank_key` (a total order, so any correct sort gives it)."""
    ordered = sorted(plans, key=_step_time_key)
    times = [_step_time_key(p) for p in ordered]
    start = 0
    for end in range(1, len(ordered) + 1):
        if end == len(ordered) or times[end] != times[start]:
            if end - start > 1:
                ordered[start:end] = sorted(ordered[start:end], key=rank_key)
            start = end
    return ordered


def _step_time_key(p: Plan) -> float:
    """:func:`rank_key`'s first field."""
    return p.step_time_s if p.step_time_s is not None else 0.0


_RECOMPUTE_RANK = {mode: i for i, mode in enumerate(RECOMPUTE_ORDER)}
"""A recompute mode's place in :data:`RECOMPUTE_ORDER` (:func:`rank_key`)."""


def rank_key(p: Plan) -> tuple[object, ...]:
    """By predicted step time (None ranks as 0, before timed plans); then fewest GPUs, the least recompute
    (full recompute re-runs the forward pass, about a third more compute, Korthikanti et al. 2022, Sec. 5)
    and the most memory headroom. A total order: equal keys are broken on the plan's own fields."""
    return (
        p.step_time_s if p.step_time_s is not None else 0.0,
        p.num_gpus,
        _RECOMPUTE_RANK[p.parallel.recompute],
        -p.headroom_bytes,
        # Ties broken on the plan itself, so the order never depends on the search order.
        p.gpu_type,
        -p.micro_batch_size,
        (p.parallel.dp, p.parallel.tp, p.parallel.pp, p.parallel.vpp, p.parallel.cp, p.parallel.ep),
        p.parallel.zero_stage,
        p.parallel.sequence_parallel,
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
