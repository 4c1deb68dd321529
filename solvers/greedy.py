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

    def total(self) -> int:
        return sum(self.free.values())

    def change(self, node: int, delta: int) -> None:
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

    def earliest(self, option: Option, now: float) -> float:
        """The end after which the option's placement fits (at least ``now``); inf if never. Like the
        rescan it replaces, an option that fits already (blocked by a reservation) gets the first end."""
        values, need = (self.blocks, option.num_gpus) if option.whole_nodes == 0 else (self.wholes, option.whole_nodes)
        i = bisect.bisect_left(values, need)
        if i < len(values):
            return max(self.ends[i], now)
        while self.pos < len(self.runs):
            self._extend()
            if values[-1] >= need:
                return max(self.ends[-1], now)
        return float("inf")


@dataclass
class GreedyState:
    """The online scheduler's state: free GPUs, running jobs, the queue."""

    problem: SchedulingProblem
    free: dict[str, _FreeIndex] = field(init=False)
    running: list[tuple[float, int, _Running]] = field(default_factory=list)
    queue: dict[str, ProblemJob] = field(default_factory=dict)
    by_job: dict[str, _Running] = field(default_factory=dict)
    _seq: int = 0

    def __post_init__(self) -> None:
        self.free = {t: _FreeIndex(self.problem.topology, t) for t in self.problem.topology.gpu_types}
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

    def decide(self, now: float) -> list[Assignment]:
        """Start what should start now (module docstring)."""
        started: list[Assignment] = []
        reserved: dict[str, float] = {}
        horizons: dict[str, _Horizon] = {}
        ends: dict[str, list[tuple[float, int, _Running]]] = {}
        # Where each placement shape fits now; like ``horizons``, dropped for a type when a job starts on it.
        fits: dict[tuple[str, int, int], tuple[int, ...] | None] = {}
        order = sorted(self.queue.values(), key=lambda j: (-j.weight / j.fastest_s, j.arrival_s, j.id))
        for job in order:
            best: tuple[float, Option, tuple[int, ...] | None] | None = None
            for option in job.options:
                shape = (option.gpu_type, option.num_gpus, option.whole_nodes)
                if shape in fits:
                    nodes = fits[shape]
                else:
                    nodes = fits[shape] = self.free[option.gpu_type].fit(option)
                blocked = option.gpu_type in reserved and now + option.duration_s > reserved[option.gpu_type]
                candidate: tuple[float, Option, tuple[int, ...] | None]
                if nodes is not None and not blocked:
                    candidate = (now + option.duration_s, option, nodes)
                else:
                    horizon = self._horizon(option.gpu_type, horizons, ends)
                    candidate = (horizon.earliest(option, now) + option.duration_s, option, None)
                if best is None or candidate[0] < best[0]:
                    best = candidate
            assert best is not None
            end, option, nodes = best
            if nodes is None:
                start = end - option.duration_s
                if start != float("inf"):
                    reserved[option.gpu_type] = min(reserved.get(option.gpu_type, start), start)
                continue
            per_node = option.gpus_per_node
            for node in nodes:
                self.free[option.gpu_type].change(node, -per_node)
            horizons.pop(option.gpu_type, None)
            for key in [k for k in fits if k[0] == option.gpu_type]:
                del fits[key]
            entry = self._push(_Running(end_s=end, job=job.id, nodes=nodes, per_node=per_node))
            if option.gpu_type in ends:
                bisect.insort(ends[option.gpu_type], entry)
            del self.queue[job.id]
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
