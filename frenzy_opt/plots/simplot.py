"""Plots of simulator results (matplotlib, headless): JCT CDFs, GPU utilization over time, Gantt charts."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from numpy.typing import NDArray

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from frenzy_opt.hardware.topology import Topology
from frenzy_opt.simulation.simulator import Segment, SimResult

DEFAULT_POINTS = 400
MAX_FIGURE_HEIGHT_IN = 30.0


def _save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` (PNG), creating parent directories, and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_jct_cdf(results: list[SimResult], path: Path, title: str = "") -> Path:
    """Write the empirical CDF of job completion time (hours, log x) of each policy to ``path`` (PNG)."""
    fig, ax = plt.subplots(figsize=(8, 5))
    any_positive = False
    for result in results:
        hours = np.sort(np.asarray(result.jct(), dtype=float)) / 3600
        if hours.size == 0:
            ax.plot([], [], label=f"{result.policy} (no finished jobs)")
            continue
        any_positive = any_positive or bool((hours > 0).any())
        cdf = np.arange(1, hours.size + 1) / hours.size
        ax.step(hours, cdf, where="post", label=f"{result.policy} (mean {hours.mean():.2f} h)")
    if any_positive:
        ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title or "job completion time CDF")
    ax.grid(True, which="both", linewidth=0.3)
    if results:
        ax.legend(fontsize=8)
    return _save(fig, path)


def utilization_series(result: SimResult, step_s: float | None = None) -> tuple[list[float], dict[str, list[float]]]:
    """Times (s) on a regular grid from 0 to the last segment end, and per GPU type the fraction of its GPUs
    busy at each time (a segment holds its GPUs in ``[start_s, end_s)``); ~400 points unless ``step_s``."""
    if step_s is not None and step_s <= 0:
        raise ValueError(f"step_s must be positive, got {step_s}")
    starts: dict[str, list[float]] = {t: [] for t in result.gpus_per_type}
    ends: dict[str, list[float]] = {t: [] for t in result.gpus_per_type}
    counts: dict[str, list[int]] = {t: [] for t in result.gpus_per_type}
    horizon = 0.0
    for seg in result.segments():
        horizon = max(horizon, seg.end_s)
        if seg.gpu_type in counts and seg.end_s > seg.start_s:
            starts[seg.gpu_type].append(seg.start_s)
            ends[seg.gpu_type].append(seg.end_s)
            counts[seg.gpu_type].append(seg.num_gpus)
    grid: NDArray[np.float64]
    if step_s is None:
        grid = np.linspace(0.0, horizon, DEFAULT_POINTS) if horizon > 0 else np.zeros(1)
    else:
        grid = np.arange(int(horizon / step_s + 1e-9) + 1, dtype=np.float64) * step_s
    fractions: dict[str, list[float]] = {}
    for gpu_type, total in result.gpus_per_type.items():
        weights = np.asarray(counts[gpu_type], dtype=np.int64)
        held = _held_at(np.asarray(starts[gpu_type], dtype=np.float64), weights, grid)
        busy = held - _held_at(np.asarray(ends[gpu_type], dtype=np.float64), weights, grid)
        fractions[gpu_type] = (busy / max(total, 1)).tolist()
    times: list[float] = grid.tolist()
    return times, fractions


def _held_at(times: NDArray[np.float64], weights: NDArray[np.int64], grid: NDArray[np.float64]) -> NDArray[np.int64]:
    """For each grid time, the total weight of the events at or before it."""
    order = np.argsort(times, kind="stable")
    cumulative = np.concatenate(([0], np.cumsum(weights[order])))
    return cumulative[np.searchsorted(times[order], grid, side="right")]


def plot_utilization(results: list[SimResult], path: Path) -> Path:
    """Write one subplot per policy (shared x, hours) with the busy fraction of each GPU type over time."""
    if not results:
        raise ValueError("plot_utilization needs at least one result")
    height = min(MAX_FIGURE_HEIGHT_IN, max(3.0, 2.5 * len(results)))
    fig, axes = plt.subplots(len(results), 1, sharex=True, squeeze=False, figsize=(12, height))
    for ax, result in zip(axes[:, 0], results, strict=True):
        times, fractions = utilization_series(result)
        hours = np.asarray(times) / 3600
        for gpu_type, fraction in fractions.items():
            ax.step(
                hours,
                fraction,
                where="post",
                linewidth=0.8,
                label=f"{gpu_type} ({result.gpus_per_type[gpu_type]} GPUs)",
            )
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("busy fraction")
        ax.set_title(result.policy, fontsize=10)
        ax.grid(True, linewidth=0.3)
        if fractions:
            ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time (h)")
    return _save(fig, path)


def _runs(slots: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs ``(first, length)`` of sorted slot numbers."""
    runs: list[tuple[int, int]] = []
    for k in slots:
        if runs and runs[-1][0] + runs[-1][1] == k:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((k, 1))
    return runs


def plot_sim_gantt(result: SimResult, topology: Topology, path: Path, max_segments: int = 3000) -> Path:
    """Write a Gantt chart of ``result`` to ``path`` (PNG): GPUs stacked node by node, one colour per job;
    at most the first ``max_segments`` segments by start time."""
    rows, y = {}, 0
    for node in topology.nodes:
        rows[node.index] = y
        y += node.num_gpus
    total = y
    every = result.segments()
    segments: list[Segment] = every[:max_segments]
    cmap = plt.get_cmap("tab20")
    colours: dict[str, int] = {}
    free_at = {n.index: [0.0] * n.num_gpus for n in topology.nodes}
    verts: list[list[tuple[float, float]]] = []
    faces: list[tuple[float, float, float, float]] = []
    fig, ax = plt.subplots(figsize=(12, min(MAX_FIGURE_HEIGHT_IN, max(3.0, total * 0.12))))
    label = len(segments) <= 100
    for seg in segments:
        colour = cmap(colours.setdefault(seg.job, len(colours)) % 20)
        x0, x1 = seg.start_s / 3600, seg.end_s / 3600
        for index in seg.nodes:
            slots = [k for k, t in enumerate(free_at[index]) if t <= seg.start_s][: seg.per_node]
            for k in slots:
                free_at[index][k] = seg.end_s
            for first, length in _runs(slots):
                y0, y1 = rows[index] + first, rows[index] + first + length
                verts.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
                faces.append(colour)
            if label and slots:
                middle = rows[index] + (slots[0] + slots[-1] + 1) / 2
                ax.text((x0 + x1) / 2, middle, seg.job, ha="center", va="center", fontsize=6)
    ax.add_collection(PolyCollection(verts, facecolors=faces, edgecolors="none"))
    if len(topology.nodes) <= 256:
        for node in topology.nodes:
            ax.axhline(rows[node.index], color="grey", linewidth=0.3)
    ticks: list[int] = []
    names: list[str] = []
    for node in topology.nodes:
        if not names or names[-1] != node.gpu.name:
            ticks.append(rows[node.index])
            names.append(node.gpu.name)
            ax.axhline(rows[node.index], color="black", linewidth=0.8)
    ax.set_yticks(ticks)
    ax.set_yticklabels(names, fontsize=7, va="bottom")
    ax.set_ylim(0, max(total, 1))
    last_h = max((s.end_s for s in segments), default=0.0) / 3600
    ax.set_xlim(0, last_h if last_h > 0 else 1.0)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPUs (grouped by node)")
    if len(every) > len(segments):
        ax.set_title(f"{result.policy}: only the first {len(segments)} of {len(every)} segments (by start time) shown")
    else:
        ax.set_title(f"{result.policy}: {len(every)} segments of {len(colours)} jobs")
    return _save(fig, path)
