"""Everyday commands as a user types them: ``frenzy launch`` on a cluster this machine cannot run and what it
prints, ``frenzy serve --db PATH``, ``frenzy solve`` on a ``workload:`` scenario, GPU names on ``--gpu``,
and the parallel layout as the CLI prints it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from frenzy_opt.cli import main

# --- frenzy launch ----------------------------------------------------------------------------------------


def _no_cuda() -> bool:
    import torch

    return int(torch.cuda.device_count()) == 0


@pytest.mark.skipif(not _no_cuda(), reason="checks the refusal on a machine without CUDA GPUs")
def test_launch_on_a_gpu_cluster_without_cuda_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["launch", "job-tiny", "--cluster", "paper-3type", "--workdir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2
    assert "no CUDA GPU" in err and "local-4slot" in err and "A100" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.skipif(not _no_cuda(), reason="checks the refusal on a machine without CUDA GPUs")
def test_the_local_executor_fails_a_gpu_placement_without_cuda_instead_of_running_it_on_cpu(tmp_path: Path) -> None:
    from frenzy_opt.core.spec import load_job
    from frenzy_opt.hardware.topology import Topology
    from frenzy_opt.launch.executors import ExitInfo, Launch
    from frenzy_opt.launch.executors.local import LocalExecutor
    from frenzy_opt.planning.problem import OptionCache
    from frenzy_opt.planning.scenario import load_cluster_ref, resolve

    cluster = load_cluster_ref("paper-3type")
    spec = load_job(resolve("job-tiny"))
    option = OptionCache(cluster, Topology(cluster)).options(spec)[0]
    launch = Launch(job_id="j", attempt=1, spec=spec, option=option, nodes=("n0",), gpus_per_node=1, duration_s=1.0)
    got: list[ExitInfo] = []
    done = threading.Event()
    LocalExecutor(tmp_path).launch(launch, lambda _j, _a, info: (got.append(info), done.set()))
    assert done.wait(5)
    assert not got[0].ok and "no CUDA GPU" in got[0].cause
    assert not (tmp_path / "j").exists()  # nothing was started


def test_launch_prints_units_and_rounded_figures_and_never_a_none_label(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import frenzy_opt.service.launcher

    def fake(*_: Any, **__: Any) -> dict[str, Any]:
        return {
            "state": "failed",
            "cause": "node 0 (torchrun) exited with code 1",
            "plan": {"num_gpus": 4, "gpu_type": "CPU-SLOT", "micro_batch_size": 2,
                     "parallel": {"dp": 4, "tp": 1, "pp": 1, "cp": 1, "zero_stage": 0, "recompute": "none"}},
            "steps_run": 0, "loss_first": None, "loss_last": None,
            "measured": {"peak_memory_bytes": None, "memory_source": None, "step_time_s": None, "tokens_per_s": None},
            "predicted": {"peak_allocated_bytes": 3 * 2**20, "device_used_bytes": 0,
                          "step_time_s": 2.4358626476025203e-06},
        }  # fmt: skip

    monkeypatch.setattr(frenzy_opt.service.launcher, "launch_job", fake)
    assert main(["launch", "job-tiny"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "(None)" not in out and "None" not in out
    assert "predicted 2.44 µs" in out and "measured -" in out
    assert "peak memory per rank: not measured" in out and "MARP 3 MiB" in out


def test_figures_are_printed_with_three_significant_figures_and_a_unit() -> None:
    from frenzy_opt.cli import _bytes_text, _seconds_text

    assert _seconds_text(0.123456) == "123 ms"
    assert _seconds_text(12.3456) == "12.3 s"
    assert _seconds_text(2.4358626476025203e-06) == "2.44 µs"
    assert _bytes_text(1.5 * 2**30) == "1.5 GiB"
    assert _bytes_text(123456) == "0.118 MiB"


# --- the README's curl examples ---------------------------------------------------------------------------


def test_the_readme_curl_posts_send_their_json_bodies_as_json() -> None:
    """FastAPI answers 422 to a JSON body sent as curl's default form encoding."""
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    posts = [line for line in readme.splitlines() if line.startswith("$ curl") and "-XPOST" in line]
    assert posts
    assert all("-H 'Content-Type: application/json'" in line for line in posts), posts


# --- frenzy serve --db ------------------------------------------------------------------------------------


def test_serve_takes_a_plain_path_as_a_sqlite_file_and_explains_a_bad_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import frenzy_opt.api.server
    from frenzy_opt.cli import db_url

    assert db_url("myjobs.db") == "sqlite:///myjobs.db"
    assert db_url(str(tmp_path / "jobs.db")) == f"sqlite:///{tmp_path / 'jobs.db'}"
    assert db_url("sqlite:///frenzy-opt.db") == "sqlite:///frenzy-opt.db"
    with pytest.raises(ValueError, match=r"--db: .*sqlite:///myjobs.db"):
        db_url("nosuchdialect://host/db")
    with pytest.raises(ValueError, match="does not exist"):
        db_url(str(tmp_path / "missing" / "jobs.db"))
    seen: dict[str, Any] = {}
    monkeypatch.setattr(frenzy_opt.api.server, "build_config", lambda cluster, **kw: seen.update(kw))
    monkeypatch.setattr(frenzy_opt.api.server, "serve", lambda *_: None)
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--db", "myjobs.db"]) == 0
    assert seen["db_url"] == "sqlite:///myjobs.db"


# --- frenzy solve -----------------------------------------------------------------------------------------


def test_solve_generates_the_jobs_of_a_workload_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["solve", "sia64-llm", "--solver", "greedy", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["results"]["greedy"]
    assert len(result["schedule"]) == 160  # workload: {num_jobs: 160}


@pytest.mark.solver
def test_cpsat_out_of_reach_says_so_instead_of_crashing(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["solve", "paper3type-llm", "--solver", "cpsat", "--time-limit", "1", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    scheduled = payload["results"]["cpsat"]["schedule"]
    if scheduled:  # a fast machine may find one within the second
        assert len(scheduled) == 50
    else:
        assert "cpsat found no schedule for the 50 jobs within --time-limit 1 s" in payload["unsolved"]["cpsat"]


# --- --gpu names ------------------------------------------------------------------------------------------


def test_an_ambiguous_gpu_name_is_an_error_listing_the_matches(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "job-tiny", "--gpu", "a100"]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" in err
    for name in ("A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-80GB", "A100-SXM4-80GB"):
        assert name in err
    assert main(["predict", "job-tiny", "--gpu", "A100-SXM4-40GB"]) == 0
    assert "A100-SXM4-40GB" in capsys.readouterr().out
    assert main(["predict", "job-tiny", "--gpu", "a100-sxm4-80g"]) == 0  # an alias that names one part


def test_the_printed_layout_shows_every_parallel_dimension_that_is_not_1() -> None:
    from frenzy_opt.core.readable import parallel_text

    parallel = {"dp": 1, "tp": 4, "pp": 2, "vpp": 1, "cp": 2, "ep": 1, "zero_stage": 1, "recompute": "none"}
    assert parallel_text(parallel).startswith("dp1 tp4 pp2 cp2")
