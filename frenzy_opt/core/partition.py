"""How a pipeline splits a model's layers over its ``pp x vpp`` chunks, as each runtime does it (pure arithmetic).

It sits in ``core`` because both sides need the same answer: MARP's stage models
(:mod:`frenzy_opt.prediction.marp.stages`) and the training worker (:mod:`frenzy_opt.launch.worker.train`), which
must not load the planner to build its pipeline.
"""

from __future__ import annotations

import functools

from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.core.spec import ParallelConfig, check_end_stages

SPLIT_RULES = ("even", "megatron", "torchtitan")
"""How a runtime splits the layers over its ``pp x vpp`` model chunks (:func:`chunk_layer_counts`)."""


def split_rule(runtime: str) -> str:
    """The split rule of ``runtime`` (its profile's ``pipeline_split``): Megatron-core's, torchtitan's (fsdp2),
    else the even split."""
    return profile(runtime).pipeline_split


@functools.lru_cache(maxsize=4096)
def chunk_layer_counts(
    num_layers: int,
    pp: int,
    vpp: int,
    rule: str = "even",
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
) -> tuple[int, ...]:
    """Layers per model chunk, chunk ``c`` living on rank ``c % pp`` (Narayanan et al. 2021, Sec. 2.2).

    * ``even``: an uneven remainder goes to the earliest chunks.
    * ``megatron`` (``megatron/core/transformer/transformer_block.py``, ``get_num_layers_to_build``):
      ``first_stage_layers`` / ``last_stage_layers`` (``--decoder-first/last-pipeline-num-layers``) fix the
      first / last rank's layers and the others share the rest evenly; each rank's layers split evenly
      over its ``vpp`` chunks. Without them the layers split evenly when they divide; when they do not but
      counting the embedding and the loss as one layer each makes them divide
      (``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``, how
      NVIDIA runs Llama-3.1-405B's 126 layers over pp x vpp = 64), the first and the last chunk build one
      layer fewer; otherwise the remainder goes to the earliest chunks (Megatron then needs an explicit
      ``--pipeline-model-parallel-layout``).
    * ``torchtitan`` (``torchtitan/distributed/pipeline_parallel.py``, ``_generate_llm_fqn_per_model_part``
      with its default weights of 1): the embedding and ``norm + lm_head`` count as one layer each, the
      ``L + 2`` units split evenly with the remainder to the earliest chunks, and the first and last chunk
      hold one block fewer than their share (the last may hold none).
    """
    chunks = pp * vpp
    if num_layers < chunks:
        raise ValueError(f"parallel.pp x parallel.vpp ({chunks}) must be <= the model's num_layers ({num_layers})")
    if rule not in SPLIT_RULES:
        raise ValueError(f"split rule must be one of {', '.join(SPLIT_RULES)}, got {rule!r}")
    if first_stage_layers is not None or last_stage_layers is not None:
        return _fixed_end_stages(num_layers, pp, vpp, first_stage_layers, last_stage_layers)
    base, extra = divmod(num_layers, chunks)
    even = tuple(base + (1 if c < extra else 0) for c in range(chunks))
    if chunks == 1 or rule == "even" or (rule == "megatron" and extra == 0):
        return even
    if rule == "megatron":
        for embedding, loss in ((1, 1), (1, 0), (0, 1)):
            units = num_layers + embedding + loss
            if units % chunks == 0 and units // chunks > max(embedding, loss):
                counts = [units // chunks] * chunks
                counts[0] -= embedding
                counts[-1] -= loss
                return tuple(counts)
        return even
    units = num_layers + 2
    base, extra = divmod(units, chunks)
    counts = [base + (1 if c < extra else 0) for c in range(chunks)]
    counts[0] -= 1
    counts[-1] -= 1
    # torchtitan hands out blocks in order while they last: a short last chunk keeps what is left.
    counts[-1] = num_layers - sum(counts[:-1])
    if min(counts) < 0 or counts[0] < 0:
        raise ValueError(
            f"parallel.pp x parallel.vpp ({chunks}) leaves torchtitan an empty stage for {num_layers} layers"
        )
    return tuple(counts)


def _fixed_end_stages(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> tuple[int, ...]:
    """Megatron's uneven first / last pipeline stage (see :func:`chunk_layer_counts`); ``ParallelConfig``
    checks the fields' types and pp >= 2, :func:`check_end_stages` the shares."""
    check_end_stages(num_layers, ParallelConfig(pp=pp, vpp=vpp, first_stage_layers=first, last_stage_layers=last))
    middle = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    per_rank = [rest // middle if middle else 0] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    # Chunk c = v * pp + rank holds its rank's layers / vpp.
    return tuple(per_rank[c % pp] // vpp for c in range(pp * vpp))
