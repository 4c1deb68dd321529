"""GPU accounting from job histories (frenzy_opt.service.accounting): stretches across a preemption, a job
still running, GPU-hours inside a window, and the placement sentence read back."""

from __future__ import annotations

import pytest

from frenzy_opt.service.accounting import Held, held, placement_detail, placement_of, usage
from frenzy_opt.service.records import EventRecord, JobRecord


def _record(job: str, tenant: str) -> JobRecord:
    return JobRecord(
        id=job, seq=0, tenant=tenant, name=f"{job}-name", idempotency_key=None, request_hash="", spec={},
        state="running", reason="", attempts=1, max_retries=2, weight=1.0, plan=None, placement=None,
        predicted=None, measured=None, created_at=0.0, updated_at=0.0,
    )  # fmt: skip


def _events(*items: tuple[float, str, str]) -> list[EventRecord]:
    return [EventRecord(at=at, state=state, detail=detail) for at, state, detail in items]


def test_the_placement_sentence_reads_back() -> None:
    assert placement_of(placement_detail(16, "A100-SXM4-80GB", ["n0", "n1"])) == (16, "A100-SXM4-80GB")
    assert placement_of("attempt 1 launched (simulated)") is None


def test_stretches_across_a_preemption_and_while_running() -> None:
    events = _events(
        (0.0, "queued", "accepted"),
        (10.0, "scheduled", placement_detail(8, "A100", ["n0"])),
        (10.0, "running", "attempt 1 launched"),
        (100.0, "queued", "preempted"),
        (150.0, "scheduled", placement_detail(4, "V100", ["n5"])),
        (151.0, "running", "attempt 2 launched"),
    )
    stretches = held(_record("a", "team"), events)
    assert stretches == [
        Held("a", "a-name", "team", "A100", 8, 10.0, 100.0),
        Held("a", "a-name", "team", "V100", 4, 151.0, None),
    ]
    finished = held(_record("a", "team"), [*events, *_events((251.0, "succeeded", "done"))])
    assert finished[-1].end == 251.0


def test_gpu_hours_per_tenant_and_type_inside_the_window() -> None:
    stretches = [
        Held("a", "a", "t1", "A100", 8, 0.0, 3600.0),
        Held("b", "b", "t1", "A100", 2, 1800.0, None),  # still running
        Held("c", "c", "t2", "V100", 4, 7200.0, 9000.0),  # outside the window
    ]
    rows = usage(stretches, since=1800.0, until=5400.0)
    assert rows == [{"tenant": "t1", "gpu_type": "A100", "gpu_hours": pytest.approx(8 * 0.5 + 2 * 1.0), "jobs": 2}]
    assert [r["tenant"] for r in usage(stretches, since=0.0, until=10_000.0)] == ["t1", "t2"]
    # One clock: at a time scale of 120 the same wall window holds 120x the GPU-hours of cluster time.
    scaled = usage(stretches, since=1800.0, until=5400.0, time_scale=120.0)
    assert scaled[0]["gpu_hours"] == pytest.approx(120 * rows[0]["gpu_hours"])
