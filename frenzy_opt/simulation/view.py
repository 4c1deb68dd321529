"""What a simulator policy sees and may ask: a read-only view of the cluster (:class:`ClusterView`) and the
:class:`Policy` protocol itself, beside the simulator's types it speaks of.

A policy never holds the simulator. Its view gives the topology, the free GPUs per node and which nodes are
up, the running and queued jobs, every job's state, the clock, the failure model it must plan around, and
what the policy has measured of a job (:meth:`ClusterView.observed_step_s`, as Sia and Gavel measure); the
containers are read-only views of the simulator's own (no copies per decision: a 2,048-GPU cluster is 256
nodes). Its only requests are its actions (:class:`~frenzy_opt.simulation.simulator.Start`,
:class:`~frenzy_opt.simulation.simulator.Stop`) and :meth:`ClusterView.wake_at`. Oracle policies (told every
true step time: what prediction errors cost) read :meth:`ClusterView.true_step_s`; no other policy may.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from frenzy_opt.hardware.topology import Topology
    from frenzy_opt.planning.problem import Option
    from frenzy_opt.simulation.simulator import Action, Failures, SimJob, SimJobState, Simulator


T = TypeVar("T")


class _ReadOnly(Sequence[T]):
    """A list seen through a read-only sequence (indexing, length, iteration; no assignment)."""

    __slots__ = ("_items",)

    def __init__(self, items: list[T]) -> None:
        self._items = items

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)


class ClusterView:
    """The simulator as a policy sees it (module docstring)."""

    __slots__ = ("_free", "_jobs", "_queue", "_running", "_sim", "_up")

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim
        self._free: Sequence[int] = _ReadOnly[int](sim.free)
        self._up: Sequence[bool] = _ReadOnly[bool](sim.up)
        self._jobs: Mapping[str, SimJobState] = MappingProxyType(sim.jobs)
        self._queue: Mapping[str, SimJobState] = MappingProxyType(sim.queue)
        self._running: Mapping[str, SimJobState] = MappingProxyType(sim.running)

    @property
    def topology(self) -> Topology:
        return self._sim.topology

    @property
    def free(self) -> Sequence[int]:
        """Free GPUs per node index (a node that is down keeps its count: see :attr:`up`)."""
        return self._free

    @property
    def up(self) -> Sequence[bool]:
        return self._up

    @property
    def jobs(self) -> Mapping[str, SimJobState]:
        return self._jobs

    @property
    def queue(self) -> Mapping[str, SimJobState]:
        return self._queue

    @property
    def running(self) -> Mapping[str, SimJobState]:
        return self._running

    @property
    def now(self) -> float:
        return self._sim.now

    @property
    def failures(self) -> Failures | None:
        """The failure model (a policy that checkpoints plans around it), or None."""
        return self._sim.failures

    def observed_step_s(self, job_id: str, gpu_type: str, num_gpus: int) -> float | None:
        """What the job's runs measured on (type, count) so far (:meth:`Simulator.observed_step_s`)."""
        return self._sim.observed_step_s(job_id, gpu_type, num_gpus)

    def wake_at(self, when: float) -> None:
        """Decide again at ``when`` (an event-driven policy's planned start or measurement)."""
        self._sim.wake_at(when)

    def true_step_s(self, job: SimJob, option: Option) -> float:
        """The truth's seconds per step: for oracle policies only (what they are told, not what they know)."""
        return self._sim.truth.step_s(job, option)


class Policy(Protocol):
    """A scheduling policy plugged into the simulator."""

    name: str
    round_s: float | None
    """None: decide after every event batch; else only at ticks every ``round_s`` seconds."""

    def attach(self, view: ClusterView) -> None:
        """Called once before the first event, with the view it decides from."""

    def on_arrival(self, job: SimJob, now: float) -> None: ...

    def on_end(self, job: SimJob, now: float, finished: bool) -> None:
        """A running job ended: finished, failed (``finished`` False) or was stopped by the policy."""

    def on_node(self, node: int, now: float, up: bool, until_s: float) -> None:
        """A node failed (``up`` False, back at ``until_s``) or was repaired."""

    def decide(self, now: float) -> list[Action]: ...
