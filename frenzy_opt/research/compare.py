"""The comparison protocol of ``frenzy compare`` beyond one scenario under one truth (docs/simulator.md,
Comparison protocol): Sia's own workload files replayed as samples, the regimes and sensitivity variants,
and what the report tabulates per job — restarts per job and the average JCT per model.

* **Sia's traces** (:func:`run_sia_workloads`): each workload file of a set (``philly``, ``saturn``) is one
  sample, replayed with Sia's tables as the truth (:mod:`frenzy_opt.simulation.siareplay`); the set's files play the
  role of the seeds, so the report's means, intervals and paired differences are over workloads.
* **Sensitivity** (:func:`run_sensitivity`): the same seeds (same jobs, same truth draws) replayed under
  :class:`Variant` s — another round length for ``sia`` and ``gavel`` (``round_s``, as a scenario's
  ``policies`` section would set it) or every job's restart cost scaled (``SimJob.restart_s`` and
  ``startup_s`` times a factor; the simulator's cost model itself is unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.scenario import Scenario, load_scenario
from frenzy_opt.research.experiment import Experiment, Progress, SeededRuns, run_policies, run_seeds
from frenzy_opt.simulation.siareplay import load_sia_replay
from frenzy_opt.simulation.simulator import SimJob, SimResult, Simulator
from frenzy_opt.simulation.throughputs import read_sia_profiles
from frenzy_opt.simulation.truth import SIA_TABLES, TruthKind, TruthSpec
from frenzy_opt.solvers.base import make_policy

SIA_WORKLOADS = SIA_TABLES.parent / "workloads"
"""Sia's workload files (``../shared/traces/sia-heterogeneous/workloads/<set>/workload-<k>.csv``)."""
# The report's sets of Sia's workloads: Sia's evaluation traces (SOSP 2023 §6.1: Philly-derived and
# Saturn-derived, 160 jobs each on the 64-GPU cluster), every file of each.
DEFAULT_SIA_SETS = ("philly", "saturn")
DEFAULT_SIA_CLUSTER = "sia-64"
# The policies' default round lengths (seconds): the round_s defaults of solvers/sia.py (SiaPolicy) and
# solvers/gavel.py (GavelPolicy, "Gavel's default" there); tests/test_compare.py checks they agree.
DEFAULT_ROUND_S = {"sia": 60.0, "gavel": 360.0}
# Round lengths of the sensitivity (seconds): those two defaults and the neighbours that halve and double Sia's.
DEFAULT_ROUNDS_S = (30.0, 60.0, 120.0, 360.0)
# Restart-cost factors of the sensitivity: Sia measured 25-250 s per model (SOSP 2023 §5), a 10x range, and
# storage differs more between clusters; half and double our per-job estimate (planning/restart.py) bracket it.
DEFAULT_RESTART_SCALES = (0.5, 2.0)
DEFAULT_SENSITIVITY_SCENARIO = "sia64-llm"
DEFAULT_SENSITIVITY_SEEDS = 4
DEFAULT_SENSITIVITY_POLICIES = ("frenzy", "sia", "gavel")
# The hour-long-job regime: the synthetic LLM scenarios without duration shortening (scenarios/*-hours.yaml;
# cluster2048-llm already runs unshortened).
DEFAULT_HOURS_SCENARIOS = ("paper3type-llm-hours", "sia64-llm-hours")


def sia_workload_files(name: str, root: Path = SIA_WORKLOADS) -> list[Path]:
    """The workload files of set ``name`` under ``root``, in numeric order (workload-2 before workload-10)."""
    folder = root / name
    files = sorted(folder.glob("workload-*.csv"), key=lambda p: (len(p.stem), p.stem))
    if not files:
        raise ValueError(f"sia workloads: no workload-*.csv in {folder}")
    return files


def run_sia_workloads(
    files: Sequence[Path],
    policies: Sequence[str],
    *,
    cluster: ClusterSpec,
    traces_root: Path = SIA_TABLES,
    label: str = "sia",
) -> SeededRuns:
    """Every policy on every workload file (one sample each, module docstring); ``optimal`` is skipped
    where it cannot run (160 jobs exceed its size limit)."""
    table = read_sia_profiles(traces_root)
    topology = Topology(cluster)
    runs = SeededRuns(
        seeds=[],
        experiments=[],
        truth=TruthSpec(kind=TruthKind.PROFILED),
        labels=[],
        description=(
            f"Sia's workload files replayed with Sia's tables `{traces_root}` as the truth (docs/simulator.md, "
            "Replaying Sia's own benchmark); one sample per workload file"
        ),
    )
    for k, path in enumerate(files):
        jobs, truth = load_sia_replay(path, table, traces_root, topology)
        scenario = Scenario(name=label, cluster=cluster, jobs=())
        experiment = Experiment(scenario=scenario, topology=topology, jobs=jobs, truth=truth)
        run_policies(experiment, policies, skip_infeasible=True)
        runs.seeds.append(k)
        runs.labels.append(path.stem)
        runs.experiments.append(experiment)
    return runs


# --- sensitivity ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    """One setting of the sensitivity: per-policy keyword settings and a restart-cost factor."""

    label: str
    settings: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    restart_scale: float = 1.0


def sensitivity_variants(
    rounds_s: Sequence[float] = DEFAULT_ROUNDS_S, restart_scales: Sequence[float] = DEFAULT_RESTART_SCALES
) -> list[Variant]:
    """The defaults (:data:`DEFAULT_ROUND_S`, restart costs as modelled), then one variant per round length
    (``sia`` and ``gavel`` both), then one per restart factor (at the default rounds)."""
    defaults = {name: {"round_s": r} for name, r in DEFAULT_ROUND_S.items()}
    variants = [Variant(label="defaults", settings=defaults)]
    for r in rounds_s:
        if not r > 0:
            raise ValueError(f"--rounds-s: round lengths must be > 0, got {r:g}")
        variants.append(Variant(label=f"rounds {r:g} s", settings={"sia": {"round_s": r}, "gavel": {"round_s": r}}))
    for s in restart_scales:
        if not s >= 0:
            raise ValueError(f"--restart-scales: factors must be >= 0, got {s:g}")
        variants.append(Variant(label=f"restarts x{s:g}", settings=defaults, restart_scale=s))
    return variants


def scaled_restarts(jobs: Sequence[SimJob], factor: float) -> list[SimJob]:
    """The jobs with their restart cost (and first-start stall) times ``factor``."""
    return [replace(j, restart_s=j.restart_s * factor, startup_s=j.startup_s * factor) for j in jobs]


def variant_key(policy: str, variant: Variant) -> str:
    """The name a variant's run of ``policy`` has in the experiments' results."""
    return f"{policy} [{variant.label}]"


def _settings(experiment: Experiment, policy: str, variant: Variant) -> dict[str, object]:
    return {**dict(experiment.scenario.settings).get(policy, {}), **variant.settings.get(policy, {})}


def run_variant(experiment: Experiment, policy: str, variant: Variant) -> SimResult:
    """Replay the experiment's jobs (restart costs scaled) under ``policy`` with the scenario's settings
    overridden by the variant's; stored under :func:`variant_key`."""
    jobs = experiment.jobs if variant.restart_scale == 1.0 else scaled_restarts(experiment.jobs, variant.restart_scale)
    policy_object = make_policy(policy, **_settings(experiment, policy, variant))
    sim = Simulator(experiment.topology, jobs, policy_object, truth=experiment.truth)  # type: ignore[arg-type]
    result = experiment.results[variant_key(policy, variant)] = sim.run()
    return result


def run_sensitivity(
    scenario: Scenario | str,
    variants: Sequence[Variant],
    *,
    policies: Sequence[str] = DEFAULT_SENSITIVITY_POLICIES,
    seeds: int = DEFAULT_SENSITIVITY_SEEDS,
    truth: TruthSpec | None = None,
    progress: Progress | None = None,
) -> SeededRuns:
    """Every variant of every policy on the same ``seeds`` experiments (same jobs and truth draws). A
    variant that gives a policy the same settings and restart factor as an earlier one (``rounds 60 s`` is
    sia's default) reuses that run: the replay is deterministic."""
    if isinstance(scenario, str):
        scenario = load_scenario(scenario)
    runs = run_seeds(scenario, [], seeds=seeds, truth=truth, progress=progress)
    for experiment in runs.experiments:
        done: dict[tuple[str, str, float], SimResult] = {}
        for variant in variants:
            for policy in policies:
                key = (policy, repr(sorted(_settings(experiment, policy, variant).items())), variant.restart_scale)
                if key in done:
                    experiment.results[variant_key(policy, variant)] = done[key]
                else:
                    done[key] = run_variant(experiment, policy, variant)
    return runs


# --- per job and per model -----------------------------------------------------------------------------


def restarts_per_job(result: SimResult) -> dict[str, int]:
    """Every job's restarts: its starts after the first (what ``SimResult.metrics()['restarts']`` sums)."""
    return {job_id: max(state.starts - 1, 0) for job_id, state in result.jobs.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartStats:
    mean: float
    """Restarts per job, over every job of every sample."""
    max: int


def restart_stats(runs: SeededRuns, policy: str) -> RestartStats:
    """Restarts per job of ``policy``, pooled over the samples."""
    counts = [n for e in runs.experiments for n in restarts_per_job(e.results[policy]).values()]
    return RestartStats(mean=sum(counts) / len(counts) if counts else 0.0, max=max(counts, default=0))


def per_model_jct(runs: SeededRuns, policies: Sequence[str]) -> dict[str, dict[str, tuple[float, int]]]:
    """Per model (``SimJob.model``: the catalogue model, or Sia's application), per policy: the mean JCT of
    its finished jobs pooled over every sample, and how many jobs that is; models by name."""
    out: dict[str, dict[str, tuple[float, int]]] = {}
    for policy in policies:
        pooled: dict[str, list[float]] = {}
        for experiment in runs.experiments:
            for state in experiment.results[policy].jobs.values():
                if state.end_s is not None:
                    pooled.setdefault(state.job.model, []).append(state.end_s - state.job.arrival_s)
        for model, jcts in pooled.items():
            out.setdefault(model, {})[policy] = (sum(jcts) / len(jcts), len(jcts))
    return dict(sorted(out.items()))
