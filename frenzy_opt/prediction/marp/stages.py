"""Pipeline partitioning and in-flight micro-batches per stage (pure arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_opt.core.partition import chunk_layer_counts


@dataclass(frozen=True, slots=True, kw_only=True)
class StageShape:
    """What pipeline rank ``stage`` holds and how many micro-batches' activations it keeps at once."""

    stage: int
    num_layers: int
    first_layer: int
    has_embedding: bool
    has_output: bool
    in_flight_layer_microbatches: float
    """Sum over in-flight (chunk, micro-batch) pairs of the layers whose activations are kept, divided by
    ``num_layers``: the number of micro-batches' worth of this rank's activations alive at the peak."""


def in_flight_chunks(stage: int, pp: int, vpp: int, num_microbatches: int) -> int:
    """Chunk-micro-batches whose activations rank ``stage`` holds at its peak.

    Non-interleaved 1F1B keeps ``pp - stage`` micro-batches (Narayanan et al. 2021, Sec. 2.2; Korthikanti
    et al. 2022, Sec. 4.2.3). Interleaved 1F1B warms up with ``2 (pp - stage - 1) + (vpp - 1) pp`` forward
    chunks before its first backward (Megatron-LM ``schedules.py``), so one more is in flight at the peak.
    Never more than the ``vpp * num_microbatches`` chunks of a step.
    """
    if vpp == 1:
        return min(pp - stage, num_microbatches)
    warmup = 2 * (pp - stage - 1) + (vpp - 1) * pp
    return min(warmup + 1, vpp * num_microbatches)


def stage_shape(num_layers: int, pp: int, vpp: int, stage: int, num_microbatches: int) -> StageShape:
    """The :class:`StageShape` of pipeline rank ``stage``."""
    counts = chunk_layer_counts(num_layers, pp, vpp)
    mine = counts[stage::pp]
    layers = sum(mine)
    return StageShape(
        stage=stage,
        num_layers=layers,
        first_layer=sum(counts[:stage]),
        has_embedding=stage == 0,
        has_output=stage == pp - 1,
        in_flight_layer_microbatches=in_flight_layer_microbatches(mine, stage, pp, num_microbatches),
    )


def in_flight_layer_microbatches(chunk_layers: tuple[int, ...], stage: int, pp: int, num_microbatches: int) -> float:
    """Micro-batches' worth of the rank's activations alive at its peak. Chunks run round-robin over the
    rank's ``vpp`` chunks, so each alive chunk-micro-batch holds its chunk's layers."""
    vpp = len(chunk_layers)
    if not sum(chunk_layers):
        return float(min(in_flight_chunks(stage, pp, vpp, num_microbatches), num_microbatches))
    alive = in_flight_chunks(stage, pp, vpp, num_microbatches)
    full, rest = divmod(alive, vpp)
    alive_layers = full * sum(chunk_layers) + sum(chunk_layers[:rest])
    return alive_layers / sum(chunk_layers)


def stage_shapes(num_layers: int, pp: int, vpp: int, num_microbatches: int) -> list[StageShape]:
    """One :class:`StageShape` per pipeline rank, in order."""
    return [stage_shape(num_layers, pp, vpp, stage, num_microbatches) for stage in range(pp)]
