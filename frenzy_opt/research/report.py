"""The policy comparison report of ``frenzy compare`` (``benchmarks/results/compare.md``; the protocol is
docs/simulator.md, Comparison protocol). Sections (:class:`Section`): the synthetic LLM mixes under one truth
(``llm``), the failure experiment, a scenario under the profiled truth, the hour-long-job regime, Sia's own
traces and the sensitivity to round length and restart cost. Per section the metrics of every policy as
mean ± 95 % confidence half-width over the samples (:mod:`frenzy_opt.research.experiment`), restarts per job, frenzy
against each policy paired by sample, the per-model breakdown, the samples themselves and figures of the
first; a summary of frenzy against sia opens the report."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from frenzy_opt.core.machine import describe_machine
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.planning.scenario import load_scenario
from frenzy_opt.research.compare import (
    DEFAULT_HOURS_SCENARIOS,
    DEFAULT_SENSITIVITY_POLICIES,
    DEFAULT_SENSITIVITY_SCENARIO,
    DEFAULT_SENSITIVITY_SEEDS,
    Variant,
    per_model_jct,
    restart_stats,
    run_sensitivity,
    run_sia_workloads,
    sensitivity_variants,
    variant_key,
)
from frenzy_opt.research.experiment import (
    DEFAULT_COMPARE_SCENARIOS,
    DEFAULT_FAILURES,
    PairedComparison,
    Progress,
    SeededRuns,
    compare_metrics,
    paired,
    paired_comparisons,
    run_seeds,
    seeded_payload,
    write_plots,
)
from frenzy_opt.research.stats import PairedDifference, ci95_half_width, mean
from frenzy_opt.simulation.simulator import Failures
from frenzy_opt.simulation.tracemap import REQUEST_POLICIES, describe_requests
from frenzy_opt.simulation.truth import SIA_TABLES, TruthKind, TruthSpec

POLICY_TEXT = (
    "Policies (docs/simulator.md): `frenzy` = MARP plans + greedy HAS, planning with the same information as "
    "the others (docs/simulator.md, What each policy knows); `fifo` = the users' own requests, FIFO per GPU "
    "type; `sia` = Sia's goodput ILP every 60 s (elastic, preemptive); `gavel` = max-sum-throughput time shares, "
    "360 s rounds (rigid, preemptive) — both know a job's true speed on a (GPU type, count) once it has run "
    "there, the model's prediction before; `cpsat-offline` = the offline CP-SAT schedule of the predicted durations "
    "(clairvoyant of arrivals, non-preemptive, the best found within its time limit: a heuristic, not a bound), "
    "tried on scenarios of up to 60 jobs; `-oracle` = the policy "
    "told every true step time (not a real policy: what its prediction errors cost it). Scheduling overhead = "
    "wall time of each decision on this machine."
)
# The honest labels of the two kinds of workload (docs/simulator.md, Comparison protocol).
LLM_LABEL = "synthetic LLM mix (Philly-mapped)"
OWN_LABEL = "the scenario's own jobs"
SIA_LABEL = "Sia's traces (profiled truth)"
# The target of issue 12 that the summary checks: frenzy's average JCT at least 20 % below sia's, the paired
# 95 % interval excluding zero, p99 no worse.
TARGET_REDUCTION = 0.20


class Section(StrEnum):
    """The report's sections, in the order they run (``frenzy compare --sections``)."""

    LLM = "llm"
    FAILURES = "failures"
    PROFILED = "profiled"
    HOURS = "hours"
    SIA_TRACES = "sia-traces"
    SENSITIVITY = "sensitivity"


def parse_sections(text: str) -> tuple[Section, ...]:
    """``llm,sia-traces`` -> sections in report order; ``ValueError`` names an unknown one."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    allowed = [s.value for s in Section]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise ValueError(f"--sections: unknown {', '.join(unknown) or '(none given)'}; allowed: {', '.join(allowed)}")
    return tuple(s for s in Section if s.value in names)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareSetup:
    """What ``frenzy compare`` runs (docs/simulator.md, Comparison protocol)."""

    policies: tuple[str, ...]
    sections: tuple[Section, ...] = tuple(Section)
    scenarios: tuple[str, ...] = DEFAULT_COMPARE_SCENARIOS
    """The ``llm`` section's scenarios."""
    truth: TruthSpec = field(default_factory=TruthSpec)
    """The truth of the ``llm``, ``failures``, ``hours`` and ``sensitivity`` sections."""
    seeds: int = 1
    failures: tuple[str, Failures] = DEFAULT_FAILURES
    profiled: tuple[str, TruthSpec] | None = None
    """The ``profiled`` section's scenario and truth (None: skipped, see ``skipped``)."""
    hours: tuple[str, ...] = DEFAULT_HOURS_SCENARIOS
    sia_sets: tuple[tuple[str, tuple[Path, ...]], ...] = ()
    """The ``sia-traces`` section: (set name, workload files) pairs."""
    sia_cluster: ClusterSpec | None = None
    sia_traces_root: Path = SIA_TABLES
    sensitivity_scenario: str = DEFAULT_SENSITIVITY_SCENARIO
    sensitivity_seeds: int = DEFAULT_SENSITIVITY_SEEDS
    sensitivity_policies: tuple[str, ...] = DEFAULT_SENSITIVITY_POLICIES
    variants: tuple[Variant, ...] = field(default_factory=lambda: tuple(sensitivity_variants()))
    skipped: tuple[tuple[Section, str], ...] = ()
    """Sections asked for that cannot run here, with the reason (e.g. Sia's tables absent)."""


def _h(seconds: object) -> str:
    return "-" if not isinstance(seconds, int | float) or math.isnan(seconds) else f"{seconds / 3600:.2f}"


def _h_ci(seconds: object, ci: object) -> str:
    return _h(seconds) + ("" if not isinstance(ci, int | float) else f" ± {ci / 3600:.2f}")


def _ms(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.3g}"


def _pct_ci(d: PairedDifference) -> str:
    return f"{d.mean:+.1%}" + ("" if d.half_width is None else f" ± {d.half_width:.1%}")


def _excludes(d: PairedDifference) -> str:
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
            f"| {name} | {c['avg_jct_reduction']:+.1%} | {_pct_ci(p.avg_reduction)} | {_excludes(p.avg_reduction)} "
            f"| {_h_ci(diff.mean, diff.half_width)} | {c['p99_jct_reduction']:+.1%} | {_pct_ci(p.p99_reduction)} "
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


# --- sensitivity ---------------------------------------------------------------------------------------


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
            cells += [_pct_ci(paired(runs, keys["frenzy"], keys[p]).avg_reduction) for p in others]
        lines.append(f"| {variant.label} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


# --- the report ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Report:
    out: Path
    progress: Progress | None
    lines: list[str] = field(default_factory=list)
    summary: list[tuple[str, int, PairedComparison]] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)

    @property
    def figures_dir(self) -> Path:
        return self.out.parent / self.out.stem

    def add(self, runs: SeededRuns, name: str, *, figures: bool = True, **kwargs: Any) -> None:
        plots = write_plots(runs.first, self.figures_dir) if figures else []
        self.lines += report_section(runs, plots, self.out.parent, **kwargs)
        if {"frenzy", "sia"} <= set(runs.policies()):
            self.summary.append((name, len(runs.experiments), paired(runs, "frenzy", "sia")))


def workload_label(scenario: str) -> str:
    """Where a scenario's jobs come from: generated from the Philly distribution (its ``workload:`` section,
    :data:`LLM_LABEL`), mapped from a trace file's jobs, or written in the scenario file (:data:`OWN_LABEL`)."""
    workload = load_scenario(scenario).workload
    if workload is None:
        return OWN_LABEL
    if workload.trace is not None:
        return f"LLM jobs mapped from the trace {Path(workload.trace).name}"
    return LLM_LABEL


def _run_llm(setup: CompareSetup, report: _Report, scenarios: Sequence[str]) -> None:
    for name in scenarios:
        runs = run_seeds(
            name, setup.policies, seeds=setup.seeds, truth=setup.truth, progress=report.progress,
            skip_infeasible=True, bound=True,
        )  # fmt: skip
        label = f" — {workload_label(name)}, {setup.truth.kind} truth"
        report.add(runs, f"{name} ({setup.truth.kind} truth)", label=label)


def _run_failures(setup: CompareSetup, report: _Report) -> None:
    name, spec = setup.failures
    policies = [p for p in setup.policies if p != "cpsat-offline"]
    runs = run_seeds(name, policies, seeds=setup.seeds, truth=setup.truth, failures=spec, progress=report.progress)
    report.add(runs, f"{name} with node failures", figures=False, failures=spec, label=f" — {LLM_LABEL}")


def _run_profiled(setup: CompareSetup, report: _Report) -> None:
    assert setup.profiled is not None
    name, spec = setup.profiled
    runs = run_seeds(
        name, setup.policies, seeds=setup.seeds, truth=spec, progress=report.progress, skip_infeasible=True,
        bound=True,
    )  # fmt: skip
    first = runs.first
    renamed = replace(first, scenario=replace(first.scenario, name=f"{first.scenario.name}-{spec.kind}"))
    report.lines += report_section(
        runs,
        write_plots(renamed, report.figures_dir),
        report.out.parent,
        label=f" under the {spec.kind} truth — {LLM_LABEL}",
    )
    if {"frenzy", "sia"} <= set(runs.policies()):
        report.summary.append((f"{name} (profiled truth)", len(runs.experiments), paired(runs, "frenzy", "sia")))


def _run_sia_traces(setup: CompareSetup, report: _Report) -> None:
    assert setup.sia_cluster is not None
    for name, files in setup.sia_sets:
        runs = run_sia_workloads(
            files, setup.policies, cluster=setup.sia_cluster, traces_root=setup.sia_traces_root, label=name
        )
        report.lines += report_section(runs, [], report.out.parent, label=f" — {SIA_LABEL}")
        if {"frenzy", "sia"} <= set(runs.policies()):
            report.summary.append((f"Sia's {name} traces", len(runs.experiments), paired(runs, "frenzy", "sia")))


def _run_sensitivity(setup: CompareSetup, report: _Report) -> None:
    runs = run_sensitivity(
        setup.sensitivity_scenario, setup.variants, policies=setup.sensitivity_policies,
        seeds=setup.sensitivity_seeds, truth=setup.truth, progress=report.progress,
    )  # fmt: skip
    report.lines += sensitivity_section(runs, setup.variants, setup.sensitivity_policies)


def _summary(report: _Report) -> list[str]:
    if not report.summary:
        return []
    lines = [
        "## Summary: frenzy against sia",
        "",
        "Per workload set, paired by sample (seed or workload file): 1 − frenzy's / sia's average (and p99) JCT, "
        "mean ± Student-t 95 % half-width. Issue 12's target: average JCT at least "
        f"{TARGET_REDUCTION:.0%} lower with the interval excluding 0, p99 no worse (paired mean ≥ 0).",
        "",
        "| workloads | samples | avg JCT reduction | CI excludes 0 | p99 JCT reduction | wins | target met |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for name, n, c in report.summary:
        met = c.avg_reduction.excludes_zero and c.avg_reduction.mean >= TARGET_REDUCTION and c.p99_reduction.mean >= 0
        lines.append(
            f"| {name} | {n} | {_pct_ci(c.avg_reduction)} | {_excludes(c.avg_reduction)} "
            f"| {_pct_ci(c.p99_reduction)} | {c.wins}/{n} | {'yes' if met else 'no'} |"
        )
    return [*lines, ""]


def planned_runs(setup: CompareSetup) -> dict[Section, int]:
    """Simulations each section will run (samples x policies): the weights of the estimate of the time left
    that :func:`write_report` announces."""
    n = len(setup.policies)
    files = sum(len(f) for _, f in setup.sia_sets)
    return {
        Section.LLM: len(setup.scenarios) * setup.seeds * n,
        Section.FAILURES: setup.seeds * len([p for p in setup.policies if p != "cpsat-offline"]),
        Section.PROFILED: setup.seeds * n,
        Section.HOURS: len(setup.hours) * setup.seeds * n,
        Section.SIA_TRACES: files * n,
        Section.SENSITIVITY: setup.sensitivity_seeds * len(setup.variants) * len(setup.sensitivity_policies),
    }


def write_report(
    setup: CompareSetup,
    out: Path,
    *,
    progress: Progress | None = None,
    command: str = "frenzy compare",
    announce: Callable[[str], None] | None = None,
) -> Path:
    """Run the setup's sections in order and write the Markdown report ``out`` (figures of the first sample
    next to it, in ``<out stem>/``); the summary and each section's wall time open it. ``announce`` hears a
    line as each section starts, with the time spent and an estimate of the time left (the time per
    simulation so far times the simulations left; none before the first section ends)."""
    report = _Report(out=out, progress=progress)
    weights = planned_runs(setup)
    todo = [s for s in setup.sections if s not in dict(setup.skipped)]
    total_runs = max(sum(weights[s] for s in todo), 1)
    done_runs = 0
    began = time.perf_counter()
    runners = {
        Section.LLM: lambda: _run_llm(setup, report, setup.scenarios),
        Section.FAILURES: lambda: _run_failures(setup, report),
        Section.PROFILED: lambda: _run_profiled(setup, report),
        Section.HOURS: lambda: _run_llm(setup, report, setup.hours),
        Section.SIA_TRACES: lambda: _run_sia_traces(setup, report),
        Section.SENSITIVITY: lambda: _run_sensitivity(setup, report),
    }
    skipped = dict(setup.skipped)
    for section in setup.sections:
        if section in skipped:
            report.lines += [f"## Section `{section}` skipped", "", skipped[section], ""]
            continue
        started = time.perf_counter()
        if announce is not None:
            spent = started - began
            left = f", about {spent / done_runs * (total_runs - done_runs) / 60:.0f} min left" if done_runs else ""
            position = f"{todo.index(section) + 1} of {len(todo)}"
            announce(
                f"compare: section {section.value} ({position}, {weights[section]} simulations) starts after "
                f"{spent / 60:.1f} min{left}"
            )
        runners[section]()
        done_runs += weights[section]
        report.timings.append((section.value, time.perf_counter() - started))
    timing = ", ".join(f"`{name}` {s / 60:.1f} min" for name, s in report.timings)
    total = sum(s for _, s in report.timings)
    head = [
        "# Policy comparison: frenzy vs fifo, sia, gavel, an offline CP-SAT schedule and a proven lower bound",
        "",
        f"Regenerate: `{command}`. Machine: {describe_machine()}. Wall time per section: {timing or 'none'} "
        f"(total {total / 60:.1f} min).",
        "",
        f"Labels: *{LLM_LABEL}* = LLM jobs generated from the Philly distribution and mapped "
        f"to catalogue models (docs/simulator.md, Workloads), judged under the stated truth; "
        f"*{SIA_LABEL}* = Sia's own workload files replayed with Sia's measured tables. The protocol "
        "(what each policy knows, seeds, intervals, regimes): docs/simulator.md, Comparison protocol.",
        "",
        POLICY_TEXT,
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join([*head, *_summary(report), *report.lines]), encoding="utf-8")
    return out
