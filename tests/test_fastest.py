"""fastest_plans finds, for every (GPU type, count), the plan the full search ranks first there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from factories import cluster_of, first_per_count
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzy_opt.core.spec import JobSpec, parse_job
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors.common import plan_supported
from frenzy_opt.planning.fastest import fastest_plans
from frenzy_opt.planning.plans import Plan, enumerate_plans
from frenzy_opt.planning.problem import Option, best_per_count, search_options, supported, thin_fronts


def _cluster(*groups: tuple[str, int, int]) -> ClusterSpec:
    return cluster_of(*groups, name="fastest")


def _job(model: str, parallel: dict[str, object] | None = None, **training: object) -> JobSpec:
    train = {"seq_len": 2048, "micro_batch_size": 1, "global_batch_size": 16, **training}
    return parse_job({"name": "fastest", "model": model, "training": train, "parallel": parallel or {}})


# A100 40 GB and 80 GB share an architecture and a link (one bound, replayed per budget near the edge), and
# V100 runs bf16 jobs at fp16 with eager attention (a group of its own).
MIXED = _cluster(("A100-SXM4-80GB", 1, 8), ("A100-SXM4-40GB", 1, 8), ("V100-SXM2-32GB", 1, 8), ("RTX-3090", 1, 4))
CASES = {
    "dense-megatron": (_job("gpt3-1.3b"), MIXED),
    "dense-large": (_job("llama2-7b", seq_len=4096, global_batch_size=64), MIXED),
    "moe": (_job("mixtral-8x7b", seq_len=1024, global_batch_size=32), _cluster(("H100-SXM5-80GB", 2, 8))),
    "fsdp2": (_job("gpt3-2.7b", runtime="fsdp2"), MIXED),
    "deepspeed-fp16": (_job("gpt3-1.3b", runtime="deepspeed", precision="fp16"), MIXED),
    "fp8": (_job("qwen2.5-0.5b", precision="fp8"), _cluster(("H100-SXM5-80GB", 1, 8), ("A100-SXM4-80GB", 1, 8))),
    "pinned-tp": (_job("gpt3-2.7b", {"tp": 2}), MIXED),
    "tight": (_job("gpt3-6.7b", global_batch_size=16), _cluster(("A100-SXM4-40GB", 1, 8), ("RTX-3090", 2, 4))),
}


def _worker_filter(job: JobSpec) -> Callable[[Plan], bool]:
    return lambda plan: plan_supported(plan, job.model)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("filtered", [False, True], ids=["all", "worker-filter"])
def test_same_plan_per_count_as_the_full_search(name: str, filtered: bool) -> None:
    job, cluster = CASES[name]
    plan_filter = _worker_filter(job) if filtered else None
    full = first_per_count(enumerate_plans(job, cluster, plan_filter=plan_filter).plans)
    fast = {(p.gpu_type, p.num_gpus): p for p in fastest_plans(job, cluster, plan_filter=plan_filter)}
    assert fast == full
    if name != "moe" or not filtered:  # the worker runs no MoE model
        assert fast


def test_admit_keeps_only_the_pairs_asked_for() -> None:
    job, cluster = CASES["dense-megatron"]
    everything = {(p.gpu_type, p.num_gpus): p for p in fastest_plans(job, cluster)}
    some = fastest_plans(job, cluster, admit=lambda gpu, n: gpu == "A100-SXM4-40GB" and n % 8 == 0)
    assert some
    assert {(p.gpu_type, p.num_gpus): p for p in some} == {
        key: plan for key, plan in everything.items() if key[0] == "A100-SXM4-40GB" and key[1] % 8 == 0
    }


def test_a_pinned_layout_gets_its_one_plan() -> None:
    pinned = {"dp": 2, "tp": 2, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "sequence_parallel": True, "zero_stage": 1,
              "recompute": "none", "attention": "flash"}  # fmt: skip
    job = _job("gpt3-350m", pinned, pin_micro_batch=True, micro_batch_size=2)
    cluster = CASES["dense-megatron"][1]
    assert fastest_plans(job, cluster) == list(first_per_count(enumerate_plans(job, cluster).plans).values())


def test_search_options_takes_the_full_searchs_options() -> None:
    """The scheduler's options (best per admissible count, capped, Pareto-thinned) are those the full
    search's plans give."""
    job, cluster = CASES["dense-large"]
    topology = Topology(cluster)
    searched = search_options(job, cluster, topology=topology)
    one_step = replace(job, name="", training=replace(job.training, train_steps=1))
    full = enumerate_plans(one_step, cluster).plans
    assert searched.per_count == best_per_count(full, topology, round_up=False)


def test_a_gpus_plans_do_not_depend_on_the_gpus_searched_with_it() -> None:
    """A100 40 GB and 80 GB share one search and one bound per candidate; near a GPU's budget the bound is
    replayed at the candidate's own dp for that GPU, whichever GPU of the pair asked first (before, the
    80 GB GPU's answer was reused for the 40 GB one, and a search in another order admitted other plans)."""
    job = _job("gpt3-1.3b", global_batch_size=64)
    alone = enumerate_plans(job, _cluster(("A100-SXM4-40GB", 1, 8))).plans
    paired = enumerate_plans(job, _cluster(("A100-SXM4-80GB", 1, 8), ("A100-SXM4-40GB", 1, 8))).plans
    assert [p for p in paired if p.gpu_type == "A100-SXM4-40GB"] == alone


def _front(points: list[tuple[int, float]]) -> list[Option]:
    return [Option(gpu_type="H100", num_gpus=n, whole_nodes=0, duration_s=d, plan=None) for n, d in points]  # type: ignore[arg-type]


def test_a_thinned_front_keeps_the_lean_counts_and_drops_the_ones_that_scale_badly() -> None:
    # A 13B model's front on H100s (GPUs, seconds per step, as planned on cluster-2048): 16, 64 and 256 GPUs are the
    # leanest for their speed; 8, 40, 80, 128 and 160 cost more GPU-seconds than a faster count on either side.
    front = _front(
        [
            *[(4, 105), (5, 74), (8, 46), (16, 23), (32, 11.65), (40, 10.35), (64, 6.05), (80, 5.66)],
            *[(128, 3.24), (160, 3.19), (256, 1.64), (512, 1.08)],
        ]
    )
    assert [front[i].num_gpus for i in supported(front)] == [16, 32, 64, 256, 512]
    assert [o.num_gpus for o in thin_fronts([front], 6)] == [4, 16, 32, 64, 256, 512]
    # fewer slots than the hull: the fewest-GPU option and the hull's ends stay
    assert [o.num_gpus for o in thin_fronts([front], 3)] == [4, 16, 512]
    # more slots than the hull: the rest of the front fills them
    assert [o.num_gpus for o in thin_fronts([front], 8)] == [4, 5, 16, 32, 64, 160, 256, 512]
    assert [o.num_gpus for o in thin_fronts([front], 2)] == [4, 512]  # one slot for the hull: its fastest end
    assert thin_fronts([front[:4]], 6) == tuple(front[:4])  # short fronts untouched


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 64), st.floats(1.0, 1e5)), min_size=1, max_size=24),
    st.integers(2, 8),
    st.floats(0.0, 10.0),
)
def test_the_cheapest_option_at_any_price_survives_the_cut(
    raw: list[tuple[int, float]], count: int, price: float
) -> None:
    # a Pareto front as built from per-count plans: more GPUs, strictly faster
    points: list[tuple[int, float]] = []
    for gpus, duration in sorted(raw):
        if not points or (gpus > points[-1][0] and duration < points[-1][1]):
            points.append((gpus, duration))
    front = _front(points)
    kept = thin_fronts([front], count)
    assert len(kept) == min(count, len(front)) and kept[0] is front[0]
    assert list(kept) == sorted(kept, key=lambda o: o.num_gpus)
    cheapest = min(front, key=lambda o: (o.duration_s + price * o.num_gpus * o.duration_s, o.duration_s))
    best_kept = min(o.duration_s + price * o.num_gpus * o.duration_s for o in kept)
    if len(supported(front)) <= count - 1:  # the whole hull fits in the cut
        assert best_kept == pytest.approx(cheapest.duration_s + price * cheapest.num_gpus * cheapest.duration_s)
