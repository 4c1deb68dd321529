"""The Markdown of one section of ``frenzy compare``'s report (:mod:`frenzy_opt.research.report` runs the
sections and assembles the page): per scenario or workload set the metrics of every policy as mean ± 95 %
confidence half-width over the samples (:mod:`frenzy_opt.research.experiment`), restarts per job, frenzy against
each policy paired by sample, the proven lower bound, the per-model breakdown, the samples themselves and
figures of the first; the sensitivity table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from frenzy_opt.research.compare import Variant, per_model_jct, restart_stats, variant_key
from frenzy_opt.research.experiment import SeededRuns, compare_metrics, paired, paired_comparisons, seeded_payload
from frenzy_opt.research.stats import PairedDifference, ci95_half_width, mean
from frenzy_opt.simulation.simulator import Failures
from frenzy_opt.simulation.tracemap import REQUEST_POLICIES, describe_requests
from frenzy_opt.simulation.truth import TruthKind, TruthSpec

# The honest labels of the two kinds of workload (docs/simulator.md, Comparison protocol).
LLM_LABEL = "synthetic LLM mix (Philly-mapped)"
OWN_LABEL = "the scenario's own jobs"
SIA_LABEL = "Sia's traces (profiled truth)"


def _h(seconds: object) -> str:
    return "-" if not isinstance(seconds, int | float) or math.isnan(seconds) else f"{seconds / 3600:.2f}"


def _h_ci(seconds: object, ci: object) -> str:
    return _h(seconds) + ("" if not isinstance(ci, int | float) else f" ± {ci / 3600:.2f}")


def _ms(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.3g}"


def pct_ci(d: PairedDifference) -> str:
    return f"{d.mean:+.1%}" + ("" if d.half_width is None else f" ± {d.half_width:.1%}")


def ci_excludes_zero(d: PairedDifference) -> str:
    if d.half_width is None:
        return "- (one sample)"
    if not d.excludes_zero:
        return "no"
    return "yes, frenzy lower" if d.mean > 0 else "yes, frenzy higher"


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


def _samples(runs: SeededRuns) -> str:
    if runs.labels:
        return f"{len(runs.labels)} workload files ({', '.join(runs.labels)})"
    if len(runs.seeds) == 1:
        return f"1 seed ({runs.seeds[0]})"
    return f"{len(runs.seeds)} seeds ({runs.seeds[0]}…{runs.seeds[-1]})"


def _metrics_table(payload: dict[str, dict[str, Any]], runs: SeededRuns) -> list[str]:
    fallback = runs.truth.kind == TruthKind.PROFILED and not runs.labels
    header = (
        "| policy | avg JCT h | p50 JCT h | p99 JCT h | makespan h | utilization | decisions | mean decision ms "
        "| p99 decision ms | restarts | restarts per job (mean, max) | failures | sim wall s |"
        + (" model fallback |" if fallback else "")
    )
    lines = [header, "|---" + "|---:" * (header.count("|") - 2) + "|"]
    for name, m in payload.items():
        per_job = restart_stats(runs, name)
        row = (
            f"| {name} | {_h_ci(m['avg_jct_s'], m['avg_jct_ci95_s'])} | {_h(m['p50_jct_s'])} "
            f"| {_h_ci(m['p99_jct_s'], m['p99_jct_ci95_s'])} | {_h(m['makespan_s'])} | {float(m['utilization']):.1%} "
            f"| {m['num_decisions']:.0f} | {_ms(m['mean_decision_ms'])} | {_ms(m['p99_decision_ms'])} "
            f"| {m['restarts']:.0f} | {per_job.mean:.2f}, {per_job.max} | {m['failures']:.0f} "
            f"| {float(m['sim_wall_s']):.1f} |"
        )
        if fallback:
            row += f" {float(m['truth_fallback_gpu_share']):.0%} |"
        lines.append(row)
    for name, reason in runs.first.skipped.items():
        lines.append(f"| {name} | skipped: {reason} |" + " |" * (header.count("|") - 3))
    return lines


def _versus_table(payload: dict[str, dict[str, Any]], runs: SeededRuns) -> list[str]:
    versus = compare_metrics(payload)
    pairs = paired_comparisons(runs)
    if not versus:
        return []
    n = len(runs.experiments)
    lines = [
        "",
        "`frenzy` against each policy (positive = frenzy lower). *On the means*: 1 − frenzy's mean / the other's; "
        "*paired*: per sample 1 − frenzy's / the other's, mean ± Student-t 95 % half-width over the samples, and "
        "the per-sample difference of average JCT (the other's − frenzy's) in hours; ratio = the other's mean "
        "decision time over frenzy's; wins = samples in which frenzy's average JCT is lower.",
        "",
        "| vs | avg JCT reduction on the means | avg JCT reduction, paired | CI excludes 0 | avg JCT difference h, "
        "paired | p99 JCT reduction on the means | p99 JCT reduction, paired | decision time ratio | wins |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, c in versus.items():
        p = pairs[name]
        diff = p.avg_difference_s
        lines.append(
            f"| {name} | {c['avg_jct_reduction']:+.1%} | {pct_ci(p.avg_reduction)} "
            f"| {ci_excludes_zero(p.avg_reduction)} | {_h_ci(diff.mean, diff.half_width)} "
            f"| {c['p99_jct_reduction']:+.1%} | {pct_ci(p.p99_reduction)} "
            f"| {c['decision_time_ratio']:.3g}x | {p.wins}/{n} |"
        )
    return lines


def _per_model_table(runs: SeededRuns, policies: Sequence[str]) -> list[str]:
    table = per_model_jct(runs, policies)
    if not table:
        return []
    pooled = "every workload file" if runs.labels else "every seed"
    lines = [
        "",
        f"Average JCT per model (h; the jobs of each model pooled over {pooled}; `jobs` = that pool's size):",
        "",
        "| model | jobs | " + " | ".join(policies) + " |",
        "|---|---:|" + "---:|" * len(policies),
    ]
    for model, by_policy in table.items():
        count = max(n for _, n in by_policy.values())
        cells = [_h(by_policy[p][0]) if p in by_policy else "-" for p in policies]
        lines.append(f"| {model} | {count} | " + " | ".join(cells) + " |")
    return lines


def _per_sample_table(runs: SeededRuns, policies: Sequence[str]) -> list[str]:
    names = runs.labels or [str(s) for s in runs.seeds]
    lines = [
        "",
        "Average JCT per sample (h):",
        "",
        f"| {'workload' if runs.labels else 'seed'} | " + " | ".join(policies) + " |",
        "|---|" + "---:|" * len(policies),
    ]
    for name, experiment in zip(names, runs.experiments, strict=True):
        cells = [_h(experiment.results[p].metrics()["avg_jct_s"]) for p in policies]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def report_section(
    runs: SeededRuns, figures: list[Path], report_dir: Path, failures: Failures | None = None, label: str = ""
) -> list[str]:
    """Markdown for one scenario or workload set (``label`` appended to its title): metrics per policy,
    frenzy vs each paired by sample, heuristic vs optimal, per model, per sample, figures."""
    payload = seeded_payload(runs)
    build = sum(e.build_s for e in runs.experiments)
    lines = [
        _title(runs, failures, label),
        "",
        f"{_samples(runs)}; {runs.description or describe_truth(runs.truth)}. Values are means over the samples, "
        f"± the Student-t 95 % half-width. Jobs built (workload mapped, plans searched) in {build:.1f} s over all "
        "samples; sim wall s is per sample; restarts per job pool every job of every sample.",
        "",
        *_requests_line(runs, payload),
        *_metrics_table(payload, runs),
        *_versus_table(payload, runs),
    ]
    lines += _bound_lines(runs, payload)
    lines += _per_model_table(runs, list(payload))
    lines += _per_sample_table(runs, list(payload))
    lines += [""]
    for path in figures:
        rel = path.relative_to(report_dir) if path.is_relative_to(report_dir) else path
        lines.append(f"![{path.stem}]({rel.as_posix()})")
    lines.append("")
    return lines


def _requests_line(runs: SeededRuns, payload: dict[str, dict[str, Any]]) -> list[str]:
    """What the request-running baselines were given (the first sample's jobs), when one of them ran."""
    if not any(name.split(" ")[0] in REQUEST_POLICIES for name in payload):
        return []
    return [describe_requests([job.request for job in runs.first.jobs]) + " (the first sample's jobs).", ""]


def _bound_lines(runs: SeededRuns, payload: dict[str, dict[str, Any]]) -> list[str]:
    """The proven lower bound on the average JCT (solvers/jctbound.py) and each policy's distance from it."""
    bounds = [e.bound.avg_jct_s if e.bound is not None else None for e in runs.experiments]
    if not bounds or any(b is None for b in bounds):
        if any(e.bound is not None for e in runs.experiments):
            return ["", "Lower bound: the LP was not solved to optimality on every sample (no bound stated)."]
        return []
    values = [float(b) for b in bounds if b is not None]
    slots = [e.bound.slots for e in runs.experiments if e.bound is not None]
    lines = [
        "",
        f"Lower bound on the average JCT of any policy, preemptive or not, knowing every arrival and true step "
        f"time (LP relaxation, `solvers/jctbound.py`): {_h_ci(mean(values), ci95_half_width(values))}, on "
        f"{min(slots)}-{max(slots)} time slots (fewer slots, a looser bound). Each policy's mean distance above "
        "it, sample by sample:",
        "",
        "| policy | above the bound |",
        "|---|---:|",
    ]
    for name in payload:
        pairs = zip(runs.experiments, values, strict=True)
        gaps = [float(e.results[name].metrics()["avg_jct_s"]) / bound - 1 for e, bound in pairs]
        half = ci95_half_width(gaps)
        spread = f" ± {100 * half:.1f}" if half is not None else ""
        lines.append(f"| {name} | {100 * mean(gaps):+.1f} %{spread} |")
    return lines


# --- sensitivity ---------------------------------------------------------------------------------------


def sensitivity_section(runs: SeededRuns, variants: Sequence[Variant], policies: Sequence[str]) -> list[str]:
    """One row per variant: each policy's average JCT (± half-width), decisions and restarts per job, and
    frenzy against each other policy of the same variant, paired by seed."""
    sc = runs.first.scenario
    others = [p for p in policies if p != "frenzy"]
    header = "| variant | " + " | ".join(f"{p} avg JCT h" for p in policies)
    header += " | " + " | ".join(f"{p} decisions, restarts per job" for p in policies)
    header += "".join(f" | frenzy vs {p}, paired" for p in others if "frenzy" in policies) + " |"
    lines = [
        f"## Sensitivity on {sc.name} — {LLM_LABEL}, {len(runs.first.jobs)} jobs on {sc.cluster.name}",
        "",
        f"{_samples(runs)}; {describe_truth(runs.truth)}. Every variant replays the same jobs and truth draws. "
        "`rounds R s` sets `round_s` = R for both sia and gavel (defaults: sia 60 s, gavel 360 s); `restarts xF` "
        "multiplies every job's restart cost (docs/simulator.md, Restarts) by F. Values are means ± the "
        "Student-t 95 % half-width over the seeds; frenzy vs p = per seed 1 − frenzy's / p's average JCT.",
        "",
        header,
        "|---" + "|---:" * (header.count("|") - 2) + "|",
    ]
    payload = seeded_payload(runs)
    for variant in variants:
        keys = {p: variant_key(p, variant) for p in policies}
        cells = [_h_ci(payload[k]["avg_jct_s"], payload[k]["avg_jct_ci95_s"]) for k in keys.values()]
        cells += [f"{payload[k]['num_decisions']:.0f}, {restart_stats(runs, k).mean:.2f}" for k in keys.values()]
        if "frenzy" in policies:
            cells += [pct_ci(paired(runs, keys["frenzy"], keys[p]).avg_reduction) for p in others]
        lines.append(f"| {variant.label} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines
