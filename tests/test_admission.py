"""Admission cannot be starved (issue 23, item 4): a submission's feasibility check is the scheduler's own plan
search run in a worker process under the tenant's plan-search limits, a known job shape is answered from the
scheduler's cache without waiting for anyone's search, and the loop adopts the worker's search instead of
searching again. Also: the option cache's bound is in measured bytes."""

from __future__ import annotations

import gc
import os
import pickle
import signal
import threading
import time
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from factories import simulated_service
from fastapi.testclient import TestClient

from frenzy_opt.api.app import create_app
from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors import Launch, OnExit
from frenzy_opt.launch.executors.common import job_plan_supported, plan_supported
from frenzy_opt.launch.executors.local import LocalExecutor
from frenzy_opt.launch.executors.simulated import SimulatedExecutor
from frenzy_opt.planning.group import clear_shared_memos
from frenzy_opt.planning.plans import DEFAULT_STEP_MODEL, NoFeasiblePlan, Plan, enumerate_plans, search_or_fail
from frenzy_opt.planning.problem import OptionCache, search_options
from frenzy_opt.planning.scenario import load_cluster_ref
from frenzy_opt.prediction.stepterms import cached_step_terms
from frenzy_opt.service.orchestrator import Orchestrator
from frenzy_opt.service.store import Store

A, B = "token-team-a", "token-team-b"
TENANTS = {"tokens": [{"token": A, "tenant": "team-a"}, {"token": B, "tenant": "team-b"}]}
SMALL = {
    "name": "small",
    "model": "gpt3-125m",
    "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 50},
}
OTHER = {"name": "other", "model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 512}}
CLUSTER = load_cluster_ref("paper-3type")
HOLD_S = 3.0
"""How long the worker is kept busy while a known spec is submitted (the answer must come well before)."""


@contextmanager
def _client(tmp_path: Path, **settings: Any) -> Iterator[TestClient]:
    """A simulated service whose jobs finish in milliseconds, with team-a's and team-b's tokens."""
    config = simulated_service(f"sqlite:///{tmp_path / 'jobs.db'}", 1e9, TENANTS, decision_wait_s=5.0, **settings)
    with TestClient(create_app(config)) as client:
        yield client


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _wait_until(condition: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_known_spec_does_not_wait_for_another_tenants_search(tmp_path: Path) -> None:
    with _client(tmp_path) as client:
        service = client.app.state.service  # type: ignore[attr-defined]
        assert client.post("/v1/jobs", json=SMALL, headers=auth(A)).status_code == 202  # known from now on
        busy = service.searches._pool.submit(time.sleep, HOLD_S)  # the one worker is taken
        with ThreadPoolExecutor(1) as pool:
            new = pool.submit(client.post, "/v1/jobs", json=OTHER, headers=auth(B))
            _wait_until(lambda: len(service.searches._running) == 1)  # team-b's search waits for the worker
            start = time.perf_counter()
            known = client.post("/v1/jobs", json={**SMALL, "name": "again"}, headers=auth(A))
            elapsed_s = time.perf_counter() - start
            assert known.status_code == 202, known.text
            assert not new.done() and not busy.done()
            assert elapsed_s < HOLD_S / 3
            assert new.result().status_code == 202  # and team-b's submission goes through once searched


@pytest.mark.slow
def test_a_tenant_flooding_new_specs_gets_429_and_another_keeps_a_low_p99(tmp_path: Path) -> None:
    flooders, samples = 4, 200
    limits = {"plans_per_minute": 30.0, "plans_burst": 4, "plan_searches_per_tenant": 2}
    with _client(tmp_path, **limits) as client:
        service = client.app.state.service  # type: ignore[attr-defined]
        assert client.post("/v1/jobs", json=SMALL, headers=auth(B)).status_code == 202  # team-b's known spec
        stop = threading.Event()
        answers: list[Any] = []

        def flood(first: int) -> None:
            for k in range(first, 1_000_000, flooders):  # a new job shape every time
                if stop.is_set():
                    return
                body = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 8 * (k + 1)}}
                answers.append(client.post("/v1/jobs", json=body, headers=auth(A)))

        latencies_s = []
        with ThreadPoolExecutor(flooders) as pool:
            running = [pool.submit(flood, k) for k in range(flooders)]
            _wait_until(lambda: any(a.status_code == 429 for a in answers))
            for n in range(samples):
                start = time.perf_counter()
                answer = client.post("/v1/jobs", json={**SMALL, "name": f"b-{n}"}, headers=auth(B))
                latencies_s.append(time.perf_counter() - start)
                assert answer.status_code == 202, answer.text
            stop.set()
            for future in running:
                future.result()
        refused = [a for a in answers if a.status_code == 429]
        assert {a.status_code for a in answers} <= {202, 429}
        assert len(refused) > len(answers) // 2
        assert all(int(a.headers["retry-after"]) >= 1 for a in refused)
        assert all("plan searches" in a.json()["detail"] for a in refused)
        p99_s = sorted(latencies_s)[int(0.99 * samples) - 1]
        assert p99_s < 1.0, f"team-b's p99 {p99_s:.3f} s"
        # Every search team-a got past its limits: the burst plus the rate over the test (and team-b's one).
        assert service.searches.searches <= 1 + limits["plans_burst"] + 2 + 30.0 / 60 * sum(latencies_s)


def test_a_spec_with_no_feasible_plan_still_gets_422_with_the_reason(tmp_path: Path) -> None:
    huge = {"name": "huge", "model": "llama3.1-405b", "parallel": {"tp": 1, "pp": 1}}
    capped = {"name": "capped", "model": "llama3-8b", "scheduling": {"max_gpus": 1}}
    with pytest.raises(NoFeasiblePlan) as memory:  # the reason the service always gave
        search_or_fail(parse_job(huge), CLUSTER)
    placement = (
        "job capped: memory-feasible plans exist but none the placement rules of paper-3type admit "
        "(inside one node, or whole nodes)"
    )
    with _client(tmp_path) as client:
        service = client.app.state.service  # type: ignore[attr-defined]
        for body, message in ((huge, str(memory.value)), (capped, placement)):
            answer = client.post("/v1/jobs", json=body, headers=auth(A))
            assert answer.status_code == 422
            assert answer.json()["detail"][0]["msg"] == message
        searched = service.searches.searches
        again = client.post("/v1/jobs", json={**huge, "name": "huge-2"}, headers=auth(B))
        assert again.status_code == 422 and again.json()["detail"][0]["msg"].startswith("job huge-2 fits no GPU type")
        assert service.searches.searches == searched  # the verdict was kept: no search, and nothing charged
        assert service.metrics.rejected._value.get() == 3
        assert client.get("/v1/jobs", headers=auth(A)).json()["total"] == 0


def test_the_loop_adopts_the_workers_search_and_does_not_search_again(tmp_path: Path) -> None:
    with _client(tmp_path) as client:
        service = client.app.state.service  # type: ignore[attr-defined]
        answer = client.post("/v1/jobs", json=OTHER, headers=auth(A))
        assert answer.status_code == 202 and answer.json()["plan"] is not None
        cache = service.orchestrator.cache
        assert (service.searches.searches, cache.adopted, cache.searches_run) == (1, 1, 0)
        longer = {**OTHER, "name": "longer", "training": {**OTHER["training"], "train_steps": 99}}
        assert client.post("/v1/jobs", json=longer, headers=auth(B)).status_code == 202  # the same shape
        assert (service.searches.searches, cache.adopted, cache.searches_run) == (1, 1, 0)


def test_adopt_takes_only_a_search_made_with_the_caches_own_step_model_and_filter() -> None:
    spec, other = parse_job(OTHER), parse_job(SMALL)
    made = pickle.loads(pickle.dumps(search_options(spec, CLUSTER)))  # as it comes back from a worker
    refitted = DEFAULT_STEP_MODEL.with_efficiency("A100-SXM4-80GB", 0.3)  # the closed loop's new model
    stale = OptionCache(CLUSTER, Topology(CLUSTER), step_model=refitted)
    assert not stale.adopt(spec, made)
    assert stale.per_step(spec) and stale.searches_run == 1  # it searched itself
    assert not OptionCache(CLUSTER, Topology(CLUSTER), plan_filter=job_plan_supported).adopt(spec, made)
    assert not OptionCache(CLUSTER, Topology(CLUSTER), max_options_per_type=2).adopt(spec, made)
    assert not OptionCache(CLUSTER, Topology(CLUSTER)).adopt(other, made)  # another shape
    cache = OptionCache(CLUSTER, Topology(CLUSTER))
    assert cache.adopt(spec, made) and cache.adopted == 1
    assert cache.per_step(spec) == cache.cached(spec).options == made.options  # type: ignore[union-attr]
    assert cache.searches_run == 0 and cache.cache_bytes > 0


class _FilteringExecutor:
    """Runs nothing; supports what the training worker runs (as the local and Ray executors do)."""

    name = "filtering"
    preemptible = False

    def launch(self, launch: Launch, on_exit: OnExit, on_report: object = None) -> None:
        pass

    def cancel(self, job_id: str, why: str | None = None) -> None:
        pass

    def running(self) -> set[str]:
        return set()

    def shutdown(self) -> None:
        pass

    def supports(self, plan: Plan, arch: Any) -> bool:
        return plan_supported(plan, arch)

    def plan_filter(self) -> Any:
        return job_plan_supported

    def adopt(self, job_id: str, attempt: int, on_exit: OnExit) -> None:
        pass


def test_the_orchestrator_adopts_a_search_made_with_its_executors_filter_only(tmp_path: Path) -> None:
    orchestrator = Orchestrator(Store(f"sqlite:///{tmp_path / 'jobs.db'}"), CLUSTER, _FilteringExecutor())
    orchestrator.start()
    try:
        for n, plan_filter in enumerate((job_plan_supported, None)):
            body = {**OTHER, "training": {**OTHER["training"], "seq_len": 2048 * (n + 1)}}
            spec = parse_job(body)
            record = orchestrator.store.add_job(
                job_id=f"job-{n}", tenant="t", name=spec.name, spec=body, request_hash=str(n), idempotency_key=None,
                max_retries=0, weight=1.0, predicted=None,
            )  # fmt: skip
            searched = search_options(spec, CLUSTER, step_model=orchestrator.step_model, plan_filter=plan_filter)
            waiter = orchestrator.submit(record, spec=spec, searched=pickle.loads(pickle.dumps(searched)))
            assert isinstance(waiter, threading.Event) and waiter.wait(20)
        cache = orchestrator.cache
        assert (cache.adopted, cache.searches_run) == (1, 1)  # the unfiltered search was searched again
    finally:
        orchestrator.stop()


def test_an_executors_plan_filter_answers_as_its_supports_and_pickles_by_name(tmp_path: Path) -> None:
    spec = parse_job(OTHER)
    plans = enumerate_plans(spec, CLUSTER).plans
    for executor in (SimulatedExecutor(), LocalExecutor(tmp_path)):
        accept = executor.plan_filter()
        verdicts = [executor.supports(plan, spec.model) for plan in plans]
        assert verdicts == [accept is None or accept(plan, spec) for plan in plans]
        assert pickle.loads(pickle.dumps(accept)) is accept
    local = [plan_supported(plan, spec.model) for plan in plans]
    assert any(local) and not all(local)  # the check could fail: the local executor refuses some plans


def _freed_when_dropped(cache: OptionCache) -> int:
    """Bytes tracemalloc sees freed when every search of the cache is dropped. The process-wide memos a search
    fills (step terms, stage models and splits, step-time pricing) are emptied first: they are bounded on their
    own and not counted (:data:`frenzy_opt.planning.problem.CACHE_BYTES`), and a layout they keep as a key would
    otherwise stay alive with them (how many do depends on what the process searched before)."""
    cached_step_terms.cache_clear()
    clear_shared_memos()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    cache._searches.clear()
    gc.collect()
    return before - tracemalloc.get_traced_memory()[0]


@pytest.mark.slow
def test_an_entrys_measured_size_is_what_it_retains_on_a_2048_gpu_cluster() -> None:
    cluster = load_cluster_ref("cluster-2048")
    spec = parse_job({"model": "llama3-70b", "training": {"seq_len": 4096, "global_batch_size": 512}})
    cache = OptionCache(cluster, Topology(cluster))
    tracemalloc.start()
    try:
        cache.per_step(spec)  # a real search, every allocation traced
        measured, freed = cache.cache_bytes, _freed_when_dropped(cache)
    finally:
        tracemalloc.stop()
    assert freed > 10_000  # tens of kB: a real search (26 kB when measured)
    assert abs(measured - freed) <= 0.15 * freed, (measured, freed)


def test_an_adopted_entrys_measured_size_is_what_it_retains() -> None:
    blob = pickle.dumps(search_options(parse_job(SMALL), CLUSTER))  # what a worker sends back
    cache = OptionCache(CLUSTER, Topology(CLUSTER))
    tracemalloc.start()
    try:
        assert cache.adopt(parse_job(SMALL), pickle.loads(blob))
        measured, freed = cache.cache_bytes, _freed_when_dropped(cache)
    finally:
        tracemalloc.stop()
    assert freed > 10_000
    assert abs(measured - freed) <= 0.15 * freed, (measured, freed)


def test_the_option_cache_stays_under_its_bound_in_bytes() -> None:
    specs = [parse_job({**SMALL, "training": {**SMALL["training"], "seq_len": n}}) for n in (512, 1024, 2048)]
    searches = [search_options(spec, CLUSTER) for spec in specs]
    probe = OptionCache(CLUSTER, Topology(CLUSTER))
    sizes = []
    for spec, searched in zip(specs, searches, strict=True):
        before = probe.cache_bytes
        probe.adopt(spec, searched)
        sizes.append(probe.cache_bytes - before)
    bound = sizes[0] + sizes[1] + sizes[2] - 1  # all three do not fit
    cache = OptionCache(CLUSTER, Topology(CLUSTER), max_bytes=bound)
    for spec, searched in zip(specs, searches, strict=True):
        cache.adopt(spec, searched)
        assert cache.cache_bytes <= bound
    assert len(cache) == 2 and cache.cached(specs[0]) is None  # the least recently used went
    assert cache.cache_bytes == sizes[1] + sizes[2]


def test_a_dead_search_worker_is_replaced_and_charges_nothing(tmp_path: Path) -> None:
    with _client(tmp_path, plan_searches_per_tenant=1) as client:
        searches = client.app.state.service.searches  # type: ignore[attr-defined]
        assert client.post("/v1/jobs", json=SMALL, headers=auth(A)).status_code == 202
        broken = searches._pool
        for pid in list(broken._processes):
            os.kill(pid, signal.SIGKILL)  # as the kernel's out-of-memory killer would
        _wait_until(lambda: broken._broken)
        for seq_len in (2048, 4096):  # neither a count left behind nor the broken pool: team-a searches again
            body = {**OTHER, "training": {**OTHER["training"], "seq_len": seq_len}}
            answer = client.post("/v1/jobs", json=body, headers=auth(A))
            assert answer.status_code == 202, answer.text
        assert searches._pool is not broken and searches._per_tenant == {"team-a": 0}
