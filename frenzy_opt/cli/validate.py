"""``frenzy validate``, ``calibrate`` and ``profile``: the models against measured runs, refits, layer profiles."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from frenzy_opt.core.spec import load_job
from frenzy_opt.hardware.gpus import resolve_gpu

if TYPE_CHECKING:  # the report pulls in matplotlib: imported when compare runs
    pass
from frenzy_opt.cli.common import _emit

# --- validate / calibrate ------------------------------------------------------------------------------


def _validate_steptime(args: argparse.Namespace) -> int:
    from frenzy_opt.prediction.calibrations import resolve_model
    from frenzy_opt.validation.steptime_report import render_markdown
    from frenzy_opt.validation.steptime_runs import fittable
    from frenzy_opt.validation.steptime_validation import refused, validate

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
    from frenzy_opt.validation.memory_validation import render_markdown, validate

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
    from frenzy_opt.validation.steptime_fit import cross_validate, fit, score
    from frenzy_opt.validation.steptime_runs import read_any, usable
    from frenzy_opt.validation.steptime_validation import calibrate, summarise, write_fit

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
    from frenzy_opt.validation.memory_runs import read_measurements, usable
    from frenzy_opt.validation.memory_scores import score_run, summarise
    from frenzy_opt.validation.memory_validation import calibrate, write_fit

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
        from frenzy_opt.planning.candidates import MICRO_BATCH_CHOICES

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
