"""Simulator policies (:class:`frenzy_opt.simulation.view.Policy`) and their registry; each decides from a
:class:`~frenzy_opt.simulation.view.ClusterView`.

* ``frenzy`` — MARP plans + the greedy HAS (:mod:`frenzy_opt.solvers.greedy`), deciding at every arrival and
  completion, non-preemptive: the same :class:`GreedyState` ``frenzy solve`` replays. It plans with its own
  predictions (the step-time model's step times x the job's steps), so under a truth other than the model
  its estimated ends are wrong and it pays for that; a running job past its estimated end counts as ending
  now in its estimates. ``frenzy-oracle`` is the same policy told every option's true step time.
* ``fifo`` — a plain cluster: each job runs the request its user made by hand (GPU type and count, see
  :mod:`frenzy_opt.simulation.tracemap`), with the fastest plan for that count. One FIFO queue per GPU type (a
  partition per type, as Slurm sites configure heterogeneous clusters); a queue's head blocks only its
  own type. No backfilling.
* ``cpsat-offline`` — the CP-SAT schedule of the whole workload (:mod:`frenzy_opt.solvers.cpsat`), computed
  once with all arrivals known (offline, clairvoyant) and replayed; tractable for tens of jobs. It is
  non-preemptive and the best schedule found within its time limit, so a preemptive online policy can beat
  it: it is a baseline, not a bound (the bound is :mod:`frenzy_opt.solvers.jctbound`). Its decision
  time is the solve time. It plans with predicted durations; under another truth a planned start whose
  GPUs are still held (an earlier job ran longer than predicted) takes any placement of the same option
  that fits, else waits until one does.
* ``sia`` and ``gavel`` — :mod:`frenzy_opt.solvers.sia`, :mod:`frenzy_opt.solvers.gavel`.

Placement on the simulator's ledger follows the shared rule (:mod:`frenzy_opt.hardware.topology`): inside one node by
best fit, else whole free nodes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

from frenzy_opt.hardware.placement import choose, refusal
from frenzy_opt.planning.problem import Option, ProblemJob, SchedulingProblem, thin_fronts
from frenzy_opt.simulation.simulator import Action, SimJob, SimulationError, Start, Stop
from frenzy_opt.simulation.view import ClusterView
from frenzy_opt.solvers.base import register_policy
from frenzy_opt.solvers.cpsat import CpSatSolver
from frenzy_opt.solvers.greedy import PRICED_JOBS, GreedyState
from frenzy_opt.solvers.greedy_review import Move


def place(view: ClusterView, option: Option, free: list[int] | None = None) -> tuple[int, ...] | None:
    """Where ``option`` fits now on the simulator's ledger (or on ``free``, a copy a policy plans on):
    inside one node by best fit, else the lowest-numbered whole free nodes; None if it does not fit."""
    left = view.free if free is None else free
    up = {n: left[n] for n in view.topology.nodes_of(option.gpu_type) if view.up[n]}
    return choose(option, up, view.topology.node_size(option.gpu_type))


class _Base:
    name = "base"
    round_s: float | None = None

    def __init__(self) -> None:
        self.view: ClusterView | None = None

    def attach(self, view: ClusterView) -> None:
        self.view = view

    def on_arrival(self, job: SimJob, now: float) -> None:
        return None

    def on_end(self, job: SimJob, now: float, finished: bool) -> None:
        return None

    def on_node(self, node: int, now: float, up: bool, until_s: float) -> None:
        return None


@register_policy("frenzy")
class FrenzyPolicy(_Base):
    """MARP plans + the greedy HAS (module docstring), preemptive and elastic unless ``preempt`` is off.

    What it knows of a job's speed on (GPU type, count): what it has measured of that job there (the
    simulator's :meth:`~frenzy_opt.simulation.view.ClusterView.observed_step_s`, as Sia and Gavel measure), else the
    prediction corrected by a ratio measured / predicted (:meth:`_correction`) — the simulated counterpart of
    the service's closed-loop calibration (:mod:`frenzy_opt.prediction.closedloop`). The job's own ratio on the
    type at another count comes first, carried to this count by how its model's ratio changes between the two
    counts (measured on one job where one ran at both): what the prediction misses of a job on a type stays
    with the job when its count changes, while another job of the same model may differ in batch, sequence
    length or luck. Without it, a job measured at 0.9x its prediction on 2 GPUs was priced at another job's
    1.8x on 4 and did not grow into 4 idle GPUs of its type for hours (paper3type-llm, seed 2). Without the
    job's own ratio, its model's on the type: at that count, or at the largest smaller count measured (scaling
    efficiency does not rise with the count: Amdahl 1967). Both are the latest measurements, not averages over
    jobs: in Sia's traces a job's throughput changes as its batch size adapts, and the geometric mean over
    jobs lost 4-6 points of average JCT against sia there. A running job's estimated end follows its
    measured speed and progress. ``max_options_per_type`` thins each job's per-type Pareto front.

    Preemptive, it also reviews the whole cluster every ``review_every_s`` seconds of cluster time while
    jobs run (default 60 s, Sia's round: Jayaram Subramanya et al. 2023 §5), besides every arrival and
    completion: jobs that have become movable since the last event (past their hysteresis) are divided the
    idle GPUs by marginal gain per GPU (:mod:`frenzy_opt.solvers.waterfill`), and queued jobs may preempt."""

    name = "frenzy"
    oracle = False
    """True: plan with the simulator's true step times instead of the predictions (``frenzy-oracle``)."""

    def __init__(
        self,
        max_options_per_type: int = 6,
        preempt: bool = True,
        max_restarts: int = 20,
        queue_price: float = 1.0,
        patient: bool | None = None,
        review_every_s: float = 60.0,
        priced_jobs: int | None = PRICED_JOBS,
    ) -> None:
        super().__init__()
        if review_every_s < 0:
            raise ValueError(f"review_every_s must be >= 0 (0: only at arrivals and completions), got {review_every_s}")
        if max_options_per_type < 2:
            raise ValueError(f"max_options_per_type must be >= 2, got {max_options_per_type}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self.max_options_per_type = max_options_per_type
        self.preempt = preempt
        self.max_restarts = max_restarts
        self.queue_price = queue_price
        self.patient = not preempt if patient is None else patient
        self.review_every_s = review_every_s
        self.priced_jobs = priced_jobs
        """The greedy decision's bound (:data:`~frenzy_opt.solvers.greedy.PRICED_JOBS`; None: unbounded)."""
        self._next_review = 0.0
        self.state: GreedyState | None = None
        self._options: dict[str, dict[int, Option]] = {}
        """Per queued job: the scaled option's id -> the job's one-step option."""
        self._ratios: dict[tuple[str, str], dict[int, float]] = {}
        """Per (model, GPU type): measured / predicted step time per GPU count, the latest job's."""
        self._own_ratios: dict[tuple[str, str], dict[int, float]] = {}
        """The same per (job id, GPU type)."""
        self._scaling: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
        """Per (model, GPU type): a job's ratio at count b over its ratio at count a, by (a, b), the latest job's."""
        self._stopping: set[str] = set()
        self._unmeasured: dict[str, float] = {}
        """Runs started whose speed the policy has not measured yet (job -> start)."""

    def attach(self, view: ClusterView) -> None:
        super().attach(view)
        self.state = GreedyState(
            SchedulingProblem(topology=view.topology, jobs=()),
            queue_price=self.queue_price,
            patient=self.patient,
            priced_jobs=self.priced_jobs,
            max_restarts=self.max_restarts,
        )

    def _step_s(self, job: SimJob, option: Option) -> float:
        """Seconds per step as the policy knows them (class docstring)."""
        assert self.view is not None
        if self.oracle:
            return self.view.true_step_s(job, option)
        seen = self.view.observed_step_s(job.id, option.gpu_type, option.num_gpus)
        if seen is not None:
            return seen
        return job.step_s(option) * self._correction(job, option.gpu_type, option.num_gpus)

    def _correction(self, job: SimJob, gpu_type: str, num_gpus: int) -> float:
        """Measured / predicted step time expected for ``job`` on ``num_gpus`` x ``gpu_type`` (class docstring):
        the job's own ratio there; else its own at the nearest count measured below (else above) times its
        model's scaling of the ratio between the two counts, else its own below alone; else its model's ratio
        there or at the largest smaller count; else 1."""
        own = self._own_ratios.get((job.id, gpu_type))
        if own:
            if num_gpus in own:
                return own[num_gpus]
            below = [n for n in own if n < num_gpus]
            base = max(below) if below else min(own)
            scaling = self._scaling.get((job.model, gpu_type), {}).get((base, num_gpus))
            if scaling is None:
                model = self._ratios.get((job.model, gpu_type), {})
                if base in model and num_gpus in model:
                    scaling = model[num_gpus] / model[base]
            if scaling is not None:
                return own[base] * scaling
            if below:
                return own[base]
        ratios = self._ratios.get((job.model, gpu_type))
        if not ratios:
            return 1.0
        if num_gpus in ratios:
            return ratios[num_gpus]
        below = [n for n in ratios if n < num_gpus]
        return ratios[max(below)] if below else 1.0

    def _learn(self, job: SimJob, gpu_type: str, num_gpus: int) -> float | None:
        """Record the measured speed of ``job`` on (type, count), if any; returns it."""
        assert self.view is not None
        seen = self.view.observed_step_s(job.id, gpu_type, num_gpus)
        option = job.per_count.get((gpu_type, num_gpus))
        if seen is not None and option is not None and job.step_s(option) > 0:
            ratio = seen / job.step_s(option)
            self._ratios.setdefault((job.model, gpu_type), {})[num_gpus] = ratio
            own = self._own_ratios.setdefault((job.id, gpu_type), {})
            own[num_gpus] = ratio
            scaling = self._scaling.setdefault((job.model, gpu_type), {})
            for count, other in own.items():
                if count != num_gpus:
                    scaling[(count, num_gpus)] = ratio / other
                    scaling[(num_gpus, count)] = other / ratio
        return seen

    def _scaled(
        self, job: SimJob, remaining: float, move: Move | None = None
    ) -> tuple[tuple[Option, ...], dict[int, Option]]:
        """The job's options for ``remaining`` steps (restart included), Pareto per type, thinned (and cut as
        ``move`` allows, for a job the review moved); and the one-step option each came from, by the scaled
        option's id."""
        assert self.view is not None
        state = self.view.jobs[job.id]
        restart = job.restart_s if state.starts else job.startup_s
        per_type: dict[str, list[tuple[int, float, Option]]] = {}
        for original in job.per_count.values():
            duration = float(math.ceil(restart + self._step_s(job, original) * remaining))
            per_type.setdefault(original.gpu_type, []).append((original.num_gpus, duration, original))
        fronts: list[list[Option]] = []
        originals: dict[int, Option] = {}
        for triples in per_type.values():
            triples.sort(key=lambda t: (t[0], t[1]))
            front: list[Option] = []
            last = math.inf
            for _, duration, original in triples:
                if duration < last:  # only the front's options are built (most of the counts are dominated)
                    scaled = Option(
                        gpu_type=original.gpu_type,
                        num_gpus=original.num_gpus,
                        whole_nodes=original.whole_nodes,
                        duration_s=duration,
                        plan=original.plan,
                    )
                    front.append(scaled)
                    originals[id(scaled)] = original
                    last = duration
            fronts.append(front)
        chosen = thin_fronts(fronts, self.max_options_per_type)
        if move is not None:
            chosen = move.cut(chosen)
        # Last first: the order the reports in benchmarks/results were measured with (ties keep it).
        return tuple(reversed(chosen)), {id(o): originals[id(o)] for o in chosen}

    def _enqueue(self, job: SimJob, remaining: float, move: Move | None = None) -> None:
        assert self.state is not None
        scaled, self._options[job.id] = self._scaled(job, remaining, move)
        self.state.queue[job.id] = ProblemJob(
            id=job.id,
            arrival_s=job.arrival_s,
            weight=job.weight,
            options=scaled,
            priority=job.priority,
            deadline_s=job.deadline_s,
            restart_s=job.restart_s,
            preemptible=job.preemptible,
            max_moves=job.max_moves,
        )

    def _remaining_now(self, job_id: str, now: float) -> float:
        """Steps left of a running job at ``now`` (what a scheduler reads from the job's progress)."""
        assert self.view is not None
        state = self.view.jobs[job_id]
        ran = max(now - state.progress_from_s, 0.0)
        return max(state.remaining - ran / state.step_s, 0.0) if state.step_s > 0 else state.remaining

    def on_arrival(self, job: SimJob, now: float) -> None:
        assert self.state is not None
        self.state.note_arrival(now, job.weight)
        self._enqueue(job, float(job.steps))

    def on_end(self, job: SimJob, now: float, finished: bool) -> None:
        assert self.state is not None and self.view is not None
        last = self.view.jobs[job.id].segments[-1]
        self._learn(job, last.gpu_type, last.num_gpus)
        if job.id in self._stopping:  # a move of this policy's: released and enqueued already
            self._stopping.discard(job.id)
            return
        self.state.release(job.id)
        if not finished:
            self._enqueue(job, self.view.jobs[job.id].remaining)

    def on_node(self, node: int, now: float, up: bool, until_s: float) -> None:
        assert self.state is not None and self.view is not None
        key = f"node-down:{node}"
        if up:
            self.state.release(key)
        else:
            self.state.hold(key, node, self.view.free[node], until_s)

    def _refresh(self, now: float) -> None:
        """Running jobs' estimated ends from their measured speed and progress (class docstring)."""
        assert self.state is not None and self.view is not None
        # A run's speed is measured once it progresses; with the truth fixed per run, its end follows from
        # that once, so only runs not yet measured are looked at.
        for job_id in list(self._unmeasured):
            state = self.view.running.get(job_id)
            option = None if state is None else state.option
            if state is None or option is None or job_id not in self.state.by_job:
                del self._unmeasured[job_id]
                continue
            seen = self._learn(state.job, option.gpu_type, option.num_gpus)
            if seen is None:
                continue
            del self._unmeasured[job_id]
            end = max(state.progress_from_s, now) + self._remaining_now(job_id, now) * seen
            self.state.update_end(job_id, end)

    def _options_now(self, job_id: str) -> tuple[Option, ...]:
        assert self.view is not None
        job = self.view.jobs[job_id].job
        return self._scaled(job, self._remaining_now(job_id, self.view.now))[0]

    def decide(self, now: float) -> list[Action]:
        assert self.state is not None and self.view is not None
        if not self.oracle:
            self._refresh(now)
        assignments = self.state.decide(now)
        stops: list[Action] = []
        if self.preempt:
            moves = self.state.review(now, max_restarts=self.max_restarts, options_now=self._options_now)
            for move in moves:
                if any(a.job == move.job for a in assignments):
                    continue
                remaining = self._remaining_now(move.job, now)
                self._stopping.add(move.job)
                stops.append(Stop(job=move.job))
                self._enqueue(self.view.jobs[move.job].job, remaining, move)
            if moves:
                assignments += self.state.decide(now)
                # A growth's cut holds for that decision only: a grown job the decision did not start (another
                # job took the GPUs it was divided) is an ordinary queued job again, with all its options
                # (kept cut, it waited for that one plan for hours in Sia's philly workload 5).
                started = {a.job for a in assignments}
                for move in moves:
                    if move.reason == "grow" and move.job in self._stopping and move.job not in started:
                        self._enqueue(self.view.jobs[move.job].job, self._remaining_now(move.job, now))
        if self.preempt and self.review_every_s > 0 and self.state.by_job and now >= self._next_review:
            self._next_review = now + self.review_every_s
            self.view.wake_at(self._next_review)
        actions: list[Action] = list(stops)
        for a in assignments:
            originals = self._options.pop(a.job)
            actions.append(Start(job=a.job, option=originals[id(a.option)], nodes=a.nodes))
            self._unmeasured[a.job] = now
            if self.preempt:
                job = self.view.jobs[a.job]
                restart = job.job.restart_s if job.starts else job.job.startup_s
                self.view.wake_at(now + restart + 1.0)  # measure its speed once it progresses
        return actions


@register_policy("frenzy-oracle")
class FrenzyOraclePolicy(FrenzyPolicy):
    """``frenzy`` told the true step time of every option (not a real policy: what its prediction errors
    cost it)."""

    name = "frenzy-oracle"
    oracle = True


@register_policy("fifo")
class FifoPolicy(_Base):
    """Per-type FIFO queues on the users' own requests (module docstring)."""

    name = "fifo"

    def __init__(self) -> None:
        super().__init__()
        self.queues: dict[str, deque[SimJob]] = {}

    def on_arrival(self, job: SimJob, now: float) -> None:
        self.queues.setdefault(job.request.gpu_type, deque()).append(job)

    def on_end(self, job: SimJob, now: float, finished: bool) -> None:
        if not finished:  # failed: back to the head of its queue, it keeps its place
            self.queues[job.request.gpu_type].appendleft(job)

    def decide(self, now: float) -> list[Action]:
        assert self.view is not None
        actions: list[Action] = []
        free = list(self.view.free)
        for queue in self.queues.values():
            while queue:
                job = queue[0]
                option = job.per_count[(job.request.gpu_type, job.request.num_gpus)]
                nodes = place(self.view, option, free)
                if nodes is None:
                    break
                queue.popleft()
                actions.append(Start(job=job.id, option=option, nodes=nodes))
                for n in nodes:
                    free[n] -= option.gpus_per_node
        return actions


@register_policy("cpsat-offline")
class OptimalPolicy(_Base):
    """The offline CP-SAT schedule, replayed (module docstring). ``max_jobs`` bounds where it is tried."""

    name = "cpsat-offline"

    def __init__(self, time_limit_s: float = 60.0, workers: int = 2, seed: int = 0, max_jobs: int = 60) -> None:
        super().__init__()
        self.solver = CpSatSolver(time_limit_s=time_limit_s, workers=workers, seed=seed)
        self.max_jobs = max_jobs
        self.plan: dict[str, tuple[float, Option, tuple[int, ...]]] = {}
        self.status = ""
        self.bound: float | None = None
        self._solved = False

    def attach(self, view: ClusterView) -> None:
        super().attach(view)
        if view.failures is not None:
            raise SimulationError("cpsat-offline: an offline schedule cannot replay failures; run it without them")
        if len(view.jobs) > self.max_jobs:
            raise SimulationError(
                f"cpsat-offline: {len(view.jobs)} jobs exceed max_jobs={self.max_jobs}, beyond what CP-SAT solves here "
                "(raise policies.cpsat-offline.max_jobs to try)"
            )

    def _solve(self) -> None:
        assert self.view is not None
        problem_jobs = []
        originals: dict[str, dict[int, Option]] = {}
        for state in self.view.jobs.values():
            job = state.job
            scaled = tuple(replace(o, duration_s=float(math.ceil(job.step_s(o) * job.steps))) for o in job.options)
            originals[job.id] = {id(s): o for s, o in zip(scaled, job.options, strict=True)}
            problem_jobs.append(ProblemJob(id=job.id, arrival_s=job.arrival_s, weight=job.weight, options=scaled))
        schedule = self.solver.solve(SchedulingProblem(topology=self.view.topology, jobs=tuple(problem_jobs)))
        self.status, self.bound = schedule.status, schedule.bound
        if not schedule.assignments:
            raise SimulationError(f"cpsat-offline: CP-SAT found no schedule ({schedule.status})")
        for a in schedule.assignments:
            self.plan[a.job] = (a.start_s, originals[a.job][id(a.option)], a.nodes)
            self.view.wake_at(a.start_s)

    def decide(self, now: float) -> list[Action]:
        assert self.view is not None
        if not self._solved:
            self._solve()
            self._solved = True
        actions: list[Action] = []
        free = list(self.view.free)
        for job_id in [j for j, (start, _, _) in self.plan.items() if start <= now and j in self.view.queue]:
            _, option, planned = self.plan[job_id]
            nodes = planned if self._fits(option, planned, free) else place(self.view, option, free)
            if nodes is None:
                continue  # an earlier job still holds the GPUs (it ran longer than predicted): wait
            del self.plan[job_id]
            for n in nodes:
                free[n] -= option.gpus_per_node
            actions.append(Start(job=job_id, option=option, nodes=nodes))
        return actions

    def _fits(self, option: Option, nodes: tuple[int, ...], free: list[int]) -> bool:
        assert self.view is not None
        up = {n: free[n] for n in nodes if self.view.up[n]}
        return refusal(option, nodes, up, self.view.topology.node_size(option.gpu_type)) is None
