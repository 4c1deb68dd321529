"""``frenzy catalog``, ``predict`` and ``plan``: what the catalogue holds, a job's memory, its plans."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from frenzy_opt.core.readable import parallel_text
from frenzy_opt.core.spec import JobSpec, load_job
from frenzy_opt.hardware.gpus import load_gpus, resolve_gpu
from frenzy_opt.models.catalog import load_catalog
from frenzy_opt.planning.candidates import micro_batch_summary
from frenzy_opt.planning.export import to_k8s, to_slurm
from frenzy_opt.planning.plans import Plan, PlanSearch, search_or_fail
from frenzy_opt.planning.scenario import load_cluster_ref, resolve
from frenzy_opt.prediction.marp.predictor import MemoryPrediction, predict_memory

if TYPE_CHECKING:  # the report pulls in matplotlib: imported when compare runs
    pass
from frenzy_opt.cli.common import _emit, _gib

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
    from frenzy_opt.prediction.marp.allocator.replay import replay

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
