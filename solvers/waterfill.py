"""Water-filling of idle GPUs among running jobs: who grows, to which plan, by marginal gain per GPU.

The greedy HAS (:mod:`frenzy_opt.solvers.greedy`) starts queued jobs first; what stays idle after that is
divided here among the running jobs that may move. Each job has a ladder of plans (its options if it
restarted now, each duration counting the restart). Starting from every job where it runs, the division
repeatedly takes the single step (a job to a faster plan) with the largest **marginal gain per GPU**: the
job's weighted seconds saved over the step, divided by the idle GPUs the step adds (Kelly's proportional
share as a discrete water-filling: Boyd & Vandenberghe 2004, §5.5.3; the marginal-goodput-per-GPU rule of
Pollux's allocation, Qiao et al. 2021 §4.2). A job's first step must pay for its move: it saves more than
``grow_gain`` of the job's remaining time and more than ``margin`` restarts. Steps continue until none has
a positive gain that fits the idle GPUs. The final target of each job is then placed, largest total gain
first, on the free-GPU index (a job's own GPUs count as free on its own type); one whose plan does not fit
on whole nodes stays where it is.

This is the part of a whole-cluster re-division that a move can pay for: a job moves once per division
(its restart paid once), and a job moved recently is not offered (the caller's hysteresis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frenzy_opt.hardware.placement import FreeIndex
from frenzy_opt.planning.problem import Option


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running job the division may move."""

    job: str
    weight: float
    gpu_type: str
    nodes: tuple[int, ...]
    per_node: int
    left_s: float
    """Seconds it has left where it runs (no restart)."""
    restart_s: float
    options: tuple[Option, ...]
    """Its plans if it restarted now, durations with the restart."""

    @property
    def num_gpus(self) -> int:
        return self.per_node * len(self.nodes)


@dataclass(frozen=True, slots=True)
class Grant:
    """A job the division moves: to ``option`` on ``nodes``; its options are cut to those shorter than
    ``limit_s`` when it rejoins the queue."""

    job: str
    option: Option
    nodes: tuple[int, ...]
    limit_s: float
    gain: float
    """Weighted seconds it saves."""


def _need(candidate: Candidate, option: Option | None) -> tuple[str, int]:
    """Idle GPUs of which type ``option`` takes beyond what the job holds (``None``: where it runs)."""
    if option is None:
        return candidate.gpu_type, 0
    own = candidate.num_gpus if option.gpu_type == candidate.gpu_type else 0
    return option.gpu_type, max(option.num_gpus - own, 0)


def divide(candidates: list[Candidate], free: dict[str, FreeIndex], *, grow_gain: float, margin: float) -> list[Grant]:
    """The moves of one division of the idle GPUs in ``free`` among ``candidates`` (module docstring).
    ``free`` is left as it was; the caller applies the grants (releasing each job and taking its nodes)."""
    idle = {gpu_type: index.count for gpu_type, index in free.items()}
    limits: dict[str, float] = {}
    ladders: dict[str, list[Option]] = {}
    for c in candidates:
        limit = min(c.left_s * (1.0 - grow_gain), c.left_s - margin * c.restart_s)
        ladder = sorted((o for o in c.options if o.duration_s < limit and o.gpu_type in idle), key=_shortest)
        if ladder:
            limits[c.job], ladders[c.job] = limit, ladder
    target: dict[str, Option | None] = {c.job: None for c in candidates if c.job in ladders}
    by_job = {c.job: c for c in candidates}
    while True:
        best: tuple[float, float, str, Option] | None = None
        for job, now_at in target.items():
            c = by_job[job]
            duration = c.left_s if now_at is None else now_at.duration_s
            held_type, held = _need(c, now_at)
            for option in ladders[job]:
                if option.duration_s >= duration:
                    break  # the ladder is sorted shortest first: nothing further is faster
                gpu_type, need = _need(c, option)
                extra = need - (held if gpu_type == held_type else 0)
                if extra > idle[gpu_type]:
                    continue
                gain = c.weight * (duration - option.duration_s)
                ratio = gain / extra if extra > 0 else math.inf
                key = (ratio, gain, job, option)
                if best is None or (ratio, gain) > (best[0], best[1]):
                    best = key
        if best is None:
            break
        _, _, job, option = best
        c = by_job[job]
        if target[job] is not None:  # the step replaces its previous one: those GPUs are idle again
            held_type, held = _need(c, target[job])
            idle[held_type] += held
        gpu_type, need = _need(c, option)
        idle[gpu_type] -= need
        target[job] = option
    return _place([(by_job[job], option) for job, option in target.items() if option is not None], free, limits)


def _shortest(option: Option) -> tuple[float, int]:
    return option.duration_s, option.num_gpus


def _place(moves: list[tuple[Candidate, Option]], free: dict[str, FreeIndex], limits: dict[str, float]) -> list[Grant]:
    """Place each move on the index, largest gain first; a move that does not fit stays out. The index is
    restored before returning."""
    moves.sort(key=lambda m: (-m[0].weight * (m[0].left_s - m[1].duration_s), m[0].job))
    taken: list[tuple[str, int, int]] = []
    grants: list[Grant] = []
    for c, option in moves:
        index = free[option.gpu_type]
        own = option.gpu_type == c.gpu_type
        if own:
            for node in c.nodes:
                index.change(node, c.per_node)
        nodes = index.fit(option)
        if own:
            for node in c.nodes:
                index.change(node, -c.per_node)
        if nodes is None:
            continue
        if own:  # its own GPUs are released to the move: only the rest is taken from the idle ones
            for node in c.nodes:
                index.change(node, c.per_node)
                taken.append((c.gpu_type, node, -c.per_node))
        for node in nodes:
            index.change(node, -option.gpus_per_node)
            taken.append((option.gpu_type, node, option.gpus_per_node))
        gain = c.weight * (c.left_s - option.duration_s)
        grants.append(Grant(job=c.job, option=option, nodes=nodes, limit_s=limits[c.job], gain=gain))
    for gpu_type, node, count in reversed(taken):
        free[gpu_type].change(node, count)
    return grants
