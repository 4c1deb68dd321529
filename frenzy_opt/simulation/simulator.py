"""Discrete-event simulator: replays a workload on a heterogeneous cluster under a scheduling policy.

The simulator owns the truth: the GPU ledger (free GPUs per node, nodes up or down), every job's state and
progress, the clock. A policy (:class:`~frenzy_opt.simulation.view.Policy`) sees that state read-only through a
:class:`~frenzy_opt.simulation.view.ClusterView` and answers
each decision with actions: :class:`Start` (a job, one of its options, the nodes) and :class:`Stop`
(preempt a running job). The simulator checks every action against the ledger — a policy can never
double-book a GPU, start a job twice or place it against the placement rule — and raises
:class:`SimulationError` when one tries.

**Jobs and time.** A job's work is its ``train_steps``; on an option it progresses at one step per
:meth:`Truth.step_s` seconds. The truth is the simulator's, not the policies': by default
(:class:`ModelTruth`) the plan's predicted ``step_time_s`` (the step-time model, :mod:`frenzy_opt.prediction.steptime`),
else a noisy or a profiled truth (:mod:`frenzy_opt.simulation.truth`). Policies plan with the predictions
(:meth:`SimJob.step_s`) and what they have observed (:meth:`Simulator.observed_step_s`). A start after the
first (a preemption or a failure) first pays the job's restart cost — reloading its checkpoint and rebuilding
the process group — before progressing; the first start pays the job's ``startup_s`` (0 unless
the workload says otherwise).
A preemption checkpoints (no progress lost); a failure loses the progress since the job's last periodic
checkpoint.

**Event order.** Events at the same time are handled in this order, then the policy decides once:

1. completions (GPUs released),
2. node failures (their jobs fail and return to the queue), then node repairs,
3. arrivals (jobs join the queue),
4. the round tick of round-based policies.

Event-driven policies (``round_s`` None) decide after every batch of events; round-based ones only at
their ticks (every ``round_s`` from time 0). Each decision's wall time is recorded: the scheduler overhead.

**Failures** (optional, :class:`Failures`): each node fails after an exponential time with mean
``node_mtbf_h`` (seeded), stays down ``repair_s``, and fails again later; jobs checkpoint every
``checkpoint_interval_s`` of progress.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from frenzy_opt.hardware.placement import refusal
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import Option, OptionCache, no_option_message
from frenzy_opt.planning.restart import job_restart_s
from frenzy_opt.planning.scenario import Request, Scenario
from frenzy_opt.simulation.tracemap import expand, with_requests
from frenzy_opt.simulation.view import ClusterView, Policy


@dataclass(frozen=True, slots=True)
class Completion:
    """A run ends (``epoch``: the run it was planned for; a stopped run's completion is stale)."""

    job: str
    epoch: int


@dataclass(frozen=True, slots=True)
class NodeFailure:
    node: int


@dataclass(frozen=True, slots=True)
class NodeRepair:
    node: int


@dataclass(frozen=True, slots=True)
class Arrival:
    job: str


@dataclass(frozen=True, slots=True)
class Wake:
    """A decision a policy asked for (:meth:`ClusterView.wake_at`)."""


@dataclass(frozen=True, slots=True)
class Tick:
    """A round boundary of a round-based policy."""


SimEvent = Completion | NodeFailure | NodeRepair | Arrival | Wake | Tick
EVENT_ORDER: dict[type, int] = {Completion: 0, NodeFailure: 1, NodeRepair: 2, Arrival: 3, Wake: 4, Tick: 5}
"""The order of events at equal times (module docstring)."""
WAKE, TICK = Wake(), Tick()


class _Due(NamedTuple):
    """An event in the simulator's heap: by time, then :data:`EVENT_ORDER`, then the order pushed."""

    when: float
    order: int
    seq: int
    event: SimEvent


class SimulationError(RuntimeError):
    """A policy asked for something the cluster cannot do, or the workload can never finish."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimJob:
    """A job as the simulator replays it: its one-step options and the user's hand-made request."""

    id: str
    arrival_s: float
    weight: float
    model: str
    steps: int
    options: tuple[Option, ...]
    """Candidate options for one step (Pareto front per GPU type; duration = step time)."""
    per_count: Mapping[tuple[str, int], Option]
    """The fastest one-step option for every admissible (GPU type, GPU count)."""
    request: Request
    restart_s: float
    startup_s: float = 0.0
    """The stall of the first start (0: none; Sia's replay charges its restart cost there too)."""
    priority: int = 0
    """The spec's ``scheduling.priority`` (what policies that know priority classes use)."""
    deadline_s: float | None = None
    """Absolute time by which the job should end (the spec's ``scheduling.deadline_s`` after arrival)."""
    preemptible: bool = True
    """The spec's ``scheduling.preemptible``: policies may stop it once started (failures aside)."""
    max_moves: int | None = None
    """The spec's ``scheduling.max_moves``."""

    def step_s(self, option: Option) -> float:
        """The *predicted* seconds per step on ``option`` (the step-time model's): what a policy knows."""
        return option.plan.step_time_s or option.duration_s


class Truth(Protocol):
    """How fast a job really runs in the simulation: real seconds per training step on an option. Must be
    a pure function of (job, option) within one replay (a restart on the same option runs at the same
    speed)."""

    name: str

    def step_s(self, job: SimJob, option: Option) -> float: ...

    def falls_back(self, job: SimJob, option: Option) -> bool:
        """Whether the truth has no figure of its own for this option and uses the model's prediction."""


class ModelTruth:
    """The step-time model's prediction is the truth (every policy is then judged on the same physics and
    none pays for prediction error)."""

    name = "model"

    def step_s(self, job: SimJob, option: Option) -> float:
        return job.step_s(option)

    def falls_back(self, job: SimJob, option: Option) -> bool:
        return False


@dataclass(slots=True)
class Segment:
    """One stretch of a job on a set of GPUs."""

    job: str
    gpu_type: str
    nodes: tuple[int, ...]
    per_node: int
    start_s: float
    end_s: float
    restart_s: float
    step_s: float

    @property
    def num_gpus(self) -> int:
        return self.per_node * len(self.nodes)


@dataclass(slots=True)
class SimJobState:
    job: SimJob
    remaining: float
    status: str = "pending"  # pending -> queued -> running -> (queued ...) -> done
    option: Option | None = None
    nodes: tuple[int, ...] = ()
    step_s: float = 0.0
    """True seconds per step of the current run (the simulator's truth)."""
    started_s: float = 0.0
    progress_from_s: float = 0.0
    """When the current run started progressing (after its restart cost)."""
    epoch: int = 0
    starts: int = 0
    failures: int = 0
    first_start_s: float | None = None
    end_s: float | None = None
    segments: list[Segment] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Start:
    job: str
    option: Option
    """One of the job's options (its ``per_count`` or ``options``)."""
    nodes: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    job: str


Action = Start | Stop


@dataclass(frozen=True, slots=True, kw_only=True)
class Failures:
    node_mtbf_h: float
    repair_s: float = 1800.0
    checkpoint_interval_s: float = 1800.0
    seed: int = 0


@dataclass(slots=True, kw_only=True)
class SimResult:
    policy: str
    jobs: dict[str, SimJobState]
    decision_s: list[float]
    total_gpus: int
    gpus_per_type: dict[str, int]
    wall_s: float

    def jct(self) -> list[float]:
        return [s.end_s - s.job.arrival_s for s in self.jobs.values() if s.end_s is not None]

    def metrics(self) -> dict[str, float | int]:
        """The per-policy keys of contract 3 (``frenzy simulate``), plus restarts and failures."""
        jct = sorted(self.jct())
        ends = [s.end_s for s in self.jobs.values() if s.end_s is not None]
        first = min((s.job.arrival_s for s in self.jobs.values()), default=0.0)
        makespan = max(ends, default=0.0)
        busy = sum(seg.num_gpus * (seg.end_s - seg.start_s) for s in self.jobs.values() for seg in s.segments)
        span = max(makespan - first, 1e-9)
        decisions = sorted(self.decision_s)
        return {
            "num_jobs": len(self.jobs),
            "num_finished": len(jct),
            "avg_jct_s": sum(jct) / len(jct) if jct else math.nan,
            "p50_jct_s": percentile(jct, 50),
            "p99_jct_s": percentile(jct, 99),
            "makespan_s": makespan,
            "utilization": busy / (self.total_gpus * span),
            "mean_decision_ms": 1e3 * sum(decisions) / len(decisions) if decisions else 0.0,
            "p99_decision_ms": 1e3 * percentile(decisions, 99) if decisions else 0.0,
            "num_decisions": len(decisions),
            "restarts": sum(max(s.starts - 1, 0) for s in self.jobs.values()),
            "failures": sum(s.failures for s in self.jobs.values()),
            "sim_wall_s": self.wall_s,
        }

    def segments(self) -> list[Segment]:
        return sorted((seg for s in self.jobs.values() for seg in s.segments), key=lambda g: (g.start_s, g.job))


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile by linear interpolation between closest ranks (numpy's default method)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def sim_jobs(scenario: Scenario, cache: OptionCache | None = None) -> tuple[list[SimJob], Topology]:
    """The simulator's jobs for a scenario (its workload expanded, every job given a request)."""
    topology = cache.topology if cache is not None else Topology(scenario.cluster)
    if cache is None:
        cache = OptionCache(scenario.cluster, topology)
    scenario = with_requests(expand(scenario, cache), cache)
    jobs = []
    for job in scenario.jobs:
        options = cache.per_step(job.spec)
        if not options or job.request is None:
            raise ValueError(no_option_message(job.id, job.spec, scenario.cluster.name))
        per_count = cache.per_count(job.spec)
        deadline = job.spec.scheduling.deadline_s
        if (job.request.gpu_type, job.request.num_gpus) not in per_count:
            raise ValueError(
                f"job {job.id}: request {job.request.num_gpus} x {job.request.gpu_type} has no memory-feasible plan "
                f"the placement rule admits; feasible counts there: "
                f"{sorted(n for t, n in per_count if t == job.request.gpu_type) or 'none'}"
            )
        jobs.append(
            SimJob(
                id=job.id,
                arrival_s=float(math.ceil(job.arrival_s)),
                weight=job.weight,
                model=job.spec.model.name,
                steps=job.spec.training.train_steps,
                options=options,
                per_count=per_count,
                request=job.request,
                restart_s=job_restart_s(job.spec, scenario.cluster.storage, options),
                preemptible=job.spec.scheduling.preemptible,
                max_moves=job.spec.scheduling.max_moves,
                priority=job.spec.scheduling.priority,
                deadline_s=None if deadline is None else math.ceil(job.arrival_s) + deadline,
            )
        )
    ids = [j.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("scenario: job ids must be unique")
    return jobs, topology


class Simulator:
    """One replay of ``jobs`` on ``topology`` under ``policy`` (module docstring)."""

    def __init__(
        self,
        topology: Topology,
        jobs: list[SimJob],
        policy: Policy,
        *,
        failures: Failures | None = None,
        truth: Truth | None = None,
        progress: Callable[[int, int], None] | None = None,
        max_idle_ticks: int = 1000,
    ) -> None:
        self.topology = topology
        self.policy = policy
        self.truth: Truth = truth if truth is not None else ModelTruth()
        self.failures = failures
        self.progress = progress
        self.max_idle_ticks = max_idle_ticks
        self.jobs: dict[str, SimJobState] = {j.id: SimJobState(job=j, remaining=float(j.steps)) for j in jobs}
        self.free: list[int] = [n.num_gpus for n in topology.nodes]
        self.up: list[bool] = [True] * len(topology.nodes)
        self.queue: dict[str, SimJobState] = {}
        self.running: dict[str, SimJobState] = {}
        self.now = 0.0
        self.decision_s: list[float] = []
        self._events: list[_Due] = []
        self._seq = 0
        self._finished = 0
        self._rng = random.Random(failures.seed if failures else 0)
        self._observed: dict[tuple[str, str, int], float] = {}

    # --- events --------------------------------------------------------------------------------------

    def _push(self, when: float, event: SimEvent) -> None:
        self._seq += 1
        heapq.heappush(self._events, _Due(when, EVENT_ORDER[type(event)], self._seq, event))

    def _next_failure(self, node: int, after: float) -> None:
        assert self.failures is not None
        self._push(after + self._rng.expovariate(1.0 / (self.failures.node_mtbf_h * 3600.0)), NodeFailure(node))

    def run(self) -> SimResult:
        wall = time.perf_counter()
        self.policy.attach(ClusterView(self))
        for state in self.jobs.values():
            self._push(state.job.arrival_s, Arrival(state.job.id))
        if self.failures is not None:
            for node in range(len(self.topology.nodes)):
                self._next_failure(node, 0.0)
        round_s = self.policy.round_s
        if round_s is not None:
            self._push(0.0, TICK)
        idle_ticks = 0
        total = len(self.jobs)
        while self._finished < total:
            if not self._events:
                raise SimulationError(self._stuck_message())
            self.now = self._events[0].when
            tick = False
            while self._events and self._events[0].when == self.now:
                event = heapq.heappop(self._events).event
                if isinstance(event, Completion):
                    self._complete(event.job, event.epoch)
                elif isinstance(event, NodeFailure):
                    self._fail_node(event.node)
                elif isinstance(event, NodeRepair):
                    self._repair_node(event.node)
                elif isinstance(event, Arrival):
                    state = self.jobs[event.job]
                    state.status = "queued"
                    self.queue[event.job] = state
                    self.policy.on_arrival(state.job, self.now)
                elif isinstance(event, Tick):
                    tick = True
            if round_s is None or tick:
                started = time.perf_counter()
                actions = self.policy.decide(self.now)
                self.decision_s.append(time.perf_counter() - started)
                for action in actions:
                    self._apply(action)
                if tick:
                    idle_ticks = idle_ticks + 1 if not actions and not self.running and self.queue else 0
                    if idle_ticks > self.max_idle_ticks:
                        raise SimulationError(self._stuck_message())
                    if self._finished < total:
                        assert round_s is not None
                        self._push(self._next_tick(round_s), TICK)
            if round_s is None and not self.running and self.queue and not self._pending_non_tick():
                raise SimulationError(self._stuck_message())
            if self.progress is not None:
                self.progress(self._finished, total)
        return SimResult(
            policy=self.policy.name,
            jobs=self.jobs,
            decision_s=self.decision_s,
            total_gpus=sum(n.num_gpus for n in self.topology.nodes),
            gpus_per_type={t: self.topology.num_gpus_of(t) for t in self.topology.gpu_types},
            wall_s=time.perf_counter() - wall,
        )

    def _next_tick(self, round_s: float) -> float:
        """The next round boundary; with nothing queued or running, the first one at or after the next
        event (rounds with no job to decide on are skipped, not simulated)."""
        following = self.now + round_s
        if self.queue or self.running:
            return following
        upcoming = self._events[0].when if self._events else following  # the only tick is the one being pushed
        return max(following, math.ceil(upcoming / round_s) * round_s)

    def _pending_non_tick(self) -> bool:
        """Whether an event is still due that could let a queued job start."""
        return any(isinstance(due.event, Completion | NodeRepair | Arrival | Wake) for due in self._events)

    def wake_at(self, when: float) -> None:
        """Make an event-driven policy decide again at ``when`` (e.g. a planned start)."""
        self._push(max(when, self.now), WAKE)

    def observed_step_s(self, job_id: str, gpu_type: str, num_gpus: int) -> float | None:
        """The true seconds per step of ``job_id`` on ``num_gpus`` x ``gpu_type`` if the job has made
        progress there before now (a past run, or the current one past its restart), else None: what a
        scheduler that measures running jobs knows (Sia and Gavel learn throughput this way)."""
        key = (job_id, gpu_type, num_gpus)
        seen = self._observed.get(key)
        if seen is not None:
            return seen
        state = self.running.get(job_id)
        option = None if state is None else state.option
        if state is not None and option is not None and state.progress_from_s < self.now:
            return state.step_s if (option.gpu_type, option.num_gpus) == (gpu_type, num_gpus) else None
        return None

    def _stuck_message(self) -> str:
        waiting = sorted(self.queue)[:5]
        return f"{self.policy.name}: jobs {waiting} can never start (nothing running, no event left that frees GPUs)"

    # --- state changes -------------------------------------------------------------------------------

    def _apply(self, action: Action) -> None:
        if isinstance(action, Stop):
            state = self.running.get(action.job)
            if state is None:
                raise SimulationError(f"{self.policy.name}: stop {action.job}, which is not running")
            self._end_run(state, finished=False, keep_progress=True)
            self.policy.on_end(state.job, self.now, False)
            return
        state = self.queue.get(action.job)
        if state is None:
            raise SimulationError(f"{self.policy.name}: start {action.job}, which is not queued")
        option = action.option
        if (
            state.job.per_count.get((option.gpu_type, option.num_gpus)) is not option
            and option not in state.job.options
        ):
            raise SimulationError(f"{self.policy.name}: {action.job}: option is not one of the job's")
        for n in action.nodes:
            node = self.topology.nodes[n]
            if node.gpu.name != option.gpu_type:
                raise SimulationError(f"{self.policy.name}: {action.job}: node {node.name} is not {option.gpu_type}")
            if not self.up[n]:
                raise SimulationError(f"{self.policy.name}: {action.job}: node {node.name} is down")
        size = self.topology.node_size(option.gpu_type)
        why = refusal(
            option, action.nodes, {n: self.free[n] for n in action.nodes}, size, lambda n: self.topology.nodes[n].name
        )
        if why is not None:
            raise SimulationError(f"{self.policy.name}: {action.job}: {why}")
        per_node = option.gpus_per_node
        for n in action.nodes:
            self.free[n] -= per_node
        del self.queue[action.job]
        self.running[action.job] = state
        restart = state.job.restart_s if state.starts else state.job.startup_s
        state.status = "running"
        state.option = option
        state.nodes = tuple(action.nodes)
        state.started_s = self.now
        state.progress_from_s = self.now + restart
        state.starts += 1
        state.epoch += 1
        if state.first_start_s is None:
            state.first_start_s = self.now
        state.step_s = self.truth.step_s(state.job, option)
        end = state.progress_from_s + state.remaining * state.step_s
        self._push(end, Completion(state.job.id, state.epoch))

    def _end_run(self, state: SimJobState, *, finished: bool, keep_progress: bool) -> None:
        """Close the current run of a running job at ``now``: progress, segment, GPUs back."""
        option = state.option
        assert option is not None
        step_s = state.step_s
        ran_s = max(self.now - state.progress_from_s, 0.0)
        if ran_s > 0:
            self._observed[(state.job.id, option.gpu_type, option.num_gpus)] = step_s
        if finished:
            state.remaining = 0.0
        elif keep_progress:
            state.remaining = max(state.remaining - ran_s / step_s, 0.0)
        else:
            assert self.failures is not None
            interval = self.failures.checkpoint_interval_s
            state.remaining = max(state.remaining - math.floor(ran_s / interval) * interval / step_s, 0.0)
        state.segments.append(
            Segment(
                job=state.job.id,
                gpu_type=option.gpu_type,
                nodes=state.nodes,
                per_node=option.gpus_per_node,
                start_s=state.started_s,
                end_s=self.now,
                restart_s=min(state.progress_from_s, self.now) - state.started_s,
                step_s=step_s,
            )
        )
        for n in state.nodes:
            self.free[n] += option.gpus_per_node
        del self.running[state.job.id]
        state.epoch += 1
        state.option = None
        state.nodes = ()
        if finished:
            state.status = "done"
            state.end_s = self.now
            self._finished += 1
        else:
            state.status = "queued"
            self.queue[state.job.id] = state

    def _complete(self, job_id: str, epoch: int) -> None:
        state = self.jobs[job_id]
        if state.status != "running" or state.epoch != epoch:
            return  # a stale completion of a run that was stopped or failed
        self._end_run(state, finished=True, keep_progress=True)
        self.policy.on_end(state.job, self.now, True)

    def _fail_node(self, node: int) -> None:
        assert self.failures is not None
        if not self.up[node]:
            return
        for state in [s for s in self.running.values() if node in s.nodes]:
            state.failures += 1
            self._end_run(state, finished=False, keep_progress=False)
            self.policy.on_end(state.job, self.now, False)
        self.up[node] = False
        until = self.now + self.failures.repair_s
        self._push(until, NodeRepair(node))
        self.policy.on_node(node, self.now, False, until)

    def _repair_node(self, node: int) -> None:
        self.up[node] = True
        self.policy.on_node(node, self.now, True, self.now)
        if self._finished < len(self.jobs):
            self._next_failure(node, self.now)


def simulate(
    scenario: Scenario,
    policy: Policy,
    *,
    failures: Failures | None = None,
    truth: Truth | None = None,
    cache: OptionCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    jobs, topology = sim_jobs(scenario, cache)
    return Simulator(topology, jobs, policy, failures=failures, truth=truth, progress=progress).run()


def check_result(result: SimResult, topology: Topology) -> list[str]:
    """Conservation checks on a finished replay: every job finished exactly once after it arrived, its
    runs add up to at least its work (more when a failure lost progress), and no node ever held more GPUs
    than it has."""
    errors = []
    events: dict[int, list[tuple[float, int]]] = {}
    for state in result.jobs.values():
        job = state.job
        if state.status != "done" or state.end_s is None:
            errors.append(f"{job.id}: not finished ({state.status})")
            continue
        if state.segments and state.segments[0].start_s < job.arrival_s - 1e-9:
            errors.append(f"{job.id}: started before its arrival")
        if state.segments and abs(state.segments[-1].end_s - state.end_s) > 1e-6:
            errors.append(f"{job.id}: ends after its last run")
        work = sum((seg.end_s - seg.start_s - seg.restart_s) / seg.step_s for seg in state.segments)
        if work < job.steps * (1 - 1e-9) - 1e-6:
            errors.append(f"{job.id}: ran {work:.3f} steps of {job.steps}")
        for seg in state.segments:
            for n in seg.nodes:
                events.setdefault(n, []).extend([(seg.start_s, seg.per_node), (seg.end_s, -seg.per_node)])
    for n, changes in events.items():
        load = 0
        for _, delta in sorted(changes, key=lambda e: (e[0], e[1])):
            load += delta
            if load > topology.nodes[n].num_gpus:
                errors.append(f"node {topology.nodes[n].name}: {load} GPUs held of {topology.nodes[n].num_gpus}")
                break
    return errors
