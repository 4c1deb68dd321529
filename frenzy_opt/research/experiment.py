"""Experiments over the simulator: run several policies on one scenario under one truth, for one seed or
several (``frenzy simulate``, ``frenzy compare``; the report is :mod:`frenzy_opt.research.report`).

Every policy of one experiment replays the same jobs (one :class:`~frenzy_opt.planning.problem.OptionCache`: the same
plans, step times and requests) under the same truth, so their numbers compare.

**Seeds** (``--seeds N``): run k = 0 … N−1 uses truth seed ``base + k`` (the noisy draw), failure seed
``base + k`` (with ``--mtbf-h``) and, for a scenario with a ``workload:`` generator or trace mapping, workload
seed = the scenario's + k: another sample of the same arrival process, sizes and model mix. So the 95 %
interval covers the variation between workloads of the same distribution (and between noise draws), the
question "does policy A beat B on workloads like this one"; with the model truth and explicit ``jobs:``
every run is the same and the interval is 0. Run 0 is exactly the single-seed run. The reported metrics are
means over the runs; ``avg_jct_ci95_s`` and ``p99_jct_ci95_s`` are Student-t half-widths
(:mod:`frenzy_opt.research.stats`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import OptionCache
from frenzy_opt.planning.scenario import Scenario, load_scenario
from frenzy_opt.plots.gantt import plot_sim_gantt
from frenzy_opt.plots.simplot import plot_jct_cdf, plot_utilization
from frenzy_opt.research.stats import PairedDifference, ci95_half_width, mean, paired_ci95, relative_reductions
from frenzy_opt.simulation.simulator import (
    Failures,
    ModelTruth,
    SimJob,
    SimResult,
    SimulationError,
    Simulator,
    Truth,
    sim_jobs,
)
from frenzy_opt.simulation.truth import TruthKind, TruthSpec
from frenzy_opt.solvers.base import make_policy, policy_names
from frenzy_opt.solvers.jctbound import JctBound, jct_lower_bound

DEFAULT_COMPARE_SCENARIOS = ("paper3type-llm", "sia64-llm", "cluster2048-llm")
# frenzy-oracle (frenzy told the true step times) costs a second per run and shows what frenzy's prediction
# errors cost it; the sia and gavel oracles would double the report's run time (Sia's ILP dominates it).
DEFAULT_COMPARE_POLICIES = ("frenzy", "frenzy-oracle", "fifo", "sia", "gavel", "cpsat-offline")
# The report's truth and seeds (docs/simulator.md): the step-time model's cross-validated error, 8 seeds.
DEFAULT_COMPARE_TRUTH = "noisy"
DEFAULT_COMPARE_SEEDS = 8
# Sia's own cluster, where Sia's measured tables cover every GPU type: the report's profiled-truth section.
DEFAULT_PROFILED_SCENARIO = "sia64-llm"
# The report's failure experiment: Sia-64 with every node failing once per 10 h on average (about a dozen
# failures over the workload), an hour to repair and checkpoints every 30 minutes.
DEFAULT_FAILURES = ("sia64-llm", Failures(node_mtbf_h=10.0, repair_s=3600.0, checkpoint_interval_s=1800.0, seed=0))

Progress = Callable[[str, int, int], None]


@dataclass
class Experiment:
    scenario: Scenario
    topology: Topology
    jobs: list[SimJob]
    results: dict[str, SimResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    """Policies that could not run here, with the reason (e.g. ``cpsat-offline`` beyond its size limit)."""
    build_s: float = 0.0
    truth: Truth = field(default_factory=ModelTruth)
    cache: OptionCache | None = None
    """The plan searches, shared with the experiments of the other seeds."""
    bound: JctBound | None = None
    """The proven lower bound on any policy's average JCT here (:mod:`frenzy_opt.solvers.jctbound`), when asked."""


def parse_policies(text: str) -> list[str]:
    """``frenzy,sia`` -> names; ``ValueError`` names an unknown policy and lists the known ones."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise ValueError(f"--policy: give one or more of {', '.join(policy_names())}, comma-separated")
    unknown = [n for n in names if n not in policy_names()]
    if unknown:
        raise ValueError(f"--policy: unknown {', '.join(unknown)}; allowed: {', '.join(policy_names())}")
    return list(dict.fromkeys(names))


def reseeded(scenario: Scenario, offset: int) -> Scenario:
    """The scenario with its workload seed moved by ``offset`` (module docstring); explicit jobs unchanged."""
    if scenario.workload is None or offset == 0:
        return scenario
    return replace(scenario, workload=replace(scenario.workload, seed=scenario.workload.seed + offset))


def prepare(
    scenario: Scenario | str, *, truth: Truth | None = None, seed_offset: int = 0, cache: OptionCache | None = None
) -> Experiment:
    """Load a scenario and build its jobs once (workload expanded with its seed moved by ``seed_offset``,
    plans searched — or taken from ``cache`` — requests made)."""
    started = time.perf_counter()
    if isinstance(scenario, str):
        scenario = load_scenario(scenario)
    if cache is None:
        cache = OptionCache(scenario.cluster, Topology(scenario.cluster))
    jobs, topology = sim_jobs(reseeded(scenario, seed_offset), cache)
    return Experiment(
        scenario=scenario,
        topology=topology,
        jobs=jobs,
        build_s=time.perf_counter() - started,
        truth=truth if truth is not None else ModelTruth(),
        cache=cache,
    )


def run_policies(
    experiment: Experiment,
    policies: Sequence[str],
    *,
    failures: Failures | None = None,
    progress: Progress | None = None,
    skip_infeasible: bool = False,
) -> Experiment:
    """Replay the experiment's jobs under each policy (settings from the scenario's ``policies`` section).
    A policy that cannot run on this scenario raises, or with ``skip_infeasible`` is recorded in
    ``experiment.skipped``."""
    settings = dict(experiment.scenario.settings)
    for name in policies:
        policy = make_policy(name, **settings.get(name, {}))
        report = None if progress is None else (lambda done, total, n=name: progress(n, done, total))
        try:
            sim = Simulator(
                experiment.topology,
                experiment.jobs,
                policy,  # type: ignore[arg-type]
                failures=failures,
                truth=experiment.truth,
                progress=report,
            )
            experiment.results[name] = sim.run()
        except SimulationError as err:
            if not skip_infeasible or name != "cpsat-offline":
                raise
            experiment.skipped[name] = str(err)
    return experiment


def _null_nan(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}


def truth_metrics(result: SimResult, truth: Truth) -> dict[str, float | int]:
    """Where the truth had no figure of its own and used the model's (:meth:`Truth.falls_back`): runs
    (segments) and their share of the GPU-seconds held."""
    runs, held, fallback_held = 0, 0.0, 0.0
    for state in result.jobs.values():
        for seg in state.segments:
            option = state.job.per_count.get((seg.gpu_type, seg.num_gpus))
            gpu_s = seg.num_gpus * (seg.end_s - seg.start_s)
            held += gpu_s
            if option is None or truth.falls_back(state.job, option):
                runs += 1
                fallback_held += gpu_s
    return {"truth_fallback_runs": runs, "truth_fallback_gpu_share": fallback_held / held if held else 0.0}


def policy_payload(result: SimResult, truth: Truth | None = None) -> dict[str, Any]:
    """Contract 3's per-policy keys (NaN, e.g. no finished job, as null); with a truth that can fall back
    to the model, how often it did (:func:`truth_metrics`)."""
    metrics: dict[str, Any] = dict(result.metrics())
    if truth is not None and truth.name != TruthKind.MODEL:
        metrics.update(truth_metrics(result, truth))
    return _null_nan(metrics)


def comparisons(results: dict[str, SimResult], reference: str = "frenzy") -> dict[str, dict[str, float]]:
    """``reference`` against every other policy: relative avg/p99 JCT reduction (positive = reference
    better) and the ratio of mean decision times (other / reference)."""
    return compare_metrics({name: dict(r.metrics()) for name, r in results.items()}, reference)


def compare_metrics(metrics: dict[str, dict[str, Any]], reference: str = "frenzy") -> dict[str, dict[str, float]]:
    """:func:`comparisons` on metric dicts (e.g. the means over seeds)."""
    if reference not in metrics:
        return {}
    ref = metrics[reference]
    out = {}
    for name, other in metrics.items():
        if name == reference:
            continue
        out[name] = {
            "avg_jct_reduction": 1 - float(ref["avg_jct_s"]) / float(other["avg_jct_s"]),
            "p99_jct_reduction": 1 - float(ref["p99_jct_s"]) / float(other["p99_jct_s"]),
            "decision_time_ratio": float(other["mean_decision_ms"]) / max(float(ref["mean_decision_ms"]), 1e-9),
        }
    return out


def write_plots(experiment: Experiment, directory: Path, gantt_policy: str | None = None) -> list[Path]:
    """JCT CDF of every policy, utilization per GPU type over time, a Gantt chart of one policy (default
    ``frenzy`` if it ran, else the first)."""
    results = list(experiment.results.values())
    if not results:
        return []
    name = experiment.scenario.name
    paths = [
        plot_jct_cdf(results, directory / f"{name}-jct-cdf.png", title=f"{name}: job completion time"),
        plot_utilization(results, directory / f"{name}-utilization.png"),
    ]
    chosen = gantt_policy or ("frenzy" if "frenzy" in experiment.results else results[0].policy)
    paths.append(
        plot_sim_gantt(experiment.results[chosen], experiment.topology, directory / f"{name}-gantt-{chosen}.png")
    )
    return paths


# --- several seeds -------------------------------------------------------------------------------------


@dataclass
class SeededRuns:
    """One scenario's experiments, one per seed (module docstring)."""

    seeds: list[int]
    experiments: list[Experiment]
    truth: TruthSpec
    labels: list[str] = field(default_factory=list)
    """Names of the samples when they are not seeds (e.g. Sia's workload files); empty: seeds."""
    description: str = ""
    """What the samples are and what is true in them, when not the truth spec's (e.g. Sia's replay)."""

    @property
    def first(self) -> Experiment:
        return self.experiments[0]

    def policies(self) -> list[str]:
        """Policies that ran under every seed, in the order they ran."""
        return [n for n in self.first.results if all(n in e.results for e in self.experiments)]


def run_seeds(
    scenario: Scenario | str,
    policies: Sequence[str],
    *,
    seeds: int = 1,
    base_seed: int = 0,
    truth: TruthSpec | None = None,
    failures: Failures | None = None,
    progress: Progress | None = None,
    skip_infeasible: bool = False,
    cache: OptionCache | None = None,
    bound: bool = False,
) -> SeededRuns:
    """Every policy on ``scenario`` for seeds ``base_seed`` … ``base_seed + seeds - 1`` (module docstring);
    the plan searches are shared between the seeds (``cache``: e.g. one with another step-time model);
    ``bound``: also each sample's lower bound on the average JCT (:mod:`frenzy_opt.solvers.jctbound`)."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    spec = truth if truth is not None else TruthSpec()
    if isinstance(scenario, str):
        scenario = load_scenario(scenario)
    runs = SeededRuns(seeds=[], experiments=[], truth=spec)
    for k in range(seeds):
        seed = base_seed + k
        experiment = prepare(scenario, truth=spec.make(seed), seed_offset=k, cache=cache)
        cache = experiment.cache
        seeded_failures = None if failures is None else replace(failures, seed=failures.seed + k)
        run_policies(experiment, policies, failures=seeded_failures, progress=progress, skip_infeasible=skip_infeasible)
        if bound:
            experiment.bound = jct_lower_bound(experiment.jobs, experiment.topology, experiment.truth)
        runs.seeds.append(seed)
        runs.experiments.append(experiment)
    return runs


def _mean_of(values: list[Any]) -> Any:
    if any(v is None or isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        return None
    return mean([float(v) for v in values])


def seeded_payload(runs: SeededRuns) -> dict[str, dict[str, Any]]:
    """Per policy: every metric's mean over the seeds, ``avg_jct_ci95_s`` and ``p99_jct_ci95_s`` (Student-t
    95 % half-widths; null for one seed) and ``per_seed`` (seed, avg and p99 JCT)."""
    out: dict[str, dict[str, Any]] = {}
    for name in runs.policies():
        per = [policy_payload(e.results[name], e.truth) for e in runs.experiments]
        payload = {key: _mean_of([p[key] for p in per]) for key in per[0]}
        for key in ("avg_jct_s", "p99_jct_s"):
            values = [p[key] for p in per]
            ok = all(isinstance(v, int | float) for v in values)
            payload[key.replace("_s", "_ci95_s")] = ci95_half_width([float(v) for v in values]) if ok else None
        payload["per_seed"] = [
            {"seed": seed, "avg_jct_s": p["avg_jct_s"], "p99_jct_s": p["p99_jct_s"]}
            for seed, p in zip(runs.seeds, per, strict=True)
        ]
        for row, label in zip(payload["per_seed"], runs.labels, strict=False):
            row["label"] = label
        out[name] = payload
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PairedComparison:
    """``reference`` against one policy over the same samples (seeds or workload files)."""

    avg_reduction: PairedDifference
    """Per sample 1 − reference's average JCT / the other's: mean and 95 % half-width (positive = lower)."""
    avg_difference_s: PairedDifference
    """Per sample the other's average JCT − reference's, seconds."""
    p99_reduction: PairedDifference
    wins: int
    """Samples in which the reference's average JCT is lower."""


def paired(runs: SeededRuns, reference: str, other: str) -> PairedComparison:
    """``reference`` against ``other`` (two result names of every experiment), paired by sample."""

    def series(name: str, key: str) -> list[float]:
        return [float(e.results[name].metrics()[key]) for e in runs.experiments]

    ref_avg, ref_p99 = series(reference, "avg_jct_s"), series(reference, "p99_jct_s")
    avg, p99 = series(other, "avg_jct_s"), series(other, "p99_jct_s")
    zeros = [0.0] * len(avg)
    return PairedComparison(
        avg_reduction=paired_ci95(relative_reductions(ref_avg, avg), zeros),
        avg_difference_s=paired_ci95(avg, ref_avg),
        p99_reduction=paired_ci95(relative_reductions(ref_p99, p99), zeros),
        wins=sum(r < o for r, o in zip(ref_avg, avg, strict=True)),
    )


def paired_comparisons(runs: SeededRuns, reference: str = "frenzy") -> dict[str, PairedComparison]:
    """``reference`` against every other policy that ran on every sample (:func:`paired`); empty without
    the reference."""
    names = runs.policies()
    if reference not in names:
        return {}
    return {name: paired(runs, reference, name) for name in names if name != reference}
