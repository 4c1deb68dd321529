"""The dry run's plan searches (``POST /v1/plans``), off the request path.

They run in a worker process: a search of a large cluster holds the CPU and about 16 MB for up to seconds,
so in the server's own threads a burst of them starved every other client. Their results are cached by what
changes the search (not the name or the step count), bounded in bytes; each tenant has a limit on concurrent
searches and a rate limit (429 with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from frenzy_opt.core.spec import JobSpec
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.planning.plans import NoFeasiblePlan, search_or_fail
from frenzy_opt.prediction.steptime import StepTimeModel

if TYPE_CHECKING:
    from frenzy_opt.api.app import ServiceConfig

MAX_TOP_PLANS = 100
"""The most plans the dry run lists (``top``'s bound): what its cache keeps per search."""


class TokenBucket:
    """A rate limit: ``rate`` per second with bursts of ``burst`` (the token bucket of RFC 2697's meters)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> float:
        """0 if a token was taken, else the seconds until one is there."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate if self.rate > 0 else math.inf


def plan_summary(spec: JobSpec, cluster: ClusterSpec, step_model: StepTimeModel) -> dict[str, Any]:
    """The dry run's answer for one training step (worker process): plan count, fewest GPUs per type and the
    first :data:`MAX_TOP_PLANS` plans, fastest first. Raises :class:`NoFeasiblePlan`."""
    search = search_or_fail(spec, cluster, step_model=step_model)
    min_gpus: dict[str, int] = {}
    for plan in search.plans:
        min_gpus[plan.gpu_type] = min(min_gpus.get(plan.gpu_type, plan.num_gpus), plan.num_gpus)
    plans = [
        {
            "gpu_type": p.gpu_type,
            "num_gpus": p.num_gpus,
            "parallel": p.parallel.to_dict(),
            "micro_batch_size": p.micro_batch_size,
            "precision": p.precision,
            "peak_allocated_bytes": p.peak_allocated_bytes,
            "device_used_bytes": p.device_used_bytes,
            "step_time_s": p.step_time_s,
            "step_time_p10_s": p.step_time_p10_s,
            "step_time_p90_s": p.step_time_p90_s,
            "est_runtime_s": p.est_runtime_s,
            "memory_risk": p.memory_risk,
        }
        for p in search.plans[:MAX_TOP_PLANS]
    ]
    return {"num_plans": len(search.plans), "min_gpus_per_type": min_gpus, "plans": plans}


class Throttled(Exception):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PlanSearches:
    """The dry run's plan searches (module docstring): a worker pool, an LRU cache bounded in bytes keyed by
    the one-step spec, in-flight searches shared, per-tenant concurrency and rate limits."""

    def __init__(self, config: ServiceConfig, step_model: StepTimeModel) -> None:
        self.config, self.step_model = config, step_model
        self._pool: ProcessPoolExecutor | None = None
        self._cache: OrderedDict[JobSpec, tuple[dict[str, Any] | NoFeasiblePlan, int]] = OrderedDict()
        self.cache_bytes = 0
        self._running: dict[JobSpec, Future[dict[str, Any]]] = {}
        self._per_tenant: dict[str, int] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.RLock()  # a done callback may run at once, in the thread that holds it
        self.searches = 0
        """Searches run (cache misses), for tests and metrics."""

    @staticmethod
    def key(spec: JobSpec) -> JobSpec:
        """What changes the search: the spec without its name, step count and scheduling fields."""
        return replace(
            spec, name="", training=replace(spec.training, train_steps=1), scheduling=type(spec.scheduling)()
        )

    def __len__(self) -> int:
        """Results cached."""
        return len(self._cache)

    def admit(self, tenant: str) -> None:
        """Charge a dry run to the tenant's rate limit; :class:`Throttled` when it is spent."""
        with self._lock:
            bucket = self._buckets.setdefault(
                tenant, TokenBucket(self.config.plans_per_minute / 60.0, self.config.plans_burst)
            )
            wait = bucket.take()
        if wait > 0:
            raise Throttled(
                f"tenant {tenant!r} is over its rate of {self.config.plans_per_minute:g} plan requests per minute",
                wait,
            )

    async def summary(self, spec: JobSpec, tenant: str) -> dict[str, Any]:
        """The one-step summary of ``spec`` (cached, or searched in the pool); raises
        :class:`NoFeasiblePlan` or :class:`Throttled`."""
        key = self.key(spec)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                future = None
            else:
                future = self._running.get(key) or self._start(key, tenant)
        if future is None:
            assert cached is not None
            result = cached[0]
        else:
            try:
                result = await asyncio.wrap_future(future)
            except NoFeasiblePlan as err:
                result = err
        if isinstance(result, NoFeasiblePlan):
            raise result
        return result

    def _start(self, key: JobSpec, tenant: str) -> Future[dict[str, Any]]:
        """A new search charged to the tenant's concurrency (under ``_lock``)."""
        limit = self.config.plan_searches_per_tenant
        if self._per_tenant.get(tenant, 0) >= limit:
            raise Throttled(f"tenant {tenant!r} already has {limit} plan searches running", 1.0)
        self._per_tenant[tenant] = self._per_tenant.get(tenant, 0) + 1
        future = self._submit(key)
        self._running[key] = future

        def done(finished: Future[dict[str, Any]]) -> None:
            self._done(key, tenant, finished)

        future.add_done_callback(done)
        return future

    def _submit(self, key: JobSpec) -> Future[dict[str, Any]]:
        if self._pool is None:
            # spawn: a forked child of a threaded server can inherit a held lock
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.config.plan_workers, mp_context=context)
        self.searches += 1
        return self._pool.submit(plan_summary, key, self.config.cluster, self.step_model)

    def _done(self, key: JobSpec, tenant: str, future: Future[dict[str, Any]]) -> None:
        with self._lock:
            self._running.pop(key, None)
            self._per_tenant[tenant] -= 1
            if future.cancelled():
                return
            error = future.exception()
            if error is not None and not isinstance(error, NoFeasiblePlan):
                return  # not cached: a crashed worker is retried by the next request
            value: dict[str, Any] | NoFeasiblePlan = error if isinstance(error, NoFeasiblePlan) else future.result()
            size = len(str(value)) if isinstance(value, NoFeasiblePlan) else len(json.dumps(value))
            self._cache[key] = (value, size)
            self.cache_bytes += size
            while self.cache_bytes > self.config.plan_cache_bytes and len(self._cache) > 1:
                _, (_, dropped) = self._cache.popitem(last=False)
                self.cache_bytes -= dropped

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
