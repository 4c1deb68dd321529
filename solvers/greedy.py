"""Greedy HAS: the heterogeneity-aware online scheduler.

At every event (a job arrives, a job completes) :meth:`GreedyState.decide` chooses which queued jobs start
now, with which plan and on which GPUs:

* jobs are taken in weighted-shortest-processing-time order (Smith 1956: weight / fastest duration, the
  order that minimises weighted completion time on one machine);
* for each job every candidate plan is weighed by its estimated completion time: now + duration if the
  plan's GPUs are free, else the time enough GPUs of that type free up (from the running jobs' end times)
  + duration, so a job waits for a faster plan only when waiting finishes it sooner;
* placement follows the shared rule (:mod:`frenzy_opt.topology`): inside one node by best fit (the node
  with the fewest free GPUs that still fit, keeping large blocks free), else whole free nodes;
* a job that chooses to wait reserves its GPU type from its estimated start; later jobs may backfill that
  type only if they finish before the reservation (EASY backfilling, Lifka 1995).

Free GPUs are kept per type in buckets by free count (best fit in O(node size)), running jobs in a heap by
end time: a decision never rescans the whole cluster.
"""

from __future__ import annotations

import bisect
import heapq
import time
from dataclasses import dataclass, field
from typing import Protocol

from frenzy_opt.problem import Assignment, Option, ProblemJob, Schedule, SchedulingProblem
from frenzy_opt.solvers.base import register
from frenzy_opt.topology import Topology


@dataclass(slots=True)
class _Running:
    end_s: float
    job: str
    nodes: tuple[int, ...]
    per_node: int
    gpu_type: str = ""
    released: bool = False


class _FreeIndex:
    """Free GPUs per node of one GPU type, bucketed by free count."""

    def __init__(self, topology: Topology, gpu_type: str) -> None:
        self.size = max(topology.nodes[i].num_gpus for i in topology.nodes_of(gpu_type))
        self.free = {i: topology.nodes[i].num_gpus for i in topology.nodes_of(gpu_type)}
        self.buckets: list[set[int]] = [set() for _ in range(self.size + 1)]
        for i, left in self.free.items():
            self.buckets[left].add(i)
        self.count = sum(self.free.values())
        """Free GPUs of the type in all."""

    def total(self) -> int:
        return self.count

    def change(self, node: int, delta: int) -> None:
        self.count += delta
        left = self.free[node]
        self.buckets[left].discard(node)
        self.free[node] = left + delta
        self.buckets[left + delta].add(node)

    def fit(self, option: Option) -> tuple[int, ...] | None:
        if option.whole_nodes == 0:
            for left in range(option.num_gpus, self.size + 1):  # best fit: the tightest node that fits
                if self.buckets[left]:
                    return (min(self.buckets[left]),)
            return None
        empty = self.buckets[self.size]
        if len(empty) < option.whole_nodes:
            return None
        return tuple(sorted(empty)[: option.whole_nodes])


class _Horizon:
    """When a placement shape of one GPU type can start: the type's running jobs in end order and, after
    each end, the largest free block on one node and the number of wholly free nodes (both only grow, so a
    shape's earliest start is a binary search). Extended lazily: a decision walks only as far as its
    queries need."""

    def __init__(self, index: _FreeIndex, runs: list[tuple[float, int, _Running]]) -> None:
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
        for node in run.nodes:
            after = self.freed[node] = self.freed.get(node, self.index.free[node]) + run.per_node
            self.block = max(self.block, after)
            if after == self.index.size:
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
        if option.whole_nodes == 0:
            node = min((left, n) for n, left in free.items() if left >= option.num_gpus)[1]
            self.left[node] -= option.num_gpus
        else:
            for n in sorted(n for n, left in free.items() if left == size)[: option.whole_nodes]:
                self.left[n] = 0
        self._fits: dict[tuple[int, int], bool] = {}

    def take(self, nodes: tuple[int, ...], per_node: int) -> bool:
        """Whether a job on ``nodes`` (``per_node`` GPUs each) running past the reserved start leaves the
        reservation whole; if so, its GPUs are counted out of the extra ones."""
        if any(self.left[n] < per_node for n in nodes):
            return False
        for n in nodes:
            self.left[n] -= per_node
        self._fits.clear()
        return True

    def fits_alongside(self, option: Option) -> bool:
        """Whether the option's shape still fits at the reserved start next to the reserved job."""
        key = (option.num_gpus, option.whole_nodes)
        found = self._fits.get(key)
        if found is None:
            if option.whole_nodes == 0:
                found = any(left >= option.num_gpus for left in self.left.values())
            else:
                found = sum(left == self.size for left in self.left.values()) >= option.whole_nodes
            self._fits[key] = found
        return found


class Admission(Protocol):
    """Who may use what (e.g. per-tenant quotas per GPU type, enforced by the scheduler itself)."""

    def allows(self, job: str, option: Option) -> bool: ...

    def take(self, job: str, option: Option) -> None: ...


@dataclass
class GreedyState:
    """The online scheduler's state: free GPUs, running jobs, the queue."""

    problem: SchedulingProblem
    free: dict[str, _FreeIndex] = field(init=False)
    capacity: dict[str, int] = field(init=False)
    running: list[tuple[float, int, _Running]] = field(default_factory=list)
    queue: dict[str, ProblemJob] = field(default_factory=dict)
    by_job: dict[str, _Running] = field(default_factory=dict)
    _ranks: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    _ranked_options: dict[str, tuple[Option, ...]] = field(default_factory=dict)
    _sorted: dict[str, tuple[Option, ...]] = field(default_factory=dict)
    waiting: dict[str, tuple[Option | None, float]] = field(default_factory=dict)
    """After :meth:`decide`: per job it reached and left queued, the option it waits for (None: admission
    ruled out every option) and its estimated start."""
    _seq: int = 0

    def __post_init__(self) -> None:
        self.free = {t: _FreeIndex(self.problem.topology, t) for t in self.problem.topology.gpu_types}
        self.capacity = {t: self.problem.topology.num_gpus_of(t) for t in self.problem.topology.gpu_types}
        for busy in self.problem.busy:
            gpu_type = self.problem.topology.nodes[busy.node].gpu.name
            self.free[gpu_type].change(busy.node, -busy.num_gpus)
            self._push(_Running(end_s=busy.until_s, job="", nodes=(busy.node,), per_node=busy.num_gpus))

    def _push(self, run: _Running) -> tuple[float, int, _Running]:
        self._seq += 1
        run.gpu_type = self.problem.topology.nodes[run.nodes[0]].gpu.name
        entry = (run.end_s, self._seq, run)
        heapq.heappush(self.running, entry)
        if run.job:
            self.by_job[run.job] = run
        return entry

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
        run.released = True
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
            self.by_job.pop(run.job, None)
            gpu_type = self.problem.topology.nodes[run.nodes[0]].gpu.name
            for node in run.nodes:
                self.free[gpu_type].change(node, run.per_node)
            done.append(run)
        return done

    def _horizon(
        self,
        gpu_type: str,
        horizons: dict[str, _Horizon],
        ends: dict[str, list[tuple[float, int, _Running]]],
    ) -> _Horizon:
        """The type's :class:`_Horizon` for this decision; its running jobs are sorted by end once per
        decision (jobs started during the decision are inserted) and the horizon is rebuilt after a start."""
        horizon = horizons.get(gpu_type)
        if horizon is None:
            runs = ends.get(gpu_type)
            if runs is None:
                runs = ends[gpu_type] = sorted(
                    e for e in self.running if not e[2].released and e[2].gpu_type == gpu_type
                )
            horizon = horizons[gpu_type] = _Horizon(self.free[gpu_type], runs)
        return horizon

    def _rank(self, job: ProblemJob) -> tuple[float, float, str]:
        """WSPT order (weight / fastest duration, larger first), then arrival, then id; cached per job."""
        key = self._ranks.get(job.id)
        if key is None or self._ranked_options.get(job.id) is not job.options:
            key = self._ranks[job.id] = (-job.weight / job.fastest_s, job.arrival_s, job.id)
            self._ranked_options[job.id] = job.options
            self._sorted[job.id] = tuple(sorted(job.options, key=lambda o: o.duration_s))
        return key

    def _by_duration(self, job: ProblemJob) -> tuple[Option, ...]:
        """The job's options, shortest first (sorted when it was ranked)."""
        return self._sorted[job.id]

    def _ahead(self, gpu_type: str, now: float, ahead: dict[str, float]) -> float:
        """GPU-seconds of work ahead on a type (see :meth:`decide`); the running part summed once per
        decision."""
        work = ahead.get(gpu_type)
        if work is None:
            work = ahead[gpu_type] = sum(
                max(run.end_s - now, 0.0) * run.per_node * len(run.nodes)
                for _, _, run in self.running
                if not run.released and run.gpu_type == gpu_type
            )
        return work

    def decide(self, now: float, admit: Admission | None = None) -> list[Assignment]:
        """Start what should start now (module docstring). ``admit`` (e.g. per-tenant quotas) may rule
        options out; a job whose every option it rules out waits. :attr:`waiting` tells, after the call,
        what each job the decision reached and left queued waits for."""
        self.waiting = {}
        started: list[Assignment] = []
        reserved: dict[str, _Reservation] = {}
        horizons: dict[str, _Horizon] = {}
        ends: dict[str, list[tuple[float, int, _Running]]] = {}
        # Where each placement shape fits now; like ``horizons``, dropped for a type when a job starts on it.
        fits: dict[tuple[str, int, int], tuple[int, ...] | None] = {}
        free_total = sum(index.count for index in self.free.values())
        # GPU-seconds ahead of a waiting job on each type: what runs there now, and what earlier jobs of this
        # decision chose to wait for (the queue ahead, as a fluid: Harchol-Balter 2013, ch. 13).
        ahead: dict[str, float] = {}
        order = sorted(self.queue.values(), key=self._rank)
        for job in order:
            if free_total == 0:
                break  # nothing can start; the remaining jobs' reservations would block nothing
            best: tuple[float, Option, tuple[int, ...] | None, int] | None = None
            for option in self._by_duration(job):
                if best is not None and best[0] <= now + option.duration_s:
                    break  # this option and every longer one end no sooner than the best so far
                if admit is not None and not admit.allows(job.id, option):
                    continue
                gpu_type = option.gpu_type
                shape = (gpu_type, option.num_gpus, option.whole_nodes)
                if shape in fits:
                    nodes = fits[shape]
                else:
                    nodes = fits[shape] = self.free[gpu_type].fit(option)
                reservation = reserved.get(gpu_type)
                if nodes is not None and (
                    reservation is None
                    or now + option.duration_s <= reservation.start
                    or all(reservation.left[n] >= option.gpus_per_node for n in nodes)
                ):
                    candidate: tuple[float, Option, tuple[int, ...] | None, int]
                    candidate = (now + option.duration_s, option, nodes, -1)
                else:
                    floor = now + self._ahead(gpu_type, now, ahead) / self.capacity[gpu_type]
                    if best is not None and best[0] <= floor + option.duration_s:
                        continue  # even the queue ahead alone makes it end no sooner than the best
                    horizon = self._horizon(gpu_type, horizons, ends)
                    i = horizon.earliest(option)
                    start = float("inf") if i < 0 else max(horizon.ends[i], now)
                    if (
                        reservation is not None
                        and start >= reservation.start
                        and not reservation.fits_alongside(option)
                    ):
                        start = max(start, reservation.end)  # it queues behind the reserved job
                    start = max(start, floor)
                    candidate = (start + option.duration_s, option, None, i)
                if best is None or candidate[0] < best[0]:
                    best = candidate
            if best is None:  # admission ruled out every option
                self.waiting[job.id] = (None, float("inf"))
                continue
            end, option, nodes, index = best
            gpu_type = option.gpu_type
            if nodes is None:
                self.waiting[job.id] = (option, end - option.duration_s)
                if end != float("inf"):
                    ahead[gpu_type] = self._ahead(gpu_type, now, ahead) + option.num_gpus * option.duration_s
                if index >= 0 and gpu_type not in reserved:
                    horizon = self._horizon(gpu_type, horizons, ends)
                    reserved[gpu_type] = _Reservation(
                        option, end - option.duration_s, horizon.free_after(index), self.free[gpu_type].size
                    )
                continue
            reservation = reserved.get(gpu_type)
            if reservation is not None and end > reservation.start:
                taken = reservation.take(nodes, option.gpus_per_node)
                assert taken
            per_node = option.gpus_per_node
            for node in nodes:
                self.free[gpu_type].change(node, -per_node)
            free_total -= option.num_gpus
            if gpu_type in ahead:
                ahead[gpu_type] += option.num_gpus * option.duration_s
            horizons.pop(gpu_type, None)
            for key in [k for k in fits if k[0] == gpu_type]:
                del fits[key]
            entry = self._push(_Running(end_s=end, job=job.id, nodes=nodes, per_node=per_node))
            if gpu_type in ends:
                bisect.insort(ends[gpu_type], entry)
            del self.queue[job.id]
            for cache in (self._ranks, self._ranked_options, self._sorted):
                del cache[job.id]
            if admit is not None:
                admit.take(job.id, option)
            started.append(Assignment(job=job.id, option=option, nodes=nodes, start_s=now, end_s=end))
        return started


@register("greedy")
class GreedyHAS:
    """Replays the online policy over the problem's arrivals: decide at every arrival and completion."""

    name = "greedy"

    def __init__(self, **_: object) -> None:
        self.decision_times_s: list[float] = []

    def solve(self, problem: SchedulingProblem) -> Schedule:
        start = time.perf_counter()
        state = GreedyState(problem)
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
            status="FEASIBLE",
            assignments=tuple(assignments),
            solve_time_s=time.perf_counter() - start,
        )
