"""Calibrating the step-time model: per-GPU-type efficiency fitted to measured per-block times.

The measurements are Sailor's per-layer profiles (Strati et al., "Sailor: Automating Distributed Training
over Dynamic, Heterogeneous, and Geo-distributed Clusters", SOSP 2025; github.com/eth-easl/sailor, MIT),
read from ``<traces>/sailor-llm-profiles`` when that folder is present; nothing of them is copied into this
project. ``profiles/<model>/<gpu>/profile.json`` maps ``micro_batch_size -> tp -> layer -> [fwd_s, bwd_s,
update_s]``: seconds per micro-batch on one GPU of the tensor-parallel group, layer 0 the embedding, the last
the head, the ones between transformer blocks. Sailor's profiler (``third_party/Megatron-DeepSpeed/
profile_all.py``, run by ``profile.sh`` with ``--num-layers 2``) times two blocks and copies them to the
other block indices, so a measurement here is the mean of blocks 1 and 2 of ``fwd_s + bwd_s``.

**What is compared.** One block's forward and backward pass over one micro-batch of ``b`` sequences of
``s`` tokens on one GPU of a ``t``-way tensor-parallel group, as :mod:`frenzy_opt.steptime` prices it:

* compute: ``3 b s F / t`` FLOPs at ``peak x efficiency``, with ``F`` the block's forward FLOPs per token,
  ``2 P + 4 s a d`` (two FLOPs per multiply-add over the block's ``P`` parameters and the attention core
  QK^T and attention x V; the backward pass twice the forward), Narayanan et al. 2021, Sec. 5.1, Eq. 3 --
  the per-layer part of :func:`frenzy_opt.steptime.forward_flops_per_token`;
* tensor parallelism: two all-reduces of the block's ``b s h`` activations forward and two backward
  (Shoeybi et al. 2019, Fig. 4), ring all-reduce ``2 (t-1)/t x bytes`` (Patarasuk & Yuan 2009) over
  :meth:`frenzy_opt.steptime.Links.for_gpu`'s intra-node link at ``link_efficiency`` -- the per-layer part
  of :func:`frenzy_opt.steptime.step_terms_of`'s ``intra_node_bytes``.

**Fit.** Per GPU type, ``measured = c / e + r`` with ``c`` the compute seconds at efficiency 1 and ``r`` the
communication seconds, so ``1/e`` is the one-parameter weighted least-squares solution of
``(measured - r) ~ c x (1/e)``: ``1/e = sum(w c (m - r)) / sum(w c^2)`` (the normal equation; the same fit
as :func:`frenzy_opt.steptime.fit_efficiency`). ``weighting="absolute"`` (``w = 1``, fit_efficiency's
criterion) minimises squared seconds and lets the slowest rows decide; the default ``"relative"``
(``w = 1/m^2``) minimises squared relative errors, so a 5 ms and a 500 ms measurement count alike. (For
compute-only rows whose own efficiencies ``e_i = c_i / m_i`` differ, the two give ``e = sum(e_i^2) /
sum(e_i)`` and ``e = sum(c_i^2) / sum(c_i^2 / e_i)``.)

**Precision.** Sailor trains in fp32: neither ``profile_all.py`` nor its ``ds_config.json`` enables fp16 or
bf16, and ``llm_info.json`` stores 4 bytes per parameter. The peak is therefore
``peak_tflops(gpu, "fp32")``: the TF32 tensor rate where the catalogue lists one (A100 156, RTX 3090 35.6),
else the CUDA-core fp32 rate (V100 15.7, RTX 2080 Ti 13.4 TFLOP/s). The fitted efficiencies are fp32
efficiencies; :class:`frenzy_opt.steptime.StepTimeModel` keeps one efficiency per GPU type for every
precision, so :func:`calibrated_model` describes fp32 (TF32) training only. Applied to bf16/fp16 jobs it is
wrong both ways: on A100 a TF32 efficiency under-rates the bf16 tensor cores, while on V100 and RTX 2080 Ti,
whose fp32 peak is the CUDA-core rate, an efficiency near the CUDA-core limit over-rates the fp16 tensor cores.

**Exclusions** (stated rules, applied by :func:`select_for_fit`; every excluded row is returned with its
reason, nothing is dropped silently):

* ``TF32_OFF_RULE``: on a GPU whose fp32 peak is a TF32 tensor rate above its CUDA-core rate, a (model, GPU)
  profile none of whose rows reaches the CUDA-core fp32 peak ran with TF32 off (PyTorch >= 1.12 disables
  TF32 matmuls by default), i.e. at a different peak than the other profiles of that GPU. In the Sailor data
  that is OPT-30 and LLAMA-3-8 on A100-40: 15-18 TFLOP/s, 0.79-0.92 of the 19.5 TFLOP/s CUDA-core peak, at
  every micro-batch and tp, while the best rows of OPT-350 and GPT-Neo-2.7 on A100 reach 27-72 TFLOP/s.
* ``TENSOR_PARALLEL_RULE``: rows with tp > 1 are not fitted. Their block time includes Megatron's
  tensor-parallel all-reduces on Sailor's machines, whose links (PCIe without peer-to-peer on the RTX
  servers) are far slower than the spec-sheet links the model assumes; fitting them would fold that
  communication into the compute efficiency. They remain available to check the model's tp term
  (:func:`evaluate`).

**Architectures** (:func:`sailor_architecture`), checked against the per-block parameter counts of
Sailor's ``llm_info.json`` (tp = 1) when loading; a mismatch raises ``ValueError``:

* OPT-350 and GPT-Neo-2.7: from ``configs/training_config_*.json`` (layers, hidden, heads, head_dim,
  sequence length, vocabulary, positions) with Megatron's GPT block: GeLU MLP of ``4 h`` (Megatron's default
  ``ffn_hidden_size``; ``profile_all.py`` sets none), LayerNorm, biases on every linear, learned positions:
  12 h^2 + 13 h parameters per block. OPT-350: 24 layers, h 1024, 16 heads, ffn 4096, seq 2048 (12,596,224
  per block). GPT-Neo-2.7: 32 layers, h 2560, ffn 10240, seq 2048 (78,676,480 per block); its config says 32
  heads of 80 while ``profile_all.py`` runs 20 of 128 -- the same ``a d = h`` for the attention core. GPT-Neo's
  local-attention layers are masked full attention in Sailor's code (``gpt_neo_model.py``), so the full
  ``4 s h`` is counted.
* OPT-30: ``profile_all.py``'s 48 layers, h 7168, 56 heads, seq 2048 with the same block (ffn 28672):
  616,655,872 per block.
* LLAMA-3-8: ``profile_all.py`` runs 32 layers, h 4096, 32 heads, seq 8192 through Sailor's Megatron-DeepSpeed
  ``llama_model.py``: SwiGLU with Megatron's default ffn ``4 h = 16384``, full multi-head attention (no GQA),
  biases on every linear, RMSNorm -- 16 h^2 + 15 h = 268,496,896 per block, as ``llm_info.json`` records.
  This is *not* Meta's Llama-3-8B (the catalogue's ``llama3-8b``: 8 kv heads, ffn 14336, no biases, 218.1M
  per block, 23 % fewer FLOPs); the profile measured Sailor's variant, so that is the one priced here.
* Vocabulary and positions do not enter a block's FLOPs; the configs' vocabulary sizes are kept as given
  (``llm_info.json``'s embeddings imply Megatron's padded GPT-2 vocabulary of 50,304 for all four).

**GPU names**: A100-40 -> A100-SXM4-40GB, A100-80 -> A100-SXM4-80GB, V100-16 -> V100-SXM2-16GB, RTX-2080 ->
RTX-2080Ti, RTX-3090 -> RTX-3090. GH-96 (GH200) and Titan-RTX are not in the catalogue and are skipped
(reported in :attr:`SailorProfiles.skipped`); so is ``GPT-Neo-2.7/GH-96``, which besides holds 26 layer
entries -- OPT-350's profile, not GPT-Neo's.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frenzy_opt.gpus import GpuType, lookup_gpu
from frenzy_opt.marp.layout import DTYPE_BYTES
from frenzy_opt.models.arch import ModelArch, shard_param_counts
from frenzy_opt.models.catalog import parse_model
from frenzy_opt.steptime import LINK_EFFICIENCY, Links, StepTimeModel, peak_tflops

SAILOR_DIR = "sailor-llm-profiles"
"""The Sailor profiles' folder inside the traces folder."""

SAILOR_GPUS = {
    "A100-40": "A100-SXM4-40GB",
    "A100-80": "A100-SXM4-80GB",
    "V100-16": "V100-SXM2-16GB",
    "RTX-2080": "RTX-2080Ti",
    "RTX-3090": "RTX-3090",
}
"""Sailor's GPU folder names -> catalogue names."""

SKIPPED_SAILOR_GPUS = {
    "GH-96": "GH200 96 GB is not in the GPU catalogue",
    "Titan-RTX": "Titan RTX is not in the GPU catalogue",
}

SAILOR_PRECISION = "fp32"
"""Sailor profiles without ``--fp16``/``--bf16`` (profile_all.py, ds_config.json): fp32 training."""

PROFILED_BLOCKS = ("1", "2")
"""The two blocks Sailor's profiler times (``--num-layers 2``); the other block indices are copies."""

WEIGHTINGS = ("relative", "absolute")

TF32_OFF_RULE = (
    "TF32 off: no row of this (model, GPU) profile reaches the GPU's CUDA-core fp32 peak, so it ran below the "
    "TF32 peak the other profiles of this GPU use"
)
TENSOR_PARALLEL_RULE = "tp > 1: the block time includes tensor-parallel all-reduces over Sailor's links"

# Megatron GPT block (gpt_model / opt_model / gpt_neo_model in Sailor's Megatron-DeepSpeed): GeLU MLP of 4h,
# LayerNorm, biases on every linear, learned positions.
_GPT_BLOCK: dict[str, Any] = {
    "mlp": "gelu",
    "norm": "layernorm",
    "linear_bias": True,
    "position_embedding": "learned",
}

# Sailor's profile_all.py model_configs (layers, hidden, heads, seq) for the two models without a config json.
_FIXED_ARCHS: dict[str, tuple[dict[str, Any], int]] = {
    "OPT-30": (
        {
            "name": "sailor-opt-30",
            "num_layers": 48,
            "hidden_size": 7168,
            "ffn_hidden_size": 4 * 7168,
            "num_attention_heads": 56,
            "vocab_size": 50272,
            "max_position_embeddings": 2048,
            **_GPT_BLOCK,
        },
        2048,
    ),
    "LLAMA-3-8": (
        {
            "name": "sailor-llama-3-8",
            "num_layers": 32,
            "hidden_size": 4096,
            "ffn_hidden_size": 4 * 4096,
            "num_attention_heads": 32,
            "num_kv_heads": 32,
            "vocab_size": 50304,
            "mlp": "swiglu",
            "norm": "rmsnorm",
            "linear_bias": True,
            "position_embedding": "rope",
            "max_position_embeddings": 8192,
        },
        8192,
    ),
}

_CONFIG_FILES = {
    "OPT-350": "training_config_opt_350.json",
    "GPT-Neo-2.7": "training_config_gpt_neo27.json",
}

SAILOR_MODELS = ("OPT-350", "GPT-Neo-2.7", "OPT-30", "LLAMA-3-8")


@dataclass(frozen=True, slots=True, kw_only=True)
class SailorModel:
    """The architecture and sequence length a Sailor profile was measured with."""

    name: str
    arch: ModelArch
    seq_len: int
    """Tokens per sequence."""
    layer_entries: int
    """Entries per (micro-batch, tp) in its profile: embedding, the blocks, (LLaMA: the final RMSNorm,) head."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockMeasurement:
    """One measured forward + backward time of one transformer block over one micro-batch, on one GPU of a
    ``tp``-way tensor-parallel group, with the volumes the step-time model prices it by."""

    model: str
    gpu: str
    """GPU type; stored as its catalogue name (an alias is accepted and canonicalised)."""
    micro_batch_size: int
    """Sequences per micro-batch."""
    tp: int
    seq_len: int
    """Tokens per sequence."""
    measured_s: float
    """Measured seconds (forward + backward) of the block for the micro-batch."""
    flops: float
    """Model FLOPs of the block's forward + backward on one GPU of the group (:func:`block_flops`)."""
    tp_bytes: float
    """Bytes one GPU moves in the block's tensor-parallel all-reduces (:func:`block_tp_bytes`)."""
    precision: str = SAILOR_PRECISION
    source: str = ""
    """Where the measurement comes from (a profile file relative to the traces folder, or a test)."""

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "tp", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("measured_s", "flops"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if not (math.isfinite(self.tp_bytes) and self.tp_bytes >= 0):
            raise ValueError(f"tp_bytes must be a non-negative finite number, got {self.tp_bytes!r}")
        if self.precision not in DTYPE_BYTES:
            raise ValueError(f"precision must be one of {', '.join(DTYPE_BYTES)}, got {self.precision!r}")
        # Canonical catalogue name (aliases accepted); ValueError naming the catalogue for an unknown GPU.
        object.__setattr__(self, "gpu", lookup_gpu(self.gpu).name)

    @property
    def achieved_tflops(self) -> float:
        """Model TFLOP/s this row reached (communication included for tp > 1)."""
        return self.flops / self.measured_s / 1e12


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """A measurement next to the model's prediction for it."""

    measurement: BlockMeasurement
    predicted_s: float

    @property
    def error(self) -> float:
        """Relative error ``(predicted - measured) / measured``; positive = predicted too slow."""
        return (self.predicted_s - self.measurement.measured_s) / self.measurement.measured_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Exclusion:
    """A measurement left out of the fit, and the rule that left it out."""

    measurement: BlockMeasurement
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFit:
    """The fitted efficiency of one GPU type and the calibrated model's predictions of its fitted rows."""

    gpu: str
    efficiency: float
    """Achieved fraction of ``peak_tflops(gpu, precision)``."""
    predictions: tuple[Prediction, ...]
    precision: str = SAILOR_PRECISION
    """The number format the fitted measurements ran in: the efficiency is keyed to it in the model."""

    @property
    def mean_abs_error(self) -> float:
        return mean_abs_error(self.predictions)

    @property
    def max_abs_error(self) -> float:
        return max_abs_error(self.predictions)


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Fitted efficiencies per GPU type, with what was left out and why."""

    fits: tuple[GpuFit, ...]
    excluded: tuple[Exclusion, ...] = ()
    weighting: str = "relative"
    link_efficiency: float = LINK_EFFICIENCY
    """The link efficiency the fit assumed for the tensor-parallel communication."""

    @property
    def efficiencies(self) -> dict[str, float]:
        return {fit.gpu: fit.efficiency for fit in self.fits}

    def model(self, base: StepTimeModel | None = None) -> StepTimeModel:
        """``base`` (default: a :class:`StepTimeModel` with the fit's link efficiency) with the fitted
        efficiencies."""
        model = base or StepTimeModel(link_efficiency=self.link_efficiency)
        for fit in self.fits:
            model = model.with_efficiency(fit.gpu, fit.efficiency, precision=fit.precision)
        return model


@dataclass(frozen=True, slots=True, kw_only=True)
class SailorProfiles:
    """The block measurements read from a Sailor profiles folder, and the profiles not read, with why."""

    measurements: tuple[BlockMeasurement, ...]
    skipped: tuple[str, ...]
    models: tuple[SailorModel, ...]


# ---------------------------------------------------------------------------------------------- formulas


def block_forward_flops_per_token(arch: ModelArch, seq_len: int) -> float:
    """Forward FLOPs per token of one transformer block: ``2 P + 4 s a d`` with ``P`` the block's parameters
    (Narayanan et al. 2021, Eq. 3: two FLOPs per multiply-add; QK^T and attention x V ``4 s (a d)``); the
    per-layer part of :func:`frenzy_opt.steptime.forward_flops_per_token` (MoE: active experts only)."""
    params = shard_param_counts(arch, tp=1, ep=1).per_layer
    # Only moe_top_k experts touch a token: ModelArch.num_active_params drops the same count from every layer.
    params -= (arch.num_params - arch.num_active_params) // arch.num_layers
    return 2.0 * params + 4.0 * seq_len * arch.num_attention_heads * arch.kv_channels


def block_flops(arch: ModelArch, *, seq_len: int, micro_batch_size: int, tp: int) -> float:
    """FLOPs of one block's forward + backward over one micro-batch on one GPU of a ``tp``-way group:
    ``3 b s F / tp`` (backward = 2x forward, Narayanan et al. 2021, Sec. 5.1; Megatron splits every matmul
    and the attention heads evenly over the group, Shoeybi et al. 2019, Sec. 3)."""
    return 3.0 * micro_batch_size * seq_len * block_forward_flops_per_token(arch, seq_len) / tp


def block_tp_bytes(hidden_size: int, *, seq_len: int, micro_batch_size: int, tp: int, precision: str) -> float:
    """Bytes one GPU sends in one block's tensor-parallel all-reduces for one micro-batch: four all-reduces
    (two forward, two backward; Shoeybi et al. 2019, Fig. 4) of ``b s h`` activations, ring factor
    ``2 (t-1)/t`` (Patarasuk & Yuan 2009); as :func:`frenzy_opt.steptime.step_terms_of` per layer."""
    act_bytes = DTYPE_BYTES["bf16" if precision == "fp8" else precision]
    ring = 2 * (tp - 1) / tp
    return 4 * ring * act_bytes * micro_batch_size * seq_len * hidden_size


def block_measurement(
    *,
    model: str,
    arch: ModelArch,
    gpu: str,
    seq_len: int,
    micro_batch_size: int,
    tp: int,
    measured_s: float,
    precision: str = SAILOR_PRECISION,
    source: str = "",
) -> BlockMeasurement:
    """A :class:`BlockMeasurement` with its FLOPs and bytes computed from ``arch``."""
    return BlockMeasurement(
        model=model,
        gpu=gpu,
        micro_batch_size=micro_batch_size,
        tp=tp,
        seq_len=seq_len,
        measured_s=measured_s,
        flops=block_flops(arch, seq_len=seq_len, micro_batch_size=micro_batch_size, tp=tp),
        tp_bytes=block_tp_bytes(
            arch.hidden_size, seq_len=seq_len, micro_batch_size=micro_batch_size, tp=tp, precision=precision
        ),
        precision=precision,
        source=source,
    )


def _terms(m: BlockMeasurement, model: StepTimeModel, links: Links | None) -> tuple[GpuType, float, float]:
    """(GPU, compute seconds at efficiency 1, communication seconds) of ``m``."""
    gpu = lookup_gpu(m.gpu)
    link = links or Links.for_gpu(gpu)
    compute_at_one = m.flops / (peak_tflops(gpu, m.precision) * 1e12)
    comm = m.tp_bytes / (link.intra_node_gbs * model.link_efficiency * 1e9) if m.tp_bytes else 0.0
    return gpu, compute_at_one, comm


def predict_block_s(m: BlockMeasurement, model: StepTimeModel, links: Links | None = None) -> float:
    """Seconds the step-time model gives the block of ``m``: FLOPs at ``peak x efficiency`` plus the
    tensor-parallel all-reduces over ``links`` (default :meth:`Links.for_gpu`), not overlapped."""
    gpu, compute_at_one, comm = _terms(m, model, links)
    return compute_at_one / model.efficiency_of(gpu, m.precision) + comm


def evaluate(
    measurements: Iterable[BlockMeasurement], model: StepTimeModel, links: Links | None = None
) -> list[Prediction]:
    """The model's prediction for each measurement."""
    return [Prediction(measurement=m, predicted_s=predict_block_s(m, model, links)) for m in measurements]


def mean_abs_error(predictions: Sequence[Prediction]) -> float:
    """Mean of ``|relative error|``."""
    if not predictions:
        raise ValueError("no predictions to summarise")
    return sum(abs(p.error) for p in predictions) / len(predictions)


def max_abs_error(predictions: Sequence[Prediction]) -> float:
    """Largest ``|relative error|``."""
    if not predictions:
        raise ValueError("no predictions to summarise")
    return max(abs(p.error) for p in predictions)


# -------------------------------------------------------------------------------------------------- fit


def fit_block_efficiency(
    measurements: Sequence[BlockMeasurement],
    model: StepTimeModel | None = None,
    *,
    weighting: str = "relative",
    links: Links | None = None,
) -> float:
    """Least-squares efficiency of one GPU type from block measurements (module docstring, "Fit").

    ``measured = c / e + r``; ``1/e = sum(w c (m - r)) / sum(w c^2)`` with ``w = 1/m^2`` (``"relative"``) or
    ``1`` (``"absolute"``). ``model`` supplies the link efficiency (its efficiencies are not used).
    ``ValueError`` for no measurements, several GPU types, an unknown weighting, or times that imply an
    efficiency outside (0, 1].
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
    if not measurements:
        raise ValueError("fit_block_efficiency needs at least one measurement")
    gpus = sorted({m.gpu for m in measurements})
    if len(gpus) > 1:
        raise ValueError(f"fit_block_efficiency fits one GPU type at a time, got {', '.join(gpus)}")
    base = model or StepTimeModel()
    num, den = 0.0, 0.0
    for m in measurements:
        _, c, r = _terms(m, base, links)
        w = 1.0 / m.measured_s**2 if weighting == "relative" else 1.0
        num += w * c * (m.measured_s - r)
        den += w * c * c
    inverse = num / den
    if inverse <= 0:
        raise ValueError(f"{gpus[0]}: measured times do not exceed the modelled communication; cannot fit")
    if inverse < 1:
        raise ValueError(f"{gpus[0]}: measured times imply efficiency {1 / inverse:.3f} > 1: check the inputs")
    return 1.0 / inverse


def calibrate(
    measurements: Iterable[BlockMeasurement],
    *,
    base: StepTimeModel | None = None,
    weighting: str = "relative",
    excluded: Sequence[Exclusion] = (),
) -> Calibration:
    """One :func:`fit_block_efficiency` per GPU type, with the calibrated model's predictions of the fitted
    rows; ``excluded`` is carried into the result for the record."""
    by_gpu: dict[str, list[BlockMeasurement]] = defaultdict(list)
    for m in measurements:
        by_gpu[m.gpu].append(m)
    if not by_gpu:
        raise ValueError("calibrate needs at least one measurement")
    start = base or StepTimeModel()
    fits = []
    for gpu, rows in by_gpu.items():
        efficiency = fit_block_efficiency(rows, start, weighting=weighting)
        fitted = start.with_efficiency(gpu, efficiency)
        fits.append(GpuFit(gpu=gpu, efficiency=efficiency, predictions=tuple(evaluate(rows, fitted))))
    return Calibration(
        fits=tuple(fits), excluded=tuple(excluded), weighting=weighting, link_efficiency=start.link_efficiency
    )


def select_for_fit(measurements: Iterable[BlockMeasurement]) -> tuple[list[BlockMeasurement], list[Exclusion]]:
    """Split measurements into the rows to fit and the rows excluded by the module's stated rules
    (``TF32_OFF_RULE`` first, then ``TENSOR_PARALLEL_RULE``)."""
    rows = list(measurements)
    best: dict[tuple[str, str], float] = defaultdict(float)
    for m in rows:
        best[m.model, m.gpu] = max(best[m.model, m.gpu], m.achieved_tflops)
    kept: list[BlockMeasurement] = []
    excluded: list[Exclusion] = []
    for m in rows:
        gpu = lookup_gpu(m.gpu)
        tensor_fp32 = m.precision == "fp32" and peak_tflops(gpu, "fp32") > gpu.fp32_tflops
        if tensor_fp32 and best[m.model, m.gpu] < gpu.fp32_tflops:
            excluded.append(Exclusion(measurement=m, reason=TF32_OFF_RULE))
        elif m.tp > 1:
            excluded.append(Exclusion(measurement=m, reason=TENSOR_PARALLEL_RULE))
        else:
            kept.append(m)
    return kept, excluded


def split_largest_micro_batch(
    measurements: Iterable[BlockMeasurement],
) -> tuple[list[BlockMeasurement], list[BlockMeasurement]]:
    """(rows to fit, held-out rows): per (model, GPU, tp) the rows at the largest micro-batch are held out
    when that group has more than one micro-batch size."""
    rows = list(measurements)
    largest: dict[tuple[str, str, int], int] = {}
    sizes: dict[tuple[str, str, int], set[int]] = defaultdict(set)
    for m in rows:
        key = (m.model, m.gpu, m.tp)
        largest[key] = max(largest.get(key, 0), m.micro_batch_size)
        sizes[key].add(m.micro_batch_size)
    train: list[BlockMeasurement] = []
    test: list[BlockMeasurement] = []
    for m in rows:
        key = (m.model, m.gpu, m.tp)
        held = len(sizes[key]) > 1 and m.micro_batch_size == largest[key]
        (test if held else train).append(m)
    return train, test


# --------------------------------------------------------------------------------------------- loading


def sailor_dir(root: Path | str) -> Path:
    """The Sailor profiles folder: ``root`` itself if it holds ``profiles/``, else ``root/sailor-llm-profiles``.
    ``FileNotFoundError`` when neither exists."""
    base = Path(root)
    for candidate in (base, base / SAILOR_DIR):
        if (candidate / "profiles").is_dir():
            return candidate
    raise FileNotFoundError(f"no Sailor profiles under {base} (looked for profiles/ and {SAILOR_DIR}/profiles/)")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


def _positive_int(config: dict[str, Any], key: str, path: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{path}: {key} must be a positive integer, got {value!r}")
    return value


def sailor_architecture(folder: Path, model: str) -> SailorModel:
    """The architecture Sailor profiled ``model`` with (module docstring, "Architectures"); ``folder`` is the
    Sailor profiles folder (:func:`sailor_dir`). ``ValueError`` for a model with no known architecture."""
    if model in _FIXED_ARCHS:
        fields, seq_len = _FIXED_ARCHS[model]
        arch = parse_model(dict(fields))
        # Sailor's LLaMA pipeline has the final RMSNorm as a layer of its own (llm_info.json layer 33).
        extra = 3 if model == "LLAMA-3-8" else 2
        return SailorModel(name=model, arch=arch, seq_len=seq_len, layer_entries=arch.num_layers + extra)
    if model not in _CONFIG_FILES:
        raise ValueError(f"no architecture known for Sailor model {model!r}; known: {', '.join(SAILOR_MODELS)}")
    path = folder / "configs" / _CONFIG_FILES[model]
    config = _read_json(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    hidden = _positive_int(config, "hidden_size", path)
    heads = _positive_int(config, "heads", path)
    head_dim = _positive_int(config, "head_dim", path) if "head_dim" in config else hidden // heads
    seq_len = _positive_int(config, "sequence_length", path)
    arch = parse_model(
        {
            "name": f"sailor-{model.lower()}",
            "num_layers": _positive_int(config, "num_layers", path),
            "hidden_size": hidden,
            "ffn_hidden_size": 4 * hidden,
            "num_attention_heads": heads,
            "head_dim": head_dim,
            "vocab_size": _positive_int(config, "vocab_size", path),
            "max_position_embeddings": _positive_int(config, "max_position_embeddings", path)
            if "max_position_embeddings" in config
            else seq_len,
            **_GPT_BLOCK,
        }
    )
    return SailorModel(name=model, arch=arch, seq_len=seq_len, layer_entries=arch.num_layers + 2)


def check_block_params(folder: Path, model: SailorModel) -> None:
    """``ValueError`` unless ``llm_info.json`` gives the block (layer 1, tp 1) of ``model`` exactly the
    parameters our architecture counts (:func:`frenzy_opt.models.arch.shard_param_counts`)."""
    path = folder / "llm_info.json"
    info = _read_json(path)
    try:
        recorded = info[model.name]["1"]["1"]["params_floats"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: no tp-1 block-1 parameter count for {model.name}") from exc
    ours = shard_param_counts(model.arch, tp=1, ep=1).per_layer
    if recorded != ours:
        raise ValueError(
            f"{model.name}: llm_info.json records {recorded} parameters per block, the assumed architecture "
            f"has {ours}; the architecture does not match what Sailor profiled"
        )


def _block_seconds(layers: Any, path: Path, mbs: str, tp: str, entries: int) -> float:
    if not isinstance(layers, dict):
        raise ValueError(f"{path}: micro-batch {mbs}, tp {tp}: expected a mapping of layers")
    if len(layers) != entries:
        raise ValueError(
            f"{path}: micro-batch {mbs}, tp {tp}: {len(layers)} layer entries, expected {entries} "
            "(embedding, blocks, head)"
        )
    times = []
    for block in PROFILED_BLOCKS:
        entry = layers.get(block)
        if not (isinstance(entry, list) and len(entry) >= 2 and all(isinstance(x, int | float) for x in entry)):
            raise ValueError(f"{path}: micro-batch {mbs}, tp {tp}, layer {block}: expected [fwd_s, bwd_s, ...]")
        fwd, bwd = float(entry[0]), float(entry[1])
        if not (fwd > 0 and bwd > 0 and math.isfinite(fwd + bwd)):
            raise ValueError(f"{path}: micro-batch {mbs}, tp {tp}, layer {block}: times must be positive")
        times.append(fwd + bwd)
    return sum(times) / len(times)


def load_sailor_profiles(root: Path | str) -> SailorProfiles:
    """Block measurements of every Sailor profile on a catalogue GPU, under ``root`` (the traces folder or
    the Sailor folder itself). Profiles of GPUs or models we cannot price are listed in ``skipped``;
    malformed files raise ``ValueError``."""
    folder = sailor_dir(root)
    measurements: list[BlockMeasurement] = []
    skipped: list[str] = []
    models: dict[str, SailorModel] = {}
    for model_dir in sorted(p for p in (folder / "profiles").iterdir() if p.is_dir()):
        for gpu_dir in sorted(p for p in model_dir.iterdir() if p.is_dir()):
            label = f"{model_dir.name}/{gpu_dir.name}"
            path = gpu_dir / "profile.json"
            if gpu_dir.name not in SAILOR_GPUS:
                reason = SKIPPED_SAILOR_GPUS.get(gpu_dir.name, "GPU name not mapped to the catalogue")
                skipped.append(f"{label}: {reason}")
                continue
            if model_dir.name not in SAILOR_MODELS:
                skipped.append(f"{label}: no architecture known for model {model_dir.name}")
                continue
            if not path.is_file():
                skipped.append(f"{label}: no profile.json")
                continue
            if model_dir.name not in models:
                sailor = sailor_architecture(folder, model_dir.name)
                check_block_params(folder, sailor)
                models[model_dir.name] = sailor
            sailor = models[model_dir.name]
            measurements += _profile_measurements(path, folder, sailor, SAILOR_GPUS[gpu_dir.name])
    return SailorProfiles(measurements=tuple(measurements), skipped=tuple(skipped), models=tuple(models.values()))


def _profile_measurements(path: Path, folder: Path, sailor: SailorModel, gpu: str) -> list[BlockMeasurement]:
    profile = _read_json(path)
    if not isinstance(profile, dict):
        raise ValueError(f"{path}: expected {{micro_batch_size: {{tp: {{layer: [fwd_s, bwd_s, update_s]}}}}}}")
    source = str(path.relative_to(folder.parent))
    out = []
    for mbs, by_tp in sorted(profile.items(), key=lambda kv: _int_key(kv[0], path)):
        if not isinstance(by_tp, dict):
            raise ValueError(f"{path}: micro-batch {mbs}: expected a mapping of tp degrees")
        for tp, layers in sorted(by_tp.items(), key=lambda kv: _int_key(kv[0], path)):
            seconds = _block_seconds(layers, path, mbs, tp, sailor.layer_entries)
            out.append(
                block_measurement(
                    model=sailor.name,
                    arch=sailor.arch,
                    gpu=gpu,
                    seq_len=sailor.seq_len,
                    micro_batch_size=_int_key(mbs, path),
                    tp=_int_key(tp, path),
                    measured_s=seconds,
                    source=source,
                )
            )
    return out


def _int_key(key: str, path: Path) -> int:
    try:
        value = int(key)
    except ValueError:
        raise ValueError(f"{path}: key {key!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{path}: key {key!r} must be positive")
    return value


def calibrate_sailor(root: Path | str, *, weighting: str = "relative") -> Calibration:
    """Load the Sailor profiles under ``root``, apply :func:`select_for_fit` and :func:`calibrate`."""
    kept, excluded = select_for_fit(load_sailor_profiles(root).measurements)
    return calibrate(kept, weighting=weighting, excluded=excluded)


def calibrated_model(root: Path | str, *, weighting: str = "relative") -> StepTimeModel:
    """A :class:`StepTimeModel` with the per-GPU-type efficiencies fitted to the Sailor profiles under
    ``root``. These are fp32 (TF32) efficiencies (module docstring, "Precision")."""
    return calibrate_sailor(root, weighting=weighting).model()
