"""Plots of simulator results: exact utilization series and PNGs written by every plot function."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.scenario import load_scenario
from frenzy_opt.plots.simplot import plot_jct_cdf, plot_sim_gantt, plot_utilization, utilization_series
from frenzy_opt.simulation.simulator import JobState, Segment, SimJob, SimResult, sim_jobs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def real() -> tuple[list[SimJob], Topology]:
    return sim_jobs(load_scenario())


def _seg(job: str, gpu_type: str, nodes: tuple[int, ...], per_node: int, start: float, end: float) -> Segment:
    return Segment(
        job=job, gpu_type=gpu_type, nodes=nodes, per_node=per_node, start_s=start, end_s=end, restart_s=0.0, step_s=1.0
    )


def _result(
    template: SimJob, policy: str, segments: list[Segment], gpus_per_type: dict[str, int], arrival_s: float = 0.0
) -> SimResult:
    jobs: dict[str, JobState] = {}
    for seg in segments:
        if seg.job not in jobs:
            jobs[seg.job] = JobState(job=replace(template, id=seg.job, arrival_s=arrival_s), remaining=0.0)
        state = jobs[seg.job]
        state.segments.append(seg)
        state.status = "done"
        state.end_s = max(state.end_s or 0.0, seg.end_s)
    return SimResult(
        policy=policy,
        jobs=jobs,
        decision_s=[],
        total_gpus=sum(gpus_per_type.values()),
        gpus_per_type=gpus_per_type,
        wall_s=0.0,
    )


def _is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 100 and path.read_bytes()[:8] == PNG_MAGIC


def test_utilization_exact_fractions(real: tuple[list[SimJob], Topology]) -> None:
    segments = [_seg("a", "A", (0,), 2, 0.0, 50.0), _seg("b", "B", (1,), 4, 0.0, 100.0)]
    times, fractions = utilization_series(_result(real[0][0], "p", segments, {"A": 8, "B": 4, "C": 4}), step_s=10.0)
    assert times == [10.0 * i for i in range(11)]
    assert set(fractions) == {"A", "B", "C"}
    assert fractions["A"] == [0.25] * 5 + [0.0] * 6
    assert fractions["B"] == [1.0] * 10 + [0.0]
    assert fractions["C"] == [0.0] * 11


def test_utilization_overlaps_never_exceed_one(real: tuple[list[SimJob], Topology]) -> None:
    segments = [
        _seg("a", "A", (0,), 2, 0.0, 60.0),
        _seg("b", "A", (0,), 6, 30.0, 90.0),
        _seg("a", "A", (1,), 8, 60.0, 120.0),
    ]
    times, fractions = utilization_series(_result(real[0][0], "p", segments, {"A": 16}), step_s=15.0)
    assert times == [15.0 * i for i in range(9)]
    assert fractions["A"] == [2 / 16, 2 / 16, 1 / 2, 1 / 2, 14 / 16, 14 / 16, 1 / 2, 1 / 2, 0.0]
    assert max(fractions["A"]) <= 1.0


def test_utilization_default_grid_matches_brute_force(real: tuple[list[SimJob], Topology]) -> None:
    rng = random.Random(0)
    segments = []
    for i in range(2000):
        start = rng.uniform(0, 1e5)
        gpu_type = rng.choice(["A", "B"])
        segments.append(_seg(f"j{i}", gpu_type, (0,), rng.choice([1, 2, 4]), start, start + rng.uniform(0, 1e4)))
    per_type = {"A": 4000, "B": 4000}
    times, fractions = utilization_series(_result(real[0][0], "p", segments, per_type))
    assert len(times) == 400
    assert times[0] == 0.0 and times[-1] == pytest.approx(max(s.end_s for s in segments))
    for i in range(0, 400, 37):
        t = times[i]
        for gpu_type, total in per_type.items():
            busy = sum(s.num_gpus for s in segments if s.gpu_type == gpu_type and s.start_s <= t < s.end_s)
            assert fractions[gpu_type][i] == pytest.approx(busy / total)
    assert all(0.0 <= f <= 1.0 for series in fractions.values() for f in series)


def test_utilization_empty_result(real: tuple[list[SimJob], Topology]) -> None:
    times, fractions = utilization_series(_result(real[0][0], "p", [], {"A": 8}))
    assert times == [0.0] and fractions == {"A": [0.0]}
    with pytest.raises(ValueError):
        utilization_series(_result(real[0][0], "p", [], {"A": 8}), step_s=0.0)


def _two_results(real: tuple[list[SimJob], Topology]) -> list[SimResult]:
    jobs, topology = real
    per_type = {t: topology.num_gpus_of(t) for t in topology.gpu_types}
    a100, v100, rtx = topology.gpu_types
    first = [
        _seg("j1", a100, (0, 1), 8, 0.0, 3600.0),
        _seg("j2", a100, (0,), 2, 3600.0, 9000.0),
        _seg("j3", a100, (0,), 4, 3600.0, 7200.0),
        _seg("j2", v100, (2,), 2, 9000.0, 12000.0),
        _seg("j4", rtx, (4, 5), 4, 100.0, 20000.0),
    ]
    second = [_seg("j1", v100, (2, 3), 8, 0.0, 7200.0), _seg("j2", rtx, (6,), 2, 0.0, 30000.0)]
    return [_result(jobs[0], "fifo", first, per_type), _result(jobs[0], "frenzy", second, per_type)]


def test_plot_jct_cdf_and_utilization_write_pngs(real: tuple[list[SimJob], Topology], tmp_path: Path) -> None:
    results = _two_results(real)
    cdf = plot_jct_cdf(results, tmp_path / "nested" / "jct.png", title="test")
    assert cdf == tmp_path / "nested" / "jct.png" and _is_png(cdf)
    util = plot_utilization(results, tmp_path / "util" / "u.png")
    assert _is_png(util)
    assert _is_png(plot_utilization(results[:1], tmp_path / "one.png"))


def test_plot_sim_gantt_writes_png_and_truncates(real: tuple[list[SimJob], Topology], tmp_path: Path) -> None:
    result = _two_results(real)[0]
    topology = real[1]
    assert _is_png(plot_sim_gantt(result, topology, tmp_path / "g" / "gantt.png"))
    assert _is_png(plot_sim_gantt(result, topology, tmp_path / "truncated.png", max_segments=2))


def test_plot_sim_gantt_large_cluster(real: tuple[list[SimJob], Topology], tmp_path: Path) -> None:
    topology = Topology(
        parse_cluster(
            {
                "node_groups": [
                    {"gpu": "A100-SXM4-80GB", "num_nodes": 128, "gpus_per_node": 8, "intra_node": "nvlink"},
                    {"gpu": "V100-SXM2-32GB", "num_nodes": 128, "gpus_per_node": 8, "intra_node": "nvlink"},
                ],
                "network": {"inter_node_gbps": 200},
            }
        )
    )
    a100, v100 = topology.gpu_types
    segments = [
        _seg(f"j{i}", a100 if i % 2 else v100, (i % 128 + (0 if i % 2 else 128),), 8, 100.0 * i, 100.0 * i + 5000)
        for i in range(300)
    ]
    per_type = {t: topology.num_gpus_of(t) for t in topology.gpu_types}
    assert sum(per_type.values()) == 2048
    path = plot_sim_gantt(
        _result(real[0][0], "p", segments, per_type), topology, tmp_path / "big.png", max_segments=200
    )
    assert _is_png(path)
