"""GPU check: MARP's three totals against a real GPU's, for about ten configurations.

Run on a machine with one CUDA GPU (the project's device check), from the repository root:

    python benchmarks/gpu_memory.py --gpu H200-SXM-141GB --out "$OUT"

For each case it runs real training steps of the reference decoder on the GPU (the validation harness's
Megatron layout) and records ``torch.cuda.max_memory_allocated``, ``max_memory_reserved`` and nvidia-smi's
used memory next to MARP's ``peak_allocated_bytes``, ``peak_reserved_bytes`` and ``device_used_bytes``.
Writes ``gpu_memory.json`` and ``gpu_memory.md`` and prints the CUDA-only terms fitted from the
measurements (fragmentation = reserved/allocated - 1; context = used - reserved - cuBLAS - NCCL).
``--dry-run`` prints the plan of work and the predictions without a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.prediction.marp.cuda import CudaTerms, nccl_bytes
from frenzy_opt.prediction.marp.predictor import predict_memory
from frenzy_opt.validation.cases import CASES

GPU_CASES = (
    "small-base",
    "small-seq2048",
    "small-fp32",
    "small-eager-gqa",
    "small-full",
    "small-moe",
    "gpt3-125m",
    "gpt3-1.3b-tp2-pp4",
    "qwen2.5-0.5b-pp2-tied",
    "llama2-7b-tp4-pp4-dp2",
    "llama3-8b-tp8-pp8",
)
MIB = 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="H200-SXM-141GB", help="catalogue name of the GPU the run is on")
    parser.add_argument("--out", type=Path, default=Path("out"))
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    gpu = lookup_gpu(args.gpu)
    cuda = CudaTerms()
    rows = []
    for case in (c for c in CASES if c.name in GPU_CASES):
        job = case.job()
        prediction = predict_memory(job, gpu, cuda=cuda)
        for stage in prediction.stages[:: max(len(prediction.stages) - 1, 1)]:
            row = {
                "case": case.name,
                "stage": stage.stage,
                "predicted": {
                    "peak_allocated_bytes": stage.peak_allocated_bytes,
                    "peak_reserved_bytes": stage.peak_reserved_bytes,
                    "device_used_bytes": stage.device_used_bytes,
                    "nccl_bytes": nccl_bytes(job.parallel, cuda, gpu),
                },
            }
            if not args.dry_run:
                from frenzy_opt.validation.gpu import measure_cuda

                m = measure_cuda(job, stage=stage.stage)
                row["measured"] = {
                    "peak_allocated_bytes": m.peak_allocated_bytes,
                    "peak_reserved_bytes": m.peak_reserved_bytes,
                    "device_used_bytes": m.device_used_bytes,
                }
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": gpu.name, "torch": torch.__version__, "python": platform.python_version(), "dry_run": args.dry_run}
    if torch.cuda.is_available():
        meta["device_name"] = torch.cuda.get_device_name(0)
    (args.out / "gpu_memory.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2), encoding="utf-8")
    (args.out / "gpu_memory.md").write_text(_markdown(meta, rows, cuda), encoding="utf-8")
    return 0


def _markdown(meta: dict[str, object], rows: list[dict[str, dict[str, int] | str | int]], cuda: CudaTerms) -> str:
    lines = [
        "# MARP vs a real GPU",
        "",
        f"Command: `python benchmarks/gpu_memory.py --gpu {meta['gpu']}`; {json.dumps(meta)}",
        "",
        "| case | stage | alloc pred MiB | alloc meas MiB | err | reserved pred | reserved meas | used pred "
        "| used meas |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fragmentation, context = [], []
    for row in rows:
        p = row["predicted"]
        m = row.get("measured")
        assert isinstance(p, dict)
        if not isinstance(m, dict):
            continue
        err = p["peak_allocated_bytes"] / m["peak_allocated_bytes"] - 1
        used = m["device_used_bytes"]
        lines.append(
            f"| {row['case']} | {row['stage']} | {p['peak_allocated_bytes'] / MIB:,.0f} | "
            f"{m['peak_allocated_bytes'] / MIB:,.0f} | {100 * err:+.2f} % | {p['peak_reserved_bytes'] / MIB:,.0f} | "
            f"{m['peak_reserved_bytes'] / MIB:,.0f} | {p['device_used_bytes'] / MIB:,.0f} | "
            f"{'-' if used is None else f'{used / MIB:,.0f}'} |"
        )
        fragmentation.append(m["peak_reserved_bytes"] / m["peak_allocated_bytes"] - 1)
        if used is not None:
            context.append(used - m["peak_reserved_bytes"] - cuda.cublas_workspace_bytes - p["nccl_bytes"])
    if fragmentation:
        lines += ["", f"Fitted fragmentation (median): {statistics.median(fragmentation):.4f}"]
    if context:
        lines += [f"Fitted CUDA context + other (median): {statistics.median(context) / MIB:,.0f} MiB"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
