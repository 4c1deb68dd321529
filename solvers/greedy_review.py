"""The greedy HAS's review of running jobs (:meth:`frenzy_opt.solvers.greedy.GreedyState.review`): preemption of
long jobs for short waiting ones and growth into idle GPUs (the module docstring of :mod:`frenzy_opt.solvers.greedy`),
bounded whatever the queue and the cluster."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from frenzy_opt.core.readable import human_duration
from frenzy_opt.planning.interfaces import Admission
from frenzy_opt.planning.problem import Option, ProblemJob
from frenzy_opt.solvers.greedy_horizon import Horizon, Running
from frenzy_opt.solvers.waterfill import Candidate, divide

if TYPE_CHECKING:
    from frenzy_opt.solvers.greedy import GreedyState

# Preempt only jobs whose remaining time is over this multiple of the waiting job's run (SRPT with a
# hysteresis, so two jobs of similar size never swap back and forth).
PREEMPT_RATIO = 2.0
# How much one review looks at (a bound on its cost, whatever the queue and the cluster): the first queued jobs
# in decision order, each one's cheapest plans, and the running jobs with the longest remaining time for growth.
REVIEW_WAITING = 4
REVIEW_OPTIONS = 3
REVIEW_GROWTHS = 16
# Restarts may take at most this fraction of a job's time since its first start (see can_move): a bound on what
# moves may cost a job whatever their gains, above Pollux's 10 % (Qiao et al. 2021 §4.2) because each move here
# must also pay for itself (MOVE_MARGIN). Chosen by cross-validation on Sia's two trace sets (the value best on
# one set, then measured on the other, ``benchmarks/results/overhead_sweep.md``): at 0.1 a job preempted twice
# for short ones could not move again for hours, and the long jobs starved behind the stream of short ones.
MAX_OVERHEAD = 0.5
# A job moved is not moved again before it has run this many times its restart cost (a design choice: two
# moves in a row for small gains would each pay a checkpoint save and load).
HYSTERESIS = 3.0
# A preemption must save the waiting job this many times what it costs the stopped jobs (their restart and the
# waiting job's run, weighted), and a growth must save this many restarts. Chosen by cross-validation on Sia's two
# trace sets (``benchmarks/results/move_margin_sweep.md``: 0 best on philly, read on saturn +10.8 % average JCT
# against sia; 0.15 best on saturn, read on philly +11.1 %; the smaller of the two kept no guard against
# prediction error at all). The margin of 1.5 used before lost 4 points on philly: a preemption's cost counts the
# waiting job's whole run as the stopped jobs' delay, though they often restart sooner beside it, so the cost is
# an upper bound already, and a margin on top of it refused moves that paid.
MOVE_MARGIN = 0.15
# Grow a running job only if it saves over this fraction of its remaining time, its restart paid.
GROW_GAIN = 0.25


@dataclass(frozen=True, slots=True)
class Move:
    """A running job :meth:`GreedyState.review` stopped: it rejoins the queue (the caller enqueues it with
    its remaining work), with only options shorter than ``max_duration_s`` when it is to grow."""

    job: str
    reason: str
    """``preempt`` (for a waiting job) or ``grow`` (into idle GPUs)."""
    max_duration_s: float = float("inf")
    min_duration_s: float = 0.0
    """A growth's options are cut to ``[min_duration_s, max_duration_s)``: no faster than the plan the
    division (:mod:`frenzy_opt.solvers.waterfill`) gave it, so it takes no GPUs promised to another job."""
    why: str = ""
    """What the move gains and what it costs, in a sentence (the service logs it with the move)."""

    def cut(self, options: tuple[Option, ...]) -> tuple[Option, ...]:
        """The moved job's options when it rejoins the queue: those in ``[min_duration_s, max_duration_s)``,
        or all of them if none is (a preemption keeps every option)."""
        return tuple(o for o in options if self.min_duration_s <= o.duration_s < self.max_duration_s) or options


def can_move(state: GreedyState, run: Running, now: float, max_restarts: int) -> bool:
    """Whether review may stop ``run``: a preemptible job (not a hold) that has run :data:`HYSTERESIS`
    times its restart cost since it last started, under its spec's ``max_moves`` and both bounds: at
    most ``max_restarts`` stops, and restarts so far plus this one at most :data:`MAX_OVERHEAD` of the
    time since it first started (the budget of Pollux's re-allocation penalty, Qiao et al. 2021 §4.2,
    that Sia keeps)."""
    problem = run.problem
    if problem is None or run.released or not problem.preemptible:
        return False
    done = state.restarts.get(run.job, 0)
    if problem.max_moves is not None and done >= problem.max_moves:
        return False
    age = now - state._first_start.get(run.job, run.start_s)
    return (
        done < max_restarts
        and now - run.start_s >= max(HYSTERESIS * problem.restart_s, 1.0)
        and (done + 1) * problem.restart_s <= MAX_OVERHEAD * age
    )


def review(
    state: GreedyState,
    now: float,
    *,
    max_restarts: int,
    options_now: Callable[[str], tuple[Option, ...]] | None = None,
    admit: Admission | None = None,
) -> list[Move]:
    """Preempt and grow running jobs (module docstring), after :meth:`decide` at the same time. Stopped
    jobs' GPUs are released here; the caller stops them and enqueues them again with their remaining
    work (and calls :meth:`decide` once more). ``options_now(job)``: a running job's options if it
    restarted now (durations with the restart cost); without it, no job grows. The work is bounded:
    the first :data:`REVIEW_WAITING` queued jobs, their :data:`REVIEW_OPTIONS` cheapest plans, and
    :data:`REVIEW_GROWTHS` running jobs."""
    moves: list[Move] = []
    movable: dict[str, list[tuple[int, float, str, Running]]] = {}
    horizons: dict[str, Horizon] = {}  # per type, until a preemption there changes its running jobs
    if state.queue:
        behind = state._ranked().weight
        for job in itertools.islice(state._order(now), REVIEW_WAITING):
            behind -= job.weight
            ranked = sorted(job.options, key=lambda o: job.weight * o.duration_s + state._used(behind, o))
            tried = 0
            for option in ranked:
                if admit is not None and not admit.allows(job.id, option):
                    continue
                tried += 1
                found = _preempt_for(state, job, option, now, max_restarts, movable, horizons)
                if found is not None:
                    moves += found
                    break
                if tried == REVIEW_OPTIONS:
                    break
    if (state.queue and state.patient) or options_now is None:
        return moves
    if sum(index.count for index in state.free.values()) == 0:
        return moves
    waited = {option.gpu_type for option, _ in state.waiting.values() if option is not None}
    free = {t: index for t, index in state.free.items() if t not in waited}  # queued jobs' types first
    longest = sorted(
        (r for r in state.by_job.values() if can_move(state, r, now, max_restarts)), key=lambda r: (r.end_s, r.seq)
    )[-REVIEW_GROWTHS:]
    candidates = []
    for run in longest:
        assert run.problem is not None
        options = options_now(run.job)
        if admit is not None:
            options = tuple(o for o in options if admit.allows(run.job, o))
        candidates.append(
            Candidate(
                job=run.job,
                weight=run.problem.weight,
                gpu_type=run.gpu_type,
                nodes=run.nodes,
                per_node=run.per_node,
                left_s=run.end_s - now,
                restart_s=run.problem.restart_s,
                options=options,
            )
        )
    held: list[tuple[str, int, int]] = []  # idle GPUs promised to the grants, until the caller re-decides
    grants = divide(candidates, free, grow_gain=GROW_GAIN, margin=MOVE_MARGIN)
    for grant in grants:  # every granted job first: a grant may take GPUs another granted job leaves
        state.release(grant.job)
    for grant in grants:
        for node in grant.nodes:
            state.free[grant.option.gpu_type].change(node, -grant.option.gpus_per_node)
            held.append((grant.option.gpu_type, node, grant.option.gpus_per_node))
        state.restarts[grant.job] = state.restarts.get(grant.job, 0) + 1
        moves.append(
            Move(
                job=grant.job,
                reason="grow",
                max_duration_s=grant.limit_s,
                min_duration_s=grant.option.duration_s,
                why=(
                    f"to {grant.option.num_gpus} x {grant.option.gpu_type} on idle GPUs: saves about "
                    f"{human_duration(grant.gain)} of weighted time, restart included"
                ),
            )
        )
    for gpu_type, node, count in held:
        state.free[gpu_type].change(node, count)
    return moves


def _preempt_for(
    state: GreedyState,
    job: ProblemJob,
    option: Option,
    now: float,
    max_restarts: int,
    movable: dict[str, list[tuple[int, float, str, Running]]],
    horizons: dict[str, Horizon],
) -> list[Move] | None:
    """Stop running jobs so that ``job`` can start ``option`` now, if it is worth it (module docstring);
    None if it is not (or the option fits without). ``movable`` caches, per GPU type for this review,
    the runs :func:`can_move` admits by (priority, longest remaining first), ``horizons`` the types'
    :class:`Horizon` s (dropped for a type where it preempts)."""
    gpu_type = option.gpu_type
    index = state.free[gpu_type]
    if index.fit(option) is not None:
        return None
    runs = movable.get(gpu_type)
    if runs is None:
        runs = movable[gpu_type] = sorted(
            (run.problem.priority, -(run.end_s - now), run.job, run)
            for run in state.by_job.values()
            if run.gpu_type == gpu_type and run.problem is not None and can_move(state, run, now, max_restarts)
        )
    threshold = PREEMPT_RATIO * option.duration_s
    size = index.size
    freed: dict[int, int] = {}
    whole = len(index.buckets[size])
    block = max((left for left in range(size + 1) if index.buckets[left]), default=0)
    chosen: list[Running] = []
    loss = 0.0
    fits = False
    for priority, negative_left, _, run in runs:
        if priority > job.priority:
            break
        if -negative_left <= threshold or run.released:
            continue
        chosen.append(run)
        for node in run.nodes:
            after = freed[node] = freed.get(node, index.free[node]) + run.per_node
            block = max(block, after)
            whole += after == size
        assert run.problem is not None
        loss += run.problem.weight * (run.problem.restart_s + option.duration_s)
        fits = block >= option.num_gpus if option.whole_nodes == 0 else whole >= option.whole_nodes
        if fits:
            break
    if not fits:
        return None
    # Its wait without preemption: until the running jobs of the type free enough GPUs (a lower bound).
    ends = state._ends.setdefault(gpu_type, [])
    index_end = state._horizon(gpu_type, horizons).earliest(option)
    start = ends[index_end][0] if index_end >= 0 else float("inf")
    if job.weight * (start - now) <= MOVE_MARGIN * loss:
        return None
    horizons.pop(gpu_type, None)
    why = (
        f"for {job.id}, which starts on {option.num_gpus} x {gpu_type} now instead of in "
        f"{human_duration(start - now)}; the stop costs {human_duration(loss)} of weighted time, restart included"
    )
    moves = []
    for run in chosen:
        state.release(run.job)
        state.restarts[run.job] = state.restarts.get(run.job, 0) + 1
        moves.append(Move(job=run.job, reason="preempt", why=why))
    return moves
