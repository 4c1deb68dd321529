"""Pipeline splits as the runtimes make them: Megatron-core's even split, its embedding/loss accounting and
uneven first/last stages, torchtitan's weighted split; published uneven layouts are never refused as invalid."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frenzy_opt.core.partition import chunk_layer_counts
from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.planning.plans import enumerate_plans
from frenzy_opt.prediction.marp.predictor import peak_stages, predict_memory, predict_peak


def _job(model: str, parallel: dict[str, object], **training: object):  # type: ignore[no-untyped-def]
    train = {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 256, **training}
    return parse_job({"model": model, "training": train, "parallel": parallel})


def test_megatron_counts_embedding_and_loss_when_that_makes_the_layers_divide() -> None:
    # Llama-3.1-405B: 126 layers over pp16 x vpp4 = 64 chunks; 126 + 2 = 128 = 64 x 2.
    counts = chunk_layer_counts(126, 16, 4, "megatron")
    assert sum(counts) == 126 and counts[0] == counts[-1] == 1 and set(counts[1:-1]) == {2}
    assert chunk_layer_counts(32, 4, 1, "megatron") == (8, 8, 8, 8)  # divisible: even, untouched


def test_megatron_uneven_first_and_last_stage() -> None:
    assert chunk_layer_counts(96, 8, 1, "megatron", 10, 8) == (10, 13, 13, 13, 13, 13, 13, 8)
    # With vpp, each rank's layers split over its virtual stages: chunk c is on rank c % pp.
    assert chunk_layer_counts(20, 2, 2, "megatron", 8, None) == (4, 6, 4, 6)
    with pytest.raises(ValueError, match="equal share"):
        chunk_layer_counts(96, 8, 1, "megatron", 10, 7)
    with pytest.raises(ValueError, match="virtual stages"):
        chunk_layer_counts(20, 2, 2, "megatron", 7, None)
    with pytest.raises(ValueError, match="Megatron-core"):
        _job("llama3-8b", {"pp": 4, "first_stage_layers": 5}, runtime="fsdp2")
    with pytest.raises(ValueError, match=r"parallel\.first_stage_layers"):
        _job("llama3-8b", {"pp": 1, "first_stage_layers": 5})


def test_torchtitan_counts_the_embedding_and_the_head_as_a_layer_each() -> None:
    # torchtitan's _generate_llm_fqn_per_model_part(4, 4, 1, 1): [[emb, l0], [l1, l2], [l3], [norm, head]].
    assert chunk_layer_counts(4, 4, 1, "torchtitan") == (1, 2, 1, 0)
    assert chunk_layer_counts(126, 8, 1, "torchtitan") == (15, 16, 16, 16, 16, 16, 16, 15)
    # A last stage with no block at all still predicts: the output layer and the loss.
    job = _job("llama3-8b", {"pp": 4, "dp": 2, "zero_stage": 3}, runtime="fsdp2")
    small = replace(job, model=replace(job.model, num_layers=4))
    stages = predict_memory(small).stages
    assert [s.num_layers for s in stages] == [1, 2, 1, 0]
    assert stages[-1].peak_allocated_bytes > 0


def test_a_middle_stage_with_more_layers_is_a_peak_candidate() -> None:
    counts = chunk_layer_counts(32, 4, 1, "megatron", 2, 2)
    assert counts == (2, 14, 14, 2)
    assert peak_stages(4, counts) == (0, 1, 3)
    job = _job("llama3-8b", {"pp": 4, "dp": 2, "zero_stage": 1, "first_stage_layers": 2, "last_stage_layers": 2})
    full = predict_memory(job)
    assert predict_peak(job).peak_allocated_bytes == full.peak_allocated_bytes
    assert max(full.stages, key=lambda s: s.peak_allocated_bytes).stage in (1, 2)


def test_a_published_uneven_layout_is_planned_not_refused_as_invalid() -> None:
    cluster = parse_cluster(
        {"name": "h", "node_groups": [{"gpu": "H100-SXM5-80GB", "num_nodes": 128, "gpus_per_node": 8}]}
    )
    parallel = {"tp": 8, "pp": 16, "vpp": 4, "cp": 1, "dp": 8, "sequence_parallel": True, "zero_stage": 1,
                "recompute": "full"}  # fmt: skip
    job = _job("llama3.1-405b", parallel, seq_len=8192, global_batch_size=512, micro_batch_size=1)
    search = enumerate_plans(job, cluster)
    assert search.plans, search.refusal({"H100-SXM5-80GB": 80 * 2**30})
    assert {p.parallel.vpp for p in search.plans} == {4}
