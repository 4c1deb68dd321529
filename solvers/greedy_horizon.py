"""When GPUs of a type free up, for the greedy HAS (:mod:`frenzy_opt.solvers.greedy`): its running jobs, the
horizon of a type (how many must end before a placement shape fits) and EASY backfilling's reservation.
Nothing here depends on the queue."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass

from frenzy_opt.hardware.placement import FreeIndex, choose
from frenzy_opt.planning.problem import Option, ProblemJob


@dataclass(slots=True)
class Running:
    end_s: float
    job: str
    nodes: tuple[int, ...]
    per_node: int
    gpu_type: str = ""
    released: bool = False
    option: Option | None = None
    problem: ProblemJob | None = None
    """The job as it was started (None: a hold, or a run adopted after a restart of the orchestrator)."""
    start_s: float = 0.0
    seq: int = 0

    @property
    def num_gpus(self) -> int:
        return self.per_node * len(self.nodes)


class Horizon:
    """When a placement shape of one GPU type can start: the type's running jobs in end order and, after
    each end, the largest free block on one node and the number of wholly free nodes (both only grow, so a
    shape's earliest start is a binary search). Extended lazily: a decision walks only as far as its
    queries need."""

    def __init__(self, index: FreeIndex, runs: list[tuple[float, int, Running]]) -> None:
        self.index, self.runs, self.pos = index, runs, 0
        self.freed: dict[int, int] = {}
        self.block = max((left for left in range(index.size + 1) if index.buckets[left]), default=0)
        self.whole = len(index.buckets[index.size])
        self.ends: list[float] = []
        self.blocks: list[int] = []
        self.wholes: list[int] = []

    def _extend(self) -> None:
        end, _, run = self.runs[self.pos]
        self.pos += 1
        size = self.index.size
        if run.per_node == size:  # it held its nodes whole: they are free once it ends (no per-node walk)
            self.whole += len(run.nodes)
            self.block = size
        else:
            for node in run.nodes:
                after = self.freed[node] = self.freed.get(node, self.index.free[node]) + run.per_node
                self.block = max(self.block, after)
                if after == size:
                    self.whole += 1
        self.ends.append(end)
        self.blocks.append(self.block)
        self.wholes.append(self.whole)

    def earliest(self, option: Option) -> int:
        """How many running jobs (in end order) must end before the option's placement fits, minus one:
        the index of the end it waits for; -1 if never. Like the rescan it replaces, an option that fits
        already (blocked by a reservation) waits for the first end."""
        values, need = (self.blocks, option.num_gpus) if option.whole_nodes == 0 else (self.wholes, option.whole_nodes)
        i = bisect.bisect_left(values, need)
        if i < len(values):
            return i
        while self.pos < len(self.runs):
            self._extend()
            if values[-1] >= need:
                return len(values) - 1
        return -1

    def free_after(self, i: int) -> dict[int, int]:
        """Free GPUs per node of the type once the first ``i + 1`` running jobs have ended."""
        free = dict(self.index.free)
        for _, _, run in self.runs[: i + 1]:
            for node in run.nodes:
                free[node] += run.per_node
        return free


class Reservation:
    """EASY backfilling's reservation for the first waiting job of a GPU type (Lifka 1995; Mu'alem &
    Feitelson 2001): its start, its end, and the GPUs per node that stay free at its start once it has
    taken its own — the "extra" GPUs a job may backfill onto even if it runs past the reserved start."""

    def __init__(self, option: Option, start: float, free: dict[int, int], size: int) -> None:
        self.start, self.end, self.size = start, start + option.duration_s, size
        self.left = free
        # Nodes per free count (``free`` lists nodes in ascending order, so the first match is the lowest).
        self.counts = [0] * (size + 1)
        for left, many in Counter(free.values()).items():
            self.counts[left] = many
        nodes = choose(option, free, size)
        assert nodes is not None  # the reserved start is when the option fits
        for n in nodes:
            self._set(n, free[n] - option.gpus_per_node)
        self._fits: dict[tuple[int, int], bool] = {}

    def _set(self, node: int, left: int) -> None:
        self.counts[self.left[node]] -= 1
        self.counts[left] += 1
        self.left[node] = left

    def take(self, nodes: tuple[int, ...], per_node: int) -> bool:
        """Whether a job on ``nodes`` (``per_node`` GPUs each) running past the reserved start leaves the
        reservation whole; if so, its GPUs are counted out of the extra ones."""
        if any(self.left[n] < per_node for n in nodes):
            return False
        for n in nodes:
            self._set(n, self.left[n] - per_node)
        self._fits.clear()
        return True

    def fits_alongside(self, option: Option) -> bool:
        """Whether the option's shape still fits at the reserved start next to the reserved job."""
        key = (option.num_gpus, option.whole_nodes)
        found = self._fits.get(key)
        if found is None:
            if option.whole_nodes == 0:
                found = any(self.counts[v] for v in range(option.num_gpus, self.size + 1))
            else:
                found = self.counts[self.size] >= option.whole_nodes
            self._fits[key] = found
        return found
