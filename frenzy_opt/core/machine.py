"""This machine: what a benchmark ran on (CPU model, package versions, load average, for result headers), and a
free TCP port on it."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_version(dist: str) -> str:
    """The installed version of distribution ``dist``, or "not installed"."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def load_average() -> str:
    """The 1/5/15-minute load averages as "a/b/c", or "n/a" where the OS has none."""
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def describe_machine() -> str:
    """One line for a result header: CPU, cores, Python and solver versions, load average."""
    return (
        f"{cpu_model()}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}, "
        f"ortools {package_version('ortools')}, highspy {package_version('highspy')}, load {load_average()}"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the kernel's pick for port 0; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
