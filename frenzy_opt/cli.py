"""The ``frenzy`` command line (contract 3): ``catalog``, ``predict``, ``plan``, ``solve``, ``simulate``,
``compare``, ``serve``, ``demo`` and ``run``.

Human-readable tables by default, ``--json`` for one JSON object on stdout. Exit codes: 0 ok; 2 bad input
or a job that fits no GPU (message on stderr); 1 internal error.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

from frenzy_opt import __version__, client
from frenzy_opt.core.readable import parallel_text
from frenzy_opt.core.spec import JobSpec, load_job
from frenzy_opt.hardware.gpus import load_gpus, resolve_gpu
from frenzy_opt.models.catalog import load_catalog
from frenzy_opt.planning.export import TARGETS as EXPORT_TARGETS
from frenzy_opt.planning.export import load_placement, to_k8s, to_slurm
from frenzy_opt.planning.plans import NoFeasiblePlan, Plan, PlanSearch, micro_batch_summary, search_or_fail
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
from frenzy_opt.planning.scenario import DEFAULT_SCENARIO, Scenario, load_cluster_ref, load_scenario, resolve
from frenzy_opt.plots.gantt import plot_schedule
from frenzy_opt.prediction.marp.predictor import MemoryPrediction, predict_memory
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
from frenzy_opt.solvers import make_solver
from frenzy_opt.solvers.base import policy_names

if TYPE_CHECKING:  # the report pulls in matplotlib: imported when compare runs
    from frenzy_opt.research.report import CompareSetup, Section

GIB = 2**30
DEFAULT_REPORT = "benchmarks/results/compare.md"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:,.2f}"


def _sig(value: float | None) -> str:
    """Three significant figures, or "-"."""
    return "-" if value is None else f"{value:.3g}"


def _seconds_text(value: float | None) -> str:
    """A duration in s, ms or µs (whichever puts it at or above 1), three significant figures; "-" if None."""
    if value is None:
        return "-"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-6:.3g} µs"


def _bytes_text(value: float | None) -> str:
    """Bytes in GiB, or MiB below 1 GiB, three significant figures; "-" if None."""
    if value is None:
        return "-"
    return f"{value / GIB:.3g} GiB" if value >= GIB else f"{value / 2**20:.3g} MiB"


def _emit(args: argparse.Namespace, payload: dict[str, Any], render: Callable[[Console], None]) -> None:
    if args.json:
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        render(Console(width=160))


# --- catalog -------------------------------------------------------------------------------------------


def cmd_catalog(args: argparse.Namespace) -> int:
    if args.what == "gpus":
        gpus = [g.to_dict() for g in load_gpus().values()]

        def render(console: Console) -> None:
            table = Table(title="GPU catalogue (dense TFLOPs, GB/s)")
            for col in ("name", "memory GiB", "bf16", "fp16", "fp32", "fp8", "HBM GB/s", "intra-node GB/s"):
                table.add_column(col, justify="left" if col == "name" else "right")
            for g in load_gpus().values():
                cells = (g.bf16_tflops or "-", g.fp16_tflops, g.fp32_tflops, g.fp8_tflops or "-")
                table.add_row(
                    g.name, _gib(g.memory_bytes), *map(str, cells), f"{g.hbm_gbyte_s:g}", f"{g.intra_node_gbyte_s:g}"
                )
            console.print(table)

        _emit(args, {"gpus": gpus}, render)
        return 0
    models = [{"name": a.name, "num_params": a.num_params, **a.to_dict()} for a in load_catalog().values()]

    def render_models(console: Console) -> None:
        table = Table(title="Model catalogue")
        for col in (
            "name",
            "params (B)",
            "layers",
            "hidden",
            "ffn",
            "heads",
            "kv",
            "vocab",
            "mlp",
            "experts",
        ):
            table.add_column(col, justify="left" if col in ("name", "mlp") else "right")
        for a in load_catalog().values():
            table.add_row(a.name, f"{a.num_params / 1e9:.3f}", str(a.num_layers), str(a.hidden_size),
                          str(a.ffn_hidden_size), str(a.num_attention_heads), str(a.num_kv_heads), str(a.vocab_size),
                          a.mlp, f"{a.num_experts} (top {a.moe_top_k})" if a.is_moe else "-")  # fmt: skip
        console.print(table)

    _emit(args, {"models": models}, render_models)
    return 0


# --- predict -------------------------------------------------------------------------------------------


def prediction_payload(prediction: MemoryPrediction) -> dict[str, Any]:
    return {
        "gpu_type": prediction.gpu_type,
        "parallel": prediction.parallel.to_dict(),
        "fits": prediction.fits,
        "capacity_bytes": prediction.capacity_bytes,
        "peak_allocated_bytes": prediction.peak_allocated_bytes,
        "peak_reserved_bytes": prediction.peak_reserved_bytes,
        "device_used_bytes": prediction.device_used_bytes,
        "fits_upper": prediction.fits_upper,
        "peak_allocated_upper_bytes": prediction.peak_allocated_upper_bytes,
        "peak_reserved_upper_bytes": prediction.peak_reserved_upper_bytes,
        "device_used_upper_bytes": prediction.device_used_upper_bytes,
        "required_upper_bytes": prediction.required_upper_bytes,
        "stages": [s.to_dict() for s in prediction.stages],
    }


def cmd_predict(args: argparse.Namespace) -> int:
    job = load_job(resolve(args.job))
    gpu = resolve_gpu(args.gpu, "--gpu")
    if args.micro_batch_size:
        job = job.with_parallel(job.parallel, micro_batch_size=args.micro_batch_size)
    prediction = predict_memory(job, gpu)
    payload = {"job": job.name, "model": job.model.name, "micro_batch_size": job.training.micro_batch_size,
               **prediction_payload(prediction)}  # fmt: skip
    trace = _run_trace(job) if args.trace else None
    if trace is not None:
        payload["trace"] = trace
        payload["admission"] = ADMISSION_NOTE

    def render(console: Console) -> None:
        verdict = "[green]fits[/]" if prediction.fits else "[red]does not fit[/]"
        parallel = parallel_text(prediction.parallel.to_dict())
        console.print(
            f"{job.name} on {gpu.name} ({_gib(gpu.memory_bytes)} GiB): {verdict}; "
            f"parallel {parallel}, micro-batch {job.training.micro_batch_size}"
        )
        table = Table(title="Per-stage peak memory (GiB)")
        table.add_column("component")
        for s in prediction.stages:
            table.add_column(f"stage {s.stage}", justify="right")
        keys = list(prediction.stages[0].breakdown)
        for key in keys:
            table.add_row(key, *(_gib(s.breakdown.get(key, 0)) for s in prediction.stages))
        table.add_row("[bold]peak allocated", *(_gib(s.peak_allocated_bytes) for s in prediction.stages))
        table.add_row("[bold]peak reserved", *(_gib(s.peak_reserved_bytes) for s in prediction.stages))
        table.add_row("[bold]device used (nvidia-smi)", *(_gib(s.device_used_bytes) for s in prediction.stages))
        for key in prediction.stages[0].bound:
            table.add_row(f"bound: {key}", *(_gib(s.bound.get(key, 0)) for s in prediction.stages))
        table.add_row("[bold]bound: required (admission)", *(_gib(s.required_upper_bytes) for s in prediction.stages))
        table.add_row("upper bound: allocated", *(_gib(s.peak_allocated_upper_bytes) for s in prediction.stages))
        table.add_row("upper bound: reserved", *(_gib(s.peak_reserved_upper_bytes) for s in prediction.stages))
        table.add_row("upper bound: device used", *(_gib(s.device_used_upper_bytes) for s in prediction.stages))
        table.add_row("peak phase", *(s.peak_phase for s in prediction.stages))
        console.print(table)
        if prediction.capacity_bytes is not None:
            admitted = "admits" if prediction.fits_upper else "refuses"
            console.print(f"the planner {admitted} this layout on {gpu.name}: required bound "
                          f"{_gib(prediction.required_upper_bytes)} GiB (plus the headroom) vs "
                          f"{_gib(prediction.capacity_bytes)} GiB")  # fmt: skip
        if trace is not None:
            console.print(_trace_table(trace, prediction))
            console.print(ADMISSION_NOTE)

    _emit(args, payload, render)
    return 0


ADMISSION_NOTE = (
    "admission uses MARP's bound of parts (the 'required' row), not the trace: the trace is one step of the "
    "runtime's own code on the CPU (exact tensors, no CUDA context, NCCL or fragmentation of a real device) and "
    "takes seconds to minutes, while the planner evaluates thousands of layouts in milliseconds; "
    "benchmarks/results/marp_vs_trace.md measures how far the two allocated figures agree"
)


def _run_trace(job: Any) -> dict[str, Any]:
    """The trace path for one plan: the real runtime's code under FakeTensorMode (``frenzy_opt.tracing``,
    needs the ``validate`` extra), its allocation trace replayed through the caching-allocator model."""
    try:
        from frenzy_opt.tracing import trace_job
    except ImportError as err:
        raise ValueError(f"--trace needs the validate extra (pip install 'frenzy-opt[validate]'): {err}") from None
    from frenzy_opt.prediction.marp.allocator import replay

    result = trace_job(job)
    stages = []
    for stage in result.stages:
        stats = replay(stage.trace.events if stage.trace is not None else [])
        stages.append({**stage.to_dict(), "replayed_peak_allocated_bytes": stats.peak_allocated_bytes,
                       "replayed_peak_reserved_bytes": stats.peak_reserved_bytes})  # fmt: skip
    return {"runtime": result.runtime, "stages": stages}


def _trace_table(trace: dict[str, Any], prediction: MemoryPrediction) -> Table:
    table = Table(title=f"Trace path ({trace['runtime']} under FakeTensorMode) vs MARP (GiB)")
    for col in ("stage", "traced allocated", "allocator model reserved", "MARP allocated", "MARP reserved"):
        table.add_column(col, justify="right")
    predicted = {s.stage: s for s in prediction.stages}
    for s in trace["stages"]:
        p = predicted.get(s["stage"])
        marp = (p.peak_allocated_bytes, p.peak_reserved_bytes) if p else (None, None)
        table.add_row(str(s["stage"]), _gib(s["peak_allocated_bytes"]), _gib(s["replayed_peak_reserved_bytes"]),
                      _gib(marp[0]), _gib(marp[1]))  # fmt: skip
    return table


# --- plan ----------------------------------------------------------------------------------------------


def plans_payload(search: PlanSearch, top: int, job: JobSpec | None = None) -> dict[str, Any]:
    payload = {
        "plans": [p.to_dict() for p in search.plans[:top]],
        "num_plans": len(search.plans),
        "min_gpus_per_type": search.min_gpus_per_type(),
    }
    if job is not None:
        payload["micro_batch"] = micro_batch_summary(job)
    return payload


def _micro_batch_line(job: JobSpec) -> str:
    summary = micro_batch_summary(job)
    if summary["pinned"]:
        return f"micro-batch: pinned at {job.training.micro_batch_size} (training.pin_micro_batch: true)"
    sizes = ", ".join(map(str, summary["searched"]))
    return f"micro-batch: searched over {sizes} (training.pin_micro_batch: true keeps training.micro_batch_size)"


def per_type(plans: Sequence[Plan], count: int) -> list[Plan]:
    """The best ``count`` plans of each GPU type (in the search's rank order), types by their best plan."""
    kept: dict[str, list[Plan]] = {}
    for plan in plans:
        chosen = kept.setdefault(plan.gpu_type, [])
        if len(chosen) < count:
            chosen.append(plan)
    return [plan for chosen in kept.values() for plan in chosen]


def _plans_table(title: str, search: PlanSearch, top: int, plans: Sequence[Plan] | None = None) -> Table:
    table = Table(title=title)
    for col in (
        "#",
        "gpu",
        "gpus",
        "parallel",
        "mb",
        "prec",
        "step s",
        "step band s",
        "runtime h",
        "alloc GiB",
        "used GiB",
        "upper GiB",
        "headroom",
    ):
        table.add_column(col, justify="left" if col in ("gpu", "parallel", "prec") else "right")
    for i, p in enumerate(search.plans[:top] if plans is None else plans, 1):
        step = "-" if p.step_time_s is None else f"{p.step_time_s:.3f}"
        band = "-"
        if p.step_time_p10_s is not None and p.step_time_p90_s is not None:
            band = f"{p.step_time_p10_s:.3f}-{p.step_time_p90_s:.3f}"
        runtime = "-" if p.est_runtime_s is None else f"{p.est_runtime_s / 3600:.1f}"
        if p.memory_risk:
            runtime += " (memory risk)"
        table.add_row(str(i), p.gpu_type, str(p.num_gpus), parallel_text(p.parallel.to_dict()),
                      str(p.micro_batch_size), p.precision, step, band, runtime, _gib(p.peak_allocated_bytes),
                      _gib(p.device_used_bytes), _gib(p.device_used_upper_bytes),
                      f"{100 * p.headroom_bytes / p.capacity_bytes:.0f}%")  # fmt: skip
    return table


def cmd_plan(args: argparse.Namespace) -> int:
    from frenzy_opt.prediction.calibrations import resolve_model

    if args.out and not args.export:
        raise ValueError("--out writes the --export script or manifest: give --export slurm or --export k8s")
    if args.export and args.headroom is not None:
        raise ValueError(
            "--export takes the service's plan, planned at the job's training.memory_headroom (or the fit's): "
            "set that field instead of --headroom"
        )
    job = load_job(resolve(args.job))
    cluster = load_cluster_ref(args.cluster)
    step_model = resolve_model(args.calibration)
    search = search_or_fail(job, cluster, headroom=args.headroom, step_model=step_model)
    # On a mixed cluster the overall ranking may show one type only: the best of each type by default.
    count = args.per_type if args.per_type is not None else (1 if len(cluster.gpu_types()) > 1 else 0)
    if count < 0:
        raise ValueError(f"--per-type must be >= 0, got {count}")
    by_type = per_type(search.plans, count) if count else []
    payload = {
        "job": job.name,
        "cluster": cluster.name,
        "calibration": args.calibration or "shipped",
        **plans_payload(search, args.top, job),
        "best_per_type": [p.to_dict() for p in by_type],
    }
    text = None
    if args.export:
        from frenzy_opt.service.launcher import decided_placement

        placement = decided_placement(job, cluster, step_model=step_model)
        text = to_slurm(placement) if args.export == "slurm" else to_k8s(placement)
        if args.out:
            Path(args.out).write_text(text, encoding="utf-8")
        payload["export"] = {"target": args.export, "out": args.out, "placement": placement, "text": text}

    def render(console: Console) -> None:
        if text is not None and not args.out:
            sys.stdout.write(text)  # the script or manifest alone, for `frenzy plan ... --export slurm > FILE`
            return
        console.print(
            _plans_table(f"{job.name} on {cluster.name}: {len(search.plans)} feasible plans", search, args.top)
        )
        if by_type:
            title = f"the best {'plan' if count == 1 else f'{count} plans'} of each GPU type"
            console.print(_plans_table(title, search, args.top, by_type))
        mins = ", ".join(f"{k}: {v}" for k, v in search.min_gpus_per_type().items())
        console.print(f"minimum GPUs per type: {mins}")
        console.print(_micro_batch_line(job), highlight=False)
        console.print(
            "feasible = upper bound of device memory used + required headroom <= GPU memory; "
            "headroom column = memory left above the upper bound; step band = 10th-90th percentile from the "
            f"step-time model's cross-validated errors (calibration: {payload['calibration']})"
        )
        if args.export:
            chosen = payload["export"]["placement"]
            plan, nodes = chosen["plan"], chosen["placement"]["nodes"]
            console.print(
                f"wrote {args.out} ({args.export}): the scheduler's plan on an empty cluster, {plan['num_gpus']} x "
                f"{plan['gpu_type']} ({parallel_text(plan['parallel'])}, micro-batch {plan['micro_batch_size']}) "
                f"on {len(nodes)} node(s)",
                highlight=False,
            )

    _emit(args, payload, render)
    return 0


# --- validate / calibrate ------------------------------------------------------------------------------


def _validate_steptime(args: argparse.Namespace) -> int:
    from frenzy_opt.prediction.calibrations import resolve_model
    from frenzy_opt.validation.steptime import fittable, refused, render_markdown, validate

    result = validate(args.file, resolve_model(args.calibration))
    refusals = {r.row_id: refused(r) for r in fittable(result.runs)}
    payload = result.to_dict()
    payload["refused"] = {k: v for k, v in refusals.items() if v}
    if args.out:
        with_profile = f" --calibration {args.calibration}" if args.calibration else ""
        command = f"frenzy validate steptime {args.file}{with_profile} --out {args.out}"
        Path(args.out).write_text(render_markdown(result, command, refusals), encoding="utf-8")

    def render(console: Console) -> None:
        cv = payload["cross_validated"]
        for label, o in (
            ("in sample (given parameters)", payload["overall"]),
            ("leave one source out", cv["leave_one_source_out"]["overall"]),
            ("leave one GPU type out", cv["leave_one_gpu_type_out"]["overall"]),
        ):
            console.print(
                f"{label}: {o['rows']} rows, mean |error| {100 * o['mean_abs_error']:.1f} %, median "
                f"{100 * o['median_abs_error']:.1f} %, worst {100 * o['max_abs_error']:.1f} %, signed "
                f"{100 * o['mean_signed_error']:+.1f} %"
            )
        for title, group in (("By source", "by_source"), ("By GPU type", "by_gpu_type")):
            table = Table(title=f"{title}: mean |error|")
            for col in (group.removeprefix("by_"), "rows", "in sample", "LOSO", "LOGO"):
                table.add_column(col, justify="left" if col in ("source", "gpu_type") else "right")
            for name, o in payload[group].items():
                loso = cv["leave_one_source_out"][group].get(name, {})
                logo = cv["leave_one_gpu_type_out"][group].get(name, {})
                table.add_row(
                    name[:60], str(o["rows"]), f"{100 * o['mean_abs_error']:.1f} %",
                    f"{100 * loso.get('mean_abs_error', float('nan')):.1f} %",
                    f"{100 * logo.get('mean_abs_error', float('nan')):.1f} %",
                )  # fmt: skip
            console.print(table)
        console.print(f"published configurations the planner refuses: {len(payload['refused'])} of {len(refusals)}")

    _emit(args, payload, render)
    return 0


def _validate_layers(args: argparse.Namespace) -> int:
    from frenzy_opt.prediction.calibrations import resolve_model
    from frenzy_opt.validation import layers

    profiles, notes = layers.load_profiles(args.file)
    rows = layers.compare(profiles, resolve_model(args.calibration))
    summary = layers.summary(rows)
    payload = {"summary": summary, "points": [r.to_dict() for r in rows], "skipped": notes}
    if args.out:
        command = f"frenzy validate layers {args.file} --out {args.out}"
        Path(args.out).write_text(layers.render_markdown(rows, notes, command), encoding="utf-8")

    def render(console: Console) -> None:
        table = Table(title="Layer forward + backward, predicted against measured: mean |error| (median error)")
        for col in ("GPU type", "points", "shipped fit", "kernels alone"):
            table.add_column(col, justify="left" if col == "GPU type" else "right")
        for name, v in [("all", summary["overall"]), *summary["by_gpu"].items()]:
            if v:
                table.add_row(name, str(v["points"]), *(
                    f"{100 * v[k]['mean_abs_error']:.1f} % ({100 * v[k]['median_error']:+.0f} %)"
                    for k in ("fitted", "kernels")
                ))  # fmt: skip
        console.print(table)

    _emit(args, payload, render)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from frenzy_opt.validation.measured import render_markdown, validate

    if args.what == "steptime":
        return _validate_steptime(args)
    if args.what == "layers":
        return _validate_layers(args)
    result = validate(args.file)
    payload = result.to_dict()
    if args.out:
        command = f"frenzy validate memory {args.file} --out {args.out}"
        Path(args.out).write_text(render_markdown(result, command), encoding="utf-8")

    def render(console: Console) -> None:
        for label, key in (("in sample (shipped fit)", "overall"), ("leave one source out", "cross_validated")):
            o = payload[key] if key == "overall" else payload[key]["overall"]
            console.print(
                f"{label}: {o['rows']} rows, mean accuracy {100 * o['mean_accuracy']:.1f} %, worst "
                f"{100 * o['worst_accuracy']:.1f} %, {o['under_predicted_3pct']} under-predicted by > 3 %, "
                f"upper bound holds on {100 * o['upper_coverage']:.0f} % ({o['upper_under_3pct']} rows > 3 % under it)"
            )
        table = Table(title="By source, leave one source out")
        for col in ("source", "rows", "mean acc", "worst acc", "bound holds"):
            table.add_column(col, justify="left" if col == "source" else "right")
        for source, o in payload["cross_validated"]["by_source"].items():
            table.add_row(source[:60], str(o["rows"]), f"{100 * o['mean_accuracy']:.1f} %",
                          f"{100 * o['worst_accuracy']:.1f} %", f"{100 * o['upper_coverage']:.0f} %")  # fmt: skip
        console.print(table)

    _emit(args, payload, render)
    return 0


def _calibrate_steptime(args: argparse.Namespace) -> int:
    """``--name steptime``: refit the shipped step-time parameters; any other name: a user's profile."""
    from frenzy_opt.prediction.calibrations import CalibrationStore, check_name
    from frenzy_opt.prediction.steptime import shipped_model
    from frenzy_opt.validation.steptime import (
        calibrate,
        cross_validate,
        fit,
        read_any,
        score,
        summarise,
        usable,
        write_fit,
    )

    files = [args.file, *args.more]
    shipped = shipped_model()
    if args.name == "steptime":
        if len(files) != 1 or files[0].endswith(".json"):
            raise ValueError("calibrate --name steptime: give one calibration-format CSV file")
        before = score(read_any(files), shipped)
        fitted, after = calibrate(args.file)
        out = write_fit(fitted, Path(args.file).name, Path(args.out) if args.out else None)
        error_after = summarise(after.by_source_cv).to_dict()
        error_after["method"] = "leave one source out"
        written = str(out)
    else:
        name = check_name(args.name)
        store = CalibrationStore(args.out) if args.out else CalibrationStore()
        # Measured layer profiles already in the profile stay with the refitted parameters.
        kept = store.load(name).layer_profiles if store.path(name).exists() else ()
        runs = usable(read_any(files))
        if not runs:
            raise ValueError(f"calibrate: no usable measured run in {', '.join(files)}")
        before = score(runs, shipped)
        base = replace(shipped, layer_profiles=kept)
        fitted = fit(runs, base, keys="gpu")
        error_after = summarise(score(runs, fitted)).to_dict()
        error_after["method"] = "in sample"
        if len({r.source for r in runs}) > 1:
            held = cross_validate(runs, by="source", base=shipped)
            error_after["leave_one_source_out"] = summarise(held).to_dict()
        written = str(
            store.save(
                name,
                fitted,
                source=[str(f) for f in files],
                rows=len(runs),
                error_before=summarise(before).to_dict(),
                error_after=error_after,
            )
        )
    payload = {
        "name": args.name,
        "parameters": fitted.to_dict(),
        "written_to": written,
        "error_before": summarise(before).to_dict(),
        "error_after": error_after,
    }

    def render(console: Console) -> None:
        b, a = payload["error_before"], payload["error_after"]
        console.print(f"wrote {written}")
        console.print(
            f"mean |step-time error| before (shipped parameters) {100 * b['mean_abs_error']:.1f} % over "
            f"{b['rows']} runs; after ({a['method']}) {100 * a['mean_abs_error']:.1f} %"
        )

    _emit(args, payload, render)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from frenzy_opt.prediction.marp.fit import FIT_PATH, load_fit
    from frenzy_opt.validation.measured import (
        calibrate,
        read_measurements,
        score_run,
        summarise,
        usable,
        write_fit,
    )

    if args.name != "memory":
        return _calibrate_steptime(args)
    if args.more:
        raise ValueError("calibrate --name memory: give one calibration-format CSV file")
    # Before: the fit shipped now, scored on the file (a cross-validation would refit and ignore it).
    shipped = load_fit()
    before = [score_run(run, shipped) for run in usable(read_measurements(args.file))]
    fitted, after = calibrate(args.file)
    out = Path(args.out) if args.out else FIT_PATH
    write_fit(fitted, out)
    payload = {
        "name": args.name,
        "parameters": fitted.to_dict(),
        "written_to": str(out),
        "error_before": summarise(before).to_dict(),
        "error_after": summarise(after.held_out).to_dict(),
    }

    def render(console: Console) -> None:
        console.print(f"wrote {out}: {json.dumps(fitted.to_dict(), sort_keys=True)}")
        a = payload["error_after"]
        console.print(
            f"leave one source out: mean accuracy {100 * a['mean_accuracy']:.1f} %, worst "
            f"{100 * a['worst_accuracy']:.1f} %, bound holds on {100 * a['upper_coverage']:.0f} %"
        )

    _emit(args, payload, render)
    return 0


# --- profile -------------------------------------------------------------------------------------------


def cmd_profile(args: argparse.Namespace) -> int:
    """Measure a job's layers on this machine's GPU, or import Sailor's profiles, into a calibration profile."""
    from frenzy_opt.prediction.calibrations import CalibrationStore, add_profiles, check_name

    name = check_name(args.name)
    store = CalibrationStore(args.dir) if args.dir else CalibrationStore()
    notes: list[str] = []
    if args.from_sailor:
        if args.job:
            raise ValueError("profile: give a job to measure or --from-sailor DIR, not both")
        from frenzy_opt.prediction.sailor import import_profiles

        profiles, notes = import_profiles(args.from_sailor)
        source = f"sailor:{args.from_sailor}"
    else:
        if not args.job:
            raise ValueError("profile: give a job spec to measure (or --from-sailor DIR to import Sailor's profiles)")
        from frenzy_opt.prediction import profiler

        job = load_job(args.job)
        refusal = profiler.cuda_refusal()
        if refusal:
            raise ValueError(refusal)
        import torch

        gpu = resolve_gpu(args.gpu or torch.cuda.get_device_name(0))
        from frenzy_opt.planning.plans import MICRO_BATCH_CHOICES

        micro = _int_list(args.micro_batches, "--micro-batches") or profiler.micro_batch_sizes(job, MICRO_BATCH_CHOICES)
        tps = _int_list(args.tp, "--tp") or profiler.tp_degrees(job)
        source = f"frenzy profile on {torch.cuda.get_device_name(0)} (torch {torch.__version__})"
        profile, notes = profiler.measure(
            job, gpu=gpu.name, micro_batches=micro, tps=tps, warmup=args.warmup, iters=args.iters, source=source,
            log=None if args.json else print,
        )  # fmt: skip
        profiles = [profile]
    path = add_profiles(store, name, profiles, source)
    payload = {
        "name": name,
        "written_to": str(path),
        "profiles": [p.to_dict() for p in profiles],
        "skipped": notes,
    }

    def render(console: Console) -> None:
        for p in profiles:
            console.print(f"{p.gpu} {p.runtime} {p.model}: {len(p.points)} points")
        for note in notes:
            console.print(f"[yellow]skipped: {note}")
        console.print(f"wrote {path}; plan with it: frenzy plan JOB --cluster C --calibration {name}")

    _emit(args, payload, render)
    return 0


def _int_list(text: str | None, flag: str) -> list[int]:
    if not text:
        return []
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag}: comma-separated positive integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{flag}: comma-separated positive integers, got {text!r}")
    return values


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


def cmd_solve(args: argparse.Namespace) -> int:
    if args.time_limit <= 0 or args.workers < 1:
        raise ValueError("--time-limit must be > 0 and --workers >= 1")
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
                f"greedy vs optimal: avg JCT gap {100 * payload['gap']:+.1f} %, CP-SAT {payload['speedup']:.0f}x slower"
            )
        for plot in payload.get("plots", []):
            console.print(f"wrote {plot}")

    _emit(args, payload, render)
    return 0


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


# --- serve and demo ------------------------------------------------------------------------------------


def db_url(text: str) -> str:
    """``--db`` as a SQLAlchemy URL: a plain path (no ``scheme://``) is a SQLite file (``myjobs.db`` ->
    ``sqlite:///myjobs.db``); a URL must parse and name a dialect SQLAlchemy has. ``ValueError`` says what a
    URL looks like."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shape = "a path to a SQLite file (myjobs.db) or a SQLAlchemy URL such as sqlite:///myjobs.db or "
    shape += "postgresql+psycopg://user:password@host/dbname"
    text = text.strip()
    if not text:
        raise ValueError(f"--db: give {shape}")
    if "://" not in text:
        folder = Path(text).expanduser().parent
        if not folder.is_dir():
            raise ValueError(f"--db: folder {folder} of SQLite file {text!r} does not exist")
        return f"sqlite:///{Path(text).expanduser()}"
    try:
        make_url(text).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as err:
        raise ValueError(f"--db: {text!r} is not a database URL SQLAlchemy can use ({err}); give {shape}") from None
    return text


def cmd_serve(args: argparse.Namespace) -> int:
    from frenzy_opt.api.httplimits import HttpLimits
    from frenzy_opt.api.server import build_config, serve
    from frenzy_opt.api.workers import MAX_WORKERS, WorkerSettings

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise ValueError(f"--workers must be in [1, {MAX_WORKERS}], got {args.workers}")
    limits = HttpLimits(  # checked first: a bad flag fails before the store is opened
        max_header_bytes=args.max_header_bytes,
        header_timeout_s=args.header_timeout_s,
        keep_alive_s=args.keep_alive_s,
        max_connections=args.max_connections,
    )
    config = build_config(
        load_cluster_ref(args.cluster),
        db_url=db_url(args.db),
        executor=args.executor,
        tokens=args.tokens,
        time_scale=args.time_scale,
        fail_rate=args.fail_rate,
        decision_wait_s=args.decision_wait_s,
        workdir=args.workdir,
        calibration=args.calibration,
        create=args.create,
    )
    if args.workers == 1:
        serve(config, args.host, args.port, limits)
        return 0
    workers = WorkerSettings(
        db_url=db_url(args.db),
        cluster=args.cluster,
        executor=args.executor,
        tokens=args.tokens,
        scheduler_url="",  # the scheduler process's private port, set when it listens
        parent_pid=0,
    )
    serve(config, args.host, args.port, limits, workers, args.workers)
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from frenzy_opt.service.launcher import launch_job

    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    job = load_job(resolve(args.job))
    payload = launch_job(
        job, load_cluster_ref(args.cluster), executor_name=args.executor, steps=args.steps, workdir=args.workdir
    )

    def render(console: Console) -> None:
        plan, m, p = payload["plan"], payload["measured"], payload["predicted"]
        console.print(
            f"{job.name}: {payload['state']} after {payload['steps_run']} steps on {plan['num_gpus']} x "
            f"{plan['gpu_type']} ({parallel_text(plan['parallel'])}, micro-batch {plan['micro_batch_size']}); "
            f"loss {_sig(payload['loss_first'])} -> {_sig(payload['loss_last'])}"
        )
        if payload["cause"]:
            console.print(f"[red]{payload['cause']}")
        peaks = m["peak_memory_bytes"] or []
        measured = ", ".join(_bytes_text(b) for b in peaks) if peaks else "not measured"
        source = f" ({m['memory_source']})" if m["memory_source"] else ""
        console.print(
            f"step time: measured {_seconds_text(m['step_time_s'])}, predicted {_seconds_text(p['step_time_s'])}; "
            f"peak memory per rank{source}: {measured}; MARP {_bytes_text(p['peak_allocated_bytes'])}"
        )

    _emit(args, payload, render)
    return 0 if payload["state"] == "succeeded" else 1


def cmd_export(args: argparse.Namespace) -> int:
    placement = load_placement(resolve(args.placement))
    if args.to == "slurm":
        text = to_slurm(placement, steps=args.steps, partition=args.partition)
    else:
        text = to_k8s(placement, steps=args.steps, image=args.image)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    payload = {"target": args.to, "out": args.out, "text": text}

    def render(_: Console) -> None:
        sys.stdout.write(text if not args.out else f"wrote {args.out}\n")

    _emit(args, payload, render)
    return 0


def cmd_reference(args: argparse.Namespace) -> int:
    from frenzy_opt.reference import payload, render

    def show(_: Console) -> None:
        sys.stdout.write(render())

    _emit(args, payload(), show)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from frenzy_opt.formats import import_spec

    if (args.file is None) == (args.args is None):
        raise ValueError("import: give FILE, or for megatron --args='--num-layers ...' (not both)")
    if args.args is not None and args.format != "megatron":
        raise ValueError("import: --args is for megatron argument lists; give FILE")
    result = import_spec(args.format, args.file, text=args.args, name=args.name, runtime=args.runtime,
                         global_batch_size=args.global_batch_size, vocab_size=args.vocab_size)  # fmt: skip
    text = yaml.safe_dump(result.spec, sort_keys=False)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    for note in result.notes:
        sys.stderr.write(f"frenzy import: note: {note}\n")
    payload = {"format": args.format, "source": args.file or "--args", "out": args.out, **asdict(result)}

    def show(_: Console) -> None:
        sys.stdout.write(f"wrote {args.out}\n" if args.out else text)

    _emit(args, payload, show)
    return 0


def wrap_clauses(line: str, width: int, indent: int = 11) -> str:
    """A long line broken between its clauses (after ``; `` or ``, ``), never inside one, continuation lines
    indented past the demo's time stamp; a clause longer than the width stays whole on its own line."""
    if len(line) <= width:
        return line
    pieces = re.split(r"(?<=[;,]) ", line)
    lines = [pieces[0]]
    for piece in pieces[1:]:
        if len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines.append(" " * indent + piece)
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    from frenzy_opt.api.server import demo

    scenario = load_scenario(args.scenario)
    console = Console(soft_wrap=True)
    width = shutil.get_terminal_size((120, 24)).columns

    def say(line: str) -> None:
        console.print(wrap_clauses(line, width), highlight=False)

    result = demo(scenario, time_scale=args.time_scale, say=say)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0 if all(state == "succeeded" for state in result["jobs"].values()) else 1


# --- entry point ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="frenzy", description="Memory-aware scheduling of LLM training jobs.")
    parser.add_argument("--version", action="version", version=f"frenzy-opt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        p.set_defaults(func=func)
        return p

    p = add("catalog", "list the GPU or model catalogue", cmd_catalog)
    p.add_argument("what", choices=("gpus", "models"))
    p = add("predict", "per-stage peak memory of a job on one GPU type", cmd_predict)
    p.add_argument("job", help="job spec file (YAML or JSON, contract 1) or a shipped job name")
    p.add_argument("--gpu", required=True, help="GPU type name or alias (see `frenzy catalog gpus`)")
    p.add_argument("--micro-batch-size", type=int, default=0, help="override training.micro_batch_size")
    p.add_argument("--trace", action="store_true", help="also run the trace path (real runtime, FakeTensorMode)")
    p = add("plan", "every memory-feasible plan of a job on a cluster, best first", cmd_plan)
    p.add_argument("job", help="job spec file (YAML or JSON, contract 1) or a shipped job name")
    p.add_argument("--cluster", required=True, help="cluster file or shipped cluster name (contract 2)")
    p.add_argument("--top", type=int, default=10, help="how many plans to show (default 10)")
    p.add_argument(
        "--per-type",
        type=int,
        help="also show the best N plans of each GPU type (default 1 on a cluster of several types, else 0)",
    )
    p.add_argument(
        "--headroom", type=float, help="fraction of GPU memory kept free above the upper bound (default: the fit's)"
    )
    p.add_argument("--calibration", help="step-time calibration profile (frenzy calibrate FILE --name NAME)")
    p.add_argument(
        "--export",
        choices=EXPORT_TARGETS,
        help="print the plan the scheduler takes on the empty cluster as a Slurm batch script or a Kubernetes "
        "manifest instead of the table (as `frenzy export` writes them)",
    )
    p.add_argument("--out", help="--export: write the script or manifest here and print the table")
    p = add(
        "validate",
        "score MARP or the step-time model on measured runs (calibration-format CSV), cross-validated",
        cmd_validate,
    )
    p.add_argument("what", choices=("memory", "steptime", "layers"))
    p.add_argument(
        "file",
        help="CSV in the format of ../shared/calibration/{memory,steptime}-measured.csv; layers: Sailor's profile "
        "folder or a calibration profile's JSON file",
    )
    p.add_argument(
        "--out", help="also write the Markdown report (docs/marp-validation.md, docs/steptime-validation.md)"
    )
    p.add_argument("--calibration", help="steptime: score a stored calibration profile instead of the shipped fit")
    p = add(
        "calibrate", "refit the shipped parameters, or store a calibration profile, from measured runs", cmd_calibrate
    )
    p.add_argument("file", help="calibration-format CSV (memory or steptime), or launcher JSON reports")
    p.add_argument("more", nargs="*", help="more launcher JSON reports or CSV files (profiles only)")
    p.add_argument(
        "--name",
        required=True,
        help="memory or steptime (refit the shipped fit), or a profile name for plan/solve/simulate/serve "
        "--calibration NAME",
    )
    p.add_argument(
        "--out", help="memory/steptime: where to write the fit; a profile: the profile directory instead of the default"
    )
    p = add("profile", "measure a job's layers on this machine's CUDA GPU into a calibration profile", cmd_profile)
    p.add_argument("job", nargs="?", help="job spec file or shipped job name (the shapes to measure)")
    p.add_argument("--name", required=True, help="calibration profile to add the measurements to")
    p.add_argument("--gpu", help="the GPU's catalogue type (default: from the CUDA device name)")
    p.add_argument("--micro-batches", help="comma-separated micro-batch sizes (default: the planner's choices)")
    p.add_argument("--tp", help="comma-separated tensor-parallel degrees (default: 1, 2, 4, 8 where they divide)")
    p.add_argument("--warmup", type=int, default=3, help="untimed repetitions first (default 3)")
    p.add_argument("--iters", type=int, default=10, help="timed repetitions, the median kept (default 10)")
    p.add_argument("--from-sailor", metavar="DIR", help="import Sailor's per-layer profiles (its artefact's folder)")
    p.add_argument("--dir", help="the calibration profile directory (default $FRENZY_CALIBRATIONS or ~/.frenzy)")
    p = add("solve", "schedule a scenario's jobs with the greedy HAS, CP-SAT, or both", cmd_solve)
    p.add_argument("scenario", help="scenario file or shipped name")
    p.add_argument("--calibration", help="step-time calibration profile (frenzy calibrate FILE --name NAME)")
    p.add_argument("--solver", choices=("greedy", "cpsat", "both"), default="both")
    p.add_argument("--time-limit", type=float, default=30.0, help="CP-SAT time limit in seconds (default 30)")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT search workers (default 2)")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default 0)")
    p.add_argument("--plot", help="directory for a Gantt chart per solver (PNG)")
    p = add("simulate", "replay a scenario's workload under one or more scheduling policies", cmd_simulate)
    p.add_argument("scenario", help="scenario file or shipped name (jobs or a workload generator)")
    p.add_argument("--calibration", help="step-time calibration profile the policies plan with")
    p.add_argument("--policy", default="frenzy", help=f"comma-separated policies: {', '.join(policy_names())}")
    p.add_argument("--plot", help="directory for the JCT CDF, utilization and Gantt charts (PNG)")
    p.add_argument("--mtbf-h", type=float, help="inject node failures: mean time between failures per node (hours)")
    p.add_argument("--repair-s", type=float, default=1800.0, help="seconds a failed node stays down (default 1800)")
    p.add_argument("--checkpoint-s", type=float, default=1800.0, help="checkpoint interval of jobs (default 1800)")
    p.add_argument("--seed", type=int, default=0, help="seed of the failures and the noisy truth (default 0)")
    _add_truth_args(p, "model")
    p.add_argument("--seeds", type=int, help="run seeds SEED…SEED+N-1 (truth, failures, workload): means and 95 %% CIs")
    p.add_argument(
        "--workload-file", help="replay this workload file on the scenario's cluster (with --workload-format)"
    )
    p.add_argument("--workload-format", help="format of --workload-file: sia (name, time, application, ...)")
    p = add("compare", "run policies on scenarios and write the Markdown comparison report", cmd_compare)
    p.add_argument(
        "scenarios", nargs="*", help=f"llm section's scenarios (default: {' '.join(DEFAULT_COMPARE_SCENARIOS)})"
    )
    p.add_argument(
        "--sections",
        help="comma-separated: llm, failures, profiled, hours, sia-traces, sensitivity (default: all; with "
        "SCENARIOS: llm,failures,profiled)",
    )
    p.add_argument("--policy", default=COMPARE_OPTIONS["policy"], help="comma-separated policies")
    p.add_argument("--out", default=DEFAULT_REPORT, help=f"report path (default {DEFAULT_REPORT})")
    p.add_argument("--overwrite", action="store_true", help="replace the report at --out if it exists")
    p.add_argument("--no-failures", action="store_true", help=f"skip the failure experiment on {DEFAULT_FAILURES[0]}")
    _add_truth_args(p, DEFAULT_COMPARE_TRUTH)
    p.add_argument(
        "--seeds", type=int, default=DEFAULT_COMPARE_SEEDS, help=f"seeds per scenario (default {DEFAULT_COMPARE_SEEDS})"
    )
    p.add_argument(
        "--no-profiled", action="store_true", help=f"skip {DEFAULT_PROFILED_SCENARIO} under the profiled truth"
    )
    for dest, help_text in COMPARE_HELP.items():
        default = COMPARE_OPTIONS[dest]
        kind = int if isinstance(default, int) else str
        shown = f" (default {default})" if default is not None else ""
        p.add_argument("--" + dest.replace("_", "-"), type=kind, default=default, help=help_text + shown)
    p = add("serve", "run the HTTP service (FastAPI under uvicorn)", cmd_serve)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--calibration", help="step-time calibration profile to plan with; the closed loop learns into it")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--db",
        default="sqlite:///frenzy-opt.db",
        help="SQLAlchemy URL or a SQLite file path (default: SQLite file frenzy-opt.db)",
    )
    p.add_argument(
        "--create",
        action="store_true",
        help="create the job store if it does not exist (without it, a missing SQLite file or a database without "
        "the tables is refused: a volume not mounted must not start an empty store)",
    )
    p.add_argument("--cluster", default="paper-3type", help="cluster file or shipped name (default paper-3type)")
    p.add_argument("--executor", default="simulated", help="simulated, local (torchrun) or ray (RAY_ADDRESS)")
    p.add_argument("--workdir", default="frenzy-runs", help="local/ray executors: where runs keep their files")
    p.add_argument("--tokens", help="tokens/tenants/quotas file (YAML or JSON); none: single-tenant local mode")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulated executor: cluster seconds per second")
    p.add_argument("--fail-rate", type=float, default=0.0, help="simulated executor: fraction of attempts that fail")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="API worker processes in front of the scheduler (1: the scheduler's process serves the API)",
    )
    p.add_argument(
        "--decision-wait-s",
        type=float,
        default=0.0,
        help="how long a submission without ?wait waits for its first decision (0: answered once stored)",
    )
    from frenzy_opt.api.httplimits import DEFAULT_LIMITS as HTTP  # HTTP limits: docs/service.md

    p.add_argument(
        "--max-header-bytes",
        type=int,
        default=HTTP.max_header_bytes,
        help=f"request line plus headers, bytes; over it: 431 (default {HTTP.max_header_bytes})",
    )
    p.add_argument(
        "--header-timeout-s",
        type=float,
        default=HTTP.header_timeout_s,
        help="a connection whose request line and headers are not complete this long after it opened (or after "
        f"the request's first byte) is closed (default {HTTP.header_timeout_s:g})",
    )
    p.add_argument(
        "--keep-alive-s",
        type=int,
        default=HTTP.keep_alive_s,
        help="idle keep-alive between requests; behind a proxy: longer than its idle timeout "
        f"(default {HTTP.keep_alive_s})",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=HTTP.max_connections,
        help="open connections; one more is closed at once, and a request is answered 503 while this many are open "
        f"or in progress (default {HTTP.max_connections})",
    )
    p = add(
        "launch", "plan, place and really run one job (torch.distributed) and compare with the prediction", cmd_launch
    )
    p.add_argument("job", help="job spec file (YAML or JSON, contract 1) or a shipped job name")
    p.add_argument("--cluster", default="local-4slot", help="cluster file or shipped name (default local-4slot)")
    p.add_argument("--executor", default="local", help="local (torchrun on this machine) or ray (RAY_ADDRESS)")
    p.add_argument("--steps", type=int, help="train at most this many steps (default: the spec's train_steps)")
    p.add_argument("--workdir", default="frenzy-runs", help="where runs keep their files (default frenzy-runs)")
    p = add("export", "a placement as a Slurm batch script or a Kubernetes manifest", cmd_export)
    p.add_argument("placement", help="placement file (JSON/YAML: job, plan, placement; e.g. frenzy launch --json)")
    p.add_argument("--to", required=True, choices=EXPORT_TARGETS)
    p.add_argument("--out", help="write here instead of stdout")
    p.add_argument("--steps", type=int, help="train at most this many steps")
    p.add_argument("--partition", help="slurm: the partition to submit to")
    p.add_argument("--image", default="frenzy-opt:latest", help="k8s: the container image with frenzy-opt")
    add("reference", "the field reference of job specs, cluster files and the GPU catalogue (Markdown)", cmd_reference)
    p = add("import", "a job spec (contract 1) from a HF config.json, a torchtitan TOML or Megatron args", cmd_import)
    p.add_argument("format", choices=("hf", "torchtitan", "megatron"))
    p.add_argument("file", nargs="?", help="the file to read (local files only)")
    p.add_argument("--args", help="megatron: the argument list as a string (--args='--num-layers 32 ...')")
    p.add_argument("--out", help="write the spec here instead of stdout")
    p.add_argument("--name", help="the job's name (default: from the source)")
    p.add_argument("--runtime", help="hf: training.runtime of the spec (default: contract 1's)")
    p.add_argument("--global-batch-size", type=int, help="training.global_batch_size (torchtitan's -1 needs it)")
    p.add_argument("--vocab-size", type=int, help="megatron, torchtitan: the tokenizer's vocabulary size")
    p = add("demo", "the serverless flow in a minute: service, HTTP submissions, live decisions", cmd_demo)
    p.add_argument("scenario", nargs="?", default=DEFAULT_SCENARIO, help="scenario file or shipped name")
    p.add_argument("--time-scale", type=float, default=3600.0, help="cluster seconds per wall second (default 3600)")
    p = add("run", "plan every job of a scenario (default: the embedded default scenario)", cmd_run)
    p.add_argument("scenario", nargs="?", default=DEFAULT_SCENARIO, help="scenario file or shipped name")
    p.add_argument("--top", type=int, default=3, help="plans kept per job in --json output (default 3)")
    client.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "top", 1) < 1:
        print("frenzy: --top must be a positive integer", file=sys.stderr)
        return 2
    try:
        code: int = args.func(args)
        return code
    except ValueError as err:  # bad input, infeasible job: the message names the field or the memory needed
        print(f"frenzy: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
