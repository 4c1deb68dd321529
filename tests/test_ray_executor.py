"""The Ray executor on a local Ray cluster the test starts with fake GPU-type resources: the placement group
asks for the GPU type of the placement, the actors form one torch.distributed group and train to success;
a rank that fails ends the attempt with its cause and frees the bundles."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from frenzy_opt.core.spec import parse_job  # noqa: E402
from frenzy_opt.hardware.topology import Topology  # noqa: E402
from frenzy_opt.launch.executors import ExitInfo, Launch  # noqa: E402
from frenzy_opt.launch.executors.ray import RayExecutor  # noqa: E402
from frenzy_opt.planning.problem import OptionCache  # noqa: E402
from frenzy_opt.planning.scenario import load_cluster_ref  # noqa: E402

JOB = {
    "name": "tiny",
    "model": {
        "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "num_kv_heads": 2,
        "vocab_size": 256, "mlp": "swiglu", "norm": "rmsnorm", "tied_embeddings": False,
    },
    "training": {"seq_len": 32, "micro_batch_size": 2, "global_batch_size": 8, "train_steps": 6, "precision": "fp32"},
    "parallel": {"dp": 2, "tp": 1, "pp": 1, "zero_stage": 0},
}  # fmt: skip


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # Ray runs its workers at niceness 15 by default (system config ``worker_niceness``): on a machine busy with
    # other processes at niceness 0 (the other half of the suite, a CPU burner) the ranks then got ~3 % of a
    # CPU each and the run took minutes instead of ~10 s. A test cluster runs them like any other process.
    ray.init(
        num_cpus=4,
        resources={"gpu_type:CPU-SLOT": 4},
        include_dashboard=False,
        logging_level="ERROR",
        _system_config={"worker_niceness": 0},
    )
    try:
        yield
    finally:
        ray.shutdown()


def _launch(job_id: str) -> Launch:
    cluster = load_cluster_ref("local-4slot")
    spec = parse_job(JOB)
    option = next(o for o in OptionCache(cluster, Topology(cluster)).options(spec) if o.num_gpus == 2)
    return Launch(
        job_id=job_id, attempt=1, spec=spec, option=option, nodes=("CPU-SLOT-g0-n0",), gpus_per_node=2, duration_s=1.0
    )


def _all_bundles_back(timeout: float = 30) -> bool:
    """Removing a placement group is asynchronous: wait until the fake GPU-type resources are all free."""
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("gpu_type:CPU-SLOT") != 4:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _run(executor: RayExecutor, launch: Launch) -> ExitInfo:
    done = threading.Event()
    result: list[ExitInfo] = []

    def on_exit(_: str, __: int, info: ExitInfo) -> None:
        result.append(info)
        done.set()

    executor.launch(launch, on_exit)
    assert done.wait(240), "the Ray run did not end"
    return result[0]


@pytest.mark.slow
def test_ray_actors_train_on_a_placement_group_of_the_gpu_type(local_ray: None, tmp_path: Path) -> None:
    executor = RayExecutor(tmp_path, checkpoint_every=3)
    launch = _launch("ray-ok")
    assert executor.bundles(launch) == [{"CPU": 1.0, "gpu_type:CPU-SLOT": 1.0}] * 2
    info = _run(executor, launch)
    assert info.ok, info.cause
    assert info.measured.steps_run == 6 and info.measured.loss_last < info.measured.loss_first
    assert len(info.measured.peak_memory_bytes) == 2
    log = executor.read_log("ray-ok", 1, 0, 1 << 20)
    assert (
        log is not None
        and "[rank0]: step 6/6 loss" in log.data.decode()
        and "[rank0]: completed 6 steps" in (log.data.decode())
    )
    assert executor.running() == set()
    assert _all_bundles_back()


@pytest.mark.slow
def test_a_failing_rank_ends_the_attempt_with_its_cause(local_ray: None, tmp_path: Path) -> None:
    executor = RayExecutor(tmp_path)
    launch = _launch("ray-fail")
    spec = launch.spec
    bad = Launch(
        job_id=launch.job_id, attempt=1, spec=spec, option=launch.option, nodes=launch.nodes, gpus_per_node=2,
        duration_s=1.0,
    )  # fmt: skip
    # A plan for 3 ranks on 2 actors: the worker refuses it on every rank.
    from dataclasses import replace

    broken = replace(
        bad,
        option=replace(
            bad.option, plan=replace(bad.option.plan, parallel=replace(bad.option.plan.parallel, tp=3, dp=1))
        ),
    )
    info = _run(executor, broken)
    assert not info.ok and "rank" in info.cause and "plan needs dp x tp x pp = 3 ranks" in info.cause
    log = executor.read_log("ray-fail", 1, None, 1 << 20)
    assert log is not None and "plan needs dp x tp x pp = 3 ranks" in log.data.decode()  # the ranks' own words
    assert _all_bundles_back()
