"""MARP's fitted parameters from measured runs, and the leave-one-source-out cross-validation.

**Fitted parameters** (:class:`MemoryFit`): for the point prediction, the allocator's reserve over allocated
(``fragmentation``) and the memory nvidia-smi shows beyond the allocator and NCCL (``context_bytes``);
for the bound of parts (:mod:`frenzy_opt.prediction.marp.bound`), the margin on activations per runtime
(``activation_margin``) and the allocator's elastic cache (``cached_fraction``). ``fit`` fits them on
some rows; ``cross_validate`` refits without each source in turn and scores that
source's rows with the parameters fitted on the others (leave one source out), so every figure it reports
is out of sample.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

from frenzy_opt.prediction.marp import bound
from frenzy_opt.prediction.marp.fit import MemoryFit
from frenzy_opt.validation.memory_runs import MeasuredRun, usable
from frenzy_opt.validation.memory_scores import RowScore, prediction_of, score_run, stages_of

MARGIN_SLACK = 0.01
"""Added to each fitted margin: the rows are few, so the largest shortfall seen is an optimistic estimate of
the largest to come (for n rows, the next one exceeds all of them with probability 1 / (n + 1))."""


FRAGMENTATION_GRID = tuple(i / 200 for i in range(0, 101))
"""Reserved / allocated - 1 searched from 0 to 0.5: GMLake (Guo et al., ASPLOS 2024, Fig. 2) measures 5-30 %
fragmentation in LLM training."""


CONTEXT_GRID = tuple(i * 64 * 2**20 for i in range(0, 25))
"""nvidia-smi's memory beyond the allocator and NCCL, searched from 0 to 1.5 GiB: the CUDA context with
PyTorch's kernels (the calibration file's Hugging Face rows measure 1,343 MiB on a V100)."""


def _point_fit(rows: Sequence[MeasuredRun], base: MemoryFit) -> MemoryFit:
    """One fragmentation and one CUDA context for every runtime and GPU, chosen on a grid to minimise the
    mean absolute relative error of the ``max_reserved`` and ``device_used`` rows together (two parameters
    for all rows: few enough that a held-out source is predicted by what the others taught), then a context
    per GPU architecture that has nvidia-smi rows."""
    zero = replace(base, fragmentation=0.0, default_context_bytes=0, context_bytes={})
    parts = {r.row_id: stages_of(r, prediction_of(r, zero)) for r in rows}
    cuda_rows = [r for r in rows if r.metric in ("max_reserved", "device_used")]
    fragmentation, context = base.fragmentation, base.default_context_bytes
    if cuda_rows:
        best = math.inf
        for f in FRAGMENTATION_GRID:
            for c in CONTEXT_GRID if any(r.metric == "device_used" for r in cuda_rows) else (context,):
                error = 0.0
                for r in cuda_rows:
                    assert r.measured_bytes is not None
                    predicted = max(
                        s.peak_allocated_bytes * (1 + f)
                        + (c + s.breakdown["nccl_buffers"] if r.metric == "device_used" else 0)
                        for s in parts[r.row_id]
                    )
                    error += abs(predicted / r.measured_bytes - 1)
                if error < best - 1e-12:
                    best, fragmentation, context = error, f, c
    # Then the context of each GPU architecture with nvidia-smi rows of its own, at that fragmentation (the
    # CUDA context and the kernels loaded differ by architecture); the others keep the common value.
    per_family: dict[str, int] = {}
    for family in sorted({r.gpu_family for r in cuda_rows if r.metric == "device_used"}):
        mine = [r for r in cuda_rows if r.metric == "device_used" and r.gpu_family == family]

        def family_error(c: int, mine: list[MeasuredRun] = mine) -> float:
            total = 0.0
            for r in mine:
                assert r.measured_bytes is not None
                used = max(s.peak_allocated_bytes * (1 + fragmentation) + c + s.breakdown["nccl_buffers"]
                           for s in parts[r.row_id])  # fmt: skip
                total += abs(used / r.measured_bytes - 1)
            return total

        per_family[family] = min(CONTEXT_GRID, key=family_error)
    return replace(base, fragmentation=fragmentation, context_bytes=per_family, default_context_bytes=context)


def least_margin(rows: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The margin ``(a, F)``, ``a >= 0`` relative to the activations and ``F >= 0`` bytes, that covers every
    ``(activations, shortfall)`` row (``F + a x activations >= shortfall``) with the least total over the
    rows: a linear programme in two variables, solved at its vertices (the axes and each pair of rows).
    A fixed cost that a small model's prediction misses goes to ``F``; an error that grows with the
    activations goes to ``a``, so neither inflates the other's margin for every other job."""
    if not rows:
        return 0.0, 0.0
    total = sum(u for u, _ in rows)
    candidates = [(max(0.0, max(d / u for u, d in rows)), 0.0), (0.0, max(0.0, max(d for _, d in rows)))]
    for (u1, d1), (u2, d2) in itertools.combinations(rows, 2):
        if u1 != u2:
            a = (d1 - d2) / (u1 - u2)
            candidates.append((a, d1 - a * u1))
    feasible = [(a, f) for a, f in candidates if a >= 0 and f >= 0 and all(f + a * u >= d - 1 for u, d in rows)]
    return min(feasible, key=lambda c: len(rows) * c[1] + c[0] * total)


def fit(runs: Sequence[MeasuredRun], base: MemoryFit | None = None) -> MemoryFit:
    """Fit :class:`MemoryFit` on ``runs`` (their usable rows).

    1. The point prediction's fragmentation and CUDA context (:func:`_point_fit`).
    2. The margin of each runtime: the least proportional (relative to the predicted activations and
       temporaries) and fixed part under which every ``max_allocated`` measurement stays within ``states +
       activations + workspaces + margin`` (:func:`least_margin`), the proportional part plus
       :data:`MARGIN_SLACK`; a runtime without such rows takes the largest of those margins (the fitted
       margins measure how far the activation model is off, which does not depend on how the runtime holds
       its states). Only when no row measures ``max_allocated`` does each runtime take the largest
       shortfall its ``max_reserved`` and nvidia-smi rows imply for the allocated peak under the point
       model's fragmentation and context (conservative: it counts the allocator's cache as allocation).
    3. The elastic cache (``cached_fraction``): the largest excess of a ``max_reserved`` or nvidia-smi
       measurement over the bound without it (allocated bound + modelled reserve [+ context and NCCL]),
       relative to the allocated bound, plus :data:`MARGIN_SLACK`.
    """
    base = base or MemoryFit()
    rows = usable(runs)
    fitted = _point_fit(rows, base)
    unmargined = replace(
        fitted,
        activation_margin={},
        default_activation_margin=0.0,
        fixed_margin_bytes={},
        default_fixed_margin_bytes=0,
        cached_fraction=0.0,
        rows=1,
    )
    needs: dict[str, list[tuple[float, float]]] = {}
    implied: dict[str, list[tuple[float, float]]] = {}
    cached_needs: list[MeasuredRun] = []
    for r in rows:
        assert r.job is not None and r.measured_bytes is not None
        stages = stages_of(r, prediction_of(r, unmargined))
        stage = max(stages, key=lambda s: s.peak_allocated_bytes)
        b = stage.bound
        runtime = r.job.training.runtime.value
        activations = float(max(b["activations"], 1))
        if r.metric == "max_allocated":
            shortfall = float(r.measured_bytes - b["states"] - b["library_workspaces"] - b["activations"])
            needs.setdefault(runtime, []).append((activations, shortfall))
            continue
        cached_needs.append(r)
        # What the row implies for the allocated peak under the point model's allocator and context terms.
        outside = b["cuda_context"] + b["nccl_buffers"] if r.metric == "device_used" else 0
        allocated = (r.measured_bytes - outside) / (1 + fitted.fragmentation)
        shortfall = allocated - b["states"] - b["library_workspaces"] - b["activations"]
        implied.setdefault(runtime, []).append((activations, shortfall))
    # Without any max_allocated row, each runtime takes what its other rows imply for its allocated peak.
    fitted_margins = {k: least_margin(v) for k, v in (needs or implied).items()}
    margins = {k: round(a + MARGIN_SLACK, 4) for k, (a, _) in fitted_margins.items()}
    fixed = {k: int(f) for k, (_, f) in fitted_margins.items()}
    default_margin = max(margins.values(), default=0.0)
    default_fixed = max(fixed.values(), default=0)
    margined = replace(
        unmargined,
        activation_margin=margins,
        default_activation_margin=default_margin,
        fixed_margin_bytes=fixed,
        default_fixed_margin_bytes=default_fixed,
    )
    cached = 0.0
    for r in cached_needs:
        assert r.measured_bytes is not None
        stages = stages_of(r, prediction_of(r, margined))
        stage = max(stages, key=lambda s: s.required_upper_bytes)
        b = stage.bound
        allocated = bound.MemoryBound(b).allocated
        without = allocated + b["allocator_reserve"]
        if r.metric == "device_used":
            without += b["cuda_context"] + b["nccl_buffers"]
        cached = max(cached, (r.measured_bytes - without) / allocated)
    return replace(
        margined,
        cached_fraction=round(max(cached, 0.0) + MARGIN_SLACK, 4),
        rows=len(rows),
    )


# --- cross-validation ---------------------------------------------------------------------------------


def cross_validate(runs: Sequence[MeasuredRun], base: MemoryFit | None = None) -> list[RowScore]:
    """Leave one source out: each source's rows scored with the parameters fitted on every other source."""
    rows = usable(runs)
    scores: dict[str, RowScore] = {}
    for source in sorted({r.source for r in rows}):
        held = [r for r in rows if r.source == source]
        fitted = fit([r for r in rows if r.source != source], base)
        for r in held:
            scores[r.row_id] = score_run(r, fitted)
    return [scores[r.row_id] for r in rows]
