"""Import Sailor's per-layer profiles (Strati et al., SOSP 2025; github.com/eth-easl/sailor,
``sailor/Planner/sailor_planner/profiles``) as layer profiles (:mod:`frenzy_opt.prediction.profiles`).

Sailor's artefact keeps ``profiles/<model>/<gpu>/profile.json`` as ``{micro_batch: {tp: {layer: [forward_s,
backward_s, update_s]}}}``, measured with Megatron-DeepSpeed: layer 0 is the embedding, the last the output
layer, the others transformer layers; its ``llm_info.json`` gives each layer's parameter and activation
sizes. The shapes below are read from those files: the hidden size and sequence length from the first
transformer layer's output activation (``act_output_floats = seq_len x hidden``), the vocabulary from the
embedding's parameters (rows x hidden, less the learned position table), the MLP width from the layer's
parameters (``12 h^2 + 13 h`` for a 4h GeLU MLP, ``16 h^2 + 15 h`` for Sailor's LLAMA-3-8). The profiles
are fp32 (Sailor's configs enable no 16-bit format; the parameter sizes in ``llm_info.json`` are 4 bytes per
float), and a layer at ``tp`` > 1 was timed on ``tp`` GPUs of one node, so its times include the layer's
tensor-parallel all-reduces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from frenzy_opt.prediction.profiles import LayerProfile, LayerShape, ProfilePoint

SOURCE = "Sailor artefact (Strati et al., SOSP 2025), eth-easl/sailor sailor/Planner/sailor_planner/profiles"

# Sailor's GPU names and the catalogue parts they are: GCP's A100 and V100 machine types are SXM parts
# (a2-highgpu: A100 40GB SXM4, a2-ultragpu: A100 80GB, n1 + V100: V100-SXM2-16GB; GCP GPU docs), "GH-96"
# is the 96 GB GH200 superchip, and "RTX-2080" is an RTX 2080 Ti (11 GB in Sailor's own GPU-memory table).
GPU_NAMES = {
    "A100-40": "A100-SXM4-40GB",
    "A100-80": "A100-SXM4-80GB",
    "GH-96": "GH200-96GB",
    "V100-16": "V100-SXM2-16GB",
    "RTX-2080": "RTX-2080Ti",
    "RTX-3090": "RTX-3090",
    "Titan-RTX": "TITAN-RTX",
}


@dataclass(frozen=True, slots=True)
class _Model:
    heads: int
    mlp: str
    up_factor: int
    """The MLP's parameters per layer over h^2: 8 for a 4h GeLU MLP, 12 for a 4h SwiGLU one."""
    linear_factor: int
    """The layer's other parameters over h (biases and norms): 13 for OPT's and GPT-Neo's, 15 for LLAMA-3-8."""
    learned_positions: bool


# Attention heads are not in llm_info.json: OPT-350M 16 and OPT-30B 56 (Zhang et al. 2022, Table 1),
# GPT-Neo-2.7B 32 (Sailor's training_config_gpt_neo27.json), Sailor's LLAMA-3-8 32 (Llama 3 8B's query
# heads; its 4h^2 attention parameters say every head has its own key and value).
MODELS = {
    "OPT-350": _Model(heads=16, mlp="gelu", up_factor=8, linear_factor=13, learned_positions=True),
    "GPT-Neo-2.7": _Model(heads=32, mlp="gelu", up_factor=8, linear_factor=13, learned_positions=True),
    "OPT-30": _Model(heads=56, mlp="gelu", up_factor=8, linear_factor=13, learned_positions=True),
    "LLAMA-3-8": _Model(heads=32, mlp="swiglu", up_factor=12, linear_factor=15, learned_positions=False),
}
RUNTIME = "deepspeed"
"""Megatron-DeepSpeed, which :func:`frenzy_opt.validation.steptime_runs.runtime_of` calls deepspeed."""


def _shape(name: str, info: dict[str, dict[str, dict[str, int]]]) -> LayerShape:
    model = MODELS[name]
    layers = info["1"]
    first = layers["1"]
    params = first["params_floats"]
    # The layer's parameters are a h^2 + b h (attention and MLP weights; biases and norms): solve for h, then
    # check it against the activation (seq x h).
    a, b = 4 + model.up_factor, model.linear_factor
    h = round((-b + (b * b + 4 * a * params) ** 0.5) / (2 * a))
    if a * h * h + b * h != params:
        raise ValueError(f"sailor {name}: {params} layer parameters are not {a} h^2 + {b} h for a whole h")
    seq = first["act_output_floats"] // h
    if seq * h != first["act_output_floats"]:
        raise ValueError(f"sailor {name}: act_output_floats {first['act_output_floats']} is not seq x {h}")
    rows = layers["0"]["params_floats"] // h
    vocab = rows - (seq if model.learned_positions else 0)
    ffn = model.up_factor * h // (3 if model.mlp == "swiglu" else 2)
    return LayerShape(
        hidden_size=h,
        ffn_hidden_size=ffn,
        num_attention_heads=model.heads,
        num_kv_heads=model.heads,
        head_dim=h // model.heads,
        vocab_size=vocab,
        seq_len=seq,
        precision="fp32",
        mlp=model.mlp,
        # Megatron-DeepSpeed's attention without FlashAttention (Sailor's configs set no flash-attention flag).
        attention="eager",
    )


def import_profiles(root: Path | str) -> tuple[list[LayerProfile], list[str]]:
    """The profiles under ``root`` (the artefact's folder: ``profiles/`` and ``llm_info.json``), and a note
    for each one skipped and why."""
    root = Path(root)
    info_path = root / "llm_info.json"
    if not info_path.is_file() or not (root / "profiles").is_dir():
        raise ValueError(f"{root}: not a Sailor profile folder (needs llm_info.json and profiles/<model>/<gpu>/)")
    info = json.loads(info_path.read_text(encoding="utf-8"))
    out: list[LayerProfile] = []
    notes: list[str] = []
    for path in sorted(root.glob("profiles/*/*/profile.json")):
        model, gpu = path.parent.parent.name, path.parent.name
        if model not in MODELS or model not in info:
            notes.append(f"{model}/{gpu}: model not known to the importer ({', '.join(MODELS)})")
            continue
        if gpu not in GPU_NAMES:
            notes.append(f"{model}/{gpu}: GPU not known to the importer ({', '.join(GPU_NAMES)})")
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        expected = len(info[model]["1"])
        points: list[ProfilePoint] = []
        wrong: set[int] = set()
        for mbs, by_tp in data.items():
            for tp, layers in by_tp.items():
                if len(layers) != expected:
                    wrong.add(len(layers))
                    continue
                points.append(_point(int(mbs), int(tp), layers))
        if wrong:
            counts = ", ".join(str(n) for n in sorted(wrong))
            notes.append(
                f"{model}/{gpu}: entries with {counts} layers where {model} has {expected} (another model's "
                "measurements under this name): those entries skipped"
            )
        if points:
            out.append(
                LayerProfile(
                    gpu=GPU_NAMES[gpu],
                    runtime=RUNTIME,
                    model=f"sailor {model}",
                    source=f"{SOURCE}/{model}/{gpu}/profile.json",
                    includes_tp_comm=True,
                    shape=_shape(model, info[model]),
                    points=tuple(points),
                )
            )
    return out, notes


def _point(mbs: int, tp: int, layers: dict[str, list[float]]) -> ProfilePoint:
    """One (micro-batch, tp) entry: the transformer layers' median times (the first layer after the
    embedding also carries the pipeline's input handling in Sailor's tables), the embedding and the output
    layer's own."""
    last = str(len(layers) - 1)
    body = sorted(layers[str(i)] for i in range(1, len(layers) - 1))
    fwd = sorted(v[0] for v in body)[len(body) // 2]
    bwd = sorted(v[1] for v in body)[len(body) // 2]
    update = sorted(v[2] for v in body)[len(body) // 2]
    return ProfilePoint(
        micro_batch_size=mbs,
        tp=tp,
        layer_fwd_s=fwd,
        layer_bwd_s=bwd,
        embedding_fwd_s=layers["0"][0],
        embedding_bwd_s=layers["0"][1],
        output_fwd_s=layers[last][0],
        output_bwd_s=layers[last][1],
        update_s=update,
    )
