"""The service's plan searches, off the request path: the dry run's (``POST /v1/plans``) and a submission's
feasibility check (``POST /v1/jobs``, :meth:`PlanSearches.admission`).

They run in a worker process: a search of a large cluster holds the CPU and about 16 MB for up to seconds,
so in the server's own threads a burst of them starved every other client. The dry run's results are cached by
what changes the search (not the name or the step count), bounded in bytes. A submission's search is the one
the scheduler's option cache makes (:func:`frenzy_opt.planning.problem.search_options`, with the loop's step
model and the executor's plan filter): its result goes to the scheduler with the job, whose loop adopts it
instead of searching again; only the verdict "no plan" is cached here. Each tenant has a limit on concurrent
searches (both kinds together) and a rate limit per kind (a dry run is charged per request, a submission per
search it starts): over either, 429 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Any

from frenzy_opt.core.spec import JobSpec
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.planning.plans import NoFeasiblePlan, search_or_fail
from frenzy_opt.planning.problem import PlanFilter, Searched, search_key, search_options
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
    first :data:`MAX_TOP_PLANS` plans, fastest first, each as :meth:`Plan.to_dict` writes it (the shape of a
    job's ``plan``). Raises :class:`NoFeasiblePlan`."""
    search = search_or_fail(spec, cluster, step_model=step_model)
    min_gpus: dict[str, int] = {}
    for plan in search.plans:
        min_gpus[plan.gpu_type] = min(min_gpus.get(plan.gpu_type, plan.num_gpus), plan.num_gpus)
    plans = [p.to_dict() for p in search.plans[:MAX_TOP_PLANS]]  # the plan's one wire format
    return {"num_plans": len(search.plans), "min_gpus_per_type": min_gpus, "plans": plans}


def admission_search(
    spec: JobSpec, cluster: ClusterSpec, step_model: StepTimeModel, plan_filter: PlanFilter | None, max_options: int
) -> Searched:
    """A submission's plan search (worker process): the scheduler's own (:func:`search_options`); when it
    leaves no option, :class:`NoFeasiblePlan` saying why, as the service always has: the memory search's reason
    (:func:`search_or_fail`) or the placement rules. ``spec`` is the name-less one-step key, so the message
    names the job ``""`` (:func:`named` puts the name back)."""
    searched = search_options(
        spec, cluster, step_model=step_model, plan_filter=plan_filter, max_options_per_type=max_options
    )
    if searched.options:
        return searched
    search_or_fail(spec, cluster)  # raises NoFeasiblePlan when no plan fits memory
    raise NoFeasiblePlan(
        f"job {spec.name}: memory-feasible plans exist but none the placement rules of "
        f"{cluster.name} admit (inside one node, or whole nodes)"
    )


def named(error: NoFeasiblePlan, name: str) -> NoFeasiblePlan:
    """The error of a search of the name-less key (every message starts ``job {name}``) naming ``name``."""
    text = str(error)
    assert text.startswith("job "), text
    return NoFeasiblePlan(f"job {name}{text[4:]}")


def worker_context() -> BaseContext:
    """Where the pool's workers come from: forked from multiprocessing's fork server, a single-threaded process
    that imported this module once, where the platform has one (a new pool starts in about 30 ms instead of the
    second an import of the planner takes: measured on this repository's 2-CPU machine); else spawned. Never
    forked from the server itself: a forked child of a threaded server can inherit a held lock."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # only read when the fork server starts
    return context


class Throttled(Exception):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PlanSearches:
    """The service's plan searches (module docstring): a worker pool, an LRU cache bounded in bytes keyed by
    what changes a search, in-flight searches shared, per-tenant concurrency and rate limits."""

    def __init__(self, config: ServiceConfig, step_model: StepTimeModel) -> None:
        self.config, self.step_model = config, step_model
        self._pool: ProcessPoolExecutor | None = None
        self._cache: OrderedDict[Hashable, tuple[dict[str, Any] | NoFeasiblePlan, int]] = OrderedDict()
        self.cache_bytes = 0
        self._running: dict[Hashable, Future[Any]] = {}
        self._per_tenant: dict[str, int] = {}
        self._buckets: dict[str, TokenBucket] = {}
        """Each tenant's dry runs (charged per request)."""
        self._search_buckets: dict[str, TokenBucket] = {}
        """Each tenant's submissions' searches (charged per search started)."""
        self._lock = threading.RLock()  # a done callback may run at once, in the thread that holds it
        self.searches = 0
        """Searches run (cache misses, both kinds), for tests and metrics."""

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
            self._charge(tenant, self._buckets, "plan requests")

    def _charge(self, tenant: str, buckets: dict[str, TokenBucket], what: str) -> None:
        """Take a token of the tenant's bucket in ``buckets``; :class:`Throttled` when there is none."""
        with self._lock:
            bucket = buckets.setdefault(
                tenant, TokenBucket(self.config.plans_per_minute / 60.0, self.config.plans_burst)
            )
            wait = bucket.take()
        if wait > 0:
            raise Throttled(
                f"tenant {tenant!r} is over its rate of {self.config.plans_per_minute:g} {what} per minute", wait
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
                future = self._running.get(key) or self._start(
                    key, tenant, plan_summary, key, self.config.cluster, self.step_model
                )
        if future is None:
            assert cached is not None
            result = cached[0]
        else:
            try:
                result = await asyncio.shield(asyncio.wrap_future(future))
            except NoFeasiblePlan as err:
                result = err
        if isinstance(result, NoFeasiblePlan):
            raise named(result, spec.name)
        return result

    async def admission(
        self, spec: JobSpec, tenant: str, step_model: StepTimeModel, plan_filter: PlanFilter | None, max_options: int
    ) -> Searched:
        """A submission's plan search (module docstring, :func:`admission_search`) with the scheduler's step
        model, the executor's plan filter and the scheduler's option count: searched in the pool (or shared with
        the same search running), charged to the tenant's concurrency and search rate; raises
        :class:`NoFeasiblePlan` (cached) or :class:`Throttled`."""
        key = ("admission", search_key(spec), plan_filter, max_options)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                assert isinstance(cached[0], NoFeasiblePlan)
                raise named(cached[0], spec.name)
            future = self._running.get(key)
            if future is None:
                self._check_concurrency(tenant)
                self._charge(tenant, self._search_buckets, "plan searches")
                # Name-less and one step (what search_key ignores), with its scheduling.max_gpus.
                one_step = replace(spec, name="", training=replace(spec.training, train_steps=1))
                call = (admission_search, one_step, self.config.cluster, step_model, plan_filter, max_options)
                future = self._start(key, tenant, *call, keep_results=False)
        try:
            searched: Searched = await asyncio.shield(asyncio.wrap_future(future))
        except NoFeasiblePlan as err:
            raise named(err, spec.name) from None
        return searched

    def _check_concurrency(self, tenant: str) -> None:
        """:class:`Throttled` when the tenant has its limit of searches running (under ``_lock``)."""
        limit = self.config.plan_searches_per_tenant
        if self._per_tenant.get(tenant, 0) >= limit:
            raise Throttled(f"tenant {tenant!r} already has {limit} plan searches running", 1.0)

    def _start(
        self, key: Hashable, tenant: str, function: Callable[..., Any], *args: Any, keep_results: bool = True
    ) -> Future[Any]:
        """A new search charged to the tenant's concurrency (under ``_lock``); its outcome is cached when it
        is "no plan", and its result too with ``keep_results``."""
        self._check_concurrency(tenant)
        try:
            future = self._pool_now().submit(function, *args)
        except BrokenProcessPool:  # a worker died (killed, out of memory): the next pool serves
            assert self._pool is not None
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            future = self._pool_now().submit(function, *args)
        self._per_tenant[tenant] = self._per_tenant.get(tenant, 0) + 1
        self.searches += 1
        self._running[key] = future

        def done(finished: Future[Any]) -> None:
            self._done(key, tenant, finished, keep_results)

        future.add_done_callback(done)
        return future

    def _pool_now(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.config.plan_workers, mp_context=worker_context())
        return self._pool

    def _done(self, key: Hashable, tenant: str, future: Future[Any], keep_results: bool) -> None:
        with self._lock:
            self._running.pop(key, None)
            self._per_tenant[tenant] -= 1
            if future.cancelled():
                return
            error = future.exception()
            if error is not None and not isinstance(error, NoFeasiblePlan):
                return  # not cached: a crashed worker is retried by the next request
            if error is None and not keep_results:
                return
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
