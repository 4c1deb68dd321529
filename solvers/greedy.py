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
  behind it. As a fluid (Harchol-Balter 2013, ch. 13), g GPUs held for d seconds delay each job behind by
  g·d / C (C: the cluster's GPUs), so the term is (weight behind) × g·d / C. With nobody behind a job takes
  its fastest plan; behind a long queue, the plan that uses the fewest GPU-seconds (the best scaling
  efficiency) — the trade-off of Pollux's goodput and heSRPT (Berg et al. 2020), priced by the queue. A
  plan that would end after the job's deadline costs :data:`LATE_PENALTY` times its lateness on top;
* placement follows the shared rule (:mod:`frenzy_opt.hardware.topology`): inside one node by best fit (the node
  with the fewest free GPUs that still fit, keeping large blocks free), else whole free nodes;
* a job that chooses to wait reserves its GPU type from its estimated start; later jobs may backfill that
  type only if they finish before the reservation (EASY backfilling, Lifka 1995).

Where the executor can stop and resume jobs (the simulator; checkpoints), :meth:`GreedyState.review` then
revisits running jobs at the same event:

* **preemption** (shortest-remaining-first, Schrage 1968): a queued job that waits for GPUs of a type may
  stop running jobs there of no higher priority whose remaining time is over :data:`PREEMPT_RATIO` times its
  own run, longest remaining first, when its weighted wait saved exceeds what the stopped jobs lose (their
  restart cost plus its run, weighted) — at most ``max_restarts`` stops per job, and never a job that has
  not yet run past its own restart cost;
* **elastic growth**: the GPUs left idle on types no queued job waits for are divided among the running jobs
  that may move (the :data:`REVIEW_GROWTHS` with the longest remaining time) by marginal gain per GPU
  (:mod:`frenzy_opt.solvers.waterfill`); a job moves to the faster plan it was given (its own GPUs included)
  when the time it saves, restart paid, is over :data:`GROW_GAIN` of its remaining time and
  :data:`MOVE_MARGIN` restarts.
  Shrinking is the preemption above: the stopped job rejoins the queue and takes, by marginal cost, what
  is left beside the short job.

Free GPUs are kept per type in buckets by free count (best fit in O(node size)), running jobs in a heap by
end time: a decision never rescans the whole cluster (:meth:`GreedyState.review` walks the running jobs of
the types waiting jobs ask for). The queue is kept in rank order by bisection, and a decision prices each job's
options from per-type books of placement shapes (:mod:`frenzy_opt.solvers.greedy_index`: a shape's fit, its
fit beside the reservation and its earliest wait are worked out once per decision, not once per option). A
decision still walks the queue up to the last job it reaches: every job that waits plans its start and counts
its work into the queue ahead of the next ones, so its cost grows with the queue's depth
(``benchmarks/results/has_scale.md``).
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from frenzy_opt.core.enums import SolverStatus
from frenzy_opt.core.protocols import Admission
from frenzy_opt.hardware.placement import FreeIndex, choose
from frenzy_opt.planning.problem import Assignment, Option, ProblemJob, Schedule, SchedulingProblem
from frenzy_opt.solvers.base import register
from frenzy_opt.solvers.greedy_index import Priced, Pricing, RankOrder, ShapeBook, price_options
from frenzy_opt.solvers.waterfill import Candidate, divide

# A deadline is near when less than this many fastest runs of the job are left before it (a design choice:
# twice the fastest run leaves room for one wait as long as the job itself).
URGENT_SLACK = 2.0
# Weight per second of lateness past a deadline, relative to a second of completion time: a late plan is
# chosen only when every plan is late (then the least late one).
LATE_PENALTY = 100.0
# Preempt only jobs whose remaining time is over this multiple of the waiting job's run (SRPT with a
# hysteresis, so two jobs of similar size never swap back and forth).
PREEMPT_RATIO = 2.0
# Impatient, a decision plans the wait (estimated start, reservation) of at most this many jobs that cannot
# start now; the others wait unplanned until the next decision (a bound on its cost with a long queue).
IMPATIENT_WAITS = 8
# Impatient, a job that fits now still waits for a busy plan if that costs it less than this fraction of the
# best plan that fits now (a short wait for much faster GPUs; a design choice, 0 = never wait).
WAIT_GAIN = 0.5
# How much one review looks at (a bound on its cost, whatever the queue and the cluster): the first queued jobs
# in decision order, each one's cheapest plans, and the running jobs with the longest remaining time for growth.
REVIEW_WAITING = 4
REVIEW_OPTIONS = 3
REVIEW_GROWTHS = 16
# Restarts may take at most this fraction of a job's time since its first start (see GreedyState._movable).
MAX_OVERHEAD = 0.1
# A job moved is not moved again before it has run this many times its restart cost (a design choice: two
# moves in a row for small gains would each pay a checkpoint save and load).
HYSTERESIS = 3.0
# A move must gain this many times what it costs (restart and the stopped jobs' delay): a margin for the
# prediction error of the gain (the step-time model's cross-validated error is tens of percent).
MOVE_MARGIN = 1.5
# Grow a running job only if it saves over this fraction of its remaining time, its restart paid.
GROW_GAIN = 0.25


@dataclass(slots=True)
class _Running:
    end_s: float
    job: str
    nodes: tuple[int, ...]
    per_node: int
    gpu_type: str = ""
    released: bool = False
    option: Option | None = None
    problem: ProblemJob | None = None
    """The job as it was started (None: a hold, or a run adopted after a restart of the orchestrator)."""
    start_s: float = 0.0
    seq: int = 0

    @property
    def num_gpus(self) -> int:
        return self.per_node * len(self.nodes)


@dataclass(frozen=True, slots=True)
class Move:
    """A running job :meth:`GreedyState.review` stopped: it rejoins the queue (the caller enqueues it with
    its remaining work), with only options shorter than ``max_duration_s`` when it is to grow."""

    job: str
    reason: str
    """``preempt`` (for a waiting job) or ``grow`` (into idle GPUs)."""
    max_duration_s: float = float("inf")
    min_duration_s: float = 0.0
    """A growth's options are cut to ``[min_duration_s, max_duration_s)``: no faster than the plan the
    division (:mod:`frenzy_opt.solvers.waterfill`) gave it, so it takes no GPUs promised to another job."""


class _Horizon:
    """When a placement shape of one GPU type can start: the type's running jobs in end order and, after
    each end, the largest free block on one node and the number of wholly free nodes (both only grow, so a
    shape's earliest start is a binary search). Extended lazily: a decision walks only as far as its
    queries need."""

    def __init__(self, index: FreeIndex, runs: list[tuple[float, int, _Running]]) -> None:
        self.index, self.runs, self.pos = index, runs, 0
        self.freed: dict[int, int] = {}
        self.block = max((left for left in range(index.size + 1) if index.buckets[left]), default=0)
        self.whole = len(index.buckets[index.size])
        self.ends: list[float] = []
        self.blocks: list[int] = []
        self.wholes: list[int] = []

    def _extend(self) -> None:
        end, _, run = self.runs[self.pos]
        self.pos += 1
        size = self.index.size
        if run.per_node == size:  # it held its nodes whole: they are free once it ends (no per-node walk)
            self.whole += len(run.nodes)
            self.block = size
        else:
            for node in run.nodes:
                after = self.freed[node] = self.freed.get(node, self.index.free[node]) + run.per_node
                self.block = max(self.block, after)
                if after == size:
                    self.whole += 1
        self.ends.append(end)
        self.blocks.append(self.block)
        self.wholes.append(self.whole)

    def earliest(self, option: Option) -> int:
        """How many running jobs (in end order) must end before the option's placement fits, minus one:
        the index of the end it waits for; -1 if never. Like the rescan it replaces, an option that fits
        already (blocked by a reservation) waits for the first end."""
        values, need = (self.blocks, option.num_gpus) if option.whole_nodes == 0 else (self.wholes, option.whole_nodes)
        i = bisect.bisect_left(values, need)
        if i < len(values):
            return i
        while self.pos < len(self.runs):
            self._extend()
            if values[-1] >= need:
                return len(values) - 1
        return -1

    def free_after(self, i: int) -> dict[int, int]:
        """Free GPUs per node of the type once the first ``i + 1`` running jobs have ended."""
        free = dict(self.index.free)
        for _, _, run in self.runs[: i + 1]:
            for node in run.nodes:
                free[node] += run.per_node
        return free


class _Reservation:
    """EASY backfilling's reservation for the first waiting job of a GPU type (Lifka 1995; Mu'alem &
    Feitelson 2001): its start, its end, and the GPUs per node that stay free at its start once it has
    taken its own — the "extra" GPUs a job may backfill onto even if it runs past the reserved start."""

    def __init__(self, option: Option, start: float, free: dict[int, int], size: int) -> None:
        self.start, self.end, self.size = start, start + option.duration_s, size
        self.left = free
        # Nodes per free count (``free`` lists nodes in ascending order, so the first match is the lowest).
        self.counts = [0] * (size + 1)
        for left, many in Counter(free.values()).items():
            self.counts[left] = many
        nodes = choose(option, free, size)
        assert nodes is not None  # the reserved start is when the option fits
        for n in nodes:
            self._set(n, free[n] - option.gpus_per_node)
        self._fits: dict[tuple[int, int], bool] = {}

    def _set(self, node: int, left: int) -> None:
        self.counts[self.left[node]] -= 1
        self.counts[left] += 1
        self.left[node] = left

    def take(self, nodes: tuple[int, ...], per_node: int) -> bool:
        """Whether a job on ``nodes`` (``per_node`` GPUs each) running past the reserved start leaves the
        reservation whole; if so, its GPUs are counted out of the extra ones."""
        if any(self.left[n] < per_node for n in nodes):
            return False
        for n in nodes:
            self._set(n, self.left[n] - per_node)
        self._fits.clear()
        return True

    def fits_alongside(self, option: Option) -> bool:
        """Whether the option's shape still fits at the reserved start next to the reserved job."""
        key = (option.num_gpus, option.whole_nodes)
        found = self._fits.get(key)
        if found is None:
            if option.whole_nodes == 0:
                found = any(self.counts[v] for v in range(option.num_gpus, self.size + 1))
            else:
                found = self.counts[self.size] >= option.whole_nodes
            self._fits[key] = found
        return found


_Choice = Priced
"""A job's best option so far in one decision: its cost, its estimated end, and either the nodes it starts on
now or (``nodes`` None) the index in the type's horizon of the running job's end it waits for (-1: none it
knows of)."""


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
    gpus: int  # GPUs in the cluster, at least 1
    reserved: dict[str, _Reservation] = field(default_factory=dict)
    # Like ``horizons``, dropped for a type when a job starts on it: where each placement shape fits now.
    horizons: dict[str, _Horizon] = field(default_factory=dict)
    fits: dict[tuple[str, int, int], tuple[int, ...] | None] = field(default_factory=dict)
    books: dict[str, ShapeBook] = field(default_factory=dict)  # the fast path's per-type shapes (greedy_index)
    floors: dict[str, float] = field(default_factory=dict)  # the fast path's queue-ahead floors, dropped as ``ahead``
    # GPU-seconds ahead of a waiting job on each type: what runs there now, and what earlier jobs of this
    # decision chose to wait for (the queue ahead, as a fluid: Harchol-Balter 2013, ch. 13).
    ahead: dict[str, float] = field(default_factory=dict)
    analysed: int = 0  # impatient: jobs whose wait this decision planned


class _Queue(dict[str, ProblemJob]):
    """The queue: a dict that notes the ids put or taken since the decision order was last taken, so that
    :meth:`GreedyState._order` updates the order (:class:`RankOrder`) instead of sorting the queue again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.touched: list[str] = list(self)

    def __setitem__(self, key: str, value: ProblemJob) -> None:
        super().__setitem__(key, value)
        self.touched.append(key)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.touched.append(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.touched.append(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, ProblemJob]:
        key, job = super().popitem()
        self.touched.append(key)
        return key, job

    def clear(self) -> None:
        self.touched += list(self)
        super().clear()

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


@dataclass
class GreedyState:
    """The online scheduler's state: free GPUs, running jobs, the queue."""

    problem: SchedulingProblem
    free: dict[str, FreeIndex] = field(init=False)
    capacity: dict[str, int] = field(init=False)
    running: list[tuple[float, int, _Running]] = field(default_factory=list)
    queue: dict[str, ProblemJob] = field(default_factory=_Queue)
    by_job: dict[str, _Running] = field(default_factory=dict)
    _ranks: dict[str, tuple[float, float, float, str]] = field(default_factory=dict)
    _ranked_options: dict[str, tuple[Option, ...]] = field(default_factory=dict)
    _sorted: dict[str, tuple[Option, ...]] = field(default_factory=dict)
    _fewest: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per queued job, the fewest GPUs any of its options takes on each type."""
    waiting: dict[str, tuple[Option | None, float]] = field(default_factory=dict)
    """After :meth:`decide`: per job it reached and left queued, the option it waits for (None: admission
    ruled out every option) and its estimated start."""
    restarts: dict[str, int] = field(default_factory=dict)
    """Stops per job :meth:`review` made (bounded by its ``max_restarts``)."""
    queue_price: float = 1.0
    patient: bool = True
    """True: a job may wait for a plan whose GPUs are busy when that ends it sooner (non-preemptive use).
    False (where :meth:`review` may move jobs): a job that fits now starts now on the best plan that fits
    and grows later (waiting estimates count only the running jobs, not the shorter jobs still to come)."""
    """Scale of the queue's price of GPU-seconds in the marginal cost (module docstring); 0: every job takes
    its fastest plan, as the HAS did before."""
    _deadlines: set[str] = field(default_factory=set)
    _ends: dict[str, list[tuple[float, int, _Running]]] = field(default_factory=dict)
    """Per GPU type its running jobs (and holds) in end order."""
    _work: dict[str, list[float]] = field(default_factory=dict)
    """Per GPU type, over its running jobs: the sum of GPUs x end and the sum of GPUs."""

    _first_start: dict[str, float] = field(default_factory=dict)
    _seq: int = 0
    _ordered: RankOrder = field(default_factory=RankOrder)
    """The queue in rank order as of the last :meth:`_order` (kept up to date from :class:`_Queue`'s notes)."""
    fast: bool = True
    """Price options through the per-decision shape books (:mod:`frenzy_opt.solvers.greedy_index`); False: the
    plain pricing of :meth:`_price`, the reference the fast path is tested against (same decisions)."""

    def __post_init__(self) -> None:
        if not isinstance(self.queue, _Queue):
            self.queue = _Queue(self.queue)
        topology = self.problem.topology
        self.free = {
            t: FreeIndex({i: topology.nodes[i].num_gpus for i in topology.nodes_of(t)}) for t in topology.gpu_types
        }
        self.capacity = {t: self.problem.topology.num_gpus_of(t) for t in self.problem.topology.gpu_types}
        for busy in self.problem.busy:
            gpu_type = self.problem.topology.nodes[busy.node].gpu.name
            self.free[gpu_type].change(busy.node, -busy.num_gpus)
            self._push(_Running(end_s=busy.until_s, job="", nodes=(busy.node,), per_node=busy.num_gpus))

    def _push(self, run: _Running) -> tuple[float, int, _Running]:
        self._seq += 1
        run.gpu_type = self.problem.topology.nodes[run.nodes[0]].gpu.name
        run.seq = self._seq
        entry = (run.end_s, self._seq, run)
        heapq.heappush(self.running, entry)
        if run.job:
            self.by_job[run.job] = run
        bisect.insort(self._ends.setdefault(run.gpu_type, []), entry)
        sums = self._work.setdefault(run.gpu_type, [0.0, 0.0])
        sums[0] += run.num_gpus * run.end_s
        sums[1] += run.num_gpus
        return entry

    def _drop(self, run: _Running) -> None:
        """Take a run that ended or was replaced out of its type's end order and work sums."""
        run.released = True
        ends = self._ends[run.gpu_type]
        i = bisect.bisect_left(ends, (run.end_s, run.seq))
        assert ends[i][2] is run
        del ends[i]
        sums = self._work[run.gpu_type]
        sums[0] -= run.num_gpus * run.end_s
        sums[1] -= run.num_gpus

    def hold(self, key: str, node: int, num_gpus: int, until_s: float) -> None:
        """Take ``num_gpus`` of ``node`` until about ``until_s`` (a node down for repair), under ``key``."""
        gpu_type = self.problem.topology.nodes[node].gpu.name
        self.free[gpu_type].change(node, -num_gpus)
        self._push(_Running(end_s=until_s, job=key, nodes=(node,), per_node=num_gpus))

    def occupy(self, key: str, nodes: tuple[int, ...], per_node: int, until_s: float) -> None:
        """Take ``per_node`` GPUs on each of ``nodes`` until about ``until_s`` for job ``key`` (a run that
        survived a restart of the orchestrator)."""
        gpu_type = self.problem.topology.nodes[nodes[0]].gpu.name
        for node in nodes:
            self.free[gpu_type].change(node, -per_node)
        self._push(_Running(end_s=until_s, job=key, nodes=nodes, per_node=per_node))

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

    def complete_until(self, now: float) -> list[_Running]:
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

    def _horizon(self, gpu_type: str, horizons: dict[str, _Horizon]) -> _Horizon:
        """The type's :class:`_Horizon` for this decision, over its running jobs in end order (kept sorted
        as jobs start and end); rebuilt after a start on the type."""
        horizon = horizons.get(gpu_type)
        if horizon is None:
            horizon = horizons[gpu_type] = _Horizon(self.free[gpu_type], self._ends.setdefault(gpu_type, []))
        return horizon

    def _rank(self, job: ProblemJob) -> tuple[float, float, float, str]:
        """Priority class, then WSPT order (weight / fastest duration, larger first), then arrival, then id;
        cached per job."""
        key = self._ranks.get(job.id)
        if key is None or self._ranked_options.get(job.id) is not job.options:
            key = self._ranks[job.id] = (-job.priority, -job.weight / job.fastest_s, job.arrival_s, job.id)
            self._ranked_options[job.id] = job.options
            self._sorted[job.id] = tuple(sorted(job.options, key=lambda o: o.duration_s))
            fewest: dict[str, int] = {}
            for option in job.options:
                fewest[option.gpu_type] = min(option.num_gpus, fewest.get(option.gpu_type, option.num_gpus))
            self._fewest[job.id] = fewest
            if job.deadline_s is not None:
                self._deadlines.add(job.id)
        return key

    def _ranked(self) -> list[ProblemJob]:
        """The queue sorted by :meth:`_rank`: the last order with what left or was replaced taken out and what
        was put inserted, each by bisection (the same order as a full sort: the rank ends with the job's id, so
        no two are equal). A fresh list; the kept one is never handed out."""
        queue = self.queue
        if not isinstance(queue, _Queue):  # a plain dict was assigned: take it over (and sort it whole)
            queue = self.queue = _Queue(queue)
            self._ordered = RankOrder()
        touched, queue.touched = queue.touched, []
        self._ordered.sync(touched, queue.get, self._rank)
        return list(self._ordered.jobs)

    def _order(self, now: float) -> list[ProblemJob]:
        """The queue in decision order (module docstring): rank, with near-deadline jobs moved to the front of
        their priority class."""
        order = self._ranked()
        if not self._deadlines:
            return order

        def urgent(job: ProblemJob) -> tuple[int, int, float]:
            deadline = job.deadline_s
            near = deadline is not None and deadline - now < URGENT_SLACK * job.fastest_s
            return (-job.priority, 0 if near else 1, deadline if near and deadline is not None else 0.0)

        return sorted(order, key=urgent)  # stable: WSPT order inside each group

    def _by_duration(self, job: ProblemJob) -> tuple[Option, ...]:
        """The job's options, shortest first (sorted when it was ranked)."""
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
        self.waiting = {}
        started: list[Assignment] = []
        free_total = sum(index.count for index in self.free.values())
        if free_total == 0:
            return started  # nothing can start (the loop below would stop at its first job)
        order = self._order(now)
        round_ = _Round(
            now=now,
            free_total=free_total,
            behind=sum(map(_weight, order)),  # the same sum as job by job, at C speed
            gpus=max(sum(self.capacity.values()), 1),
        )
        for job in order:
            round_.behind -= job.weight
            if round_.free_total == 0:
                break  # nothing can start; the remaining jobs' reservations would block nothing
            choice = self._choose(job, round_, admit)
            if choice is _NoChoice.REFUSED:
                self.waiting[job.id] = (None, float("inf"))  # None: admission's doing
            elif isinstance(choice, _Choice):
                if choice.nodes is None:
                    self._wait(job, choice, round_)
                else:
                    started.append(self._start(job, choice, choice.nodes, round_, admit))
        return started

    def plan_waits(
        self, now: float, admit: Admission | None = None, limit: int = 500
    ) -> tuple[list[ProblemJob], dict[str, tuple[Option | None, float]]]:
        """The queue in decision order, and what each of its first ``limit`` jobs waits for and when it is
        expected to start (``(None, inf)``: admission refuses every option), as a patient decision at ``now``
        would plan them on the GPUs held now; nothing starts. A job that fits now is expected at once, its work
        counted into the queue ahead of the later ones. For a queued job's estimated start: a decision plans
        the waits of only some jobs (none when no GPU is free, :meth:`decide`)."""
        kept, patient = self.waiting, self.patient
        self.waiting, self.patient = {}, True
        try:
            order = self._order(now)
            planned = order[:limit]
            round_ = _Round(
                now=now,
                free_total=sum(index.count for index in self.free.values()),
                behind=sum(job.weight for job in planned),
                gpus=max(sum(self.capacity.values()), 1),
            )
            for job in planned:
                round_.behind -= job.weight
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
        """The job's cheapest option this decision: shortest options first, stopping once no longer one can
        cost less. Impatient, a job waits only when nothing fits now; once every type holds a reservation,
        how long it would wait changes no start of this decision (only what :attr:`waiting` says)."""
        best: _Choice | None = None
        plan_wait = False
        if self.patient:
            passes: tuple[bool, ...] = (False,)
        else:
            fewest = self._fewest[job.id]
            room = any(self.free[t].count >= n for t, n in fewest.items())  # else nothing can fit now
            plan_wait = len(round_.reserved) < len(self.free) and round_.analysed < IMPATIENT_WAITS
            passes = ((True,) if room else ()) + ((False,) if plan_wait else ())
        refused = admitted = False  # whether admission refused an option, and let one through
        pricing = self._pricing(job, round_, admit) if self.fast else None
        for now_only in passes:
            if pricing is not None:
                best, no, yes = price_options(self._by_duration(job), pricing, now_only, best)
                refused, admitted = refused or no, admitted or yes
                if best is not None and (not now_only or WAIT_GAIN <= 0.0 or not plan_wait):
                    break
                continue
            for option in self._by_duration(job):
                if best is not None and best.cost <= job.weight * option.duration_s:
                    break  # this option and every longer one cost no less than the best so far
                if admit is not None and not admit.allows(job.id, option):
                    refused = True
                    continue
                admitted = True
                candidate = self._price(job, option, now_only, best, round_)
                if candidate is None:
                    continue
                # impatient: waiting must beat the best plan that fits now by WAIT_GAIN
                waits_instead = candidate.nodes is None and best is not None and best.nodes is not None
                if best is None or candidate.cost < best.cost * (WAIT_GAIN if waits_instead else 1.0):
                    best = candidate
            if best is not None and (not now_only or WAIT_GAIN <= 0.0 or not plan_wait):
                break  # impatient: something fits now, take the best of that
        if best is not None:
            return best
        # admission ruled out every option, or (impatient) its wait was not planned
        return _NoChoice.REFUSED if refused and not admitted else _NoChoice.UNPLANNED

    def _pricing(self, job: ProblemJob, round_: _Round, admit: Admission | None) -> Pricing:
        """What the fast path (:func:`greedy_index.price_options`) reads to price ``job``'s options."""
        now = round_.now

        def book(gpu_type: str) -> ShapeBook:
            found = round_.books[gpu_type] = ShapeBook(
                free=self.free[gpu_type],
                reservation=round_.reserved.get(gpu_type),
                horizon=lambda: self._horizon(gpu_type, round_.horizons),
            )
            return found

        def floor(gpu_type: str) -> float:
            found = round_.floors[gpu_type] = now + self._ahead(gpu_type, now, round_.ahead) / self.capacity[gpu_type]
            return found

        return Pricing(
            now=now,
            weight=job.weight,
            deadline_s=job.deadline_s,
            used_scale=self.queue_price * round_.behind,
            gpus=round_.gpus,
            books=round_.books,
            make_book=book,
            floors=round_.floors,
            make_floor=floor,
            allows=None if admit is None else (lambda option: admit.allows(job.id, option)),
            late_penalty=LATE_PENALTY,
            wait_gain=WAIT_GAIN,
        )

    def _price(
        self, job: ProblemJob, option: Option, now_only: bool, best: _Choice | None, round_: _Round
    ) -> _Choice | None:
        """What ``option`` would cost the job: started now if it fits (next to the type's reservation), else
        started when the horizon, the reservation and the queue ahead allow. None when ``now_only`` and it
        does not fit now, or when waiting cannot beat ``best``."""
        now, gpu_type = round_.now, option.gpu_type
        shape = (gpu_type, option.num_gpus, option.whole_nodes)
        if shape in round_.fits:
            nodes = round_.fits[shape]
        else:
            nodes = round_.fits[shape] = self.free[gpu_type].fit(option)
        reservation = round_.reserved.get(gpu_type)
        fits_now = nodes is not None and (
            reservation is None
            or now + option.duration_s <= reservation.start
            or all(reservation.left[n] >= option.gpus_per_node for n in nodes)
        )
        if now_only and not fits_now:
            return None
        used = self._used(round_.behind, option, round_.gpus)
        index = -1
        if fits_now:
            end = now + option.duration_s
        else:
            floor = now + self._ahead(gpu_type, now, round_.ahead) / self.capacity[gpu_type]
            if best is not None and best.cost <= job.weight * (floor + option.duration_s - now) + used:
                return None  # even the queue ahead alone makes it cost no less than the best
            horizon = self._horizon(gpu_type, round_.horizons)
            index = horizon.earliest(option)
            start = float("inf") if index < 0 else max(horizon.ends[index], now)
            if reservation is not None and start >= reservation.start and not reservation.fits_alongside(option):
                start = max(start, reservation.end)  # it queues behind the reserved job
            start = max(start, floor)
            end, nodes = start + option.duration_s, None
        cost = job.weight * (end - now) + used
        if job.deadline_s is not None and end > job.deadline_s:
            cost += LATE_PENALTY * job.weight * (end - job.deadline_s)
        return _Choice(cost=cost, end=end, option=option, nodes=nodes, wait_for=index)

    def _wait(self, job: ProblemJob, choice: _Choice, round_: _Round) -> None:
        """The job waits for its choice: say so in :attr:`waiting`, count its work into the queue ahead, and
        reserve its start if it is the first to wait on the type (EASY backfilling)."""
        option, gpu_type = choice.option, choice.option.gpu_type
        if not self.patient:
            round_.analysed += 1
        self.waiting[job.id] = (option, choice.end - option.duration_s)
        if choice.end != float("inf"):
            round_.ahead[gpu_type] = (
                self._ahead(gpu_type, round_.now, round_.ahead) + option.num_gpus * option.duration_s
            )
            round_.floors.pop(gpu_type, None)
        if choice.wait_for >= 0 and gpu_type not in round_.reserved:
            horizon = self._horizon(gpu_type, round_.horizons)
            round_.reserved[gpu_type] = _Reservation(
                option, choice.end - option.duration_s, horizon.free_after(choice.wait_for), self.free[gpu_type].size
            )
            round_.books.pop(gpu_type, None)  # its shapes now fit beside, and wait behind, the reservation

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
        round_.floors.pop(gpu_type, None)
        round_.horizons.pop(gpu_type, None)
        round_.books.pop(gpu_type, None)
        for key in [k for k in round_.fits if k[0] == gpu_type]:
            del round_.fits[key]
        run = _Running(end_s=end, job=job.id, nodes=nodes, per_node=per_node, option=option, problem=job, start_s=now)
        self._first_start.setdefault(job.id, now)
        self._push(run)
        del self.queue[job.id]
        for cache in (self._ranks, self._ranked_options, self._sorted, self._fewest):
            del cache[job.id]
        self._deadlines.discard(job.id)
        if admit is not None:
            admit.take(job.id, option)
        return Assignment(job=job.id, option=option, nodes=nodes, start_s=now, end_s=end)

    def _used(self, behind: float, option: Option, gpus: int) -> float:
        """The marginal-cost term of ``option``'s GPU-seconds (module docstring): the weight queued behind
        times g·d / C."""
        return self.queue_price * behind * option.num_gpus * option.duration_s / gpus

    def update_end(self, key: str, end_s: float) -> None:
        """A running job's estimated end changed (its speed was measured, or it ran past the estimate)."""
        run = self.by_job.get(key)
        if run is None or run.released or run.end_s == end_s:
            return
        self._drop(run)  # the old heap entry is skipped from now on
        fresh = _Running(
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

    def _movable(self, run: _Running, now: float, max_restarts: int) -> bool:
        """Whether review may stop ``run``: a preemptible job (not a hold) that has run :data:`HYSTERESIS`
        times its restart cost since it last started, under its spec's ``max_moves`` and both bounds: at
        most ``max_restarts`` stops, and restarts so far plus this one at most :data:`MAX_OVERHEAD` of the
        time since it first started (the budget of Pollux's re-allocation penalty, Qiao et al. 2021 §4.2,
        that Sia keeps)."""
        problem = run.problem
        if problem is None or run.released or not problem.preemptible:
            return False
        done = self.restarts.get(run.job, 0)
        if problem.max_moves is not None and done >= problem.max_moves:
            return False
        age = now - self._first_start.get(run.job, run.start_s)
        return (
            done < max_restarts
            and now - run.start_s >= max(HYSTERESIS * problem.restart_s, 1.0)
            and (done + 1) * problem.restart_s <= MAX_OVERHEAD * age
        )

    def review(
        self,
        now: float,
        *,
        max_restarts: int,
        options_now: Callable[[str], tuple[Option, ...]] | None = None,
        admit: Admission | None = None,
    ) -> list[Move]:
        """Preempt and grow running jobs (module docstring), after :meth:`decide` at the same time. Stopped
        jobs' GPUs are released here; the caller stops them and enqueues them again with their remaining
        work (and calls :meth:`decide` once more). ``options_now(job)``: a running job's options if it
        restarted now (durations with the restart cost); without it, no job grows. The work is bounded:
        the first :data:`REVIEW_WAITING` queued jobs, their :data:`REVIEW_OPTIONS` cheapest plans, and
        :data:`REVIEW_GROWTHS` running jobs."""
        moves: list[Move] = []
        movable: dict[str, list[tuple[int, float, str, _Running]]] = {}
        horizons: dict[str, _Horizon] = {}  # per type, until a preemption there changes its running jobs
        if self.queue:
            behind = sum(job.weight for job in self.queue.values())
            gpus = max(sum(self.capacity.values()), 1)
            for job in self._order(now)[:REVIEW_WAITING]:
                behind -= job.weight
                ranked = sorted(job.options, key=lambda o: job.weight * o.duration_s + self._used(behind, o, gpus))
                tried = 0
                for option in ranked:
                    if admit is not None and not admit.allows(job.id, option):
                        continue
                    tried += 1
                    found = self._preempt_for(job, option, now, max_restarts, movable, horizons)
                    if found is not None:
                        moves += found
                        break
                    if tried == REVIEW_OPTIONS:
                        break
        if (self.queue and self.patient) or options_now is None:
            return moves
        if sum(index.count for index in self.free.values()) == 0:
            return moves
        waited = {option.gpu_type for option, _ in self.waiting.values() if option is not None}
        free = {t: index for t, index in self.free.items() if t not in waited}  # queued jobs' types first
        longest = sorted(
            (r for r in self.by_job.values() if self._movable(r, now, max_restarts)), key=lambda r: (r.end_s, r.seq)
        )[-REVIEW_GROWTHS:]
        candidates = []
        for run in longest:
            assert run.problem is not None
            options = options_now(run.job)
            if admit is not None:
                options = tuple(o for o in options if admit.allows(run.job, o))
            candidates.append(
                Candidate(
                    job=run.job,
                    weight=run.problem.weight,
                    gpu_type=run.gpu_type,
                    nodes=run.nodes,
                    per_node=run.per_node,
                    left_s=run.end_s - now,
                    restart_s=run.problem.restart_s,
                    options=options,
                )
            )
        held: list[tuple[str, int, int]] = []  # idle GPUs promised to the grants, until the caller re-decides
        for grant in divide(candidates, free, grow_gain=GROW_GAIN, margin=MOVE_MARGIN):
            self.release(grant.job)
            for node in grant.nodes:
                self.free[grant.option.gpu_type].change(node, -grant.option.gpus_per_node)
                held.append((grant.option.gpu_type, node, grant.option.gpus_per_node))
            self.restarts[grant.job] = self.restarts.get(grant.job, 0) + 1
            moves.append(
                Move(
                    job=grant.job,
                    reason="grow",
                    max_duration_s=grant.limit_s,
                    min_duration_s=grant.option.duration_s,
                )
            )
        for gpu_type, node, count in held:
            self.free[gpu_type].change(node, count)
        return moves

    def _preempt_for(
        self,
        job: ProblemJob,
        option: Option,
        now: float,
        max_restarts: int,
        movable: dict[str, list[tuple[int, float, str, _Running]]],
        horizons: dict[str, _Horizon],
    ) -> list[Move] | None:
        """Stop running jobs so that ``job`` can start ``option`` now, if it is worth it (module docstring);
        None if it is not (or the option fits without). ``movable`` caches, per GPU type for this review,
        the runs :meth:`_movable` admits by (priority, longest remaining first), ``horizons`` the types'
        :class:`_Horizon` s (dropped for a type where it preempts)."""
        gpu_type = option.gpu_type
        index = self.free[gpu_type]
        if index.fit(option) is not None:
            return None
        runs = movable.get(gpu_type)
        if runs is None:
            runs = movable[gpu_type] = sorted(
                (run.problem.priority, -(run.end_s - now), run.job, run)
                for run in self.by_job.values()
                if run.gpu_type == gpu_type and run.problem is not None and self._movable(run, now, max_restarts)
            )
        threshold = PREEMPT_RATIO * option.duration_s
        size = index.size
        freed: dict[int, int] = {}
        whole = len(index.buckets[size])
        block = max((left for left in range(size + 1) if index.buckets[left]), default=0)
        chosen: list[_Running] = []
        loss = 0.0
        fits = False
        for priority, negative_left, _, run in runs:
            if priority > job.priority:
                break
            if -negative_left <= threshold or run.released:
                continue
            chosen.append(run)
            for node in run.nodes:
                after = freed[node] = freed.get(node, index.free[node]) + run.per_node
                block = max(block, after)
                whole += after == size
            assert run.problem is not None
            loss += run.problem.weight * (run.problem.restart_s + option.duration_s)
            fits = block >= option.num_gpus if option.whole_nodes == 0 else whole >= option.whole_nodes
            if fits:
                break
        if not fits:
            return None
        # Its wait without preemption: until the running jobs of the type free enough GPUs (a lower bound).
        ends = self._ends.setdefault(gpu_type, [])
        index_end = self._horizon(gpu_type, horizons).earliest(option)
        start = ends[index_end][0] if index_end >= 0 else float("inf")
        if job.weight * (start - now) <= MOVE_MARGIN * loss:
            return None
        horizons.pop(gpu_type, None)
        moves = []
        for run in chosen:
            self.release(run.job)
            self.restarts[run.job] = self.restarts.get(run.job, 0) + 1
            moves.append(Move(job=run.job, reason="preempt"))
        return moves


def _weight(job: ProblemJob) -> float:
    return job.weight


@register("greedy")
class GreedyHAS:
    """Replays the online policy over the problem's arrivals: decide at every arrival and completion."""

    name = "greedy"

    def __init__(self, fast: bool = True, **_: object) -> None:
        self.decision_times_s: list[float] = []
        self.fast = fast
        """False: the plain pricing (:attr:`GreedyState.fast`), for tests and benchmarks of the fast path."""

    def solve(self, problem: SchedulingProblem) -> Schedule:
        start = time.perf_counter()
        state = GreedyState(problem, fast=self.fast)
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
