"""The policy comparison report of ``frenzy compare`` (``benchmarks/results/compare.md``): per scenario the
metrics of every policy as mean ± 95 % confidence half-width over seeds (:mod:`frenzy_opt.experiment`),
frenzy against each policy, the heuristic against the offline optimum, and figures of the first seed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from frenzy_opt.experiment import (
    DEFAULT_FAILURES,
    Progress,
    SeededRuns,
    compare_metrics,
    run_seeds,
    seeded_payload,
    write_plots,
)
from frenzy_opt.machine import describe_machine
from frenzy_opt.simulator import Failures
from frenzy_opt.truth import TruthKind, TruthSpec

POLICY_TEXT = (
    "Policies (docs/simulator.md): `frenzy` = MARP plans + greedy HAS (online, non-preemptive), planning with its "
    "own predicted step times; `fifo` = the users' own requests, FIFO per GPU type; `sia` = Sia's goodput ILP every "
    "60 s (elastic, preemptive); `gavel` = max-sum-throughput time shares, 360 s rounds (rigid, preemptive) — both "
    "know a job's true speed on a (GPU type, count) once it has run there, the model's prediction before; "
    "`optimal` = the offline CP-SAT schedule of the predicted durations (clairvoyant of arrivals, "
    "non-preemptive), tried on scenarios of up to 60 jobs; `-oracle` = the policy told every true step time "
    "(not a real policy: what its prediction errors cost it). Scheduling overhead = wall time of each "
    "decision on this machine."
)


def _h(seconds: object) -> str:
    return "-" if not isinstance(seconds, int | float) or math.isnan(seconds) else f"{seconds / 3600:.2f}"


def _h_ci(seconds: object, ci: object) -> str:
    return _h(seconds) + ("" if not isinstance(ci, int | float) else f" ± {ci / 3600:.2f}")


def _ms(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.3g}"


def describe_truth(spec: TruthSpec) -> str:
    """One sentence on the truth the runs used (docs/simulator.md, Truth)."""
    if spec.kind == TruthKind.MODEL:
        return "truth `model`: jobs advance at the step-time model's predicted step time (no prediction error)"
    info = spec.describe()
    if spec.kind == TruthKind.NOISY:
        return (
            f"truth `noisy`: predicted step time x exp(r), r resampled per (seed, job, GPU type) from "
            f"{info['num_residuals']} cross-validated log residuals of the step-time model ({info['residuals_source']})"
        )
    return (
        f"truth `profiled`: measured speed ratios of `{info['application']}` (batch {info['batch_size']:g}) from "
        f"`{info['profiles']}`, anchored on each job's request; configurations without a measurement use the "
        "model's prediction (their share of GPU time in the table)"
    )


def _title(runs: SeededRuns, failures: Failures | None, label: str) -> str:
    first = runs.first
    sc = first.scenario
    title = sc.name + label
    if failures is not None:
        title += (
            f" with node failures (MTBF {failures.node_mtbf_h:g} h per node, repair {failures.repair_s:g} s, "
            f"checkpoints every {failures.checkpoint_interval_s:g} s, failure seeds {failures.seed}…)"
        )
    types = ", ".join(f"{first.topology.num_gpus_of(t)} x {t}" for t in first.topology.gpu_types)
    return f"## {title} — {len(first.jobs)} jobs on {sc.cluster.name} ({sc.cluster.num_gpus} GPUs: {types})"


def _metrics_table(payload: dict[str, dict[str, Any]], runs: SeededRuns) -> list[str]:
    fallback = runs.truth.kind == TruthKind.PROFILED
    header = (
        "| policy | avg JCT h | p50 JCT h | p99 JCT h | makespan h | utilization | decisions | mean decision ms "
        "| p99 decision ms | restarts | failures | sim wall s |" + (" model fallback |" if fallback else "")
    )
    lines = [header, "|---" + "|---:" * (header.count("|") - 2) + "|"]
    for name, m in payload.items():
        row = (
            f"| {name} | {_h_ci(m['avg_jct_s'], m['avg_jct_ci95_s'])} | {_h(m['p50_jct_s'])} "
            f"| {_h_ci(m['p99_jct_s'], m['p99_jct_ci95_s'])} | {_h(m['makespan_s'])} | {float(m['utilization']):.1%} "
            f"| {m['num_decisions']:.0f} | {_ms(m['mean_decision_ms'])} | {_ms(m['p99_decision_ms'])} "
            f"| {m['restarts']:.0f} | {m['failures']:.0f} | {float(m['sim_wall_s']):.1f} |"
        )
        if fallback:
            row += f" {float(m['truth_fallback_gpu_share']):.0%} |"
        lines.append(row)
    for name, reason in runs.first.skipped.items():
        lines.append(f"| {name} | skipped: {reason} |" + " |" * (header.count("|") - 3))
    return lines


def _wins(runs: SeededRuns, name: str) -> int:
    """Seeds in which frenzy's average JCT is lower than policy ``name``'s."""
    return sum(
        float(e.results["frenzy"].metrics()["avg_jct_s"]) < float(e.results[name].metrics()["avg_jct_s"])
        for e in runs.experiments
    )


def report_section(
    runs: SeededRuns, figures: list[Path], report_dir: Path, failures: Failures | None = None, label: str = ""
) -> list[str]:
    """Markdown for one scenario (``label`` appended to its title): metrics per policy, frenzy vs each,
    heuristic vs optimal, figures."""
    payload = seeded_payload(runs)
    n = len(runs.seeds)
    build = sum(e.build_s for e in runs.experiments)
    lines = [
        _title(runs, failures, label),
        "",
        f"{n} seeds ({runs.seeds[0]}…{runs.seeds[-1]}); {describe_truth(runs.truth)}. Values are means over the "
        f"seeds, ± the Student-t 95 % half-width. Jobs built (workload mapped, plans searched) in {build:.1f} s "
        "over all seeds; sim wall s is per seed.",
        "",
        *_metrics_table(payload, runs),
    ]
    versus = compare_metrics(payload)
    if versus:
        lines += [
            "",
            "`frenzy` against each policy, on the means (positive = frenzy lower; ratio = the other's mean decision "
            "time over frenzy's; wins = seeds in which frenzy's average JCT is lower):",
            "",
            "| vs | avg JCT reduction | p99 JCT reduction | decision time ratio | wins |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, c in versus.items():
            lines.append(
                f"| {name} | {c['avg_jct_reduction']:+.1%} | {c['p99_jct_reduction']:+.1%} "
                f"| {c['decision_time_ratio']:.3g}x | {_wins(runs, name)}/{n} |"
            )
    if "optimal" in payload and "frenzy" in payload:
        gap = float(payload["frenzy"]["avg_jct_s"]) / float(payload["optimal"]["avg_jct_s"]) - 1
        lines += [
            "",
            f"Heuristic vs optimal: the greedy HAS's mean average JCT is {gap:+.1%} from the offline CP-SAT schedule "
            f"of the same options (non-preemptive, all arrivals known, planned on predicted durations; CP-SAT's "
            f"schedule is optimal only where it proved it within its time limit).",
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
    truth: TruthSpec | None = None,
    seeds: int = 1,
    progress: Progress | None = None,
    command: str = "",
    failures: tuple[str, Failures] | None = DEFAULT_FAILURES,
    extra: Sequence[tuple[str, TruthSpec]] = (),
) -> Path:
    """Run every policy on every scenario for ``seeds`` seeds under ``truth`` and write the Markdown report
    ``out`` (figures of the first seed next to it, in ``<out stem>/``); then the failure experiment, then
    each ``extra`` (scenario, truth) section."""
    spec = truth if truth is not None else TruthSpec()
    figures_dir = out.parent / out.stem
    lines = [
        "# Policy comparison: frenzy vs fifo, sia, gavel and the offline optimum",
        "",
        f"Regenerate: `{command or 'frenzy compare'}`. Machine: {describe_machine()}.",
        "",
        POLICY_TEXT,
        "",
    ]
    for name in scenarios:
        runs = run_seeds(name, policies, seeds=seeds, truth=spec, progress=progress, skip_infeasible=True)
        lines += report_section(runs, write_plots(runs.first, figures_dir), out.parent)
    if failures is not None:
        name, failure_spec = failures
        runs = run_seeds(
            name, [p for p in policies if p != "optimal"], seeds=seeds, truth=spec, failures=failure_spec,
            progress=progress,
        )  # fmt: skip
        lines += report_section(runs, [], out.parent, failures=failure_spec)
    for name, extra_spec in extra:
        runs = run_seeds(name, policies, seeds=seeds, truth=extra_spec, progress=progress, skip_infeasible=True)
        first = runs.first
        renamed = replace(first, scenario=replace(first.scenario, name=f"{first.scenario.name}-{extra_spec.kind}"))
        figures = write_plots(renamed, figures_dir)
        lines += report_section(runs, figures, out.parent, label=f" under the {extra_spec.kind} truth")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    return out
