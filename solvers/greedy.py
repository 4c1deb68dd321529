"""Greedy HAS: the heterogeneity-aware online scheduler.

At every event (a job arrives, a job completes) :meth:`GreedyState.decide` chooses which queued jobs start
now, with which plan and on which GPUs:

* jobs are taken by priority class (``ProblemJob.priority``, higher first), inside a class a job whose
  deadline is near (less than :data:`URGENT_SLACK` times its fastest run left before it) first, by
  deadline (earliest-deadline-first, Liu & Layland 1973), then in weighted-shortest-processing-time order
  (Smith 1956: weight / fastest duration, the order that minimises weighted completion time on one machine);
* for each job every candidate plan is weighed by its **marginal cost**: the job's own weighted time to
  completion (now + duration if the plan's GPUs are free, else the time enough GPUs of that type free up —
  from the running jobs' end times — + duration) plus the delay its GPU-time imposes on the jobs queued
  behind it, the larger of two estimates of it, plus the delay it imposes on the jobs still to come. *Pooled*:
  as a fluid (Harchol-Balter 2013, ch. 13), g GPUs of
  type t held for d seconds delay each job behind by g·d·p_t, p_t the share of the cluster's work per second
  one GPU of the type does: its speed over the sum of GPUs × speed over the types
  (:class:`~frenzy_opt.solvers.greedy_index.TypePrices`, the speeds the queued jobs' own options show; on one
  type p = 1 / GPUs), so the term is (weight behind) × g·d·p_t. An idle slow type is then as cheap as the work
  it does: priced alike per GPU-second, every job waited for the fast types behind a deep queue while the slow
  ones idled. *Queued for the type*: the jobs behind in the queue's head (its first :data:`QUEUED_WINDOW`
  in rank order) whose fastest plan is on type t would each wait g·d / G_t longer for it
  (G_t the type's GPUs), so the term is (their weight) × g·d / G_t. The pooled estimate assumes the jobs behind
  spread over the cluster; when they all want the same fast type (a few jobs at once, every one fastest there)
  it under-prices that type and over-prices the idle ones, and the greedy queued everything for the fast type
  while a slow type idled through the whole schedule (10 % above the CP-SAT optimum on such an instance,
  ``tests/test_greedy_index.py``); the larger of the two keeps the pooled price behind a deep queue (the window
  holds few of its jobs) and the type's own queue in front of a short one. *To come*: jobs keep arriving while
  the plan runs, at the rate of weight submitted over the last :data:`ARRIVAL_WINDOW_S` (λ, what
  :meth:`GreedyState.note_arrival` has seen: past arrivals only), λ·d of them over its d seconds, each delayed
  on average by half its g·d·p_t, so the term adds λ·d·:data:`ARRIVAL_SHARE` to the weight behind. Without it a
  job arriving to an empty queue took its fastest (widest) plan, and in Sia's philly traces the next arrivals
  queued behind it while Sia started every job at once on fewer GPUs. With nobody behind and no arrivals seen a
  job takes its fastest plan; behind a long queue, the plan that holds the least of the cluster's work (the best
  scaling efficiency) — the trade-off of Pollux's goodput and heSRPT (Berg et al. 2020), priced by the queue. A plan
  that would end after the job's deadline costs :data:`LATE_PENALTY` times its lateness on top;
* placement follows the shared rule (:mod:`frenzy_opt.hardware.topology`): inside one node by best fit (the node
  with the fewest free GPUs that still fit, keeping large blocks free), else whole free nodes;
* a job that chooses to wait reserves its GPU type from its estimated start; later jobs may backfill that
  type only if they finish before the reservation (EASY backfilling, Lifka 1995).

**A decision's work is bounded, whatever the queue's depth** (as Slurm bounds its scheduling passes; see
:data:`PRICED_JOBS`): it prices fully only the first :data:`PRICED_JOBS` jobs in decision order (each plans a
wait, counts its work into the queue ahead, the first per type reserves). Past them it tests at most
:data:`BACKFILL_TESTS` jobs, in rank order, and only jobs whose fewest GPUs fit some type's largest free block
now (an index per GPU type of the queued jobs by that need, :mod:`frenzy_opt.solvers.greedy_index`): such a job
starts now where an option fits beside the reservations and costs less than waiting, its wait priced with the
work of the jobs the decision did not price counted in the queue ahead of it — each queued job's last planned
GPU-seconds (its option of fewest GPU-seconds until it was priced), summed per type as jobs enter and leave the
queue, in proportion to the job's place among them. None of them reserves. The weight behind a job is a running
sum too. A decision's cost is then O((PRICED_JOBS + BACKFILL_TESTS) x options per job), plus a bisection per
job tested and the near-deadline jobs; what it gives up against pricing every job is measured in
``benchmarks/results/has_scale.md`` (b). :meth:`GreedyState.plan_waits` (the service's queue estimates) still
prices each of the jobs it is asked about.

Where the executor can stop and resume jobs (the simulator; checkpoints), :meth:`GreedyState.review`
(:mod:`frenzy_opt.solvers.greedy_review`) then revisits running jobs at the same event:

* **preemption** (shortest-remaining-first, Schrage 1968): a queued job that waits for GPUs of a type may
  stop running jobs there of no higher priority whose remaining time is over ``PREEMPT_RATIO`` times its
  own run, longest remaining first, when its weighted wait saved exceeds what the stopped jobs lose (their
  restart cost plus its run, weighted) — at most ``max_restarts`` stops per job, and never a job that has
  not yet run past its own restart cost;
* **elastic growth**: the GPUs left idle on types no queued job waits for are divided among the running jobs
  that may move (the ``REVIEW_GROWTHS`` with the longest remaining time) by marginal gain per GPU
  (:mod:`frenzy_opt.solvers.waterfill`); a job moves to the faster plan it was given (its own GPUs included)
  when the time it saves, restart paid, is over ``GROW_GAIN`` of its remaining time and ``MOVE_MARGIN``
  restarts. Shrinking is the preemption above: the stopped job rejoins the queue and takes, by marginal cost,
  what is left beside the short job.

Free GPUs are kept per type in buckets by free count (best fit in O(node size)), running jobs in a heap by
end time and per type in end order (:mod:`frenzy_opt.solvers.greedy_horizon`): a decision never rescans the
whole cluster (:meth:`GreedyState.review` walks the running jobs of the types waiting jobs ask for).
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TypeVar

from frenzy_opt.core.enums import SolverStatus
from frenzy_opt.hardware.placement import FreeIndex
from frenzy_opt.planning.interfaces import Admission
from frenzy_opt.planning.problem import Assignment, Option, ProblemJob, Schedule, SchedulingProblem
from frenzy_opt.solvers.base import register
from frenzy_opt.solvers.greedy_horizon import Horizon, Reservation, Running
from frenzy_opt.solvers.greedy_index import Queue, RankOrder, TypePrices
from frenzy_opt.solvers.greedy_review import Move, review

# A deadline is near when less than this many fastest runs of the job are left before it (a design choice:
# twice the fastest run leaves room for one wait as long as the job itself).
URGENT_SLACK = 2.0
# Weight per second of lateness past a deadline, relative to a second of completion time: a late plan is
# chosen only when every plan is late (then the least late one).
LATE_PENALTY = 100.0
# A decision prices fully (every option, waits, reservations) at most PRICED_JOBS queued jobs, the first in
# decision order; after them it tests at most BACKFILL_TESTS more, only jobs whose fewest GPUs fit some type's
# largest free block now, and starts one only where that costs less than its wait, with the work of the jobs it
# did not price counted in the queue ahead (module docstring). Production schedulers bound their passes the same
# way: Slurm's event-triggered pass considers ``default_queue_depth`` = 100 jobs by default
# (https://slurm.schedmd.com/sched_config.html) and its backfill cycle tests at most ``bf_max_job_test`` jobs (500
# by default in the backfill plugin, src/plugins/sched/backfill/backfill.c). The values are a design choice: the
# smallest of 16/24/32/48/64/96 (the two equal: for a given total, an even split lost least) whose mean and worst
# loss in sum of weight x JCT against pricing every job both stay under 1 % on 512 jobs queued at once on 2,160
# GPUs (``benchmarks/results/has_scale.md`` (b), cost and quality per value; when chosen, 16 and 24 lost under 1 % on
# the mean but up to 1.6 % and 1.3 % on an instance; with the queued-for-type delay of QUEUED_WINDOW, 24 stays under
# 1 % too, worst 0.91 %, and 32 was kept: +0.16 % +/- 0.42, worst 0.84 %). Since the options are cut to the
# convex hull of GPU-seconds against duration (frenzy_opt.planning.problem.thin_fronts), 32 loses +0.51 % +/- 0.95,
# worst 2.20 %: the worst instance is over 1 % at every value but 96 (0.80 %), which costs 1.38 ms per job, above the
# issue's 1 ms; 32 is kept, its loss inside its interval on the mean.
PRICED_JOBS = 32
BACKFILL_TESTS = 32
# The jobs at the head of the queue (rank order) whose fastest type counts in the "queued for the type" estimate of
# the delay a plan imposes (module docstring); past them the pooled estimate alone. A design choice, the jobs a
# bounded decision prices: over a whole deep queue the estimate priced every fast type as if all its jobs would
# wait for it, and the greedy lost 10 % of sum of weight x JCT on 512 jobs at once (2,160 GPUs, 4 seeds).
QUEUED_WINDOW = 32
# The arrival rate the marginal cost counts (module docstring) is that of the jobs submitted in this last stretch
# (a design choice: an hour holds tens of arrivals in Sia's philly and saturn traces, and follows a day's load).
ARRIVAL_WINDOW_S = 3600.0
# Of the jobs arriving while a plan runs (rate x its duration d), the share its GPU-seconds delay: in the fluid view
# a job arriving at a uniform time in [0, d] waits behind the part of the plan's work still to do, half on average.
ARRIVAL_SHARE = 0.5
# Impatient, a decision plans the wait (estimated start, reservation) of at most this many jobs that cannot
# start now; the others wait unplanned until the next decision (a bound on its cost with a long queue), and start
# now only on a plan that no wait could beat by WAIT_GAIN's rule (GreedyState._choose). Without that rule they took
# whatever fitted: on cluster2048-llm (1,000 jobs, 92 % busy) 13B jobs whose leanest plan was 64 H100s for 0.9 h
# started on 4 H100s for 29 h, and frenzy's average JCT was 2 % above sia's instead of 31 % below.
IMPATIENT_WAITS = 8
# Impatient, a job that fits now still waits for a busy plan if that costs it less than this fraction of the best
# plan that fits now (a short wait for much faster GPUs; a design choice, 0 = never wait while a plan fits).
WAIT_GAIN = 0.5

# A job's option as a decision reads it: its duration, GPU-seconds, GPU type, placement shape (type, GPUs, whole
# nodes: the key of :attr:`_Round.fits`) and the option itself, made once when the job is ranked.
_Row = tuple[float, float, str, tuple[str, int, int], Option]
_V = TypeVar("_V")
_UNSEEN: tuple[int, ...] = (-1,)  # a shape :attr:`_Round.fits` has not looked up yet (None there: it does not fit)
_LATER = -2  # :attr:`_Choice.wait_for` of a wait that starts after every running job of its type has ended


@dataclass(slots=True)
class _Choice:
    """A job's best option so far in one decision: its cost, its estimated end, and either the nodes it
    starts on now or (``nodes`` None) the index in the type's horizon of the running job's end it waits for
    (-1: none it knows of; :data:`_LATER`: one after them all)."""

    cost: float
    end: float
    option: Option
    nodes: tuple[int, ...] | None
    wait_for: int


class _NoChoice(Enum):
    """Why a job got no option in a decision: admission refused every one, or (impatient) nothing fit now
    and its wait was not planned."""

    REFUSED = "refused"
    UNPLANNED = "unplanned"


@dataclass(slots=True)
class _Round:
    """What one call of :meth:`GreedyState.decide` carries from job to job."""

    now: float
    free_total: int  # free GPUs of every type
    behind: float  # the weight queued behind the job being decided (module docstring: its GPU-seconds' price)
    # Per GPU type, the weight of the jobs behind in the queue's head (QUEUED_WINDOW) whose fastest plan is on that type
    # (module docstring: the second estimate of the delay a plan imposes); empty past the window.
    behind_fastest: dict[str, float] = field(default_factory=dict)
    reserved: dict[str, Reservation] = field(default_factory=dict)
    # Like ``horizons``, dropped for a type when a job starts on it: where each placement shape fits now.
    horizons: dict[str, Horizon] = field(default_factory=dict)
    fits: dict[tuple[str, int, int], tuple[int, ...] | None] = field(default_factory=dict)
    # Per placement shape that does not fit now: the index of the running job's end it waits for (-1: none) and
    # the start the horizon and the type's reservation allow, before the queue ahead; dropped for a type when a
    # job starts on it or the type's reservation is made.
    waits: dict[tuple[str, int, int], tuple[int, float]] = field(default_factory=dict)
    # GPU-seconds ahead of a waiting job on each type: what runs there now, and what earlier jobs of this
    # decision chose to wait for (the queue ahead, as a fluid: Harchol-Balter 2013, ch. 13).
    ahead: dict[str, float] = field(default_factory=dict)
    analysed: int = 0  # impatient: jobs whose wait this decision planned
    # Past the priced jobs (:data:`PRICED_JOBS`): per type the GPU-seconds the jobs this decision did not price
    # last planned there, and the share of it ahead of the job being decided (its place among them).
    backfill: bool = False
    skipped: dict[str, float] = field(default_factory=dict)
    share: float = 0.0
    plans: bool = True  # record the waits chosen as the jobs' planned work (not when only estimating)


@dataclass
class GreedyState:
    """The online scheduler's state: free GPUs, running jobs, the queue."""

    problem: SchedulingProblem
    free: dict[str, FreeIndex] = field(init=False)
    capacity: dict[str, int] = field(init=False)
    running: list[tuple[float, int, Running]] = field(default_factory=list)
    queue: dict[str, ProblemJob] = field(default_factory=Queue)
    by_job: dict[str, Running] = field(default_factory=dict)
    _ranks: dict[str, tuple[float, float, float, str]] = field(default_factory=dict)
    _ranked_options: dict[str, tuple[Option, ...]] = field(default_factory=dict)
    _sorted: dict[str, tuple[_Row, ...]] = field(default_factory=dict)
    _works: dict[str, tuple[int, tuple[float, ...], tuple[float, ...], tuple[float, ...]]] = field(default_factory=dict)
    waiting: dict[str, tuple[Option | None, float]] = field(default_factory=dict)
    """After :meth:`decide`: per job it reached and left queued, the option it waits for (None: admission
    ruled out every option) and its estimated start."""
    restarts: dict[str, int] = field(default_factory=dict)
    """Stops per job :meth:`review` made (bounded by its ``max_restarts``)."""
    max_restarts: int | None = None
    """The ``max_restarts`` :meth:`review` is called with (None: unbounded). Impatient, a job at that bound (or at
    its spec's ``max_moves``, or not preemptible) chooses as if patient: it can never grow once started, so a
    plan that fits now is no better for it than its cost says."""
    queue_price: float = 1.0
    arrival_share: float = ARRIVAL_SHARE
    """The share of the jobs to come that a plan's GPU-seconds delay in the marginal cost (module docstring);
    0: only the queue counts, as the HAS did before."""
    patient: bool = True
    """True: a job may wait for a plan whose GPUs are busy when that ends it sooner (non-preemptive use).
    False (where :meth:`review` may move jobs): a job that fits now starts now on the best plan that fits
    and grows later (waiting estimates count only the running jobs, not the shorter jobs still to come)."""
    """Scale of the queue's price of GPU-seconds in the marginal cost (module docstring); 0: every job takes
    its fastest plan, as the HAS did before."""
    _deadlines: set[str] = field(default_factory=set)
    _ends: dict[str, list[tuple[float, int, Running]]] = field(default_factory=dict)
    """Per GPU type its running jobs (and holds) in end order."""
    _work: dict[str, list[float]] = field(default_factory=dict)
    """Per GPU type, over its running jobs: the sum of GPUs x end and the sum of GPUs."""

    _first_start: dict[str, float] = field(default_factory=dict)
    _arrivals: deque[tuple[float, float]] = field(default_factory=deque)
    """(time, weight) of the jobs that arrived in the last :data:`ARRIVAL_WINDOW_S` (:meth:`note_arrival`)."""
    _arrived_weight: float = 0.0
    _seq: int = 0
    _ordered: RankOrder = field(default_factory=RankOrder)
    """The queue in rank order as of the last :meth:`_order` (kept up to date from :class:`Queue`'s notes)."""
    priced_jobs: int | None = PRICED_JOBS
    backfill_tests: int = BACKFILL_TESTS
    """A decision's bounds (:data:`PRICED_JOBS`, :data:`BACKFILL_TESTS`); ``priced_jobs`` None prices every
    job it reaches (the unbounded decision, for comparisons)."""
    priced: int = 0
    """Jobs the last :meth:`decide` priced (a measure of its work)."""
    _near: set[str] = field(default_factory=set)
    _empty_fits: dict[tuple[str, int, int], bool] = field(default_factory=dict)
    _horizons: dict[str, tuple[tuple[int, int], Horizon]] = field(default_factory=dict)
    """Per GPU type the last :class:`Horizon` built, with the versions of the free GPUs and running jobs it
    was built from."""
    _ends_changes: dict[str, int] = field(default_factory=dict)
    """Per GPU type, how many times its running jobs (:attr:`_ends`) changed."""
    """The jobs the last :meth:`_order` moved forward for a near deadline."""

    def __post_init__(self) -> None:
        if not isinstance(self.queue, Queue):
            self.queue = Queue(self.queue)
        topology = self.problem.topology
        self.free = {
            t: FreeIndex({i: topology.nodes[i].num_gpus for i in topology.nodes_of(t)}) for t in topology.gpu_types
        }
        self.capacity = {t: self.problem.topology.num_gpus_of(t) for t in self.problem.topology.gpu_types}
        self.prices = TypePrices(self.capacity)
        for busy in self.problem.busy:
            gpu_type = self.problem.topology.nodes[busy.node].gpu.name
            self.free[gpu_type].change(busy.node, -busy.num_gpus)
            self._push(Running(end_s=busy.until_s, job="", nodes=(busy.node,), per_node=busy.num_gpus))

    def _push(self, run: Running) -> tuple[float, int, Running]:
        self._seq += 1
        run.gpu_type = self.problem.topology.nodes[run.nodes[0]].gpu.name
        run.seq = self._seq
        entry = (run.end_s, self._seq, run)
        heapq.heappush(self.running, entry)
        if run.job:
            self.by_job[run.job] = run
        bisect.insort(self._ends.setdefault(run.gpu_type, []), entry)
        self._ends_changes[run.gpu_type] = self._ends_changes.get(run.gpu_type, 0) + 1
        sums = self._work.setdefault(run.gpu_type, [0.0, 0.0])
        sums[0] += run.num_gpus * run.end_s
        sums[1] += run.num_gpus
        return entry

    def _drop(self, run: Running) -> None:
        """Take a run that ended or was replaced out of its type's end order and work sums."""
        run.released = True
        ends = self._ends[run.gpu_type]
        i = bisect.bisect_left(ends, (run.end_s, run.seq))
        assert ends[i][2] is run
        del ends[i]
        self._ends_changes[run.gpu_type] = self._ends_changes.get(run.gpu_type, 0) + 1
        sums = self._work[run.gpu_type]
        sums[0] -= run.num_gpus * run.end_s
        sums[1] -= run.num_gpus

    def hold(self, key: str, node: int, num_gpus: int, until_s: float) -> None:
        """Take ``num_gpus`` of ``node`` until about ``until_s`` (a node down for repair), under ``key``."""
        gpu_type = self.problem.topology.nodes[node].gpu.name
        self.free[gpu_type].change(node, -num_gpus)
        self._push(Running(end_s=until_s, job=key, nodes=(node,), per_node=num_gpus))

    def occupy(self, key: str, nodes: tuple[int, ...], per_node: int, until_s: float) -> None:
        """Take ``per_node`` GPUs on each of ``nodes`` until about ``until_s`` for job ``key`` (a run that
        survived a restart of the orchestrator)."""
        gpu_type = self.problem.topology.nodes[nodes[0]].gpu.name
        for node in nodes:
            self.free[gpu_type].change(node, -per_node)
        self._push(Running(end_s=until_s, job=key, nodes=nodes, per_node=per_node))

    def release(self, key: str) -> None:
        """Give back what job (or hold) ``key`` holds, whenever it really ended (the simulator's and the
        orchestrator's way; :meth:`complete_until` is the replay's)."""
        run = self.by_job.pop(key)
        self._drop(run)
        gpu_type = self.problem.topology.nodes[run.nodes[0]].gpu.name
        for node in run.nodes:
            self.free[gpu_type].change(node, run.per_node)
        while self.running and self.running[0][2].released:
            heapq.heappop(self.running)

    def complete_until(self, now: float) -> list[Running]:
        """Release every job ending at or before ``now``."""
        done = []
        while self.running and self.running[0][0] <= now:
            _, _, run = heapq.heappop(self.running)
            if run.released:
                continue
            self._drop(run)
            self.by_job.pop(run.job, None)
            gpu_type = self.problem.topology.nodes[run.nodes[0]].gpu.name
            for node in run.nodes:
                self.free[gpu_type].change(node, run.per_node)
            done.append(run)
        return done

    def _fits_empty(self, shape: tuple[str, int, int], option: Option) -> bool:
        """Whether the option's placement fits its GPU type with every GPU free (cached per shape)."""
        found = self._empty_fits.get(shape)
        if found is None:
            nodes = self.problem.topology.nodes_of(shape[0])
            found = self._empty_fits[shape] = (
                FreeIndex({i: self.problem.topology.nodes[i].num_gpus for i in nodes}).fit(option) is not None
            )
        return found

    def _horizon(self, gpu_type: str, horizons: dict[str, Horizon]) -> Horizon:
        """The type's :class:`Horizon` for this decision, over its running jobs in end order (kept sorted
        as jobs start and end); rebuilt after a start on the type."""
        horizon = horizons.get(gpu_type)
        if horizon is None:
            # the last decision's, if neither the type's free GPUs nor its running jobs changed since
            version = (self.free[gpu_type].version, self._ends_changes.get(gpu_type, 0))
            kept = self._horizons.get(gpu_type)
            if kept is not None and kept[0] == version:
                horizon = kept[1]
            else:
                horizon = Horizon(self.free[gpu_type], self._ends.setdefault(gpu_type, []))
                self._horizons[gpu_type] = (version, horizon)
            horizons[gpu_type] = horizon
        return horizon

    def _rank(self, job: ProblemJob) -> tuple[float, float, float, str]:
        """Priority class, then WSPT order (weight / fastest duration, larger first), then arrival, then id;
        cached per job."""
        key = self._ranks.get(job.id)
        if key is None or self._ranked_options.get(job.id) is not job.options:
            key = self._ranks[job.id] = (-job.priority, -job.weight / job.fastest_s, job.arrival_s, job.id)
            self.prices.add(job)
            self._works.pop(job.id, None)
            self._ranked_options[job.id] = job.options
            self._sorted[job.id] = tuple(
                (o.duration_s, o.num_gpus * o.duration_s, o.gpu_type, (o.gpu_type, o.num_gpus, o.whole_nodes), o)
                for o in sorted(job.options, key=lambda o: o.duration_s)
            )
            if job.deadline_s is not None:
                self._deadlines.add(job.id)
        return key

    def _ranked(self) -> RankOrder:
        """The queue sorted by :meth:`_rank`, with its sums and need lists (:class:`RankOrder`): the last order
        with what left or was replaced taken out and what was put inserted, each by bisection (the same order
        as a full sort: the rank ends with the job's id, so no two are equal). Read it, never change it."""
        queue = self.queue
        if not isinstance(queue, Queue):  # a plain dict was assigned: take it over (and sort it whole)
            queue = self.queue = Queue(queue)
            self._ordered = RankOrder()
        touched, queue.touched = queue.touched, []
        self._ordered.sync(touched, queue.get, self._rank)
        for job_id in touched:
            if job_id not in queue:
                self._deadlines.discard(job_id)  # _order reads what is left, every decision
        return self._ordered

    def _order(self, now: float) -> Iterator[ProblemJob]:
        """The queue in decision order (module docstring), lazily: rank, with near-deadline jobs moved to the
        front of their priority class (work per job taken, plus one pass over the jobs with deadlines)."""
        ranked = self._ranked().jobs
        self._near = set()
        near = [
            job
            for job in map(self.queue.get, self._deadlines)
            if job is not None and job.deadline_s is not None and job.deadline_s - now < URGENT_SLACK * job.fastest_s
        ]
        if not near:
            yield from ranked
            return
        near.sort(key=lambda job: (job.deadline_s, self._rank(job)))
        urgent = self._near = {job.id for job in near}
        by_class: dict[int, list[ProblemJob]] = {}
        for job in near:
            by_class.setdefault(job.priority, []).append(job)
        for job in ranked:
            yield from by_class.pop(job.priority, ())  # the class's near deadlines first
            if job.id not in urgent:
                yield job

    def _priced_work(
        self, job: ProblemJob, rows: tuple[_Row, ...], price: dict[str, float]
    ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
        """The durations of the job's options (``rows``), their GPU-seconds times their type's price, and their
        GPU-seconds over their type's GPUs (the seconds by which they delay a queue on that type), kept until the
        prices change."""
        kept = self._works.get(job.id)
        if kept is None or kept[0] != self.prices.version:
            kept = self._works[job.id] = (
                self.prices.version,
                tuple(row[0] for row in rows),
                tuple(row[1] * price[row[2]] for row in rows),
                tuple(row[1] / self.capacity[row[2]] for row in rows),
            )
        return kept[1], kept[2], kept[3]

    def _by_duration(self, job: ProblemJob) -> tuple[_Row, ...]:
        """The job's options, shortest first, as :data:`_Row` s (made when it was ranked)."""
        return self._sorted[job.id]

    def _ahead(self, gpu_type: str, now: float, ahead: dict[str, float]) -> float:
        """GPU-seconds of work ahead on a type (see :meth:`decide`); the running part summed once per
        decision."""
        work = ahead.get(gpu_type)
        if work is None:
            total, gpus = self._work.get(gpu_type, (0.0, 0.0))
            work = total - now * gpus
            for end, _, run in self._ends.get(gpu_type, ()):  # runs past their estimated end count 0
                if end >= now:
                    break
                work += (now - end) * run.num_gpus
            work = ahead[gpu_type] = max(work, 0.0)
        return work

    def decide(self, now: float, admit: Admission | None = None) -> list[Assignment]:
        """Start what should start now (module docstring). ``admit`` (e.g. per-tenant quotas) may rule
        options out; a job whose every option it rules out waits. :attr:`waiting` tells, after the call,
        what each job the decision reached and left queued waits for."""
        self.waiting, self.priced = {}, 0
        self._forget_arrivals(now)
        started: list[Assignment] = []
        free_total = sum(index.count for index in self.free.values())
        if free_total == 0:
            return started  # nothing can start (the loop below would stop at its first job)
        ranked = self._ranked()
        round_ = _Round(now=now, free_total=free_total, behind=ranked.weight)
        near = self._behind_fastest(ranked.jobs[:QUEUED_WINDOW], round_)
        priced: list[ProblemJob] = []
        for job in self._order(now):
            if round_.free_total == 0:
                return started  # nothing can start; the remaining jobs' reservations would block nothing
            if self.priced_jobs is not None and len(priced) == self.priced_jobs:
                self._backfill(priced, round_, admit, started)
                return started
            priced.append(job)
            self._passed(job, near, round_)
            self._decide_one(job, round_, admit, started)
        return started

    def _fastest_type(self, job: ProblemJob) -> str:
        """The GPU type of the job's fastest option (its options are sorted by duration when it is ranked)."""
        return self._sorted[job.id][0][2]

    def _behind_fastest(self, window: list[ProblemJob], round_: _Round) -> set[str]:
        """Fill ``round_.behind_fastest`` from the jobs of the queue's head; their ids."""
        sums = round_.behind_fastest
        for job in window:
            gpu_type = self._fastest_type(job)
            sums[gpu_type] = sums.get(gpu_type, 0.0) + job.weight
        return {job.id for job in window}

    def _passed(self, job: ProblemJob, near: set[str], round_: _Round) -> None:
        """Take ``job`` out of the weight behind (it is being decided): the whole queue's, and its fastest type's
        if it is among the queue's head (``near``, :meth:`_behind_fastest`)."""
        round_.behind -= job.weight
        if job.id in near:
            round_.behind_fastest[self._fastest_type(job)] -= job.weight

    def _decide_one(self, job: ProblemJob, round_: _Round, admit: Admission | None, started: list[Assignment]) -> None:
        """Price the job's options and start it or let it wait (recorded in :attr:`waiting`)."""
        self.priced += 1
        choice = self._choose(job, round_, admit)
        if choice is _NoChoice.REFUSED:
            self.waiting[job.id] = (None, float("inf"))  # None: admission's doing
        elif isinstance(choice, _Choice):
            if choice.nodes is None:
                self._wait(job, choice, round_)
            else:
                started.append(self._start(job, choice, choice.nodes, round_, admit))

    def _backfill(
        self, priced: list[ProblemJob], round_: _Round, admit: Admission | None, started: list[Assignment]
    ) -> None:
        """After the :data:`PRICED_JOBS` first jobs (``priced``): at most :data:`BACKFILL_TESTS` later ones, in
        rank order, among those whose fewest GPUs fit some type's largest free block now (the need lists of
        :class:`RankOrder`); each starts now where an option fits beside the reservations and costs less than
        its wait, the wait priced with the work the decision did not price counted ahead of it in proportion
        to its place among those jobs. None plans a reservation."""
        ranked = self._ordered
        round_.backfill = True
        round_.behind_fastest = {}  # past the queue's head: the pooled estimate alone
        skipped = dict(ranked.planned_work)
        for job in priced:
            gpu_type, work = ranked.planned.get(job.id, ("", 0.0))
            if gpu_type:
                skipped[gpu_type] -= work
        round_.skipped = {t: max(w, 0.0) for t, w in skipped.items()}
        rest, weight_rest = len(ranked) - len(priced), round_.behind
        last = max((ranked.of[job.id][0] for job in priced if job.id not in self._near), default=None)
        seen = {job.id for job in priced}
        reach = {t: _reach(index) for t, index in self.free.items()}
        tests = 0
        for job in ranked.fitting(reach, last):
            if round_.free_total == 0 or tests == self.backfill_tests:
                return
            fewest = ranked.fewest[job.id]
            if job.id in seen or not any(need <= reach.get(t, 0) for t, need in fewest.items()):
                continue  # priced already (a near deadline), or the GPUs it could fit were taken
            tests += 1
            place = max(ranked.position(ranked.of[job.id][0]) - len(priced), 0)
            round_.share = place / max(rest, 1)
            round_.behind = weight_rest * max(rest - place - 1, 0) / max(rest, 1)
            before = len(started)
            self._decide_one(job, round_, admit, started)
            if len(started) > before:
                gpu_type = started[-1].option.gpu_type
                reach[gpu_type] = _reach(self.free[gpu_type])

    def plan_waits(
        self, now: float, admit: Admission | None = None, limit: int = 500
    ) -> tuple[list[ProblemJob], dict[str, tuple[Option | None, float]]]:
        """The queue in decision order, and what each of its first ``limit`` jobs waits for and when it is
        expected to start (``(None, inf)``: admission refuses every option), as a patient decision at ``now``
        would plan them on the GPUs held now, every one of them priced (not bounded by :data:`PRICED_JOBS`);
        nothing starts, and no job's planned work changes. A job that fits now is expected at once, its work
        counted into the queue ahead of the later ones. For a queued job's estimated start: a decision plans
        the waits of only some jobs (none when no GPU is free, :meth:`decide`)."""
        kept, patient = self.waiting, self.patient
        self.waiting, self.patient = {}, True
        try:
            order = list(self._order(now))
            planned = order[:limit]
            round_ = _Round(
                now=now,
                free_total=sum(index.count for index in self.free.values()),
                behind=sum(job.weight for job in planned),
                plans=False,
            )
            near = self._behind_fastest(planned[:QUEUED_WINDOW], round_)
            for job in planned:
                self._passed(job, near, round_)
                choice = self._choose(job, round_, admit)
                if choice is _NoChoice.REFUSED:
                    self.waiting[job.id] = (None, float("inf"))
                elif isinstance(choice, _Choice):
                    # one that fits now is planned as a wait that ends now: no GPUs taken, no reservation
                    fits = choice.nodes is not None
                    self._wait(job, replace(choice, nodes=None, wait_for=-1) if fits else choice, round_)
            return order, self.waiting
        finally:
            self.waiting, self.patient = kept, patient

    def _choose(self, job: ProblemJob, round_: _Round, admit: Admission | None) -> _Choice | _NoChoice:
        """The job's option this decision: patient, the cheapest, started now or waited for; impatient, the cheapest
        that fits now unless waiting for a busy one costs less than :data:`WAIT_GAIN` of it (then the cheapest wait;
        the cheapest wait too when nothing fits now). Options are priced
        in the order of what each would cost started now (its own time and its GPU-seconds' price, a lower bound on
        its cost: behind a long queue the leanest come first, with nobody behind the shortest), stopping once none
        left can change the choice. Impatient, a job plans a wait only while the decision plans waits
        (:data:`IMPATIENT_WAITS`, a type without a reservation); once every type holds one, how long it would wait
        changes no start of this decision (only what :attr:`waiting` says); then a plan that fits now is started only
        if no wait could beat it by that rule, i.e. it costs at most 1 / :data:`WAIT_GAIN` times the least any option
        would cost started now (a lower bound on every wait's cost). A job :meth:`review` can no longer move
        (:meth:`_settled`) chooses as if patient."""
        now_only, gain = False, 1.0  # patient: the cheapest option, waits and starts alike
        if not self.patient and not self._settled(job):
            gain = WAIT_GAIN
            fewest = self._ordered.fewest[job.id]
            room = any(self.free[t].count >= n for t, n in fewest.items())  # else nothing can fit now
            plan_wait = (
                not round_.backfill and len(round_.reserved) < len(self.free) and round_.analysed < IMPATIENT_WAITS
            )
            if not room and not plan_wait:
                return _NoChoice.UNPLANNED
            now_only = not plan_wait
        refused = admitted = False  # whether admission refused an option, and let one through
        price, weight = self.prices.price, job.weight
        per_work = self.queue_price * round_.behind  # the used term is per_work x GPU-seconds x the type's price
        rows = self._by_duration(job)
        durations, priced_work, shares = self._priced_work(job, rows, price)
        # each option's used term (the larger of the two estimates, module docstring), and its cost if started now
        # (a lower bound on its cost), by which to go through
        if round_.behind_fastest:
            queued = [self.queue_price * round_.behind_fastest.get(row[2], 0.0) for row in rows]
            useds = [
                max(per_work * work, q * share) for work, q, share in zip(priced_work, queued, shares, strict=True)
            ]
        else:
            useds = [per_work * work for work in priced_work]
        if self._arrived_weight > 0:  # the jobs still to come, at the rate seen (module docstring)
            coming = self.queue_price * self._arrived_weight / ARRIVAL_WINDOW_S * self.arrival_share
            useds = [u + coming * d * work for u, d, work in zip(useds, durations, priced_work, strict=True)]
        bounds = [weight * duration + used for duration, used in zip(durations, useds, strict=True)]
        fit: _Choice | None = None  # the cheapest option that fits now so far
        wait: _Choice | None = None  # the cheapest wait so far
        fit_cost = wait_cost = limit = floor = float("inf")  # limit: what an option must cost less than to matter
        for i in sorted(range(len(rows)), key=bounds.__getitem__):
            if limit < bounds[i]:
                break  # this option and every one after it cost too much to change the choice (a tie may)
            _, _, _, shape, option = rows[i]
            if admit is not None and not admit.allows(job.id, option):
                refused = True
                continue
            if not admitted:
                floor = bounds[i]  # the least any admitted option costs started now (they come cheapest first)
            admitted = True
            wait_limit = wait_cost if fit is None else min(wait_cost, gain * fit_cost)
            # a wait costs at least the bound: past the wait limit only a start now can matter
            fits_only = now_only or wait_limit <= bounds[i]
            if fits_only and round_.fits.get(shape, _UNSEEN) is None:
                continue  # it does not fit now (looked up by an earlier job of this decision)
            candidate = self._price(job, option, shape, fits_only, wait_limit, round_, useds[i])
            if candidate is None:
                continue
            if candidate.nodes is not None:
                if candidate.cost < fit_cost:
                    fit, fit_cost = candidate, candidate.cost
            elif candidate.cost < wait_limit:
                wait, wait_cost = candidate, candidate.cost
            # a fit matters below the cheapest fit and (when a wait is known) below what makes that wait win; a
            # wait below the cheapest wait and gain of the cheapest fit
            fit_limit = fit_cost if wait is None or gain <= 0.0 else min(fit_cost, wait_cost / gain)
            limit = max(fit_limit, wait_cost if fit is None else min(wait_cost, gain * fit_cost))
        if wait is not None and (fit is None or wait_cost < gain * fit_cost):
            return wait
        if fit is not None:
            if now_only and gain * fit_cost > floor:
                # A wait it did not plan could beat this start by the rule above: leave it to a decision that plans
                # its wait rather than commit it to the plan (see IMPATIENT_WAITS).
                return _NoChoice.UNPLANNED
            return fit
        # admission ruled out every option, or (impatient) nothing fits now and its wait was not planned
        return _NoChoice.REFUSED if refused and not admitted else _NoChoice.UNPLANNED

    def _price(
        self,
        job: ProblemJob,
        option: Option,
        shape: tuple[str, int, int],
        now_only: bool,
        lowest: float,
        round_: _Round,
        used: float,
    ) -> _Choice | None:
        """What ``option`` would cost the job: started now if it fits (next to the type's reservation), else
        started when the horizon, the reservation and the queue ahead allow; ``used``: its GPU-seconds' term
        (:meth:`_used`), ``shape`` its (type, GPUs, whole nodes). None when ``now_only`` and it does not fit now, or
        when its wait cannot cost less than ``lowest`` (what a wait must cost less than to matter)."""
        now, gpu_type, fits = round_.now, shape[0], round_.fits
        nodes = fits.get(shape, _UNSEEN)
        if nodes is _UNSEEN:
            nodes = fits[shape] = self.free[gpu_type].fit(option)
        reservation = round_.reserved.get(gpu_type)
        fits_now = nodes is not None and (
            reservation is None
            or now + option.duration_s <= reservation.start
            or all(reservation.left[n] >= option.gpus_per_node for n in nodes)
        )
        if now_only and not fits_now:
            return None
        index = -1
        if fits_now:
            end = now + option.duration_s
        else:
            ahead = round_.ahead.get(gpu_type)
            if ahead is None:
                ahead = self._ahead(gpu_type, now, round_.ahead)
            if round_.share:
                ahead += round_.share * round_.skipped.get(gpu_type, 0.0)
            floor = now + ahead / self.capacity[gpu_type]
            if lowest <= job.weight * (floor + option.duration_s - now) + used:
                return None  # even the queue ahead alone makes it cost no less than the best
            ends = self._ends.get(gpu_type)
            if (
                ends
                and floor >= ends[-1][0]
                and (reservation is None or floor >= reservation.end)
                and self._fits_empty(shape, option)
            ):
                # the queue ahead outlasts every running job and the reservation: it starts at the floor (the end
                # it waits for is looked up only if it reserves, :meth:`_wait`)
                waited: tuple[int, float] | None = (_LATER, floor)
            else:
                waited = round_.waits.get(shape)
            if waited is None:
                horizon = round_.horizons.get(gpu_type) or self._horizon(gpu_type, round_.horizons)
                index = horizon.earliest(option)
                start = float("inf") if index < 0 else max(horizon.ends[index], now)
                if reservation is not None and start >= reservation.start and not reservation.fits_alongside(option):
                    start = max(start, reservation.end)  # it queues behind the reserved job
                waited = round_.waits[shape] = (index, start)
            index, start = waited
            start = max(start, floor)
            end, nodes = start + option.duration_s, None
        cost = job.weight * (end - now) + used
        if job.deadline_s is not None and end > job.deadline_s:
            cost += LATE_PENALTY * job.weight * (end - job.deadline_s)
        return _Choice(cost=cost, end=end, option=option, nodes=nodes, wait_for=index)

    def _settled(self, job: ProblemJob) -> bool:
        """Whether :meth:`review` will never move ``job`` once it starts: not preemptible, or at its bound on
        stops (:attr:`max_restarts`, its spec's ``max_moves``)."""
        if not job.preemptible:
            return True
        done = self.restarts.get(job.id, 0)
        return any(limit is not None and done >= limit for limit in (self.max_restarts, job.max_moves))

    def _wait(self, job: ProblemJob, choice: _Choice, round_: _Round) -> None:
        """The job waits for its choice: say so in :attr:`waiting`, note its work as its planned work, and,
        among the priced jobs (not in :meth:`_backfill`, whose skipped work counts it already), count its work
        into the queue ahead and reserve its start if it is the first to wait on the type (EASY backfilling)."""
        option, gpu_type = choice.option, choice.option.gpu_type
        if not self.patient:
            round_.analysed += 1
        self.waiting[job.id] = (option, choice.end - option.duration_s)
        if round_.plans:
            self._ordered.plan(job.id, gpu_type, option.num_gpus * option.duration_s)
        if round_.backfill:
            return
        if choice.end != float("inf"):
            round_.ahead[gpu_type] = (
                self._ahead(gpu_type, round_.now, round_.ahead) + option.num_gpus * option.duration_s
            )
        if choice.wait_for != -1 and gpu_type not in round_.reserved:
            horizon = self._horizon(gpu_type, round_.horizons)
            index = horizon.earliest(option) if choice.wait_for == _LATER else choice.wait_for
            round_.reserved[gpu_type] = Reservation(
                option, choice.end - option.duration_s, horizon.free_after(index), self.free[gpu_type].size
            )
            _drop_type(round_.waits, gpu_type)

    def _start(
        self, job: ProblemJob, choice: _Choice, nodes: tuple[int, ...], round_: _Round, admit: Admission | None
    ) -> Assignment:
        """Start the job on ``nodes`` now: take its GPUs (and, past the reserved start, the reservation's extra
        ones), drop what this decision cached for the type, and move it from the queue to the running."""
        now, end, option = round_.now, choice.end, choice.option
        gpu_type, per_node = option.gpu_type, option.gpus_per_node
        reservation = round_.reserved.get(gpu_type)
        if reservation is not None and end > reservation.start:
            taken = reservation.take(nodes, per_node)
            assert taken
        for node in nodes:
            self.free[gpu_type].change(node, -per_node)
        round_.free_total -= option.num_gpus
        if gpu_type in round_.ahead:
            round_.ahead[gpu_type] += option.num_gpus * option.duration_s
        round_.horizons.pop(gpu_type, None)
        _drop_type(round_.fits, gpu_type)
        _drop_type(round_.waits, gpu_type)
        run = Running(end_s=end, job=job.id, nodes=nodes, per_node=per_node, option=option, problem=job, start_s=now)
        self._first_start.setdefault(job.id, now)
        self._push(run)
        del self.queue[job.id]
        for cache in (self._ranks, self._ranked_options, self._sorted):
            del cache[job.id]
        self._works.pop(job.id, None)
        self._deadlines.discard(job.id)
        if admit is not None:
            admit.take(job.id, option)
        return Assignment(job=job.id, option=option, nodes=nodes, start_s=now, end_s=end)

    def _used(self, behind: float, option: Option) -> float:
        """The marginal-cost term of ``option``'s GPU-seconds (module docstring): the weight queued behind, and
        that of the jobs to come while it runs, times g·d·p, p the price of a GPU-second of the option's type."""
        coming = self._arrived_weight / ARRIVAL_WINDOW_S * self.arrival_share * option.duration_s
        work = option.num_gpus * option.duration_s * self.prices.price[option.gpu_type]
        return self.queue_price * (behind + coming) * work

    def note_arrival(self, now: float, weight: float) -> None:
        """A job was submitted at ``now`` (not a stopped job queued again): the rate of arriving weight the
        marginal cost counts (module docstring) is that of the last :data:`ARRIVAL_WINDOW_S`. The simulator's
        ``frenzy`` policy and the service call it; :class:`GreedyHAS` (``frenzy solve``) does not: on the
        offline instances of ``benchmarks/results/greedy_gap.md`` the non-preemptive greedy, which cannot give
        back the GPUs it holds, came out further from CP-SAT's schedules with it."""
        self._arrivals.append((now, weight))
        self._arrived_weight += weight
        self._forget_arrivals(now)

    def _forget_arrivals(self, now: float) -> None:
        """Drop the arrivals older than :data:`ARRIVAL_WINDOW_S` (a decision does too: the rate falls when
        nothing arrives)."""
        seen = self._arrivals
        while seen and seen[0][0] <= now - ARRIVAL_WINDOW_S:
            self._arrived_weight -= seen.popleft()[1]
        if not seen:
            self._arrived_weight = 0.0  # no float drift

    def update_end(self, key: str, end_s: float) -> None:
        """A running job's estimated end changed (its speed was measured, or it ran past the estimate)."""
        run = self.by_job.get(key)
        if run is None or run.released or run.end_s == end_s:
            return
        self._drop(run)  # the old heap entry is skipped from now on
        fresh = Running(
            end_s=end_s,
            job=run.job,
            nodes=run.nodes,
            per_node=run.per_node,
            option=run.option,
            problem=run.problem,
            start_s=run.start_s,
        )
        self._push(fresh)
        while self.running and self.running[0][2].released:
            heapq.heappop(self.running)

    def review(
        self,
        now: float,
        *,
        max_restarts: int,
        options_now: Callable[[str], tuple[Option, ...]] | None = None,
        admit: Admission | None = None,
    ) -> list[Move]:
        """Preempt and grow running jobs after :meth:`decide` at the same time (module docstring;
        :func:`frenzy_opt.solvers.greedy_review.review`)."""
        return review(self, now, max_restarts=max_restarts, options_now=options_now, admit=admit)


def _drop_type(cache: dict[tuple[str, int, int], _V], gpu_type: str) -> None:
    """Forget what a decision's per-shape ``cache`` holds for ``gpu_type``."""
    for key in [k for k in cache if k[0] == gpu_type]:
        del cache[key]


def _reach(index: FreeIndex) -> int:
    """The most GPUs one option of the type could take now: its wholly free nodes' GPUs, else its largest free
    block on one node (an option of fewer GPUs than a node fits inside one node, of more on whole nodes)."""
    whole = len(index.buckets[index.size])
    if whole:
        return whole * index.size
    return max((left for left in range(index.size, 0, -1) if index.buckets[left]), default=0)


@register("greedy")
class GreedyHAS:
    """Replays the online policy over the problem's arrivals: decide at every arrival and completion."""

    name = "greedy"

    def __init__(
        self, priced_jobs: int | None = PRICED_JOBS, backfill_tests: int = BACKFILL_TESTS, **_: object
    ) -> None:
        self.decision_times_s: list[float] = []
        self.priced_jobs, self.backfill_tests = priced_jobs, backfill_tests
        """A decision's bounds (:class:`GreedyState`); None prices every job (the unbounded decision)."""

    def solve(self, problem: SchedulingProblem) -> Schedule:
        start = time.perf_counter()
        state = GreedyState(problem, priced_jobs=self.priced_jobs, backfill_tests=self.backfill_tests)
        arrivals = sorted(problem.jobs, key=lambda j: (j.arrival_s, j.id))
        assignments: list[Assignment] = []
        i = 0
        now = 0.0
        while i < len(arrivals) or state.queue:
            # The next event: an arrival or a completion, whichever comes first (arrivals first on ties).
            next_arrival = arrivals[i].arrival_s if i < len(arrivals) else float("inf")
            next_end = state.running[0][0] if state.running else float("inf")
            now = min(next_arrival, next_end)
            if now == float("inf"):
                raise ValueError("greedy: queued jobs can never start (no option fits the cluster)")
            state.complete_until(now)
            while i < len(arrivals) and arrivals[i].arrival_s <= now:
                state.queue[arrivals[i].id] = arrivals[i]
                i += 1
            tick = time.perf_counter()
            assignments += state.decide(now)
            self.decision_times_s.append(time.perf_counter() - tick)
        return Schedule(
            solver=self.name,
            status=SolverStatus.FEASIBLE,
            assignments=tuple(assignments),
            solve_time_s=time.perf_counter() - start,
        )
