"""Exact offline scheduling with OR-Tools CP-SAT: the greedy's problem, solved to a proven optimum.

Model (after the flexible job-shop pattern of the OR-Tools examples): for each job an integer start and
end (whole seconds, ``start >= arrival``); a presence literal per (job, option) with exactly one per job
and ``end = start + duration`` under it; per (job, option, node) an optional fixed-size interval on that
node, present when the job runs its option there. An option inside one node takes exactly one node of its
GPU type; an option of k whole nodes takes exactly k nodes, each fully. A cumulative constraint per node
(capacity = its GPUs) makes every placement realisable, so the same placement rule binds both solvers.
Redundant energy constraints per GPU type (GPU-seconds used <= GPUs x (makespan - first arrival)) tighten
the bound. Objective: sum of weight x (end - arrival), weights scaled to integers.

The greedy schedule is given as a hint; time limit, workers and seed come from the caller (CLI flags).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from frenzy_opt.problem import Assignment, Schedule, SchedulingProblem
from frenzy_opt.solvers.base import register

WEIGHT_SCALE = 1000
STATUS = {
    cp_model.OPTIMAL: "OPTIMAL",
    cp_model.FEASIBLE: "FEASIBLE",
    cp_model.INFEASIBLE: "INFEASIBLE",
    cp_model.UNKNOWN: "UNKNOWN",
    cp_model.MODEL_INVALID: "UNKNOWN",
}


def _scaled(weight: float) -> int:
    """Integer objective weight (CP-SAT needs integer coefficients)."""
    return round(weight * WEIGHT_SCALE)


@dataclass
class _Vars:
    start: dict[str, cp_model.IntVar]
    end: dict[str, cp_model.IntVar]
    choose: dict[tuple[str, int], cp_model.IntVar]
    on_node: dict[tuple[str, int, int], cp_model.IntVar]


def build_model(problem: SchedulingProblem, hint: Schedule | None = None) -> tuple[cp_model.CpModel, _Vars]:
    """The CP-SAT model of ``problem`` (module docstring), with ``hint`` as a solution hint."""
    model = cp_model.CpModel()
    topology = problem.topology
    first = int(min(j.arrival_s for j in problem.jobs))
    horizon = int(
        max(j.arrival_s for j in problem.jobs) + sum(max(o.duration_s for o in j.options) for j in problem.jobs)
    )
    horizon = max(horizon, int(max((b.until_s for b in problem.busy), default=0)) + horizon)
    v = _Vars(start={}, end={}, choose={}, on_node={})
    node_intervals: dict[int, list[tuple[cp_model.IntervalVar, int]]] = {n.index: [] for n in topology.nodes}
    energy: dict[str, list[tuple[cp_model.IntVar, int]]] = {t: [] for t in topology.gpu_types}
    for job in problem.jobs:
        start = model.new_int_var(int(job.arrival_s), horizon, f"start[{job.id}]")
        end = model.new_int_var(int(job.arrival_s), horizon, f"end[{job.id}]")
        v.start[job.id], v.end[job.id] = start, end
        literals = []
        for k, option in enumerate(job.options):
            chosen = model.new_bool_var(f"choose[{job.id},{k}]")
            v.choose[job.id, k] = chosen
            literals.append(chosen)
            duration = int(option.duration_s)
            model.add(end == start + duration).only_enforce_if(chosen)
            nodes = [
                n
                for n in topology.nodes_of(option.gpu_type)
                if topology.nodes[n].num_gpus >= option.num_gpus or option.whole_nodes
            ]
            per_node = option.gpus_per_node
            placed = []
            for n in nodes:
                here = model.new_bool_var(f"on[{job.id},{k},{n}]")
                v.on_node[job.id, k, n] = here
                placed.append(here)
                interval = model.new_optional_fixed_size_interval_var(start, duration, here, f"run[{job.id},{k},{n}]")
                node_intervals[n].append((interval, per_node))
            model.add(sum(placed) == (option.whole_nodes or 1) * chosen)
            energy[option.gpu_type].append((chosen, option.num_gpus * duration))
        model.add_exactly_one(literals)
    for busy in problem.busy:
        interval = model.new_fixed_size_interval_var(0, int(busy.until_s), f"busy[{busy.node}]")
        node_intervals[busy.node].append((interval, busy.num_gpus))
    for n, on_node in node_intervals.items():
        if on_node:
            model.add_cumulative([i for i, _ in on_node], [d for _, d in on_node], topology.nodes[n].num_gpus)
    makespan = model.new_int_var(first, horizon, "makespan")
    model.add_max_equality(makespan, list(v.end.values()))
    for gpu_type, work in energy.items():
        if work:
            capacity = topology.num_gpus_of(gpu_type)
            model.add(
                cp_model.LinearExpr.weighted_sum([lit for lit, _ in work], [w for _, w in work])
                <= capacity * (makespan - first)
            )
    weights = [_scaled(job.weight) for job in problem.jobs]
    model.minimize(cp_model.LinearExpr.weighted_sum([v.end[job.id] for job in problem.jobs], weights))
    if hint is not None:
        _add_hint(model, v, problem, hint)
    return model, v


def _add_hint(model: cp_model.CpModel, v: _Vars, problem: SchedulingProblem, hint: Schedule) -> None:
    by_job = {a.job: a for a in hint.assignments}
    for job in problem.jobs:
        a = by_job.get(job.id)
        if a is None:
            continue
        model.add_hint(v.start[job.id], int(a.start_s))
        model.add_hint(v.end[job.id], int(a.end_s))
        for k, option in enumerate(job.options):
            model.add_hint(v.choose[job.id, k], option == a.option)
            for n in problem.topology.nodes_of(option.gpu_type):
                if (job.id, k, n) in v.on_node:
                    model.add_hint(v.on_node[job.id, k, n], option == a.option and n in a.nodes)


@register("cpsat")
class CpSatSolver:
    """CP-SAT on :func:`build_model`; the greedy schedule as hint unless ``hint=False``."""

    name = "cpsat"

    def __init__(
        self, *, time_limit_s: float = 30.0, workers: int = 2, seed: int = 0, hint: bool = True, **_: object
    ) -> None:
        self.time_limit_s, self.workers, self.seed, self.use_hint = time_limit_s, workers, seed, hint

    def solve(self, problem: SchedulingProblem) -> Schedule:
        from frenzy_opt.solvers.greedy import GreedyHAS

        begin = time.perf_counter()
        hint = GreedyHAS().solve(problem) if self.use_hint else None
        model, v = build_model(problem, hint)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = self.time_limit_s
        solver.parameters.num_workers = self.workers
        solver.parameters.random_seed = self.seed
        code = solver.solve(model)
        status = STATUS.get(code, "UNKNOWN")
        assignments: list[Assignment] = []
        bound = None
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            for job in problem.jobs:
                k = next(k for k in range(len(job.options)) if solver.value(v.choose[job.id, k]))
                option = job.options[k]
                nodes = tuple(
                    n
                    for n in problem.topology.nodes_of(option.gpu_type)
                    if (job.id, k, n) in v.on_node and solver.value(v.on_node[job.id, k, n])
                )
                start = float(solver.value(v.start[job.id]))
                assignments.append(
                    Assignment(job=job.id, option=option, nodes=nodes, start_s=start, end_s=start + option.duration_s)
                )
            offset = sum(_scaled(j.weight) * int(j.arrival_s) for j in problem.jobs)
            bound = (solver.best_objective_bound - offset) / WEIGHT_SCALE
        return Schedule(
            solver=self.name,
            status=status,
            assignments=tuple(assignments),
            solve_time_s=time.perf_counter() - begin,
            bound=bound,
        )
