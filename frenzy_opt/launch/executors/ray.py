"""The Ray executor: for clusters beyond one machine, a placement becomes a Ray placement group and one Ray
actor per rank running the training worker (:mod:`frenzy_opt.launch.worker.train`) in-process.

* **Placement group**: one bundle per rank, ``{"CPU": 1, "gpu_type:<GPU type>": 1}`` (plus ``"GPU": 1`` where
  Ray sees GPUs), and ``"frenzy_node:<node name>": 1`` when the Ray cluster advertises that resource — so the
  bundles land on the nodes and GPU types of frenzy's placement when the Ray nodes are started with
  ``--resources '{"gpu_type:A100-SXM4-80GB": 8, "frenzy_node:<name>": 8}'``. Strategy: ``PACK`` for a
  placement inside one node, ``SPREAD`` beyond.
* **Process group**: the actors set up the same torch.distributed process group torchrun would — rank 0
  picks its node's address and a free port, every actor gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT`` — and each runs ``python -m frenzy_opt.launch.worker.train`` as its child
  with the job and plan files written to the run folder (``WORKDIR/<job>/``, a shared file system across Ray nodes, as
  checkpoints need anyway).
* **End**: success when every actor returned; failure (with the first error) when one raised or died, after
  which the others are killed and the placement group removed. Rank 0 returns its report lines, from which
  the measurement is summarised as for the local executor.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from frenzy_opt.launch.executors import ExitInfo, Launch, LogChunk, OnExit, OnReport, attempt_log, read_chunk
from frenzy_opt.launch.executors.common import job_plan_supported, plan_supported, prepare_run, summarize
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.planning.plans import Plan
from frenzy_opt.planning.problem import PlanFilter


def _actor_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class TrainActor:
        """One rank: runs the training worker in this actor's process."""

        def address(self) -> tuple[str, int]:
            import socket

            with socket.socket() as s:
                s.bind(("", 0))
                port = int(s.getsockname()[1])
            return ray.util.get_node_ip_address(), port

        def run(self, env: dict[str, str], cwd: str, argv: list[str], log: str) -> list[dict[str, Any]]:
            import collections
            import subprocess
            import sys

            # The worker runs as a child of the actor: a fresh interpreter whose imports do not see the
            # driver's source tree (Ray puts the driver's folder on its workers' path) and whose
            # torch.distributed state ends with it. Its output goes, line by line and marked with its rank,
            # to the attempt's log, which every rank appends to (as torchrun's ``[rank]`` prefixes do).
            command = [sys.executable, "-m", "frenzy_opt.launch.worker.train", *argv]
            child_env = {**os.environ, **env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            last: collections.deque[str] = collections.deque(maxlen=3)
            with (
                open(log, "a", encoding="utf-8") as out,
                subprocess.Popen(
                    command, cwd=cwd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                ) as child,
            ):
                assert child.stdout is not None
                for line in child.stdout:
                    out.write(f"[rank{env['RANK']}]: {line}")
                    out.flush()
                    last.append(line.strip())
                code = child.wait()
            if code != 0:
                tail = " | ".join(last)[:500]
                raise RuntimeError(f"rank {env['RANK']}: the worker exited with code {code}: {tail}")
            report = Path(cwd) / "report.jsonl"
            if env["RANK"] != "0" or not report.is_file():
                return []
            return [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]

    return TrainActor


class RayExecutor:
    name = "ray"
    preemptible = False
    """A stopped attempt starts again from step 0 on its next placement."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        address: str | None = None,
        max_steps: int | None = None,
        checkpoint_every: int = 5,
        cpu: bool | None = None,
    ) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, logging_level="ERROR")
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.max_steps, self.checkpoint_every = max_steps, checkpoint_every
        self.cpu = cpu
        self._runs: dict[str, tuple[list[Any], Any]] = {}
        self._lock = threading.Lock()

    def supports(self, plan: Plan, arch: ModelArch) -> bool:
        return plan_supported(plan, arch)

    def plan_filter(self) -> PlanFilter:
        return job_plan_supported

    def placement_problem(self, gpu_type: str, gpus_per_node: int) -> str | None:
        """None: the Ray cluster's own resources decide (a placement group waits until its bundles fit)."""
        return None

    def read_log(self, job_id: str, attempt: int, offset: int | None, limit: int) -> LogChunk | None:
        """The attempt's ``attempt-N.log`` in the run folder: every rank's output, each line marked
        ``[rankR]:``."""
        return read_chunk(attempt_log(self.workdir, job_id, attempt), offset, limit)

    def bundles(self, launch: Launch) -> list[dict[str, float]]:
        """One bundle per rank (module docstring)."""
        import ray

        available = ray.cluster_resources()
        out = []
        for node in launch.nodes:
            for _ in range(launch.gpus_per_node):
                bundle = {"CPU": 1.0, f"gpu_type:{launch.option.gpu_type}": 1.0}
                if available.get("GPU", 0) > 0 and not self.cpu:
                    bundle["GPU"] = 1.0
                if f"frenzy_node:{node}" in available:
                    bundle[f"frenzy_node:{node}"] = 1.0
                out.append(bundle)
        return out

    def launch(self, launch: Launch, on_exit: OnExit, on_report: OnReport | None = None) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        job_dir, steps = prepare_run(self.workdir, launch, self.max_steps)
        argv = ["--job", "job.json", "--plan", "plan.json", "--steps", str(steps), "--report", "report.jsonl"]
        argv += ["--checkpoint-dir", "checkpoints", "--checkpoint-every", str(self.checkpoint_every)]
        use_gpu = ray.cluster_resources().get("GPU", 0) > 0 and not self.cpu
        if not use_gpu:
            argv.append("--cpu")
        group = placement_group(self.bundles(launch), strategy="PACK" if len(launch.nodes) == 1 else "SPREAD")
        ray.get(group.ready(), timeout=120)
        actor = _actor_class()
        world = len(launch.nodes) * launch.gpus_per_node
        actors = [
            actor.options(
                num_gpus=1 if use_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=rank
                ),
                runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
            ).remote()
            for rank in range(world)
        ]
        with self._lock:
            self._runs[launch.job_id] = (actors, group)
        master, port = ray.get(actors[0].address.remote())
        log = attempt_log(self.workdir, launch.job_id, launch.attempt)
        log.write_bytes(b"")
        refs = []
        for rank, handle in enumerate(actors):
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank % launch.gpus_per_node),
                "LOCAL_WORLD_SIZE": str(launch.gpus_per_node),
                "MASTER_ADDR": master,
                "MASTER_PORT": str(port),
            }
            refs.append(handle.run.remote(env, str(job_dir), argv, str(log)))
        threading.Thread(target=self._watch, args=(launch, refs, on_exit), daemon=True).start()

    def _watch(self, launch: Launch, refs: list[Any], on_exit: OnExit) -> None:
        import ray

        pending, cause = list(refs), ""
        records: list[dict[str, Any]] = []
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                result = ray.get(done[0])
                records += result
            except Exception as err:  # a rank raised or its actor died: stop the run
                inner = getattr(err, "cause", None) or err  # RayTaskError wraps the actor's exception
                text = str(inner).strip().splitlines()[-1] if str(inner).strip() else type(inner).__name__
                cause = f"rank {refs.index(done[0])} failed: {type(inner).__name__}: {text[:400]}"
                break
        cancelled = self._teardown(launch.job_id)
        if cancelled:
            return
        on_exit(launch.job_id, launch.attempt, ExitInfo(ok=not cause, cause=cause, measured=summarize(records)))

    def _teardown(self, job_id: str) -> bool:
        """Kill the run's actors and remove its placement group; True if it had been cancelled already."""
        import ray
        from ray.util.placement_group import remove_placement_group

        with self._lock:
            run = self._runs.pop(job_id, None)
        if run is None:
            return True
        actors, group = run
        for handle in actors:
            ray.kill(handle)
        remove_placement_group(group)
        return False

    def cancel(self, job_id: str, why: str | None = None) -> None:
        """Tear the job's actors down (``why`` is not kept: Ray's actor logs are its own)."""
        self._teardown(job_id)

    def running(self) -> set[str]:
        with self._lock:
            return set(self._runs)

    def adopt(self, job_id: str, attempt: int, on_exit: OnExit) -> None:
        """Never called after a restart: Ray's actors end with the driver, so :meth:`running` lists none of
        the runs of an earlier service; a direct call reports the run lost."""
        on_exit(job_id, attempt, ExitInfo(ok=False, cause="the Ray executor keeps no runs across a restart"))

    def shutdown(self) -> None:
        for job_id in list(self.running()):
            self._teardown(job_id)
