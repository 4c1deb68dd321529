"""The greedy HAS's queue index: what one decision of :class:`frenzy_opt.solvers.greedy.GreedyState` reads of the
queue without walking it.

* :class:`Queue`: the queue as a dict that notes the ids put or taken, so the index is brought up to date from
  the changes alone.
* :class:`RankOrder`: the queued jobs sorted by their rank key, kept by bisection as jobs are put and leave (a
  decision iterates it in place, and finds a job's position by bisection); with it

  - the weight queued in all (the first job's "weight behind" in the marginal cost), a running sum;
  - per GPU type, the keys of the queued jobs by the fewest GPUs any of their options takes on the type (a few
    distinct counts: 1 to the node size, a few whole-node counts), each list in rank order: the jobs that can
    fit the type's largest free block now are the lists of needs up to that block, merged in rank order
    (:meth:`RankOrder.fitting`), so a decision looks at no job that fits nowhere;
  - per GPU type, the GPU-seconds the queued jobs last planned to wait for there (:meth:`RankOrder.plan`; a job
    never planned counts its option of fewest GPU-seconds, the plan the marginal cost picks behind a long
    queue), a running sum: the work a bounded decision did not price still counts in the queue ahead.

Every update costs a bisection and a list insertion or deletion (a memory move, O(queue) at C speed); nothing
here runs Python code per queued job.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from frenzy_opt.planning.problem import ProblemJob

RankKey = tuple[float, float, float, str]


class Queue(dict[str, ProblemJob]):
    """The queue: a dict that notes the ids put or taken since the index was last brought up to date
    (:meth:`RankOrder.sync`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.touched: list[str] = list(self)

    def __setitem__(self, key: str, value: ProblemJob) -> None:
        super().__setitem__(key, value)
        self.touched.append(key)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.touched.append(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.touched.append(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, ProblemJob]:
        key, job = super().popitem()
        self.touched.append(key)
        return key, job

    def clear(self) -> None:
        self.touched += list(self)
        super().clear()

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


def fewest_gpus(job: ProblemJob) -> dict[str, int]:
    """The fewest GPUs any of the job's options takes, per GPU type it has options on."""
    fewest: dict[str, int] = {}
    for option in job.options:
        fewest[option.gpu_type] = min(option.num_gpus, fewest.get(option.gpu_type, option.num_gpus))
    return fewest


def leanest_work(job: ProblemJob) -> tuple[str, float]:
    """The GPU type and GPU-seconds of the job's option of fewest GPU-seconds ("", 0 without options)."""
    option = min(job.options, key=lambda o: o.num_gpus * o.duration_s, default=None)
    return ("", 0.0) if option is None else (option.gpu_type, option.num_gpus * option.duration_s)


class TypePrices:
    """What a GPU-second of each type is worth to the jobs queued behind: each type's speed per GPU relative to
    the others, as the jobs seen so far show it, over the cluster's capacity in those units.

    A job's leanest GPU-seconds on a type (its option of fewest GPU-seconds there) measure how fast the type runs
    it; across the job's types their logarithms, less their mean, are the type's log slowness for that job, and a
    type's speed is the geometric mean over the jobs of the inverse (the jobs' own step-time predictions are the
    measurements; with every job on every type it is the least-squares fit of log GPU-seconds = job + type). A
    GPU-second of a type then costs speed / sum over types of (GPUs x speed): the share of the cluster's work per
    second it holds, as Gavel normalises each type's throughput to compare allocations across types (Narayanan et
    al., OSDI 2020, section 3.1). On one type, 1 / GPUs, the fluid price of the module docstring of
    :mod:`frenzy_opt.solvers.greedy`. A type no job with options on two types has shown is taken at the mean."""

    def __init__(self, capacity: dict[str, int]) -> None:
        self.capacity = capacity
        self._sums = dict.fromkeys(capacity, 0.0)
        self._counts = dict.fromkeys(capacity, 0)
        self._seen: set[str] = set()
        self._price: dict[str, float] = {}
        self.version = 0
        """Updates of :attr:`price` so far."""
        self._stale = True

    def add(self, job: ProblemJob) -> None:
        """Count ``job``'s options in (once per job id)."""
        if job.id in self._seen:
            return
        self._seen.add(job.id)
        lean: dict[str, float] = {}
        for option in job.options:
            work = option.num_gpus * option.duration_s
            if work > 0 and option.gpu_type in self._sums:
                lean[option.gpu_type] = min(work, lean.get(option.gpu_type, work))
        if len(lean) < 2:
            return
        logs = {t: math.log(w) for t, w in lean.items()}
        mean = sum(logs.values()) / len(logs)
        for gpu_type, value in logs.items():
            self._sums[gpu_type] += value - mean
            self._counts[gpu_type] += 1
        self._stale = True

    @property
    def price(self) -> dict[str, float]:
        """Per GPU type, what a GPU-second of it costs (class docstring); brought up to date when read."""
        if self._stale:
            self._update()
        return self._price

    def _update(self) -> None:
        self._stale = False
        speed = {t: math.exp(-self._sums[t] / n) if (n := self._counts[t]) else 1.0 for t in self.capacity}
        total = sum(self.capacity[t] * speed[t] for t in self.capacity) or 1.0
        self._price = {t: speed[t] / total for t in self.capacity}
        self.version += 1


class RankOrder:
    """Queued jobs sorted by their rank key (unique: it ends with the job's id), with the sums and the per-type
    need lists of the module docstring."""

    def __init__(self) -> None:
        self.keys: list[RankKey] = []
        self.jobs: list[ProblemJob] = []
        self.of: dict[str, tuple[RankKey, ProblemJob]] = {}
        self.weight = 0.0
        """The weight of every queued job."""
        self.needs: dict[str, dict[int, list[RankKey]]] = {}
        """Per GPU type, per fewest GPU count there: the keys of the jobs of that need, in rank order."""
        self.fewest: dict[str, dict[str, int]] = {}
        self.planned: dict[str, tuple[str, float]] = {}
        """Per queued job: the GPU type and GPU-seconds it last planned to wait for (see :meth:`plan`)."""
        self.planned_work: dict[str, float] = {}
        """Per GPU type: the sum of :attr:`planned` there."""

    def __len__(self) -> int:
        return len(self.keys)

    def put(self, key: RankKey, job: ProblemJob) -> None:
        """Insert ``job`` under ``key`` (replacing the job of the same id, if any)."""
        self.drop(job.id)
        i = bisect.bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.jobs.insert(i, job)
        self.of[job.id] = (key, job)
        self.weight += job.weight
        fewest = self.fewest[job.id] = fewest_gpus(job)
        for gpu_type, need in fewest.items():
            bisect.insort(self.needs.setdefault(gpu_type, {}).setdefault(need, []), key)
        self.plan(job.id, *leanest_work(job))

    def drop(self, job_id: str) -> None:
        """Remove the job of id ``job_id`` if it is here."""
        found = self.of.pop(job_id, None)
        if found is None:
            return
        key, job = found
        i = bisect.bisect_left(self.keys, key)
        assert self.jobs[i] is job
        del self.keys[i]
        del self.jobs[i]
        self.weight = self.weight - job.weight if self.of else 0.0  # no drift left once the queue is empty
        for gpu_type, need in self.fewest.pop(job_id).items():
            keys = self.needs[gpu_type][need]
            del keys[bisect.bisect_left(keys, key)]
        self.plan(job_id, "", 0.0)
        del self.planned[job_id]
        if not self.of:
            self.planned_work = {}

    def plan(self, job_id: str, gpu_type: str, work: float) -> None:
        """The job now plans ``work`` GPU-seconds on ``gpu_type`` (it chose to wait for such an option)."""
        old_type, old_work = self.planned.get(job_id, ("", 0.0))
        if old_type:
            self.planned_work[old_type] = max(self.planned_work[old_type] - old_work, 0.0)
        if gpu_type:
            self.planned_work[gpu_type] = self.planned_work.get(gpu_type, 0.0) + work
        self.planned[job_id] = (gpu_type, work)

    def position(self, key: RankKey) -> int:
        """How many queued jobs rank before ``key``."""
        return bisect.bisect_left(self.keys, key)

    def fitting(self, reach: dict[str, int], after: RankKey | None) -> Iterator[ProblemJob]:
        """The queued jobs ranked after ``after`` (all: None) whose fewest GPUs on some type are at most that
        type's ``reach``, in rank order, each once: a merge of the need lists up to each reach."""
        lists: list[Iterator[RankKey]] = []
        for gpu_type, most in reach.items():
            for need, keys in self.needs.get(gpu_type, {}).items():
                if need <= most and keys:
                    start = 0 if after is None else bisect.bisect_right(keys, after)
                    if start < len(keys):
                        lists.append(_tail(keys, start))
        last = None
        for key in heapq.merge(*lists):
            if key != last:
                last = key
                yield self.of[key[3]][1]

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


def _tail(keys: list[RankKey], start: int) -> Iterator[RankKey]:
    """``keys[start:]`` without the copy (read while no job enters or leaves the queue)."""
    for i in range(start, len(keys)):
        yield keys[i]
