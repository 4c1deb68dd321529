"""The step-time model's measured runs: a file in the calibration format (or the launcher's reports) read into
:class:`StepRun` records, one a row.

The format is ``../shared/calibration/steptime-measured.csv``'s (one published run a row; its README
describes the columns). A user's own measurements in the same columns -- or the launcher's reports, see
:func:`runs_from_reports` -- score and fit the same way.

**What a row becomes** (:func:`parse_row`): the job (model shape, sequence, micro- and global batch,
precision, runtime from the framework), its parallel config (dp, tp, pp, vpp, cp, ep, sequence
parallelism, ZeRO stage, recompute), the GPU type and the links of the row's own words
(:func:`~frenzy_opt.validation.steptime_hardware.links_of`). Where a source leaves a field out, the rule used
is stated in the row's ``assumptions``; a row that cannot be modelled carries ``skip_reason`` (nothing is
dropped silently). Rows measured as TFLOP/s per GPU are turned into seconds with the model's own FLOP count
(:func:`frenzy_opt.prediction.flops.step_flops`), so their error is the error of the predicted TFLOP/s.

**Heterogeneous rows** (several GPU types in one job) are priced on their slowest GPU type and slowest
network: a pipeline or data-parallel group runs at the pace of its slowest member (Narayanan et al. 2021,
Sec. 2.2; Sailor, Strati et al. 2025, Sec. 4 models heterogeneous stages the same way), and the sources
balanced their stages for speed, so this is an upper estimate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from frenzy_opt.core.enums import Precision, Recompute, Runtime
from frenzy_opt.core.spec import ZERO_STAGES_BY_RUNTIME, JobSpec, ParallelConfig, TrainingConfig, check_parallel
from frenzy_opt.hardware.gpus import GpuType, lookup_gpu
from frenzy_opt.hardware.topology import Links
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.prediction.flops import step_flops
from frenzy_opt.validation.calibration_csv import first_int, read_rows, vocab_of
from frenzy_opt.validation.steptime_hardware import GPU_WORDS, catalogue_gpu, gpu_names, links_of, slowest_gpu


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRun:
    """One measured run: the job, where it ran, and its measured seconds per iteration."""

    row_id: str
    source: str
    gpu_class: str
    measured_s: float | None
    job: JobSpec | None = None
    gpu: GpuType | None = None
    """The GPU type it is priced on (the slowest one of a heterogeneous run)."""
    links: Links | None = None
    skip_reason: str | None = None
    assumptions: tuple[str, ...] = ()
    heterogeneous: bool = False
    others: tuple[tuple[GpuType, Links], ...] = ()
    """A heterogeneous run's other GPU types and their links: it is priced on every one of its types, and
    its step is the slowest type's (its stages and replicas wait for each other)."""

    def placements(self) -> list[tuple[GpuType, Links]]:
        assert self.gpu is not None and self.links is not None
        return [(self.gpu, self.links), *self.others]


# --- reading the file ---------------------------------------------------------------------------------


REQUIRED_COLUMNS = (
    "row_id", "source_name", "framework", "gpu_class", "gpu", "num_gpus", "gpus_per_node", "interconnect",
    "num_layers", "hidden", "ffn_hidden", "mlp_type", "num_heads", "num_kv_heads", "vocab", "seq_len",
    "micro_batch", "global_batch", "dp", "tp", "pp", "vpp", "sp", "cp", "ep", "zero_fsdp", "recompute",
    "precision", "measured_value", "measured_unit", "iteration_time_s",
)  # fmt: skip


def _stated(text: str) -> bool:
    return bool(text.strip()) and not text.strip().lower().startswith("not stated")


def runtime_of(framework: str) -> str:
    low = framework.lower()
    if "torchtitan" in low or "fsdp" in low:
        return "fsdp2"
    if "deepspeed" in low:
        return "deepspeed"
    # PaddleNLP's LLM trainer runs fused kernels (fused RMSNorm, FlashAttention) with 1F1B pipelines and
    # ZeRO-style sharding stages, as Megatron does.
    if "megatron" in low or "flagscale" in low or "nemo" in low or "paddle" in low:
        return "megatron"
    return "hf"


def _precision(text: str, notes: list[str]) -> str:
    low = text.lower()
    if "fp8" in low or "float8" in low:
        return "fp8"
    if "fp16" in low:
        return "fp16"
    if "bf16" in low:
        return "bf16"
    if "fp32" in low:
        return "fp32"
    notes.append("precision not stated: fp32 (Sailor's profiler and configs enable no 16-bit format)")
    return "fp32"


def _recompute(text: str) -> str:
    low = text.lower()
    if low.startswith("full") or "consistent with full" in low:
        return "full"
    if low.startswith("selective"):
        return "selective"
    return "none"


def _zero(text: str, runtime: str, dp: int) -> int:
    low = text.lower()
    if runtime == Runtime.FSDP2:
        return 3
    if dp == 1:
        return 0
    stage = re.search(r"stage\s*(\d)", low)
    if stage:
        return int(stage.group(1))
    if "distributed optimizer" in low:
        return 1
    return 0


def _eager(framework: str) -> bool:
    """Megatron-LM before FlashAttention (2019-2021 code paths, fused softmax) and DeepSpeed's Megatron
    v1.1.5 ran attention as matmuls and a softmax kernel."""
    low = framework.lower()
    return any(year in low for year in ("2019", "2020", "2021")) or "v1.1.5" in low or "sailor" in low


def _least_recompute_that_fits(job: JobSpec, gpu: GpuType, notes: list[str]) -> JobSpec:
    """A run whose source does not state its recompute ran, so it fit: the least recompute (none, selective,
    full) that the planner admits on the GPU, by the same bound (the required part of MARP's bound of parts,
    :mod:`frenzy_opt.prediction.marp.bound`; full when none is admitted)."""
    from frenzy_opt.prediction.marp.predictor import predict_memory

    for choice in ("none", "selective", "full"):
        candidate = replace(job, parallel=replace(job.parallel, recompute=Recompute(choice)))
        if predict_memory(candidate, gpu).required_upper_bytes <= gpu.memory_bytes:
            break
    if choice != "none":
        notes.append(f"recompute not stated: {choice}, the least that fits the GPU by MARP's prediction")
    return candidate


def _measured_s(row: dict[str, str], job: JobSpec, notes: list[str]) -> float | None:
    text = row["iteration_time_s"].strip()
    if text:
        return float(text)
    unit = row["measured_unit"]
    per_gpu = re.search(r"=\s*([0-9.]+)\s*TFLOP/s/GPU", unit)
    raw = row["measured_value"].strip()
    if not per_gpu and not raw:
        return None
    value = float(per_gpu.group(1)) if per_gpu else float(raw)
    if unit.strip().lower().startswith("s/it"):
        return value
    if "TFLOP/s" not in unit:
        return None
    flops = step_flops(job.model, job.training, job.parallel)
    notes.append("seconds = the model's FLOP count / (measured TFLOP/s x GPUs)")
    return flops / (value * 1e12 * job.parallel.num_gpus)


def parse_row(row: dict[str, str]) -> StepRun:
    """A :class:`StepRun` from one CSV row (``ValueError`` naming the row and column when malformed)."""
    rid = row["row_id"]
    notes: list[str] = []
    base: dict[str, Any] = {"row_id": rid, "source": row["source_name"], "gpu_class": row["gpu_class"]}

    def num(column: str, default: int) -> int:
        text = row.get(column, "").strip()
        if not _stated(text):
            return default
        return first_int(text, column, rid)

    heterogeneous = row["gpu_class"].strip().lower().startswith("mixed")
    names = gpu_names(row["gpu"]) or gpu_names(row["gpu_class"])
    if not heterogeneous and names:
        # One GPU type: the most specific word of the row's own class ("40GB" before "A100"; the text may
        # name a relative, as "A800 ... A100 compute" does).
        family = row["gpu_class"].strip().upper()
        ranked = [name for _, name in GPU_WORDS if name in names and family in name.upper()]
        names = ranked[:1] or names[:1]
    if not names:
        return StepRun(**base, measured_s=None, skip_reason=f"GPU {row['gpu']!r} is not a known type")
    gpus = []
    for name in names:
        try:
            gpu, note = catalogue_gpu(name)
        except ValueError:
            return StepRun(**base, measured_s=None, skip_reason=f"GPU type {name} is not in the catalogue")
        gpus.append(gpu)
        if note:
            notes.append(note)
    precision = _precision(row["precision"], notes)
    gpu = slowest_gpu(gpus, precision)
    hidden, heads = num("hidden", 0), num("num_heads", 0)
    if not _stated(row["ffn_hidden"]):
        notes.append("ffn_hidden not stated: 4 x hidden (GPT)")
    if not _stated(row["micro_batch"]):
        notes.append("micro_batch not stated: 1")
    vpp_text = row["vpp"].strip()
    if vpp_text and not _stated(vpp_text) and ">" in vpp_text:
        return StepRun(**base, measured_s=None, skip_reason="interleaved schedule with an unstated vpp")
    seq_len = num("seq_len", 2048)
    mlp = row["mlp_type"].lower()
    experts = re.search(r"(\d+)\s*experts", mlp)
    topk = re.search(r"top-?(\d+)", mlp)
    arch = ModelArch(
        name=row.get("model") or f"row-{rid}",
        num_layers=num("num_layers", 1),
        hidden_size=hidden,
        ffn_hidden_size=num("ffn_hidden", 4 * hidden),
        num_attention_heads=heads,
        num_kv_heads=num("num_kv_heads", heads),
        vocab_size=vocab_of(row["vocab"], rid),
        mlp="swiglu" if "swiglu" in mlp else "gelu",
        num_experts=int(experts.group(1)) if experts else 1,
        moe_top_k=int(topk.group(1)) if topk else 1,
        max_position_embeddings=max(seq_len, 512),
    )
    dp, tp, pp, cp, ep = num("dp", 1), num("tp", 1), num("pp", 1), num("cp", 1), num("ep", 1)
    if not arch.is_moe:
        ep = 1
    runtime = runtime_of(row["framework"])
    micro = num("micro_batch", 1)
    if runtime == Runtime.FSDP2 and pp > 1 and micro % pp == 0:
        # torchtitan splits the local batch into as many pipeline micro-batches as stages by default
        # (its pipelining config, microbatch_size = local batch / stages).
        micro //= pp
        notes.append(f"torchtitan pipeline: local batch split into {pp} micro-batches of {micro}")
    zero = _zero(row["zero_fsdp"], runtime, dp)
    if zero not in ZERO_STAGES_BY_RUNTIME[runtime]:
        zero = max(s for s in ZERO_STAGES_BY_RUNTIME[runtime] if s <= zero)
    sp_text = row["sp"].lower()
    sp = tp > 1 and (sp_text.startswith("yes") or ("not stated" in sp_text and "tp" in sp_text))
    words = f"{row.get('notes', '')} {row['framework']} {row['zero_fsdp']}".lower()
    overlap = tp > 1 and any(flag in words for flag in ("tp-comm-overlap", "tp comm overlap", "asynctp", "async tp"))
    training = TrainingConfig(
        seq_len=seq_len,
        micro_batch_size=micro,
        global_batch_size=max(num("global_batch", micro * dp), micro * dp),
        train_steps=1,
        precision=Precision(precision),
        runtime=Runtime(runtime),
        tp_comm_overlap=overlap,
        # torchtitan chunks its loss only since ChunkedLossWrapper (0.3.0), later than these sources.
        loss_chunks=1 if runtime == Runtime.FSDP2 else None,
    )
    parallel = ParallelConfig(
        dp=dp,
        tp=tp,
        pp=pp,
        vpp=num("vpp", 1) if pp > 1 else 1,
        cp=cp,
        ep=ep,
        sequence_parallel=sp,
        zero_stage=zero,
        recompute=Recompute(_recompute(row["recompute"])),
        attention="eager" if _eager(row["framework"]) else "flash",
    )
    num_gpus = num("num_gpus", parallel.num_gpus)
    if parallel.num_gpus != num_gpus:
        return StepRun(
            **base, measured_s=None, skip_reason=f"dp x tp x pp x cp = {parallel.num_gpus} != num_gpus {num_gpus}"
        )
    try:
        check_parallel(arch, training, parallel)
    except ValueError as err:
        return StepRun(**base, measured_s=None, skip_reason=str(err))
    job = JobSpec(name=f"row-{rid}", model=arch, training=training, parallel=parallel)
    if not _stated(row["recompute"].replace("none stated", "not stated")) and "full" not in row["recompute"]:
        job = _least_recompute_that_fits(job, gpu, notes)
    per_node = num("gpus_per_node", 8)
    intra = "pcie" if "pcie" in row["interconnect"].lower() else gpu.intra_node
    links, link_notes = links_of(row["interconnect"], gpu, per_node, intra)
    others = []
    for other in gpus:
        if other.name != gpu.name:
            other_intra = "pcie" if "pcie" in row["interconnect"].lower() else other.intra_node
            others.append((other, links_of(row["interconnect"], other, per_node, other_intra)[0]))
    measured = _measured_s(row, job, notes)
    return StepRun(
        **base,
        measured_s=measured,
        job=job,
        gpu=gpu,
        links=links,
        skip_reason=None if measured else "no measured iteration time or TFLOP/s",
        assumptions=tuple(notes + link_notes),
        heterogeneous=heterogeneous,
        others=tuple(others),
    )


def runs_from_reports(paths: Sequence[str | Path]) -> list[StepRun]:
    """Measured runs from the launcher's JSON reports (``frenzy launch ... --json``): the job, the plan it
    ran and the placement's node size; the measured median step time."""
    from frenzy_opt.core.plan import Plan
    from frenzy_opt.core.spec import parse_job

    runs = []
    for path in paths:
        try:
            report = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read launcher report {path}: {err}") from None
        try:
            plan, measured = Plan.from_dict(report["plan"]), report.get("measured") or {}
            job = parse_job(report["job"]).with_parallel(plan.parallel, plan.micro_batch_size)
            job = replace(job, training=replace(job.training, precision=Precision(plan.precision)))
            gpu = lookup_gpu(plan.gpu_type)
            per_node = int((report.get("placement") or {}).get("gpus_per_node") or job.parallel.num_gpus)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"launcher report {path}: missing or invalid field: {err}") from None
        value = measured.get("step_time_s")
        seconds = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
        ok = report.get("state") == "succeeded" and seconds > 0
        runs.append(
            StepRun(
                row_id=Path(path).stem,
                source=str(path),
                gpu_class=gpu.name,
                measured_s=seconds if ok else None,
                job=job,
                gpu=gpu,
                links=Links.for_gpu(gpu, gpus_per_node=per_node),
                skip_reason=None if ok else "the run did not succeed or measured no step time",
            )
        )
    return runs


def read_any(paths: Sequence[str | Path]) -> list[StepRun]:
    """Runs from calibration-format CSV files and launcher JSON reports, by file suffix."""
    runs: list[StepRun] = []
    reports = [p for p in paths if str(p).endswith(".json")]
    for p in paths:
        if not str(p).endswith(".json"):
            runs.extend(read_runs(p))
    return runs + runs_from_reports(reports)


def read_runs(path: str | Path) -> list[StepRun]:
    """Every row of a step-time calibration-format CSV file, parsed."""
    return [parse_row(row) for row in read_rows(path, REQUIRED_COLUMNS)]


def usable(runs: Iterable[StepRun]) -> list[StepRun]:
    return [r for r in runs if r.skip_reason is None and r.job is not None and r.measured_s]


def fittable(runs: Iterable[StepRun]) -> list[StepRun]:
    """The runs a fit learns from: the usable homogeneous ones (a heterogeneous run is priced on each of its
    GPU types and takes the slowest, an estimate, and is only scored)."""
    return [r for r in usable(runs) if not r.heterogeneous]
