"""Answers that explain themselves (issue 28 items 5, 6, 9): deadlines at risk and missed, moves logged with
what they gain, why a job waits, and ``frenzy status`` in GiB and hours."""

from __future__ import annotations

import itertools
from pathlib import Path

from test_has import ResumingExecutor

from frenzy_opt.client import jobs_table, status_text
from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.launch.executors import ExitInfo
from frenzy_opt.service.events import Exited, Submitted
from frenzy_opt.service.orchestrator import Orchestrator
from frenzy_opt.service.store import Store

GPU = "A100-SXM4-80GB"
CLUSTER = parse_cluster({"name": "one-node", "node_groups": [{"gpu": GPU, "num_nodes": 1, "gpus_per_node": 8}]})
TRAINING = {"seq_len": 1024, "global_batch_size": 64}
COUNTER = itertools.count()


def _service(tmp_path: Path) -> tuple[Orchestrator, Store, ResumingExecutor, list[float]]:
    store = Store(f"sqlite:///{tmp_path / 'ledger.db'}")
    executor = ResumingExecutor()
    orch = Orchestrator(store, CLUSTER, executor)
    clock = [0.0]
    orch.now = lambda: clock[0]  # type: ignore[method-assign]
    return orch, store, executor, clock


def _submit(orch: Orchestrator, store: Store, spec: dict[str, object]) -> str:
    record = store.add_job(
        job_id=f"job-{next(COUNTER)}", tenant="t", name="j", spec=spec, request_hash="h", idempotency_key=None,
        max_retries=1, weight=1.0, predicted=None,
    )  # fmt: skip
    orch.process([Submitted(record, parse_job(record.spec))])
    return record.id


def test_a_deadline_the_plan_misses_is_flagged_at_placement_and_recorded_as_missed(tmp_path: Path) -> None:
    orch, store, executor, clock = _service(tmp_path)
    spec = {"model": "gpt3-125m", "training": {**TRAINING, "train_steps": 200_000}, "scheduling": {"deadline_s": 60}}
    job = _submit(orch, store, spec)
    record = store.get(job)
    assert record is not None and record.predicted is not None
    assert record.predicted["deadline_risk"] is True and record.predicted["end_after_submit_s"] > 60
    assert any("deadline at risk" in e.detail for e in store.events(job))
    clock[0] = orch.running[job].end_s
    orch.process([Exited(job, executor.launched[job].attempt, ExitInfo(ok=True))])
    done = store.get(job)
    assert done is not None and done.state == "succeeded"
    assert done.measured is not None and done.measured["deadline_missed_by_s"] > 0
    assert "after its deadline" in store.events(job)[-1].detail
    # the CLI says so
    answer = {"id": job, "name": "j", "tenant": "t", "state": "succeeded", "attempts": 1, "max_retries": 1,
              "predicted": done.predicted, "measured": done.measured,
              "deadline_missed_by_s": done.measured["deadline_missed_by_s"]}  # fmt: skip
    assert "MISSED" in status_text(answer) and "(deadline missed)" in jobs_table([answer])
    # a deadline the plan meets is not flagged
    easy = _submit(orch, store, {**spec, "scheduling": {"deadline_s": 10**8}})
    easy_record = store.get(easy)
    assert easy_record is not None and easy_record.predicted is not None
    assert easy_record.predicted["deadline_risk"] is False
    store.close()


def test_a_move_is_logged_with_what_it_gains_and_a_waiting_job_says_why(tmp_path: Path) -> None:
    orch, store, executor, clock = _service(tmp_path)
    long = _submit(orch, store, {"model": "gpt3-125m", "training": {**TRAINING, "train_steps": 200_000}})
    clock[0] = orch.running[long].end_s / 2
    short = _submit(orch, store, {"model": "gpt3-125m", "training": {**TRAINING, "train_steps": 200}})
    assert executor.cancelled == [long] and short in orch.running
    moved = [e.detail for e in store.events(long) if e.detail.startswith("moved")]
    assert len(moved) == 1
    assert "moved (preempted)" in moved[0] and f"for {short}" in moved[0] and "the stop costs" in moved[0]
    # the preempted job now waits: its reason names what it waits for, its place, and the types it can use
    info = orch.queue_info(long)  # planned when asked, as the API does before it answers
    assert info is not None and info.position == 1
    why = orch.reason(long)
    assert why is not None and why.startswith("waiting for") and "#1 in the queue" in why and GPU in why
    store.close()


def test_status_reads_in_gib_and_hours_with_a_plan_line() -> None:
    job = {
        "id": "job-1", "name": "pretrain", "tenant": "t", "state": "succeeded", "attempts": 1, "max_retries": 3,
        "time_scale": 120.0,
        "plan": {"num_gpus": 32, "gpu_type": GPU, "micro_batch_size": 2, "precision": "bf16",
                 "parallel": {"dp": 8, "tp": 2, "pp": 2, "zero_stage": 1, "sequence_parallel": True,
                              "recompute": "none"}},
        "predicted": {"peak_allocated_bytes": 35 * 2**30, "step_time_s": 1.5, "runtime_s": 7200.0},
        "measured": {"step_time_s": 1.65, "peak_memory_bytes": [36 * 2**30] * 32, "source": "simulated"},
    }  # fmt: skip
    text = status_text(job)
    assert "plan: 32 x A100-SXM4-80GB, dp8 tp2 pp2 zero1 sp, micro-batch 2, bf16" in text
    assert "peak 35.0 GiB allocated" in text and "2.0h cluster time" in text
    assert "36.0 GiB on each rank (32 ranks)" in text and "+10% vs predicted" in text
    assert "[" not in text and "{" not in text  # no Python or JSON reprs


def test_serve_says_what_it_serves() -> None:
    from frenzy_opt.api.server import banner, build_config

    config = build_config(
        CLUSTER, db_url="postgresql+psycopg://frenzy:secret@db.example/jobs", time_scale=120.0, create=False
    )
    text = banner(config, "0.0.0.0", 8000, num_workers=2)
    assert "cluster one-node (8 GPUs: 8 x A100-SXM4-80GB)" in text and "executor simulated" in text
    assert "time scale 120x" in text and "secret" not in text and "***" in text
    assert "dashboard http://127.0.0.1:8000/ui" in text and "API workers 2" in text


def test_demo_lines_break_between_clauses_not_inside_them() -> None:
    from frenzy_opt.cli.serve import wrap_clauses

    line = (
        "plan    llama3-8b-pretrain       833 memory-feasible plans; fastest 16 x A100-SXM4-80GB, 73.10 s/step, "
        "70.8 GiB/GPU; fewest GPUs: 2 A100-SXM4-80GB, 8 RTX-3090, 8 V100-SXM2-32GB"
    )
    wrapped = wrap_clauses(line, 80).split("\n")
    assert all(len(part) <= 80 for part in wrapped) and len(wrapped) > 1
    assert " ".join(part.strip() for part in wrapped) == line  # nothing lost, only line breaks between clauses
    assert all(part.rstrip().endswith((";", ",")) for part in wrapped[:-1])
    assert wrap_clauses("short", 80) == "short"
