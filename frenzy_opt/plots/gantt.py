"""Gantt charts of schedules (matplotlib, headless): GPUs on the y-axis, one colour per job."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from frenzy_opt.planning.problem import Schedule, SchedulingProblem


def gpu_rows(problem: SchedulingProblem) -> dict[int, int]:
    """First y-row of each node: GPUs are stacked node by node."""
    rows, y = {}, 0
    for node in problem.topology.nodes:
        rows[node.index] = y
        y += node.num_gpus
    return rows


def plot_schedule(problem: SchedulingProblem, schedule: Schedule, path: Path) -> Path:
    """Write a Gantt chart of ``schedule`` to ``path`` (PNG): each job a bar per GPU it holds."""
    rows = gpu_rows(problem)
    total = sum(n.num_gpus for n in problem.topology.nodes)
    fig, ax = plt.subplots(figsize=(12, max(3.0, total * 0.12)))
    cmap = plt.get_cmap("tab20")
    # When each GPU of each node is next free; a job takes the lowest-numbered GPUs free at its start.
    free_at = {n.index: [0.0] * n.num_gpus for n in problem.topology.nodes}
    for i, a in enumerate(sorted(schedule.assignments, key=lambda a: (a.start_s, a.job))):
        per_node = a.option.gpus_per_node
        for node in a.nodes:
            slots = [k for k, t in enumerate(free_at[node]) if t <= a.start_s][:per_node]
            for k in slots:
                free_at[node][k] = a.end_s
                ax.broken_barh(
                    [(a.start_s / 3600, (a.end_s - a.start_s) / 3600)], (rows[node] + k, 1), color=cmap(i % 20)
                )
            middle = rows[node] + (slots[0] + slots[-1] + 1) / 2 if slots else rows[node]
            ax.text((a.start_s + a.end_s) / 7200, middle, a.job, ha="center", va="center", fontsize=6)
    for server in problem.topology.nodes:
        ax.axhline(rows[server.index], color="grey", linewidth=0.3)
    ax.set_yticks([rows[n.index] + n.num_gpus / 2 for n in problem.topology.nodes])
    ax.set_yticklabels([n.name for n in problem.topology.nodes], fontsize=6)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPUs (grouped by node)")
    ax.set_title(f"{schedule.solver}: {schedule.status}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
