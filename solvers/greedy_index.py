"""The greedy HAS's indexes: what one decision of :class:`frenzy_opt.solvers.greedy.GreedyState` would otherwise
recompute per job and per option, kept once.

* :class:`RankOrder`: the queue in rank order, kept by bisection as jobs are put and leave (a decision used to
  filter the whole previous order in Python whenever a job had left it).
* :class:`ShapeBook`: per GPU type and decision, everything about a placement shape that does not depend on the
  job: the nodes it takes now, whether it fits beside the type's reservation, and the earliest start of a wait
  for it (the horizon's end it waits for, pushed past the reservation when it does not fit beside it) before
  the queue-ahead floor. A job's options are then priced with a dictionary look-up and a few arithmetic
  operations each (:func:`price_options`), instead of a binary search over the type's running jobs per option.
  Jobs draw their shapes from a few per type (1 to the node size inside a node, a few whole-node counts), so a
  decision over a deep queue fills each book once and reads it for every job.

Both are exact accelerations: the decisions are those of the plain pricing (``GreedyState(fast=False)``), which
``tests/test_greedy_index.py`` checks on random instances, GPU for GPU and second for second.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from frenzy_opt.planning.problem import Option, ProblemJob

if TYPE_CHECKING:
    from frenzy_opt.hardware.placement import FreeIndex

RankKey = tuple[float, float, float, str]
_UNKNOWN = ()  # a shape not yet looked up (no placement is empty)


class RankOrder:
    """Queued jobs sorted by their rank key (unique: it ends with the job's id)."""

    def __init__(self) -> None:
        self.keys: list[RankKey] = []
        self.jobs: list[ProblemJob] = []
        self.of: dict[str, tuple[RankKey, ProblemJob]] = {}

    def put(self, key: RankKey, job: ProblemJob) -> None:
        """Insert ``job`` under ``key`` (replacing the job of the same id, if any)."""
        self.drop(job.id)
        i = bisect.bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.jobs.insert(i, job)
        self.of[job.id] = (key, job)

    def drop(self, job_id: str) -> None:
        """Remove the job of id ``job_id`` if it is here."""
        found = self.of.pop(job_id, None)
        if found is None:
            return
        i = bisect.bisect_left(self.keys, found[0])
        assert self.jobs[i] is found[1]
        del self.keys[i]
        del self.jobs[i]

    def sync(
        self, touched: Sequence[str], current: Callable[[str], ProblemJob | None], rank: Callable[[ProblemJob], RankKey]
    ) -> None:
        """Bring the order up to date for the ids ``touched`` since the last sync: ``current(id)`` is the job
        queued under that id now (None: none)."""
        for job_id in touched:
            job = current(job_id)
            held = self.of.get(job_id)
            if held is not None and held[1] is job:
                continue
            if job is None:
                self.drop(job_id)
            else:
                self.put(rank(job), job)


class Reserved(Protocol):
    """What :class:`ShapeBook` reads of a type's reservation (``greedy._Reservation``)."""

    start: float
    end: float
    left: dict[int, int]

    def fits_alongside(self, option: Option) -> bool: ...


class Horizon(Protocol):
    """What :class:`ShapeBook` reads of a type's horizon (``greedy._Horizon``)."""

    ends: list[float]

    def earliest(self, option: Option) -> int: ...


@dataclass(slots=True)
class ShapeBook:
    """One GPU type's shapes in one decision, keyed by (GPUs, whole nodes); dropped when a job starts on the
    type or the type gets its reservation (what it holds depends on both)."""

    free: FreeIndex
    reservation: Reserved | None
    horizon: Callable[[], Horizon]
    """The type's horizon in this decision (built on first use)."""
    nodes: dict[tuple[int, int], tuple[int, ...] | None] = field(default_factory=dict)
    beside: dict[tuple[int, int], bool] = field(default_factory=dict)
    waits: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)

    def fits_beside(self, option: Option, nodes: tuple[int, ...]) -> bool:
        """Whether the shape on ``nodes`` leaves the reservation whole if it runs past the reserved start."""
        key = (option.num_gpus, option.whole_nodes)
        found = self.beside.get(key)
        if found is None:
            assert self.reservation is not None
            left, part = self.reservation.left, option.gpus_per_node
            found = self.beside[key] = all(left[n] >= part for n in nodes)
        return found

    def wait(self, option: Option, now: float) -> tuple[float, int]:
        """The earliest start of a wait for the shape before the queue-ahead floor (inf: never), and the index
        of the running job's end it waits for (-1: none it knows of)."""
        key = (option.num_gpus, option.whole_nodes)
        found = self.waits.get(key)
        if found is None:
            view = self.horizon()
            index = view.earliest(option)
            start = float("inf") if index < 0 else max(view.ends[index], now)
            reservation = self.reservation
            if reservation is not None and start >= reservation.start and not reservation.fits_alongside(option):
                start = max(start, reservation.end)  # it queues behind the reserved job
            found = self.waits[key] = (start, index)
        return found


@dataclass(slots=True)
class Priced:
    """A job's best option so far (``greedy._Choice`` once chosen): ``nodes`` None for a wait."""

    cost: float
    end: float
    option: Option
    nodes: tuple[int, ...] | None
    wait_for: int


@dataclass(frozen=True, slots=True)
class Pricing:
    """What pricing a job's options reads from the decision (see ``GreedyState._price``)."""

    now: float
    weight: float
    deadline_s: float | None
    used_scale: float
    """The queue's price of one GPU-second for this job before division by the cluster's GPUs: queue price x
    weight behind it."""
    gpus: int
    books: dict[str, ShapeBook]
    """The decision's shape books by GPU type (``make_book`` adds a missing one)."""
    make_book: Callable[[str], ShapeBook]
    floors: dict[str, float]
    """The decision's queue-ahead floor by GPU type: when a wait could start at the earliest, with the work
    ahead on the type spread over its GPUs (``make_floor`` adds a missing one)."""
    make_floor: Callable[[str], float]
    allows: Callable[[Option], bool] | None
    late_penalty: float
    wait_gain: float


def price_options(
    options: Sequence[Option], pricing: Pricing, now_only: bool, best: Priced | None
) -> tuple[Priced | None, bool, bool]:
    """One pass of ``GreedyState._choose`` over ``options`` (shortest first) with the shape books: the best
    option (or ``best`` kept), whether admission refused an option and whether it let one through. The same
    operations in the same order as ``GreedyState._price``, so the same floating-point costs."""
    now, weight, deadline, gpus = pricing.now, pricing.weight, pricing.deadline_s, pricing.gpus
    books, floors, allows, scale = pricing.books, pricing.floors, pricing.allows, pricing.used_scale
    refused = admitted = False
    for option in options:
        duration = option.duration_s
        if best is not None and best.cost <= weight * duration:
            break  # this option and every longer one cost no less than the best so far
        if allows is not None and not allows(option):
            refused = True
            continue
        admitted = True
        gpu_type = option.gpu_type
        book = books.get(gpu_type) or pricing.make_book(gpu_type)
        key = (option.num_gpus, option.whole_nodes)
        nodes = book.nodes.get(key, _UNKNOWN)
        if nodes is _UNKNOWN:
            nodes = book.nodes[key] = book.free.fit(option)
        reservation = book.reservation
        fits_now = nodes is not None and (
            reservation is None or now + duration <= reservation.start or book.fits_beside(option, nodes)
        )
        if now_only and not fits_now:
            continue
        used = scale * option.num_gpus * duration / gpus
        index = -1
        if fits_now:
            end = now + duration
        else:
            floor = floors.get(gpu_type)
            if floor is None:
                floor = pricing.make_floor(gpu_type)
            if best is not None and best.cost <= weight * (floor + duration - now) + used:
                continue  # even the queue ahead alone makes it cost no less than the best
            found = book.waits.get(key)
            start, index = book.wait(option, now) if found is None else found
            start = max(start, floor)
            end, nodes = start + duration, None
        cost = weight * (end - now) + used
        if deadline is not None and end > deadline:
            cost += pricing.late_penalty * weight * (end - deadline)
        # impatient: waiting must beat the best plan that fits now by the wait gain
        waits_instead = nodes is None and best is not None and best.nodes is not None
        if best is None or cost < best.cost * (pricing.wait_gain if waits_instead else 1.0):
            best = Priced(cost=cost, end=end, option=option, nodes=nodes, wait_for=index)
    return best, refused, admitted
