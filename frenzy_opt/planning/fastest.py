"""The fastest plan for every (GPU type, GPU count), found without building the plans that lose.

A scheduler needs, per GPU type and count, one plan: the one :func:`frenzy_opt.planning.plans.enumerate_plans`
ranks first among its plans of that type and count (:func:`frenzy_opt.planning.problem.best_per_count`). Most
of a full search's time goes into proving that plans fit: MARP's bound adds the caching allocator's reserve,
which a replay of the allocator gives (:func:`frenzy_opt.planning.group.reserve_ratio`), for every candidate
whose bound without it fits. :func:`fastest_plans` hands each GPU group to the best-first search of
:mod:`frenzy_opt.planning.bestfirst`, which builds the memory model of only the candidates that come first in
step-time order. With a plan filter or measured layer profiles (which that search does not serve) it walks the
same candidates in the same order as the full search, in two passes:

1. **Screen** every candidate: its allocated peak and its bound without the reserve on each GPU of its group
   (a candidate refused without the reserve is refused with it), and its step time on each GPU where that
   bound fits. The dp scan stops where the full search's would stop for certain (no GPU of the group takes
   any candidate at a dp >= 2 even without the reserve).
2. **Decide** per (GPU type, count): the screened candidates in rank order (step time, then the least
   recompute); the first whose full bound fits wins, after the candidates tied with it on that key are
   decided too and the tie is broken by :func:`frenzy_opt.planning.plans.rank_key`. A candidate at a dp
   >= 2 counts only if the full search reached it: every larger dp of its shape had a plan on some GPU of
   the group (decided on demand, :meth:`_Shape.reached`).

The answer is the same plan for every (GPU type, count) as the full search's (``tests/test_fastest.py``
checks it on jobs across runtimes, precisions, MoE, pinned fields and a plan filter). A plan filter must
judge a layout only (the plan's parallel config, micro-batch size and count, as the executors' do): it is
asked once per candidate, with a plan carrying the candidate's layout and no memory figures; a candidate it
refuses takes the full search's path (:func:`frenzy_opt.planning.plans.accepted_plans`: the layouts the
dominance rules set aside stand in). A job that pins its whole layout has one candidate: the full search
serves it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from frenzy_opt.core.plan import Plan
from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.planning.bestfirst import Admit, GroupBestFirst, ShapeSpace
from frenzy_opt.planning.candidates import (
    RECOMPUTE_ORDER,
    Shape,
    ShapeFloors,
    configs_at,
    dp_choices,
    shapes,
)
from frenzy_opt.planning.group import Candidate, GpuGroup, Tally, gpu_groups, pins_whole_layout
from frenzy_opt.planning.plans import (
    DEFAULT_STEP_MODEL,
    accepted_plans,
    collector_paused,
    enumerate_plans,
    headroom_of,
    rank_key,
)
from frenzy_opt.prediction.marp.cuda import DEFAULT_CUDA, CudaTerms
from frenzy_opt.prediction.marp.fit import SHIPPED_FIT, MemoryFit
from frenzy_opt.prediction.steptime import StepTimeModel


@collector_paused()
def fastest_plans(
    job: JobSpec,
    cluster: ClusterSpec,
    *,
    cuda: CudaTerms | None = DEFAULT_CUDA,
    step_model: StepTimeModel = DEFAULT_STEP_MODEL,
    fit: MemoryFit = SHIPPED_FIT,
    headroom: float | None = None,
    plan_filter: Callable[[Plan], bool] | None = None,
    admit: Admit | None = None,
) -> list[Plan]:
    """For every (GPU type, GPU count) that ``admit`` accepts (all when None), the plan
    :func:`enumerate_plans` with the same arguments ranks first among its plans of that type and count
    (module docstring); none for a pair without a plan."""
    if pins_whole_layout(job):
        return _first_per_count(enumerate_plans(job, cluster, cuda=cuda, step_model=step_model, fit=fit,
                                                headroom=headroom, plan_filter=plan_filter).plans, admit)  # fmt: skip
    headroom = headroom_of(job, headroom, fit)
    winners: list[Plan] = []
    floors: dict[TrainingConfig, ShapeFloors] = {}  # the groups' shared memory floors, per training config
    spaces: dict[tuple[TrainingConfig, int, int], ShapeSpace] = {}  # and their shapes, per node size and count
    for (precision, gpus_per_node, max_gpus, attention), gpus in gpu_groups(job, cluster).items():
        group = GpuGroup(job, gpus, precision, attention, cluster, cuda=cuda, step_model=step_model, fit=fit)
        shared = floors.setdefault(group.base.training, ShapeFloors(group.base))
        if plan_filter is None and not step_model.profiles:
            space = spaces.get((group.base.training, gpus_per_node, max_gpus))
            if space is None:
                space = spaces[(group.base.training, gpus_per_node, max_gpus)] = ShapeSpace(group.base, gpus_per_node,
                                                                                           max_gpus)  # fmt: skip
            winners += GroupBestFirst(group, headroom, gpus_per_node, max_gpus, admit, shared, space).run()
            continue
        search = _GroupSearch(group, headroom, plan_filter, admit)
        for shape in shapes(job, gpus_per_node, max_gpus):
            dps = dp_choices(job, shape, max_gpus)
            if dps and shared.lower_bound(shape, dps[0]) <= group.capacity:
                search.screen(shape, dps)
        winners += search.decide()
    return winners


def _first_per_count(plans: list[Plan], admit: Admit | None) -> list[Plan]:
    """The first plan of each (GPU type, count) in ``plans`` (ranked), those ``admit`` accepts."""
    best: dict[tuple[str, int], Plan] = {}
    for plan in plans:
        key = (plan.gpu_type, plan.num_gpus)
        if key not in best and (admit is None or admit(*key)):
            best[key] = plan
    return list(best.values())


@dataclass(slots=True, eq=False)
class _Entry:
    """A screened candidate at one dp of a shape: its GPUs whose bound without the reserve fits (``open``,
    decided by :meth:`GpuGroup.resolve`) and the plans already decided (``settled``)."""

    level: _Level
    candidate: Candidate | None
    """None once nothing is left to decide (no open GPU), and for a candidate the plan filter refused (its
    stand-ins' plans are ``settled``)."""
    open: list[GpuType] = field(default_factory=list)
    settled: list[Plan] = field(default_factory=list)
    fits: bool | None = None
    """Whether the candidate has a plan on some GPU of the group, whatever the filter (None: not known)."""


@dataclass(slots=True, eq=False)
class _Level:
    """One dp of a shape's scan."""

    scan: _Scan
    index: int
    dp: int
    entries: list[_Entry] = field(default_factory=list)
    fitted: bool | None = None

    def maybe_fitted(self) -> bool:
        """Whether a candidate of the level may have a plan (its bound without the reserve fits somewhere)."""
        return any(entry.fits is not False for entry in self.entries)


@dataclass(slots=True, eq=False)
class _Scan:
    """A shape's dp scan, largest dp first, as far as screening went."""

    levels: list[_Level] = field(default_factory=list)

    def reached(self, level: _Level, fits: Callable[[_Entry], bool]) -> bool:
        """Whether the full search evaluates ``level``: dp = 1 always; a dp >= 2 when every dp before it had
        a plan (:func:`frenzy_opt.planning.plans.enumerate_plans`)."""
        if level.dp < 2:
            return True
        for earlier in self.levels[: level.index]:
            if earlier.fitted is None:
                earlier.fitted = any(fits(entry) for entry in earlier.entries)
            if not earlier.fitted:
                return False
        return True


_Item = tuple[float, int, int, _Entry, Plan | None]
"""(step time, recompute rank, arrival, the entry, its settled plan or None for an open GPU)."""


class _GroupSearch:
    """The two passes (module docstring) over one GPU group."""

    def __init__(
        self, group: GpuGroup, headroom: float, plan_filter: Callable[[Plan], bool] | None, admit: Admit | None
    ) -> None:
        self.group, self.headroom, self.plan_filter, self.admit = group, headroom, plan_filter, admit
        self.gpus = {gpu.name: gpu for link_gpus in group.by_link for gpu in link_gpus}
        self.pools: dict[tuple[str, int], list[_Item]] = {}
        self.tally = Tally()

    def screen(self, shape: Shape, dps: list[int]) -> None:
        scan = _Scan()
        for dp in dps:
            if dp >= 2 and scan.levels and not scan.levels[-1].maybe_fitted():
                continue  # the full search stops here for certain: nothing fits even without the reserve
            level = _Level(scan, len(scan.levels), dp)
            scan.levels.append(level)
            for parallel in configs_at(self.group.base, shape, dp):
                entry = self._entry(level, parallel, shape.micro_batch_size)
                level.entries.append(entry)
                self._pool(entry)

    def _entry(self, level: _Level, parallel: ParallelConfig, micro_batch_size: int) -> _Entry:
        group, headroom, limit = self.group, self.headroom, self.group.capacity
        if self.plan_filter is not None and not self.plan_filter(_probe(group, parallel, micro_batch_size)):
            found = group.plans_of(parallel, micro_batch_size, limit, headroom, self.tally)
            plans = accepted_plans(found, parallel, micro_batch_size, limit, headroom, self.tally, group,
                                   self.plan_filter)  # fmt: skip
            return _Entry(level, None, settled=plans, fits=bool(found))
        candidate = group.candidate(parallel, micro_batch_size, limit)
        entry = _Entry(level, candidate)
        for gpu in self.gpus.values():
            if group.needs_reserve(candidate, gpu, headroom):
                entry.open.append(gpu)
            elif (plan := group.resolve(candidate, gpu, headroom)) is not None:
                entry.settled.append(plan)
        entry.fits = True if entry.settled else (None if entry.open else False)
        if not entry.open:
            entry.candidate = None  # nothing left to decide: let its models and bounds go
        return entry

    def _pool(self, entry: _Entry) -> None:
        for plan in entry.settled:
            self._add(plan.gpu_type, plan.num_gpus, plan.step_time_s or 0.0, plan.parallel.recompute, entry, plan)
        if entry.candidate is not None:
            parallel = entry.candidate.parallel
            for gpu in entry.open:
                seconds = self.group.seconds(entry.candidate, gpu)
                self._add(gpu.name, parallel.num_gpus, seconds, parallel.recompute, entry, None)

    def _add(self, gpu: str, count: int, seconds: float, recompute: str, entry: _Entry, plan: Plan | None) -> None:
        if self.admit is None or self.admit(gpu, count):
            pool = self.pools.setdefault((gpu, count), [])
            pool.append((seconds, RECOMPUTE_ORDER.index(recompute), len(pool), entry, plan))

    def decide(self) -> list[Plan]:
        winners = []
        for (gpu, _), pool in sorted(self.pools.items()):
            if (plan := self._first(pool, self.gpus[gpu])) is not None:
                winners.append(plan)
        return winners

    def _first(self, pool: list[_Item], gpu: GpuType) -> Plan | None:
        """The best plan of one (GPU type, count): the first tie group (equal step time and recompute) in
        rank order with a plan the full search reaches, its tie broken by :func:`rank_key`."""
        pool.sort(key=lambda item: item[:3])
        for _, tie in itertools.groupby(pool, key=lambda item: item[:2]):
            plans = [plan for item in tie if (plan := self._plan(item, gpu)) is not None]
            if plans:
                return min(plans, key=rank_key)
        return None

    def _plan(self, item: _Item, gpu: GpuType) -> Plan | None:
        entry, settled = item[3], item[4]
        if not entry.level.scan.reached(entry.level, self._fits):
            return None
        if settled is not None or entry.candidate is None:
            return settled
        return self.group.resolve(entry.candidate, gpu, self.headroom)

    def _fits(self, entry: _Entry) -> bool:
        if entry.fits is None:
            assert entry.candidate is not None  # a filtered entry's answer is known
            entry.fits = any(self.group.resolve(entry.candidate, gpu, self.headroom) for gpu in entry.open)
        return entry.fits


def _probe(group: GpuGroup, parallel: ParallelConfig, micro_batch_size: int) -> Plan:
    """A plan carrying only a candidate's layout, for a plan filter (module docstring)."""
    gpu = next(iter(group.labels))
    return Plan(
        gpu_type=gpu,
        num_gpus=parallel.num_gpus,
        parallel=parallel,
        micro_batch_size=micro_batch_size,
        precision=group.labels[gpu],
        peak_allocated_bytes=0,
        peak_reserved_bytes=0,
        device_used_bytes=0,
        capacity_bytes=0,
        num_micro_batches=group.job.training.num_micro_batches(parallel.dp, micro_batch_size),
    )
