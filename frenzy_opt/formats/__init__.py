"""``frenzy import hf|torchtitan|megatron FILE``: job specs (contract 1) from the formats users already have.

* ``hf`` — a Hugging Face ``config.json`` (:mod:`frenzy_opt.models.hf`): the model; training fields from the
  options or contract 1's defaults.
* ``torchtitan`` — a torchtitan TOML job config (:mod:`frenzy_opt.formats.torchtitan`): the model flavour,
  ``[training]``, ``[parallelism]``, ``[activation_checkpoint]``, ``[optimizer]`` and float8.
* ``megatron`` — a Megatron-LM argument list, a file or a string (:mod:`frenzy_opt.formats.megatron`).

Local files only. Every importer returns the contract-1 mapping and notes (what was approximated or
ignored); the mapping is checked by :func:`frenzy_opt.core.spec.parse_job` before it is returned, so a
refusal names the field as a hand-written spec's would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from frenzy_opt.core.enums import Runtime
from frenzy_opt.core.spec import parse_job

FORMATS = ("hf", "torchtitan", "megatron")


@dataclass(frozen=True, slots=True, kw_only=True)
class Imported:
    """A job spec read from another format."""

    spec: dict[str, Any]
    """The contract-1 mapping (what ``frenzy import`` writes as YAML)."""
    notes: list[str] = field(default_factory=list)
    """What was approximated, assumed or ignored, one sentence each."""


def import_spec(
    kind: str,
    source: str,
    *,
    text: str | None = None,
    name: str | None = None,
    runtime: str | None = None,
    global_batch_size: int | None = None,
    vocab_size: int | None = None,
) -> Imported:
    """Read ``source`` (a path; for megatron ``text`` may give the arguments instead) as format ``kind``.
    The options fill what the format leaves to its runtime: ``runtime`` (hf), ``global_batch_size``
    (torchtitan's -1), ``vocab_size`` (megatron and torchtitan take it from the tokenizer)."""
    if kind not in FORMATS:
        raise ValueError(f"import: format must be one of {', '.join(FORMATS)}, got {kind!r}")
    if runtime is not None and kind != "hf":
        raise ValueError(f"--runtime applies to hf configs only; a {kind} file names its runtime ({kind}'s own)")
    if runtime is not None and runtime not in tuple(Runtime):
        raise ValueError(f"--runtime must be one of {', '.join(Runtime)}, got {runtime!r}")
    if kind == "hf":
        from frenzy_opt.models.hf import arch_from_hf, load_hf_config

        arch, notes = arch_from_hf(load_hf_config(source), source)
        model = {k: v for k, v in arch.to_dict().items() if v is not None}
        spec: dict[str, Any] = {"name": f"{arch.name}-job", "model": model}
        training: dict[str, Any] = {"runtime": runtime} if runtime else {}
        if global_batch_size is not None:
            training["global_batch_size"] = global_batch_size
        if training:
            spec["training"] = training
        result = Imported(spec=spec, notes=notes)
    elif kind == "torchtitan":
        from frenzy_opt.formats.torchtitan import from_torchtitan

        result = from_torchtitan(source, global_batch_size=global_batch_size, vocab_size=vocab_size)
    else:
        from frenzy_opt.formats.megatron import from_megatron

        result = from_megatron(source, text=text, vocab_size=vocab_size)
    if name:
        result.spec["name"] = name
    parse_job(result.spec)  # a refusal names the field, as for a hand-written spec
    return result
