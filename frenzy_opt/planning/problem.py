"""The scheduling problem every solver gets: jobs with arrivals, weights and candidate plans, the cluster's
topology, its current occupancy; and the schedule a solver returns, with its checks and metrics.

A job's candidate plans (:class:`Option`) come from :func:`frenzy_opt.planning.fastest.fastest_plans` (the plan
:func:`frenzy_opt.planning.plans.enumerate_plans` ranks first for each GPU type and count): per GPU type,
the Pareto front of GPU count against predicted runtime among the plans the placement rule admits
(:meth:`frenzy_opt.hardware.topology.Topology.nodes_needed`), at most ``max_options_per_type`` of them: the one of
fewest GPUs and those some price of GPU-seconds makes the cheapest (:func:`thin_fronts`). Durations are the plans'
``est_runtime_s`` rounded up to whole seconds and arrivals are rounded up to whole seconds too, so the exact solvers'
integer time is the problem's own.

JCT of a job = end - arrival; the objective = sum of weight x JCT (contract 3).
"""

from __future__ import annotations

import gc
import math
import sys
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from types import BuiltinFunctionType, FunctionType, ModuleType
from typing import TypeVar

from frenzy_opt.core.enums import SolverStatus
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.placement import per_node
from frenzy_opt.hardware.topology import Topology, topology_of
from frenzy_opt.planning.fastest import fastest_plans
from frenzy_opt.planning.plans import DEFAULT_STEP_MODEL, Plan
from frenzy_opt.planning.scenario import Scenario
from frenzy_opt.prediction.steptime import StepTimeModel

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """One way to run a job: a plan, its placement shape and its duration."""

    gpu_type: str
    num_gpus: int
    whole_nodes: int
    """0: inside one node; k > 0: k whole nodes."""
    duration_s: float
    plan: Plan

    @property
    def gpus_per_node(self) -> int:
        """GPUs the option holds on each node it is placed on."""
        return per_node(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProblemJob:
    id: str
    arrival_s: float
    weight: float
    options: tuple[Option, ...]
    priority: int = 0
    """Higher first: the HAS serves every queued job of a higher priority class before any of a lower one,
    and preempts only jobs of a lower or equal class (``scheduling.priority`` of the job spec)."""
    deadline_s: float | None = None
    """When the job should end (absolute seconds, same clock as ``arrival_s``); None: no deadline."""
    restart_s: float = 0.0
    """What a stop and restart costs the job (checkpoint save and load, start-up, warm-up:
    :mod:`frenzy_opt.planning.restart`): the HAS preempts or resizes a running job only when the gain exceeds
    it."""
    preemptible: bool = True
    """The spec's ``scheduling.preemptible``: false, the HAS never stops it once started."""
    max_moves: int | None = None
    """The spec's ``scheduling.max_moves``: at most this many stops over its life."""

    @property
    def fastest_s(self) -> float:
        return min(o.duration_s for o in self.options)


@dataclass(frozen=True, slots=True, kw_only=True)
class Busy:
    """GPUs already held on a node until a time (the current occupancy)."""

    node: int
    num_gpus: int
    until_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulingProblem:
    topology: Topology
    jobs: tuple[ProblemJob, ...]
    busy: tuple[Busy, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignment:
    job: str
    option: Option
    nodes: tuple[int, ...]
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A solver's answer. ``bound`` is a proven lower bound on ``objective`` where the solver proves one."""

    solver: str
    status: SolverStatus
    assignments: tuple[Assignment, ...]
    solve_time_s: float
    bound: float | None = None


def best_per_count(plans: list[Plan], topology: Topology, *, round_up: bool = True) -> dict[tuple[str, int], Option]:
    """The fastest plan for every (GPU type, GPU count) the placement rule admits, as options."""
    best: dict[tuple[str, int], Plan] = {}
    for plan in plans:
        if plan.est_runtime_s is None or topology.nodes_needed(plan.gpu_type, plan.num_gpus) < 0:
            continue
        key = (plan.gpu_type, plan.num_gpus)
        if key not in best or plan.est_runtime_s < (best[key].est_runtime_s or 0.0):
            best[key] = plan
    return {
        key: Option(
            gpu_type=plan.gpu_type,
            num_gpus=plan.num_gpus,
            whole_nodes=topology.nodes_needed(plan.gpu_type, plan.num_gpus),
            duration_s=float(math.ceil(plan.est_runtime_s or 0.0)) if round_up else plan.est_runtime_s or 0.0,
            plan=plan,
        )
        for key, plan in sorted(best.items())
    }


def pareto_options(per_count: dict[tuple[str, int], Option], max_options_per_type: int = 4) -> tuple[Option, ...]:
    """Per GPU type the options that beat every option with fewer GPUs, thinned to at most
    ``max_options_per_type`` spread from the fewest GPUs to the fastest (module docstring)."""
    by_type: dict[str, list[Option]] = defaultdict(list)
    for (gpu_type, _), option in sorted(per_count.items()):
        front = by_type[gpu_type]
        if not front or option.duration_s < front[-1].duration_s:
            front.append(option)
    return thin_fronts(by_type.values(), max_options_per_type)


def undominated(items: Sequence[T], shape: Callable[[T], tuple[str, int, float]]) -> list[T]:
    """The items no other of the same GPU type beats on both GPUs and duration (``shape``: an item's GPU type,
    GPU count and duration), in their order: a dominated one holds more GPUs for longer, so dropping it leaves a
    relaxation's optimum unchanged (the LP bounds of :mod:`frenzy_opt.solvers.lpbound` and
    :mod:`frenzy_opt.solvers.jctbound`)."""
    shapes = [shape(item) for item in items]
    return [
        item
        for item, (gpu_type, gpus, duration) in zip(items, shapes, strict=True)
        if not any(t == gpu_type and n <= gpus and d <= duration and (n, d) != (gpus, duration) for t, n, d in shapes)
    ]


def thin_fronts(fronts: Iterable[list[Option]], max_options_per_type: int) -> tuple[Option, ...]:
    """Each per-type front (ordered from the fewest GPUs to the fastest) cut to at most ``max_options_per_type``
    options: its fewest-GPU option (it fits where little is free) and the options some price of GPU-seconds
    makes the cheapest (:func:`supported`), spread evenly over them if there are more (both ends kept), the rest
    of the front spread evenly in the slots left; all fronts concatenated. Spread evenly over the whole front,
    the cut kept counts that scale badly and dropped the lean ones between them (a 13B model on H100s: 80, 160
    and 512 GPUs at 453 to 555 GPU-seconds per step kept, 16, 64 and 256 at 367 to 420 dropped), and a job
    priced by the queue behind it could only run wide by wasting GPUs: on ``cluster2048-llm`` frenzy's p99 JCT
    was 15.4 % above sia's with that cut and is 10.3 % with this one, its average 43.3 % and 44.3 % below
    (``benchmarks/results/compare-frenzy-sia-cluster2048.md``, 8 seeds)."""
    options: list[Option] = []
    for front in fronts:
        if len(front) > max_options_per_type:
            front = _thin(front, max_options_per_type)
        options += front
    return tuple(options)


def supported(front: Sequence[Option]) -> list[int]:
    """The indices in ``front`` of the options that minimise ``duration + price x GPU-seconds`` for some price
    >= 0, fewest GPUs first: the lower convex hull of the points (GPU-seconds, duration) from the least
    GPU-seconds to the fastest (a linear cost over a finite set is minimised at a vertex of its convex hull;
    Boyd & Vandenberghe 2004, §2.5). An option off it is never the cheapest of those that fit, whatever the
    queue makes a GPU-second cost (the greedy's marginal cost, :mod:`frenzy_opt.solvers.greedy`): it can only
    matter where fewer GPUs are free than its neighbours on the hull need."""
    points = sorted(range(len(front)), key=lambda i: (front[i].num_gpus * front[i].duration_s, front[i].duration_s))
    hull: list[int] = []
    for i in points:
        work, duration = front[i].num_gpus * front[i].duration_s, front[i].duration_s
        if hull and duration >= front[hull[-1]].duration_s:
            continue  # more GPU-seconds and no faster: dominated
        while len(hull) >= 2:
            a, b = front[hull[-2]], front[hull[-1]]
            wa, wb = a.num_gpus * a.duration_s, b.num_gpus * b.duration_s
            # b is on or above the segment a -> i: drop it
            if (wb - wa) * (a.duration_s - duration) >= (work - wa) * (a.duration_s - b.duration_s):
                hull.pop()
            else:
                break
        hull.append(i)
    return sorted(hull, key=lambda i: front[i].num_gpus)


def _spread(indices: list[int], count: int) -> list[int]:
    """``count`` of ``indices`` spread evenly, both ends kept (the middle one alone for one)."""
    if len(indices) <= count:
        return indices
    if count == 1:
        return [indices[len(indices) // 2]]
    step = (len(indices) - 1) / (count - 1)
    return [indices[round(k * step)] for k in range(count)]


def _thin(front: list[Option], count: int) -> list[Option]:
    """``count`` options of ``front`` (longer than ``count``), as :func:`thin_fronts` says."""
    hull = supported(front)
    if hull[0] == 0:
        keep = _spread(hull, count)
    else:  # one slot left for the hull: its fastest end (what a job takes with nobody behind it)
        keep = [0, *(_spread(hull, count - 1) if count > 2 else hull[-1:])]
    rest = [i for i in range(len(front)) if i not in keep]
    return [front[i] for i in sorted(keep + _spread(rest, count - len(keep)) if len(keep) < count else keep)]


def options_for(
    plans: list[Plan], topology: Topology, max_options_per_type: int = 4, *, round_up: bool = True
) -> tuple[Option, ...]:
    """The candidate :class:`Option` set of one job (module docstring); ``round_up=False`` keeps the
    plans' exact runtimes (for :class:`OptionCache`, which rounds after rescaling)."""
    return pareto_options(best_per_count(plans, topology, round_up=round_up), max_options_per_type)


PlanFilter = Callable[[Plan, JobSpec], bool]
"""Which plans of a job become options (e.g. what an executor runs); given the plan and the job's spec."""

CACHE_BYTES = 256 << 20
"""Default bound of an :class:`OptionCache` in retained bytes. A search of a 2,048-GPU cluster
(``scenarios/cluster-2048.yaml``) retains 11 to 54 kB, whether made here or adopted from a worker process
(measured: the bytes tracemalloc sees freed when the entry is dropped, five models from gpt3-125m to
llama3.1-405b; MARP's memo caches, which a search fills too, are bounded on their own and not counted), so
256 MiB keeps about 5,000 searches of the largest kind: more than the 4,096 the count bound kept before, at a
known worst case however many distinct jobs a service sees."""


def search_key(spec: JobSpec) -> tuple[object, ...]:
    """What changes a job's plan search: everything but its name, step count and the scheduling fields other
    than ``max_gpus`` (a tuple: cheaper to build than a new :class:`JobSpec`)."""
    t = spec.training
    return (
        spec.model,
        spec.parallel,
        spec.pinned,
        t.seq_len,
        t.micro_batch_size,
        t.global_batch_size,
        t.precision,
        t.optimizer,
        t.runtime,
        spec.scheduling.max_gpus,
    )


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Searched:
    """One plan search of a job shape (:func:`search_options`) and what it was made with:
    :meth:`OptionCache.adopt` takes only one made with the cache's own step model, filter and option count."""

    key: tuple[object, ...]
    """The shape searched (:func:`search_key`)."""
    step_model: StepTimeModel
    plan_filter: PlanFilter | None
    max_options_per_type: int
    per_count: dict[tuple[str, int], Option]
    """The fastest one-step option for every admissible (GPU type, GPU count); shared, do not modify."""
    options: tuple[Option, ...]
    """The candidate options for one training step (durations not rounded)."""


def search_options(
    spec: JobSpec,
    cluster: ClusterSpec,
    *,
    step_model: StepTimeModel = DEFAULT_STEP_MODEL,
    plan_filter: PlanFilter | None = None,
    max_options_per_type: int = 4,
    topology: Topology | None = None,
) -> Searched:
    """The plan search :class:`OptionCache` makes for a job shape, as a function of picklable arguments so that
    a worker process can run it (``topology``: the cluster's, built if not given).

    The fastest plan of one training step (name and step count dropped) per admissible (GPU type, GPU
    count), capped at ``scheduling.max_gpus`` (:func:`frenzy_opt.planning.fastest.fastest_plans`: the plan
    :func:`enumerate_plans` ranks first there, filtered inside the search before its dominance rules prune),
    as options with runtimes not rounded; and the thinned Pareto options of those. ``plan_filter`` judges a
    plan's layout only (what the executors' filters do; :mod:`frenzy_opt.planning.fastest`)."""
    topology = topology or topology_of(cluster)
    one_step = replace(spec, name="", training=replace(spec.training, train_steps=1))
    accept = None if plan_filter is None else (lambda plan: plan_filter(plan, spec))
    cap = spec.scheduling.max_gpus

    def admit(gpu_type: str, count: int) -> bool:
        return (cap is None or count <= cap) and topology.nodes_needed(gpu_type, count) >= 0

    plans = fastest_plans(one_step, cluster, step_model=step_model, plan_filter=accept, admit=admit)
    per_count = best_per_count(plans, topology, round_up=False)
    return Searched(
        key=search_key(spec),
        step_model=step_model,
        plan_filter=plan_filter,
        max_options_per_type=max_options_per_type,
        per_count=per_count,
        options=pareto_options(per_count, max_options_per_type),
    )


_NOT_OWNED = (type, ModuleType, FunctionType, BuiltinFunctionType, bool, Enum)


def retained_bytes(*roots: object) -> int:
    """Bytes of every object reachable from ``roots`` (``sys.getsizeof``, each object counted once), not
    entering classes, functions, modules or enum members, nor counting the interpreter's shared singletons
    (None, booleans, the small ints -5..256). What the roots share with the rest of the process (a GPU type's
    name, numbers MARP's memo holds too) is counted and the allocator's own overhead is not: for the searches of
    :class:`OptionCache` this came within 7 % of the bytes tracemalloc sees freed when the search is dropped
    (2,048- and 48-GPU clusters, 5 to 28 kB; ``tests/test_admission.py`` checks 15 %)."""
    seen: set[int] = set()
    stack = list(roots)
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, _NOT_OWNED):
            continue
        if type(obj) is int and -5 <= obj <= 256:  # CPython's preallocated small ints
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


class OptionCache:
    """Candidate options per job, computed once per distinct job shape.

    A plan's runtime is its step time x ``train_steps`` (:func:`frenzy_opt.planning.plans.enumerate_plans`) and
    the Pareto front and its thinning only compare runtimes of one job, so they do not depend on the step
    count: jobs that differ only in name and steps share one plan search (:func:`search_options`), and each
    gets the shared options with durations rescaled. Workloads of tens of thousands of jobs built from a few
    dozen model/config templates need a few dozen searches, not one per job.

    The searches kept are bounded in bytes (``max_bytes``, :data:`CACHE_BYTES`): each entry's retained size is
    measured when it is inserted (:func:`retained_bytes`), a running total kept, and the least recently used
    entries dropped while the total exceeds the bound. A search made elsewhere (the service's admission, in a
    worker process) is inserted by :meth:`adopt`.

    One thread writes the cache (a lookup writes too: it searches, inserts or refreshes recency). A cache
    shared between threads is :meth:`claim`-ed by its writer (the service's scheduling loop), and then any
    other thread's lookup or adoption fails an assertion; :meth:`cached` (a read) may be called from any thread.
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        topology: Topology,
        max_options_per_type: int = 4,
        plan_filter: PlanFilter | None = None,
        step_model: StepTimeModel = DEFAULT_STEP_MODEL,
        max_bytes: int = CACHE_BYTES,
        max_searches: int | None = None,
    ) -> None:
        self.cluster = cluster
        self.topology = topology
        self.max_options_per_type = max_options_per_type
        self.plan_filter = plan_filter
        """Only plans it accepts become options (e.g. what an executor can run)."""
        self.step_model = step_model
        self.max_bytes = max_bytes
        """Retained bytes of the searches kept (least recently used dropped first; the newest is always kept)."""
        self.max_searches = max_searches
        """An optional bound on the number of searches kept as well (None: the bytes alone)."""
        self.cache_bytes = 0
        """Retained bytes of the searches kept now (the sum of their measured sizes)."""
        self.searches_run = 0
        """Searches this cache made itself (not adopted)."""
        self.adopted = 0
        """Searches made elsewhere that :meth:`adopt` inserted."""
        self._searches: OrderedDict[tuple[object, ...], tuple[Searched, int]] = OrderedDict()
        self._writer: int | None = None
        """The thread that may write (:meth:`claim`); None: whichever thread uses it (a cache of one thread)."""

    def claim(self) -> None:
        """Make the calling thread the cache's only writer (class docstring)."""
        self._writer = threading.get_ident()

    def _writing(self) -> None:
        assert self._writer in (None, threading.get_ident()), (
            f"plan cache written from thread {threading.current_thread().name!r}, not its writer's"
        )

    def __len__(self) -> int:
        """Searches kept."""
        return len(self._searches)

    def _search(self, spec: JobSpec) -> Searched:
        self._writing()
        key = search_key(spec)
        found = self._searches.get(key)
        if found is not None:
            self._searches.move_to_end(key)
            return found[0]
        searched = search_options(
            spec,
            self.cluster,
            step_model=self.step_model,
            plan_filter=self.plan_filter,
            max_options_per_type=self.max_options_per_type,
            topology=self.topology,
        )
        self.searches_run += 1
        self._insert(key, searched)
        return searched

    def _insert(self, key: tuple[object, ...], searched: Searched) -> None:
        """Keep a search with its measured size; drop the least recently used beyond the bounds."""
        size = retained_bytes(searched.per_count, searched.options) + sys.getsizeof(searched) + sys.getsizeof(key)
        self._searches[key] = (searched, size)
        self.cache_bytes += size
        count = self.max_searches
        while len(self._searches) > 1 and (
            self.cache_bytes > self.max_bytes or (count is not None and len(self._searches) > count)
        ):
            _, (_, dropped) = self._searches.popitem(last=False)
            self.cache_bytes -= dropped

    def cached(self, spec: JobSpec) -> Searched | None:
        """The search of ``spec``'s shape if the cache holds it, leaving its recency alone: one dict read, so
        another thread than the cache's writer may ask (atomic under the interpreter lock)."""
        found = self._searches.get(search_key(spec))
        return None if found is None else found[0]

    def adopt(self, spec: JobSpec, searched: Searched) -> bool:
        """Insert a search made elsewhere (a worker process: :func:`search_options`) as if this cache had made
        it, if it was made for ``spec``'s shape with this cache's own step model, filter and option count;
        else (e.g. made before the closed loop replaced the step model) ignore it, and the next lookup
        searches. True if the cache holds the shape's search now."""
        self._writing()
        key = search_key(spec)
        if key in self._searches:
            return True
        if (
            searched.key != key
            or searched.plan_filter != self.plan_filter
            or searched.max_options_per_type != self.max_options_per_type
            or searched.step_model != self.step_model
        ):
            return False
        self.adopted += 1
        # Equal, not the same: a copy unpickled from a worker; keep the cache's own and let the copies go.
        self._insert(key, replace(searched, key=key, step_model=self.step_model, plan_filter=self.plan_filter))
        return True

    def per_step(self, spec: JobSpec) -> tuple[Option, ...]:
        """The candidate options of ``spec`` for one training step (durations not rounded)."""
        return self._search(spec).options

    def per_count(self, spec: JobSpec) -> dict[tuple[str, int], Option]:
        """The fastest one-step option of ``spec`` for every admissible (GPU type, GPU count); shared, do
        not modify."""
        return self._search(spec).per_count

    def options(self, spec: JobSpec) -> tuple[Option, ...]:
        """Options of ``spec`` with durations for its ``train_steps`` (whole seconds)."""
        steps = spec.training.train_steps
        return tuple(scale_option(o, steps) for o in self.per_step(spec))


def scale_option(per_step: Option, steps: float) -> Option:
    """The option of a one-step job stretched to ``steps`` steps (duration rounded up to whole seconds)."""
    runtime = (per_step.plan.step_time_s or 0.0) * steps
    return replace(
        per_step,
        duration_s=float(math.ceil(runtime)),
        plan=replace(per_step.plan, est_runtime_s=runtime),
    )


def problem_job(job_id: str, arrival_s: float, weight: float, options: tuple[Option, ...], spec: JobSpec) -> ProblemJob:
    """The scheduler's view of a submitted job: its options and the spec's ``scheduling`` section (the
    deadline, relative to submission in the spec, becomes absolute)."""
    deadline = spec.scheduling.deadline_s
    return ProblemJob(
        id=job_id,
        arrival_s=arrival_s,
        weight=weight,
        options=options,
        priority=spec.scheduling.priority,
        deadline_s=None if deadline is None else arrival_s + deadline,
        preemptible=spec.scheduling.preemptible,
        max_moves=spec.scheduling.max_moves,
    )


def no_option_message(job_id: str, spec: JobSpec, cluster_name: str) -> str:
    """Why a job has no option, naming ``scheduling.max_gpus`` when it is the cause."""
    cap = spec.scheduling.max_gpus
    extra = f" with at most scheduling.max_gpus={cap} GPUs" if cap is not None else ""
    return f"job {job_id}: no memory-feasible plan{extra} fits the placement rules of {cluster_name}"


def build_problem(
    scenario: Scenario, *, max_options_per_type: int = 4, cache: OptionCache | None = None
) -> SchedulingProblem:
    """The problem of a scenario: every job's options on the scenario's cluster. ``ValueError`` names a job
    that fits nowhere."""
    if cache is None:
        cache = OptionCache(scenario.cluster, Topology(scenario.cluster), max_options_per_type)
    jobs = []
    for job in scenario.jobs:
        options = cache.options(job.spec)
        if not options:
            raise ValueError(no_option_message(job.id, job.spec, scenario.cluster.name))
        jobs.append(problem_job(job.id, float(math.ceil(job.arrival_s)), job.weight, options, job.spec))
    return SchedulingProblem(topology=cache.topology, jobs=tuple(jobs))


# --- metrics and checks --------------------------------------------------------------------------------


def objective(problem: SchedulingProblem, schedule: Schedule) -> float:
    """Sum over jobs of weight x JCT."""
    arrival = {j.id: (j.arrival_s, j.weight) for j in problem.jobs}
    return sum(arrival[a.job][1] * (a.end_s - arrival[a.job][0]) for a in schedule.assignments)


def avg_jct_s(problem: SchedulingProblem, schedule: Schedule) -> float:
    arrival = {j.id: j.arrival_s for j in problem.jobs}
    return sum(a.end_s - arrival[a.job] for a in schedule.assignments) / max(len(schedule.assignments), 1)


def makespan_s(schedule: Schedule) -> float:
    return max((a.end_s for a in schedule.assignments), default=0.0)


def check_schedule(problem: SchedulingProblem, schedule: Schedule) -> list[str]:
    """Every rule a schedule must keep; the list of violations (empty when valid): each job placed once
    with one of its options, never before its arrival, on nodes of the option's GPU type following the
    placement rule, and no node ever holding more GPUs than it has."""
    errors: list[str] = []
    jobs = {j.id: j for j in problem.jobs}
    topology = problem.topology
    seen = [a.job for a in schedule.assignments]
    if sorted(seen) != sorted(jobs):
        errors.append(f"jobs placed {sorted(seen)} != jobs {sorted(jobs)}")
    events: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for busy in problem.busy:
        events[busy.node] += [(0.0, busy.num_gpus), (busy.until_s, -busy.num_gpus)]
    for a in schedule.assignments:
        job = jobs.get(a.job)
        if job is None:
            continue
        if a.option not in job.options:
            errors.append(f"{a.job}: option not among its candidates")
        if a.start_s < job.arrival_s - 1e-6:
            errors.append(f"{a.job}: starts at {a.start_s} before its arrival {job.arrival_s}")
        if abs(a.end_s - a.start_s - a.option.duration_s) > 1e-6 * max(1.0, a.option.duration_s):
            errors.append(f"{a.job}: runs {a.end_s - a.start_s} s, its plan takes {a.option.duration_s} s")
        if any(topology.nodes[n].gpu.name != a.option.gpu_type for n in a.nodes):
            errors.append(f"{a.job}: placed on nodes of another GPU type")
        expected = a.option.whole_nodes or 1
        if len(set(a.nodes)) != expected:
            errors.append(f"{a.job}: on {len(set(a.nodes))} nodes, its placement rule takes {expected}")
        per_node = a.option.gpus_per_node
        for n in set(a.nodes):
            events[n] += [(a.start_s, per_node), (a.end_s, -per_node)]
    for n, changes in events.items():
        load = 0
        for _, delta in sorted(changes, key=lambda e: (e[0], e[1])):  # releases before starts at equal times
            load += delta
            if load > topology.nodes[n].num_gpus:
                errors.append(f"node {topology.nodes[n].name}: {load} GPUs in use of {topology.nodes[n].num_gpus}")
                break
    return errors
