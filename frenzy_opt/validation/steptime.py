"""The step-time model against measured runs: read a file in the calibration format, predict each run's
seconds per iteration, fit the model's parameters, and cross-validate leaving one source or one GPU type out.

The format is ``../shared/calibration/steptime-measured.csv``'s (one published run a row; its README
describes the columns). A user's own measurements in the same columns -- or the launcher's reports, see
:func:`runs_from_reports` -- score and fit the same way.

**What a row becomes** (:func:`parse_row`): the job (model shape, sequence, micro- and global batch,
precision, runtime from the framework), its parallel config (dp, tp, pp, vpp, cp, ep, sequence
parallelism, ZeRO stage, recompute), the GPU type and the links of the row's own words (:func:`links_of`).
Where a source leaves a field out, the rule used is stated in the row's ``assumptions``; a row that cannot
be modelled carries ``skip_reason`` (nothing is dropped silently). Rows measured as TFLOP/s per GPU are
turned into seconds with the model's own FLOP count (:func:`frenzy_opt.prediction.steptime.step_flops`), so their
error is the error of the predicted TFLOP/s.

**Heterogeneous rows** (several GPU types in one job) are priced on their slowest GPU type and slowest
network: a pipeline or data-parallel group runs at the pace of its slowest member (Narayanan et al. 2021,
Sec. 2.2; Sailor, Strati et al. 2025, Sec. 4 models heterogeneous stages the same way), and the sources
balanced their stages for speed, so this is an upper estimate.

**Error** of a row = ``predicted / measured - 1``; the scores are the mean of ``|error|``. **Fit**
(:func:`fit`): the parameters of :class:`~frenzy_opt.prediction.steptime.StepTimeModel` minimising the sum of squared
``log(predicted / measured)`` (a relative error, symmetric in over- and under-prediction), by
Levenberg-Marquardt (Marquardt 1963) over the logarithms of the parameters with a numerical Jacobian
(:func:`frenzy_opt.prediction.fitting.fit_points`, the fitter the closed loop uses too), with a weak pull
towards the starting parameters (:data:`PRIOR_WEIGHT`).
**Cross-validation** (:func:`cross_validate`) refits without each source (or GPU type) in turn and
predicts that group's rows with the others' parameters.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from frenzy_opt.core.enums import Precision, Recompute, Runtime
from frenzy_opt.core.spec import ZERO_STAGES_BY_RUNTIME, JobSpec, ParallelConfig, TrainingConfig, check_parallel
from frenzy_opt.hardware.gpus import GpuType, lookup_gpu
from frenzy_opt.hardware.topology import Links
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.prediction.fitting import (
    FitPoint,
    Parameter,
    efficiency_parameter,
    fit_points,
    per_runtime_parameter,
    scalar_parameter,
)
from frenzy_opt.prediction.flops import peak_tflops, step_flops
from frenzy_opt.prediction.stepeval import profiled_point
from frenzy_opt.prediction.stepterms import StepTerms, step_terms
from frenzy_opt.prediction.steptime import (
    DEFAULT_EFFICIENCY,
    FIT_PATH,
    MAX_RELATIVE_EFFICIENCY,
    MIN_BAND_RUNS,
    StepTimeModel,
    shipped_model,
)
from frenzy_opt.validation.measured import _first_int, _vocab, read_rows

REQUIRED_COLUMNS = (
    "row_id", "source_name", "framework", "gpu_class", "gpu", "num_gpus", "gpus_per_node", "interconnect",
    "num_layers", "hidden", "ffn_hidden", "mlp_type", "num_heads", "num_kv_heads", "vocab", "seq_len",
    "micro_batch", "global_batch", "dp", "tp", "pp", "vpp", "sp", "cp", "ep", "zero_fsdp", "recompute",
    "precision", "measured_value", "measured_unit", "iteration_time_s",
)  # fmt: skip

# GPU words of the calibration format -> catalogue names, most specific first.
GPU_WORDS = (
    ("GB200", "GB200"),
    ("GH200", "GH200"),
    ("H800", "H800-SXM5-80GB"),
    ("H200", "H200-SXM-141GB"),
    ("H100 96GB", "H100-SXM5-96GB"),
    ("H100-PCIE", "H100-PCIE-80GB"),
    ("H100", "H100-SXM5-80GB"),
    ("A800", "A800-SXM4-80GB"),
    ("A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("40GB", "A100-SXM4-40GB"),
    ("A100", "A100-SXM4-80GB"),
    ("V100-SXM3", "V100-SXM3-32GB"),
    ("V100-16GB", "V100-SXM2-16GB"),
    ("V100", "V100-SXM2-32GB"),
    ("T4", "T4"),
    ("RTX-3090", "RTX-3090"),
    ("Titan-RTX", "TITAN-RTX"),
    # The calibration file's "RTX-2080" rows are Sailor's, whose RTX-2080 is an RTX 2080 Ti (11 GB in Sailor's
    # GPU-memory table; gpus.yaml's note on RTX-2080).
    ("RTX-2080", "RTX-2080Ti"),
)
# Catalogue fall-backs for GPU types the catalogue may lack: the part whose compute and memory they share.
GPU_FALLBACK = {
    "H100-SXM5-96GB": "H100-SXM5-80GB",
    "V100-SXM3-32GB": "V100-SXM2-32GB",
    "TITAN-RTX": "RTX-2080Ti",
}

# Reference node designs for networks a source names without numbers: eight single-port compute NICs per
# node, one per GPU -- DGX A100: 8 x 200 Gbit/s HDR InfiniBand (NVIDIA DGX A100 User Guide, "Hardware
# Overview"); DGX H100: 8 x 400 Gbit/s NDR (NVIDIA DGX H100 User Guide, "Hardware Overview"); DGX-2(H):
# 8 x 100 Gbit/s EDR (NVIDIA DGX-2 datasheet), which is the blog's "100 GB/s inter-server".
REFERENCE_NIC_GBPS = {"ampere": 200.0, "hopper": 400.0, "blackwell": 400.0, "volta": 100.0}
# GB200 NVL72: 72 GPUs in one NVLink domain (NVIDIA GB200 NVL72 product page).
NVL72_DOMAIN = 72


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


# Physical ranges of the parameters other than the efficiencies (those are bounded by
# frenzy_opt.prediction.steptime.MAX_RELATIVE_EFFICIENCY): a layer forward reads and writes its activations
# some 4 times when fully fused and about 60 when every op is its own kernel (eager PyTorch: each norm, add,
# dropout, activation and cast reads and writes its input); a layer runs 20-80 kernels forward and backward at 5-25 us
# of launch and framework cost each (CUDA C++ Best Practices Guide, "Kernel launch overhead").
ELEMENTWISE_PASSES_RANGE = (4.0, 60.0)
LAYER_OVERHEAD_RANGE = (1e-5, 2e-3)
# Weight of the pull towards the starting parameters in the fit (a weak ridge term in log space: 0.2-1.0
# raised the leave-one-source-out error from 28-29 % to 30-32 %).
PRIOR_WEIGHT = 0.05


# --- reading the file ---------------------------------------------------------------------------------


def _stated(text: str) -> bool:
    return bool(text.strip()) and not text.strip().lower().startswith("not stated")


def _gpu_names(text: str) -> list[str]:
    """Catalogue names of the GPU types a ``gpu`` cell names, in order of appearance."""
    found: list[tuple[int, str]] = []
    taken: list[tuple[int, int]] = []
    for word, name in GPU_WORDS:
        for match in re.finditer(re.escape(word), text, flags=re.IGNORECASE):
            span = (match.start(), match.end())
            if any(a < span[1] and span[0] < b for a, b in taken):
                continue
            taken.append(span)
            found.append((span[0], name))
    return list(dict.fromkeys(name for _, name in sorted(found)))


def _catalogue_gpu(name: str) -> tuple[GpuType, str | None]:
    """The catalogue entry for ``name``, or its stated stand-in (with the assumption made)."""
    try:
        return lookup_gpu(name), None
    except ValueError:
        stand_in = GPU_FALLBACK.get(name)
        if stand_in is None:
            raise
        return lookup_gpu(stand_in), f"{name} is not in the catalogue: priced as {stand_in}"


def _slowest(gpus: Sequence[GpuType], precision: str) -> GpuType:
    """The GPU type with the least peak for the run's number format (then the least HBM bandwidth)."""
    return min(gpus, key=lambda g: (peak_tflops(g, precision), g.hbm_gbyte_s))


def links_of(interconnect: str, gpu: GpuType, gpus_per_node: int, intra: str) -> tuple[Links, list[str]]:
    """The links a row's ``interconnect`` words describe (module docstring), and the assumptions made.

    Per-node figures are taken as per node and per-GPU ones times the GPUs of a node; an InfiniBand speed
    with no count on an NVLink server is per NIC with one NIC per GPU (the DGX reference designs,
    :data:`REFERENCE_NIC_GBPS`); a network named without a speed gets its reference design's."""
    low = interconnect.lower()
    notes: list[str] = []
    domain = NVL72_DOMAIN if "nvl" in low and "domain" in low else 0
    nics, nic_gbit_s = 1, 0.0
    per_node = re.search(r"(\d+)\s*x\s*(\d+)\s*gb/s", low)
    speeds = [(float(m.group(1)), m.group(0)) for m in re.finditer(r"(\d+(?:\.\d+)?)\s*gb/s", low)]
    gigabytes = re.search(r"(\d+)\s*gb/s inter-server", interconnect.lower().replace("GB/s", "gb/s"))
    if per_node:
        nics, nic_gbit_s = int(per_node.group(1)), float(per_node.group(2))
    elif "per gpu" in low and speeds:
        nics, nic_gbit_s = gpus_per_node, speeds[-1][0]
    elif gigabytes and "GB/s inter-server" in interconnect:
        nics, nic_gbit_s = 8, float(gigabytes.group(1)) * 8 / 8
        notes.append("100 GB/s inter-server read as 8 x 100 Gbit/s EDR NICs (DGX-2 datasheet)")
    elif "infiniband" in low or "rdma" in low:
        stated = [s for s, text in speeds if "gb/s" in text and not re.search(rf"{int(s)}\s*gb/s", low.split(";")[0])]
        if stated and "nvlink" in low:
            nics, nic_gbit_s = gpus_per_node, stated[-1]
            notes.append(f"InfiniBand {stated[-1]:g} Gbit/s read as one NIC per GPU (DGX reference design)")
        elif stated:
            nic_gbit_s = stated[-1]
        else:
            nics, nic_gbit_s = gpus_per_node, REFERENCE_NIC_GBPS.get(gpu.architecture, 200.0)
            notes.append(f"network not detailed: {nics} x {nic_gbit_s:g} Gbit/s (DGX reference design)")
    elif speeds and ("inter-node" in low or "+" in low):
        nic_gbit_s = min(s for s, _ in speeds)  # the slowest node's network
    elif "single" in low or ("nvlink/nvswitch" in low and "inter" not in low):
        nic_gbit_s = 0.0
    else:
        nic_gbit_s = 100.0
        notes.append("inter-node network not stated: 1 x 100 Gbit/s assumed")
    capped = "400 gb/s" in low.split(";")[0] and "nvlink" in low  # A800/H800: NVLink at 400 GB/s (the row's words)
    links = Links.for_gpu(
        gpu,
        inter_node_gbit_s=nics * nic_gbit_s,
        nics_per_node=nics,
        gpus_per_node=gpus_per_node,
        intra_node=intra,
        nvlink_domain=domain,
        intra_node_spec_gbyte_s=400.0 if capped else None,
    )
    return links, notes


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
        return _first_int(text, column, rid)

    heterogeneous = row["gpu_class"].strip().lower().startswith("mixed")
    names = _gpu_names(row["gpu"]) or _gpu_names(row["gpu_class"])
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
            gpu, note = _catalogue_gpu(name)
        except ValueError:
            return StepRun(**base, measured_s=None, skip_reason=f"GPU type {name} is not in the catalogue")
        gpus.append(gpu)
        if note:
            notes.append(note)
    precision = _precision(row["precision"], notes)
    gpu = _slowest(gpus, precision)
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
        vocab_size=_vocab(row["vocab"], rid),
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


# --- predicting, fitting, cross-validating ------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Scored:
    row_id: str
    source: str
    gpu_class: str
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.row_id,
            "source": self.source,
            "gpu_class": self.gpu_class,
            "measured_s": round(self.measured_s, 6),
            "predicted_s": round(self.predicted_s, 6),
            "error": round(self.error, 4),
        }


@dataclass(frozen=True, slots=True)
class _Prepared:
    run: StepRun
    terms: StepTerms


def _prepare(runs: Sequence[StepRun]) -> list[_Prepared]:
    out = []
    for r in usable(runs):
        assert r.job is not None
        out.append(_Prepared(r, step_terms(r.job)))
    return out


def predict_s(run: StepRun, model: StepTimeModel) -> float:
    assert run.job is not None
    return _slowest_s(step_terms(run.job), run, model)


def _slowest_s(terms: StepTerms, run: StepRun, model: StepTimeModel) -> float:
    """The run's step on the slowest of its GPU types (:attr:`StepRun.others`)."""
    return max(terms.evaluate(gpu, links, model).total_s for gpu, links in run.placements())


def score(runs: Sequence[StepRun], model: StepTimeModel) -> list[Scored]:
    out = []
    for p in _prepare(runs):
        r = p.run
        assert r.measured_s
        seconds = _slowest_s(p.terms, r, model)
        out.append(
            Scored(
                row_id=r.row_id, source=r.source, gpu_class=r.gpu_class, measured_s=r.measured_s, predicted_s=seconds
            )
        )
    return out


def parameters_for(runs: Sequence[StepRun], *, keys: str = "architecture") -> list[Parameter]:
    """The parameters the runs can inform. ``keys="architecture"`` (the published runs): each runtime's share
    of the measured kernel rates (no efficiency per GPU: GPU types differ by their measured throughput
    tables, data/kernel-throughput.yaml), the fp8 ratio if any run is fp8, the per-micro-batch overhead of
    each runtime, and from 8 runs on the elementwise passes and per-layer cost. ``keys="gpu"`` (a user's few
    runs): one efficiency per GPU type and format they ran on."""
    rows = usable(runs)
    if keys == "gpu":
        seen = dict.fromkeys(f"{r.gpu.name}@{r.job.training.precision}" for r in rows if r.gpu and r.job)
        return [efficiency_parameter(key) for key in seen]
    if keys != "architecture":
        raise ValueError(f"keys must be 'architecture' or 'gpu', got {keys!r}")
    runtimes = sorted({r.job.training.runtime for r in rows if r.job is not None})
    out = [
        per_runtime_parameter("gemm_efficiency", rt, 0.2, MAX_RELATIVE_EFFICIENCY, start=DEFAULT_EFFICIENCY)
        for rt in runtimes
    ]
    if any(r.job is not None and r.job.training.precision == Precision.FP8 for r in rows):
        out.append(scalar_parameter("fp8_efficiency", 0.2, MAX_RELATIVE_EFFICIENCY))
    out.extend(per_runtime_parameter("microbatch_overhead_s", rt, 1e-5, 1.0, start=1e-3) for rt in runtimes)
    if len(rows) >= 8:
        out.extend(per_runtime_parameter("elementwise_passes", rt, *ELEMENTWISE_PASSES_RANGE) for rt in runtimes)
        out.extend(per_runtime_parameter("layer_overhead_s", rt, *LAYER_OVERHEAD_RANGE) for rt in runtimes)
    return out


def fit(
    runs: Sequence[StepRun],
    base: StepTimeModel | None = None,
    *,
    keys: str = "architecture",
    iterations: int = 60,
) -> StepTimeModel:
    """Parameters minimising ``sum(log(predicted / measured)^2)`` over ``runs`` (module docstring): the
    fittable runs and :func:`parameters_for` them, fitted by :func:`frenzy_opt.prediction.fitting.fit_points`
    with the weak prior :data:`PRIOR_WEIGHT`."""
    model = base or StepTimeModel()
    runs = fittable(runs)
    prepared = _prepare(runs)
    if not prepared:
        raise ValueError("fit needs at least one usable homogeneous measured run")
    points = []
    for p in prepared:
        assert p.run.gpu is not None and p.run.links is not None
        points.append(FitPoint(p.terms, p.run.gpu, p.run.links, float(p.run.measured_s or 0.0)))
    params = parameters_for(runs, keys=keys)
    return fit_points(points, params, model, prior_weight=PRIOR_WEIGHT, iterations=iterations)


def _group(run: StepRun, by: str) -> str:
    if by == "source":
        return run.source
    return gpu_type_of(run)


def gpu_type_of(run: StepRun) -> str:
    """The GPU type a row reports under: the file's ``gpu_class`` (A100, H100, ..., "mixed (...)")."""
    return run.gpu_class


def cross_validate(runs: Sequence[StepRun], *, by: str = "source", base: StepTimeModel | None = None) -> list[Scored]:
    """Leave one group (``"source"`` or ``"gpu"`` type) out: each group's rows predicted by the parameters
    fitted on all the other rows."""
    rows = usable(runs)
    groups = sorted({_group(r, by) for r in rows})
    out: list[Scored] = []
    for g in groups:
        train = [r for r in rows if _group(r, by) != g]
        test = [r for r in rows if _group(r, by) == g]
        fitted = fit(train, base) if train else (base or StepTimeModel())
        out.extend(score(test, fitted))
    order = {r.row_id: i for i, r in enumerate(rows)}
    return sorted(out, key=lambda s: order[s.row_id])


# --- reports ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    rows: int
    mean_abs_error: float
    median_abs_error: float
    max_abs_error: float
    mean_signed_error: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "mean_abs_error": round(self.mean_abs_error, 4),
            "median_abs_error": round(self.median_abs_error, 4),
            "max_abs_error": round(self.max_abs_error, 4),
            "mean_signed_error": round(self.mean_signed_error, 4),
        }


def summarise(scores: Sequence[Scored]) -> Summary:
    if not scores:
        return Summary(
            rows=0,
            mean_abs_error=math.nan,
            median_abs_error=math.nan,
            max_abs_error=math.nan,
            mean_signed_error=math.nan,
        )
    errors = [abs(s.error) for s in scores]
    return Summary(
        rows=len(scores),
        mean_abs_error=statistics.fmean(errors),
        median_abs_error=statistics.median(errors),
        max_abs_error=max(errors),
        mean_signed_error=statistics.fmean(s.error for s in scores),
    )


def summary_by(scores: Sequence[Scored], key: Callable[[Scored], str]) -> dict[str, Summary]:
    groups: dict[str, list[Scored]] = {}
    for s in scores:
        groups.setdefault(key(s), []).append(s)
    return {k: summarise(v) for k, v in sorted(groups.items())}


@dataclass
class Validation:
    """``frenzy validate steptime``'s result: in sample (the given parameters), leave one source out and
    leave one GPU type out."""

    runs: list[StepRun]
    model: StepTimeModel
    in_sample: list[Scored]
    by_source_cv: list[Scored]
    by_gpu_cv: list[Scored]
    gpu_of: dict[str, str] = field(default_factory=dict)
    profiled: frozenset[str] = frozenset()
    """Rows priced from a measured layer profile (:mod:`frenzy_opt.prediction.profiles`) on any of their GPU
    types: reported apart from the rest."""

    def profile_split(self) -> dict[str, Any]:
        """In sample, LOSO and LOGO summaries of the profile-guided rows and of the others."""
        out: dict[str, Any] = {"rows": sorted(self.profiled)}
        for label, scores in (
            ("in_sample", self.in_sample),
            ("leave_one_source_out", self.by_source_cv),
            ("leave_one_gpu_type_out", self.by_gpu_cv),
        ):
            out[label] = {
                "profile_guided": summarise([s for s in scores if s.row_id in self.profiled]).to_dict(),
                "unprofiled": summarise([s for s in scores if s.row_id not in self.profiled]).to_dict(),
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        loso = {s.row_id: s for s in self.by_source_cv}
        logo = {s.row_id: s for s in self.by_gpu_cv}
        rows = []
        for run in self.runs:
            base: dict[str, Any] = {"id": run.row_id, "source": run.source, "gpu_class": run.gpu_class}
            score_ = next((s for s in self.in_sample if s.row_id == run.row_id), None)
            if score_ is None:
                rows.append({**base, "skipped": run.skip_reason})
                continue
            rows.append(
                {
                    **score_.to_dict(),
                    "gpu_type": self.gpu_of[run.row_id],
                    "assumptions": list(run.assumptions),
                    "cross_validated": {
                        "leave_one_source_out": loso[run.row_id].to_dict(),
                        "leave_one_gpu_type_out": logo[run.row_id].to_dict(),
                    },
                }
            )

        def by_gpu(scores: Sequence[Scored]) -> dict[str, Any]:
            return {k: v.to_dict() for k, v in summary_by(scores, lambda s: self.gpu_of[s.row_id]).items()}

        def by_src(scores: Sequence[Scored]) -> dict[str, Any]:
            return {k: v.to_dict() for k, v in summary_by(scores, lambda s: s.source).items()}

        return {
            "rows": rows,
            "by_source": by_src(self.in_sample),
            "by_gpu_type": by_gpu(self.in_sample),
            "overall": summarise(self.in_sample).to_dict(),
            "cross_validated": {
                "leave_one_source_out": {
                    "overall": summarise(self.by_source_cv).to_dict(),
                    "by_source": by_src(self.by_source_cv),
                    "by_gpu_type": by_gpu(self.by_source_cv),
                },
                "leave_one_gpu_type_out": {
                    "overall": summarise(self.by_gpu_cv).to_dict(),
                    "by_gpu_type": by_gpu(self.by_gpu_cv),
                    "by_source": by_src(self.by_gpu_cv),
                },
            },
            "skipped": sum(1 for r in self.runs if r.skip_reason is not None),
            "profile_guided": self.profile_split() if self.profiled else None,
            "parameters": self.model.to_dict(),
        }


def validate(path: str | Path, model: StepTimeModel | None = None) -> Validation:
    """Score the step-time model on every usable row of ``path`` with ``model`` (the shipped parameters by
    default) and cross-validated, leaving one source and one GPU type out."""
    runs = read_runs(path)
    model = model or shipped_model()
    # Cross-validation refits from the defaults (the given parameters were fitted on these rows), keeping
    # the given model's measured layer profiles.
    base = StepTimeModel(layer_profiles=model.layer_profiles)
    return Validation(
        runs=runs,
        model=model,
        in_sample=score(runs, model),
        by_source_cv=cross_validate(runs, by="source", base=base),
        by_gpu_cv=cross_validate(runs, by="gpu", base=base),
        gpu_of={r.row_id: gpu_type_of(r) for r in runs},
        profiled=profiled_rows(runs, model),
    )


def profiled_rows(runs: Sequence[StepRun], model: StepTimeModel) -> frozenset[str]:
    """The usable rows ``model`` prices from a measured layer profile on any of their GPU types."""
    if not model.profiles:
        return frozenset()
    out = set()
    for r in usable(runs):
        assert r.job is not None
        terms = step_terms(r.job)
        if any(profiled_point(terms, gpu, model) is not None for gpu, _ in r.placements()):
            out.add(r.row_id)
    return frozenset(out)


def calibrate(path: str | Path, base: StepTimeModel | None = None) -> tuple[StepTimeModel, Validation]:
    """Fit on every usable row of ``path``; the residuals kept for bands and noisy truth are the
    leave-one-source-out ones."""
    runs = read_runs(path)
    loso = cross_validate(runs, by="source", base=base)
    fitted = fit(runs, base)
    arch = {r.row_id: r.gpu.architecture for r in usable(runs) if r.gpu is not None and not r.heterogeneous}
    by_arch: dict[str, list[float]] = {}
    for s in loso:
        if s.row_id in arch:
            by_arch.setdefault(arch[s.row_id], []).append(math.log(s.measured_s / s.predicted_s))
    fitted = replace(
        fitted,
        residuals=tuple(math.log(s.measured_s / s.predicted_s) for s in loso),
        residuals_by_architecture={k: tuple(v) for k, v in by_arch.items()},
    )
    return fitted, Validation(
        runs=runs,
        model=fitted,
        in_sample=score(runs, fitted),
        by_source_cv=loso,
        by_gpu_cv=cross_validate(runs, by="gpu", base=base),
        gpu_of={r.row_id: gpu_type_of(r) for r in runs},
    )


def write_fit(model: StepTimeModel, source: str, path: Path | None = None) -> Path:
    """Write the shipped parameters (``frenzy_opt/data/steptime-fit.json``)."""
    target = path or Path(__file__).resolve().parents[1] / FIT_PATH
    payload = {"source": source, "parameters": model.to_dict()}
    target.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return target


# --- feasibility of the published configurations -------------------------------------------------------

PARALLEL_FIELDS = ("dp", "tp", "pp", "vpp", "cp", "ep", "sequence_parallel", "zero_stage", "recompute", "attention")


def refused(run: StepRun) -> str | None:
    """Why the planner would refuse the run's own configuration on its own GPU type (None: admitted).

    The job is pinned to the run's parallel config and micro-batch and planned on a cluster of the run's
    GPU type and node size, as ``frenzy plan`` would; a refusal is a plan search without that plan."""
    from frenzy_opt.hardware.cluster import parse_cluster
    from frenzy_opt.planning.plans import enumerate_plans

    assert run.job is not None and run.gpu is not None and run.links is not None
    job = replace(run.job, pinned=frozenset({*PARALLEL_FIELDS, "micro_batch_size"}))
    n, per_node = job.parallel.num_gpus, run.links.gpus_per_node
    nodes = max(1, math.ceil(n / per_node))
    cluster = parse_cluster(
        {
            "name": f"row-{run.row_id}",
            "node_groups": [{"gpu": run.gpu.name, "num_nodes": nodes, "gpus_per_node": min(per_node, n)}],
        }
    )
    search = enumerate_plans(job, cluster)
    if any(p.parallel == job.parallel and p.micro_batch_size == job.training.micro_batch_size for p in search.plans):
        return None
    needed = search.min_device_bytes
    gib = 2**30
    if not needed:
        return "no valid configuration"
    why = search.refusal({run.gpu.name: run.gpu.memory_bytes})
    return (
        f"memory: the bound needs {needed / gib:.1f} GiB per GPU, {run.gpu.name} has "
        f"{run.gpu.memory_bytes / gib:.1f} GiB" + (f" ({why})" if why else "")
    )


# --- the report ----------------------------------------------------------------------------------------


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f} %"


def _signed(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:+.1f} %"


def render_markdown(result: Validation, command: str, refusals: dict[str, str | None] | None = None) -> str:
    """``docs/steptime-validation.md``: targets, per source and per GPU type (in sample, leave one source
    out, leave one GPU type out), the fitted parameters, every row, the skipped rows."""
    payload = result.to_dict()
    cv = payload["cross_validated"]
    loso, logo = cv["leave_one_source_out"], cv["leave_one_gpu_type_out"]
    lines = [
        "# Step-time model against published measured runs",
        "",
        f"- Command: `{command}`",
        "- Data: the calibration file's rows (one published run each; sources and locators in its README).",
        "- Model: `frenzy_opt/prediction/steptime.py`; parameters fitted by `frenzy_opt/validation/steptime.py` on the",
        "  homogeneous rows (heterogeneous rows are priced on each of their GPU types, the slowest step kept, and",
        "  only scored).",
        "- Error = predicted / measured - 1; tables give the mean |error| (signed mean in brackets).",
        "- In sample = the parameters fitted on every row; leave one source out (LOSO) = each source's rows",
        "  predicted by parameters fitted without that source; leave one GPU type out (LOGO) likewise by the",
        "  file's `gpu_class`.",
        "",
        "## Targets",
        "",
        "| target | figure | met |",
        "|---|---:|---|",
    ]
    lo, lg = loso["overall"]["mean_abs_error"], logo["overall"]["mean_abs_error"]
    lines.append(f"| LOSO mean error <= 12 % | {_pct(lo)} | {'yes' if lo <= 0.12 else 'no'} |")
    lines.append(f"| LOGO mean error <= 15 % | {_pct(lg)} | {'yes' if lg <= 0.15 else 'no'} |")
    worst_gpu = max(
        ((k, v["mean_abs_error"]) for k, v in logo["by_gpu_type"].items() if not k.startswith("mixed")),
        key=lambda kv: kv[1],
        default=("-", math.nan),
    )
    worst_loso_gpu = max(
        ((k, v["mean_abs_error"]) for k, v in loso["by_gpu_type"].items() if not k.startswith("mixed")),
        key=lambda kv: kv[1],
        default=("-", math.nan),
    )
    lines.append(
        f"| every GPU type <= 20 % (LOSO), worst | {worst_loso_gpu[0]} {_pct(worst_loso_gpu[1])} | "
        f"{'yes' if worst_loso_gpu[1] <= 0.2 else 'no'} |"
    )
    lines.append(
        f"| every GPU type <= 20 % when left out (LOGO), worst | {worst_gpu[0]} {_pct(worst_gpu[1])} | "
        f"{'yes' if worst_gpu[1] <= 0.2 else 'no'} |"
    )
    if refusals is not None:
        bad = {k: v for k, v in refusals.items() if v}
        lines.append(
            f"| no published configuration refused as infeasible | {len(bad)} of {len(refusals)} refused | "
            f"{'yes' if not bad else 'no'} |"
        )
    split = payload.get("profile_guided")
    if split:
        lines += [
            "",
            f"Measured layer profiles price {len(split['rows'])} rows (ids {', '.join(split['rows'])}); their errors",
            "apart from the others':",
            "",
            "| rows | in sample | LOSO | LOGO |",
            "|---|---:|---:|---:|",
        ]
        for kind in ("profile_guided", "unprofiled"):
            cells = [split[k][kind] for k in ("in_sample", "leave_one_source_out", "leave_one_gpu_type_out")]
            lines.append(
                f"| {kind.replace('_', '-')} ({cells[0]['rows']}) | "
                + " | ".join(f"{_pct(c['mean_abs_error'])} ({_signed(c['mean_signed_error'])})" for c in cells)
                + " |"
            )
    lines += [
        "",
        f"Overall: in sample {_pct(payload['overall']['mean_abs_error'])}, LOSO {_pct(lo)} (median "
        f"{_pct(loso['overall']['median_abs_error'])}, worst {_pct(loso['overall']['max_abs_error'])}), LOGO "
        f"{_pct(logo['overall']['mean_abs_error'])}; {payload['overall']['rows']} rows scored, "
        f"{payload['skipped']} skipped.",
        "",
        "## By source",
        "",
        "| source | rows | in sample | LOSO | LOGO |",
        "|---|---:|---:|---:|---:|",
    ]

    def cell(table: dict[str, Any], key: str) -> str:
        v = table.get(key)
        if not v:
            return "-"
        return f"{_pct(v['mean_abs_error'])} ({_signed(v['mean_signed_error'])})"

    for source, v in payload["by_source"].items():
        lines.append(
            f"| {source} | {v['rows']} | {cell(payload['by_source'], source)} | {cell(loso['by_source'], source)} | "
            f"{cell(logo['by_source'], source)} |"
        )
    lines += ["", "## By GPU type", "", "| GPU type | rows | in sample | LOSO | LOGO |", "|---|---:|---:|---:|---:|"]
    for gpu, v in payload["by_gpu_type"].items():
        lines.append(
            f"| {gpu} | {v['rows']} | {cell(payload['by_gpu_type'], gpu)} | {cell(loso['by_gpu_type'], gpu)} | "
            f"{cell(logo['by_gpu_type'], gpu)} |"
        )
    params = payload["parameters"]
    lines += ["", "## Fitted parameters (in sample, shipped in `frenzy_opt/data/steptime-fit.json`)", ""]
    for key, value in sorted(params.items()):
        if key in ("residuals", "residuals_by_architecture") or value == {}:
            continue  # an empty table is not fitted (its defaults apply)
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v:.4g}" for k, v in sorted(value.items()))
        elif isinstance(value, float):
            value = f"{value:.4g}"
        lines.append(f"- `{key}`: {value}")
    if result.model.residuals:
        p10, p90 = result.model.band(1.0)
        lines.append(
            f"- prediction band from the {len(result.model.residuals)} LOSO residuals: p10 x{p10:.2f}, p90 x{p90:.2f}"
        )
        for arch, pool in sorted(result.model.residuals_by_architecture.items()):
            lo, hi = result.model.band(1.0, arch)
            own = "its own" if len(pool) >= MIN_BAND_RUNS else "all runs' (too few of its own)"
            lines.append(f"  - {arch}: {len(pool)} runs, {own} band p10 x{lo:.2f}, p90 x{hi:.2f}")
    lines += [
        "",
        "## Rows",
        "",
        "| id | source | GPU | measured s | in sample | LOSO | LOGO | assumptions |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in payload["rows"]:
        if "skipped" in row:
            continue
        c = row["cross_validated"]
        lines.append(
            f"| {row['id']} | {row['source'][:40]} | {row['gpu_type']} | {row['measured_s']:.4g} | "
            f"{_signed(row['error'])} | {_signed(c['leave_one_source_out']['error'])} | "
            f"{_signed(c['leave_one_gpu_type_out']['error'])} | {'; '.join(row['assumptions'])} |"
        )
    skipped = [row for row in payload["rows"] if "skipped" in row]
    if skipped:
        lines += ["", "## Skipped rows", "", "| id | source | reason |", "|---|---|---|"]
        lines += [f"| {r['id']} | {r['source'][:50]} | {r['skipped']} |" for r in skipped]
    if refusals:
        bad = {k: v for k, v in refusals.items() if v}
        if bad:
            lines += ["", "## Configurations the planner refuses", "", "| id | reason |", "|---|---|"]
            lines += [f"| {k} | {v} |" for k, v in bad.items()]
    return "\n".join(lines) + "\n"
