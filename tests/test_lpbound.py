"""The time-indexed LP bound (solvers/lpbound.py): its slot grid, and bounds that are exact where the optimum is
known by hand (a rounding or a capacity row gone wrong moves them)."""

from __future__ import annotations

import itertools

import pytest
from factories import synthetic_plan

from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import Option, ProblemJob, SchedulingProblem
from frenzy_opt.solvers.lpbound import GROWTH, grid, time_indexed_bound


def _problem(jobs: list[tuple[float, float, list[tuple[int, float]]]]) -> SchedulingProblem:
    """One 8-GPU A100 node; jobs as (arrival, weight, [(GPUs, duration)])."""
    topology = Topology(parse_cluster({"node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 1, "gpus_per_node": 8}]}))
    return SchedulingProblem(
        topology=topology,
        jobs=tuple(
            ProblemJob(
                id=f"j{i}",
                arrival_s=arrival,
                weight=weight,
                options=tuple(
                    Option(
                        gpu_type="A100-SXM4-80GB",
                        num_gpus=n,
                        whole_nodes=topology.nodes_needed("A100-SXM4-80GB", n),
                        duration_s=d,
                        plan=synthetic_plan("A100-SXM4-80GB", n),
                    )
                    for n, d in options
                ),
            )
            for i, (arrival, weight, options) in enumerate(jobs)
        ),
    )


def test_grid_is_dense_then_grows() -> None:
    bounds = grid(0.0, 100.0, 1_000.0, 10.0)
    assert bounds[:11] == [10.0 * i for i in range(11)]
    lengths = [b - a for a, b in itertools.pairwise(bounds[10:])]
    assert all(later == pytest.approx(GROWTH * earlier) for earlier, later in itertools.pairwise(lengths))
    assert bounds[-1] >= 1_000.0 > bounds[-2]


def test_one_job_is_bounded_by_its_fastest_run() -> None:
    problem = _problem([(0.0, 2.0, [(4, 1_000.0), (8, 600.0)])])
    bound = time_indexed_bound(problem)
    assert bound.objective == pytest.approx(2.0 * 600.0, rel=1e-5)


def test_jobs_that_cannot_share_the_node_wait_for_each_other() -> None:
    # Two jobs that each need the whole node for 1,000 s: the optimum runs them one after the other (1,000 + 2,000).
    # Without the capacity rows the bound would be 2,000; a time-indexed LP reaches 3,000 here (half of each job
    # at 0 and half at 1,000 cost the same), short of it only by a slot's rounding.
    problem = _problem([(0.0, 1.0, [(8, 1_000.0)]), (0.0, 1.0, [(8, 1_000.0)])])
    bound = time_indexed_bound(problem)
    assert bound.objective is not None
    assert 0.95 * 3_000.0 <= bound.objective <= 3_000.0


def test_a_late_arrival_counts_from_its_arrival() -> None:
    # The second job arrives when the first ends: nothing overlaps, each pays its own run.
    problem = _problem([(0.0, 1.0, [(8, 1_000.0)]), (1_000.0, 1.0, [(8, 500.0)])])
    bound = time_indexed_bound(problem)
    assert bound.objective == pytest.approx(1_500.0, rel=1e-5)
