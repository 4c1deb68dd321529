"""Real runs of a tiny decoder on CPU slots in every parallel mode the worker runs: measured vs predicted peak
memory and step time, and the closed loop's refit of the CPU-SLOT efficiency from those runs.

Each mode is a `frenzy launch` (local executor, torchrun + gloo, `local-4slot` cluster) of the job below
with its parallel fields pinned. Memory: MemTracker's peak live tensor bytes per rank where it applies
(single, DDP, ZeRO-1, TP), else the process's peak RSS (not comparable with MARP; marked). Step time: the
median over steps 2-20 against the step-time model's prediction for the same plan, before and after the
refit (`frenzy_opt/prediction/closedloop.py`).

Usage, from the repository root::

    .venv/bin/python benchmarks/launcher_runs.py [--out benchmarks/results/launcher_runs.md]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from frenzy_opt.core.machine import describe_machine
from frenzy_opt.core.spec import parse_job
from frenzy_opt.planning.plans import DEFAULT_STEP_MODEL
from frenzy_opt.planning.scenario import load_cluster_ref
from frenzy_opt.prediction.closedloop import memory_errors, predicted_step_s, recalibrate, sample_of
from frenzy_opt.service.launcher import launch_job

MODEL = {
    "num_layers": 4, "hidden_size": 128, "ffn_hidden_size": 384, "num_attention_heads": 4, "num_kv_heads": 2,
    "vocab_size": 1024, "mlp": "swiglu", "norm": "rmsnorm", "tied_embeddings": False,
}  # fmt: skip
TRAINING = {"seq_len": 128, "micro_batch_size": 2, "global_batch_size": 8, "train_steps": 20, "precision": "fp32"}
MODES: dict[str, tuple[dict[str, Any], str]] = {
    "single": ({"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0}, "megatron"),
    "DDP dp2": ({"dp": 2, "tp": 1, "pp": 1, "zero_stage": 0}, "megatron"),
    "ZeRO-1 dp2": ({"dp": 2, "tp": 1, "pp": 1, "zero_stage": 1}, "megatron"),
    "FSDP2 dp2": ({"dp": 2, "tp": 1, "pp": 1, "zero_stage": 3}, "fsdp2"),
    "TP tp2": ({"dp": 1, "tp": 2, "pp": 1, "sequence_parallel": False}, "megatron"),
    "PP pp2": ({"dp": 1, "tp": 1, "pp": 2}, "megatron"),
    "PP x TP 2x2": ({"dp": 1, "tp": 2, "pp": 2, "sequence_parallel": False}, "megatron"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default="benchmarks/results/launcher_runs.md")
    args = parser.parse_args()
    cluster = load_cluster_ref("local-4slot")
    started = time.perf_counter()
    rows, samples = [], []
    with tempfile.TemporaryDirectory(prefix="frenzy-launch-") as tmp:
        for name, (parallel, runtime) in MODES.items():
            spec = parse_job(
                {"name": "bench", "model": MODEL, "training": {**TRAINING, "runtime": runtime}, "parallel": parallel}
            )
            out = launch_job(spec, cluster, workdir=Path(tmp), job_id=name.replace(" ", "-"))
            measured = {
                "steps_run": out["steps_run"],
                "step_time_s": out["measured"]["step_time_s"],
                "peak_memory_bytes": out["measured"]["peak_memory_bytes"],
                "memory_source": out["measured"]["memory_source"],
            }
            sample = sample_of(name, spec, out["plan"], measured, cluster)
            if sample is not None:
                samples.append(sample)
            peaks = out["measured"]["peak_memory_bytes"] or [0]
            rows.append((name, out, sample, max(peaks)))
            print(name, out["state"], out["loss_first"], out["loss_last"], flush=True)
    model, report = recalibrate(samples, DEFAULT_STEP_MODEL)
    entry = report.get("CPU-SLOT@fp32", {})
    # Leave one run out: each run predicted by the efficiency refitted on the other runs.
    held_out = []
    for i, sample in enumerate(samples):
        others, _ = recalibrate(samples[:i] + samples[i + 1 :], DEFAULT_STEP_MODEL)
        held_out.append(abs(predicted_step_s(sample, others) / sample.step_time_s - 1))
    cv_error = sum(held_out) / len(held_out) if held_out else float("nan")
    errors = {e["job"]: e["error"] for e in memory_errors(samples)}
    lines = [
        "# Real runs on CPU slots: measured vs predicted",
        "",
        f"Command: `.venv/bin/python benchmarks/launcher_runs.py`. Machine: {describe_machine()}. "
        f"Took {time.perf_counter() - started:.0f} s.",
        "",
        f"Job: a {MODEL['num_layers']}-layer decoder (hidden {MODEL['hidden_size']}, vocab {MODEL['vocab_size']}), "
        f"sequence {TRAINING['seq_len']}, global batch {TRAINING['global_batch_size']}, "
        "the micro-batch (mb) as planned, fp32, 20 steps, `frenzy launch` on `local-4slot` (torchrun, gloo). "
        "Memory error = MARP peak allocated / measured max over ranks - 1 (MemTracker only). Step time: median of "
        "steps 2-20; predicted by the default model and by the model refitted on all these runs.",
        "",
        "| mode | mb | state | loss first -> last | measured peak (max rank) | source | MARP peak allocated "
        "| memory error | measured step s | predicted s (default) | predicted s (refit) |",
        "|---|---:|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, out, sample, peak in rows:
        default = predicted_step_s(sample, DEFAULT_STEP_MODEL) if sample else None
        refit = predicted_step_s(sample, model) if sample else None
        err = errors.get(name)
        lines.append(
            f"| {name} | {out['plan']['micro_batch_size']} | {out['state']} "
            f"| {out['loss_first']:.3f} -> {out['loss_last']:.3f} | {peak / 2**20:.2f} MiB "
            f"| {out['measured']['memory_source']} | {out['predicted']['peak_allocated_bytes'] / 2**20:.2f} MiB "
            f"| {'-' if err is None else f'{err:+.1%}'} | {out['measured']['step_time_s']:.4f} "
            f"| {default or 0:.5f} | {refit or 0:.4f} |"
        )
    lines += [
        "",
        f"Closed loop, CPU-SLOT@fp32: efficiency {entry.get('efficiency_before', 0):.4g} -> "
        f"{entry.get('efficiency_after', 0):.4g}; mean relative step-time error "
        f"{entry.get('step_time_error_before', 0):.1%} -> {entry.get('step_time_error_after', 0):.1%} "
        f"over {entry.get('samples', 0)} runs (in sample); {cv_error:.1%} with each run left out of the refit "
        "that predicts it.",
        "",
    ]
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
