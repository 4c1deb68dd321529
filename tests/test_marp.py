"""MARP properties and golden figures from the papers and runtime docs it cites."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from frenzy_opt.core.partition import chunk_layer_counts
from frenzy_opt.core.runtimes import default_sequence_parallel, runtime_refusal
from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig, parse_job
from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.prediction.marp.cuda import DEFAULT_CUDA
from frenzy_opt.prediction.marp.layout import state_layout
from frenzy_opt.prediction.marp.predictor import peak_stages, predict_memory, predict_peak
from frenzy_opt.prediction.marp.stages import in_flight_chunks, stage_shapes


def _job(model: str = "llama2-7b", parallel: dict[str, object] | None = None, **training: object) -> JobSpec:
    train = {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 512, **training}
    return parse_job({"model": model, "training": train, "parallel": parallel or {}})


@pytest.mark.parametrize(
    ("zero", "expected_gb"),
    # Rajbhandari et al. 2020 (ZeRO), Fig. 1: 7.5B parameters, Adam (K = 12), Nd = 64 data-parallel ranks.
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_zero_model_states_match_the_zero_paper(zero: int, expected_gb: float) -> None:
    training = TrainingConfig(precision="fp16", runtime="deepspeed")
    layout = state_layout(training, ParallelConfig(dp=64, zero_stage=zero))
    bytes_per_param = sum(layout.per_param(64))
    assert bytes_per_param * 7.5e9 / 1e9 == pytest.approx(expected_gb, abs=0.05)


@pytest.mark.parametrize(("dp", "zero", "expected"), [(1, 0, 18.0), (8, 1, 6 + 12 / 8), (64, 1, 6 + 12 / 64)])
def test_megatron_bytes_per_parameter_match_its_distributed_optimizer_table(
    dp: int, zero: int, expected: float
) -> None:
    # Megatron-LM docs, "Distributed Optimizer": bf16 params + fp32 grads: 18 bytes, or 6 + 12/d sharded.
    layout = state_layout(TrainingConfig(runtime="megatron"), ParallelConfig(dp=dp, zero_stage=zero))
    assert sum(layout.per_param(dp)) == pytest.approx(expected)


def test_fsdp2_shards_everything_and_hf_keeps_sixteen_bytes() -> None:
    fsdp = state_layout(TrainingConfig(runtime="fsdp2"), ParallelConfig(dp=8, zero_stage=3))
    assert sum(fsdp.per_param(8)) == pytest.approx(16 / 8)
    hf = state_layout(TrainingConfig(runtime="hf"), ParallelConfig(dp=1, zero_stage=0))
    assert sum(hf.per_param(1)) == pytest.approx(16.0) and hf.weight_cache_bytes == 2.0


def test_runtime_rejects_zero_stage_it_does_not_have() -> None:
    with pytest.raises(ValueError, match=r"parallel\.zero_stage 2 is not available with training\.runtime hf"):
        _job(parallel={"dp": 8, "zero_stage": 2}, runtime="hf")


def test_one_f_one_b_in_flight_micro_batches() -> None:
    # Narayanan et al. 2021: stage s of p keeps p - s micro-batches in flight (1F1B).
    assert [in_flight_chunks(s, 4, 1, 64) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight_chunks(0, 4, 1, 2) == 2  # never more than the step's micro-batches
    # Korthikanti et al. 2022, Sec. 4.2.3: interleaving keeps (1 + (p-1)/(p v)) x p micro-batches on stage 0.
    shapes = stage_shapes(32, 4, 2, 64)
    assert shapes[0].in_flight_layer_microbatches == pytest.approx(4 * (1 + 3 / (4 * 2)))


def test_uneven_layers_go_to_the_first_chunks() -> None:
    assert chunk_layer_counts(10, 4, 1) == (3, 3, 2, 2)
    with pytest.raises(ValueError, match="num_layers"):
        chunk_layer_counts(4, 4, 2)


def test_first_and_last_stage_differ() -> None:
    prediction = predict_memory(_job(parallel={"pp": 4, "dp": 2, "zero_stage": 1}))
    first, last = prediction.stages[0], prediction.stages[-1]
    assert first.breakdown["activations"] > last.breakdown["activations"]  # more micro-batches in flight
    assert last.breakdown["logits_and_loss"] > 0 and first.breakdown["logits_and_loss"] == 0
    assert prediction.peak_allocated_bytes == max(s.peak_allocated_bytes for s in prediction.stages)


def test_tied_embeddings_on_separate_stages_keep_a_copy() -> None:
    one = predict_memory(_job("qwen2.5-0.5b")).stages[0].num_params
    stages = predict_memory(_job("qwen2.5-0.5b", parallel={"pp": 2})).stages
    assert sum(s.num_params for s in stages) > one  # the output layer is a second copy of the embedding


def test_cuda_terms_add_up() -> None:
    cuda = DEFAULT_CUDA  # the shipped fit's terms
    prediction = predict_memory(_job(parallel={"tp": 2, "dp": 4, "zero_stage": 1}), lookup_gpu("H100-SXM5-80GB"))
    stage = prediction.stages[0]
    assert stage.peak_reserved_bytes == int(stage.peak_allocated_bytes * (1 + cuda.fragmentation))
    assert stage.device_used_bytes == sum(stage.breakdown.values())
    assert prediction.fits == (prediction.device_used_bytes <= prediction.capacity_bytes)
    assert stage.device_used_upper_bytes >= stage.device_used_bytes
    assert stage.peak_allocated_upper_bytes >= stage.peak_allocated_bytes


def test_recompute_and_flash_trade_memory() -> None:
    none, selective, full = (
        predict_memory(_job(parallel={"recompute": r})).peak_allocated_bytes for r in ("none", "selective", "full")
    )
    assert full < selective <= none
    eager = predict_memory(_job(parallel={"attention": "eager"})).peak_allocated_bytes
    assert eager > none


def test_fp8_saves_activation_memory() -> None:
    bf16 = predict_memory(_job(precision="bf16")).stages[0].breakdown["activations"]
    fp8 = predict_memory(_job(precision="fp8")).stages[0].breakdown["activations"]
    assert fp8 < bf16


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(["gpt3-1.3b", "llama3-8b", "mixtral-8x7b", "qwen2.5-0.5b"]),
    runtime=st.sampled_from(["megatron", "deepspeed", "fsdp2", "hf"]),
    seq=st.sampled_from([512, 1024, 2048, 4096]),
    mb=st.sampled_from([1, 2, 4]),
    tp=st.sampled_from([1, 2]),
    pp=st.sampled_from([1, 2, 4]),
    recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_memory_is_monotone_in_batch_and_sequence(
    model: str, runtime: str, seq: int, mb: int, tp: int, pp: int, recompute: str
) -> None:
    zero = {"megatron": 1, "deepspeed": 2 if pp == 1 else 1, "fsdp2": 3, "hf": 0}[runtime]
    # Only layouts the runtime runs (frenzy_opt.core.runtimes): hf has no tp or pp, deepspeed no selective.
    sp = default_sequence_parallel(runtime, tp)
    assume(runtime_refusal(runtime, tp=tp, pp=pp, sequence_parallel=sp, zero_stage=zero, recompute=recompute) is None)
    parallel = {"tp": tp, "pp": pp, "dp": 2 if runtime != "hf" else 1, "zero_stage": zero, "recompute": recompute}
    base = _job(model, parallel, seq_len=seq, micro_batch_size=mb, runtime=runtime, global_batch_size=64)
    peak = predict_memory(base).peak_allocated_bytes
    longer = replace(base, training=replace(base.training, seq_len=seq * 2))
    bigger = replace(base, training=replace(base.training, micro_batch_size=mb * 2))
    assert predict_memory(longer).peak_allocated_bytes >= peak
    assert predict_memory(bigger).peak_allocated_bytes >= peak
    # The peak-stage shortcut the plan search uses never misses the true peak.
    assert predict_peak(base).peak_allocated_bytes == peak
    assert set(peak_stages(pp)) <= set(range(pp))
