"""Plan enumeration: validity rules, the fast search against brute force, ranking, precision fallback."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzy_opt.core.spec import JobSpec, parse_job, plan_layout
from frenzy_opt.hardware.cluster import ClusterSpec, parse_cluster
from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.planning.candidates import attention_on, configs_at, dp_choices, effective_precision, shapes
from frenzy_opt.planning.plans import Plan, enumerate_plans, rank_plans
from frenzy_opt.prediction.marp.fit import SHIPPED_FIT
from frenzy_opt.prediction.marp.predictor import predict_memory


def _cluster(*groups: tuple[str, int, int]) -> ClusterSpec:
    return parse_cluster({"node_groups": [{"gpu": g, "num_nodes": n, "gpus_per_node": k} for g, n, k in groups]})


def _job(model: str, parallel: dict[str, object] | None = None, **training: object) -> JobSpec:
    train = {"seq_len": 2048, "micro_batch_size": 1, "global_batch_size": 64, **training}
    return parse_job({"model": model, "training": train, "parallel": parallel or {}})


def _brute_force(job: JobSpec, cluster: ClusterSpec) -> set[tuple[object, ...]]:
    """Every valid candidate on every GPU, checked with the full per-stage predictor (no shortcuts) against
    the planner's rule: the required bound plus headroom within the GPU's memory."""
    found = set()
    for gpu in cluster.gpu_types():
        precision = effective_precision(gpu, job.training.precision)
        attention = replace(job.parallel, attention=attention_on(gpu, job))  # eager where flash cannot run
        base = replace(job, training=replace(job.training, precision=precision), parallel=attention)
        max_gpus = cluster.num_gpus_of(gpu.name)
        for shape in shapes(job, cluster.gpus_per_node_of(gpu.name), max_gpus):
            for dp in dp_choices(job, shape, max_gpus):
                for parallel in configs_at(base, shape, dp):
                    candidate = base.with_parallel(parallel, micro_batch_size=shape.micro_batch_size)
                    required = int(SHIPPED_FIT.headroom_fraction * gpu.memory_bytes)
                    if predict_memory(candidate, gpu).required_upper_bytes + required <= gpu.memory_bytes:
                        found.add((gpu.name, parallel, shape.micro_batch_size))
    return found


def _keys(plans: list[Plan]) -> set[tuple[object, ...]]:
    return {(p.gpu_type, p.parallel, p.micro_batch_size) for p in plans}


@pytest.mark.parametrize(
    ("model", "runtime"),
    [("llama2-7b", "megatron"), ("mixtral-8x7b", "megatron"), ("gpt3-1.3b", "deepspeed"), ("mistral-7b", "fsdp2")],
)
def test_fast_search_equals_brute_force(model: str, runtime: str) -> None:
    cluster = _cluster(("A100-SXM4-80GB", 2, 8), ("V100-SXM2-32GB", 2, 8), ("RTX-3090", 2, 4))
    job = _job(model, runtime=runtime)
    search = enumerate_plans(job, cluster)
    assert search.plans, "expected feasible plans"
    assert _keys(search.plans) == _brute_force(job, cluster)


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(["gpt3-350m", "llama3-8b", "qwen2.5-7b", "mixtral-8x7b"]),
    gpu=st.sampled_from(["T4", "RTX-3090", "A100-SXM4-40GB", "H100-SXM5-80GB"]),
    nodes=st.integers(1, 4),
    per_node=st.sampled_from([2, 4, 8]),
    gbs=st.sampled_from([16, 48, 64]),
    seq=st.sampled_from([1024, 4096]),
)
def test_every_plan_is_valid_and_fits(model: str, gpu: str, nodes: int, per_node: int, gbs: int, seq: int) -> None:
    cluster = _cluster((gpu, nodes, per_node))
    job = _job(model, seq_len=seq, global_batch_size=gbs)
    arch = job.model
    for plan in enumerate_plans(job, cluster).plans:
        p = plan.parallel
        assert plan.num_gpus == p.dp * p.tp * p.pp * p.cp <= cluster.num_gpus
        assert arch.num_attention_heads % p.tp == 0 and arch.num_kv_heads % p.tp == 0 and p.tp <= per_node
        assert p.pp * p.vpp <= arch.num_layers
        assert gbs % (p.dp * plan.micro_batch_size) == 0
        assert p.dp % p.ep == 0 and arch.num_experts % p.ep == 0
        assert plan.device_used_bytes <= plan.capacity_bytes == lookup_gpu(gpu).memory_bytes
        assert plan.peak_allocated_bytes <= plan.peak_reserved_bytes <= plan.device_used_bytes


def test_a_plan_reads_back_from_its_dict_and_bad_fields_are_named() -> None:
    plans = enumerate_plans(_job("llama2-7b"), _cluster(("A100-SXM4-80GB", 2, 8))).plans[:20]
    assert [Plan.from_dict(p.to_dict()) for p in plans] == [replace(p, num_micro_batches=None) for p in plans]
    data = plans[0].to_dict()
    old = {"parallel": plans[0].parallel.to_dict(), "micro_batch_size": plans[0].micro_batch_size}
    assert plan_layout(old) == plan_layout(data) == (plans[0].parallel, plans[0].micro_batch_size)
    for bad, message in [
        ({**data, "speed": 1}, "unknown field(s) speed"),
        ({k: v for k, v in data.items() if k != "gpu_type"}, "plan.gpu_type is required"),
        ({**data, "num_gpus": True}, "plan.num_gpus must be an integer"),
        ({**data, "num_gpus": data["num_gpus"] + 1}, "must equal dp x tp x pp x cp"),
        ({**data, "micro_batch_size": 0}, "plan.micro_batch_size must be a positive integer"),
        ({**data, "parallel": {**data["parallel"], "micro_batch_size": 7}}, "differs from plan.micro_batch_size"),
        ({**data, "parallel": {"dq": 2}, "micro_batch_size": 1}, "plan.parallel: unknown field(s) dq"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            Plan.from_dict(bad)


def test_pinned_fields_are_kept() -> None:
    job = _job("llama2-7b", {"tp": 2, "recompute": "selective"})
    plans = enumerate_plans(job, _cluster(("A100-SXM4-80GB", 2, 8))).plans
    assert plans and all(p.parallel.tp == 2 and p.parallel.recompute == "selective" for p in plans)


def test_minimum_gpus_per_type_and_ranking() -> None:
    search = enumerate_plans(_job("llama2-13b"), _cluster(("A100-SXM4-80GB", 4, 8), ("RTX-3090", 8, 4)))
    mins = search.min_gpus_per_type()
    assert mins["A100-SXM4-80GB"] < mins["RTX-3090"]  # 80 GiB vs 24 GiB per GPU
    times = [p.step_time_s for p in search.plans]
    assert all(t is not None and t > 0 for t in times)
    assert times == sorted(times)  # type: ignore[type-var]
    assert all(p.est_runtime_s == pytest.approx(p.step_time_s * 1000) for p in search.plans)  # type: ignore[operator]
    assert rank_plans(list(reversed(search.plans))) == search.plans


def test_precision_falls_back_on_gpus_without_the_format() -> None:
    assert effective_precision(lookup_gpu("V100-SXM2-32GB"), "bf16") == "fp16"
    assert effective_precision(lookup_gpu("A100-SXM4-80GB"), "fp8") == "bf16"
    assert effective_precision(lookup_gpu("T4"), "fp8") == "fp16"
    assert effective_precision(lookup_gpu("H100-SXM5-80GB"), "fp8") == "fp8"
    plans = enumerate_plans(_job("gpt3-350m"), _cluster(("V100-SXM2-32GB", 1, 8))).plans
    assert plans and {p.precision for p in plans} == {"fp16"}


def test_a_job_too_big_for_the_cluster_has_no_plan_but_a_minimum() -> None:
    search = enumerate_plans(_job("llama3.1-405b"), _cluster(("T4", 1, 2)))
    assert not search.plans
    assert search.min_device_bytes is not None and search.min_device_bytes > lookup_gpu("T4").memory_bytes
