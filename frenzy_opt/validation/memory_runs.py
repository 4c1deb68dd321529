"""MARP's measured runs: a file in the calibration format read into :class:`MeasuredRun` records, one a row.

The file format is ``../shared/calibration/memory-measured.csv``'s (one measured run a row; its README
describes the columns). A user's own measurements in the same columns score the same way. Each row names
what was measured, and a row is compared like with like:

* ``max_allocated`` (``torch.cuda.max_memory_allocated``, also ``active_bytes.all.peak``) with MARP's
  ``peak_allocated_bytes``;
* ``max_reserved`` (``torch.cuda.max_memory_reserved``) with ``peak_reserved_bytes``;
* ``device_used`` (nvidia-smi / pynvml) with ``device_used_bytes``.

``rank_measured`` says which rank: "last rank" (Megatron CI logs the last pipeline stage) is compared with
the last stage, anything else with the maximum over stages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from frenzy_opt.core.enums import Precision, Recompute, Runtime
from frenzy_opt.core.spec import RECOMPUTES, JobSpec, ParallelConfig, TrainingConfig, check_parallel, default_zero_stage
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.validation.calibration_csv import first_int, read_rows, vocab_of

GIB = 2**30


REQUIRED_COLUMNS = (
    "row_id", "source", "framework", "gpu", "num_layers", "hidden", "ffn_hidden", "num_heads", "num_kv_heads",
    "vocab", "seq_len", "micro_batch", "global_batch", "dp", "tp", "pp", "precision", "optimizer",
    "optimizer_sharding", "recompute", "measured_gib", "metric",
)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRun:
    """One row: the job as the run configured it, what was measured, and on which rank."""

    row_id: str
    source: str
    framework: str
    gpu: str
    gpu_family: str
    metric: str
    measured_bytes: int | None
    last_rank: bool
    job: JobSpec | None
    skip_reason: str | None = None
    capacity_bytes: int | None = None
    """The GPU's memory from the row's ``gpu`` column ("80GB", "141GB", ...; None when it names none):
    the nominal GiB figure less 0.5 % (the catalogue's H100-SXM5-80GB has 79.65 GiB usable)."""


# --- reading the file ---------------------------------------------------------------------------------


def gpu_family(gpu: str) -> str:
    """The GPU architecture a row ran on (its CUDA context and library workspaces differ by architecture)."""
    name = gpu.upper()
    for key, family in (("GB200", "blackwell"), ("B200", "blackwell"), ("H", "hopper"), ("A100", "ampere"),
                        ("A10", "ampere"), ("V100", "volta"), ("T4", "turing"), ("L4", "ada")):  # fmt: skip
        if name.startswith(key) or f" {key}" in name:
            return family
    return "other"


def metric_of(text: str) -> str:
    low = text.lower()
    if "max_allocated" in low or "allocated_bytes" in low or "active" in low:
        return "max_allocated"
    if "reserved" in low:
        return "max_reserved"
    if "nvidia-smi" in low or "pynvml" in low or "used" in low:
        return "device_used"
    raise ValueError(f"metric must name max_allocated, max_reserved or nvidia-smi/pynvml used, got {text!r}")


def runtime_of(framework: str) -> str:
    low = framework.lower()
    if "megatron" in low or "flagscale" in low:
        return "megatron"
    if "torchtitan" in low or "fsdp" in low:
        return "fsdp2"
    if "deepspeed" in low:
        return "deepspeed"
    return "hf"


def _precision(text: str) -> str:
    low = text.lower()
    if "fp8" in low or "float8" in low:
        return "fp8"
    if low.startswith("fp32"):
        return "fp32"
    if "fp16" in low:
        return "fp16"
    return "bf16"


def _skip_reason(row: dict[str, str]) -> str | None:
    notes, precision = row.get("notes", "").lower(), row["precision"].lower()
    if not row["measured_gib"].strip():
        return "no measurement (the run went out of memory or logged nothing comparable)"
    if "mla" in notes or "mtp" in notes:
        return "multi-latent attention and multi-token prediction are not modelled"
    if "pure bf16" in precision:
        return "pure bf16 training (bf16 optimizer states, no fp32 master) is not a modelled precision"
    return None


def parse_row(row: dict[str, str]) -> MeasuredRun:
    """A :class:`MeasuredRun` from one CSV row (``ValueError`` naming the row and column when malformed)."""
    rid = row["row_id"]
    metric = metric_of(row["metric"])
    measured = row["measured_gib"].strip()
    measured_bytes = round(float(measured) * GIB) if measured else None
    skip = _skip_reason(row)
    job = None
    if skip is None:
        job = _job_of(row)
    size = re.search(r"(\d+)\s*GB", row["gpu"])
    capacity = int(int(size.group(1)) * GIB * 0.995) if size else None
    return MeasuredRun(
        capacity_bytes=capacity,
        row_id=rid,
        source=row["source"],
        framework=row["framework"],
        gpu=row["gpu"],
        gpu_family=gpu_family(row["gpu"]),
        metric=metric,
        measured_bytes=measured_bytes,
        last_rank="last" in row.get("rank_measured", "").lower(),
        job=job,
        skip_reason=skip,
    )


def _dropout(notes: str, key: str) -> float:
    """A dropout rate from the notes: ``hidden-dropout 0.1`` (Megatron flags) or a plain ``dropout 0.1``
    (both dropouts, as Hugging Face configs set them)."""
    match = re.search(rf"{key}\s+([0-9.]+)", notes) or re.search(r"(?<![-\w])dropout\s+([0-9.]+)", notes)
    return float(match.group(1)) if match else 0.0


def _job_of(row: dict[str, str]) -> JobSpec:
    rid = row["row_id"]

    def num(column: str, default: int = 1) -> int:
        text = row.get(column, "").strip()
        return first_int(text, column, rid) if text else default

    notes = row.get("notes", "").lower()
    ffn_text = row["ffn_hidden"]
    experts = num("num_experts")
    ffn = first_int(ffn_text, "ffn_hidden", rid)
    expert_ffn = None
    if "expert" in ffn_text:
        expert_ffn = int(re.findall(r"\d+", ffn_text)[-1])
    runtime = runtime_of(row["framework"])
    seq_len = num("seq_len")
    tied = row.get("tied_embeddings", "").strip().lower().startswith(("yes", "n/a"))
    learned = "learned_absolute" in notes or "bert" in row.get("model", "").lower()
    layernorm = "norm layernorm" in notes or "bert" in row.get("model", "").lower()
    bias = "bias-linear on" in notes or "bert" in row.get("model", "").lower()
    arch = ModelArch(
        name=row.get("model", "row") or "row",
        num_layers=num("num_layers"),
        hidden_size=num("hidden"),
        ffn_hidden_size=ffn,
        num_attention_heads=num("num_heads"),
        num_kv_heads=num("num_kv_heads"),
        vocab_size=vocab_of(row["vocab"], rid),
        mlp="swiglu" if "swiglu" in row["mlp_type"].lower() else "gelu",
        norm="layernorm" if layernorm else "rmsnorm",
        tied_embeddings=tied,
        num_experts=experts,
        moe_top_k=num("moe_topk"),
        moe_ffn_hidden_size=expert_ffn,
        linear_bias=bias,
        position_embedding="learned" if learned else "rope",
        max_position_embeddings=max(seq_len, 512),
        hidden_dropout=_dropout(notes, "hidden-dropout"),
        attention_dropout=_dropout(notes, "attention-dropout"),
    )
    dp, tp, pp, cp, ep = num("dp"), num("tp"), num("pp"), num("cp"), num("ep")
    vpp = num("vpp") if "interleaved" in row.get("pp_schedule", "").lower() else 1
    optimizer = "adafactor" if "adafactor" in row["optimizer"].lower() else "adamw"
    sharding = row["optimizer_sharding"].lower()
    if runtime == Runtime.FSDP2:
        zero = 3
    elif "distributed optimizer" in sharding and "dp=1" not in sharding:
        # Megatron's distributed optimizer shards over the data-parallel group with context parallelism.
        zero = 1 if dp * cp > 1 else 0
    else:
        zero = default_zero_stage(runtime, dp) if runtime == Runtime.DEEPSPEED else 0
    recompute = row["recompute"].split()[0].lower() if row["recompute"].strip() else "none"
    attention = row.get("attention_impl", "").lower()
    eager = any(word in attention for word in ("unfused", "eager", "local"))
    micro = num("micro_batch")
    training = TrainingConfig(
        seq_len=seq_len,
        micro_batch_size=micro,
        global_batch_size=max(num("global_batch"), micro * dp),
        train_steps=1,
        precision=Precision(_precision(row["precision"])),
        optimizer=optimizer,
        runtime=Runtime(runtime),
        # A measured run kept fp8 parameters only when its row says so (Megatron-LM's default is off).
        fp8_param_gather=any(
            k in f"{notes} {row['precision'].lower()}" for k in ("fp8-param", "fp8_param", "float8 fsdp all-gather")
        ),
        # torchtitan chunks its loss only since ChunkedLossWrapper (0.3.0); a row says so when it did.
        loss_chunks=None if runtime != Runtime.FSDP2 or "chunk" in notes else 1,
    )
    parallel = ParallelConfig(
        dp=dp,
        tp=tp,
        pp=pp,
        vpp=vpp,
        cp=cp,
        ep=ep,
        sequence_parallel=tp > 1 and row.get("sequence_parallel", "").strip().lower().startswith("yes"),
        zero_stage=zero,
        recompute=Recompute(recompute) if recompute in RECOMPUTES else Recompute.NONE,
        attention="eager" if eager else "flash",
    )
    try:
        check_parallel(arch, training, parallel)
    except ValueError as err:
        raise ValueError(f"row {rid}: {err}") from None
    return JobSpec(name=f"row-{rid}", model=arch, training=training, parallel=parallel)


def read_measurements(path: str | Path) -> list[MeasuredRun]:
    """Every row of a calibration-format CSV file, parsed (rows MARP cannot model carry ``skip_reason``)."""
    return [parse_row(row) for row in read_rows(path, REQUIRED_COLUMNS)]


def usable(runs: Iterable[MeasuredRun]) -> list[MeasuredRun]:
    return [r for r in runs if r.skip_reason is None and r.job is not None and r.measured_bytes]
