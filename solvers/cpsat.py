"""Exact offline scheduling with OR-Tools CP-SAT: the greedy's problem, solved to a proven optimum.

Model (after the flexible job-shop pattern of the OR-Tools examples, ``flexible_job_shop_sat``). Time is
in whole seconds (durations and arrivals are whole seconds, :mod:`frenzy_opt.planning.problem`).

* Per job an integer start and end, ``start >= arrival``; a presence literal per (job, option), exactly one
  per job, and ``end = start + sum_k duration_k x choose_k`` (one linear equality, exact because exactly
  one literal is true, and visible to the LP relaxation, unlike one enforced equality per option).
* Per (job, option, node) an optional fixed-size interval on that node, present when the job runs its
  option there: an option inside one node takes exactly one node of its GPU type that is large enough,
  an option of k whole nodes takes exactly k nodes, each fully. A cumulative constraint per node
  (capacity = its GPUs; busy GPUs as fixed intervals from 0) makes every placement realisable, so the
  same placement rule binds both solvers. These constraints define the problem; the rest only prune.
* Objective: sum of weight x (end - arrival), weights scaled to integers (:data:`WEIGHT_SCALE`).

Redundant constraints (each removes no optimal schedule; each can be switched off in :class:`ModelConfig`
to measure it, and ``tests/test_cpsat.py`` checks the optimum does not move):

* ``pools``: one cumulative per GPU type over the (job, option) intervals, capacity = the type's GPUs,
  demand = the option's GPUs: the per-node cumulatives summed, a relaxation. At ``linearization_level``
  >= 2 CP-SAT adds cut generators for every cumulative (OR-Tools ``linear_relaxation.cc``: the
  ``kCumulative`` case calls ``AddCumulativeCutGenerator`` only when ``linearization_level > 1``), among
  them completion-time cuts that treat a task of demand k and duration d as a one-machine task of
  duration d x k / capacity (``scheduling_cuts.h``, ``CreateCumulativeCompletionTimeCutGenerator``),
  Queyranne's inequalities for sum w x C (Queyranne 1993, "Structure of a simple scheduling polyhedron",
  Math. Programming 58). On the per-node cumulatives those cuts see one node; on a pool, the whole type.
* ``energy``: per GPU type, GPU-seconds used <= the type's GPUs x (makespan - first arrival).
* ``symmetry``: nodes of one GPU type with the same GPU count and the same busy entries are
  interchangeable: relabelling them in any schedule gives a schedule of the same cost. Each such class
  is ordered by the first job (in the problem's job order) that uses a node: a job may use the m-th node of
  a class only if it or an earlier job uses node m - 1. Every schedule has a relabelling that obeys it
  (sort the class's nodes by their first user), so an optimum survives (lexicographic symmetry breaking
  of identical machines, Sherali & Smith 2001, "Improving discrete model representations via symmetry
  considerations", Management Science 47).
* ``hint_bounds``: the greedy schedule, when valid, costs U; an optimum costs at most U, so
  ``objective <= U`` and, since every other job i completes no earlier than ``arrival_i + fastest_i``,
  ``w_j (end_j - arrival_j - fastest_j) <= U - sum_i w_i (arrival_i + fastest_i)`` for each job j: a
  per-job deadline, and the horizon is the latest of them (standard upper-bound tightening of branch and
  bound; no optimum has a larger objective). Also ``end_j >= arrival_j + fastest_j`` always.

* ``grid_points``: the interval-indexed relaxation of Hall, Schulz, Shmoys & Wein 1997 ("Scheduling to
  minimize average completion time: off-line and on-line approximation algorithms", Math. of Operations
  Research 22, the LP over geometric intervals), with GPU-seconds for processing times and a GPU type's
  GPUs for the machines: at checkpoints T_1 < ... < T_L (geometric, :func:`checkpoints`) a Boolean
  ``done[j,k,T]`` = job j runs option k and ends by T (reified both ways, so it is determined by the
  schedule); per GPU type and T, the GPU-seconds of the jobs done by T <= its GPUs x (T - first arrival)
  minus the busy GPU-seconds in that window (work done by T was done in it); and
  ``end_j >= sum_i (T_i - T_i-1) x (1 - done_j by T_i)`` (a job not done by T_i ends after T_i). Valid for
  every schedule, so the optimum stays; its LP rows couple option choice and contention, which the
  per-job bounds ``end >= start + duration`` do not.

The greedy schedule is given as a complete hint (its nodes relabelled to obey ``symmetry``, every
``done`` literal and the makespan set from it), so the first solution is the greedy's; time limit,
workers, seed, linearization level and the full-problem worker (``max_lp``, :class:`CpSatSolver`) come
from the caller.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from frenzy_opt.core.enums import SolverStatus
from frenzy_opt.hardware.placement import can_host
from frenzy_opt.planning.problem import Assignment, Schedule, SchedulingProblem, check_schedule
from frenzy_opt.solvers.base import register

WEIGHT_SCALE = 1000
STATUS = {
    cp_model.OPTIMAL: SolverStatus.OPTIMAL,
    cp_model.FEASIBLE: SolverStatus.FEASIBLE,
    cp_model.INFEASIBLE: SolverStatus.INFEASIBLE,
    cp_model.UNKNOWN: SolverStatus.UNKNOWN,
    cp_model.MODEL_INVALID: SolverStatus.UNKNOWN,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Which redundant constraints :func:`build_model` adds (module docstring); all on by default."""

    pools: bool = True
    energy: bool = True
    symmetry: bool = True
    hint_bounds: bool = True
    grid_points: int = 36
    """Checkpoints of the interval-indexed completion relaxation (0: none; module docstring)."""


BASE = ModelConfig(pools=False, energy=True, symmetry=False, hint_bounds=False, grid_points=0)
"""The model as it was before the redundant constraints beyond ``energy`` (for measurements and tests)."""


def _scaled(weight: float) -> int:
    """Integer objective weight (CP-SAT needs integer coefficients)."""
    return round(weight * WEIGHT_SCALE)


@dataclass
class _Vars:
    start: dict[str, cp_model.IntVar]
    end: dict[str, cp_model.IntVar]
    choose: dict[tuple[str, int], cp_model.IntVar]
    on_node: dict[tuple[str, int, int], cp_model.IntVar]
    done: dict[tuple[str, int, int], cp_model.IntVar] = field(default_factory=dict)
    """(job, option, checkpoint) -> the job runs that option and ends by the checkpoint (``grid_points``)."""
    makespan: cp_model.IntVar | None = None


def node_classes(problem: SchedulingProblem) -> list[list[int]]:
    """Classes of interchangeable nodes (same GPU type, GPU count and busy entries), two or more each,
    every class in ascending node index."""
    busy: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for b in problem.busy:
        busy[b.node].append((b.num_gpus, b.until_s))
    classes: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for node in problem.topology.nodes:
        classes[node.gpu.name, node.num_gpus, tuple(sorted(busy[node.index]))].append(node.index)
    return [nodes for nodes in classes.values() if len(nodes) > 1]


def _valid_hint(problem: SchedulingProblem, hint: Schedule | None) -> Schedule | None:
    """``hint`` when it is a complete valid schedule in whole seconds (so its cost bounds the optimum)."""
    if hint is None or check_schedule(problem, hint):
        return None
    if any(a.start_s != int(a.start_s) for a in hint.assignments):
        return None
    return hint


def _deadlines(problem: SchedulingProblem, hint: Schedule | None) -> tuple[dict[str, int], int | None]:
    """Per-job latest end and the objective's upper bound (scaled, ``hint_bounds`` in the module docstring);
    without a valid hint a horizon long enough for any active schedule, and no bound."""
    jobs = problem.jobs
    if hint is None:
        horizon = int(max(j.arrival_s for j in jobs) + sum(max(o.duration_s for o in j.options) for j in jobs))
        horizon = max(horizon, int(max((b.until_s for b in problem.busy), default=0)) + horizon)
        return {j.id: horizon for j in jobs}, None
    by_job = {a.job: a for a in hint.assignments}
    upper = sum(_scaled(j.weight) * int(by_job[j.id].end_s) for j in jobs)
    slack = upper - sum(_scaled(j.weight) * int(j.arrival_s + j.fastest_s) for j in jobs)
    latest = max(int(a.end_s) for a in hint.assignments)
    deadline = {}
    for j in jobs:
        w = _scaled(j.weight)
        deadline[j.id] = int(j.arrival_s + j.fastest_s) + slack // w if w > 0 else latest + int(j.fastest_s)
    return deadline, upper


def build_model(
    problem: SchedulingProblem, hint: Schedule | None = None, config: ModelConfig = ModelConfig()
) -> tuple[cp_model.CpModel, _Vars]:
    """The CP-SAT model of ``problem`` (module docstring), with ``hint`` as a solution hint."""
    model = cp_model.CpModel()
    topology = problem.topology
    valid = _valid_hint(problem, hint)
    deadline, upper = _deadlines(problem, valid if config.hint_bounds else None)
    v = _Vars(start={}, end={}, choose={}, on_node={})
    node_intervals: dict[int, list[tuple[cp_model.IntervalVar, int]]] = {n.index: [] for n in topology.nodes}
    pool_intervals: dict[str, list[tuple[cp_model.IntervalVar, int]]] = {t: [] for t in topology.gpu_types}
    energy: dict[str, list[tuple[cp_model.IntVar, int]]] = {t: [] for t in topology.gpu_types}
    for job in problem.jobs:
        latest = deadline[job.id]
        start = model.new_int_var(int(job.arrival_s), latest - int(job.fastest_s), f"start[{job.id}]")
        end = model.new_int_var(int(job.arrival_s + job.fastest_s), latest, f"end[{job.id}]")
        v.start[job.id], v.end[job.id] = start, end
        literals = []
        for k, option in enumerate(job.options):
            chosen = model.new_bool_var(f"choose[{job.id},{k}]")
            v.choose[job.id, k] = chosen
            literals.append(chosen)
            duration = int(option.duration_s)
            if duration > latest - int(job.arrival_s):
                model.add(chosen == 0)
            nodes = [
                n
                for n in topology.nodes_of(option.gpu_type)
                if can_host(option, topology.nodes[n].num_gpus, topology.node_size(option.gpu_type))
            ]
            placed = []
            for n in nodes:
                here = model.new_bool_var(f"on[{job.id},{k},{n}]")
                v.on_node[job.id, k, n] = here
                placed.append(here)
                interval = model.new_optional_fixed_size_interval_var(start, duration, here, f"run[{job.id},{k},{n}]")
                node_intervals[n].append((interval, option.gpus_per_node))
            model.add(sum(placed) == (option.whole_nodes or 1) * chosen)
            if config.pools:
                interval = model.new_optional_fixed_size_interval_var(start, duration, chosen, f"pool[{job.id},{k}]")
                pool_intervals[option.gpu_type].append((interval, option.num_gpus))
            energy[option.gpu_type].append((chosen, option.num_gpus * duration))
        model.add_exactly_one(literals)
        durations = [int(o.duration_s) for o in job.options]
        model.add(end == start + cp_model.LinearExpr.weighted_sum(literals, durations))
    for busy in problem.busy:
        interval = model.new_fixed_size_interval_var(0, int(busy.until_s), f"busy[{busy.node}]")
        node_intervals[busy.node].append((interval, busy.num_gpus))
        if config.pools:
            pool_intervals[topology.nodes[busy.node].gpu.name].append((interval, busy.num_gpus))
    for n, on_node in node_intervals.items():
        if on_node:
            model.add_cumulative([i for i, _ in on_node], [d for _, d in on_node], topology.nodes[n].num_gpus)
    for gpu_type, in_pool in pool_intervals.items():
        if in_pool:
            model.add_cumulative([i for i, _ in in_pool], [d for _, d in in_pool], topology.num_gpus_of(gpu_type))
    if config.energy:
        _add_energy(model, problem, v, energy, max(deadline.values()))
    if config.symmetry:
        _add_symmetry(model, problem, v)
    if config.grid_points:
        _add_completion_grid(model, problem, v, checkpoints(problem, max(deadline.values()), config.grid_points))
    weights = [_scaled(job.weight) for job in problem.jobs]
    total = cp_model.LinearExpr.weighted_sum([v.end[job.id] for job in problem.jobs], weights)
    if upper is not None:
        model.add(total <= upper)
    model.minimize(total)
    if hint is not None:
        _add_hint(model, v, problem, canonical_nodes(problem, hint) if config.symmetry else hint)
    return model, v


def _add_energy(
    model: cp_model.CpModel,
    problem: SchedulingProblem,
    v: _Vars,
    energy: dict[str, list[tuple[cp_model.IntVar, int]]],
    horizon: int,
) -> None:
    """GPU-seconds per GPU type <= its GPUs x (makespan - first arrival) (module docstring)."""
    first = int(min(j.arrival_s for j in problem.jobs))
    makespan = v.makespan = model.new_int_var(first, horizon, "makespan")
    model.add_max_equality(makespan, list(v.end.values()))
    for gpu_type, work in energy.items():
        if work:
            capacity = problem.topology.num_gpus_of(gpu_type)
            used = cp_model.LinearExpr.weighted_sum([lit for lit, _ in work], [w for _, w in work])
            model.add(used <= capacity * (makespan - first))


def _add_symmetry(model: cp_model.CpModel, problem: SchedulingProblem, v: _Vars) -> None:
    """Node m of a class of interchangeable nodes is used by job j only if node m - 1 is used by job j or an
    earlier one (module docstring)."""
    for nodes in node_classes(problem):
        uses: dict[int, list[list[cp_model.IntVar]]] = {n: [] for n in nodes}
        for job in problem.jobs:
            for n in nodes:
                uses[n].append([lit for (j, _, m), lit in v.on_node.items() if j == job.id and m == n])
        for previous, current in itertools.pairwise(nodes):
            earlier: list[cp_model.IntVar] = []
            for j in range(len(problem.jobs)):
                earlier += uses[previous][j]
                if uses[current][j]:
                    model.add(sum(uses[current][j]) <= sum(earlier))


def checkpoints(problem: SchedulingProblem, horizon: int, num_points: int) -> list[int]:
    """``num_points`` times from the earliest possible completion to ``horizon``, geometrically spaced (the
    interval-indexed grid of Hall et al. 1997, there with ratio 2)."""
    first = int(min(j.arrival_s + j.fastest_s for j in problem.jobs))
    if horizon <= first or num_points < 2:
        return [horizon]
    ratio = (horizon / first) ** (1 / (num_points - 1))
    return sorted({min(horizon, round(first * ratio**i)) for i in range(num_points)})


def _add_completion_grid(model: cp_model.CpModel, problem: SchedulingProblem, v: _Vars, points: list[int]) -> None:
    """The interval-indexed completion relaxation (module docstring): ``done[j,k,T]`` = job j runs option k and
    ends by T; per GPU type and T the GPU-seconds of the jobs done by T fit in its GPUs x (T - first
    arrival) less the busy GPU-seconds; ``end_j >= sum_i (T_i - T_i-1) (1 - done_j by T_i)``."""
    topology = problem.topology
    first = int(min(j.arrival_s for j in problem.jobs))
    work: dict[tuple[str, int], list[tuple[cp_model.IntVar, int]]] = defaultdict(list)
    for job in problem.jobs:
        end, previous, steps = v.end[job.id], None, []
        for i, t in enumerate(points):
            done_by = []
            for k, option in enumerate(job.options):
                if job.arrival_s + option.duration_s > t:
                    continue
                done = model.new_bool_var(f"done[{job.id},{k},{t}]")
                v.done[job.id, k, t] = done
                chosen = v.choose[job.id, k]
                model.add_implication(done, chosen)
                model.add(end <= t).only_enforce_if(done)
                model.add(end >= t + 1).only_enforce_if([chosen, done.Not()])
                work[option.gpu_type, t].append((done, option.num_gpus * int(option.duration_s)))
                done_by.append(done)
            total = cp_model.LinearExpr.sum(done_by)
            if previous is not None:
                model.add(previous <= total)
            previous = total
            steps.append((t - (points[i - 1] if i else 0), total))
        model.add(end >= sum(width * (1 - total) for width, total in steps))
    for (gpu_type, t), terms in work.items():
        held = sum(
            b.num_gpus * max(0, min(int(b.until_s), t) - first)
            for b in problem.busy
            if topology.nodes[b.node].gpu.name == gpu_type
        )
        used = cp_model.LinearExpr.weighted_sum([d for d, _ in terms], [e for _, e in terms])
        model.add(used <= topology.num_gpus_of(gpu_type) * (t - first) - held)


def canonical_nodes(problem: SchedulingProblem, schedule: Schedule) -> Schedule:
    """``schedule`` with each class of interchangeable nodes relabelled in the order of their first user (the
    problem's job order): the same cost, and it obeys the ``symmetry`` constraints."""
    order = {job.id: i for i, job in enumerate(problem.jobs)}
    relabel: dict[int, int] = {}
    for nodes in node_classes(problem):
        first = {n: len(order) for n in nodes}
        for a in schedule.assignments:
            for n in a.nodes:
                if n in first:
                    first[n] = min(first[n], order[a.job])
        ranked = sorted(nodes, key=lambda n: (first[n], n))
        relabel.update(zip(ranked, nodes, strict=True))
    assignments = tuple(
        Assignment(
            job=a.job,
            option=a.option,
            nodes=tuple(relabel.get(n, n) for n in a.nodes),
            start_s=a.start_s,
            end_s=a.end_s,
        )
        for a in schedule.assignments
    )
    return Schedule(
        solver=schedule.solver,
        status=schedule.status,
        assignments=assignments,
        solve_time_s=schedule.solve_time_s,
        bound=schedule.bound,
    )


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
    jobs = {job.id: job for job in problem.jobs}
    for (job_id, k, t), done in v.done.items():
        a = by_job.get(job_id)
        model.add_hint(done, a is not None and a.option == jobs[job_id].options[k] and a.end_s <= t)
    if v.makespan is not None and len(by_job) == len(problem.jobs):
        model.add_hint(v.makespan, int(max(a.end_s for a in hint.assignments)))


def _extract(problem: SchedulingProblem, solver: cp_model.CpSolver, v: _Vars) -> tuple[Assignment, ...]:
    assignments = []
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
    return tuple(assignments)


@register("cpsat")
class CpSatSolver:
    """CP-SAT on :func:`build_model`; the greedy schedule as hint unless ``hint=False``.

    ``subsolvers`` names the full-problem workers (OR-Tools ``SatParameters.subsolvers``; with 2 workers
    CP-SAT runs one of them next to its LNS workers). The default ``max_lp`` is the worker at
    ``linearization_level`` 2, whose LP carries the scheduling cuts on ``pools`` and the ``grid_points``
    rows; the default portfolio's ``default_lp`` worker runs at level 1 whatever ``linearization_level``
    says (OR-Tools ``cp_model_search.cc``, ``GetNamedParameters``); ``linearization_level`` applies with
    1 worker. The effect of each choice is measured by ``benchmarks/scheduler_benchmarks.py cpsat``
    (``--model base`` for the model without the redundant constraints)."""

    name = "cpsat"

    def __init__(
        self,
        *,
        time_limit_s: float = 30.0,
        workers: int = 2,
        seed: int = 0,
        hint: bool = True,
        config: ModelConfig = ModelConfig(),
        linearization_level: int = 2,
        subsolvers: tuple[str, ...] = ("max_lp",),
        **_: object,
    ) -> None:
        self.time_limit_s, self.workers, self.seed, self.use_hint = time_limit_s, workers, seed, hint
        self.config, self.linearization_level, self.subsolvers = config, linearization_level, subsolvers

    def solve(self, problem: SchedulingProblem) -> Schedule:
        from frenzy_opt.solvers.greedy import GreedyHAS

        begin = time.perf_counter()
        hint = GreedyHAS().solve(problem) if self.use_hint else None
        model, v = build_model(problem, hint, self.config)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = self.time_limit_s
        solver.parameters.num_workers = self.workers
        solver.parameters.random_seed = self.seed
        solver.parameters.linearization_level = self.linearization_level
        solver.parameters.subsolvers.extend(self.subsolvers)
        code = solver.solve(model)
        assignments: tuple[Assignment, ...] = ()
        bound = None
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            assignments = _extract(problem, solver, v)
            offset = sum(_scaled(j.weight) * int(j.arrival_s) for j in problem.jobs)
            bound = (solver.best_objective_bound - offset) / WEIGHT_SCALE
        return Schedule(
            solver=self.name,
            status=STATUS.get(code, SolverStatus.UNKNOWN),
            assignments=assignments,
            solve_time_s=time.perf_counter() - begin,
            bound=bound,
        )
