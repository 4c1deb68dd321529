"""Gantt charts (matplotlib, headless) of a solver's schedule or a simulation: one chart for both.

GPUs are stacked node by node on the y-axis, time in hours on the x-axis. A job keeps its colour across the
charts of one problem (the colour follows the job's rank among all job ids, not the order a solver started
them), so two solvers' charts compare at a glance; up to :data:`LEGEND_MAX_JOBS` jobs get a legend. Up to
:data:`GPU_ROWS_MAX` GPUs a row is a GPU, up to :data:`NODE_ROWS_MAX` nodes a row is a node (its GPUs split the
row), beyond that a row holds several nodes of one type, so a 2,048-GPU cluster of 8-GPU nodes is 128 rows and
the figure never exceeds :data:`MAX_FIGURE_HEIGHT_IN`. A job's id is written only inside a box it fits, so
labels never overlap; each GPU type is named at the middle of its block, with its GPU count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import Schedule, SchedulingProblem
from frenzy_opt.simulation.simulator import SimResult

PALETTE = "tab20"
PALETTE_SIZE = 20
LEGEND_MAX_JOBS = 20
GPU_ROWS_MAX = 64
"""Up to this many GPUs one row is a GPU; beyond, one row is a node (a node's GPUs split its row)."""
NODE_ROWS_MAX = 128
"""Beyond this many nodes one row holds several consecutive nodes of one type (each a slice of the row)."""
NODE_LINES_MAX = 128
ROW_HEIGHT_IN = 0.12
MAX_FIGURE_HEIGHT_IN = 16.0
"""Figures stay under 16 in (1,920 px at the 120 dpi of :func:`save`) whatever the cluster."""
FIGURE_WIDTH_IN = 12.0
LABEL_FONT_PT = 6.0
# A label is drawn only inside a bar it fits: its width estimated at 0.6 em per character, the usual average
# advance of a sans-serif font (DejaVu Sans digits and lower case: 0.55-0.64 em).
CHAR_WIDTH_EM = 0.6


@dataclass(frozen=True, slots=True)
class Bar:
    """A job on ``per_node`` GPUs of each of ``nodes`` from ``start_s`` to ``end_s``."""

    job: str
    nodes: tuple[int, ...]
    per_node: int
    start_s: float
    end_s: float


def job_colours(jobs: Iterable[str]) -> dict[str, tuple[float, float, float, float]]:
    """A colour per job id from its rank among the sorted ids (the palette repeats every 20 jobs)."""
    cmap = plt.get_cmap(PALETTE)
    return {job: cmap(rank % PALETTE_SIZE) for rank, job in enumerate(sorted(set(jobs)))}


def _nodes_per_row(topology: Topology) -> int:
    """How many nodes share one row: 1 up to :data:`NODE_ROWS_MAX` nodes, else enough to keep the rows under
    it (a row never mixes GPU types: a type's last row may hold fewer)."""
    return max(1, -(-len(topology.nodes) // NODE_ROWS_MAX))


def _rows(topology: Topology, per_gpu: bool) -> tuple[dict[int, float], dict[int, float], float]:
    """Each node's first row and the height of one of its GPUs; the total height in rows."""
    first: dict[int, float] = {}
    unit: dict[int, float] = {}
    share = 1 if per_gpu else _nodes_per_row(topology)
    y = 0.0
    for node in topology.nodes:
        first[node.index] = y
        unit[node.index] = 1.0 if per_gpu else 1.0 / (node.num_gpus * share)
        y += node.num_gpus * unit[node.index]
    return first, unit, y


def _runs(slots: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs ``(first, length)`` of sorted slot numbers."""
    runs: list[tuple[int, int]] = []
    for k in slots:
        if runs and runs[-1][0] + runs[-1][1] == k:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((k, 1))
    return runs


def gantt_figure(
    bars: Sequence[Bar],
    topology: Topology,
    title: str,
    *,
    jobs: Iterable[str] | None = None,
    max_bars: int = 3000,
) -> Figure:
    """The chart of the first ``max_bars`` bars by start time. ``jobs`` (default: the bars' jobs) fixes the
    colours, so charts of the same jobs share them. A job takes the lowest-numbered GPUs of a node that are
    free at its start; its id is written inside each of its boxes that the text fits (module docstring)."""
    ordered = sorted(bars, key=lambda b: (b.start_s, b.job))
    shown = ordered[:max_bars]
    colours = job_colours(jobs if jobs is not None else (b.job for b in ordered))
    per_gpu = sum(n.num_gpus for n in topology.nodes) <= GPU_ROWS_MAX
    first, unit, total = _rows(topology, per_gpu)
    free_at = {n.index: [0.0] * n.num_gpus for n in topology.nodes}
    verts: list[list[tuple[float, float]]] = []
    faces: list[tuple[float, float, float, float]] = []
    height_in = min(MAX_FIGURE_HEIGHT_IN, max(3.0, total * ROW_HEIGHT_IN + 1.5))
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH_IN, height_in))
    last_h = max((b.end_s for b in shown), default=0.0) / 3600
    span_h = last_h if last_h > 0 else 1.0
    # Inches per hour and per row of the plot area (matplotlib's default subplot box: 77.5 % x 77 %, less the
    # legend's column when there is one).
    drawn = sorted({b.job for b in shown})
    legend = 0 < len(drawn) <= LEGEND_MAX_JOBS
    x_in = FIGURE_WIDTH_IN * (0.62 if legend else 0.775) / span_h
    y_in = height_in * 0.77 / max(total, 1.0)
    text_h_in = LABEL_FONT_PT / 72.0
    for bar in shown:
        x0, x1 = bar.start_s / 3600, bar.end_s / 3600
        text_w_in = CHAR_WIDTH_EM * LABEL_FONT_PT / 72.0 * len(bar.job)
        wide = (x1 - x0) * x_in >= 1.2 * text_w_in
        for index in bar.nodes:
            slots = [k for k, t in enumerate(free_at[index]) if t <= bar.start_s][: bar.per_node]
            for k in slots:
                free_at[index][k] = bar.end_s
            for start, length in _runs(slots):
                y0 = first[index] + start * unit[index]
                y1 = y0 + length * unit[index]
                verts.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
                faces.append(colours[bar.job])
                if wide and (y1 - y0) * y_in >= 1.2 * text_h_in:
                    ax.text((x0 + x1) / 2, (y0 + y1) / 2, bar.job, ha="center", va="center", fontsize=LABEL_FONT_PT)
    ax.add_collection(PolyCollection(verts, facecolors=faces, edgecolors="none"))
    _axes(ax, topology, first, total, per_gpu)
    ax.set_xlim(0, span_h)
    if legend:
        handles = [Patch(facecolor=colours[job], label=job) for job in drawn]
        ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="job")
    if len(ordered) > len(shown):
        ax.set_title(f"{title}: only the first {len(shown)} of {len(ordered)} bars (by start time) shown")
    else:
        ax.set_title(f"{title}: {len(ordered)} bars of {len(drawn)} jobs")
    return fig


def _axes(ax: Axes, topology: Topology, first: dict[int, float], total: float, per_gpu: bool) -> None:
    """Node separators, a heavier line between GPU types and each type's name (and GPU count) at the middle of
    its block, labels and limits."""
    if len(topology.nodes) <= NODE_LINES_MAX:
        for node in topology.nodes:
            ax.axhline(first[node.index], color="grey", linewidth=0.3)
    blocks: list[tuple[str, float, int]] = []  # (type, first row, GPUs)
    for node in topology.nodes:
        if not blocks or blocks[-1][0] != node.gpu.name:
            blocks.append((node.gpu.name, first[node.index], 0))
            ax.axhline(first[node.index], color="black", linewidth=0.8)
        name, start, gpus = blocks[-1]
        blocks[-1] = (name, start, gpus + node.num_gpus)
    ends = [start for _, start, _ in blocks[1:]] + [total]
    ax.set_yticks([(start + end) / 2 for (_, start, _), end in zip(blocks, ends, strict=True)])
    ax.set_yticklabels([f"{name}\n({gpus} GPUs)" for name, _, gpus in blocks], fontsize=7, va="center")
    ax.set_ylim(0, max(total, 1.0))
    ax.set_xlabel("time (h)")
    if per_gpu:
        ax.set_ylabel("GPUs (grouped by node)")
    else:
        share = _nodes_per_row(topology)
        ax.set_ylabel("nodes (a node's GPUs split its row)" if share == 1 else f"{share} nodes per row")


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` (PNG), creating parent directories, and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def schedule_bars(schedule: Schedule) -> list[Bar]:
    return [
        Bar(job=a.job, nodes=a.nodes, per_node=a.option.gpus_per_node, start_s=a.start_s, end_s=a.end_s)
        for a in schedule.assignments
    ]


def schedule_figure(problem: SchedulingProblem, schedule: Schedule) -> Figure:
    """A solver's schedule, coloured by the problem's jobs (the same colours for every solver)."""
    return gantt_figure(
        schedule_bars(schedule),
        problem.topology,
        f"{schedule.solver} ({schedule.status})",
        jobs=[job.id for job in problem.jobs],
    )


def plot_schedule(problem: SchedulingProblem, schedule: Schedule, path: Path) -> Path:
    """Write :func:`schedule_figure` to ``path`` (PNG)."""
    return save(schedule_figure(problem, schedule), path)


def result_bars(result: SimResult) -> list[Bar]:
    return [
        Bar(job=s.job, nodes=s.nodes, per_node=s.per_node, start_s=s.start_s, end_s=s.end_s) for s in result.segments()
    ]


def plot_sim_gantt(result: SimResult, topology: Topology, path: Path, max_segments: int = 3000) -> Path:
    """Write the chart of a simulation's segments (at most the first ``max_segments``) to ``path`` (PNG),
    coloured by all of the simulation's jobs."""
    figure = gantt_figure(result_bars(result), topology, result.policy, jobs=result.jobs, max_bars=max_segments)
    return save(figure, path)
