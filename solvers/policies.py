"""Simulator policies (:class:`frenzy_opt.simulator.Policy`) and their registry.

* ``frenzy`` — MARP plans + the greedy HAS (:mod:`frenzy_opt.solvers.greedy`), deciding at every arrival and
  completion, non-preemptive: the same :class:`GreedyState` ``frenzy solve`` replays. It plans with its own
  predictions (the step-time model's step times x the job's steps), so under a truth other than the model
  its estimated ends are wrong and it pays for that; a running job past its estimated end counts as ending
  now in its estimates. ``frenzy-oracle`` is the same policy told every option's true step time.
* ``fifo`` — a plain cluster: each job runs the request its user made by hand (GPU type and count, see
  :mod:`frenzy_opt.tracemap`), with the fastest plan for that count. One FIFO queue per GPU type (a
  partition per type, as Slurm sites configure heterogeneous clusters); a queue's head blocks only its
  own type. No backfilling.
* ``optimal`` — the CP-SAT schedule of the whole workload (:mod:`frenzy_opt.solvers.cpsat`), computed once
  with all arrivals known (offline, clairvoyant) and replayed; tractable for tens of jobs. Its decision
  time is the solve time. It plans with predicted durations; under another truth a planned start whose
  GPUs are still held (an earlier job ran longer than predicted) takes any placement of the same option
  that fits, else waits until one does.
* ``sia`` and ``gavel`` — :mod:`frenzy_opt.solvers.sia`, :mod:`frenzy_opt.solvers.gavel`.

Placement on the simulator's ledger follows the shared rule (:mod:`frenzy_opt.topology`): inside one node by
best fit, else whole free nodes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from frenzy_opt.problem import Option, ProblemJob, SchedulingProblem, thin_fronts
from frenzy_opt.simulator import Action, SimJob, SimulationError, Simulator, Start
from frenzy_opt.solvers.cpsat import CpSatSolver
from frenzy_opt.solvers.greedy import GreedyState

_POLICIES: dict[str, Callable[..., object]] = {}


def register_policy(name: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
    def wrap(factory: Callable[..., object]) -> Callable[..., object]:
        _POLICIES[name] = factory
        return factory

    return wrap


def policy_names() -> list[str]:
    return sorted(_POLICIES)


def make_policy(name: str, **settings: object) -> object:
    """A fresh policy by name; ``ValueError`` lists the registered names, or names a bad setting."""
    factory = _POLICIES.get(name)
    if factory is None:
        raise ValueError(f"policy: unknown name {name!r}; allowed: {', '.join(policy_names())}")
    try:
        return factory(**settings)
    except TypeError as err:
        raise ValueError(f"policies.{name}: {err}") from None


def place(sim: Simulator, option: Option, free: list[int] | None = None) -> tuple[int, ...] | None:
    """Where ``option`` fits now on the simulator's ledger (or on ``free``, a copy a policy plans on):
    inside one node by best fit, else the lowest-numbered whole free nodes; None if it does not fit."""
    left = sim.free if free is None else free
    nodes = sim.topology.nodes_of(option.gpu_type)
    if option.whole_nodes == 0:
        best = -1
        for n in nodes:
            if sim.up[n] and left[n] >= option.num_gpus and (best < 0 or left[n] < left[best]):
                best = n
        return None if best < 0 else (best,)
    empty = [n for n in nodes if sim.up[n] and left[n] == sim.topology.nodes[n].num_gpus]
    return tuple(empty[: option.whole_nodes]) if len(empty) >= option.whole_nodes else None


class _Base:
    name = "base"
    round_s: float | None = None

    def __init__(self) -> None:
        self.sim: Simulator | None = None

    def attach(self, sim: Simulator) -> None:
        self.sim = sim

    def on_arrival(self, job: SimJob, now: float) -> None:
        return None

    def on_end(self, job: SimJob, now: float, finished: bool) -> None:
        return None

    def on_node(self, node: int, now: float, up: bool, until_s: float) -> None:
        return None


@register_policy("frenzy")
class FrenzyPolicy(_Base):
    """MARP plans + greedy HAS (module docstring). ``max_options_per_type`` thins each job's Pareto front
    as ``frenzy solve`` does."""

    name = "frenzy"
    oracle = False
    """True: plan with the simulator's true step times instead of the predictions (``frenzy-oracle``)."""

    def __init__(self, max_options_per_type: int = 4) -> None:
        super().__init__()
        self.max_options_per_type = max_options_per_type
        self.state: GreedyState | None = None
        self._options: dict[str, tuple[tuple[Option, ...], tuple[Option, ...]]] = {}
        self._thinned: dict[int, tuple[Option, ...]] = {}

    def attach(self, sim: Simulator) -> None:
        super().attach(sim)
        self.state = GreedyState(SchedulingProblem(topology=sim.topology, jobs=()))

    def _thin(self, options: tuple[Option, ...]) -> tuple[Option, ...]:
        """At most ``max_options_per_type`` per type, spread over the front; once per shared option set."""
        chosen = self._thinned.get(id(options))
        if chosen is None:
            per_type: dict[str, list[Option]] = {}
            for option in options:
                per_type.setdefault(option.gpu_type, []).append(option)
            chosen = self._thinned[id(options)] = thin_fronts(per_type.values(), self.max_options_per_type)
        return chosen

    def _enqueue(self, job: SimJob, remaining: float) -> None:
        assert self.state is not None
        chosen = self._thin(job.options)
        assert self.sim is not None
        restart = job.restart_s if remaining < job.steps else 0.0
        truth = self.sim.truth
        scaled = tuple(
            Option(
                gpu_type=o.gpu_type,
                num_gpus=o.num_gpus,
                whole_nodes=o.whole_nodes,
                duration_s=float(
                    math.ceil(restart + (truth.step_s(job, o) if self.oracle else job.step_s(o)) * remaining)
                ),
                plan=o.plan,
            )
            for o in chosen
        )
        self._options[job.id] = (chosen, scaled)
        self.state.queue[job.id] = ProblemJob(id=job.id, arrival_s=job.arrival_s, weight=job.weight, options=scaled)

    def on_arrival(self, job: SimJob, now: float) -> None:
        self._enqueue(job, float(job.steps))

    def on_end(self, job: SimJob, now: float, finished: bool) -> None:
        assert self.state is not None and self.sim is not None
        self.state.release(job.id)
        if not finished:
            self._enqueue(job, self.sim.jobs[job.id].remaining)

    def on_node(self, node: int, now: float, up: bool, until_s: float) -> None:
        assert self.state is not None and self.sim is not None
        key = f"node-down:{node}"
        if up:
            self.state.release(key)
        else:
            self.state.hold(key, node, self.sim.free[node], until_s)

    def decide(self, now: float) -> list[Action]:
        assert self.state is not None
        actions: list[Action] = []
        for a in self.state.decide(now):
            originals, scaled = self._options.pop(a.job)
            index = next(i for i, o in enumerate(scaled) if o is a.option)
            actions.append(Start(job=a.job, option=originals[index], nodes=a.nodes))
        return actions


@register_policy("frenzy-oracle")
class FrenzyOraclePolicy(FrenzyPolicy):
    """``frenzy`` told the true step time of every option (not a real policy: what its prediction errors
    cost it)."""

    name = "frenzy-oracle"
    oracle = True


@register_policy("fifo")
class FifoPolicy(_Base):
    """Per-type FIFO queues on the users' own requests (module docstring)."""

    name = "fifo"

    def __init__(self) -> None:
        super().__init__()
        self.queues: dict[str, deque[SimJob]] = {}

    def on_arrival(self, job: SimJob, now: float) -> None:
        self.queues.setdefault(job.request.gpu_type, deque()).append(job)

    def on_end(self, job: SimJob, now: float, finished: bool) -> None:
        if not finished:  # failed: back to the head of its queue, it keeps its place
            self.queues[job.request.gpu_type].appendleft(job)

    def decide(self, now: float) -> list[Action]:
        assert self.sim is not None
        actions: list[Action] = []
        free = list(self.sim.free)
        for queue in self.queues.values():
            while queue:
                job = queue[0]
                option = job.per_count[(job.request.gpu_type, job.request.num_gpus)]
                nodes = place(self.sim, option, free)
                if nodes is None:
                    break
                queue.popleft()
                actions.append(Start(job=job.id, option=option, nodes=nodes))
                for n in nodes:
                    free[n] -= option.gpus_per_node
        return actions


@register_policy("optimal")
class OptimalPolicy(_Base):
    """The offline CP-SAT schedule, replayed (module docstring). ``max_jobs`` bounds where it is tried."""

    name = "optimal"

    def __init__(self, time_limit_s: float = 60.0, workers: int = 2, seed: int = 0, max_jobs: int = 60) -> None:
        super().__init__()
        self.solver = CpSatSolver(time_limit_s=time_limit_s, workers=workers, seed=seed)
        self.max_jobs = max_jobs
        self.plan: dict[str, tuple[float, Option, tuple[int, ...]]] = {}
        self.status = ""
        self.bound: float | None = None
        self._solved = False

    def attach(self, sim: Simulator) -> None:
        super().attach(sim)
        if sim.failures is not None:
            raise SimulationError("optimal: an offline schedule cannot replay failures; run it without them")
        if len(sim.jobs) > self.max_jobs:
            raise SimulationError(
                f"optimal: {len(sim.jobs)} jobs exceed max_jobs={self.max_jobs}, beyond what CP-SAT solves here "
                "(raise policies.optimal.max_jobs to try)"
            )

    def _solve(self) -> None:
        assert self.sim is not None
        problem_jobs = []
        originals: dict[str, dict[int, Option]] = {}
        for state in self.sim.jobs.values():
            job = state.job
            scaled = tuple(replace(o, duration_s=float(math.ceil(job.step_s(o) * job.steps))) for o in job.options)
            originals[job.id] = {id(s): o for s, o in zip(scaled, job.options, strict=True)}
            problem_jobs.append(ProblemJob(id=job.id, arrival_s=job.arrival_s, weight=job.weight, options=scaled))
        schedule = self.solver.solve(SchedulingProblem(topology=self.sim.topology, jobs=tuple(problem_jobs)))
        self.status, self.bound = schedule.status, schedule.bound
        if not schedule.assignments:
            raise SimulationError(f"optimal: CP-SAT found no schedule ({schedule.status})")
        for a in schedule.assignments:
            self.plan[a.job] = (a.start_s, originals[a.job][id(a.option)], a.nodes)
            self.sim.wake_at(a.start_s)

    def decide(self, now: float) -> list[Action]:
        assert self.sim is not None
        if not self._solved:
            self._solve()
            self._solved = True
        actions: list[Action] = []
        free = list(self.sim.free)
        for job_id in [j for j, (start, _, _) in self.plan.items() if start <= now and j in self.sim.queue]:
            _, option, planned = self.plan[job_id]
            nodes = planned if self._fits(option, planned, free) else place(self.sim, option, free)
            if nodes is None:
                continue  # an earlier job still holds the GPUs (it ran longer than predicted): wait
            del self.plan[job_id]
            for n in nodes:
                free[n] -= option.gpus_per_node
            actions.append(Start(job=job_id, option=option, nodes=nodes))
        return actions

    def _fits(self, option: Option, nodes: tuple[int, ...], free: list[int]) -> bool:
        assert self.sim is not None
        full = [self.sim.topology.nodes[n].num_gpus for n in nodes]
        return all(
            self.sim.up[n] and free[n] >= option.gpus_per_node and (not option.whole_nodes or free[n] == size)
            for n, size in zip(nodes, full, strict=True)
        )
