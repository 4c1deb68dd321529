"""MARP against measured peak memory: real training steps of the reference decoder on the CPU, under
FakeTensorMode (every case) and executed for real (small cases), each pipeline stage within 3 %."""

from __future__ import annotations

import pytest

from frenzy_opt.prediction.marp.activations import native_operators
from frenzy_opt.prediction.marp.predictor import predict_memory
from frenzy_opt.validation.cases import CASES, Case
from frenzy_opt.validation.harness import check_supported, measure
from frenzy_opt.validation.harness_report import run_case, to_markdown

TOLERANCE = 0.03


def test_at_least_thirty_configurations_cover_the_space() -> None:
    assert len(CASES) >= 30
    jobs = [case.job() for case in CASES]
    assert {j.training.precision for j in jobs} >= {"bf16", "fp16", "fp32"}
    assert {j.parallel.recompute for j in jobs} == {"none", "selective", "full"}
    assert {j.parallel.attention for j in jobs} == {"flash", "eager"}
    assert any(j.model.is_moe for j in jobs) and any(j.model.tied_embeddings for j in jobs)
    assert any(j.model.num_kv_heads < j.model.num_attention_heads for j in jobs)
    for degree in ("tp", "pp", "cp", "ep", "dp"):
        assert any(getattr(j.parallel, degree) > 1 for j in jobs), degree
    assert {j.training.seq_len for j in jobs} >= {512, 1024, 2048, 4096, 8192}
    assert {j.training.micro_batch_size for j in jobs} >= {1, 2, 4}


# The cases that take over 10 s each here (FakeTensorMode traces of real-size models): behind the slow marker,
# so that `make test` stays fast; `make test-all` runs them.
SLOW_CASES = {
    "mixtral-8x7b-tp4-pp8-ep8",
    "mistral-7b-tp4-pp8-cp2",
    "llama3-8b-tp8-pp8",
    "llama2-7b-tp4-pp4-dp2",
    "qwen2.5-0.5b-pp2-tied",
    "gpt3-1.3b-tp2-pp4",
    "gpt3-125m",
}


def test_the_slow_cases_name_real_cases() -> None:
    assert {c.name for c in CASES} >= SLOW_CASES


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.name in SLOW_CASES else []) for c in CASES]
)
def test_prediction_within_three_percent_of_fake_measurement(case: Case) -> None:
    for row in run_case(case, fake=True):
        assert abs(row.error) <= TOLERANCE, f"{case.name} stage {row.stage}: {100 * row.error:+.2f} %"


# Tiny models: real execution on the CPU costs real FLOPs, so the cross-check uses small shapes that still
# exercise every kind of term (GQA, eager attention, recompute, pipeline stages, MoE, fp32).
TINY = {"num_layers": 2, "hidden_size": 128, "ffn_hidden_size": 352, "num_attention_heads": 4, "num_kv_heads": 2}
TINY_TRAINING = {"seq_len": 128, "micro_batch_size": 2, "global_batch_size": 8, "precision": "bf16"}
REAL_CASES = [
    Case(
        name=name,
        spec={
            "model": {**TINY, "vocab_size": 512, **model},
            "training": {**TINY_TRAINING, **training},
            "parallel": parallel,
        },
    )
    for name, model, training, parallel in (
        ("tiny-flash", {}, {}, {}),
        ("tiny-eager-gqa", {}, {}, {"attention": "eager"}),
        ("tiny-full-recompute", {}, {}, {"recompute": "full"}),
        ("tiny-pp2", {}, {}, {"pp": 2}),
        ("tiny-moe", {"num_experts": 4, "moe_top_k": 2}, {}, {}),
        ("tiny-fp32", {}, {"precision": "fp32"}, {}),
    )
]


@pytest.mark.parametrize("case", REAL_CASES, ids=[c.name for c in REAL_CASES])
def test_real_execution_matches_fake_and_prediction(case: Case) -> None:
    job = case.job()
    with native_operators():
        predicted = predict_memory(job, cuda=None)
    for stage in predicted.stages:
        real = measure(job, stage=stage.stage, fake=False)
        fake = measure(job, stage=stage.stage, fake=True)
        assert real.peak_bytes == fake.peak_bytes
        assert abs(stage.peak_allocated_bytes / real.peak_bytes - 1) <= TOLERANCE


def test_harness_rejects_what_it_cannot_emulate() -> None:
    job = CASES[0].job()
    for change, field in (({"runtime": "fsdp2"}, "training.runtime"), ({"precision": "fp8"}, "training.precision")):
        bad = Case(name="bad", spec={**CASES[0].spec, "training": {**CASES[0].spec["training"], **change}})
        with pytest.raises(ValueError, match=field):
            check_supported(bad.job())
    with pytest.raises(ValueError, match="stage"):
        measure(job, stage=3)


def test_report_table_states_accuracy() -> None:
    rows = run_case(CASES[0])
    text = to_markdown(rows, fake=True, command="cmd")
    assert "| small-base | 0 |" in text and "within 3 %" in text and "`cmd`" in text
