"""``frenzy run`` (the main job on a scenario) and ``solve`` (a solver's schedule of a scenario)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from frenzy_opt.core.readable import parallel_text
from frenzy_opt.planning.plans import NoFeasiblePlan, search_or_fail
from frenzy_opt.planning.problem import (
    OptionCache,
    Schedule,
    SchedulingProblem,
    avg_jct_s,
    build_problem,
    check_schedule,
    makespan_s,
    objective,
)
from frenzy_opt.planning.scenario import load_scenario
from frenzy_opt.plots.gantt import plot_schedule
from frenzy_opt.solvers import make_solver

if TYPE_CHECKING:  # the report pulls in matplotlib: imported when compare runs
    pass
from frenzy_opt.cli.common import _emit
from frenzy_opt.cli.sizing import plans_payload

# --- run (the main job on a scenario) ------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    results = []
    for job in scenario.jobs:
        try:
            search = search_or_fail(job.spec, scenario.cluster)
            results.append({"id": job.id, "arrival_s": job.arrival_s, **plans_payload(search, args.top, job.spec)})
        except NoFeasiblePlan as err:
            results.append({"id": job.id, "arrival_s": job.arrival_s, "plans": [], "error": str(err)})
    payload = {"scenario": scenario.name, "cluster": scenario.cluster.name, "jobs": results}

    def render(console: Console) -> None:
        console.print(f"scenario {scenario.name} on cluster {scenario.cluster.name} ({scenario.cluster.num_gpus} GPUs)")
        table = Table(title="Fastest memory-feasible plan per job (predicted step time)")
        for col in ("job", "arrival s", "plans", "best plan", "min GPUs per type"):
            table.add_column(col)
        for r in results:
            best = r["plans"][0] if r["plans"] else None
            if best:
                parallel = parallel_text(best["parallel"])
                best_text = f"{best['num_gpus']}x {best['gpu_type']} {parallel} mb{best['micro_batch_size']}"
            else:
                best_text = f"[red]{r['error']}"
            mins = ", ".join(f"{k} {v}" for k, v in r.get("min_gpus_per_type", {}).items())
            table.add_row(r["id"], f"{r['arrival_s']:g}", str(r.get("num_plans", 0)), best_text, mins)
        console.print(table)

    _emit(args, payload, render)
    return 0


# --- solve --------------------------------------------------------------------------------------------


def schedule_payload(problem: SchedulingProblem, schedule: Schedule) -> dict[str, Any]:
    names = {n.index: n.name for n in problem.topology.nodes}
    payload: dict[str, Any] = {
        "status": schedule.status,
        "solve_time_s": schedule.solve_time_s,
        "objective": objective(problem, schedule) if schedule.assignments else None,
        "avg_jct_s": avg_jct_s(problem, schedule) if schedule.assignments else None,
        "makespan_s": makespan_s(schedule) if schedule.assignments else None,
        "schedule": [
            {
                "job": a.job,
                "gpu_type": a.option.gpu_type,
                "num_gpus": a.option.num_gpus,
                "nodes": [names[n] for n in a.nodes],
                "start_s": a.start_s,
                "end_s": a.end_s,
                "parallel": {**a.option.plan.parallel.to_dict(), "micro_batch_size": a.option.plan.micro_batch_size},
            }
            for a in sorted(schedule.assignments, key=lambda a: (a.start_s, a.job))
        ],
    }
    if schedule.solver == "cpsat":
        payload["bound"] = schedule.bound
    return payload


def _proven_bound(
    problem: SchedulingProblem, schedules: dict[str, Schedule], time_limit_s: float, columns: int | None
) -> dict[str, Any]:
    """``--lp-bound``: the time-indexed LP bound (:mod:`frenzy_opt.solvers.lpbound`, the best schedule found as its
    incumbent), the larger of it and CP-SAT's bound, and the gaps that proves."""
    from frenzy_opt.solvers.lpbound import MAX_COLUMNS, time_indexed_bound

    found = {name: objective(problem, s) for name, s in schedules.items() if s.assignments}
    best_name = min(found, key=lambda name: found[name]) if found else None
    lp = time_indexed_bound(
        problem,
        incumbents=schedules.values(),
        max_columns=MAX_COLUMNS if columns is None else columns,
        time_limit_s=max(time_limit_s, 60.0),
    )
    cpsat = schedules.get("cpsat")
    bounds = [b for b in (lp.objective, None if cpsat is None else cpsat.bound) if b is not None]
    proven = max(bounds) if bounds else None
    out: dict[str, Any] = {
        "lp_bound": {
            "objective": lp.objective,
            "status": lp.status,
            "slot_s": lp.slot_s,
            "columns": lp.columns,
            "solve_s": lp.solve_s,
        },
        "proven_bound": proven,
    }
    if proven and best_name is not None:
        out["best_proven_gap"] = found[best_name] / proven - 1
    if proven and "greedy" in found:
        out["greedy_proven_gap"] = found["greedy"] / proven - 1
    return out


def cmd_solve(args: argparse.Namespace) -> int:
    if args.time_limit <= 0 or args.workers < 1 or (args.lp_columns is not None and args.lp_columns < 1):
        raise ValueError("--time-limit must be > 0, --workers >= 1 and --lp-columns >= 1")
    from frenzy_opt.hardware.topology import Topology
    from frenzy_opt.prediction.calibrations import resolve_model
    from frenzy_opt.simulation.tracemap import expand

    scenario = load_scenario(args.scenario)
    cache = OptionCache(scenario.cluster, Topology(scenario.cluster), step_model=resolve_model(args.calibration))
    # A ``workload:`` scenario is generated into jobs with its own seed, as `frenzy simulate` does (sim_jobs).
    problem = build_problem(expand(scenario, cache), cache=cache)
    if not problem.jobs:
        raise ValueError(f"scenario {scenario.name}: no jobs to schedule (give jobs: or a workload: section)")
    names = ["greedy", "cpsat"] if args.solver == "both" else [args.solver]
    options = {"time_limit_s": args.time_limit, "workers": args.workers, "seed": args.seed}
    schedules = {name: make_solver(name, **options).solve(problem) for name in names}
    for name, schedule in schedules.items():
        errors = check_schedule(problem, schedule) if schedule.assignments else []
        if errors:  # a solver bug, never bad input
            raise RuntimeError(f"{name} produced an invalid schedule: {'; '.join(errors[:3])}")
    results = {name: schedule_payload(problem, s) for name, s in schedules.items()}
    unsolved = {
        name: f"{name} found no schedule for the {len(problem.jobs)} jobs within --time-limit {args.time_limit:g} s "
        f"(status {s.status}): the instance is beyond its reach in that time; raise --time-limit or use "
        "--solver greedy"
        for name, s in schedules.items()
        if not s.assignments
    }
    payload: dict[str, Any] = {"scenario": scenario.name, "cluster": scenario.cluster.name, "results": results}
    if args.solver == "both" and results["cpsat"]["objective"]:
        greedy, cpsat = results["greedy"], results["cpsat"]
        payload["gap"] = greedy["avg_jct_s"] / cpsat["avg_jct_s"] - 1
        payload["bound_gap"] = greedy["objective"] / cpsat["bound"] - 1 if cpsat["bound"] else None
        payload["speedup"] = cpsat["solve_time_s"] / max(greedy["solve_time_s"], 1e-9)
    if args.lp_bound:
        payload.update(_proven_bound(problem, schedules, args.time_limit, args.lp_columns))
    if unsolved:
        payload["unsolved"] = unsolved
    if args.plot:
        payload["plots"] = [
            str(plot_schedule(problem, s, Path(args.plot) / f"gantt-{n}.png"))
            for n, s in schedules.items()
            if s.assignments
        ]

    def render(console: Console) -> None:
        table = Table(title=f"{scenario.name} on {scenario.cluster.name}: {len(problem.jobs)} jobs")
        for col in ("solver", "status", "solve s", "objective", "avg JCT h", "makespan h", "bound"):
            table.add_column(col, justify="left" if col in ("solver", "status") else "right")
        for name, r in results.items():
            bound, objective = r.get("bound"), r["objective"]
            hours = ["-" if r[k] is None else f"{r[k] / 3600:.2f}" for k in ("avg_jct_s", "makespan_s")]
            table.add_row(name, r["status"], f"{r['solve_time_s']:.3f}",
                          "-" if objective is None else f"{objective:,.0f}", *hours,
                          "-" if bound is None else f"{bound:,.0f}")  # fmt: skip
        console.print(table)
        for message in unsolved.values():
            console.print(f"[red]{message}")
        if "gap" in payload:
            console.print(
                f"greedy vs CP-SAT ({results['cpsat']['status']}): avg JCT gap {100 * payload['gap']:+.1f} %, "
                f"CP-SAT {payload['speedup']:.0f}x slower"
            )
        if payload.get("proven_bound") is not None:
            lp = payload["lp_bound"]
            said = (
                f"proven lower bound on the objective: {payload['proven_bound']:,.0f} "
                f"(LP {lp['status']} in {lp['solve_s']:.1f} s)"
            )
            if "best_proven_gap" in payload:
                said += f"; the best schedule is at most {100 * payload['best_proven_gap']:.1f} % above the optimum"
            if "greedy_proven_gap" in payload:
                said += f", the greedy at most {100 * payload['greedy_proven_gap']:.1f} %"
            console.print(said)
        for plot in payload.get("plots", []):
            console.print(f"wrote {plot}")

    _emit(args, payload, render)
    return 0
