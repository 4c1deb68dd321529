"""The best-first plan search's two premises, checked on every candidate of jobs across runtimes, precisions,
MoE and context parallelism on multi-node clusters: a family's estimate is the candidate's step time (up to
rounding), and a layout's step time bounds the same layout's with more recompute from below
(:func:`follower_bound`). And its answer is the full search's."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from factories import cluster_of, first_per_count

from frenzy_opt.core.spec import JobSpec, parse_job
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.planning.bestfirst import ROUNDING, GroupBestFirst, follower_bound
from frenzy_opt.planning.candidates import (
    RECOMPUTE_ORDER,
    ShapeFloors,
    config_of,
    dp_choices,
    layout_choices,
    lower_bound,
    shapes,
)
from frenzy_opt.planning.fastest import fastest_plans
from frenzy_opt.planning.group import GpuGroup, gpu_groups
from frenzy_opt.planning.plans import DEFAULT_STEP_MODEL, enumerate_plans
from frenzy_opt.prediction.marp.cuda import DEFAULT_CUDA
from frenzy_opt.prediction.marp.fit import SHIPPED_FIT
from frenzy_opt.prediction.stepeval import StepTime
from frenzy_opt.prediction.stepterms import cached_step_terms


def _job(model: str, **training: object) -> JobSpec:
    train = {"seq_len": 2048, "micro_batch_size": 1, "global_batch_size": 64, **training}
    return parse_job({"name": "bestfirst", "model": model, "training": train})


# Several nodes per type, so that pipeline sends and data-parallel rings cross nodes at some dp and not at others.
NODES = cluster_of(("H100-SXM5-80GB", 4, 8), ("A100-SXM4-40GB", 4, 8), ("V100-SXM2-32GB", 2, 8), ("L4", 2, 4))
JOBS = {
    "megatron": _job("llama2-7b", seq_len=4096),
    "moe": _job("mixtral-8x7b", seq_len=1024, global_batch_size=32),
    "fsdp2": _job("gpt3-2.7b", runtime="fsdp2"),
    "deepspeed": _job("gpt3-1.3b", runtime="deepspeed", precision="fp16"),
    "fp8-cp": _job("llama3-8b", precision="fp8", seq_len=8192, global_batch_size=32),
}


def _groups(job: JobSpec, cluster: ClusterSpec) -> list[tuple[GpuGroup, int, int]]:
    out = []
    for (precision, per_node, max_gpus, attention), gpus in gpu_groups(job, cluster).items():
        group = GpuGroup(job, gpus, precision, attention, cluster, cuda=DEFAULT_CUDA, step_model=DEFAULT_STEP_MODEL,
                         fit=SHIPPED_FIT)  # fmt: skip
        out.append((group, per_node, max_gpus))
    return out


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_candidates_bound_and_estimate_against_its_step_time(name: str) -> None:
    """The search's three keys of every candidate on every GPU: the bound at most the step time, the estimate
    equal to it up to rounding."""
    job = JOBS[name]
    checked = 0
    for group, per_node, max_gpus in _groups(job, NODES):
        search = GroupBestFirst(group, 0.0, per_node, max_gpus, None)
        for index, shape in enumerate(search.shapes):
            for dp in search.dps[index]:
                for ep, zero in layout_choices(group.base, shape, dp):
                    key = (index, dp, ep, zero)
                    for gpu in search.gpus.values():
                        exact = search._exact(key, gpu)[0]
                        assert search._bound_s(key, gpu.name) <= exact
                        estimate = search._estimated(key, gpu.name)[0][0]
                        # The key is the estimate less ROUNDING; the estimate itself is the step time.
                        assert estimate / (1 - ROUNDING) == pytest.approx(exact, rel=ROUNDING / 10), key
                        assert estimate <= exact
                        checked += 1
    assert checked > 500


@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_layouts_step_time_bounds_its_next_recompute_from_below(name: str) -> None:
    job = JOBS[name]
    chains = 0
    for group, per_node, max_gpus in _groups(job, NODES):
        steps: dict[tuple[object, ...], list[tuple[int, StepTime]]] = {}
        for shape in shapes(group.base, per_node, max_gpus):
            training = group.cache.training(shape.micro_batch_size)
            layout = (shape.tp, shape.pp, shape.vpp, shape.cp, shape.micro_batch_size, shape.sequence_parallel)
            for dp in dp_choices(group.base, shape, max_gpus):
                for ep, zero in layout_choices(group.base, shape, dp):
                    terms = cached_step_terms(job.model, training, config_of(group.base, shape, dp, ep, zero))
                    for gpu in group.by_link[0]:
                        step = terms.evaluate(gpu, group.links[gpu.name], DEFAULT_STEP_MODEL, group.rates[gpu.name])
                        key = (*layout, dp, ep, zero, gpu.name)
                        steps.setdefault(key, []).append((RECOMPUTE_ORDER.index(shape.recompute), step))
        for chain in steps.values():
            chain.sort(key=lambda item: item[0])
            for (_, step), (_, follower) in itertools.pairwise(chain):
                assert follower_bound(step) <= follower.total_s * (1 + ROUNDING / 10), (step, follower)
                chains += 1
    assert chains > 100


@pytest.mark.parametrize("name", ["megatron", "moe", "fp8-cp"])
def test_the_best_first_search_answers_as_the_full_search_across_nodes(name: str) -> None:
    job = replace(JOBS[name], training=replace(JOBS[name].training, train_steps=1))
    full = first_per_count(enumerate_plans(job, NODES).plans)
    fast = {(p.gpu_type, p.num_gpus): p for p in fastest_plans(job, NODES)}
    assert fast == full


@pytest.mark.parametrize("name", ["megatron", "moe"])
def test_shape_floors_shared_across_groups_are_each_groups_own(name: str) -> None:
    """One :class:`ShapeFloors` serves every group of a training config (fastest_plans shares it): the V100's
    group runs eager attention and the others flash, and each group's floors are still its own lower_bound."""
    job = JOBS[name]
    groups = _groups(job, NODES)
    assert len({group.base.parallel.attention for group, _, _ in groups}) > 1
    shared = ShapeFloors(groups[0][0].base)
    checked = 0
    for group, per_node, max_gpus in groups:
        assert group.base.training == shared.job.training
        for shape in shapes(group.base, per_node, max_gpus):
            values = shared.of(shape)
            for dp in dp_choices(group.base, shape, max_gpus):
                assert shared.at(shape, values, dp) == lower_bound(group.base, shape, dp)
                checked += 1
    assert checked > 200


@pytest.mark.parametrize("name", sorted(JOBS))
def test_offered_floors_bound_every_candidate_the_search_builds(name: str) -> None:
    """The best-first search's per-dp floors (:class:`ShapeFloors`' offered floors) shard the states at the deepest
    ZeRO stage the search offers the shape, not the runtime's deepest: never below :func:`lower_bound`, and still
    at most the first stage's allocated peak of every candidate of the shape at that dp."""
    job = JOBS[name]
    checked = tighter = 0
    for group, per_node, max_gpus in _groups(job, NODES):
        floors = ShapeFloors(group.base)
        for shape in shapes(group.base, per_node, max_gpus):
            values = floors.of(shape, offered=True)
            for dp in dp_choices(group.base, shape, max_gpus):
                floor, loose = floors.at(shape, values, dp, offered=True), lower_bound(group.base, shape, dp)
                assert floor >= loose
                tighter += floor > loose
                for ep, zero in layout_choices(group.base, shape, dp):
                    config = config_of(group.base, shape, dp, ep, zero)
                    model, split = group.candidate(config, shape.micro_batch_size, 2**62).models[0]
                    assert model.stage == 0
                    assert floor <= sum(split), (shape, dp, ep, zero)
                    checked += 1
    assert checked > 100
    # Megatron-core's search offers its distributed optimizer alone where the runtime also runs ZeRO 3.
    assert tighter > 0 or job.training.runtime != "megatron"
