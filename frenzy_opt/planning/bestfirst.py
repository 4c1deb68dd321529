"""The fastest plan per (GPU type, count) found best-first: candidates in the order of their step time, memory
predicted only for the few that come first.

:func:`frenzy_opt.planning.fastest.fastest_plans` screens every candidate's memory and prices it on every GPU
before it decides; on a 2,048-GPU cluster that is thousands of candidates and most of a second for one job.
Here each (GPU type, count) keeps a heap of its candidates keyed by step time and pops them in that order; the
first whose plan fits (and that the full search reaches) wins, with the same tie rule. What makes it fast:

* **An estimate from shared parts.** A candidate's step time is its micro-batch parts
  (:func:`frenzy_opt.prediction.stepeval.microbatch_time`: layers, output layer, tensor/context/expert
  collectives, all independent of dp) assembled with the fields that depend on dp and the pipeline depth
  (:func:`frenzy_opt.prediction.stepeval.assemble`). The layer and collective parts are proportional to the
  stage's layers (every GEMM count, FLOP and byte volume of them is, :mod:`frenzy_opt.prediction.stepterms`),
  so the micro-batch parts are priced once per (tp, cp, micro-batch, recompute, sequence parallelism, ep) and
  GPU (:func:`parts_key`) and scaled to any pp, and the dp- and depth-dependent fields come from one reference
  terms per *family* (:func:`family_key`: the same without recompute, with the ZeRO stage, vpp and whether
  pp > 1): the data-parallel bytes, the optimizer's bytes and the stage's layers scale by ``pp_ref / pp``, the
  optimizer's by ``dp_ref / dp`` when its states are sharded, and the rest is arithmetic on dp. Every candidate
  first enters its heap at a cheaper lower bound from the parts alone (its micro-batches, bubble and fixed
  costs) and is estimated only when that comes first. The estimate equals the step time up to rounding
  (``tests/test_bestfirst.py`` checks 1e-10 on every candidate of several jobs); a heap key is the estimate less
  :data:`ROUNDING`, so it never exceeds the step time, and an entry popped on its estimate is priced exactly
  (:func:`frenzy_opt.prediction.stepterms.cached_step_terms`, what the full search prices) and pushed back.
* **More recompute on demand.** More recompute only lengthens a micro-batch's layers (more FLOPs, layer
  executions and elementwise passes), so the same layout with the next recompute mode takes at least this
  one's compute, bubble, optimizer, sends and fixed costs (:func:`follower_bound`; not its collectives or
  data-parallel traffic: the model hides more of those behind longer layers, and a step with recompute can
  come out faster). It enters the heap at that bound, and is estimated only when the bound comes first.
* **Memory floors first, the rest on demand.** A candidate enters its heap only when its shape's memory floor
  (:func:`frenzy_opt.planning.candidates.lower_bound`) fits at the shape's largest dp (the full search's test
  of the shape) and its offered floor (the same with the states sharded at the deepest ZeRO stage the search
  offers, far tighter under Megatron-core) at its own dp; one that does not is replaced by the same layout
  with the next recompute that does (nearly every candidate comes first in some heap, so the floors are worked
  out as the heaps are built, once per shape and dp for all the groups of a training config,
  :class:`frenzy_opt.planning.candidates.ShapeFloors`). It is priced exactly only when its bound without the
  allocator reserve fits and, at a dp >= 2, such a bound fits some GPU at every larger dp of its shape; and its
  plan is judged as the full search judges it (:meth:`frenzy_opt.planning.group.GpuGroup.resolve`) when it
  comes first, after the dp scan's reach (a dp >= 2 counts only when every larger dp of its shape had a plan on
  some GPU of the group), each worked out once per shape and level.

Measured layer profiles (``StepTimeModel.profiles``) replace the layers' time by measured times that need not
scale with the layer count, and a plan filter sends refused layouts to stand-ins: the screening search serves
those (:func:`frenzy_opt.planning.fastest.fastest_plans`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from frenzy_opt.core.plan import Plan
from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.core.spec import JobSpec, ParallelConfig
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.planning.candidates import (
    RECOMPUTE_ORDER,
    Shape,
    ShapeFloors,
    config_of,
    dp_choices_of,
    layout_choices,
    shapes,
)
from frenzy_opt.planning.group import Candidate, GpuGroup
from frenzy_opt.planning.plans import rank_key
from frenzy_opt.prediction.stepeval import (
    MicrobatchTime,
    StepTime,
    microbatch_time,
    parts_total,
    per_microbatch_s,
    step_parts,
)
from frenzy_opt.prediction.stepterms import StepTerms, cached_step_terms

Admit = Callable[[str, int], bool]
"""Whether a (GPU type, GPU count) is wanted at all (e.g. the placement rule places that many GPUs); a pure
function (a search may ask once per pair and keep the answer)."""

ROUNDING = 1e-9
"""Relative slack of an estimate's heap key: the estimate reassociates the step time's floating-point sums
(measured within 1e-12 of it; ``tests/test_bestfirst.py`` asserts 1e-10)."""


class _DpView(NamedTuple):
    """The dp- and depth-dependent fields of a candidate's terms (:class:`frenzy_opt.prediction.stepeval.DpTerms`)
    derived from its family's reference terms."""

    microbatches: int
    pp: int
    vpp: int
    balanced: bool
    num_gpus: int
    pp_stride: int
    pipeline_bytes: float
    collective_calls: tuple[float, float, float, float]
    dp_group: int
    dp_stride: int
    dp_allreduce_bytes: float
    dp_microbatch_bytes: float
    optimizer_bytes: float
    optimizer_share: float
    stage_layers: float
    runtime: str
    model_flops: float


def family_key(shape: Shape, ep: int, zero: int) -> tuple[object, ...]:
    """Candidates whose step times one reference's terms give with their own micro-batch parts (module
    docstring): all but pp, dp and the recompute mode fixed (recompute changes only the micro-batch parts and
    the model FLOPs, which the step time does not read), and whether there is a pipeline at all."""
    return (shape.tp, shape.cp, shape.micro_batch_size, shape.sequence_parallel, ep, zero, shape.vpp, shape.pp > 1)


def parts_key(shape: Shape, ep: int) -> tuple[object, ...]:
    """Candidates that share their micro-batch parts (:class:`MicrobatchTime`) up to the pp scaling: the
    ZeRO stage, vpp and dp change only what :func:`frenzy_opt.prediction.stepeval.assemble` adds."""
    return (shape.tp, shape.cp, shape.micro_batch_size, shape.recompute, shape.sequence_parallel, ep)


def _rescaled(parts: MicrobatchTime, ratio: float) -> MicrobatchTime:
    return MicrobatchTime(
        layers_s=parts.layers_s * ratio,
        output_s=parts.output_s,
        comm_s=parts.comm_s * ratio,
        overhead_s=parts.overhead_s,
        hbm_bytes_s=parts.hbm_bytes_s,
        update_s=parts.update_s,
    )


def _view(group: GpuGroup, ref: StepTerms, pp: int, dp: int) -> _DpView:
    ratio = ref.pp / pp
    ref_dp = ref.dp_group // ref.cp
    sharing = ref.dp_group / (dp * ref.cp) if ref.sharded else 1.0
    return _DpView(
        microbatches=group.job.training.num_micro_batches(dp, ref.micro_batch_size),
        pp=pp,
        vpp=ref.vpp,
        balanced=ref.balanced,
        num_gpus=ref.num_gpus // (ref_dp * ref.pp) * dp * pp,
        pp_stride=ref.pp_stride // ref_dp * dp,
        pipeline_bytes=ref.pipeline_bytes,
        collective_calls=ref.collective_calls,
        dp_group=dp * ref.cp,
        dp_stride=ref.dp_stride,
        dp_allreduce_bytes=ref.dp_allreduce_bytes * ratio,
        dp_microbatch_bytes=ref.dp_microbatch_bytes * ratio,
        optimizer_bytes=ref.optimizer_bytes * ratio * sharing,
        optimizer_share=1 / (dp * ref.cp) if ref.sharded else 1.0,
        stage_layers=ref.stage_layers * ratio,
        runtime=ref.runtime,
        model_flops=ref.model_flops,
    )


_Key = tuple[int, int, int, int]
"""A candidate: (shape index, dp, ep, ZeRO stage)."""
_Entry = tuple[float, int, int, int, _Key]
"""A heap entry: (key seconds, recompute rank, sequence, state, candidate). The state says what the key is: a
lower bound (:data:`_BOUND`), the estimate (:data:`_ESTIMATE`) or the step time (:data:`_EXACT`)."""
_BOUND, _ESTIMATE, _EXACT = 0, 1, 2


def follower_bound(step: StepTime) -> float:
    """A lower bound of the step time of the same candidate with the next recompute mode, from this one's
    (module docstring): its compute, bubble, optimizer, sends and fixed costs. More recompute only adds to
    the micro-batch's layers, and those parts grow with them; the collectives and the data-parallel traffic
    are left out because longer layers hide more of them."""
    return _follower_bound(step.compute_s, step.bubble_s, step.optimizer_s, step.pipeline_p2p_s, step.overhead_s)


def _follower_bound(compute: float, bubble: float, optimizer: float, p2p: float, overhead: float) -> float:
    """:func:`follower_bound` of a step time's parts (:func:`step_parts`)."""
    return compute + bubble + optimizer + p2p + overhead


class ShapeSpace:
    """A job's shapes on ``gpus_per_node``-GPU nodes and at most ``max_gpus`` GPUs (:func:`shapes`), with what the
    best-first search reads of each: its dp choices, its recompute's rank in :data:`RECOMPUTE_ORDER`, its follower
    (the same layout with the next recompute), and its (ep, ZeRO stage) pairs per dp. They read the model, the
    training config and the pinned fields, not the GPU or its attention kernel, so the searches of the GPU
    groups of one training config, node size and GPU count may share one
    (:func:`frenzy_opt.planning.fastest.fastest_plans`)."""

    def __init__(self, job: JobSpec, gpus_per_node: int, max_gpus: int) -> None:
        self.job, self.gpus_per_node, self.max_gpus = job, gpus_per_node, max_gpus
        self.shapes = list(shapes(job, gpus_per_node, max_gpus))
        self.dps = dp_choices_of(job, self.shapes, max_gpus)
        self.ranks = [RECOMPUTE_ORDER.index(shape.recompute) for shape in self.shapes]
        # The next shape with the same layout and the next recompute in RECOMPUTE_ORDER (shapes() makes the
        # recompute the innermost choice).
        self.successor: list[int | None] = [None] * len(self.shapes)
        for i in range(len(self.shapes) - 1):
            a, b = self.shapes[i], self.shapes[i + 1]
            if _same_layout(a, b) and self.ranks[i + 1] > self.ranks[i]:
                self.successor[i] = i + 1
        self._layouts: dict[tuple[int, int, int, int], list[tuple[int, int]]] = {}

    def matches(self, job: JobSpec, gpus_per_node: int, max_gpus: int) -> bool:
        """Whether this is the space of ``job`` (its attention kernel aside) on such nodes and GPU count."""
        mine = self.job
        return (mine.model, mine.training, mine.pinned, mine.parallel) == (
            job.model, job.training, job.pinned, replace(job.parallel, attention=mine.parallel.attention)
        ) and (self.gpus_per_node, self.max_gpus) == (gpus_per_node, max_gpus)  # fmt: skip

    def layouts(self, shape: Shape, dp: int) -> list[tuple[int, int]]:
        """:func:`layout_choices`, which depends on the shape's tp, pp and cp only."""
        lkey = (shape.tp, shape.pp, shape.cp, dp)
        found = self._layouts.get(lkey)
        if found is None:
            found = self._layouts[lkey] = layout_choices(self.job, shape, dp)
        return found


class GroupBestFirst:
    """The best-first search (module docstring) over one GPU group; ``floors`` and ``space`` may be shared with
    the searches of other groups of the same training config (:class:`ShapeFloors`), and of the same node size
    and GPU count (:class:`ShapeSpace`)."""

    def __init__(
        self,
        group: GpuGroup,
        headroom: float,
        gpus_per_node: int,
        max_gpus: int,
        admit: Admit | None,
        floors: ShapeFloors | None = None,
        space: ShapeSpace | None = None,
    ) -> None:
        self.group, self.headroom = group, headroom
        if floors is None:
            floors = ShapeFloors(group.base)
        assert floors.job.training == group.base.training, "shape floors shared across training configs"
        self.shape_floors = floors
        self.admit = admit
        self.gpus = {gpu.name: gpu for link_gpus in group.by_link for gpu in link_gpus}
        job = group.base
        if space is None:
            space = ShapeSpace(job, gpus_per_node, max_gpus)
        assert space.matches(job, gpus_per_node, max_gpus), "shape space shared across jobs or GPU counts"
        self.space = space
        self.shapes, self.dps, self.ranks, self.successor = space.shapes, space.dps, space.ranks, space.successor
        self.training = job.training
        # Runtimes that balance their stages by cost spread the output layer (RuntimeProfile).
        self.balanced = profile(job.training.runtime).balanced_pipeline_stages
        self.refs: dict[tuple[object, ...], StepTerms] = {}
        self.views: dict[tuple[tuple[object, ...], int, int], _DpView] = {}
        self.parts: dict[tuple[object, ...], tuple[MicrobatchTime, int]] = {}
        self.scaled: dict[tuple[object, ...], MicrobatchTime] = {}
        self.per_slot: dict[tuple[int, int, str], float] = {}
        self.configs: dict[_Key, ParallelConfig] = {}
        self.candidates: dict[_Key, Candidate] = {}
        self.gates: list[bool | None] = [None] * len(self.shapes)
        self.levels: dict[tuple[int, int], bool] = {}
        self.maybe: dict[tuple[int, int], bool] = {}
        self.floor_values: list[dict[int, float] | None] = [None] * len(self.shapes)
        self.sequence = itertools.count(1)  # heap entries tied on key and recompute pop in the order pushed

    def run(self) -> list[Plan]:
        pools: dict[tuple[str, int], list[_Entry]] = {}
        followers = {i for i in self.successor if i is not None}
        admit = self.admit
        wanted: dict[int, list[str]] = {}  # the GPUs admit accepts, per GPU count
        heaps_at: dict[int, list[tuple[str, list[_Entry]]]] = {}  # and their heaps, once a candidate enters
        sequence = self.sequence
        for index, shape in enumerate(self.shapes):
            if index in followers:
                continue
            model_gpus = shape.model_gpus
            for dp in self.dps[index]:
                count = dp * model_gpus
                names = wanted.get(count)
                if names is None:
                    names = wanted[count] = [name for name in self.gpus if admit is None or admit(name, count)]
                if not names:
                    continue
                first = self._entering(index, dp)
                if first is None:
                    continue
                rank = self.ranks[first]
                heaps = heaps_at.get(count)
                if heaps is None:
                    heaps = heaps_at[count] = [(name, pools.setdefault((name, count), [])) for name in names]
                bounds: dict[tuple[int, str], float] = {}  # the bound does not read the ZeRO stage
                for ep, zero in self.space.layouts(shape, dp):
                    key = (first, dp, ep, zero)
                    for name, heap in heaps:
                        seconds = bounds.get((ep, name))
                        if seconds is None:
                            seconds = bounds[(ep, name)] = self._bound_s(key, name)
                        heap.append((seconds, rank, next(sequence), _BOUND, key))
        winners = []
        for (name, _), heap in sorted(pools.items()):
            heapq.heapify(heap)
            if (plan := self._first(heap, self.gpus[name])) is not None:
                winners.append(plan)
        return winners

    def _first(self, heap: list[_Entry], gpu: GpuType) -> Plan | None:
        """The plan the full search ranks first among this (GPU type, count)'s candidates."""
        found: tuple[float, int] | None = None
        ties: list[Plan] = []
        while heap:
            seconds, rank, _, state, key = heapq.heappop(heap)
            if found is not None and (seconds, rank) > found:
                break
            if state == _BOUND:
                if self._gate(key[0]) and self._floor(key[0], key[1]):
                    for entry in self._estimated(key, gpu.name):
                        heapq.heappush(heap, entry)
                elif (follower := self.successor[key[0]]) is not None:
                    # Below the shape's memory floor (at its largest dp or this one): no plan, but the next
                    # recompute needs less memory. This bound bounds the follower's step time too (follower_bound).
                    heapq.heappush(heap, (seconds, rank + 1, next(self.sequence), _BOUND, (follower, *key[1:])))
                continue
            if state == _ESTIMATE:
                if self._possible(key, gpu):
                    heapq.heappush(heap, self._exact(key, gpu))
                continue
            plan = self._plan(key, gpu, seconds)
            if plan is not None:
                found = (seconds, rank)
                ties.append(plan)
        return min(ties, key=rank_key) if ties else None

    def _config(self, key: _Key) -> ParallelConfig:
        config = self.configs.get(key)
        if config is None:
            index, dp, ep, zero = key
            config = self.configs[key] = config_of(self.group.base, self.shapes[index], dp, ep, zero)
        return config

    def _terms(self, key: _Key) -> StepTerms:
        shape = self.shapes[key[0]]
        return cached_step_terms(self.group.job.model, self.group.cache.training(shape.micro_batch_size),
                                 self._config(key))  # fmt: skip

    def _parts(self, key: _Key, name: str) -> tuple[MicrobatchTime, int]:
        """The micro-batch parts of the candidate's :func:`parts_key` on GPU ``name``, and the pipeline depth
        they were priced at."""
        shape = self.shapes[key[0]]
        pkey = (*parts_key(shape, key[2]), name)
        found = self.parts.get(pkey)
        if found is None:
            terms, group = self._terms(key), self.group
            parts = microbatch_time(terms, self.gpus[name], group.links[name], group.step_model, group.rates[name])
            found = self.parts[pkey] = (parts, terms.pp)
        return found

    def _scaled(self, key: _Key, name: str) -> MicrobatchTime:
        shape = self.shapes[key[0]]
        skey = (*parts_key(shape, key[2]), name, shape.pp)
        scaled = self.scaled.get(skey)
        if scaled is None:
            parts, pp = self._parts(key, name)
            scaled = self.scaled[skey] = _rescaled(parts, pp / shape.pp)
        return scaled

    def _bound_s(self, key: _Key, name: str) -> float:
        """A lower bound of the candidate's step time: its micro-batches', bubble's and fixed costs per pipeline
        slot (no collectives, data-parallel traffic or optimizer step), less :data:`ROUNDING`."""
        index, dp = key[0], key[1]
        shape = self.shapes[index]
        skey = (index, key[2], name)  # the shape (all of parts_key, pp and vpp), ep and the GPU
        per_slot = self.per_slot.get(skey)
        if per_slot is None:
            scaled = self._scaled(key, name)
            chunks = shape.vpp if shape.pp > 1 else 1
            per_slot = per_microbatch_s(scaled, shape.pp, balanced=self.balanced) + scaled.overhead_s * chunks
            self.per_slot[skey] = per_slot
        slots = self.training.num_micro_batches(dp, shape.micro_batch_size) + (shape.pp - 1) / shape.vpp
        return slots * per_slot * (1 - ROUNDING)

    def _estimated(self, key: _Key, name: str) -> list[_Entry]:
        """The candidate's entry at its estimate, and its follower's (the next recompute) at the bound the
        estimate gives it (:func:`follower_bound`)."""
        index, dp, ep, zero = key
        shape = self.shapes[index]
        fkey = family_key(shape, ep, zero)
        vkey = (fkey, shape.pp, dp)  # the view reads neither the recompute mode nor the GPU
        view = self.views.get(vkey)
        if view is None:
            ref = self.refs.get(fkey)
            if ref is None:
                ref = self.refs[fkey] = self._terms(key)
            view = self.views[vkey] = _view(self.group, ref, shape.pp, dp)
        group = self.group
        # assemble()'s parts without its StepTime (the follower bound reads them too)
        parts = step_parts(view, self._scaled(key, name), group.links[name], group.step_model)
        compute, bubble, _, p2p, _, optimizer, overhead = parts
        total = parts_total(parts)
        rank = self.ranks[index]
        entries = [(total * (1 - ROUNDING), rank, next(self.sequence), _ESTIMATE, key)]
        follower = self.successor[index]
        if follower is not None:
            bound = _follower_bound(compute, bubble, optimizer, p2p, overhead) * (1 - ROUNDING)
            entries.append((bound, rank + 1, next(self.sequence), _BOUND, (follower, dp, ep, zero)))
        return entries

    def _exact(self, key: _Key, gpu: GpuType) -> _Entry:
        group = self.group
        step = self._terms(key).evaluate(gpu, group.links[gpu.name], group.step_model, group.rates[gpu.name])
        return (step.total_s, self.ranks[key[0]], next(self.sequence), _EXACT, key)

    def _candidate(self, key: _Key) -> Candidate:
        candidate = self.candidates.get(key)
        if candidate is None:
            shape = self.shapes[key[0]]
            group = self.group
            candidate = self.candidates[key] = group.candidate(self._config(key), shape.micro_batch_size,
                                                               group.capacity)  # fmt: skip
        return candidate

    def _plan(self, key: _Key, gpu: GpuType, seconds: float) -> Plan | None:
        """The candidate's plan on ``gpu`` if the full search has it (its shape passed its memory floor before
        it was estimated): the dp scan reaches its level and its bound fits."""
        if not self._reached(key[0], key[1]):
            return None
        candidate = self._candidate(key)
        candidate.seconds.setdefault(gpu.name, seconds)
        return self.group.resolve(candidate, gpu, self.headroom)

    def _entering(self, index: int, dp: int) -> int | None:
        """The shape of ``index``'s layout that enters the heaps at ``dp``: the least recompute whose shape passes
        its memory floors (:meth:`_gate` and :meth:`_floor`) enters, at its own bound; those below them have no
        plan (nearly every candidate comes first in some heap, so the floors are worked out as the heaps are
        built rather than on demand). Recompute does not change the layouts or the dps."""
        successor, gates, floor_values, capacity = self.successor, self.gates, self.floor_values, self.group.capacity
        first: int | None = index
        while first is not None:
            passed = gates[first]
            if passed is None:
                passed = self._gate(first)
            if passed:
                values = floor_values[first]
                value = None if values is None else values.get(dp)
                if value is None:
                    value = self._floor_value(first, dp)
                if value <= capacity:
                    return first
            first = successor[first]
        return None

    def _gate(self, index: int) -> bool:
        """Whether the shape's memory floor (:func:`lower_bound`) at its largest dp fits: the full search's test of
        the shape."""
        passed = self.gates[index]
        if passed is None:
            dps = self.dps[index]
            passed = bool(dps) and self.shape_floors.lower_bound(self.shapes[index], dps[0]) <= self.group.capacity
            self.gates[index] = passed
        return passed

    def _floor(self, index: int, dp: int) -> bool:
        """Whether the shape's offered memory floor at ``dp`` (:class:`ShapeFloors`: at most the allocated peak of
        every candidate the search builds of the shape at that dp) fits the group's largest GPU."""
        values = self.floor_values[index]
        value = None if values is None else values.get(dp)
        if value is None:
            value = self._floor_value(index, dp)
        return value <= self.group.capacity

    def _floor_value(self, index: int, dp: int) -> float:
        """The shape's offered memory floor at ``dp``, kept in ``floor_values``."""
        shape = self.shapes[index]
        values = self.floor_values[index]
        if values is None:
            values = self.floor_values[index] = self.shape_floors.of(shape, offered=True)
        return self.shape_floors.at(shape, values, dp, offered=True)

    def _possible(self, key: _Key, gpu: GpuType) -> bool:
        """A necessary condition for the candidate (its shape's floors passed) to have a plan on ``gpu`` that the
        full search reaches, cheaper than its exact step time: its bound without the allocator reserve on
        ``gpu``, and, at a dp >= 2, such a bound fitting some GPU at every larger dp of the shape."""
        index, dp = key[0], key[1]
        if not self.group.may_fit(self._candidate(key), gpu, self.headroom):
            return False
        return dp < 2 or all(self._level_may_fit(index, larger) for larger in self.dps[index] if larger > dp)

    def _level_may_fit(self, index: int, dp: int) -> bool:
        fits = self.maybe.get((index, dp))
        if fits is None:
            fits = self.maybe[(index, dp)] = any(
                self.group.may_fit(self._candidate((index, dp, ep, zero)), gpu, self.headroom)
                for ep, zero in self.space.layouts(self.shapes[index], dp)
                for gpu in self.gpus.values()
            )
        return fits

    def _reached(self, index: int, dp: int) -> bool:
        """Whether the full search's dp scan of the shape evaluates ``dp``: dp = 1 always, a dp >= 2 when every
        larger dp of the shape had a plan on some GPU of the group."""
        if dp < 2:
            return True
        return all(self._level_fits(index, larger) for larger in self.dps[index] if larger > dp)

    def _level_fits(self, index: int, dp: int) -> bool:
        fits = self.levels.get((index, dp))
        if fits is None:
            shape = self.shapes[index]
            fits = self.levels[(index, dp)] = any(
                self.group.resolve(self._candidate((index, dp, ep, zero)), gpu, self.headroom) is not None
                for ep, zero in self.space.layouts(shape, dp)
                for gpu in self.gpus.values()
            )
        return fits


def _same_layout(a: Shape, b: Shape) -> bool:
    return (a.tp, a.pp, a.vpp, a.cp, a.micro_batch_size, a.sequence_parallel) == (
        b.tp, b.pp, b.vpp, b.cp, b.micro_batch_size, b.sequence_parallel)  # fmt: skip
