"""``frenzy launch`` and ``export``: run one job for real through the orchestrator, or write the Slurm or Kubernetes
script of its plan."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from frenzy_opt.core.readable import parallel_text
from frenzy_opt.core.spec import load_job
from frenzy_opt.planning.export import load_placement, to_k8s, to_slurm
from frenzy_opt.planning.scenario import load_cluster_ref, resolve

if TYPE_CHECKING:  # the report pulls in matplotlib: imported when compare runs
    pass
from frenzy_opt.cli.common import _bytes_text, _emit, _seconds_text, _sig


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
