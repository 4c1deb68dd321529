"""Plots of simulator results (matplotlib, headless): JCT CDFs and GPU utilization over time (the Gantt chart is
:mod:`frenzy_opt.plots.gantt`). Each ``*_figure`` builds the figure, each ``plot_*`` writes it."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from numpy.typing import NDArray

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from frenzy_opt.plots.gantt import MAX_FIGURE_HEIGHT_IN, save
from frenzy_opt.simulation.simulator import SimResult

DEFAULT_POINTS = 400


def jct_cdf_figure(results: list[SimResult], title: str = "") -> Figure:
    """The empirical CDF of job completion time (hours, log x), one line per policy."""
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
    return fig


def plot_jct_cdf(results: list[SimResult], path: Path, title: str = "") -> Path:
    """Write :func:`jct_cdf_figure` to ``path`` (PNG)."""
    return save(jct_cdf_figure(results, title), path)


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


def utilization_figure(results: list[SimResult]) -> Figure:
    """One subplot per policy, each on its own time axis (hours), with the busy fraction of each GPU type."""
    if not results:
        raise ValueError("plot_utilization needs at least one result")
    height = min(MAX_FIGURE_HEIGHT_IN, max(3.0, 2.5 * len(results)))
    # each policy on its own time axis: a slow policy's long tail must not squeeze a fast one's run
    fig, axes = plt.subplots(len(results), 1, squeeze=False, figsize=(12, height))
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
    for ax in axes[:, 0]:
        ax.set_xlabel("time (h)")
    return fig


def plot_utilization(results: list[SimResult], path: Path) -> Path:
    """Write :func:`utilization_figure` to ``path`` (PNG)."""
    return save(utilization_figure(results), path)
