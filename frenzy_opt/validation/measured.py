"""MARP against measured runs: read a file in the calibration format, predict each row on the metric it
measured, score, fit the CUDA-only terms and the OOM-safety bounds, and cross-validate leaving one source out.

The file format is ``../shared/calibration/memory-measured.csv``'s (one measured run a row; its README
describes the columns). A user's own measurements in the same columns score the same way. Each row names
what was measured, and a row is compared like with like:

* ``max_allocated`` (``torch.cuda.max_memory_allocated``, also ``active_bytes.all.peak``) with MARP's
  ``peak_allocated_bytes``;
* ``max_reserved`` (``torch.cuda.max_memory_reserved``) with ``peak_reserved_bytes``;
* ``device_used`` (nvidia-smi / pynvml) with ``device_used_bytes``.

``rank_measured`` says which rank: "last rank" (Megatron CI logs the last pipeline stage) is compared with
the last stage, anything else with the maximum over stages.

**Accuracy** of a row = ``1 - |predicted - measured| / measured``. **Fitted parameters**
(:class:`MemoryFit`): for the point prediction, the allocator's reserve over allocated
(``fragmentation``) and the memory nvidia-smi shows beyond the allocator and NCCL (``context_bytes``);
for the bound of parts (:mod:`frenzy_opt.prediction.marp.bound`), the margin on activations per runtime
(``activation_margin``) and the allocator's elastic cache (``cached_fraction``). ``fit`` fits them on
some rows; ``cross_validate`` refits without each source in turn and scores that
source's rows with the parameters fitted on the others (leave one source out), so every figure it reports
is out of sample.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from frenzy_opt.core.enums import Precision, Recompute, Runtime
from frenzy_opt.core.spec import RECOMPUTES, JobSpec, ParallelConfig, TrainingConfig, check_parallel, default_zero_stage
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.prediction.marp import bound
from frenzy_opt.prediction.marp.fit import FIT_PATH, MemoryFit, load_fit
from frenzy_opt.prediction.marp.predictor import MemoryPrediction, StagePrediction, cuda_terms_of, predict_memory

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


def _first_int(text: str, column: str, row_id: str) -> int:
    match = re.search(r"\d+", text.replace(",", ""))
    if match is None:
        raise ValueError(f"row {row_id}: column {column} must start with an integer, got {text!r}")
    return int(match.group())


def _vocab(text: str, row_id: str) -> int:
    padded = re.search(r"padded\s+(\d+)", text)
    if padded:
        return int(padded.group(1))
    numbers = [int(n) for n in re.findall(r"\d+", text) if int(n) > 1000]
    if not numbers:
        raise ValueError(f"row {row_id}: column vocab must hold the vocabulary size, got {text!r}")
    return numbers[0]


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
        return _first_int(text, column, rid) if text else default

    notes = row.get("notes", "").lower()
    ffn_text = row["ffn_hidden"]
    experts = num("num_experts")
    ffn = _first_int(ffn_text, "ffn_hidden", rid)
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
        vocab_size=_vocab(row["vocab"], rid),
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


def read_rows(path: str | Path, required: Sequence[str]) -> list[dict[str, str]]:
    """The rows of a calibration-format CSV file; ``ValueError`` naming the file when it cannot be read or
    lacks one of the ``required`` columns."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; required: {', '.join(required)}")
    return list(reader)


def read_measurements(path: str | Path) -> list[MeasuredRun]:
    """Every row of a calibration-format CSV file, parsed (rows MARP cannot model carry ``skip_reason``)."""
    return [parse_row(row) for row in read_rows(path, REQUIRED_COLUMNS)]


# --- predicting and scoring ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RowScore:
    row_id: str
    source: str
    metric: str
    measured_bytes: int
    predicted_bytes: int
    upper_bytes: int
    predicted_allocated_bytes: int
    predicted_reserved_bytes: int
    predicted_used_bytes: int
    required_upper_bytes: int = 0
    """The bound's required part (what admission tests)."""
    capacity_bytes: int | None = None
    headroom_fraction: float = 0.0
    explanation: str = ""
    """The required bound's parts (:meth:`frenzy_opt.prediction.marp.bound.MemoryBound.explain`)."""

    @property
    def admitted(self) -> bool | None:
        """Whether the planner would admit the run on its own GPU: the required bound plus the fit's default
        headroom within the GPU's memory."""
        if self.capacity_bytes is None:
            return None
        return self.required_upper_bytes + self.headroom_fraction * self.capacity_bytes <= self.capacity_bytes

    @property
    def accuracy(self) -> float:
        return 1 - abs(self.predicted_bytes - self.measured_bytes) / self.measured_bytes

    @property
    def signed_error(self) -> float:
        return self.predicted_bytes / self.measured_bytes - 1

    @property
    def upper_margin(self) -> float:
        """How far the upper bound is above the measurement (negative: the bound is under it)."""
        return self.upper_bytes / self.measured_bytes - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.row_id,
            "source": self.source,
            "metric": self.metric,
            "measured": self.measured_bytes,
            "predicted": self.predicted_bytes,
            "upper": self.upper_bytes,
            "accuracy": round(self.accuracy, 4),
            "signed_error": round(self.signed_error, 4),
            "upper_margin": round(self.upper_margin, 4),
            "predicted_allocated_bytes": self.predicted_allocated_bytes,
            "predicted_reserved_bytes": self.predicted_reserved_bytes,
            "predicted_used_bytes": self.predicted_used_bytes,
            "required_upper_bytes": self.required_upper_bytes,
            "admitted": self.admitted,
        }


def _prediction(run: MeasuredRun, fit: MemoryFit) -> MemoryPrediction:
    assert run.job is not None
    cuda = cuda_terms_of(replace(fit, rows=max(fit.rows, 1)), run.gpu_family)
    return predict_memory(run.job, None, cuda=cuda, fit=fit, architecture=run.gpu_family)


def _stages(run: MeasuredRun, prediction: MemoryPrediction) -> list[StagePrediction]:
    return [prediction.stages[-1]] if run.last_rank else list(prediction.stages)


def score_run(run: MeasuredRun, fit: MemoryFit) -> RowScore:
    assert run.measured_bytes is not None
    stages = _stages(run, _prediction(run, fit))
    allocated = max(s.peak_allocated_bytes for s in stages)
    reserved = max(s.peak_reserved_bytes for s in stages)
    used = max(s.device_used_bytes for s in stages)
    predicted = {"max_allocated": allocated, "max_reserved": reserved, "device_used": used}[run.metric]
    upper = {
        "max_allocated": max(s.peak_allocated_upper_bytes for s in stages),
        "max_reserved": max(s.peak_reserved_upper_bytes for s in stages),
        "device_used": max(s.device_used_upper_bytes for s in stages),
    }[run.metric]
    worst = max(stages, key=lambda s: s.required_upper_bytes)
    return RowScore(
        row_id=run.row_id,
        source=run.source,
        metric=run.metric,
        measured_bytes=run.measured_bytes,
        predicted_bytes=predicted,
        upper_bytes=upper,
        predicted_allocated_bytes=allocated,
        predicted_reserved_bytes=reserved,
        predicted_used_bytes=used,
        required_upper_bytes=worst.required_upper_bytes,
        capacity_bytes=run.capacity_bytes,
        headroom_fraction=fit.headroom_fraction,
        explanation=bound.MemoryBound(worst.bound).explain(run.capacity_bytes),
    )


def usable(runs: Iterable[MeasuredRun]) -> list[MeasuredRun]:
    return [r for r in runs if r.skip_reason is None and r.job is not None and r.measured_bytes]


# --- fitting ------------------------------------------------------------------------------------------

MARGIN_SLACK = 0.01
"""Added to each fitted margin: the rows are few, so the largest shortfall seen is an optimistic estimate of
the largest to come (for n rows, the next one exceeds all of them with probability 1 / (n + 1))."""
FRAGMENTATION_GRID = tuple(i / 200 for i in range(0, 101))
"""Reserved / allocated - 1 searched from 0 to 0.5: GMLake (Guo et al., ASPLOS 2024, Fig. 2) measures 5-30 %
fragmentation in LLM training."""
CONTEXT_GRID = tuple(i * 64 * 2**20 for i in range(0, 25))
"""nvidia-smi's memory beyond the allocator and NCCL, searched from 0 to 1.5 GiB: the CUDA context with
PyTorch's kernels (the calibration file's Hugging Face rows measure 1,343 MiB on a V100)."""


def _point_fit(rows: Sequence[MeasuredRun], base: MemoryFit) -> MemoryFit:
    """One fragmentation and one CUDA context for every runtime and GPU, chosen on a grid to minimise the
    mean absolute relative error of the ``max_reserved`` and ``device_used`` rows together (two parameters
    for all rows: few enough that a held-out source is predicted by what the others taught), then a context
    per GPU architecture that has nvidia-smi rows."""
    zero = replace(base, fragmentation=0.0, default_context_bytes=0, context_bytes={})
    parts = {r.row_id: _stages(r, _prediction(r, zero)) for r in rows}
    cuda_rows = [r for r in rows if r.metric in ("max_reserved", "device_used")]
    fragmentation, context = base.fragmentation, base.default_context_bytes
    if cuda_rows:
        best = math.inf
        for f in FRAGMENTATION_GRID:
            for c in CONTEXT_GRID if any(r.metric == "device_used" for r in cuda_rows) else (context,):
                error = 0.0
                for r in cuda_rows:
                    assert r.measured_bytes is not None
                    predicted = max(
                        s.peak_allocated_bytes * (1 + f)
                        + (c + s.breakdown["nccl_buffers"] if r.metric == "device_used" else 0)
                        for s in parts[r.row_id]
                    )
                    error += abs(predicted / r.measured_bytes - 1)
                if error < best - 1e-12:
                    best, fragmentation, context = error, f, c
    # Then the context of each GPU architecture with nvidia-smi rows of its own, at that fragmentation (the
    # CUDA context and the kernels loaded differ by architecture); the others keep the common value.
    per_family: dict[str, int] = {}
    for family in sorted({r.gpu_family for r in cuda_rows if r.metric == "device_used"}):
        mine = [r for r in cuda_rows if r.metric == "device_used" and r.gpu_family == family]

        def family_error(c: int, mine: list[MeasuredRun] = mine) -> float:
            total = 0.0
            for r in mine:
                assert r.measured_bytes is not None
                used = max(s.peak_allocated_bytes * (1 + fragmentation) + c + s.breakdown["nccl_buffers"]
                           for s in parts[r.row_id])  # fmt: skip
                total += abs(used / r.measured_bytes - 1)
            return total

        per_family[family] = min(CONTEXT_GRID, key=family_error)
    return replace(base, fragmentation=fragmentation, context_bytes=per_family, default_context_bytes=context)


def least_margin(rows: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The margin ``(a, F)``, ``a >= 0`` relative to the activations and ``F >= 0`` bytes, that covers every
    ``(activations, shortfall)`` row (``F + a x activations >= shortfall``) with the least total over the
    rows: a linear programme in two variables, solved at its vertices (the axes and each pair of rows).
    A fixed cost that a small model's prediction misses goes to ``F``; an error that grows with the
    activations goes to ``a``, so neither inflates the other's margin for every other job."""
    if not rows:
        return 0.0, 0.0
    total = sum(u for u, _ in rows)
    candidates = [(max(0.0, max(d / u for u, d in rows)), 0.0), (0.0, max(0.0, max(d for _, d in rows)))]
    for (u1, d1), (u2, d2) in itertools.combinations(rows, 2):
        if u1 != u2:
            a = (d1 - d2) / (u1 - u2)
            candidates.append((a, d1 - a * u1))
    feasible = [(a, f) for a, f in candidates if a >= 0 and f >= 0 and all(f + a * u >= d - 1 for u, d in rows)]
    return min(feasible, key=lambda c: len(rows) * c[1] + c[0] * total)


def fit(runs: Sequence[MeasuredRun], base: MemoryFit | None = None) -> MemoryFit:
    """Fit :class:`MemoryFit` on ``runs`` (their usable rows).

    1. The point prediction's fragmentation and CUDA context (:func:`_point_fit`).
    2. The margin of each runtime: the least proportional (relative to the predicted activations and
       temporaries) and fixed part under which every ``max_allocated`` measurement stays within ``states +
       activations + workspaces + margin`` (:func:`least_margin`), the proportional part plus
       :data:`MARGIN_SLACK`; a runtime without such rows takes the largest of those margins (the fitted
       margins measure how far the activation model is off, which does not depend on how the runtime holds
       its states). Only when no row measures ``max_allocated`` does each runtime take the largest
       shortfall its ``max_reserved`` and nvidia-smi rows imply for the allocated peak under the point
       model's fragmentation and context (conservative: it counts the allocator's cache as allocation).
    3. The elastic cache (``cached_fraction``): the largest excess of a ``max_reserved`` or nvidia-smi
       measurement over the bound without it (allocated bound + modelled reserve [+ context and NCCL]),
       relative to the allocated bound, plus :data:`MARGIN_SLACK`.
    """
    base = base or MemoryFit()
    rows = usable(runs)
    fitted = _point_fit(rows, base)
    unmargined = replace(
        fitted,
        activation_margin={},
        default_activation_margin=0.0,
        fixed_margin_bytes={},
        default_fixed_margin_bytes=0,
        cached_fraction=0.0,
        rows=1,
    )
    needs: dict[str, list[tuple[float, float]]] = {}
    implied: dict[str, list[tuple[float, float]]] = {}
    cached_needs: list[MeasuredRun] = []
    for r in rows:
        assert r.job is not None and r.measured_bytes is not None
        stages = _stages(r, _prediction(r, unmargined))
        stage = max(stages, key=lambda s: s.peak_allocated_bytes)
        b = stage.bound
        runtime = r.job.training.runtime.value
        activations = float(max(b["activations"], 1))
        if r.metric == "max_allocated":
            shortfall = float(r.measured_bytes - b["states"] - b["library_workspaces"] - b["activations"])
            needs.setdefault(runtime, []).append((activations, shortfall))
            continue
        cached_needs.append(r)
        # What the row implies for the allocated peak under the point model's allocator and context terms.
        outside = b["cuda_context"] + b["nccl_buffers"] if r.metric == "device_used" else 0
        allocated = (r.measured_bytes - outside) / (1 + fitted.fragmentation)
        shortfall = allocated - b["states"] - b["library_workspaces"] - b["activations"]
        implied.setdefault(runtime, []).append((activations, shortfall))
    # Without any max_allocated row, each runtime takes what its other rows imply for its allocated peak.
    fitted_margins = {k: least_margin(v) for k, v in (needs or implied).items()}
    margins = {k: round(a + MARGIN_SLACK, 4) for k, (a, _) in fitted_margins.items()}
    fixed = {k: int(f) for k, (_, f) in fitted_margins.items()}
    default_margin = max(margins.values(), default=0.0)
    default_fixed = max(fixed.values(), default=0)
    margined = replace(
        unmargined,
        activation_margin=margins,
        default_activation_margin=default_margin,
        fixed_margin_bytes=fixed,
        default_fixed_margin_bytes=default_fixed,
    )
    cached = 0.0
    for r in cached_needs:
        assert r.measured_bytes is not None
        stages = _stages(r, _prediction(r, margined))
        stage = max(stages, key=lambda s: s.required_upper_bytes)
        b = stage.bound
        allocated = bound.MemoryBound(b).allocated
        without = allocated + b["allocator_reserve"]
        if r.metric == "device_used":
            without += b["cuda_context"] + b["nccl_buffers"]
        cached = max(cached, (r.measured_bytes - without) / allocated)
    return replace(
        margined,
        cached_fraction=round(max(cached, 0.0) + MARGIN_SLACK, 4),
        rows=len(rows),
    )


# --- reports ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    rows: int
    mean_accuracy: float
    worst_accuracy: float
    under_predicted_3pct: int
    upper_under_3pct: int
    upper_coverage: float
    admitted: float = math.nan
    """Fraction of the rows (that name their GPU's memory) the planner would admit on that GPU."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "mean_accuracy": round(self.mean_accuracy, 4),
            "worst_accuracy": round(self.worst_accuracy, 4),
            "under_predicted_3pct": self.under_predicted_3pct,
            "upper_under_3pct": self.upper_under_3pct,
            "upper_coverage": round(self.upper_coverage, 4),
            "admitted": round(self.admitted, 4),
        }


def summarise(scores: Sequence[RowScore]) -> Summary:
    if not scores:
        return Summary(rows=0, mean_accuracy=math.nan, worst_accuracy=math.nan, under_predicted_3pct=0,
                       upper_under_3pct=0, upper_coverage=math.nan)  # fmt: skip
    sized = [s for s in scores if s.capacity_bytes is not None]
    return Summary(
        rows=len(scores),
        mean_accuracy=statistics.fmean(s.accuracy for s in scores),
        worst_accuracy=min(s.accuracy for s in scores),
        under_predicted_3pct=sum(1 for s in scores if s.signed_error < -0.03),
        upper_under_3pct=sum(1 for s in scores if s.upper_margin < -0.03),
        upper_coverage=sum(1 for s in scores if s.upper_margin >= 0) / len(scores),
        admitted=statistics.fmean(bool(s.admitted) for s in sized) if sized else math.nan,
    )


def by_source(scores: Sequence[RowScore]) -> dict[str, Summary]:
    groups: dict[str, list[RowScore]] = {}
    for s in scores:
        groups.setdefault(s.source, []).append(s)
    return {source: summarise(group) for source, group in sorted(groups.items())}


def cross_validate(runs: Sequence[MeasuredRun], base: MemoryFit | None = None) -> list[RowScore]:
    """Leave one source out: each source's rows scored with the parameters fitted on every other source."""
    rows = usable(runs)
    scores: dict[str, RowScore] = {}
    for source in sorted({r.source for r in rows}):
        held = [r for r in rows if r.source == source]
        fitted = fit([r for r in rows if r.source != source], base)
        for r in held:
            scores[r.row_id] = score_run(r, fitted)
    return [scores[r.row_id] for r in rows]


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation:
    """``frenzy validate memory``'s result: in-sample (the shipped fit) and leave-one-source-out."""

    runs: list[MeasuredRun]
    fit: MemoryFit
    in_sample: list[RowScore]
    held_out: list[RowScore]

    def to_dict(self) -> dict[str, Any]:
        held = {s.row_id: s for s in self.held_out}
        rows = []
        for run in self.runs:
            base: dict[str, Any] = {"id": run.row_id, "source": run.source, "metric": run.metric}
            score = next((s for s in self.in_sample if s.row_id == run.row_id), None)
            if score is None:
                rows.append({**base, "skipped": run.skip_reason, "measured": run.measured_bytes})
                continue
            cv = held[run.row_id]
            rows.append({**score.to_dict(), "cross_validated": cv.to_dict()})
        return {
            "rows": rows,
            "by_source": {k: v.to_dict() for k, v in by_source(self.in_sample).items()},
            "overall": summarise(self.in_sample).to_dict(),
            "cross_validated": {
                "method": "leave one source out",
                "overall": summarise(self.held_out).to_dict(),
                "by_source": {k: v.to_dict() for k, v in by_source(self.held_out).items()},
            },
            "fit": self.fit.to_dict(),
        }


def validate(path: str | Path, fitted: MemoryFit | None = None) -> Validation:
    """Score MARP on every usable row of ``path`` with ``fitted`` (the shipped fit by default) and with
    leave-one-source-out refits."""
    runs = read_measurements(path)
    fitted = fitted or load_fit()
    rows = usable(runs)
    return Validation(
        runs=runs,
        fit=fitted,
        in_sample=[score_run(r, fitted) for r in rows],
        held_out=cross_validate(runs),
    )


def calibrate(path: str | Path) -> tuple[MemoryFit, Validation]:
    """Fit on every usable row of ``path``; the default headroom is the largest shortfall of a held-out
    ``max_allocated`` measurement under its leave-one-source-out allocated bound, as a fraction of the
    row's GPU memory (0 when every such bound held)."""
    runs = read_measurements(path)
    held_out = cross_validate(runs)
    shortfall = max(
        ((s.measured_bytes - s.upper_bytes) / s.capacity_bytes for s in held_out
         if s.metric == "max_allocated" and s.capacity_bytes),
        default=0.0,
    )  # fmt: skip
    fitted = replace(fit(runs), headroom_fraction=round(max(shortfall, 0.0), 4), source=Path(path).name)
    rows = usable(runs)
    return fitted, Validation(runs=runs, fit=fitted, in_sample=[score_run(r, fitted) for r in rows], held_out=held_out)


def write_fit(fitted: MemoryFit, path: Path = FIT_PATH) -> None:
    path.write_text(json.dumps(fitted.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f} %"


def render_markdown(result: Validation, command: str) -> str:
    """``docs/marp-validation.md``: per source and per row, in sample and leave one source out."""
    held = {s.row_id: s for s in result.held_out}
    f = result.fit
    lines = [
        "# MARP against published measured runs",
        "",
        f"Generated by `{command}` (a command in this repository; rerun it to refresh this page). Each row is",
        "scored on the metric its source measured (max_allocated, max_reserved or nvidia-smi used); accuracy",
        "= 1 - |predicted - measured| / measured. **Cross-validated** = leave one source out: the fitted",
        "parameters (fragmentation, CUDA context, activation margins, elastic cache) refitted without the row's",
        "source. The bound is built of parts (`frenzy_opt/prediction/marp/bound.py`): model states exact, the",
        "activations and temporaries with their runtime's margin, the GEMM libraries' workspaces, the caching",
        "allocator's reserve from replaying the predicted allocation trace, the CUDA context and NCCL's buffers",
        "per communicator; `max_reserved` and nvidia-smi bounds add the allocator's elastic cache, which never",
        "decides admission.",
        "",
        f"Fit on all rows: fragmentation {f.fragmentation:.3f}, CUDA context "
        + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in sorted(f.context_bytes.items()))
        + f" (others {f.default_context_bytes / GIB:.2f} GiB), activation margins "
        + ", ".join(
            f"{k} {v:.3f} x activations + {f.fixed_margin_of(k) / 2**20:.0f} MiB"
            for k, v in sorted(f.activation_margin.items())
        )
        + f" (other runtimes the largest), elastic cache {f.cached_fraction:.3f} of the allocated bound, default "
        f"headroom {100 * f.headroom_fraction:.1f} % of GPU memory.",
        "",
        "## Overall",
        "",
        "| | rows | mean accuracy | worst accuracy | under-predicted > 3 % | upper bound > 3 % under | bound holds "
        "| admitted on its GPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, scores in (("in sample", result.in_sample), ("leave one source out", result.held_out)):
        s = summarise(scores)
        lines.append(
            f"| {label} | {s.rows} | {_pct(s.mean_accuracy)} | {_pct(s.worst_accuracy)} | {s.under_predicted_3pct} "
            f"| {s.upper_under_3pct} | {_pct(s.upper_coverage)} | {_pct(s.admitted)} |"
        )
    lines += ["", "*Admitted*: the planner's rule (the bound's required part + headroom within the GPU's "
              "memory) applied to the run on the GPU it ran on: the price of the safety margin.", ""]  # fmt: skip
    lines += ["", "## By source (leave one source out)", "",
              "| source | rows | mean accuracy | worst accuracy | under-predicted > 3 % | bound holds |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for source, s in by_source(result.held_out).items():
        lines.append(
            f"| {source} | {s.rows} | {_pct(s.mean_accuracy)} | {_pct(s.worst_accuracy)} | {s.under_predicted_3pct} "
            f"| {_pct(s.upper_coverage)} |"
        )
    lines += ["", "## Rows", "",
              "| row | source | metric | measured GiB | predicted GiB | error | cv error | upper GiB (cv) "
              "| required (cv), parts |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    by_id = {s.row_id: s for s in result.in_sample}
    for run in result.runs:
        score = by_id.get(run.row_id)
        if score is None:
            lines.append(
                f"| {run.row_id} | {run.source[:40]} | {run.metric} | - | - | skipped: {run.skip_reason} | | | |"
            )
            continue
        cv = held[run.row_id]
        lines.append(
            f"| {run.row_id} | {run.source[:40]} | {run.metric} | {score.measured_bytes / GIB:.2f} "
            f"| {score.predicted_bytes / GIB:.2f} | {100 * score.signed_error:+.1f} % | {100 * cv.signed_error:+.1f} % "
            f"| {cv.upper_bytes / GIB:.2f} | {cv.explanation} |"
        )
    return "\n".join(lines) + "\n"
