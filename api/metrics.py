"""The service's Prometheus metrics (``GET /metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """Prometheus metrics of one service (its own registries, so several apps can live in one process).
    Per-tenant series live in a registry of their own, shown only to an admin when tokens are configured
    (tenant names and their activity are not public)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tenant_registry = CollectorRegistry()
        self.queue = Gauge("frenzy_queue_length", "Jobs waiting in the scheduler's queue", registry=self.registry)
        self.gpus_used = Gauge("frenzy_gpus_used", "GPUs held by running jobs", ["gpu_type"], registry=self.registry)
        self.gpus_total = Gauge("frenzy_gpus_total", "GPUs in the cluster", ["gpu_type"], registry=self.registry)
        self.decisions = Counter("frenzy_decisions", "Scheduling decisions made", registry=self.registry)
        self.decision_seconds = Histogram(
            "frenzy_decision_seconds",
            "Wall time of one greedy HAS decision",
            buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0),
            registry=self.registry,
        )
        self.submitted = Counter("frenzy_jobs_submitted", "Jobs accepted", ["tenant"], registry=self.tenant_registry)
        self.rejected = Counter("frenzy_jobs_rejected", "Submissions refused (422)", registry=self.registry)
        self.unavailable = Counter(
            "frenzy_store_unavailable", "Requests answered 503: the store could not write", registry=self.registry
        )
        self.throttled = Counter(
            "frenzy_plans_throttled", "Dry runs and new-shape submissions answered 429", registry=self.registry
        )

    def on_decision(self, seconds: float, queued: int) -> None:
        self.decisions.inc()
        self.decision_seconds.observe(seconds)
        self.queue.set(queued)
