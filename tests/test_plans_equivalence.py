"""The plan search's speed-ups change no result: a snapshot of ``enumerate_plans`` taken before them.

``tests/data/plans-snapshot.json`` holds, for a handful of small jobs and clusters (three GPU types, equal
memory at different counts, MoE, fp8, a pinned layout, a plan filter, a job that fits nowhere), what the
search returned at commit 469f6d1 (before the shared step terms, the per-GPU rates, the direct allocator
replay and the C YAML loader): the plan count, the candidates evaluated, the least required bound, the
closest refusal, and a SHA-256 digest of every plan's fields in rank order (layouts, memory figures in
bytes, step times as ``repr`` of the float, so equal means bit-equal). The smallest case keeps its plans in
full, so that a difference there shows which field moved.

This is a consistency check of the code against its own earlier output, not a validation against
measurements. Regenerate the file only for an intended change of results::

    PYTHONPATH=. .venv/bin/python tests/test_plans_equivalence.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from factories import cluster_of

from frenzy_opt.core.spec import JobSpec, parse_job
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.planning.plans import Plan, enumerate_plans

SNAPSHOT = Path(__file__).parent / "data" / "plans-snapshot.json"
FULL_ROWS = ("gpt3-350m-two-types",)
"""Cases whose plans the snapshot keeps in full (the others keep a digest)."""


def _cluster(*groups: tuple[str, int, int]) -> ClusterSpec:
    return cluster_of(*groups, name="snapshot")


def _job(model: str, parallel: dict[str, object] | None = None, **training: object) -> JobSpec:
    train = {"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 16, **training}
    return parse_job({"name": "snapshot", "model": model, "training": train, "parallel": parallel or {}})


THREE = (("A100-SXM4-80GB", 1, 8), ("V100-SXM2-32GB", 1, 8), ("RTX-3090", 2, 4))
SAME_MEMORY = (("H100-SXM5-80GB", 1, 8), ("A100-SXM4-80GB", 2, 8), ("A100-SXM4-40GB", 1, 8))
PINNED = {"dp": 2, "tp": 2, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "sequence_parallel": True, "zero_stage": 1,
          "recompute": "none", "attention": "flash"}  # fmt: skip


def _no_sp_nor_zero1(plan: Plan) -> bool:
    return not plan.parallel.sequence_parallel and plan.parallel.zero_stage != 1


Case = tuple[JobSpec, ClusterSpec, Callable[[Plan], bool] | None]


def cases() -> dict[str, Case]:
    """The snapshot's jobs, clusters and plan filters, by name."""
    return {
        "gpt3-350m-two-types": (
            _job("gpt3-350m", {"tp": 1, "recompute": "none"}, global_batch_size=4),
            _cluster(("T4", 1, 4), ("A10G", 1, 2)),
            None,
        ),
        "llama2-7b-three-types": (_job("llama2-7b", seq_len=2048, global_batch_size=32), _cluster(*THREE), None),
        "gpt3-1.3b-same-memory": (_job("gpt3-1.3b", global_batch_size=8), _cluster(*SAME_MEMORY), None),
        "mixtral-moe": (_job("mixtral-8x7b"), _cluster(("A100-SXM4-80GB", 2, 8), ("H100-SXM5-80GB", 1, 8)), None),
        "llama3-8b-fp8-deepspeed": (
            _job("llama3-8b", precision="fp8", runtime="deepspeed", global_batch_size=8),
            _cluster(("H100-SXM5-80GB", 1, 8), ("L40S", 1, 8)),
            None,
        ),
        "mistral-fsdp2": (_job("mistral-7b", runtime="fsdp2"), _cluster(*THREE), None),
        "llama3-8b-pinned": (_job("llama3-8b", PINNED, micro_batch_size=2), _cluster(*THREE), None),
        "llama2-7b-filtered": (_job("llama2-7b", global_batch_size=32), _cluster(*THREE), _no_sp_nor_zero1),
        "llama3.1-405b-fits-nowhere": (_job("llama3.1-405b"), _cluster(("T4", 1, 4), ("RTX-3090", 1, 4)), None),
    }


def plan_row(plan: Plan) -> dict[str, Any]:
    """Every field of a plan, floats as their ``repr`` (bit-exact)."""
    row = plan.to_dict()
    for key in ("step_time_s", "step_time_p10_s", "step_time_p90_s", "est_runtime_s"):
        row[key] = repr(row[key])
    row["num_micro_batches"] = plan.num_micro_batches
    return row


def snapshot_of(name: str, case: Case) -> dict[str, Any]:
    job, cluster, plan_filter = case
    search = enumerate_plans(job, cluster, plan_filter=plan_filter)
    rows = [plan_row(p) for p in search.plans]
    closest = None
    if search.closest is not None:
        closest = [search.closest[0], search.closest[1].required, search.closest[1].explain()]
    out: dict[str, Any] = {
        "num_plans": len(rows),
        "num_evaluated": search.num_evaluated,
        "min_device_bytes": search.min_device_bytes,
        "closest": closest,
        "digest": hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest(),
    }
    if name in FULL_ROWS:
        out["plans"] = rows
    return out


@pytest.fixture(scope="module")
def snapshot() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("name", list(cases()))
def test_enumeration_matches_the_snapshot_taken_before_the_speedups(name: str, snapshot: dict[str, Any]) -> None:
    expected = snapshot["cases"][name]
    got = snapshot_of(name, cases()[name])
    if "plans" in expected:
        assert got["plans"] == expected["plans"]
    assert got == expected


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_plans_equivalence.py --write")
    data = {"cases": {name: snapshot_of(name, case) for name, case in cases().items()}}
    SNAPSHOT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
