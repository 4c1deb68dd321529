"""A Megatron-LM argument list (``--num-layers 32 --hidden-size 4096 …``, a file or a string) as a job spec
(runtime megatron).

Flags and defaults are Megatron-LM's (``megatron/training/arguments.py`` and, for the flags it builds from
``TransformerConfig``, ``megatron/core/transformer/transformer_config.py``; NVIDIA/Megatron-LM commit
``d98e8a64``): LayerNorm, learned absolute positions, biases on every linear, tied embeddings, dropout 0.1,
fp32 unless ``--bf16``/``--fp16``, ``--ffn-hidden-size`` 4 h (``int(8 h / 3 / 64) * 64`` with ``--swiglu``),
``--moe-router-topk`` 2. An argument list fixes every parallel degree but dp (Megatron derives it from the world
size), so the spec pins them all and the planner searches dp. A launcher before the script
(``torchrun … pretrain_gpt.py``) is skipped. Flags frenzy does not read are listed in a note, each with the
nearest flag it reads when one is close (a likely typo).
"""

from __future__ import annotations

import difflib
import shlex
from pathlib import Path
from typing import Any

from frenzy_opt.formats import Imported

VALUED = frozenset(
    [
        "num-layers",
        "hidden-size",
        "ffn-hidden-size",
        "num-attention-heads",
        "num-query-groups",
        "kv-channels",
        "vocab-size",
        "seq-length",
        "encoder-seq-length",
        "max-position-embeddings",
        "micro-batch-size",
        "global-batch-size",
        "train-iters",
        "train-samples",
        "tensor-model-parallel-size",
        "pipeline-model-parallel-size",
        "num-layers-per-virtual-pipeline-stage",
        "num-virtual-stages-per-pipeline-rank",
        "context-parallel-size",
        "expert-model-parallel-size",
        "recompute-granularity",
        "normalization",
        "position-embedding-type",
        "hidden-dropout",
        "attention-dropout",
        "num-experts",
        "moe-router-topk",
        "moe-ffn-hidden-size",
        "optimizer",
        "fp8-format",
        "attention-backend",
        "decoder-first-pipeline-num-layers",
        "decoder-last-pipeline-num-layers",
        "data-parallel-sharding-strategy",
    ]
)
"""Flags read with one value."""
SWITCHES = frozenset(
    [
        "group-query-attention",
        "bf16",
        "fp16",
        "sequence-parallel",
        "use-distributed-optimizer",
        "recompute-activations",
        "swiglu",
        "untie-embeddings-and-output-weights",
        "use-rotary-position-embeddings",
        "disable-bias-linear",
        "add-qkv-bias",
        "tp-comm-overlap",
        "fp8-param-gather",
        "use-flash-attn",
        "use-megatron-fsdp",
        "use-custom-fsdp",
    ]
)
"""Flags read without a value."""
REFUSED = {
    "multi-latent-attention": "multi-head latent attention",
    "moe-shared-expert-intermediate-size": "shared experts",
    "moe-layer-freq": "dense layers among MoE ones",
    "qk-layernorm": "per-head q/k normalisation",
    "mtp-num-layers": "multi-token prediction",
    "cpu-offloading": "activation CPU offload",
    "optimizer-cpu-offload": "optimizer CPU offload",
    "num-experts-per-token": "(use --moe-router-topk)",
}
"""Flags whose feature frenzy does not model: refused, naming it."""
SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
"""``--data-parallel-sharding-strategy`` of Megatron FSDP as ZeRO stages."""


def tokens_of(text: str) -> list[str]:
    """The flags and values of a script or argument string: comments and line continuations dropped, anything
    before the training script (``*.py``) dropped."""
    lines = [line.split("#", 1)[0] for line in text.replace("\\\n", " ").splitlines()]
    words = shlex.split(" ".join(lines))
    scripts = [i for i, w in enumerate(words) if w.endswith(".py")]
    return words[scripts[-1] + 1 :] if scripts else words


def parse_args(words: list[str], where: str) -> dict[str, Any]:
    """``{flag: value}`` (True for a switch, the raw string otherwise; unknown flags keep every value)."""
    args: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise ValueError(f"{where}: {word!r} is not a flag (arguments are --flag [value] pairs)")
        flag, _, inline = word[2:].partition("=")
        values: list[str] = [inline] if inline else []
        while not inline and i + 1 < len(words) and not words[i + 1].startswith("--"):
            i += 1
            values.append(words[i])
        if flag in VALUED and len(values) != 1:
            raise ValueError(f"{where}: --{flag} takes one value, got {len(values)}")
        if any(v.startswith("$") for v in values):
            raise ValueError(f"{where}: --{flag} {values[0]} is an unexpanded shell variable; expand it first")
        args[flag] = values[0] if flag in VALUED else (values or True)
        i += 1
    return args


def _int(args: dict[str, Any], flag: str, where: str, default: int | None = None) -> int:
    value = args.get(flag, default)
    if value is None:
        raise ValueError(f"{where}: --{flag} is required")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{where}: --{flag} must be an integer, got {value!r}") from None


def _model(args: dict[str, Any], where: str, vocab_size: int | None) -> dict[str, Any]:
    hidden, swiglu = _int(args, "hidden-size", where), "swiglu" in args
    heads = _int(args, "num-attention-heads", where)
    default_ffn = int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden
    vocab = vocab_size or args.get("vocab-size")
    if vocab is None:
        raise ValueError(f"{where}: Megatron takes the vocabulary from the tokenizer: give --vocab-size")
    position = (
        "rope" if "use-rotary-position-embeddings" in args else args.get("position-embedding-type", "learned_absolute")
    )
    if position not in ("rope", "learned_absolute"):
        raise ValueError(
            f"{where}: --position-embedding-type {position} is not modelled; modelled: rope, learned_absolute"
        )
    model: dict[str, Any] = {
        "name": "megatron-model",
        "num_layers": _int(args, "num-layers", where),
        "hidden_size": hidden,
        "ffn_hidden_size": _int(args, "ffn-hidden-size", where, default_ffn),
        "num_attention_heads": heads,
        "num_kv_heads": _int(args, "num-query-groups", where, 1) if "group-query-attention" in args else heads,
        "vocab_size": int(vocab),
        "mlp": "swiglu" if swiglu else "gelu",
        "norm": {"rmsnorm": "rmsnorm", "layernorm": "layernorm"}[_choice(args, "normalization", "LayerNorm", where)],
        "tied_embeddings": "untie-embeddings-and-output-weights" not in args,
        "linear_bias": "disable-bias-linear" not in args,
        "qkv_bias": "add-qkv-bias" in args,
        "position_embedding": "rope" if position == "rope" else "learned",
        "max_position_embeddings": _int(args, "max-position-embeddings", where, _seq(args, where)),
        "hidden_dropout": float(args.get("hidden-dropout", 0.1)),
        "attention_dropout": float(args.get("attention-dropout", 0.1)),
    }
    if "kv-channels" in args:
        model["head_dim"] = _int(args, "kv-channels", where)
    if "num-experts" in args:
        model |= {
            "num_experts": _int(args, "num-experts", where),
            "moe_top_k": _int(args, "moe-router-topk", where, 2),
            "moe_ffn_hidden_size": _int(args, "moe-ffn-hidden-size", where, model["ffn_hidden_size"]),
        }
    return model


def _choice(args: dict[str, Any], flag: str, default: str, where: str) -> str:
    value = str(args.get(flag, default)).lower()
    if value not in ("rmsnorm", "layernorm"):
        raise ValueError(f"{where}: --{flag} {value} is not modelled; modelled: LayerNorm, RMSNorm")
    return value


def _seq(args: dict[str, Any], where: str) -> int:
    return _int(args, "seq-length", where, args.get("encoder-seq-length"))


def _parallel(args: dict[str, Any], num_layers: int, where: str) -> dict[str, Any]:
    tp, pp = _int(args, "tensor-model-parallel-size", where, 1), _int(args, "pipeline-model-parallel-size", where, 1)
    vpp = _int(args, "num-virtual-stages-per-pipeline-rank", where, 1)
    if "num-layers-per-virtual-pipeline-stage" in args:
        vpp = num_layers // (pp * _int(args, "num-layers-per-virtual-pipeline-stage", where))
    zero = 1 if "use-distributed-optimizer" in args else 0
    if "use-megatron-fsdp" in args or "use-custom-fsdp" in args:
        strategy = str(args.get("data-parallel-sharding-strategy", "optim_grads_params"))
        if strategy not in SHARDING:
            raise ValueError(f"{where}: --data-parallel-sharding-strategy must be one of {', '.join(SHARDING)}")
        zero = SHARDING[strategy]
    recompute = str(args.get("recompute-granularity", "selective" if "recompute-activations" in args else "none"))
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"{where}: --recompute-granularity must be selective or full, got {recompute!r}")
    parallel: dict[str, Any] = {
        "tp": tp, "pp": pp, "vpp": vpp, "cp": _int(args, "context-parallel-size", where, 1),
        "ep": _int(args, "expert-model-parallel-size", where, 1), "sequence_parallel": "sequence-parallel" in args,
        "zero_stage": zero, "recompute": recompute,
        "attention": "eager" if args.get("attention-backend") in ("unfused", "local") else "flash",
    }  # fmt: skip
    for flag, key in (("decoder-first-pipeline-num-layers", "first_stage_layers"),
                      ("decoder-last-pipeline-num-layers", "last_stage_layers")):  # fmt: skip
        if flag in args:
            parallel[key] = _int(args, flag, where)
    return parallel


def from_megatron(source: str | Path | None, *, text: str | None = None, vocab_size: int | None = None) -> Imported:
    """The job spec of a Megatron-LM argument list: ``text`` when given, else the file ``source``."""
    where = "arguments" if text is not None else str(source)
    if text is None:
        try:
            text = Path(str(source)).read_text(encoding="utf-8")
        except OSError as err:
            raise ValueError(f"cannot read {source}: {err.strerror}") from None
    args = parse_args(tokens_of(text), where)
    for flag, feature in REFUSED.items():
        if flag in args:
            raise ValueError(f"{where}: --{flag}: {feature} is not modelled")
    model = _model(args, where, vocab_size)
    precision = "fp8" if "fp8-format" in args else "bf16" if "bf16" in args else "fp16" if "fp16" in args else "fp32"
    gbs, micro = _int(args, "global-batch-size", where, None), _int(args, "micro-batch-size", where, 1)
    training: dict[str, Any] = {
        "runtime": "megatron", "seq_len": _seq(args, where), "micro_batch_size": micro, "pin_micro_batch": True,
        "global_batch_size": gbs, "precision": precision,
        "optimizer": {"adam": "adamw", "sgd": "sgd"}.get(str(args.get("optimizer", "adam")), "adamw"),
        "tp_comm_overlap": "tp-comm-overlap" in args,
    }  # fmt: skip
    if "train-iters" in args:
        training["train_steps"] = _int(args, "train-iters", where)
    elif "train-samples" in args:
        training["train_steps"] = max(_int(args, "train-samples", where) // gbs, 1)
    if "fp8-param-gather" in args:
        training["fp8_param_gather"] = True
    notes = []
    unread = sorted(set(args) - VALUED - SWITCHES)
    if unread:
        hints = [f"--{f}" + (f" (nearest read: --{n})" if (n := _near(f)) else "") for f in unread]
        notes.append("not read (no input of frenzy's models): " + ", ".join(hints))
    spec = {
        "name": "megatron-job",
        "model": model,
        "training": training,
        "parallel": _parallel(args, model["num_layers"], where),
    }
    return Imported(spec=spec, notes=notes)


def _near(flag: str) -> str | None:
    """A read flag ``flag`` is spelled close to (difflib ratio >= 0.85): a likely typo."""
    close = difflib.get_close_matches(flag, [*VALUED, *SWITCHES], n=1, cutoff=0.85)
    return close[0] if close else None
