"""Run the validation cases and write the MARP-vs-measured table (Markdown).

    python -m frenzy_opt.validation.harness_report --out docs/marp-harness.md          # FakeTensorMode
    python -m frenzy_opt.validation.harness_report --real --cases small-base,small-tp2     # real CPU execution

Each pipeline stage of each case is measured (peak tensor bytes under MemTracker) and predicted by MARP
with the CUDA-only terms off; the error is prediction / measurement - 1.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from frenzy_opt.prediction.marp.activations import native_operators
from frenzy_opt.prediction.marp.predictor import predict_memory
from frenzy_opt.validation.cases import CASES, Case
from frenzy_opt.validation.harness import measure

MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    case: str
    stage: int
    measured_bytes: int
    predicted_bytes: int
    peak_phase: str
    seconds: float

    @property
    def error(self) -> float:
        return self.predicted_bytes / self.measured_bytes - 1


def run_case(case: Case, *, fake: bool = True) -> list[Row]:
    job = case.job()
    with native_operators():  # the harness runs the reference decoder's PyTorch-native operators
        prediction = predict_memory(job, cuda=None)
    rows = []
    for stage in prediction.stages:
        start = time.perf_counter()
        measured = measure(job, stage=stage.stage, fake=fake)
        rows.append(
            Row(
                case=case.name,
                stage=stage.stage,
                measured_bytes=measured.peak_bytes,
                predicted_bytes=stage.peak_allocated_bytes,
                peak_phase=stage.peak_phase,
                seconds=time.perf_counter() - start,
            )
        )
    return rows


def to_markdown(rows: list[Row], *, fake: bool, command: str) -> str:
    errors = [abs(r.error) for r in rows]
    within = sum(e <= 0.03 for e in errors)
    cases = len({r.case for r in rows})
    lines = [
        "# MARP validation against measured peak memory",
        "",
        f"Command: `{command}`",
        f"Machine: {platform.machine()}, {platform.system()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}; execution: {'FakeTensorMode' if fake else 'real CPU tensors'} with MemTracker.",
        "",
        f"{cases} configurations, {len(rows)} pipeline stages: {within}/{len(rows)} within 3 %; "
        f"mean |error| {100 * sum(errors) / len(errors):.2f} %, max |error| {100 * max(errors):.2f} %, "
        f"accuracy (1 - mean |error|) {100 * (1 - sum(errors) / len(errors)):.2f} %.",
        "",
        "| case | stage | measured MiB | predicted MiB | error | peak phase |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.stage} | {r.measured_bytes / MIB:,.1f} | {r.predicted_bytes / MIB:,.1f} | "
            f"{100 * r.error:+.2f} % | {r.peak_phase} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the Markdown table here (default: stdout)")
    parser.add_argument("--real", action="store_true", help="execute for real instead of FakeTensorMode")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    args = parser.parse_args(argv)
    selected = CASES
    if args.cases:
        wanted = set(args.cases.split(","))
        unknown = wanted - {c.name for c in CASES}
        if unknown:
            print(
                f"unknown case(s): {', '.join(sorted(unknown))}; allowed: {', '.join(c.name for c in CASES)}",
                file=sys.stderr,
            )
            return 2
        selected = tuple(c for c in CASES if c.name in wanted)
    rows: list[Row] = []
    for case in selected:
        rows.extend(run_case(case, fake=not args.real))
        print(
            f"{case.name}: "
            + ", ".join(f"stage {r.stage} {100 * r.error:+.2f} %" for r in rows if r.case == case.name),
            file=sys.stderr,
        )
    command = (
        "python -m frenzy_opt.validation.harness_report"
        + (" --real" if args.real else "")
        + (f" --cases {args.cases}" if args.cases else "")
    )
    text = to_markdown(rows, fake=not args.real, command=command)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
