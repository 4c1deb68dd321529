"""Step-time model: the Megatron-LM golden table, calibration, and the invariants a ranking relies on."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frenzy_opt.gpus import lookup_gpu
from frenzy_opt.spec import JobSpec, parse_job
from frenzy_opt.steptime import Links, StepTimeModel, fit_efficiency, step_time

GOLDEN_TOLERANCE = 0.15

# Narayanan et al. 2021, Table 1: GPT models (seq 2048, vocab 51,200) on Selene (A100-SXM4-80GB, 8 per node,
# 8 x 200 Gb/s InfiniBand per node), activation recomputation on, achieved teraFLOP/s per GPU by Eq. 3.
# (billions, heads, hidden, layers, tp, pp, GPUs, batch, TFLOP/s per GPU)
MEGATRON_TABLE_1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]


def _megatron_job(heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int, batch: int) -> JobSpec:
    dp = gpus // (tp * pp)
    model = {
        "num_layers": layers,
        "hidden_size": hidden,
        "ffn_hidden_size": 4 * hidden,
        "num_attention_heads": heads,
        "num_kv_heads": heads,
        "vocab_size": 51200,
        "mlp": "gelu",
        "norm": "layernorm",
        "linear_bias": True,
        "position_embedding": "learned",
        "max_position_embeddings": 2048,
        "tied_embeddings": True,
    }
    training = {"seq_len": 2048, "global_batch_size": batch, "micro_batch_size": 1, "precision": "bf16"}
    parallel = {"dp": dp, "tp": tp, "pp": pp, "recompute": "full", "zero_stage": 1 if dp > 1 else 0}
    return parse_job({"model": model, "training": training, "parallel": parallel})


def _selene_links() -> Links:
    return Links.for_gpu(lookup_gpu("A100-SXM4-80GB"), inter_node_gbps=1600, gpus_per_node=8)


@pytest.mark.parametrize("row", MEGATRON_TABLE_1, ids=[f"{r[0]}B" for r in MEGATRON_TABLE_1])
def test_megatron_table_1_within_tolerance(row: tuple[float, ...]) -> None:
    _, heads, hidden, layers, tp, pp, gpus, batch, reference = (int(v) if i else v for i, v in enumerate(row))
    job = _megatron_job(heads, hidden, layers, tp, pp, gpus, batch)
    seconds = step_time(job, lookup_gpu("A100-SXM4-80GB"), _selene_links(), StepTimeModel()).total_s
    # Eq. 3 of the paper: the FLOPs the published figure counts (4 forward-equivalents with recomputation).
    s, v = 2048, 51200
    flops = 96 * batch * s * layers * hidden**2 * (1 + s / (6 * hidden) + v / (16 * layers * hidden))
    predicted = flops / seconds / gpus / 1e12
    assert abs(predicted / reference - 1) <= GOLDEN_TOLERANCE, f"{predicted:.1f} vs {reference}"


def test_fit_efficiency_recovers_a_known_factor() -> None:
    gpu = lookup_gpu("V100-SXM2-32GB")
    truth = StepTimeModel().with_efficiency(gpu.name, 0.37)
    links = Links.for_gpu(gpu)
    jobs = [
        parse_job({"model": "gpt3-350m", "training": {"seq_len": 1024, "global_batch_size": 64}, "parallel": p})
        for p in ({"dp": 4, "zero_stage": 1}, {"tp": 2, "dp": 2, "zero_stage": 1}, {"pp": 2, "dp": 2, "zero_stage": 1})
    ]
    measured = [(job, gpu, links, step_time(job, gpu, links, truth).total_s) for job in jobs]
    assert fit_efficiency(measured, StepTimeModel()) == pytest.approx(0.37, rel=1e-9)
    with pytest.raises(ValueError, match="at least one"):
        fit_efficiency([], StepTimeModel())
    with pytest.raises(ValueError, match="efficiency"):
        StepTimeModel().with_efficiency(gpu.name, 1.5)


def test_faster_gpus_links_and_less_recompute_are_faster() -> None:
    job = parse_job({"model": "llama2-7b", "training": {"seq_len": 4096, "global_batch_size": 256},
                     "parallel": {"dp": 8, "tp": 2, "zero_stage": 1}})  # fmt: skip
    model = StepTimeModel()
    times = {
        g: model.step_time(job, lookup_gpu(g)).total_s for g in ("V100-SXM2-32GB", "A100-SXM4-80GB", "H100-SXM5-80GB")
    }
    assert times["H100-SXM5-80GB"] < times["A100-SXM4-80GB"] < times["V100-SXM2-32GB"]
    a100 = lookup_gpu("A100-SXM4-80GB")
    slow = Links.for_gpu(a100, inter_node_gbps=25, gpus_per_node=8)
    assert model.step_time(job, a100, slow).total_s > model.step_time(job, a100).total_s
    full = replace(job, parallel=replace(job.parallel, recompute="full"))
    assert model.step_time(full, a100).total_s > model.step_time(job, a100).total_s


def test_pipeline_bubble_shrinks_with_micro_batches_and_interleaving() -> None:
    def bubble(batch: int, vpp: int) -> float:
        job = parse_job({"model": "llama2-13b", "training": {"global_batch_size": batch},
                         "parallel": {"pp": 4, "vpp": vpp, "tp": 2}})  # fmt: skip
        st = StepTimeModel().step_time(job, lookup_gpu("A100-SXM4-80GB"))
        return st.bubble_s / st.compute_s

    # Narayanan et al. 2021, Sec. 2.2: bubble fraction (p - 1) / (v m).
    assert bubble(64, 1) == pytest.approx(3 / 64)
    assert bubble(64, 2) == pytest.approx(3 / 128)
    assert bubble(256, 1) < bubble(64, 1)


def test_efficiency_can_be_keyed_to_a_precision() -> None:
    a100 = lookup_gpu("A100-SXM4-80GB")
    model = StepTimeModel().with_efficiency(a100.name, 0.4, precision="fp32")
    assert model.efficiency_of(a100, "fp32") == 0.4
    assert model.efficiency_of(a100, "bf16") == StepTimeModel().efficiency_of(a100)  # the default still applies
    assert model.with_efficiency(a100.name, 0.55).efficiency_of(a100, "bf16") == 0.55
