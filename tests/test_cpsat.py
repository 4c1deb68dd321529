"""The CP-SAT model's redundant constraints keep the optimum: on small random problems each of them (and all
together) gives the same proven objective as the model without them; symmetry breaking and the hint helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from factories import synthetic_plan

from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import Busy, Option, ProblemJob, Schedule, SchedulingProblem, check_schedule, objective
from frenzy_opt.solvers.cpsat import BASE, CpSatSolver, ModelConfig, canonical_nodes, checkpoints, node_classes
from frenzy_opt.solvers.greedy import GreedyHAS

pytestmark = pytest.mark.solver

# Two interchangeable A100 nodes and three interchangeable RTX-3090 nodes: symmetry breaking has work to do.
GROUPS = (("A100-SXM4-80GB", 2, 4), ("RTX-3090", 3, 2))


def random_problem(seed: int, num_jobs: int, *, busy: bool = False) -> SchedulingProblem:
    """``num_jobs`` jobs with 1-GPU, one-node and two-node options on :data:`GROUPS`; Poisson-ish arrivals
    for odd seeds; with ``busy`` the first node is held for a while."""
    rng = np.random.default_rng(seed)
    groups = [{"gpu": g, "num_nodes": n, "gpus_per_node": size} for g, n, size in GROUPS]
    topology = Topology(parse_cluster({"node_groups": groups}))
    jobs = []
    for j in range(num_jobs):
        options = []
        work = int(rng.integers(2, 20)) * 100
        for gpu_type, _, size in GROUPS:
            speed = 1.0 if gpu_type.startswith("A100") else 0.5
            for n in (1, size, 2 * size):
                duration = float(math.ceil(work / speed / n**0.8))
                whole = topology.nodes_needed(gpu_type, n)
                options.append(
                    Option(
                        gpu_type=gpu_type,
                        num_gpus=n,
                        whole_nodes=whole,
                        duration_s=duration,
                        plan=synthetic_plan(gpu_type, n),
                    )
                )
        arrival = 0.0 if seed % 2 == 0 else float(rng.integers(0, 4) * 100)
        weight = float(rng.choice([1.0, 1.0, 2.0]))
        jobs.append(ProblemJob(id=f"j{j}", arrival_s=arrival, weight=weight, options=tuple(options)))
    held = (Busy(node=0, num_gpus=2, until_s=300.0),) if busy else ()
    return SchedulingProblem(topology=topology, jobs=tuple(jobs), busy=held)


def _solve(problem: SchedulingProblem, config: ModelConfig, linearization_level: int = 2) -> Schedule:
    solver = CpSatSolver(time_limit_s=20, workers=2, seed=0, config=config, linearization_level=linearization_level)
    schedule = solver.solve(problem)
    assert schedule.status == "OPTIMAL"
    assert check_schedule(problem, schedule) == []
    return schedule


CONFIGS = {
    "pools": ModelConfig(pools=True, energy=True, symmetry=False, hint_bounds=False, grid_points=0),
    "symmetry": ModelConfig(pools=False, energy=True, symmetry=True, hint_bounds=False, grid_points=0),
    "hint_bounds": ModelConfig(pools=False, energy=True, symmetry=False, hint_bounds=True, grid_points=0),
    "grid": ModelConfig(pools=False, energy=False, symmetry=False, hint_bounds=False, grid_points=8),
    "all": ModelConfig(),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_redundant_constraints_keep_the_optimum_of_the_base_model(name: str, seed: int) -> None:
    problem = random_problem(seed, 4, busy=seed == 2)
    reference = objective(problem, _solve(problem, BASE, linearization_level=1))
    assert objective(problem, _solve(problem, CONFIGS[name])) == pytest.approx(reference)


def test_the_full_model_is_no_worse_than_the_greedy_and_its_bound_is_below() -> None:
    problem = random_problem(3, 6)
    exact = CpSatSolver(time_limit_s=10, workers=2, seed=0).solve(problem)
    assert exact.status in ("OPTIMAL", "FEASIBLE") and check_schedule(problem, exact) == []
    greedy = GreedyHAS().solve(problem)
    assert objective(problem, exact) <= objective(problem, greedy) + 1e-6
    assert exact.bound is not None and exact.bound <= objective(problem, exact) + 1e-6


def test_node_classes_group_identical_nodes_and_split_busy_ones() -> None:
    assert node_classes(random_problem(0, 1)) == [[0, 1], [2, 3, 4]]
    assert node_classes(random_problem(0, 1, busy=True)) == [[2, 3, 4]]


def test_canonical_nodes_orders_each_class_by_first_user_and_keeps_the_schedule_valid() -> None:
    problem = random_problem(4, 6)
    greedy = GreedyHAS().solve(problem)
    canonical = canonical_nodes(problem, greedy)
    assert check_schedule(problem, canonical) == []
    assert objective(problem, canonical) == pytest.approx(objective(problem, greedy))
    order = {job.id: i for i, job in enumerate(problem.jobs)}
    for nodes in node_classes(problem):
        first = [min((order[a.job] for a in canonical.assignments if n in a.nodes), default=math.inf) for n in nodes]
        assert first == sorted(first)


def test_an_invalid_hint_is_not_used_as_a_bound() -> None:
    problem = random_problem(0, 3)
    greedy = GreedyHAS().solve(problem)
    # Every job at time 0 on the same node: overbooked, and cheaper than any real schedule.
    crammed = Schedule(
        solver="test",
        status="FEASIBLE",
        assignments=tuple(
            type(a)(job=a.job, option=a.option, nodes=a.nodes, start_s=0.0, end_s=a.option.duration_s)
            for a in greedy.assignments
        ),
        solve_time_s=0.0,
    )
    from frenzy_opt.solvers.cpsat import _deadlines, _valid_hint

    if check_schedule(problem, crammed):
        assert _valid_hint(problem, crammed) is None
    _, upper = _deadlines(problem, _valid_hint(problem, greedy))
    assert upper is not None


def test_checkpoints_are_increasing_and_end_at_the_horizon() -> None:
    problem = random_problem(0, 5)
    points = checkpoints(problem, 10_000, 12)
    assert points == sorted(set(points)) and points[-1] == 10_000
    assert points[0] == int(min(j.arrival_s + j.fastest_s for j in problem.jobs))
