"""Experiments over the simulator: run several policies on one scenario (``frenzy simulate``) and write the
policy-vs-policy and heuristic-vs-optimal report (``frenzy compare``).

Every policy of one experiment replays the same jobs (one :class:`~frenzy_opt.problem.OptionCache`: the same
plans, step times and requests), so their numbers compare.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frenzy_opt.machine import describe_machine
from frenzy_opt.problem import OptionCache
from frenzy_opt.scenario import Scenario, load_scenario
from frenzy_opt.simplot import plot_jct_cdf, plot_sim_gantt, plot_utilization
from frenzy_opt.simulator import Failures, SimJob, SimResult, SimulationError, Simulator, sim_jobs
from frenzy_opt.solvers.policies import make_policy, policy_names
from frenzy_opt.topology import Topology

DEFAULT_COMPARE_SCENARIOS = ("paper3type-llm", "sia64-llm", "cluster2048-llm")
DEFAULT_COMPARE_POLICIES = ("frenzy", "fifo", "sia", "gavel", "optimal")
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
    """Policies that could not run here, with the reason (e.g. ``optimal`` beyond its size limit)."""
    build_s: float = 0.0


def parse_policies(text: str) -> list[str]:
    """``frenzy,sia`` -> names; ``ValueError`` names an unknown policy and lists the known ones."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise ValueError(f"--policy: give one or more of {', '.join(policy_names())}, comma-separated")
    unknown = [n for n in names if n not in policy_names()]
    if unknown:
        raise ValueError(f"--policy: unknown {', '.join(unknown)}; allowed: {', '.join(policy_names())}")
    return list(dict.fromkeys(names))


def prepare(scenario: Scenario | str) -> Experiment:
    """Load a scenario and build its jobs once (workload expanded, plans searched, requests made)."""
    started = time.perf_counter()
    if isinstance(scenario, str):
        scenario = load_scenario(scenario)
    topology = Topology(scenario.cluster)
    jobs, topology = sim_jobs(scenario, OptionCache(scenario.cluster, topology))
    return Experiment(scenario=scenario, topology=topology, jobs=jobs, build_s=time.perf_counter() - started)


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
            sim = Simulator(experiment.topology, experiment.jobs, policy, failures=failures, progress=report)  # type: ignore[arg-type]
            experiment.results[name] = sim.run()
        except SimulationError as err:
            if not skip_infeasible or name != "optimal":
                raise
            experiment.skipped[name] = str(err)
    return experiment


def policy_payload(result: SimResult) -> dict[str, Any]:
    """Contract 3's per-policy keys (NaN, e.g. no finished job, as null)."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.metrics().items()}


def comparisons(results: dict[str, SimResult], reference: str = "frenzy") -> dict[str, dict[str, float]]:
    """``reference`` against every other policy: relative avg/p99 JCT reduction (positive = reference
    better) and the ratio of mean decision times (other / reference)."""
    if reference not in results:
        return {}
    ref = results[reference].metrics()
    out = {}
    for name, result in results.items():
        if name == reference:
            continue
        other = result.metrics()
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


# --- the comparison report ----------------------------------------------------------------------------


def _h(seconds: object) -> str:
    return "-" if not isinstance(seconds, int | float) or math.isnan(seconds) else f"{seconds / 3600:.2f}"


def _ms(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.3g}"


def report_section(
    experiment: Experiment, figures: list[Path], report_dir: Path, failures: Failures | None = None
) -> list[str]:
    """Markdown for one scenario: metrics per policy, frenzy vs each, heuristic vs optimal, figures."""
    sc = experiment.scenario
    title = sc.name
    if failures is not None:
        title += (
            f" with node failures (MTBF {failures.node_mtbf_h:g} h per node, repair {failures.repair_s:g} s, "
            f"checkpoints every {failures.checkpoint_interval_s:g} s, seed {failures.seed})"
        )
    lines = [
        f"## {title} — {len(experiment.jobs)} jobs on {sc.cluster.name} ({sc.cluster.num_gpus} GPUs: "
        + ", ".join(f"{experiment.topology.num_gpus_of(t)} x {t}" for t in experiment.topology.gpu_types)
        + ")",
        "",
        f"Jobs built (workload mapped, plans searched) in {experiment.build_s:.1f} s.",
        "",
        "| policy | avg JCT h | p50 JCT h | p99 JCT h | makespan h | utilization | decisions | mean decision ms "
        "| p99 decision ms | restarts | failures | sim wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in experiment.results.items():
        m = result.metrics()
        lines.append(
            f"| {name} | {_h(m['avg_jct_s'])} | {_h(m['p50_jct_s'])} | {_h(m['p99_jct_s'])} | {_h(m['makespan_s'])} "
            f"| {float(m['utilization']):.1%} | {m['num_decisions']} | {_ms(m['mean_decision_ms'])} "
            f"| {_ms(m['p99_decision_ms'])} | {m['restarts']} | {m['failures']} | {float(m['sim_wall_s']):.1f} |"
        )
    for name, reason in experiment.skipped.items():
        lines.append(f"| {name} | skipped: {reason} | | | | | | | | | | |")
    versus = comparisons(experiment.results)
    if versus:
        lines += [
            "",
            "`frenzy` against each policy (positive = frenzy lower; ratio = the other's mean decision time over "
            "frenzy's):",
            "",
            "| vs | avg JCT reduction | p99 JCT reduction | decision time ratio |",
            "|---|---:|---:|---:|",
        ]
        for name, c in versus.items():
            lines.append(
                f"| {name} | {c['avg_jct_reduction']:+.1%} | {c['p99_jct_reduction']:+.1%} "
                f"| {c['decision_time_ratio']:.3g}x |"
            )
    if "optimal" in experiment.results and "frenzy" in experiment.results:
        opt = experiment.results["optimal"].metrics()
        fr = experiment.results["frenzy"].metrics()
        gap = float(fr["avg_jct_s"]) / float(opt["avg_jct_s"]) - 1
        lines += [
            "",
            f"Heuristic vs optimal: the greedy HAS's average JCT is {gap:+.1%} from the offline CP-SAT schedule "
            f"of the same options (non-preemptive, all arrivals known; CP-SAT's schedule is optimal only where it "
            f"proved it within its time limit).",
        ]
    lines += [""]
    for path in figures:
        rel = path.relative_to(report_dir) if path.is_relative_to(report_dir) else path
        lines.append(f"![{path.stem}]({rel.as_posix()})")
    lines.append("")
    return lines


def write_report(
    scenarios: Sequence[str],
    policies: Sequence[str],
    out: Path,
    *,
    progress: Progress | None = None,
    command: str = "",
    failures: tuple[str, Failures] | None = DEFAULT_FAILURES,
) -> Path:
    """Run every policy on every scenario and write the Markdown report ``out`` (figures next to it, in
    ``<out stem>/``)."""
    figures_dir = out.parent / out.stem
    lines = [
        "# Policy comparison: frenzy vs fifo, sia, gavel and the offline optimum",
        "",
        f"Regenerate: `{command or 'frenzy compare'}`. Machine: {describe_machine()}.",
        "",
        "Policies (docs/simulator.md): `frenzy` = MARP plans + greedy HAS (online, non-preemptive); `fifo` = the "
        "users' own requests, FIFO per GPU type; `sia` = Sia's goodput ILP every 60 s (elastic, preemptive); "
        "`gavel` = max-sum-throughput time shares, 360 s rounds (rigid, preemptive); `optimal` = the offline "
        "CP-SAT schedule (clairvoyant, non-preemptive), tried on scenarios of up to 60 jobs. Scheduling overhead "
        "= wall time of each decision on this machine.",
        "",
    ]
    for name in scenarios:
        experiment = run_policies(prepare(name), policies, progress=progress, skip_infeasible=True)
        figures = write_plots(experiment, figures_dir)
        lines += report_section(experiment, figures, out.parent)
    if failures is not None:
        name, spec = failures
        experiment = run_policies(
            prepare(name), [p for p in policies if p != "optimal"], failures=spec, progress=progress
        )
        lines += report_section(experiment, [], out.parent, failures=spec)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    return out
