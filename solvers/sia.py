"""``sia``: a faithful Sia-like round-based policy (Jayaram Subramanya et al., SOSP 2023; BASELINES.md).

Every round (60 s by default) it chooses, for every active job (queued or running), at most one
configuration — a GPU type and a GPU count from Sia's set: powers of two inside one node, whole nodes
beyond — by an integer program over normalised goodputs, then places the chosen allocations (two-stage,
:func:`frenzy_opt.solvers.roundbased.apply_allocations`).

Parameters and how each follows the paper and its public artefact:

* goodput G[j, c] = the job's training throughput on configuration c: the fastest memory-feasible plan with
  exactly that GPU type and count from the same plans ``frenzy`` uses (``SimJob.per_count``). Its speed is
  what Sia would know (:func:`frenzy_opt.solvers.roundbased.known_step_s`): the measured (true) one once the
  job has run on that configuration, the model's prediction before (Sia profiles each job briefly and fits
  a throughput model; the prediction stands in). ``sia-oracle`` knows every true speed from the start. The
  global batch is fixed by the spec, so statistical efficiency is 1 and goodput = throughput. Each row is
  divided by its minimum over the job's allowed configurations.
* objective: minimise sum x[j, c] * G[j, c]^p + lambda_n * (#jobs - #allocated), p = -0.5 (the fairness knob;
  for p < 0 Sia minimises), lambda_n = 1.1, G^p rounded to 2 decimals as in the artefact; x binary, at most
  one configuration per job, GPUs per type <= the type's GPUs that are up, and (ours, so that every
  solution is placeable) whole-node configurations per type <= its nodes.
* restart: the goodput of every configuration other than a running job's current one is multiplied by the
  Pollux re-allocation factor max(age - restarts * r, 0) / (age + r), age = time since the job first
  started, r = the job's restart cost (``SimJob.restart_s``: :mod:`frenzy_opt.planning.restart` for our
  workloads, Sia's measured rescale times on its traces); 1 while age < r. A job still paying its restart
  cost, or one its spec forbids to move (``scheduling.preemptible``, ``max_moves``), keeps its allocation
  (hard constraint).
* scale-up: a job that has never run may take only its fewest-GPU configuration on each type (Sia starts
  jobs on one GPU; an LLM may need more to fit); afterwards at most twice the largest count it has held.
* solver: HiGHS MIP (Sia used CBC or GLPK through cvxpy), relative gap 1e-4, ``time_limit_s`` per round.
"""

from __future__ import annotations

from frenzy_opt.planning.problem import Option
from frenzy_opt.simulation.simulator import Action, Start
from frenzy_opt.simulation.view import ClusterView
from frenzy_opt.solvers.base import register_policy
from frenzy_opt.solvers.policies import _Base
from frenzy_opt.solvers.roundbased import apply_allocations, known_step_s, locked, solve_highs


def sia_counts(view: ClusterView, gpu_type: str) -> set[int]:
    """Sia's GPU counts on one type: 1, 2, 4, … up to the node size, then whole nodes (§3.2)."""
    nodes = view.topology.nodes_of(gpu_type)
    size = max(view.topology.nodes[n].num_gpus for n in nodes)
    counts = set()
    k = 1
    while k <= size:
        counts.add(k)
        k *= 2
    counts.add(size)
    counts.update(size * m for m in range(2, len(nodes) + 1))
    return counts


@register_policy("sia")
class SiaPolicy(_Base):
    """Sia's round-based goodput ILP (module docstring)."""

    name = "sia"
    oracle = False
    """True: every configuration's true speed is known from the start (``sia-oracle``)."""

    def __init__(
        self, round_s: float = 60.0, p: float = -0.5, lambda_n: float = 1.1, time_limit_s: float = 30.0
    ) -> None:
        super().__init__()
        if p >= 0:
            raise ValueError("p must be negative (Sia's fairness knob, -0.5 in the paper)")
        self.round_s = float(round_s)
        self.p, self.lambda_n, self.time_limit_s = p, lambda_n, time_limit_s
        self.largest: dict[str, int] = {}
        self.counts: dict[str, set[int]] = {}

    def attach(self, view: ClusterView) -> None:
        super().attach(view)
        self.counts = {t: sia_counts(view, t) for t in view.topology.gpu_types}

    def _allowed(self, job_id: str) -> list[Option]:
        assert self.view is not None
        job = self.view.jobs[job_id].job
        limit = 2 * self.largest.get(job_id, 0)
        by_type: dict[str, list[Option]] = {}
        for (gpu_type, count), option in job.per_count.items():
            if count in self.counts[gpu_type]:
                by_type.setdefault(gpu_type, []).append(option)
        allowed = []
        for options in by_type.values():
            fewest = min(o.num_gpus for o in options)
            allowed += [o for o in options if o.num_gpus <= max(limit, fewest)]
        return allowed

    def _realloc_factor(self, job_id: str, now: float) -> float:
        assert self.view is not None
        state = self.view.jobs[job_id]
        r = state.job.restart_s
        age = now - state.first_start_s if state.first_start_s is not None else 0.0
        if age < r:
            return 1.0
        return max(age - max(state.starts - 1, 0) * r, 0.0) / (age + r)

    def decide(self, now: float) -> list[Action]:
        view = self.view
        assert view is not None
        active = sorted([*view.running, *view.queue])
        if not active:
            return []
        columns: list[tuple[str, Option]] = []
        cost: list[float] = []
        upper: list[float] = []
        per_job: dict[str, list[int]] = {}
        for job_id in active:
            state = view.jobs[job_id]
            allowed = self._allowed(job_id)
            if not allowed:
                continue
            # Restarting, or not to be moved (the spec's preemptible/max_moves): keep it.
            pinned = state.status == "running" and (state.progress_from_s > now or locked(view, job_id))
            speed = {id(o): 1.0 / known_step_s(view, state.job, o, oracle=self.oracle) for o in allowed}
            base = min(speed.values())
            factor = self._realloc_factor(job_id, now) if state.status == "running" else 1.0
            for option in allowed:
                goodput = speed[id(option)] / base
                if state.status == "running" and option is not state.option:
                    goodput *= factor
                    if pinned:
                        continue
                value = round(max(goodput, 1e-4) ** self.p, 2)
                per_job.setdefault(job_id, []).append(len(columns))
                columns.append((job_id, option))
                cost.append(value - self.lambda_n)  # x * G^p + lambda_n * (1 - x), constant dropped
                upper.append(1.0)
        rows: list[tuple[list[int], list[float], float]] = []
        for job_id, idx in per_job.items():
            state = view.jobs[job_id]
            if state.status == "running" and (state.progress_from_s > now or locked(view, job_id)):
                rows.append((idx, [-1.0] * len(idx), -1.0))  # sum >= 1: it must stay allocated
            rows.append((idx, [1.0] * len(idx), 1.0))
        for gpu_type in view.topology.gpu_types:
            up_nodes = [n for n in view.topology.nodes_of(gpu_type) if view.up[n]]
            idx = [i for i, (_, o) in enumerate(columns) if o.gpu_type == gpu_type]
            if not idx:
                continue
            rows.append(
                (
                    idx,
                    [float(columns[i][1].num_gpus) for i in idx],
                    float(sum(view.topology.nodes[n].num_gpus for n in up_nodes)),
                )
            )
            whole = [i for i in idx if columns[i][1].whole_nodes]
            if whole:
                rows.append((whole, [float(columns[i][1].whole_nodes) for i in whole], float(len(up_nodes))))
        values = solve_highs(cost, upper, rows, integer=True, time_limit_s=self.time_limit_s)
        wanted = {columns[i][0]: columns[i][1] for i, v in enumerate(values) if v > 0.5}
        actions = apply_allocations(view, wanted)
        for action in actions:
            if isinstance(action, Start):
                self.largest[action.job] = max(self.largest.get(action.job, 0), action.option.num_gpus)
        for job_id, state in view.running.items():
            if state.option is not None and wanted.get(job_id) is state.option:
                self.largest[job_id] = max(self.largest.get(job_id, 0), state.option.num_gpus)
        return actions


@register_policy("sia-oracle")
class SiaOraclePolicy(SiaPolicy):
    """``sia`` told every configuration's true speed up front (not a real policy: Sia with perfect profiles)."""

    name = "sia-oracle"
    oracle = True
