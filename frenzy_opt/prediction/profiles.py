"""Layer profiles: measured seconds of one transformer layer (and the embedding and output layers) of a job's
shapes on one GPU type, the calibration ``frenzy profile`` writes and the step-time model prices with.

A profile is keyed by the GPU type, the runtime that ran the layer and the layer's shape (:class:`LayerShape`:
widths, heads, vocabulary, sequence length, number format); it holds one :class:`ProfilePoint` per
(micro-batch size, tensor-parallel degree) measured. A job whose GPU type, runtime and shape match a stored
profile at its tensor-parallel degree is priced from it (:meth:`ProfileIndex.point`): its micro-batch's times
are the measured point's, interpolated linearly between the two measured micro-batch sizes around it, or
scaled in proportion to the micro-batch from the nearest one outside the measured range. Everything else in
the step -- the pipeline bubble, data-parallel and pipeline communication, and the tensor-parallel collectives
unless the profile was measured with them -- stays the kernel model's. This is how Sailor (Strati et al.,
SOSP 2025, Sec. 4.1) and Metis (Um et al., ATC 2024) plan: per-layer profiles measured once per GPU type and
model, composed with a communication model.

Profiles are stored in a calibration profile (:mod:`frenzy_opt.prediction.calibrations`) as the step-time
parameters' ``layer_profiles`` list, so ``--calibration NAME`` carries them into ``plan``, ``solve``,
``simulate`` and ``serve``.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, fields, replace
from typing import Any

PROFILE_FORMAT = "frenzy-layer-profile/1"
# Runtimes pad the vocabulary to a multiple of 128 rows (Megatron-LM's ``--make-vocab-size-divisible-by``,
# default 128), so a profile of GPT-2's 50,304 rows is the one of OPT's 50,272.
VOCAB_PADDING = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerShape:
    """What fixes a layer's kernels: its widths, heads and vocabulary (on one tensor-parallel rank they are
    divided by the point's ``tp``), the sequence length and the number format."""

    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    seq_len: int
    precision: str
    mlp: str = "swiglu"
    num_experts: int = 1
    moe_top_k: int = 1
    attention: str = "flash"
    """The attention kernel: flash (fused) or eager (the score matrix in memory)."""

    @staticmethod
    def of(arch: Any, seq_len: int, precision: str, attention: str = "flash") -> LayerShape:
        """The shape of ``arch`` (a :class:`frenzy_opt.models.arch.ModelArch`) trained at ``seq_len`` in
        ``precision``, its vocabulary padded as runtimes pad it (:data:`VOCAB_PADDING`); one object per
        distinct argument set (a plan search asks for the same shape thousands of times)."""
        return _shape_of(arch, seq_len, str(precision), attention)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> LayerShape:
        return LayerShape(**_checked(data, LayerShape, "layer profile shape"))


@functools.lru_cache(maxsize=1024)
def _shape_of(arch: Any, seq_len: int, precision: str, attention: str) -> LayerShape:
    return LayerShape(
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.expert_ffn_size if arch.is_moe else arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.kv_channels,
        vocab_size=-(-arch.vocab_size // VOCAB_PADDING) * VOCAB_PADDING,
        seq_len=seq_len,
        precision=str(precision),
        mlp=arch.mlp,
        num_experts=arch.num_experts,
        moe_top_k=arch.moe_top_k,
        attention=attention,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfilePoint:
    """Seconds of one micro-batch at one tensor-parallel degree: a transformer layer's forward and backward,
    the embedding's and the output layer's (with its loss), and the optimizer step of one layer's parameters
    (0: not measured). ``layer_peak_bytes`` is the peak memory allocated while one layer ran forward and
    backward (0: not measured)."""

    micro_batch_size: int
    tp: int
    layer_fwd_s: float
    layer_bwd_s: float
    embedding_fwd_s: float = 0.0
    embedding_bwd_s: float = 0.0
    output_fwd_s: float = 0.0
    output_bwd_s: float = 0.0
    update_s: float = 0.0
    layer_peak_bytes: int = 0

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1 or self.tp < 1:
            raise ValueError(
                f"layer profile point: micro_batch_size and tp must be >= 1, got {self.micro_batch_size}, {self.tp}"
            )
        for f in fields(self):
            if f.name not in ("micro_batch_size", "tp") and getattr(self, f.name) < 0:
                raise ValueError(f"layer profile point: {f.name} must be >= 0, got {getattr(self, f.name)}")
        if self.layer_fwd_s <= 0 or self.layer_bwd_s <= 0:
            raise ValueError("layer profile point: layer_fwd_s and layer_bwd_s must be > 0 (measured seconds)")

    def layer_s(self, recompute_full: bool) -> float:
        """A layer's forward and backward, with a second forward under full recompute (Chen et al. 2016)."""
        return self.layer_fwd_s * (2 if recompute_full else 1) + self.layer_bwd_s

    def scaled(self, micro_batch_size: int, factor: float) -> ProfilePoint:
        """This point's per-micro-batch times times ``factor`` (the optimizer step does not depend on it)."""
        return replace(
            self,
            micro_batch_size=micro_batch_size,
            layer_fwd_s=self.layer_fwd_s * factor,
            layer_bwd_s=self.layer_bwd_s * factor,
            embedding_fwd_s=self.embedding_fwd_s * factor,
            embedding_bwd_s=self.embedding_bwd_s * factor,
            output_fwd_s=self.output_fwd_s * factor,
            output_bwd_s=self.output_bwd_s * factor,
            layer_peak_bytes=0,
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ProfilePoint:
        return ProfilePoint(**_checked(data, ProfilePoint, "layer profile point"))


def _between(lo: ProfilePoint, hi: ProfilePoint, micro_batch_size: int) -> ProfilePoint:
    """Each time linearly interpolated between ``lo`` and ``hi`` at ``micro_batch_size``."""
    w = (micro_batch_size - lo.micro_batch_size) / (hi.micro_batch_size - lo.micro_batch_size)
    values = {
        f.name: getattr(lo, f.name) + w * (getattr(hi, f.name) - getattr(lo, f.name))
        for f in fields(ProfilePoint)
        if f.name.endswith("_s")
    }
    return ProfilePoint(micro_batch_size=micro_batch_size, tp=lo.tp, **values)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerProfile:
    """The points measured for one GPU type, runtime and layer shape (module docstring)."""

    gpu: str
    runtime: str
    shape: LayerShape
    points: tuple[ProfilePoint, ...]
    source: str = ""
    """Where the times come from (``frenzy profile`` on a named device, or an imported artefact)."""
    includes_tp_comm: bool = False
    """The layer times include its tensor-parallel collectives (measured on ``tp`` GPUs of one node, as
    Sailor's profiler does); ``frenzy profile`` measures one rank's shard on one GPU, without them."""
    model: str = ""
    """The model the shape was taken from (informational)."""

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError(f"layer profile for {self.gpu}: no points")
        keys = [(p.micro_batch_size, p.tp) for p in self.points]
        if len(set(keys)) != len(keys):
            raise ValueError(f"layer profile for {self.gpu}: a (micro_batch_size, tp) point appears twice")

    @property
    def key(self) -> tuple[str, str, LayerShape]:
        return (self.gpu, self.runtime, self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PROFILE_FORMAT,
            "gpu": self.gpu,
            "runtime": self.runtime,
            "model": self.model,
            "source": self.source,
            "includes_tp_comm": self.includes_tp_comm,
            "shape": self.shape.to_dict(),
            "points": [p.to_dict() for p in sorted(self.points, key=lambda p: (p.tp, p.micro_batch_size))],
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> LayerProfile:
        if not isinstance(data, dict):
            raise ValueError(f"layer profile: expected a mapping, got {type(data).__name__}")
        fmt = data.get("format", PROFILE_FORMAT)
        if fmt != PROFILE_FORMAT:
            raise ValueError(f"layer profile: format {fmt!r} is not {PROFILE_FORMAT!r}")
        allowed = {"format", "gpu", "runtime", "model", "source", "includes_tp_comm", "shape", "points"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"layer profile: unknown field(s) {', '.join(unknown)}; allowed: {sorted(allowed)}")
        missing = [k for k in ("gpu", "runtime", "shape", "points") if k not in data]
        if missing:
            raise ValueError(f"layer profile: missing field(s) {', '.join(missing)}")
        return LayerProfile(
            gpu=str(data["gpu"]),
            runtime=str(data["runtime"]),
            model=str(data.get("model", "")),
            source=str(data.get("source", "")),
            includes_tp_comm=bool(data.get("includes_tp_comm", False)),
            shape=LayerShape.from_dict(data["shape"]),
            points=tuple(ProfilePoint.from_dict(p) for p in data["points"]),
        )


class ProfileIndex:
    """Profiles by (GPU type, runtime, shape, tp), each with its points sorted by micro-batch size."""

    def __init__(self, profiles: tuple[LayerProfile, ...]) -> None:
        self._points: dict[tuple[str, str, LayerShape, int], list[ProfilePoint]] = {}
        self._comm: dict[tuple[str, str, LayerShape], bool] = {}
        for profile in profiles:
            self._comm[profile.key] = profile.includes_tp_comm
            for p in profile.points:
                self._points.setdefault((*profile.key, p.tp), []).append(p)
        for points in self._points.values():
            points.sort(key=lambda p: p.micro_batch_size)

    def __bool__(self) -> bool:
        return bool(self._points)

    def includes_tp_comm(self, gpu: str, runtime: str, shape: LayerShape) -> bool:
        return self._comm.get((gpu, runtime, shape), False)

    def point(self, gpu: str, runtime: str, shape: LayerShape, tp: int, micro_batch_size: int) -> ProfilePoint | None:
        """The times of ``micro_batch_size`` at ``tp`` (module docstring), None without a profile at ``tp``."""
        points = self._points.get((gpu, runtime, shape, tp))
        if not points:
            return None
        sizes = [p.micro_batch_size for p in points]
        i = bisect.bisect_left(sizes, micro_batch_size)
        if i < len(points) and sizes[i] == micro_batch_size:
            return points[i]
        if 0 < i < len(points):
            return _between(points[i - 1], points[i], micro_batch_size)
        nearest = points[0] if i == 0 else points[-1]
        return nearest.scaled(micro_batch_size, micro_batch_size / nearest.micro_batch_size)


def merge(old: tuple[LayerProfile, ...], new: tuple[LayerProfile, ...]) -> tuple[LayerProfile, ...]:
    """``old`` with ``new`` added; a new point replaces an old one of the same profile, micro-batch and tp."""
    by_key: dict[tuple[str, str, LayerShape], LayerProfile] = {p.key: p for p in old}
    for profile in new:
        before = by_key.get(profile.key)
        if before is None:
            by_key[profile.key] = profile
            continue
        points = {(p.micro_batch_size, p.tp): p for p in before.points}
        points.update({(p.micro_batch_size, p.tp): p for p in profile.points})
        by_key[profile.key] = replace(profile, points=tuple(points.values()))
    return tuple(by_key.values())


def _checked(data: Any, cls: type, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a mapping, got {type(data).__name__}")
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {', '.join(unknown)}; allowed: {sorted(allowed)}")
    return dict(data)
