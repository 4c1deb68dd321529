"""MARP's peak_allocated_bytes against the trace path (the real runtimes under FakeTensorMode), per stage.

    .venv/bin/python benchmarks/marp_vs_trace.py --out benchmarks/results/marp_vs_trace.md [--quick]

For each configuration of the grid (per runtime: model shapes from small to 8B-class, dp, tp, sp, pp,
recompute, micro-batch, zero_stage, seq_len) it traces the first and last pipeline stage
(:func:`frenzy_opt.tracing.trace_job`) and predicts them with ``predict_memory(job, None, cuda=None)``,
then writes the relative gap, the phase of each peak and the components (model states at the end of the
last step vs MARP's weights + grads + master + optimizer states; the rest of each peak).
8B-class shapes use the real widths (hidden 4096, ffn 14336, 32/8 heads, vocab 128256) with few layers:
the cost of a fake trace grows with the number of ops, and every layer of a stage is alike.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.prediction.marp.predictor import predict_memory
from frenzy_opt.tracing import trace_job
from frenzy_opt.tracing.common import live_blocks_at_end

MIB = 2**20

SHAPES = {
    "s-256": ModelArch(name="s-256", num_layers=4, hidden_size=256, ffn_hidden_size=768, num_attention_heads=8,
                       num_kv_heads=4, vocab_size=8192),
    "m-1024": ModelArch(name="m-1024", num_layers=4, hidden_size=1024, ffn_hidden_size=2816, num_attention_heads=16,
                        num_kv_heads=8, vocab_size=32000),
    "l-2048": ModelArch(name="l-2048", num_layers=4, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=32,
                        num_kv_heads=8, vocab_size=128256),
    "8b-4L": ModelArch(name="8b-4L", num_layers=4, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                       num_kv_heads=8, vocab_size=128256),
}  # fmt: skip
MOE = ModelArch(name="moe-8x", num_layers=4, hidden_size=1024, ffn_hidden_size=2816, num_attention_heads=16,
                num_kv_heads=8, vocab_size=32000, num_experts=8, moe_top_k=2, moe_ffn_hidden_size=1408)  # fmt: skip
MOE_VARIANTS = [dict(dp=2), dict(dp=2, ep=2), dict(dp=4, ep=4), dict(dp=4, ep=2, tp=2, sequence_parallel=True),
                dict(dp=2, ep=2, recompute="full"), dict(dp=2, ep=2, pp=2)]  # fmt: skip

BASE = {"fsdp2": dict(zero_stage=3), "megatron": dict(zero_stage=1)}
VARIANTS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    # (parallel overrides, training overrides)
    (dict(dp=1, zero_stage=0), {}),
    (dict(dp=2), {}),
    (dict(dp=8), {}),
    (dict(dp=2, tp=2), {}),
    (dict(dp=2, tp=2, sequence_parallel=True), {}),
    (dict(dp=2, pp=2), {}),
    (dict(dp=1, pp=4, zero_stage=0), {}),
    (dict(dp=2, recompute="full"), {}),
    (dict(dp=2, recompute="selective"), {}),
    (dict(dp=2), dict(micro_batch_size=2)),
    (dict(dp=2), dict(seq_len=1024)),
    (dict(dp=4, tp=2, sequence_parallel=True, recompute="selective"), {}),
    (dict(dp=2, tp=4, sequence_parallel=True), dict(seq_len=1024)),
]
FSDP2_EXTRAS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    # torchtitan's loss on the full logits (``loss_chunks=1``: plain CrossEntropyLoss, no ChunkedLossWrapper),
    # and a long sequence, where a loss chunk's logits outgrow the output layer's gradient buffers.
    (dict(dp=2), dict(loss_chunks=1)),
    (dict(dp=8), dict(loss_chunks=1)),
    (dict(dp=2), dict(seq_len=4096)),
]
FSDP2_EXTRA_SHAPES = ("s-256", "m-1024")


def grid(runtime: str, quick: bool) -> list[JobSpec]:
    jobs = []
    shapes = ["s-256", "m-1024"] if quick else list(SHAPES)
    for shape in shapes:
        extras = FSDP2_EXTRAS if runtime == "fsdp2" and shape in FSDP2_EXTRA_SHAPES else []
        for parallel, training in VARIANTS + extras:
            par = {**BASE[runtime], **parallel}
            if runtime == "megatron" and par.get("dp", 1) == 1:
                par["zero_stage"] = 0
            if runtime == "fsdp2":
                par["zero_stage"] = 3
            train = dict(seq_len=512, micro_batch_size=1, global_batch_size=16, runtime=runtime) | training
            if par.get("sequence_parallel") and runtime == "megatron" and par.get("recompute") == "selective":
                pass
            name = f"{runtime}/{shape}/" + ",".join(f"{k}={v}" for k, v in sorted(parallel.items()))
            name += "".join(f",{k}={v}" for k, v in training.items())
            jobs.append(JobSpec(name=name, model=SHAPES[shape], training=TrainingConfig(**train),
                                parallel=ParallelConfig(**par)))  # fmt: skip
    if runtime == "megatron" and not quick:
        jobs += [replace(j, parallel=replace(j.parallel, attention="eager"), name=j.name + ",attention=eager")
                 for j in jobs if "m-1024" in j.name][:4]  # fmt: skip
        train = TrainingConfig(seq_len=512, micro_batch_size=1, global_batch_size=16, runtime=runtime)
        for parallel in MOE_VARIANTS:
            name = "megatron/moe-8x/" + ",".join(f"{k}={v}" for k, v in sorted(parallel.items()))
            jobs.append(
                JobSpec(name=name, model=MOE, training=train, parallel=ParallelConfig(zero_stage=1, **parallel))
            )
    return jobs


def top_transients(trace: Any, n: int = 6) -> list[tuple[str, float, int]]:
    """The largest groups of blocks alive at the peak that are not model states: (phase made, MiB, count)."""
    end = live_blocks_at_end(trace)
    groups: Counter[tuple[str, int]] = Counter()
    for block, size in trace.peak_live.items():
        if block not in end:
            groups[(trace.block_phase.get(block, "").split(":")[0], size)] += 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[0][1] * kv[1])[:n]
    return [(phase, round(size / MIB, 2), count) for (phase, size), count in ranked]


def trace_options(job: JobSpec) -> Any:
    """The tracer's options for ``job``: torchtitan's plain loss when ``training.loss_chunks`` is 1 (the tracer
    runs ``ChunkedLossWrapper`` with its default 8 chunks otherwise)."""
    chunks = job.training.loss_chunks
    if job.training.runtime != "fsdp2" or chunks is None or chunks == 8:
        return None
    if chunks != 1:
        raise ValueError(f"the fsdp2 tracer runs 1 or 8 loss chunks, not {chunks}")
    from frenzy_opt.tracing.titan import TitanOptions

    return TitanOptions(chunked_loss=False)


def marp_columns(job: JobSpec, stage: int, trace_peak: int) -> dict[str, Any]:
    """MARP's side of one row: ``predict_memory(job, None, cuda=None)`` for ``stage`` against the trace's peak."""
    p = predict_memory(job, None, cuda=None).stages[stage]
    b = p.breakdown
    return {
        "marp_peak": p.peak_allocated_bytes,
        "gap": (p.peak_allocated_bytes - trace_peak) / trace_peak,
        "marp_phase": p.peak_phase,
        "marp_states": sum(b[k] for k in ("weights", "grads", "master_weights", "optimizer_states", "weight_cache")),
        "marp_breakdown": b,
    }


def compare(job: JobSpec) -> list[dict[str, Any]]:
    trace = trace_job(job, options=trace_options(job))
    rows = []
    for st in trace.stages:
        rows.append({
            "job": job.name, "stage": st.stage,
            "trace_peak": st.peak_allocated_bytes,
            "trace_phase": st.peak_phase,
            "trace_states": st.model_state_bytes,
            "trace_setup": st.setup_bytes,
            "trace_components": st.components,
            "microbatches": st.microbatches,
            "top_transients": top_transients(st.trace),
        } | marp_columns(job, st.stage, st.peak_allocated_bytes))  # fmt: skip
    return rows


def repredict(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (of earlier traces) with MARP's columns from the current MARP sources: the traces do not depend
    on MARP, so a change of MARP alone needs no new trace. Each row's job is found in the grid by name."""
    jobs = {job.name: job for runtime in ("fsdp2", "megatron") for job in grid(runtime, False)}
    return [r | marp_columns(jobs[r["job"]], r["stage"], r["trace_peak"]) for r in rows]


def mib(x: float) -> str:
    return f"{x / MIB:,.1f}"


def summary(rows: list[dict[str, Any]]) -> str:
    gaps = [r["gap"] for r in rows]
    worst = max(rows, key=lambda r: abs(r["gap"]))
    return (
        f"mean gap {sum(gaps) / len(gaps):+.1%}, mean |gap| {sum(abs(g) for g in gaps) / len(gaps):.1%}, "
        f"worst {worst['gap']:+.1%} ({worst['job']} stage {worst['stage']})"
    )


def write(rows: list[dict[str, Any]], failures: list[tuple[str, str]], out: Path, command: str, elapsed: float) -> None:
    lines = [
        "# MARP vs the trace path (real runtimes under FakeTensorMode)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {platform.machine()} {platform.system()}, Python {platform.python_version()}, CPU only "
        f"(FakeTensorMode: no tensor memory is allocated); {elapsed:.0f} s wall.  ",
        "Each configuration traces the first and the last pipeline stage (dp/tp/cp/ep rank 0), two steps of at "
        "most pp + 1 micro-batches (seq_len 512, micro-batch 1, global batch 16 unless the config says "
        "otherwise). 8B-class shapes: 8B widths with 4 layers (every layer of a stage is alike). fsdp2 runs "
        "torchtitan's default chunked loss (`ChunkedLossWrapper`, 8 chunks) but on the `loss_chunks=1` rows, "
        "which trace its plain `CrossEntropyLoss` (`TitanOptions(chunked_loss=False)`).",
        "Runtimes: torchtitan 0.3.0 (fsdp2), megatron-core 0.16.1 (megatron, local spec), torch 2.13.0 (CPU). "
        f"MARP: `predict_memory(job, None, cuda=None)` (CUDA-only terms off) at {_marp_version()}. "
        "gap = (MARP - trace) / trace; MiB = 2^20 bytes. Per stage: the trace's peak and its phase "
        "(`forward:<mb>`, `backward:<mb>`, `optimizer`, `setup`), the model states (live bytes after the last "
        "step vs MARP's weights + grads + master + optimizer states), what else is alive at the peak by the "
        "phase it was made in (fwd = activations and loss tensors, bwd = gradients and backward temporaries, "
        "other = setup/optimizer transients) vs MARP's named terms of its peak phase.",
        "",
    ]
    for runtime in ("fsdp2", "megatron"):
        rr = [r for r in rows if r["job"].startswith(runtime)]
        if not rr:
            continue
        lines += [
            f"## {runtime}: {len({r['job'] for r in rr})} configurations, {len(rr)} stages",
            "",
            summary(rr),
            "",
        ]
        lines += [
            "| config | stage | trace MiB | MARP MiB | gap | trace phase | MARP phase | trace states MiB | "
            "MARP states MiB | trace rest: fwd / bwd / other MiB | MARP rest: act / logits / comm / temp MiB | "
            "largest transients at the trace peak (phase made: MiB x count) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rr:
            c, b = r["trace_components"], r["marp_breakdown"]
            lines.append(
                f"| {r['job'].split('/', 1)[1]} | {r['stage']} | {mib(r['trace_peak'])} | {mib(r['marp_peak'])} | "
                f"{r['gap']:+.1%} | {r['trace_phase']} | {r['marp_phase']} | {mib(r['trace_states'])} | "
                f"{mib(r['marp_states'])} | {mib(c['forward'])} / {mib(c['backward'])} / "
                f"{mib(c['other'] + c['communication_buffers'] + c['model_states'] - r['trace_states'])} | "
                f"{mib(b['activations'])} / {mib(b['logits_and_loss'])} / {mib(b['communication_buffers'])} / "
                f"{mib(b['temporaries'])} | "
                + ", ".join(f"{ph}: {size:g} x{n}" for ph, size, n in r.get("top_transients", [])[:4])
                + " |"
            )
        lines.append("")
    if failures:
        lines += ["## Configurations that did not trace", ""]
        lines += [f"- {name}: `{err}`" for name, err in failures]
        lines.append("")
    # The hand-written analysis below the marker survives a rerun.
    marker = "<!-- findings -->"
    kept = out.read_text().split(marker, 1)[1] if out.exists() and marker in out.read_text() else "\n"
    out.write_text("\n".join(lines) + "\n" + marker + kept)


def _marp_version() -> str:
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        marp = "frenzy_opt/prediction/marp"
        head = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h", "--", marp, "models"],
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", marp, "models"],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit"
    return f"the MARP sources of commit {head}" + (" (with uncommitted MARP changes)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/marp_vs_trace.md"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runtime", choices=("fsdp2", "megatron"), action="append")
    ap.add_argument("--from-json", type=Path, nargs="*", help="write the report from earlier --json files")
    ap.add_argument("--wall", type=float, default=0.0, help="with --from-json: the runs' wall seconds")
    ap.add_argument("--command", default="", help="with --from-json: the commands that made the files")
    ap.add_argument("--repredict", action="store_true", help="with --from-json: MARP columns from the current sources")
    args = ap.parse_args(argv)
    start = time.time()
    if args.from_json:
        rows = [r for path in args.from_json for r in json.loads(path.read_text())]
        if args.repredict:
            rows = repredict(rows)
        fails = [tuple(f) for path in args.from_json if path.with_suffix(".fail").exists()
                 for f in json.loads(path.with_suffix(".fail").read_text())]  # fmt: skip
        write(rows, fails, args.out, args.command or "benchmarks/marp_vs_trace.py --from-json", args.wall)
        return 0
    rows: list[dict[str, Any]] = []
    failures: list[tuple[str, str]] = []
    for runtime in args.runtime or ["fsdp2", "megatron"]:
        for job in grid(runtime, args.quick):
            t0 = time.time()
            try:
                got = compare(job)
            except Exception as err:  # a configuration the runtime cannot run on the CPU: reported
                failures.append((job.name, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"))
                traceback.print_exc(limit=3)
                continue
            rows += got
            for r in got:
                print(f"{time.time() - t0:6.1f}s {r['job']} s{r['stage']} gap {r['gap']:+.1%}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1, default=str))
                args.json.with_suffix(".fail").write_text(json.dumps(failures))
    command = "python benchmarks/marp_vs_trace.py " + " ".join(sys.argv[1:] if argv is None else argv)
    write(rows, failures, args.out, command, time.time() - start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
