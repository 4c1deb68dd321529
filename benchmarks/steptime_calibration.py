"""Benchmark: calibrating the step-time model's per-GPU-type efficiency on Sailor's measured per-layer times.

Reads the Sailor profiles under ``--traces`` (default ``../shared/traces`` next to the repository; the files
are read in place, never copied), fits one efficiency per GPU type with :mod:`frenzy_opt.calibration`, and
writes a Markdown report: per GPU type the fitted efficiency, the number of fitted measurements, and the mean
and max |relative error| of the per-block time predictions after calibration and before it (with
``steptime.DEFAULT_EFFICIENCY``); then a held-out check, the per-(model, GPU) spread, the excluded rows and
the tensor-parallel rows the fit leaves out.

Usage::

    python -P benchmarks/steptime_calibration.py --out benchmarks/results/steptime_calibration.md
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import shlex
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from frenzy_opt.calibration import (
    SAILOR_DIR,
    SAILOR_GPUS,
    TENSOR_PARALLEL_RULE,
    TF32_OFF_RULE,
    BlockMeasurement,
    Exclusion,
    Prediction,
    calibrate,
    evaluate,
    fit_block_efficiency,
    load_sailor_profiles,
    max_abs_error,
    mean_abs_error,
    sailor_dir,
    select_for_fit,
    split_largest_micro_batch,
)
from frenzy_opt.gpus import lookup_gpu
from frenzy_opt.machine import cpu_model
from frenzy_opt.steptime import DEFAULT_EFFICIENCY, StepTimeModel, peak_tflops

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO.parent / "shared" / "traces"


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _by_gpu(rows: Sequence[Prediction]) -> dict[str, list[Prediction]]:
    out: dict[str, list[Prediction]] = defaultdict(list)
    for p in rows:
        out[p.measurement.gpu].append(p)
    return out


def _rank(gpu: str) -> int:
    """Position of a GPU type in Sailor's GPU list (report order)."""
    order = list(SAILOR_GPUS.values())
    return order.index(gpu) if gpu in order else len(order)


def _worst(predictions: Sequence[Prediction]) -> str:
    p = max(predictions, key=lambda q: abs(q.error))
    m = p.measurement
    return f"{m.model} b{m.micro_batch_size} tp{m.tp}: {_pct(p.error)}"


def render(traces: Path, command: str, weighting: str) -> str:
    folder = sailor_dir(traces)
    profiles = load_sailor_profiles(traces)
    kept, excluded = select_for_fit(profiles.measurements)
    calibration = calibrate(kept, weighting=weighting, excluded=excluded)
    calibrated = calibration.model()
    before = StepTimeModel()
    commit_file = folder / ".source_commit"
    commit = commit_file.read_text().strip() if commit_file.is_file() else "unknown"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Step-time model calibration on Sailor's per-layer profiles",
        "",
        f"- Command: `{command}`",
        f"- Machine: {platform.platform()}; nproc {len(os.sched_getaffinity(0))}; CPU {cpu_model()}; "
        f"Python {platform.python_version()}",
        f"- Date: {now}",
        f"- Data: `{folder}` (Sailor, Strati et al., SOSP 2025, github.com/eth-easl/sailor commit {commit}); "
        f"{len(profiles.measurements)} (model, GPU, micro-batch, tp) measurements on catalogue GPUs",
        f"- Fit: `frenzy_opt.calibration`, weighting `{weighting}`",
        "",
        "A measurement is the forward + backward seconds of one transformer block over one micro-batch on one",
        "GPU of the tensor-parallel group (mean of the two blocks Sailor times). The model prices it as",
        "`3 b s (2 P + 4 s a d) / tp` FLOPs at `peak_tflops(gpu, 'fp32') x efficiency` (Sailor trains in fp32:",
        "the TF32 tensor rate on A100 and RTX 3090, the CUDA-core rate on V100 and RTX 2080 Ti), plus, for tp > 1,",
        "four ring all-reduces of the block's fp32 activations over the spec-sheet intra-node link at 80 %.",
        "Errors are `(predicted - measured) / measured`; positive = predicted too slow.",
        "",
        "## Fitted efficiency per GPU type (tp = 1 rows, after the stated exclusions)",
        "",
        "Before = `steptime.DEFAULT_EFFICIENCY` of the GPU's architecture on the same peak.",
        "",
        "| GPU type | fp32 peak TFLOP/s | fitted efficiency | measurements | mean abs error | max abs error "
        "| default efficiency | mean abs error before | max abs error before | worst row after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for fit in sorted(calibration.fits, key=lambda f: _rank(f.gpu)):
        gpu = lookup_gpu(fit.gpu)
        rows = [p.measurement for p in fit.predictions]
        old = evaluate(rows, before)
        lines.append(
            f"| {fit.gpu} | {peak_tflops(gpu, 'fp32'):g} | {fit.efficiency:.3f} | {len(rows)} "
            f"| {_pct(fit.mean_abs_error)} | {_pct(fit.max_abs_error)} "
            f"| {DEFAULT_EFFICIENCY.get(gpu.architecture, 0.5):.2f} | {_pct(mean_abs_error(old))} "
            f"| {_pct(max_abs_error(old))} | {_worst(fit.predictions)} |"
        )
    all_after = [p for fit in calibration.fits for p in fit.predictions]
    all_before = evaluate([p.measurement for p in all_after], before)
    lines += [
        f"| all | | | {len(all_after)} | {_pct(mean_abs_error(all_after))} | {_pct(max_abs_error(all_after))} "
        f"| | {_pct(mean_abs_error(all_before))} | {_pct(max_abs_error(all_before))} | |",
        "",
    ]
    other = "absolute" if weighting == "relative" else "relative"
    alt = calibrate(kept, weighting=other)
    lines += [
        f"With `{other}` weighting instead: "
        + "; ".join(
            f"{f.gpu} {f.efficiency:.3f} (mean {_pct(f.mean_abs_error)}, max {_pct(f.max_abs_error)})"
            for f in sorted(alt.fits, key=lambda f: _rank(f.gpu))
        )
        + ".",
        "",
    ]
    lines += _held_out(kept, weighting)
    lines += _per_model(kept, weighting)
    lines += _excluded_tf32(excluded)
    lines += _tensor_parallel(excluded, calibrated)
    lines += [
        "## Not used",
        "",
        *(f"- `{s}`" for s in profiles.skipped),
        *_duplicates(folder),
        _sia_note(traces),
        "",
    ]
    return "\n".join(lines)


def _held_out(kept: list[BlockMeasurement], weighting: str) -> list[str]:
    train, test = split_largest_micro_batch(kept)
    model = calibrate(train, weighting=weighting).model()
    lines = [
        "## Held out: the largest micro-batch of each (model, GPU) profile",
        "",
        "Fitted on the other micro-batch sizes, then predicted.",
        "",
        "| GPU type | efficiency (fit without them) | held-out rows | mean abs error | max abs error | rows |",
        "|---|---:|---:|---:|---:|---|",
    ]
    predictions = evaluate(test, model)
    for gpu, rows in sorted(_by_gpu(predictions).items(), key=lambda kv: _rank(kv[0])):
        detail = ", ".join(f"{p.measurement.model} b{p.measurement.micro_batch_size}: {_pct(p.error)}" for p in rows)
        lines.append(
            f"| {gpu} | {model.efficiency[gpu]:.3f} | {len(rows)} | {_pct(mean_abs_error(rows))} "
            f"| {_pct(max_abs_error(rows))} | {detail} |"
        )
    lines += [
        f"| all | | {len(predictions)} | {_pct(mean_abs_error(predictions))} | {_pct(max_abs_error(predictions))} | |",
        "",
    ]
    return lines


def _per_model(kept: list[BlockMeasurement], weighting: str) -> list[str]:
    groups: dict[tuple[str, str], list[BlockMeasurement]] = defaultdict(list)
    for m in kept:
        groups[m.gpu, m.model].append(m)
    lines = [
        "## Efficiency of each (model, GPU) profile alone (tp = 1)",
        "",
        "Each profile alone is fitted to a few percent at every micro-batch size; the error of the per-GPU fit",
        "comes from the spread between models on the same GPU, which one efficiency per GPU type cannot follow.",
        "",
        "| GPU type | model | rows | efficiency alone | achieved TFLOP/s | max abs error of its own fit |",
        "|---|---|---:|---:|---|---:|",
    ]
    for (gpu, model), rows in sorted(groups.items(), key=lambda kv: (_rank(kv[0][0]), kv[0][1])):
        efficiency = fit_block_efficiency(rows, weighting=weighting)
        own = evaluate(rows, StepTimeModel(efficiency={gpu: efficiency}))
        rates = [m.achieved_tflops for m in rows]
        lines.append(
            f"| {gpu} | {model} | {len(rows)} | {efficiency:.3f} | {min(rates):.1f}-{max(rates):.1f} "
            f"| {_pct(max_abs_error(own))} |"
        )
    lines.append("")
    return lines


def _excluded_tf32(excluded: Sequence[Exclusion]) -> list[str]:
    groups: dict[tuple[str, str], list[BlockMeasurement]] = defaultdict(list)
    for e in excluded:
        if e.reason == TF32_OFF_RULE:
            groups[e.measurement.gpu, e.measurement.model].append(e.measurement)
    lines = [
        "## Excluded: profiles that ran with TF32 off",
        "",
        f"Rule: {TF32_OFF_RULE}.",
        "",
        "| GPU type | model | rows | achieved TFLOP/s | fraction of CUDA-core fp32 peak | fraction of TF32 peak |",
        "|---|---|---:|---|---|---|",
    ]
    for (gpu, model), rows in sorted(groups.items()):
        g = lookup_gpu(gpu)
        rates = [m.achieved_tflops for m in rows]
        lines.append(
            f"| {gpu} | {model} | {len(rows)} | {min(rates):.1f}-{max(rates):.1f} "
            f"| {min(rates) / g.fp32_tflops:.2f}-{max(rates) / g.fp32_tflops:.2f} "
            f"| {min(rates) / peak_tflops(g, 'fp32'):.3f}-{max(rates) / peak_tflops(g, 'fp32'):.3f} |"
        )
    lines.append("")
    return lines


def _tensor_parallel(excluded: Sequence[Exclusion], calibrated: StepTimeModel) -> list[str]:
    rows = [e.measurement for e in excluded if e.reason == TENSOR_PARALLEL_RULE]
    predictions = evaluate(rows, calibrated)
    lines = [
        "## Not fitted: tensor-parallel rows, predicted with the calibrated model",
        "",
        f"Rule: {TENSOR_PARALLEL_RULE}. Prediction = compute at the fitted efficiency + the model's all-reduce",
        "time on the catalogue link (A100 NVLink 300 GB/s, V100 NVLink 150 GB/s, RTX 2080 Ti PCIe 3 16 GB/s,",
        "RTX 3090 PCIe 4 32 GB/s per direction, at 80 %). LLAMA-3-8 and OPT-30 on V100 have only tp >= 4 rows:",
        "they are out of sample for the fit. Each (model, GPU) also carries its tp = 1 error (the previous tables).",
        "",
        "| GPU type | model | tp | rows | mean error | mean abs error | max abs error | worst row |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    groups: dict[tuple[str, str, int], list[Prediction]] = defaultdict(list)
    for p in predictions:
        groups[p.measurement.gpu, p.measurement.model, p.measurement.tp].append(p)
    for (gpu, model, tp), group in sorted(groups.items(), key=lambda kv: (_rank(kv[0][0]), kv[0][1], kv[0][2])):
        signed = sum(p.error for p in group) / len(group)
        lines.append(
            f"| {gpu} | {model} | {tp} | {len(group)} | {_pct(signed)} | {_pct(mean_abs_error(group))} "
            f"| {_pct(max_abs_error(group))} | {_worst(group)} |"
        )
    lines += [
        f"| all | | | {len(predictions)} | {_pct(sum(p.error for p in predictions) / len(predictions))} "
        f"| {_pct(mean_abs_error(predictions))} | {_pct(max_abs_error(predictions))} | |",
        "",
    ]
    return lines


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _sia_note(traces: Path) -> str:
    """Why the Sia traces do not calibrate the model, from the files themselves."""
    sia = traces / "sia-heterogeneous" / "traces"
    if not sia.is_dir():
        return "- `sia-heterogeneous`: not present under the traces folder."
    parts = []
    for name, label in (("dgx-ext", "A100"), ("rtx", "RTX 2080 Ti")):
        path = sia / "gpt_pmp" / f"placements-{name}.csv"
        if path.is_file():
            rows = _csv(path)
            per = {round(float(r["step_time"]) / float(r["local_bsz"]), 9) for r in rows}
            parts.append(f"{label}: {len(rows)} rows, step_time / local_bsz takes {len(per)} value(s) ({min(per):g} s)")
    bert = sia / "bert" / "placements-dgx-ext.csv"
    bert_note = ""
    if bert.is_file():
        single = sorted((int(r["local_bsz"]), float(r["step_time"])) for r in _csv(bert) if r["placement"] == "1")
        if single:
            (b0, t0), (b1, t1) = single[0], single[-1]
            bert_note = f" (BERT on one A100: {t0:.3f} s at batch {b0}, {t1:.3f} s at batch {b1})"
    return (
        "- `sia-heterogeneous`: its only LLM trace, `gpt_pmp` (a 2.8B GPT in a pipeline, sequence length and "
        f"precision not stated), is linear in the batch by construction ({'; '.join(parts)}); the other Sia "
        "models are not decoder LLMs, and their size, sequence length and precision are not in the traces, so "
        f"their FLOPs are unknown{bert_note}. Neither calibrates a FLOP-rate efficiency."
    )


def _duplicates(folder: Path) -> list[str]:
    """Profiles identical to another model's profile on the same GPU: one of the two is a copy."""
    seen: dict[tuple[str, str], Path] = {}
    notes = []
    for path in sorted((folder / "profiles").glob("*/*/profile.json")):
        text = path.read_text(encoding="utf-8").strip()
        key = (path.parent.name, text)
        if key not in seen:
            seen[key] = path
            continue
        first = seen[key]
        by_tp = next(iter(json.loads(text).values()))
        entries = len(next(iter(by_tp.values())))
        notes.append(
            f"- `{first.parent.parent.name}/{first.parent.name}` and `{path.parent.parent.name}/{path.parent.name}` "
            f"are identical files ({entries} layer entries per micro-batch and tp): one is a copy of the other "
            "model's profile, not a measurement of its own."
        )
    return notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="traces folder (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="Markdown file to write (default: stdout)")
    parser.add_argument("--weighting", choices=("relative", "absolute"), default="relative")
    args = parser.parse_args(argv)
    if not (args.traces / SAILOR_DIR).is_dir() and not (args.traces / "profiles").is_dir():
        parser.error(f"no Sailor profiles under {args.traces}")
    flags = ["-P"] if sys.flags.safe_path else []
    command = shlex.join([sys.executable, *flags, *sys.argv])
    text = render(args.traces, command, args.weighting)
    if args.out is None:
        print(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
