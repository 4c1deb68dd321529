"""Water-filling of idle GPUs among running jobs: who grows, to which plan, by marginal gain per GPU.

The greedy HAS (:mod:`frenzy_opt.solvers.greedy`) starts queued jobs first; what stays idle after that is
divided here among the running jobs that may move. Each job has a ladder of plans (its options if it
restarted now, each duration counting the restart). Starting from every job where it runs, the division
repeatedly takes the single step (a job to a faster plan) with the largest **marginal gain per GPU**: the
job's weighted seconds saved over the step, divided by the idle GPUs the step adds (Kelly's proportional
share as a discrete water-filling: Boyd & Vandenberghe 2004, §5.5.3; the marginal-goodput-per-GPU rule of
Pollux's allocation, Qiao et al. 2021 §4.2). A job's first step must pay for its move: it saves more than
``grow_gain`` of the job's remaining time and more than ``margin`` restarts. Steps continue until none has
a positive gain that can be placed. Each step is placed as it is taken, on the free-GPU index as the
steps so far left it: a job's own GPUs (where it runs, or those of its previous step) count as free for its
own step, and a job that leaves a type gives its GPUs back for the other jobs' later steps. (Placing only
the final targets, after a division by GPU counts alone, failed where the counts fit and the nodes did not:
in Sia's philly workload 1 three jobs sat on 4 of 8 A100s each for hours beside 4 idle ones, because the
division kept offering the idle 4 to a job whose node was full.)

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


@dataclass(slots=True)
class _Held:
    """GPUs a job holds during the division: where it runs, then the nodes of the step it was given."""

    gpu_type: str
    nodes: tuple[int, ...]
    per_node: int

    @property
    def num_gpus(self) -> int:
        return self.per_node * len(self.nodes)


def _change(free: dict[str, FreeIndex], held: _Held, sign: int, log: list[tuple[str, int, int]]) -> None:
    """Give back (``sign`` 1) or take (-1) ``held``'s GPUs on the index of its type, if the division has it."""
    index = free.get(held.gpu_type)
    if index is None:
        return
    for node in held.nodes:
        index.change(node, sign * held.per_node)
        log.append((held.gpu_type, node, sign * held.per_node))


def divide(candidates: list[Candidate], free: dict[str, FreeIndex], *, grow_gain: float, margin: float) -> list[Grant]:
    """The moves of one division of the idle GPUs in ``free`` among ``candidates`` (module docstring).
    ``free`` is left as it was; the caller applies the grants (releasing every granted job first, then taking
    each grant's nodes: a grant may use GPUs another grant's job leaves)."""
    limits: dict[str, float] = {}
    ladders: dict[str, list[Option]] = {}
    for c in candidates:
        limit = min(c.left_s * (1.0 - grow_gain), c.left_s - margin * c.restart_s)
        ladder = sorted((o for o in c.options if o.duration_s < limit and o.gpu_type in free), key=_shortest)
        if ladder:
            limits[c.job], ladders[c.job] = limit, ladder
    by_job = {c.job: c for c in candidates}
    holds = {job: _Held(by_job[job].gpu_type, by_job[job].nodes, by_job[job].per_node) for job in ladders}
    target: dict[str, Option] = {}
    log: list[tuple[str, int, int]] = []  # every change made to the indexes, undone before returning
    while True:
        best: tuple[float, float, str, Option, tuple[int, ...]] | None = None
        for job, ladder in ladders.items():
            c, held = by_job[job], holds[job]
            duration = target[job].duration_s if job in target else c.left_s
            for option in ladder:
                if option.duration_s >= duration:
                    break  # the ladder is sorted shortest first: nothing further is faster
                own = held.gpu_type == option.gpu_type
                extra = option.num_gpus - (held.num_gpus if own else 0)
                gain = c.weight * (duration - option.duration_s)
                ratio = gain / extra if extra > 0 else math.inf
                if best is not None and (ratio, gain) <= (best[0], best[1]):
                    continue
                # Placed as it would be now: on idle GPUs, its own (where it runs or was given) counted idle.
                index = free[option.gpu_type]
                if own:
                    _change(free, held, 1, [])
                nodes = index.fit(option)
                if own:
                    _change(free, held, -1, [])
                if nodes is not None:
                    best = (ratio, gain, job, option, nodes)
        if best is None:
            break
        _, _, job, option, nodes = best
        _change(free, holds[job], 1, log)  # what it held is idle again, for any job's later step
        holds[job] = _Held(option.gpu_type, nodes, option.gpus_per_node)
        _change(free, holds[job], -1, log)
        target[job] = option
    for gpu_type, node, delta in reversed(log):
        free[gpu_type].change(node, -delta)
    grants = [
        Grant(
            job=job,
            option=option,
            nodes=holds[job].nodes,
            limit_s=limits[job],
            gain=by_job[job].weight * (by_job[job].left_s - option.duration_s),
        )
        for job, option in target.items()
    ]
    grants.sort(key=lambda g: (-g.gain, g.job))
    return grants


def _shortest(option: Option) -> tuple[float, int]:
    return option.duration_s, option.num_gpus
