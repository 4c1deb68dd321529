"""``gavel``: Gavel's heterogeneity-aware max-sum-throughput policy with its round-based mechanism
(Narayanan et al., OSDI 2020; BASELINES.md).

Jobs are rigid: each runs its user's request count (:mod:`frenzy_opt.simulation.tracemap`) — on any GPU type where
that count has a memory-feasible plan (the fastest such plan). The policy is an LP over the time fractions
X[j, t] each job spends on each type:

    maximise  sum_j sum_t X[j, t] * T[j, t] / max_t T[j, t]
    s.t.      sum_t X[j, t] <= 1,   sum_j X[j, t] * n_j <= GPUs of type t,   X >= 0,

T = throughput (steps/s) as Gavel would know it (:func:`frenzy_opt.solvers.roundbased.known_step_s`): the
measured (true) one once the job has run on the type, the step-time model's prediction before (Gavel
profiles or estimates throughputs; the prediction stands in); ``gavel-oracle`` knows every true throughput
from the start. Dividing each job by its best throughput makes the objective the sum of normalised
throughputs, so large and small models count alike (Gavel §4.2 normalises throughputs per job in its
policies). The LP is re-solved when the set of active jobs changes or a throughput it used was revised by a
measurement.

Every round (360 s, Gavel's default) the mechanism (§5) grants GPUs: jobs are ranked by priority
X[j, t] / (share of time received on t since arrival), unserved shares first, and granted their type if
their request still fits (shared placement rule); a job granted the type and nodes it already runs on keeps
running, others checkpoint and restart (restart cost as for every policy).
"""

from __future__ import annotations

from frenzy_opt.planning.problem import Option
from frenzy_opt.simulation.simulator import Action, SimJob
from frenzy_opt.solvers.base import register_policy
from frenzy_opt.solvers.policies import _Base, place
from frenzy_opt.solvers.roundbased import apply_allocations, known_step_s, solve_highs


@register_policy("gavel")
class GavelPolicy(_Base):
    """Max-sum-throughput time shares + round-based grants (module docstring)."""

    name = "gavel"
    oracle = False
    """True: every true throughput is known from the start (``gavel-oracle``)."""

    def __init__(self, round_s: float = 360.0, time_limit_s: float = 30.0) -> None:
        super().__init__()
        self.round_s = float(round_s)
        self.time_limit_s = time_limit_s
        self.used: dict[tuple[str, str], float] = {}
        """Seconds per step of each (job, GPU type) the last LP used."""
        self.shares: dict[tuple[str, str], float] = {}
        self.received: dict[tuple[str, str], float] = {}
        self._active: frozenset[str] = frozenset()
        self._last_tick = 0.0

    def _options(self, job: SimJob) -> dict[str, Option]:
        count = job.request.num_gpus
        return {t: o for (t, n), o in job.per_count.items() if n == count}

    def _known(self, active: list[str]) -> dict[tuple[str, str], float]:
        """Seconds per step of every active job on every type, as Gavel knows them now."""
        view = self.view
        assert view is not None
        known = {}
        for job_id in active:
            job = view.jobs[job_id].job
            for gpu_type, option in self._options(job).items():
                known[(job_id, gpu_type)] = known_step_s(view, job, option, oracle=self.oracle)
        return known

    def _solve_shares(self, active: list[str], known: dict[tuple[str, str], float]) -> None:
        view = self.view
        assert view is not None
        columns: list[tuple[str, str, Option]] = []
        cost: list[float] = []
        for job_id in active:
            job = view.jobs[job_id].job
            options = self._options(job)
            best = max(1.0 / known[(job_id, t)] for t in options)
            for gpu_type, option in options.items():
                columns.append((job_id, gpu_type, option))
                cost.append(-(1.0 / known[(job_id, gpu_type)]) / best)
        rows: list[tuple[list[int], list[float], float]] = []
        by_job: dict[str, list[int]] = {}
        by_type: dict[str, list[int]] = {}
        for i, (job_id, gpu_type, _) in enumerate(columns):
            by_job.setdefault(job_id, []).append(i)
            by_type.setdefault(gpu_type, []).append(i)
        rows += [(idx, [1.0] * len(idx), 1.0) for idx in by_job.values()]
        for gpu_type, idx in by_type.items():
            capacity = float(view.topology.num_gpus_of(gpu_type))
            rows.append((idx, [float(columns[i][2].num_gpus) for i in idx], capacity))
        values = solve_highs(cost, [1.0] * len(cost), rows, integer=False, time_limit_s=self.time_limit_s)
        self.shares = {(columns[i][0], columns[i][1]): v for i, v in enumerate(values) if v > 1e-9}

    def decide(self, now: float) -> list[Action]:
        view = self.view
        assert view is not None
        elapsed = now - self._last_tick
        self._last_tick = now
        for job_id, state in view.running.items():
            assert state.option is not None
            key = (job_id, state.option.gpu_type)
            self.received[key] = self.received.get(key, 0.0) + elapsed
        active = sorted([*view.running, *view.queue])
        if not active:
            return []
        known = self._known(active)
        if frozenset(active) != self._active or known != self.used:
            self._solve_shares(active, known)
            self._active = frozenset(active)
            self.used = known
        ranked = []
        for (job_id, gpu_type), share in self.shares.items():
            if job_id not in view.jobs or view.jobs[job_id].status == "done":
                continue
            age = max(now - view.jobs[job_id].job.arrival_s, 1e-9)
            got = self.received.get((job_id, gpu_type), 0.0) / age
            priority = share / got if got > 0 else float("inf")
            ranked.append((-priority, -share, job_id, gpu_type))
        ranked.sort()
        free = list(view.free)
        for state in view.running.values():  # plan on an empty cluster: every grant is decided afresh
            assert state.option is not None
            for n in state.nodes:
                free[n] += state.option.gpus_per_node
        wanted: dict[str, Option] = {}
        for _, _, job_id, gpu_type in ranked:
            if job_id in wanted:
                continue
            option = self._options(view.jobs[job_id].job)[gpu_type]
            state = view.jobs[job_id]
            if (
                state.status == "running"
                and state.option is option
                and all(free[n] >= option.gpus_per_node for n in state.nodes)
            ):
                nodes: tuple[int, ...] | None = state.nodes  # keep running where it is
            else:
                nodes = place(view, option, free)
            if nodes is None:
                continue
            for n in nodes:
                free[n] -= option.gpus_per_node
            wanted[job_id] = option
        return apply_allocations(view, wanted)


@register_policy("gavel-oracle")
class GavelOraclePolicy(GavelPolicy):
    """``gavel`` told every true throughput up front (not a real policy: Gavel with perfect profiles)."""

    name = "gavel-oracle"
    oracle = True
