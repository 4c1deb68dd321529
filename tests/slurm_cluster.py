"""A throwaway single-node Slurm cluster for tests: munged, slurmctld and slurmd started from a generated
configuration in a temporary folder, with typed GRES ``gpu:<type>:<n>`` backed by placeholder device files
(this machine has no GPUs). Needs Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them) and root
(as in CI and the sessions here)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from frenzy_opt.core.machine import free_port


def available() -> str | None:
    """Why the cluster cannot start here, or None."""
    for tool in ("slurmctld", "slurmd", "munged", "sbatch", "scontrol"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (Debian packages slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "needs root to start the Slurm daemons"
    return None


@contextmanager
def slurm_cluster(root: Path, gres_type: str, gpus: int, cpus: int | None = None) -> Iterator[dict[str, str]]:
    """Start the daemons; yields the environment (``SLURM_CONF``) for sbatch/scontrol; stops them after."""
    root.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    cpus = cpus or os.cpu_count() or 1
    devices = []
    for i in range(gpus):
        device = root / f"fake-gpu{i}"
        device.touch()
        devices.append(str(device))
    (root / "state").mkdir(exist_ok=True)
    (root / "spool").mkdir(exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=frenzytest",
                f"SlurmctldHost={host}",
                "AuthType=auth/munge",
                "SlurmUser=root",
                f"SlurmctldPort={free_port()}",
                f"SlurmdPort={free_port()}",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'slurmd.log'}",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "MpiDefault=none",
                "ReturnToService=2",
                "GresTypes=gpu",
                "JobCompType=jobcomp/none",
                "AccountingStorageType=accounting_storage/none",
                "SchedulerType=sched/builtin",
                f"NodeName={host} CPUs={cpus} Gres=gpu:{gres_type}:{gpus} State=UNKNOWN",
                f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        ),
        encoding="utf-8",
    )
    (root / "gres.conf").write_text(
        f"NodeName={host} Name=gpu Type={gres_type} File={','.join(devices)}\n", encoding="utf-8"
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munge_socket = root / "munge.socket"
    munged = subprocess.Popen(
        [
            "munged",
            "--foreground",
            "--force",
            f"--socket={munge_socket}",
            f"--pid-file={root / 'munged.pid'}",
            f"--log-file={root / 'munged.log'}",
            f"--seed-file={root / 'munged.seed'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # Slurm's auth/munge plugin finds the daemon through this socket path.
    (root / "slurm.conf").write_text(
        conf.read_text(encoding="utf-8").replace(
            "AuthType=auth/munge", f"AuthType=auth/munge\nAuthInfo=socket={munge_socket}"
        ),
        encoding="utf-8",
    )
    daemons = [munged]
    try:
        time.sleep(0.5)
        daemons.append(
            subprocess.Popen(
                ["slurmctld", "-D", "-c", "-f", str(conf)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        daemons.append(
            subprocess.Popen(
                ["slurmd", "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout.strip()
            if out in ("idle", "mix", "alloc"):
                break
            if time.monotonic() > deadline:
                logs = "".join(
                    (root / name).read_text(errors="replace")[-1500:]
                    for name in ("slurmctld.log", "slurmd.log")
                    if (root / name).exists()
                )
                raise RuntimeError(f"the Slurm node did not come up (sinfo: {out!r}): {logs}")
            time.sleep(0.3)
        yield env
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in reversed(daemons):
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                daemon.kill()
