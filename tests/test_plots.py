"""Plots: exact utilization series, and what each figure shows (lines, subplots, bars, colours, legends, axes)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import Schedule, build_problem
from frenzy_opt.planning.scenario import load_scenario
from frenzy_opt.plots.gantt import (
    MAX_FIGURE_HEIGHT_IN,
    Bar,
    gantt_figure,
    job_colours,
    plot_schedule,
    plot_sim_gantt,
    result_bars,
    schedule_figure,
)
from frenzy_opt.plots.simplot import (
    jct_cdf_figure,
    plot_jct_cdf,
    plot_utilization,
    utilization_figure,
    utilization_series,
)
from frenzy_opt.simulation.simulator import Segment, SimJob, SimJobState, SimResult, sim_jobs
from frenzy_opt.solvers.base import make_solver

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
    jobs: dict[str, SimJobState] = {}
    for seg in segments:
        if seg.job not in jobs:
            jobs[seg.job] = SimJobState(job=replace(template, id=seg.job, arrival_s=arrival_s), remaining=0.0)
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


def _legend(fig: Figure) -> dict[str, tuple[float, ...]]:
    """Legend label -> face colour of the figure's single axes."""
    legend = fig.axes[0].get_legend()
    if legend is None:
        return {}
    return {
        text.get_text(): tuple(handle.get_facecolor())
        for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=True)
    }


def _bars(fig: Figure) -> PolyCollection:
    (collection,) = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    return collection


def test_jct_cdf_has_one_line_per_policy(real: tuple[list[SimJob], Topology], tmp_path: Path) -> None:
    results = _two_results(real)
    fig = jct_cdf_figure(results, title="t")
    (ax,) = fig.axes
    assert len(ax.get_lines()) == 2
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert [label.split()[0] for label in labels] == ["fifo", "frenzy"]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "job completion time (h)" and ax.get_title() == "t"
    # The CDF of each policy ends at 1 at its longest job (hours).
    for line, result in zip(ax.get_lines(), results, strict=True):
        assert line.get_ydata()[-1] == 1.0
        assert line.get_xdata()[-1] == pytest.approx(max(result.jct()) / 3600)
    path = plot_jct_cdf(results, tmp_path / "nested" / "jct.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_utilization_has_a_subplot_per_policy_and_a_line_per_gpu_type(real: tuple[list[SimJob], Topology]) -> None:
    results = _two_results(real)
    fig = utilization_figure(results)
    assert [ax.get_title() for ax in fig.axes] == ["fifo", "frenzy"]
    types = real[1].gpu_types
    for ax in fig.axes:
        assert len(ax.get_lines()) == len(types)
        assert [t.get_text().split()[0] for t in ax.get_legend().get_texts()] == list(types)
        assert max(max(line.get_ydata()) for line in ax.get_lines()) <= 1.0
    assert not fig.axes[0].get_shared_x_axes().joined(fig.axes[0], fig.axes[1])  # one time axis per policy
    assert len(utilization_figure(results[:1]).axes) == 1
    with pytest.raises(ValueError):
        utilization_figure([])


def test_gantt_draws_one_rectangle_per_contiguous_gpu_run(real: tuple[list[SimJob], Topology]) -> None:
    result = _two_results(real)[0]
    topology = real[1]
    fig = gantt_figure(result_bars(result), topology, "fifo")
    # j1 on two nodes (one run each), j2 twice, j3 once (next to j2 on node 0), j4 on two nodes.
    assert len(_bars(fig).get_paths()) == 2 + 1 + 1 + 1 + 2
    ax = fig.axes[0]
    assert ax.get_ylim() == (0.0, float(sum(n.num_gpus for n in topology.nodes)))
    assert ax.get_ylabel() == "GPUs (grouped by node)"
    assert [t.get_text().split("\n")[0] for t in ax.get_yticklabels()] == list(topology.gpu_types)
    assert list(_legend(fig)) == ["j1", "j2", "j3", "j4"]
    # j2 and j3 share node 0 from 1 h: the second takes the GPUs the first left free (rows 2-5, not 0-1).
    rows = sorted(
        (p.vertices[:, 1].min(), p.vertices[:, 1].max())
        for p in _bars(fig).get_paths()
        if p.vertices[:, 0].min() == pytest.approx(1.0)
    )
    assert rows == [(0.0, 2.0), (2.0, 6.0)]


def test_gantt_keeps_a_jobs_colour_across_solvers() -> None:
    problem = build_problem(load_scenario())
    greedy = make_solver("greedy").solve(problem)
    # The same jobs started in the reverse order: colours follow the jobs, not the start order.
    shifted = Schedule(
        solver="other",
        status=greedy.status,
        solve_time_s=0.0,
        assignments=tuple(
            replace(a, start_s=a.start_s + 10.0 * rank, end_s=a.end_s + 10.0 * rank)
            for rank, a in enumerate(reversed(greedy.assignments))
        ),
    )
    first, second = _legend(schedule_figure(problem, greedy)), _legend(schedule_figure(problem, shifted))
    assert first == second and len(first) == len(problem.jobs) <= 20
    assert len(set(first.values())) == len(first)
    assert first == {job: tuple(colour) for job, colour in job_colours(j.id for j in problem.jobs).items()}


def test_gantt_of_2048_gpus_has_two_nodes_per_row_and_no_legend(
    real: tuple[list[SimJob], Topology], tmp_path: Path
) -> None:
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
    bars = [Bar(f"j{i}", (i % 128 + (0 if i % 2 else 128),), 4, 100.0 * i, 100.0 * i + 5000) for i in range(300)]
    fig = gantt_figure(bars, topology, "p", max_bars=200)
    ax = fig.axes[0]
    assert sum(n.num_gpus for n in topology.nodes) == 2048
    assert ax.get_ylim() == (0.0, 128.0) and ax.get_ylabel() == "2 nodes per row"
    heights = {round(p.vertices[:, 1].max() - p.vertices[:, 1].min(), 6) for p in _bars(fig).get_paths()}
    assert heights == {0.25}  # four of a node's eight GPUs, two nodes a row: a quarter of a row
    assert fig.get_size_inches()[1] <= MAX_FIGURE_HEIGHT_IN
    assert len(_bars(fig).get_paths()) == 200 and ax.get_legend() is None
    assert "only the first 200 of 300" in ax.get_title()
    segments = [_seg(b.job, a100 if b.nodes[0] < 128 else v100, b.nodes, b.per_node, b.start_s, b.end_s) for b in bars]
    per_type = {t: topology.num_gpus_of(t) for t in topology.gpu_types}
    segments_result = _result(real[0][0], "p", segments, per_type)
    path = plot_sim_gantt(segments_result, topology, tmp_path / "g.png", max_segments=50)
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert plot_utilization([segments_result], tmp_path / "u.png").read_bytes()[:8] == PNG_MAGIC


def test_a_32_node_gantt_is_readable_labels_fit_and_types_name_their_own_block() -> None:
    """A mixed 32-node cluster (256 GPUs): the figure stays under the height cap, no two job labels overlap and
    each sits inside its box, and each type's label is at the middle of its own block."""
    groups = [("H100-SXM5-80GB", 8), ("A100-SXM4-40GB", 8), ("V100-SXM2-32GB", 8), ("L40S", 8)]
    topology = Topology(
        parse_cluster(
            {"node_groups": [{"gpu": g, "num_nodes": n, "gpus_per_node": 8} for g, n in groups],
             "network": {"inter_node_gbps": 200}}
        )
    )  # fmt: skip
    rng = random.Random(3)
    bars = [
        Bar(f"job-{i}", (rng.randrange(32),), rng.choice([1, 2, 4, 8]), s, s + rng.uniform(300, 40_000))
        for i, s in enumerate(sorted(rng.uniform(0, 80_000) for _ in range(150)))
    ]
    fig = gantt_figure(bars, topology, "frenzy")
    width, height = fig.get_size_inches() * 120
    assert height <= MAX_FIGURE_HEIGHT_IN * 120 and width <= 12 * 120
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text().startswith("job-")]
    assert labels  # the longer bars are labelled
    boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)
    # every label lies inside a box of its own job's colour
    patches = _bars(fig)
    colours = job_colours(b.job for b in bars)
    for text, box in zip(labels, boxes, strict=True):
        inside = [
            p.get_extents().transformed(ax.transData)
            for p, face in zip(patches.get_paths(), patches.get_facecolors(), strict=True)
            if tuple(face) == tuple(colours[text.get_text()])
        ]
        assert any(c.x0 <= box.x0 and box.x1 <= c.x1 and c.y0 <= box.y0 and box.y1 <= c.y1 for c in inside)
    # type labels at the middle of their blocks, in cluster order (blocks of 8 nodes = 8 rows of 8 GPUs)
    ticks = [(t.get_position()[1], t.get_text().split("\n")[0]) for t in ax.get_yticklabels()]
    assert ticks == [(4.0 + 8 * k, g) for k, (g, _) in enumerate(groups)]


def test_plot_schedule_writes_a_png(tmp_path: Path) -> None:
    problem = build_problem(load_scenario())
    path = plot_schedule(problem, make_solver("greedy").solve(problem), tmp_path / "a" / "gantt.png")
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000
