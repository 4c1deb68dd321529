"""A torchtitan TOML job config as a job spec (runtime fsdp2).

Schema: torchtitan's ``JobConfig`` dataclasses (``torchtitan/config/job_config.py``) at commit
``9810191bbb0385d8ac91cd31abbc7f4156a0d462``'s parent, the last one whose trainer read TOML files
(``torchtitan/models/llama3/train_configs/*.toml``); later commits configure in Python. The llama3 flavours
and the MLP width rule come from ``torchtitan/models/llama3/__init__.py`` (``llama3_args``) and
``model/args.py`` / ``model/model.py`` (``FeedForward``: ``hidden = 4 dim``, then ``int(2 hidden / 3)``,
times ``ffn_dim_multiplier``, rounded up to ``multiple_of``; ``vocab_size`` 128256 unless the flavour sets it).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from frenzy_opt.formats import Imported
from frenzy_opt.models.keys import nearest_key

SECTIONS: dict[str, frozenset[str]] = {
    "model": frozenset(["name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"]),
    "training": frozenset(
        [
            "dataset",
            "dataset_path",
            "local_batch_size",
            "batch_size",
            "global_batch_size",
            "seq_len",
            "max_norm",
            "steps",
            "enable_cpu_offload",
            "dtype",
            "mixed_precision_param",
            "mixed_precision_reduce",
            "gc_freq",
            "gc_debug",
            "dataloader",
        ]
    ),
    "parallelism": frozenset(
        [
            "data_parallel_replicate_degree",
            "data_parallel_shard_degree",
            "fsdp_reshard_after_forward",
            "tensor_parallel_degree",
            "disable_loss_parallel",
            "enable_async_tensor_parallel",
            "pipeline_parallel_degree",
            "module_fqns_per_model_part",
            "pipeline_parallel_first_stage_less_layers",
            "pipeline_parallel_last_stage_less_layers",
            "pipeline_parallel_layers_per_stage",
            "pipeline_parallel_schedule",
            "pipeline_parallel_schedule_csv",
            "pipeline_parallel_microbatch_size",
            "pipeline_parallel_expert_parallel_overlap",
            "context_parallel_degree",
            "context_parallel_load_balancer",
            "context_parallel_rotate_method",
            "expert_parallel_degree",
            "expert_tensor_parallel_degree",
            "expert_parallel_comm_backend",
        ]
    ),
    "activation_checkpoint": frozenset(
        [
            "mode",
            "selective_ac_option",
            "per_op_sac_force_recompute_mm_shapes_by_fqns",
            "early_stop",
            "memory_budget",
            "visualize_memory_budget_pareto",
            "preserve_rng_state",
            "determinism_check",
            "debug",
        ]
    ),
    "optimizer": frozenset(
        ["name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation", "early_step_in_backward"]
    ),
}
"""The sections frenzy reads, with every key their ``JobConfig`` dataclass has."""
IGNORED_SECTIONS = frozenset(
    [
        "job",
        "profiling",
        "metrics",
        "lr_scheduler",
        "checkpoint",
        "compile",
        "comm",
        "memory_estimation",
        "fault_tolerance",
        "experimental",
        "validation",
        "debug",
        "quantize",
        "float8",
        "mx",
        "dataloader",
    ]
)
"""Sections that change neither memory nor step time as frenzy models them (``quantize`` and the older
``float8`` are read for fp8 options only)."""

LLAMA3_FLAVORS: dict[str, dict[str, Any]] = {
    "debugmodel": {"dim": 256, "n_layers": 6, "n_heads": 16, "vocab_size": 2048},
    "8B": {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3,
           "multiple_of": 1024},
    "70B": {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3,
            "multiple_of": 4096},
    "405B": {"dim": 16384, "n_layers": 126, "n_heads": 128, "n_kv_heads": 8, "ffn_dim_multiplier": 1.2,
             "multiple_of": 4096},
}  # fmt: skip
"""torchtitan's ``llama3_args`` (the ``_flex`` / ``_varlen`` variants share their base flavour's shapes)."""

PRECISIONS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
OPTIMIZERS = {"adamw": "adamw", "adam": "adam"}
INTERLEAVED = ("interleaved1f1b", "interleavedzerobubble", "loopedbfs", "zbvzerobubble", "dualpipev")
"""Schedules with several stages per pipeline rank (``torch.distributed.pipelining``'s multi-stage ones)."""


def llama3_ffn(dim: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """torchtitan's ``FeedForward`` width (module docstring)."""
    hidden = int(2 * 4 * dim / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _check_keys(config: dict[str, Any], where: str) -> None:
    for section, value in config.items():
        if section not in SECTIONS and section not in IGNORED_SECTIONS:
            near = nearest_key(section, [*SECTIONS, *IGNORED_SECTIONS])
            raise ValueError(f"{where}: unknown section [{section}] (nearest known: {near})")
        if section in SECTIONS:
            if not isinstance(value, dict):
                raise ValueError(f"{where}: [{section}] must be a table")
            unknown = sorted(set(value) - SECTIONS[section])
            if unknown:
                hints = ", ".join(f"{k} (nearest known: {nearest_key(k, SECTIONS[section])})" for k in unknown)
                raise ValueError(f"{where}: [{section}] unknown key(s) {hints}")


def _model(section: dict[str, Any], vocab_size: int | None, where: str) -> dict[str, Any]:
    name, flavor = section.get("name", "llama3"), str(section.get("flavor", "debugmodel"))
    if name != "llama3":
        raise ValueError(f"{where}: [model] name {name!r} is not modelled; modelled: llama3 (or import its HF config)")
    base = flavor.removesuffix("_flex_attn").removesuffix("_varlen_attn").removesuffix("_flex").removesuffix("_varlen")
    if base not in LLAMA3_FLAVORS:
        raise ValueError(f"{where}: [model] flavor {flavor!r} must be one of {', '.join(LLAMA3_FLAVORS)}")
    args = LLAMA3_FLAVORS[base]
    ffn = llama3_ffn(args["dim"], args.get("multiple_of", 256), args.get("ffn_dim_multiplier"))
    return {
        "name": f"llama3-{flavor}",
        "num_layers": args["n_layers"],
        "hidden_size": args["dim"],
        "ffn_hidden_size": ffn,
        "num_attention_heads": args["n_heads"],
        "num_kv_heads": args.get("n_kv_heads", args["n_heads"]),
        "vocab_size": vocab_size or args.get("vocab_size", 128256),
    }


def _parallel(p: dict[str, Any], num_layers: int, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, ours in (("tensor_parallel_degree", "tp"), ("pipeline_parallel_degree", "pp"),
                      ("context_parallel_degree", "cp"), ("expert_parallel_degree", "ep")):  # fmt: skip
        if key in p:
            out[ours] = int(p[key])
    shard, replicate = int(p.get("data_parallel_shard_degree", -1)), int(p.get("data_parallel_replicate_degree", 1))
    if shard > 0:
        out["dp"] = shard * replicate
    else:
        notes.append("data_parallel_shard_degree -1 (every GPU left): dp is searched")
    reshard = p.get("fsdp_reshard_after_forward", "default")
    if reshard in ("always", "never"):
        out["zero_stage"] = 3 if reshard == "always" else 2
    schedule = str(p.get("pipeline_parallel_schedule", "1F1B")).lower()
    pp = out.get("pp", 1)
    if pp > 1 and schedule in INTERLEAVED:
        per_stage = p.get("pipeline_parallel_layers_per_stage")
        out["vpp"] = num_layers // (pp * int(per_stage)) if per_stage else 2
        notes.append(
            f"pipeline schedule {p.get('pipeline_parallel_schedule')} priced as interleaved 1F1B, vpp {out['vpp']}"
        )
    elif pp > 1 and schedule not in ("1f1b", "gpipe"):
        notes.append(f"pipeline schedule {p.get('pipeline_parallel_schedule')} priced as 1F1B")
    return out


def from_torchtitan(
    path: str | Path, *, global_batch_size: int | None = None, vocab_size: int | None = None
) -> Imported:
    """The job spec of a torchtitan TOML file (see the module docstring); ``global_batch_size`` replaces a
    ``-1`` that the data-parallel degree would resolve."""
    where = str(path)
    try:
        config = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path} is not valid TOML: {err}") from None
    _check_keys(config, where)
    notes: list[str] = []
    model = _model(config.get("model", {}), vocab_size, where)
    t, p = config.get("training", {}), config.get("parallelism", {})
    parallel = _parallel(p, model["num_layers"], notes)
    training: dict[str, Any] = {"runtime": "fsdp2", "pin_micro_batch": True}
    if t.get("enable_cpu_offload"):
        raise ValueError(f"{where}: [training] enable_cpu_offload = true: CPU offload is not modelled")
    local = int(t.get("local_batch_size", t.get("batch_size", 8)))
    micro = int(p.get("pipeline_parallel_microbatch_size", 1)) if parallel.get("pp", 1) > 1 else local
    gbs = global_batch_size or int(t.get("global_batch_size", -1))
    if gbs < 1:
        if "dp" not in parallel:
            raise ValueError(
                f"{where}: [training] global_batch_size -1 is local_batch_size x the data-parallel degree, which "
                "data_parallel_shard_degree -1 leaves to the world size: give --global-batch-size"
            )
        gbs = local * parallel["dp"]
    training |= {"micro_batch_size": micro, "global_batch_size": gbs}
    for key, ours in (("seq_len", "seq_len"), ("steps", "train_steps")):
        if key in t:
            training[ours] = int(t[key])
    training["precision"] = _precision(config, t, where)
    if training["precision"] == "fp8":
        linear = config.get("quantize", {}).get("linear", {}).get("float8", config.get("float8", {}))
        if "enable_fsdp_float8_all_gather" in linear:
            training["fp8_param_gather"] = bool(linear["enable_fsdp_float8_all_gather"])
    opt = str(config.get("optimizer", {}).get("name", "AdamW"))
    if opt.lower() not in OPTIMIZERS:
        raise ValueError(f"{where}: [optimizer] name {opt!r} is not modelled; modelled: AdamW, Adam")
    training["optimizer"] = OPTIMIZERS[opt.lower()]
    mode = str(config.get("activation_checkpoint", {}).get("mode", "selective"))
    if mode not in ("none", "selective", "full"):
        raise ValueError(
            f"{where}: [activation_checkpoint] mode {mode!r} is not modelled; modelled: none, selective, full"
        )
    parallel["recompute"] = mode
    if config.get("compile", {}).get("enable"):
        notes.append("torch.compile is not modelled: step times are those of eager torchtitan")
    spec = {"name": f"{model['name']}-torchtitan", "model": model, "training": training, "parallel": parallel}
    return Imported(spec=spec, notes=notes)


def _precision(config: dict[str, Any], t: dict[str, Any], where: str) -> str:
    converters = [str(c) for c in config.get("model", {}).get("converters", [])]
    if any(c.endswith("mx") for c in converters):
        raise ValueError(f"{where}: [model] converters {converters}: MX formats are not modelled")
    if any(c.endswith("float8") for c in converters):
        return "fp8"
    param = str(t.get("mixed_precision_param", "bfloat16"))
    if param not in PRECISIONS:
        raise ValueError(
            f"{where}: [training] mixed_precision_param must be one of {', '.join(PRECISIONS)}, got {param!r}"
        )
    return PRECISIONS[param]
