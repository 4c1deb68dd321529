"""MARP's fast path equals the trace path: ``predict_memory(job, None, cuda=None)`` against the real runtimes
(torchtitan = fsdp2, megatron-core = megatron) traced under FakeTensorMode, on a small grid of the shapes of
``benchmarks/marp_vs_trace.py`` (whose full grid is benchmarks/results/marp_vs_trace.md). Every stage within
5 %, each runtime's mean |gap| within 2 %. Also the terms that comparison brought in (``training.loss_chunks``,
the reduce-scatter output, the embedding's backward under 1F1B), without the runtimes."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import runtimes  # tests/ is on sys.path

needs_runtimes = runtimes.needs_runtimes

from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig  # noqa: E402
from frenzy_opt.models.arch import ModelArch  # noqa: E402
from frenzy_opt.prediction.marp import activations as act  # noqa: E402
from frenzy_opt.prediction.marp.predictor import predict_memory  # noqa: E402
from frenzy_opt.prediction.marp.stage_model import stage_model  # noqa: E402

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "marp_vs_trace.py"
STAGE_TOLERANCE = 0.05
MEAN_TOLERANCE = 0.02

# (shape, layers, parallel overrides, training overrides). Two layers where the split allows (a fake trace
# costs per operator, and every layer of a stage is alike); pp=4 needs four.
GRID: dict[str, list[tuple[str, int, dict[str, Any], dict[str, Any]]]] = {
    "fsdp2": [
        ("s-256", 2, dict(dp=2), {}),  # chunked loss (F1) and the output group's buffers (F2)
        ("s-256", 2, dict(dp=8), {}),  # the reduce-scatter output (a gradient shard) at dp 8
        ("m-1024", 2, dict(dp=2), dict(loss_chunks=1)),  # the loss on the full logits
        ("s-256", 4, dict(dp=1, pp=4), {}),  # torchtitan's split (F3), the loss on a stage without blocks
        ("s-256", 2, dict(dp=2, pp=2), {}),  # PipelineStage's FSDP calls (F4): the reduce_grad phase, the pin
    ],
    "megatron": [
        ("s-256", 2, dict(dp=2), {}),
        ("s-256", 2, dict(dp=2, tp=2, sequence_parallel=True), {}),  # the all-gather buffer (M4)
        ("m-1024", 2, dict(dp=2, attention="eager"), {}),  # the attention's score buffer (M3)
        ("m-1024", 4, dict(dp=1, pp=4, zero_stage=0), {}),  # the embedding's backward under 1F1B (M5)
    ],
}


def _benchmark() -> Any:
    spec = importlib.util.spec_from_file_location("marp_vs_trace", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("marp_vs_trace", module)
    spec.loader.exec_module(module)
    return module


def _jobs(bench: Any, runtime: str) -> list[JobSpec]:
    jobs = []
    for shape, layers, parallel, training in GRID[runtime]:
        zero = 3 if runtime == "fsdp2" else (1 if parallel.get("dp", 1) > 1 else 0)
        par = {"zero_stage": zero} | parallel
        train = dict(seq_len=512, micro_batch_size=1, global_batch_size=16, runtime=runtime) | training
        name = f"{runtime}/{shape}-{layers}L/" + ",".join(f"{k}={v}" for k, v in {**parallel, **training}.items())
        jobs.append(
            JobSpec(
                name=name,
                model=replace(bench.SHAPES[shape], num_layers=layers),
                training=TrainingConfig(**train),
                parallel=ParallelConfig(**par),
            )
        )
    return jobs


@needs_runtimes
@pytest.mark.parametrize("runtime", ["fsdp2", "megatron"])
def test_marp_equals_the_trace_path(runtime: str) -> None:
    bench = _benchmark()
    rows = [row for job in _jobs(bench, runtime) for row in bench.compare(job)]
    assert rows
    report = "\n".join(
        f"{r['job']} stage {r['stage']}: trace {r['trace_peak'] / 2**20:.1f} MiB ({r['trace_phase']}), "
        f"MARP {r['marp_peak'] / 2**20:.1f} MiB ({r['marp_phase']}), gap {r['gap']:+.2%}"
        for r in rows
    )
    worst = max(rows, key=lambda r: abs(r["gap"]))
    assert abs(worst["gap"]) <= STAGE_TOLERANCE, report
    mean = sum(abs(r["gap"]) for r in rows) / len(rows)
    assert mean <= MEAN_TOLERANCE, f"mean |gap| {mean:.2%}\n{report}"


M1024 = ModelArch(num_layers=4, hidden_size=1024, ffn_hidden_size=2816, num_attention_heads=16, num_kv_heads=8,
                  vocab_size=32000)  # fmt: skip
MIB = 2**20
ROPE = 4 * 8 * 512 * 32  # torchtitan's complex64 RoPE table (seq_len x d / 2) in each of the 4 blocks


def _job(runtime: str, training: dict[str, Any] | None = None, **parallel: Any) -> JobSpec:
    zero = 3 if runtime == "fsdp2" else 1
    train = dict(seq_len=512, micro_batch_size=1, global_batch_size=16, runtime=runtime) | (training or {})
    return JobSpec(name="j", model=M1024, training=TrainingConfig(**train),
                   parallel=ParallelConfig(**({"zero_stage": zero} | parallel)))  # fmt: skip


def test_loss_chunks_is_validated() -> None:
    assert TrainingConfig(runtime="fsdp2", loss_chunks=4).loss_chunks == 4
    assert TrainingConfig(runtime="megatron", loss_chunks=1).loss_chunks == 1
    for bad in (0, -1, 2.0, True, "8"):
        with pytest.raises(ValueError, match="loss_chunks"):
            TrainingConfig(runtime="fsdp2", loss_chunks=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fsdp2"):
        TrainingConfig(runtime="megatron", loss_chunks=8)
    assert act.loss_chunks(TrainingConfig(runtime="fsdp2")) == 8  # torchtitan's ChunkedLossWrapper default
    assert act.loss_chunks(TrainingConfig(runtime="megatron")) == 1


def test_chunked_loss_terms() -> None:
    """torchtitan's chunked loss at the output group's last reduce-scatter (dp 2): the unsharded 16-bit weight,
    the fp32 accumulated gradient and reduce-scatter input (10 bytes per output parameter) and the gradient
    shard (4 / dp), one chunk's 16-bit logits and hidden-state gradient, the kept hidden states and their fp32
    gradient buffer; beside them torchtitan's RoPE tables."""
    t, h, v = 512, 1024, 32000
    stage = predict_memory(_job("fsdp2", dp=2), None, cuda=None).stages[0]
    assert stage.peak_phase == "loss_backward"
    assert stage.breakdown["communication_buffers"] == (10 + 4 // 2) * v * h + ROPE
    norm = 2 * t * h + 4 * t
    assert stage.breakdown["logits_and_loss"] == norm + 2 * t * h + 4 * t * h + 8 * t + 2 * (t // 8) * (v + h)
    # The loss on the full logits: fp32 log-probabilities and their gradients beside the weight alone; the
    # peak is the output group's reduce-scatter (16-bit gradient, fp32 input, shard), next block prefetched.
    job = _job("fsdp2", dict(loss_chunks=1), dp=2)
    model = stage_model(job, 0)
    loss = next(p for p in model.phases if p.name == "loss_backward")
    assert loss.logits_and_loss == norm + 2 * t * h + 4 * t * v + 8 * t + 8 * t * v
    assert loss.communication_buffers == 2 * v * h + ROPE
    unchunked = predict_memory(job, None, cuda=None).stages[0]
    assert unchunked.peak_phase == "output_backward"
    assert unchunked.breakdown["communication_buffers"] == 2 * model.params.layer_params + (6 + 4 // 2) * v * h + ROPE


def test_reduce_scatter_output_depends_on_dp() -> None:
    """The gradient shard that the output group's reduce-scatter writes shrinks with dp; the stage model's
    dp-free maximum counts it at dp 2 (an upper bound above) and :meth:`StageModel.peak_phase` exactly."""
    for dp in (2, 4, 8):
        job = _job("fsdp2", dp=dp)
        model = stage_model(job, 0)
        phase, beyond = model.peak_phase(dp)
        assert phase.communication_buffers == (10 * 32000 * 1024) + 4 * 32000 * 1024 // dp + ROPE
        states = sum(model.states(dp).values())
        assert predict_memory(job, None, cuda=None).peak_allocated_bytes == states + beyond
        assert model.allocated_bytes(dp) >= states + beyond


def test_embedding_backward_under_1f1b_holds_the_later_microbatches() -> None:
    """Megatron, pp 4, stage 0: the embedding's backward of one micro-batch runs with the 3 later in-flight
    micro-batches' activations alive, beside its 16-bit weight gradient and incoming gradient."""
    job = _job("megatron", dp=1, pp=4, zero_stage=0)
    model = stage_model(job, 0)
    phase, beyond = model.peak_phase(1)
    assert phase.name == "embedding_backward" and phase.holds_activations
    one = model.num_layers * model.acts.layer + model.acts.embedding
    assert beyond == model.activations(1) - one + 2 * 32000 * 1024 + 2 * 512 * 1024 + model.acts.persistent


def test_pipelined_fsdp2_stage_reduces_its_groups_after_the_last_microbatch() -> None:
    """fsdp2, pp 2, dp 2 (finding F4): no gradient shard before ``perform_reduce_grad``; stage 0 peaks at its
    first group's (the embedding's) reduce-scatter: its fp32 gradient and fp32 reduce-scatter input (8 bytes
    per parameter) beside the blocks' gathered 16-bit weights and fp32 gradients, whose shards do not exist
    yet. The last stage keeps the output group's shard a second time (the final norm's shard is a view of
    that reduce-scatter's flat output)."""
    job = _job("fsdp2", dp=2, pp=2)
    first = stage_model(job, 0)
    phase, beyond = first.peak_phase(2)
    emb, blocks = first.params.embedding_params, first.params.params - first.params.embedding_params
    assert phase.name == "reduce_grad"
    assert beyond == 8 * emb + (6 - 4 // 2) * blocks + first.acts.persistent + 2 * first.acts.layer_persistent
    # Every micro-batch phase lacks the stage's 4 / dp bytes of gradient shards (they join at the reduce).
    plain = replace(job, parallel=replace(job.parallel, pp=1))
    block = next(p for p in first.phases if p.name == "block_backward")
    assert first.extra_at(block, 2) == block.extra_bytes - 2 * first.params.params
    last = stage_model(job, 1)
    out = last.params.output_params
    optimizer = next(p for p in last.phases if p.name == "optimizer_step")
    assert last.extra_at(optimizer, 2) == optimizer.extra_bytes + 2 * out  # the pinned output-group shard
    assert stage_model(plain, 0).phases[-1].name != "reduce_grad"
    # The dp-free bound (plan search) stays an upper bound at every dp: a missing shard is never subtracted.
    for dp in (2, 4, 8):
        assert first.max_extra_without_activations >= first.peak_phase(dp)[1]
