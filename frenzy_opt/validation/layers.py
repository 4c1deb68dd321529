"""The kernel model against measured layer times: ``frenzy validate layers``.

Every point of a set of layer profiles (Sailor's artefact, or a calibration profile ``frenzy profile`` wrote)
is predicted by the step-time model without profiles, twice: with the fitted parameters, and with the kernels
alone (every runtime factor at its starting value: no fitted efficiency, elementwise passes or per-layer
cost). A transformer layer's forward and backward (with its
tensor-parallel collectives where the profile measured them) as the difference between a model of two
layers and one of one layer at the point's tp and micro-batch, on the profile's GPU type in a node of its
default links; the embedding and output layers as the rest of the one-layer model's compute. The table is
the kernel model's error where no end-to-end run exists: per GPU type, model shape and micro-batch.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig
from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.hardware.topology import Links
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.prediction.profiles import LayerProfile, LayerShape, ProfilePoint
from frenzy_opt.prediction.stepterms import step_terms
from frenzy_opt.prediction.steptime import StepTimeModel


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerRow:
    gpu: str
    model: str
    tp: int
    micro_batch_size: int
    measured_layer_s: float
    predicted_layer_s: float
    kernel_layer_s: float
    """The kernels alone's prediction (module docstring)."""
    measured_ends_s: float
    predicted_ends_s: float

    @property
    def layer_error(self) -> float:
        return self.predicted_layer_s / self.measured_layer_s - 1

    @property
    def kernel_error(self) -> float:
        return self.kernel_layer_s / self.measured_layer_s - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "model": self.model,
            "tp": self.tp,
            "micro_batch_size": self.micro_batch_size,
            "measured_layer_ms": round(1e3 * self.measured_layer_s, 4),
            "predicted_layer_ms": round(1e3 * self.predicted_layer_s, 4),
            "layer_error": round(self.layer_error, 4),
            "kernel_layer_ms": round(1e3 * self.kernel_layer_s, 4),
            "kernel_error": round(self.kernel_error, 4),
            "measured_embedding_output_ms": round(1e3 * self.measured_ends_s, 4),
            "predicted_embedding_output_ms": round(1e3 * self.predicted_ends_s, 4),
        }


def _job(shape: LayerShape, layers: int, runtime: str, point: ProfilePoint) -> JobSpec:
    arch = ModelArch(
        num_layers=layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_kv_heads=shape.num_kv_heads,
        vocab_size=shape.vocab_size,
        mlp=shape.mlp,
        head_dim=shape.head_dim,
        num_experts=shape.num_experts,
        moe_top_k=shape.moe_top_k,
    )
    training = TrainingConfig(
        seq_len=shape.seq_len,
        micro_batch_size=point.micro_batch_size,
        global_batch_size=point.micro_batch_size,
        precision=shape.precision,  # type: ignore[arg-type]
        runtime=runtime,  # type: ignore[arg-type]
    )
    parallel = ParallelConfig(tp=point.tp, attention=shape.attention)
    return JobSpec(name="layer", model=arch, training=training, parallel=parallel)


def predict_point(profile: LayerProfile, point: ProfilePoint, model: StepTimeModel) -> tuple[float, float]:
    """(one layer's forward and backward, the embedding's and output layer's) seconds by the kernel model."""
    gpu = lookup_gpu(profile.gpu)
    links = Links.for_gpu(gpu)
    bare = replace(model, layer_profiles=())

    def seconds(layers: int) -> float:
        step = step_terms(_job(profile.shape, layers, profile.runtime, point)).evaluate(gpu, links, bare)
        return step.compute_s + (step.intra_node_comm_s if profile.includes_tp_comm else 0.0)

    one, two = seconds(1), seconds(2)
    return two - one, one - (two - one)


def compare(profiles: Sequence[LayerProfile], model: StepTimeModel) -> list[LayerRow]:
    rows = []
    kernels = StepTimeModel()
    for profile in profiles:
        for point in sorted(profile.points, key=lambda p: (p.tp, p.micro_batch_size)):
            layer, ends = predict_point(profile, point, model)
            kernel_layer, _ = predict_point(profile, point, kernels)
            rows.append(
                LayerRow(
                    gpu=profile.gpu,
                    model=profile.model,
                    tp=point.tp,
                    micro_batch_size=point.micro_batch_size,
                    measured_layer_s=point.layer_fwd_s + point.layer_bwd_s,
                    predicted_layer_s=layer,
                    kernel_layer_s=kernel_layer,
                    measured_ends_s=point.embedding_fwd_s
                    + point.embedding_bwd_s
                    + point.output_fwd_s
                    + point.output_bwd_s,
                    predicted_ends_s=ends,
                )
            )
    return rows


def load_profiles(path: str | Path) -> tuple[list[LayerProfile], list[str]]:
    """Profiles from Sailor's artefact folder, or from a calibration profile's JSON file."""
    import json

    from frenzy_opt.prediction.sailor import import_profiles

    path = Path(path)
    if path.is_dir():
        return import_profiles(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    return list(StepTimeModel.from_dict(data["parameters"]).layer_profiles), []


def summary(rows: Sequence[LayerRow]) -> dict[str, Any]:
    """Mean |error| and median error of the fitted model and of the kernels alone: all points, tp 1 (no
    collectives in the measurement), and by GPU type."""

    def stats(group: Sequence[LayerRow]) -> dict[str, Any] | None:
        if not group:
            return None
        out: dict[str, Any] = {"points": len(group)}
        for key, errors in (
            ("fitted", [r.layer_error for r in group]),
            ("kernels", [r.kernel_error for r in group]),
        ):
            out[key] = {
                "mean_abs_error": round(statistics.fmean(abs(e) for e in errors), 4),
                "median_error": round(statistics.median(errors), 4),
            }
        return out

    by_gpu: dict[str, list[LayerRow]] = {}
    for r in rows:
        by_gpu.setdefault(r.gpu, []).append(r)
    return {
        "overall": stats(rows),
        "tp1": stats([r for r in rows if r.tp == 1]),
        "by_gpu": {g: stats(v) for g, v in sorted(by_gpu.items())},
    }


def render_markdown(rows: Sequence[LayerRow], notes: Sequence[str], command: str) -> str:
    s = summary(rows)

    def cells(v: dict[str, Any]) -> str:
        return " | ".join(
            f"{100 * v[k]['mean_abs_error']:.1f} % ({100 * v[k]['median_error']:+.0f} %)" for k in ("fitted", "kernels")
        )

    lines = [
        "# The kernel model against measured layer times",
        "",
        f"- Command: `{command}`",
        "- Each point: one transformer layer's forward + backward per micro-batch as measured (Sailor's",
        "  profiles include the tensor-parallel all-reduces at tp > 1) and as the step-time model predicts it",
        "  without profiles (`frenzy_opt/validation/layers.py`): with the shipped fit's parameters, and with the",
        "  kernels alone (no fitted runtime factor). Error = predicted / measured - 1; cells give the mean |error|",
        "  (median signed error).",
        "",
        "## Summary",
        "",
        "| points | shipped fit | kernels alone |",
        "|---|---:|---:|",
    ]
    for label, key in (("all", "overall"), ("tp 1 (no collectives)", "tp1")):
        v = s[key]
        if v:
            lines.append(f"| {label} ({v['points']}) | {cells(v)} |")
    lines += ["", "| GPU type | points | shipped fit | kernels alone |", "|---|---:|---:|---:|"]
    for gpu, v in s["by_gpu"].items():
        lines.append(f"| {gpu} | {v['points']} | {cells(v)} |")
    lines += [
        "",
        "## Every point",
        "",
        "| GPU type | model | tp | micro-batch | layer measured ms | shipped fit ms | kernels alone ms | "
        "ends measured ms | shipped fit ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d = r.to_dict()
        lines.append(
            f"| {r.gpu} | {r.model} | {r.tp} | {r.micro_batch_size} | {d['measured_layer_ms']:.2f} | "
            f"{d['predicted_layer_ms']:.2f} ({100 * r.layer_error:+.0f} %) | "
            f"{d['kernel_layer_ms']:.2f} ({100 * r.kernel_error:+.0f} %) | "
            f"{d['measured_embedding_output_ms']:.2f} | {d['predicted_embedding_output_ms']:.2f} |"
        )
    if notes:
        lines += ["", "## Skipped", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"
