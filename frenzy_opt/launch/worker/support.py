"""What the training worker can run: checked by the executors before a launch (their ``supports``) and by
the worker itself at start-up (:func:`frenzy_opt.launch.worker.train.check_plan`), one rule for both."""

from __future__ import annotations

from frenzy_opt.core.runtimes import WORKER
from frenzy_opt.core.spec import ParallelConfig
from frenzy_opt.models.arch import ModelArch


def worker_supports(parallel: ParallelConfig, arch: ModelArch, num_micro_batches: int | None = None) -> str | None:
    """Why the training worker cannot run this plan, or None if it can (mirrors ``train.check_plan``).

    ``num_micro_batches`` (per step and dp rank; None: not known) is checked against the pipeline schedule:
    the worker runs 1F1B through ``torch.distributed.pipelining.Schedule1F1B``, which refuses fewer
    micro-batches than pipeline stages (its ``__init__``: "Number of microbatches ... must be greater than or
    equal to the number of stages"); interleaved plans already have a multiple of pp (the planner's rule)."""
    if num_micro_batches is not None and parallel.pp > 1 and num_micro_batches < parallel.pp:
        return f"pp={parallel.pp} with {num_micro_batches} micro-batch(es) per step (1F1B needs at least pp)"
    if (parallel.cp > 1 and not WORKER.cp) or (parallel.ep > 1 and not WORKER.ep):
        return f"cp={parallel.cp}, ep={parallel.ep}"
    if parallel.sequence_parallel and (parallel.pp > 1 or arch.vocab_size % parallel.tp or arch.tied_embeddings):
        return "sequence_parallel with pp > 1, tied embeddings or a vocabulary tp does not divide"
    if arch.is_moe:
        return "mixture-of-experts models (model.num_experts > 1)"
    if parallel.pp > 1 and arch.tied_embeddings:
        return "tied embeddings with pp > 1"
    if parallel.zero_stage == 1 and (parallel.tp > 1 or parallel.pp > 1):
        return "zero_stage 1 with tp or pp > 1"
    return None
