"""The scheduling problem every solver gets: jobs with arrivals, weights and candidate plans, the cluster's
topology, its current occupancy; and the schedule a solver returns, with its checks and metrics.

A job's candidate plans (:class:`Option`) come from :func:`frenzy_opt.plans.enumerate_plans`: per GPU type,
the Pareto front of GPU count against predicted runtime among the plans the placement rule admits
(:meth:`frenzy_opt.topology.Topology.nodes_needed`), at most ``max_options_per_type`` of them spread from
the fewest GPUs to the fastest. Durations are the plans' ``est_runtime_s`` rounded up to whole seconds and
arrivals are rounded up to whole seconds too, so the exact solvers' integer time is the problem's own.

JCT of a job = end - arrival; the objective = sum of weight x JCT (contract 3).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from frenzy_opt.plans import Plan, enumerate_plans
from frenzy_opt.scenario import Scenario
from frenzy_opt.topology import Topology


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
        return self.num_gpus if self.whole_nodes == 0 else self.num_gpus // self.whole_nodes


@dataclass(frozen=True, slots=True, kw_only=True)
class ProblemJob:
    id: str
    arrival_s: float
    weight: float
    options: tuple[Option, ...]

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
    status: str
    assignments: tuple[Assignment, ...]
    solve_time_s: float
    bound: float | None = None


def options_for(plans: list[Plan], topology: Topology, max_options_per_type: int = 4) -> tuple[Option, ...]:
    """The candidate :class:`Option` set of one job (module docstring)."""
    by_type: dict[str, list[Plan]] = defaultdict(list)
    for plan in plans:
        if plan.est_runtime_s is not None and topology.nodes_needed(plan.gpu_type, plan.num_gpus) >= 0:
            by_type[plan.gpu_type].append(plan)
    options: list[Option] = []
    for gpu_type, candidates in by_type.items():
        fastest: dict[int, Plan] = {}
        for plan in candidates:
            best = fastest.get(plan.num_gpus)
            if best is None or (plan.est_runtime_s or 0) < (best.est_runtime_s or 0):
                fastest[plan.num_gpus] = plan
        front: list[Plan] = []
        for count in sorted(fastest):  # keep a plan only if it beats every plan with fewer GPUs
            if not front or (fastest[count].est_runtime_s or 0) < (front[-1].est_runtime_s or 0):
                front.append(fastest[count])
        if len(front) > max_options_per_type:
            step = (len(front) - 1) / (max_options_per_type - 1)
            front = [front[round(i * step)] for i in range(max_options_per_type)]
        for plan in front:
            options.append(
                Option(
                    gpu_type=gpu_type,
                    num_gpus=plan.num_gpus,
                    whole_nodes=topology.nodes_needed(gpu_type, plan.num_gpus),
                    duration_s=float(math.ceil(plan.est_runtime_s or 0.0)),
                    plan=plan,
                )
            )
    return tuple(options)


def build_problem(scenario: Scenario, *, max_options_per_type: int = 4) -> SchedulingProblem:
    """The problem of a scenario: every job's options on the scenario's cluster. ``ValueError`` names a job
    that fits nowhere."""
    topology = Topology(scenario.cluster)
    jobs = []
    for job in scenario.jobs:
        options = options_for(enumerate_plans(job.spec, scenario.cluster).plans, topology, max_options_per_type)
        if not options:
            raise ValueError(
                f"job {job.id}: no memory-feasible plan fits the placement rules of {scenario.cluster.name}"
            )
        jobs.append(
            ProblemJob(id=job.id, arrival_s=float(math.ceil(job.arrival_s)), weight=job.weight, options=options)
        )
    return SchedulingProblem(topology=topology, jobs=tuple(jobs))


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
