"""The policy comparison report of ``frenzy compare`` (``benchmarks/results/compare.md``; the protocol is
docs/simulator.md, Comparison protocol). Sections (:class:`Section`): the synthetic LLM mixes under one truth
(``llm``), the failure experiment, a scenario under the profiled truth, the hour-long-job regime, Sia's own
traces and the sensitivity to round length and restart cost. This module runs them in order and writes the
page; a summary of frenzy against sia opens it. The Markdown of each section (per policy the metrics as
mean ± 95 % confidence half-width over the samples, restarts per job, frenzy against each policy paired by
sample, the per-model breakdown, the samples themselves and figures of the first) is
:mod:`frenzy_opt.research.report_tables`'."""

from __future__ import annotations

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
    run_sensitivity,
    run_sia_workloads,
    sensitivity_variants,
)
from frenzy_opt.research.experiment import (
    DEFAULT_COMPARE_SCENARIOS,
    DEFAULT_FAILURES,
    PairedComparison,
    Progress,
    SeededRuns,
    paired,
    run_seeds,
    write_plots,
)
from frenzy_opt.research.report_tables import (
    LLM_LABEL,
    OWN_LABEL,
    SIA_LABEL,
    ci_excludes_zero,
    pct_ci,
    report_section,
    sensitivity_section,
)
from frenzy_opt.simulation.simulator import Failures
from frenzy_opt.simulation.truth import SIA_TABLES, TruthSpec

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
            f"| {name} | {n} | {pct_ci(c.avg_reduction)} | {ci_excludes_zero(c.avg_reduction)} "
            f"| {pct_ci(c.p99_reduction)} | {c.wins}/{n} | {'yes' if met else 'no'} |"
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
