"""Greedy HAS, CP-SAT and the LP bound on random small problems: validity, optimality, bounds."""

from __future__ import annotations

import itertools
import math

import pytest
from factories import synthetic_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import (
    Option,
    ProblemJob,
    Schedule,
    SchedulingProblem,
    build_problem,
    check_schedule,
    objective,
)
from frenzy_opt.planning.scenario import load_scenario
from frenzy_opt.solvers import make_solver, solver_names
from frenzy_opt.solvers.lpbound import lp_lower_bound

GPU_TYPES = ("A100-SXM4-80GB", "V100-SXM2-32GB", "RTX-3090")


@st.composite
def problems(draw: st.DrawFn, max_jobs: int = 5) -> SchedulingProblem:
    types = draw(st.lists(st.sampled_from(GPU_TYPES), min_size=1, max_size=2, unique=True))
    groups = [
        {"gpu": t, "num_nodes": draw(st.integers(1, 2)), "gpus_per_node": draw(st.sampled_from([2, 4]))} for t in types
    ]
    topology = Topology(parse_cluster({"node_groups": groups}))
    jobs = []
    for j in range(draw(st.integers(1, max_jobs))):
        options = []
        for t in draw(st.lists(st.sampled_from(types), min_size=1, max_size=2, unique=True)):
            size = topology.nodes[topology.nodes_of(t)[0]].num_gpus
            counts = sorted({1, size} | ({2 * size} if len(topology.nodes_of(t)) > 1 else set()))
            base = draw(st.integers(1, 20)) * 100
            for n in draw(st.lists(st.sampled_from(counts), min_size=1, max_size=2, unique=True)):
                duration = float(math.ceil(base / n**0.8))
                options.append(
                    Option(
                        gpu_type=t,
                        num_gpus=n,
                        whole_nodes=topology.nodes_needed(t, n),
                        duration_s=duration,
                        plan=synthetic_plan(t, n),
                    )
                )
        jobs.append(
            ProblemJob(
                id=f"j{j}",
                arrival_s=float(draw(st.integers(0, 5)) * 100),
                weight=float(draw(st.sampled_from([1, 1, 2]))),
                options=tuple(options),
            )
        )
    return SchedulingProblem(topology=topology, jobs=tuple(jobs))


def _valid(problem: SchedulingProblem, schedule: Schedule) -> None:
    assert check_schedule(problem, schedule) == []
    for a in schedule.assignments:
        # Every chosen plan fits its GPU's memory; tensor-parallel (single-node) plans stay inside one node.
        assert a.option.plan.device_used_bytes <= lookup_gpu(a.option.gpu_type).memory_bytes
        if a.option.whole_nodes == 0:
            assert len(a.nodes) == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_greedy_and_cpsat_schedules_are_valid_and_cpsat_is_no_worse(problem: SchedulingProblem) -> None:
    greedy = make_solver("greedy").solve(problem)
    _valid(problem, greedy)
    exact = make_solver("cpsat", time_limit_s=20, workers=2, seed=0).solve(problem)
    assert exact.status in ("OPTIMAL", "FEASIBLE")
    _valid(problem, exact)
    assert objective(problem, exact) <= objective(problem, greedy) + 1e-6
    assert exact.bound is not None and exact.bound <= objective(problem, exact) + 1e-6


def _brute_force(problem: SchedulingProblem) -> float:
    """Serial schedule generation over every job order, option and node choice: the set of schedules it
    builds contains an optimal one for a regular objective such as weighted completion time (Kolisch 1996,
    active schedules)."""
    topology = problem.topology
    best = math.inf
    for order in itertools.permutations(problem.jobs):
        for options in itertools.product(*(job.options for job in order)):
            stack: list[tuple[int, float, list[tuple[int, float, float, int]]]] = [(0, 0.0, [])]
            while stack:
                depth, cost, placed = stack.pop()
                if cost >= best:
                    continue
                if depth == len(order):
                    best = cost
                    continue
                job, option = order[depth], options[depth]
                per_node = option.gpus_per_node
                nodes = topology.nodes_of(option.gpu_type)
                choices = itertools.combinations(nodes, option.whole_nodes or 1)
                for chosen in choices:
                    times = sorted({job.arrival_s} | {e for _, _, e, _ in placed if e > job.arrival_s})
                    for t in times:
                        end = t + option.duration_s
                        ok = all(
                            per_node + sum(g for m, s, e, g in placed if m == n and s < end and t < e)
                            <= topology.nodes[n].num_gpus
                            for n in chosen
                        )
                        if ok:
                            stack.append(
                                (
                                    depth + 1,
                                    cost + job.weight * (end - job.arrival_s),
                                    placed + [(n, t, end, per_node) for n in chosen],
                                )
                            )
                            break
    return best


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(max_jobs=3))
def test_cpsat_optimum_equals_brute_force_and_lp_bound_is_below(problem: SchedulingProblem) -> None:
    exact = make_solver("cpsat", time_limit_s=20, workers=2, seed=0).solve(problem)
    assert exact.status == "OPTIMAL"
    optimum = objective(problem, exact)
    assert optimum == pytest.approx(_brute_force(problem))
    bound = lp_lower_bound(problem, max_columns=4_000)
    assert bound is not None and bound <= optimum + 1e-6


def test_default_scenario_solves_to_optimality() -> None:
    problem = build_problem(load_scenario())
    greedy = make_solver("greedy").solve(problem)
    exact = make_solver("cpsat", time_limit_s=60).solve(problem)
    assert exact.status == "OPTIMAL"
    _valid(problem, greedy)
    _valid(problem, exact)
    assert exact.bound == pytest.approx(objective(problem, exact))
    assert objective(problem, exact) <= objective(problem, greedy)


def test_unknown_solver_lists_the_registered_ones() -> None:
    assert {"greedy", "cpsat", "lpbound"} <= set(solver_names())
    with pytest.raises(ValueError, match="allowed: cpsat, greedy, lpbound"):
        make_solver("gurobi")
