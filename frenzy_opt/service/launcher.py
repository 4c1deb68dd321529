"""``frenzy launch JOB``: plan one job on a cluster, place it, run it for real through an executor and
compare what it measured with what MARP and the step-time model predicted for the same plan.

It takes the service's own decision path: an :class:`frenzy_opt.service.orchestrator.Orchestrator` over a
throw-away job store, with the chosen executor, runs the greedy HAS on the empty cluster, so the plan and the
placement are the ones ``frenzy serve`` with that executor would choose for the job alone (among the plans
the executor can run, ``executor.supports``). With the local executor, a cluster none of whose plans this
machine can run (a GPU type it lacks, :meth:`Executor.placement_problem`) is refused
before anything starts: it never runs on the CPU in the GPU's name. The run is one attempt (no retry):
``state`` is ``succeeded`` or ``failed`` with the cause.

:func:`decided_placement` is the same decision without a run (``frenzy plan JOB --export slurm|k8s``).
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from frenzy_opt.core.enums import TERMINAL_STATES, JobState
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors import make_executor
from frenzy_opt.launch.executors.common import plan_supported
from frenzy_opt.launch.worker.support import worker_supports
from frenzy_opt.planning.plans import DEFAULT_STEP_MODEL
from frenzy_opt.planning.problem import OptionCache, SchedulingProblem, no_option_message, problem_job
from frenzy_opt.prediction.steptime import StepTimeModel
from frenzy_opt.service.orchestrator import Orchestrator
from frenzy_opt.service.records import JobRecord
from frenzy_opt.service.store import Store
from frenzy_opt.solvers.greedy import GreedyState

POLL_S = 0.2


def launch_job(
    spec: JobSpec,
    cluster: ClusterSpec,
    *,
    executor_name: str = "local",
    steps: int | None = None,
    workdir: str | Path = "frenzy-runs",
    job_id: str | None = None,
    timeout_s: float = 3600.0,
) -> dict[str, Any]:
    """Run ``spec`` once (module docstring); the contract-3 payload of ``frenzy launch``. Each launch gets
    its own run folder (``job_id``, default a fresh one), so nothing resumes from an earlier launch."""
    job_id = job_id or f"launch-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    executor = make_executor(executor_name, workdir=str(workdir), max_steps=steps)
    with tempfile.TemporaryDirectory(prefix="frenzy-launch-") as ledger:
        store = Store(f"sqlite:///{Path(ledger) / 'jobs.db'}")
        orchestrator = Orchestrator(store, cluster, executor)
        try:
            _check_runnable(spec, cluster, orchestrator, executor_name)
            record = store.add_job(
                job_id=job_id,
                tenant="local",
                name=spec.name,
                spec=spec.to_mapping(),
                request_hash="",
                idempotency_key=None,
                max_retries=0,
                weight=1.0,
                predicted=None,
            )
            orchestrator.start()
            orchestrator.submit(record, spec=spec)
            done = _wait(store, job_id, timeout_s)
            if done is None:
                orchestrator.cancel(job_id).result(timeout=30)
                raise RuntimeError(f"launch: the run did not end within {timeout_s:.0f} s")
        finally:
            orchestrator.stop()
            store.close()
    return _payload(spec, done, Path(workdir) / job_id)


def _check_runnable(spec: JobSpec, cluster: ClusterSpec, orchestrator: Orchestrator, executor_name: str) -> None:
    """Refuse, before anything starts, a job no plan of which the executor can run here."""
    options = orchestrator.cache.options(spec)
    if not options:
        raise ValueError(
            f"job {spec.name}: no plan the {executor_name} executor can run fits cluster {cluster.name} "
            "(see `frenzy plan` for every memory-feasible plan)"
        )
    problems = [orchestrator.executor.placement_problem(o.gpu_type, o.gpus_per_node) for o in options]
    if all(p is not None for p in problems):
        raise ValueError(f"launch of job {spec.name} on cluster {cluster.name}: {problems[0]}")


def _wait(store: Store, job_id: str, timeout_s: float) -> JobRecord | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = store.get(job_id)
        if record is not None and record.state in TERMINAL_STATES:
            return record
        time.sleep(POLL_S)
    return None


def _payload(spec: JobSpec, record: JobRecord, run_dir: Path) -> dict[str, Any]:
    measured = record.measured or {}
    plan = {k: v for k, v in (record.plan or {}).items() if k != "est_runtime_s"}
    placement = record.placement or {}
    predicted = record.predicted or {}
    ok = record.state == JobState.SUCCEEDED
    return {
        "job": spec.to_mapping(),
        "state": "succeeded" if ok else "failed",
        "cause": None if ok else record.reason,
        "plan": plan,
        "placement": {"nodes": placement.get("nodes", []), "gpus_per_node": placement.get("gpus_per_node")},
        "steps_run": measured.get("steps_run", 0),
        "loss_first": measured.get("loss_first"),
        "loss_last": measured.get("loss_last"),
        "measured": {
            "peak_memory_bytes": measured.get("peak_memory_bytes"),
            "memory_source": measured.get("memory_source"),
            "step_time_s": measured.get("step_time_s"),
            "tokens_per_s": measured.get("tokens_per_s"),
        },
        "predicted": {
            "peak_allocated_bytes": predicted.get("peak_allocated_bytes"),
            "device_used_bytes": predicted.get("device_used_bytes"),
            "step_time_s": predicted.get("step_time_s"),
        },
        "workdir": str(run_dir),
    }


def decided_placement(
    spec: JobSpec, cluster: ClusterSpec, *, step_model: StepTimeModel = DEFAULT_STEP_MODEL
) -> dict[str, Any]:
    """The placement mapping (module docstring) of the service's decision for ``spec`` alone on an empty
    ``cluster``: the options the orchestrator builds (:class:`OptionCache`, keeping the plans the training
    worker runs, as it does with the local and Ray executors), one :meth:`GreedyState.decide` at time 0, and
    the nodes of that assignment by name. ``ValueError`` says why no plan is left."""
    topology = Topology(cluster)
    cache = OptionCache(
        cluster, topology, plan_filter=lambda plan, s: plan_supported(plan, s.model), step_model=step_model
    )
    options = cache.options(spec)
    if not options:
        unfiltered = OptionCache(cluster, topology, step_model=step_model).options(spec)
        if not unfiltered:
            raise ValueError(no_option_message(spec.name, spec, cluster.name))
        plan = unfiltered[0].plan
        why = worker_supports(plan.parallel, spec.model, plan.num_micro_batches)
        raise ValueError(
            f"job {spec.name}: nothing to export, the training worker (frenzy_opt.launch.worker.train) runs none of "
            f"its plans on {cluster.name}; it does not run {why}"
        )
    state = GreedyState(SchedulingProblem(topology=topology, jobs=()))
    state.queue[spec.name] = problem_job(spec.name, 0.0, 1.0, options, spec)
    started = state.decide(0.0)
    if not started:  # an empty cluster holds every option the placement rule admits
        raise ValueError(f"job {spec.name}: the scheduler started no plan on an empty {cluster.name}")
    chosen = started[0]
    return {
        "job": spec.to_mapping(),
        "plan": chosen.option.plan.to_dict(),
        "placement": {
            "nodes": [topology.nodes[i].name for i in chosen.nodes],
            "gpus_per_node": chosen.option.gpus_per_node,
        },
    }
