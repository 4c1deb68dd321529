"""``frenzy simulate`` and ``compare``: policies on scenarios, and the comparison report."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

from frenzy_opt.planning.problem import (
    OptionCache,
)
from frenzy_opt.planning.scenario import Scenario, load_cluster_ref, load_scenario, resolve
from frenzy_opt.research.compare import (
    DEFAULT_RESTART_SCALES,
    DEFAULT_ROUNDS_S,
    DEFAULT_SENSITIVITY_SCENARIO,
    DEFAULT_SENSITIVITY_SEEDS,
    DEFAULT_SIA_CLUSTER,
    DEFAULT_SIA_SETS,
    SIA_WORKLOADS,
    sensitivity_variants,
    sia_workload_files,
)
from frenzy_opt.research.experiment import (
    DEFAULT_COMPARE_POLICIES,
    DEFAULT_COMPARE_SCENARIOS,
    DEFAULT_COMPARE_SEEDS,
    DEFAULT_COMPARE_TRUTH,
    DEFAULT_FAILURES,
    DEFAULT_PROFILED_SCENARIO,
    compare_metrics,
    comparisons,
    parse_policies,
    policy_payload,
    run_seeds,
    seeded_payload,
    write_plots,
)
from frenzy_opt.simulation.simulator import Failures, SimulationError
from frenzy_opt.simulation.tracemap import REQUEST_POLICIES, describe_requests
from frenzy_opt.simulation.truth import SIA_TABLES, TruthKind, TruthSpec, truth_spec

if TYPE_CHECKING:  # the report pulls in matplotlib: imported when compare runs
    from frenzy_opt.research.report import CompareSetup, Section
from frenzy_opt.cli.common import DEFAULT_REPORT, _emit

# --- simulate and compare ------------------------------------------------------------------------------


class _ProgressBar:
    """A rich progress bar on stderr (stdout stays clean for --json), for runs of many jobs; updates at
    most ten times a second."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.progress = Progress(console=Console(stderr=True), transient=True) if enabled else None
        self.tasks: dict[str, TaskID] = {}
        self.last = 0.0

    def __enter__(self) -> _ProgressBar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def say(self, line: str) -> None:
        """A line on stderr (above the bar when there is one)."""
        if self.progress is not None:
            self.progress.console.print(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def __call__(self, policy: str, done: int, total: int) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if policy not in self.tasks:
            self.tasks[policy] = self.progress.add_task(f"{policy}: jobs finished", total=total)
        elif now - self.last < 0.1 and done < total:
            return
        self.last = now
        self.progress.update(self.tasks[policy], completed=done)


def _failures(args: argparse.Namespace) -> Failures | None:
    if args.mtbf_h is None:
        return None
    for name, value in (
        ("--mtbf-h", args.mtbf_h),
        ("--repair-s", args.repair_s),
        ("--checkpoint-s", args.checkpoint_s),
    ):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    return Failures(
        node_mtbf_h=args.mtbf_h, repair_s=args.repair_s, checkpoint_interval_s=args.checkpoint_s, seed=args.seed
    )


def _add_truth_args(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--truth",
        default=default,
        choices=[k.value for k in TruthKind],
        help=f"how fast jobs really run: as predicted, x a cross-validated error, or profiled (default {default})",
    )
    p.add_argument("--profiles", default="sia", help="--truth profiled: sia, gavel (../shared/traces) or a path")
    p.add_argument("--profile-app", help="--truth profiled: the profiled application (default bert / Transformer)")


def _truth(args: argparse.Namespace) -> TruthSpec:
    return truth_spec(args.truth, profiles=args.profiles, application=args.profile_app)


def _long_run(scenario: Scenario) -> bool:
    """Whether to show a progress bar: 500 jobs or more, or a trace file (of unknown length)."""
    workload = scenario.workload
    if workload is None:
        return len(scenario.jobs) >= 500
    return workload.trace is not None or workload.num_jobs >= 500


def _simulate_sia_replay(args: argparse.Namespace, policies: list[str], failures: Failures | None) -> int:
    """``simulate CLUSTER --workload-file F --workload-format sia --truth profiled``
    (:mod:`frenzy_opt.simulation.siareplay`)."""
    from frenzy_opt.hardware.topology import Topology
    from frenzy_opt.research.experiment import Experiment, run_policies
    from frenzy_opt.simulation.siareplay import load_sia_replay
    from frenzy_opt.simulation.truth import load_profiles

    if args.workload_format != "sia":
        raise ValueError(f"--workload-format: {args.workload_format!r}; allowed: sia")
    if args.truth != TruthKind.PROFILED or args.seeds is not None or args.calibration:
        raise ValueError("--workload-format sia replays Sia's tables: needs --truth profiled, no --seeds/--calibration")
    try:
        cluster = load_scenario(args.scenario).cluster
    except ValueError:
        cluster = load_cluster_ref(args.scenario)
    topology = Topology(cluster)
    table, fmt = load_profiles(args.profiles)
    if fmt != "sia":
        raise ValueError("--workload-format sia needs Sia's tables (--profiles sia or a folder in its format)")
    started = time.perf_counter()
    jobs, truth = load_sia_replay(args.workload_file, table, Path(table.source), topology)
    scenario = Scenario(name=Path(args.workload_file).stem, cluster=cluster, jobs=())
    experiment = Experiment(
        scenario=scenario, topology=topology, jobs=jobs, truth=truth, build_s=time.perf_counter() - started
    )
    try:
        run_policies(experiment, policies, failures=failures)
    except SimulationError as err:
        raise ValueError(str(err)) from None
    payload: dict[str, Any] = {
        "scenario": scenario.name,
        "cluster": cluster.name,
        "num_gpus": cluster.num_gpus,
        "build_s": experiment.build_s,
        "truth": {"kind": "profiled", "profiles": table.source, "workload_format": "sia"},
        "policies": {name: policy_payload(r, truth) for name, r in experiment.results.items()},
        "versus_frenzy": comparisons(experiment.results),
    }

    def render(console: Console) -> None:
        table_out = Table(title=f"{scenario.name}: {len(jobs)} Sia jobs on {cluster.name}, truth profiled")
        for col in ("policy", "avg JCT s", "p99 JCT s", "restarts", "mean ms"):
            table_out.add_column(col, justify="left" if col == "policy" else "right")
        for name, m in payload["policies"].items():
            table_out.add_row(
                name,
                f"{m['avg_jct_s']:.0f}",
                f"{m['p99_jct_s']:.0f}",
                f"{m['restarts']}",
                f"{m['mean_decision_ms']:.3g}",
            )
        console.print(table_out)

    _emit(args, payload, render)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    policies = parse_policies(args.policy)
    failures = _failures(args)
    if args.workload_file:
        return _simulate_sia_replay(args, policies, failures)
    if args.workload_format:
        raise ValueError("--workload-format needs --workload-file")
    truth = _truth(args)
    scenario = load_scenario(args.scenario)
    seeds = 1 if args.seeds is None else args.seeds
    cache = None
    if args.calibration:
        from frenzy_opt.hardware.topology import Topology
        from frenzy_opt.prediction.calibrations import resolve_model

        model = resolve_model(args.calibration)
        cache = OptionCache(scenario.cluster, Topology(scenario.cluster), step_model=model)
    with _ProgressBar(_long_run(scenario) and sys.stderr.isatty()) as bar:
        try:
            runs = run_seeds(
                scenario,
                policies,
                seeds=seeds,
                base_seed=args.seed,
                truth=truth,
                failures=failures,
                progress=bar,
                cache=cache,
            )
        except SimulationError as err:
            raise ValueError(str(err)) from None
    experiment = runs.first
    payload: dict[str, Any] = {
        "scenario": experiment.scenario.name,
        "cluster": experiment.scenario.cluster.name,
        "num_gpus": experiment.scenario.cluster.num_gpus,
        "build_s": sum(e.build_s for e in runs.experiments),
        "truth": truth.describe(),
        "calibration": args.calibration or "shipped",
    }
    if any(name in REQUEST_POLICIES for name in policies):
        payload["requests"] = describe_requests([job.request for job in experiment.jobs])
    if args.seeds is None:  # one run: the metrics themselves (contract 3)
        payload["policies"] = {name: policy_payload(r, experiment.truth) for name, r in experiment.results.items()}
        payload["versus_frenzy"] = comparisons(experiment.results)
    else:  # means over the seeds, 95 % half-widths, the seeds
        payload["seeds"] = seeds
        payload["policies"] = seeded_payload(runs)
        payload["versus_frenzy"] = compare_metrics(payload["policies"])
    if args.plot:
        payload["plots"] = [str(p) for p in write_plots(experiment, Path(args.plot))]

    def hours(m: dict[str, Any], key: str) -> str:
        ci = m.get(key.replace("_s", "_ci95_s"))
        return f"{(m[key] or 0) / 3600:.2f}" + ("" if ci is None else f" ± {ci / 3600:.2f}")

    def render(console: Console) -> None:
        sc = experiment.scenario
        title = f"{sc.name}: {len(experiment.jobs)} jobs on {sc.cluster.name} ({sc.cluster.num_gpus} GPUs), "
        title += f"truth {truth.kind}" + ("" if args.seeds is None else f", mean ± 95 % CI over {seeds} seeds")
        table = Table(title=title)
        for col in ("policy", "avg JCT h", "p50 h", "p99 h", "makespan h", "util", "decisions", "mean ms", "p99 ms",
                    "restarts"):  # fmt: skip
            table.add_column(col, justify="left" if col == "policy" else "right")
        for name, m in payload["policies"].items():
            table.add_row(name, *(hours(m, k) for k in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s")),
                          f"{m['utilization']:.1%}", f"{m['num_decisions']:.0f}", f"{m['mean_decision_ms']:.3g}",
                          f"{m['p99_decision_ms']:.3g}", f"{m['restarts']:.0f}")  # fmt: skip
        console.print(table)
        if "requests" in payload:
            console.print(payload["requests"])
        for name, c in payload["versus_frenzy"].items():
            jct, ratio = c["avg_jct_reduction"], c["decision_time_ratio"]
            console.print(
                f"frenzy vs {name}: average JCT {100 * abs(jct):.1f} % {'lower' if jct >= 0 else 'higher'}, "
                f"decisions {ratio if ratio >= 1 else 1 / ratio:.3g}x {'faster' if ratio >= 1 else 'slower'}"
            )
        for plot in payload.get("plots", []):
            console.print(f"wrote {plot}")

    _emit(args, payload, render)
    return 0


def _floats(flag: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{flag}: comma-separated numbers, got {text!r}") from None


def _compare_sections(args: argparse.Namespace) -> tuple[Section, ...]:
    """``--sections``, else every section without SCENARIOS, else (SCENARIOS named) ``llm``, ``failures``
    and ``profiled`` as before sections existed; minus ``--no-failures`` / ``--no-profiled``."""
    from frenzy_opt.research.report import Section, parse_sections

    if args.sections:
        sections = parse_sections(args.sections)
    elif args.scenarios:
        sections = (Section.LLM, Section.FAILURES, Section.PROFILED)
    else:
        sections = tuple(Section)
    dropped = {Section.FAILURES} if args.no_failures else set()
    dropped |= {Section.PROFILED} if args.no_profiled else set()
    return tuple(s for s in sections if s not in dropped)


def _compare_setup(args: argparse.Namespace) -> CompareSetup:
    """The :class:`~frenzy_opt.research.report.CompareSetup` of ``frenzy compare``'s arguments, checked before any
    simulation (bad names, missing tables: ``ValueError``); sections that cannot run here are marked
    skipped with the reason."""
    from frenzy_opt.research.report import CompareSetup, Section

    scenarios = tuple(args.scenarios or DEFAULT_COMPARE_SCENARIOS)
    for name in (*scenarios, args.sensitivity_scenario):
        resolve(name)  # fail fast on a bad name, before hours of simulation
    sections = _compare_sections(args)
    truth = _truth(args)
    skipped: list[tuple[Section, str]] = []
    profiled = None
    if Section.PROFILED in sections:
        if truth.kind == TruthKind.PROFILED:
            skipped.append((Section.PROFILED, "The main truth is already `profiled`."))
        elif SIA_TABLES.is_dir():
            profiled = (DEFAULT_PROFILED_SCENARIO, truth_spec("profiled"))
        else:
            skipped.append((Section.PROFILED, f"Sia's tables are not at `{SIA_TABLES}` (the project ships none)."))
    sia_sets: list[tuple[str, tuple[Path, ...]]] = []
    sia_root, sia_tables = Path(args.sia_workloads), Path(args.sia_tables)
    if Section.SIA_TRACES in sections:
        if sia_root.is_dir() and sia_tables.is_dir():
            names = [n.strip() for n in args.sia_sets.split(",") if n.strip()]
            sia_sets = [(n, tuple(sia_workload_files(n, sia_root))) for n in names]
        else:
            reason = (
                f"Sia's workload files (`{sia_root}`) or tables (`{sia_tables}`) are absent (the project ships none)."
            )
            skipped.append((Section.SIA_TRACES, reason))
    variants = sensitivity_variants(
        _floats("--rounds-s", args.rounds_s), _floats("--restart-scales", args.restart_scales)
    )
    if args.sensitivity_seeds < 1:
        raise ValueError(f"--sensitivity-seeds must be >= 1, got {args.sensitivity_seeds}")
    return CompareSetup(
        policies=tuple(parse_policies(args.policy)),
        sections=sections,
        scenarios=scenarios,
        truth=truth,
        seeds=args.seeds,
        failures=DEFAULT_FAILURES,
        profiled=profiled,
        sia_sets=tuple(sia_sets),
        sia_cluster=load_cluster_ref(args.sia_cluster) if sia_sets else None,
        sia_traces_root=sia_tables,
        sensitivity_scenario=args.sensitivity_scenario,
        sensitivity_seeds=args.sensitivity_seeds,
        variants=tuple(variants),
        skipped=tuple(skipped),
    )


def _compare_command(args: argparse.Namespace, parser_defaults: dict[str, Any]) -> str:
    """The command line that regenerates the report: SCENARIOS and every option away from its default."""
    command = "frenzy compare" + (" " + " ".join(args.scenarios) if args.scenarios else "")
    for dest, default in parser_defaults.items():
        value = getattr(args, dest)
        flag = "--" + dest.replace("_", "-")
        if isinstance(value, bool):
            command += f" {flag}" if value else ""
        elif value != default:
            command += f" {flag} {value}"
    return command + " --overwrite"  # what regenerates a report in place


# Options of ``frenzy compare`` and their defaults, in the order the regenerate command lists them.
COMPARE_OPTIONS: dict[str, Any] = {
    "sections": None, "policy": ",".join(DEFAULT_COMPARE_POLICIES), "truth": DEFAULT_COMPARE_TRUTH,
    "seeds": DEFAULT_COMPARE_SEEDS, "profiles": "sia", "profile_app": None, "out": DEFAULT_REPORT,
    "no_failures": False, "no_profiled": False, "sia_sets": ",".join(DEFAULT_SIA_SETS),
    "sia_cluster": DEFAULT_SIA_CLUSTER, "sia_workloads": str(SIA_WORKLOADS), "sia_tables": str(SIA_TABLES),
    "sensitivity_scenario": DEFAULT_SENSITIVITY_SCENARIO, "sensitivity_seeds": DEFAULT_SENSITIVITY_SEEDS,
    "rounds_s": ",".join(f"{r:g}" for r in DEFAULT_ROUNDS_S),
    "restart_scales": ",".join(f"{r:g}" for r in DEFAULT_RESTART_SCALES),
}  # fmt: skip
# The options of the sia-traces and sensitivity sections, added to the parser from COMPARE_OPTIONS.
COMPARE_HELP = {
    "sia_sets": "sia-traces: Sia's workload sets, every file of each",
    "sia_cluster": "sia-traces: the cluster",
    "sia_workloads": "sia-traces: the folder of the sets",
    "sia_tables": "sia-traces: Sia's tables (its traces/ folder)",
    "sensitivity_scenario": "sensitivity: the scenario",
    "sensitivity_seeds": "sensitivity: seeds",
    "rounds_s": "sensitivity: round lengths of sia and gavel, s",
    "restart_scales": "sensitivity: restart-cost factors",
}


def cmd_compare(args: argparse.Namespace) -> int:
    from frenzy_opt.research.report import write_report

    setup = _compare_setup(args)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise ValueError(
            f"--out: {out} exists (a committed report, from the repository root); pass --overwrite to replace it "
            "or give another path"
        )
    command = _compare_command(args, COMPARE_OPTIONS)
    with _ProgressBar(sys.stderr.isatty()) as bar:
        out = write_report(setup, out, progress=bar, command=command, announce=bar.say)
    _emit(args, {"report": str(out)}, lambda console: console.print(f"wrote {out}"))
    return 0
