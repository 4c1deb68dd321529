"""What a GPU group shares between its GPUs and its candidates changes no plan: a consistency check of the
plan search against its own unshared path (not a validation against measurements).

A group's GPUs of one workspace size and intra-node link share a candidate's memory bounds (evaluated over every
stage once, then on the stage that holds the largest), a GPU of the previous one's memory, workspaces and link
takes its memory judgment (:func:`frenzy_opt.planning.group.repeats`), and the candidates of a dp scan share
their micro-batch parts per GPU (:meth:`frenzy_opt.planning.group.GpuGroup.seconds`), whose step time is
summed without a :class:`~frenzy_opt.prediction.stepeval.StepTime` (``parts_total``). Here
every candidate with a plan is judged again on each GPU of its group on its own (a fresh candidate, nothing
shared with another GPU), and every plan's step time is priced again straight from its step terms
(:meth:`frenzy_opt.prediction.stepterms.StepTerms.evaluate`): both must give the search's plans bit for bit.
The cluster puts GPU types of three architectures and both link kinds in one group (two under fp8: the
Ampere GPUs run it at bf16).
"""

from __future__ import annotations

import pytest
from factories import cluster_of

from frenzy_opt.core.spec import JobSpec, parse_job
from frenzy_opt.planning.group import GpuGroup, gpu_groups
from frenzy_opt.planning.plans import DEFAULT_STEP_MODEL, enumerate_plans, headroom_of
from frenzy_opt.prediction.marp.cuda import DEFAULT_CUDA
from frenzy_opt.prediction.marp.fit import SHIPPED_FIT
from frenzy_opt.prediction.stepterms import cached_step_terms

# One group (same node size and count, FlashAttention): Hopper and Ampere on NVLink, Hopper, Ampere and Ada on
# PCIe; the Hopper GPUs take larger workspaces than the others.
MIXED = cluster_of(
    ("H100-SXM5-80GB", 2, 8),
    ("H800-SXM5-80GB", 2, 8),
    ("A100-SXM4-80GB", 2, 8),
    ("H100-PCIE-80GB", 2, 8),
    ("A100-PCIE-80GB", 2, 8),
    ("L40S", 2, 8),
)


def _job(model: str, **training: object) -> JobSpec:
    train = {"seq_len": 2048, "micro_batch_size": 1, "global_batch_size": 64, **training}
    return parse_job({"name": "sharing", "model": model, "training": train})


JOBS = {
    "megatron": _job("llama2-13b", seq_len=4096),
    "moe": _job("mixtral-8x7b", seq_len=1024, global_batch_size=32),
    "fp8-cp": _job("llama3-8b", precision="fp8", seq_len=8192, global_batch_size=32),
}


@pytest.mark.parametrize("name", sorted(JOBS))
def test_shared_bounds_and_step_parts_give_each_gpus_own_plans_consistency(name: str) -> None:
    job = JOBS[name]
    headroom = headroom_of(job, None, SHIPPED_FIT)
    plans = enumerate_plans(job, MIXED).plans
    assert plans
    by_layout = {(p.gpu_type, p.parallel, p.micro_batch_size): p for p in plans}
    for (precision, _, _, attention), gpus in gpu_groups(job, MIXED).items():
        group = GpuGroup(job, gpus, precision, attention, MIXED, cuda=DEFAULT_CUDA, step_model=DEFAULT_STEP_MODEL,
                         fit=SHIPPED_FIT)  # fmt: skip
        names = {gpu.name for gpu in gpus}
        for parallel, micro_batch_size in {(p.parallel, p.micro_batch_size) for p in plans if p.gpu_type in names}:
            terms = cached_step_terms(job.model, group.cache.training(micro_batch_size), parallel)
            for gpu in gpus:
                alone = group.candidate(parallel, micro_batch_size, group.capacity)  # shares nothing with other GPUs
                plan = by_layout.get((gpu.name, parallel, micro_batch_size))
                assert group.resolve(alone, gpu, headroom) == plan
                if plan is not None:
                    step = terms.evaluate(gpu, group.links[gpu.name], DEFAULT_STEP_MODEL, group.rates[gpu.name])
                    assert plan.step_time_s == step.total_s


def test_the_mixed_cluster_exercises_a_repeated_memory_judgment() -> None:
    """The H800-SXM5-80GB follows the H100-SXM5-80GB on NVLink with the same memory and workspaces, so the
    consistency check above covers a GPU whose memory judgment is its neighbour's; no other GPU of ``MIXED``
    repeats one (the A100s have more memory than the H100s, the L40S less and smaller workspaces)."""
    job = JOBS["megatron"]
    ((precision, _, _, attention), gpus), *_ = gpu_groups(job, MIXED).items()
    group = GpuGroup(job, gpus, precision, attention, MIXED, cuda=DEFAULT_CUDA, step_model=DEFAULT_STEP_MODEL,
                     fit=SHIPPED_FIT)  # fmt: skip
    assert group.repeats == {"H800-SXM5-80GB"}


# GPUs far apart in memory in one group (FlashAttention, 8-GPU nodes, 16 GPUs): many candidates that fit the
# largest are far too large for the smallest.
SPREAD = cluster_of(("H100-SXM5-80GB", 2, 8), ("A100-SXM4-40GB", 2, 8), ("L4", 2, 8), ("RTX-3080", 2, 8))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_settled_refusals_change_no_search_result_consistency(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """:meth:`GpuGroup._settled_refusal` skips bounds whose floor already settles them: the plans, the least
    bound, the number evaluated and the closest refusal are those of the search that works every bound out."""
    job = JOBS[name]
    settled = []
    original = GpuGroup._settled_refusal

    def counted(self: GpuGroup, *args: object) -> bool:
        settled.append(original(self, *args))  # type: ignore[arg-type]
        return settled[-1]

    monkeypatch.setattr(GpuGroup, "_settled_refusal", counted)
    fast = enumerate_plans(job, SPREAD)
    monkeypatch.setattr(GpuGroup, "_settled_refusal", lambda self, *args: False)
    full = enumerate_plans(job, SPREAD)
    assert any(settled)
    assert (fast.plans, fast.min_device_bytes, fast.num_evaluated) == (full.plans, full.min_device_bytes,
                                                                        full.num_evaluated)  # fmt: skip
    assert fast.closest is not None and full.closest is not None
    assert (fast.closest[0], fast.closest[1].rows) == (full.closest[0], full.closest[1].rows)
