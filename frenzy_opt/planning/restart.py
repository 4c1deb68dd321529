"""What moving a running job costs: the restart every scheduler (ours, Sia's, Gavel's) pays to preempt, grow,
shrink or migrate a job.

A move stops the job and starts it elsewhere from a checkpoint. Its cost, in seconds of the job's time:

* **process start-up** :data:`STARTUP_S`: launching the ranks, the rendezvous and the communicators;
* **checkpoint save and load** of the whole training state -- the weights in the training format, the fp32
  master copy under mixed precision and the optimizer's states (MARP's ``optimizer_state_bytes``; Adam's
  two fp32 moments: Rajbhandari et al. 2020, Sec. 3.1) -- written by the nodes the job leaves and read by the
  nodes it goes to, each at the cluster's storage bandwidth (:class:`frenzy_opt.hardware.cluster.Storage`:
  per node, capped by the file system's total);
* **warm-up**: :data:`WARMUP_STEPS` steps at the plan's step time that make no progress (allocator growth,
  kernel autotuning, compilation).

A 70B model with AdamW in bf16 holds 70e9 x (2 + 4 + 8) bytes = 980 GB of state: on one 8-GPU node at the
default 5 GB/s each way that is 196 s to save and 196 s to load, against a few seconds on 32 nodes of a file
system without a total limit. No cap: a large job on a slow file system is expensive to move, and the
scheduler must know it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from frenzy_opt.core.enums import Precision
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.hardware.cluster import Storage
from frenzy_opt.prediction.marp.layout import DTYPE_BYTES, optimizer_state_bytes

if TYPE_CHECKING:
    from frenzy_opt.planning.problem import Option

# Start-up of a restarted job without its checkpoint I/O: Sia measured restarts of 25 s for its smallest
# models, whose checkpoints take well under a second to read (Jayaram Subramanya et al., SOSP 2023, Sec. 5;
# ../shared/BASELINES.md), so the 25 s are process start, rendezvous and communicator set-up.
STARTUP_S = 25.0
# Steps after a restart that make no progress (allocator warm-up, cuBLAS/cuDNN autotuning, torch.compile's
# first graphs): a design choice; the first steps of a run are routinely excluded from throughput figures.
WARMUP_STEPS = 3


def checkpoint_bytes(spec: JobSpec) -> float:
    """Bytes of a full training checkpoint of ``spec`` (module docstring)."""
    t = spec.training
    precision = str(t.precision)
    weights = DTYPE_BYTES["bf16" if precision == Precision.FP8 else precision]
    master = 0.0 if precision == Precision.FP32 else 4.0
    return spec.model.num_params * (weights + master + optimizer_state_bytes(t.optimizer))


def restart_s(spec: JobSpec, storage: Storage, nodes: int, step_s: float) -> float:
    """Seconds one move of ``spec`` costs on ``nodes`` nodes (leaving and arriving) at ``step_s`` per step."""
    nodes = max(nodes, 1)
    size_gb = checkpoint_bytes(spec) / 1e9
    save = size_gb / storage.write_gbyte_s(nodes)
    load = size_gb / storage.read_gbyte_s(nodes)
    return STARTUP_S + save + load + WARMUP_STEPS * max(step_s, 0.0)


def job_restart_s(spec: JobSpec, storage: Storage, options: Sequence[Option]) -> float:
    """The cost of one move of ``spec``, sized at its fastest option (the plan a move usually lands on)."""
    if not options:
        return restart_s(spec, storage, 1, 0.0)
    fastest = min(options, key=lambda o: o.plan.step_time_s or o.duration_s)
    nodes = fastest.whole_nodes if fastest.whole_nodes > 0 else 1
    return restart_s(spec, storage, nodes, fastest.plan.step_time_s or 0.0)
