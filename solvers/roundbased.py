"""What the round-based baselines (``sia``, ``gavel``) share: what they know of a job's speed, a HiGHS model
builder and the two-stage placement that turns per-job allocations (GPU type, count) into nodes on the
simulator's ledger."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import highspy
import numpy as np

from frenzy_opt.planning.problem import Option
from frenzy_opt.simulation.simulator import Action, SimJob, Start, Stop
from frenzy_opt.simulation.view import ClusterView
from frenzy_opt.solvers.policies import place

_BANNER_SHOWN: list[bool] = []


def known_step_s(view: ClusterView, job: SimJob, option: Option, *, oracle: bool = False) -> float:
    """Seconds per step of ``job`` on ``option`` as a measuring scheduler knows them: the true value once
    the job has run on that (GPU type, GPU count) (:meth:`ClusterView.observed_step_s`: Sia and Gavel measure
    running jobs), before that the step-time model's prediction (Sia profiles and Gavel estimates
    throughput; the prediction stands in for both, with the same error frenzy has). ``oracle``: the true
    value always (the ``-oracle`` variants)."""
    if oracle:
        return view.true_step_s(job, option)
    seen = view.observed_step_s(job.id, option.gpu_type, option.num_gpus)
    return job.step_s(option) if seen is None else seen


def _highs() -> highspy.Highs:
    """A fresh, quiet HiGHS instance. The first constructor of a process prints a banner on the C-level
    stdout, which would corrupt ``--json`` output, so file descriptor 1 points to /dev/null while it runs."""
    if _BANNER_SHOWN:
        h = highspy.Highs()  # type: ignore[no-untyped-call]
    else:
        sys.stdout.flush()
        saved, sink = os.dup(1), os.open(os.devnull, os.O_WRONLY)
        os.dup2(sink, 1)
        try:
            h = highspy.Highs()  # type: ignore[no-untyped-call]
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(sink)
        _BANNER_SHOWN.append(True)
    h.setOptionValue("output_flag", False)
    return h


def highs_lp(
    cost: Sequence[float], upper: Sequence[float], rows: Sequence[tuple[Sequence[int], Sequence[float], float]]
) -> highspy.HighsLp:
    """The LP ``min cost . x`` with 0 <= x <= ``upper`` and rows ``sum(coef * x[idx]) <= rhs`` as HiGHS's
    column-wise model."""
    n = len(cost)
    cols: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for r, (idx, coef, _) in enumerate(rows):
        for i, c in zip(idx, coef, strict=True):
            cols[i].append((r, c))
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = len(rows)
    lp.col_cost_ = np.asarray(cost, dtype=float)
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.asarray(upper, dtype=float)
    lp.row_lower_ = np.full(len(rows), -highspy.kHighsInf)
    lp.row_upper_ = np.asarray([rhs for _, _, rhs in rows], dtype=float)
    starts = [0]
    index: list[int] = []
    value: list[float] = []
    for col in cols:
        index += [r for r, _ in col]
        value += [c for _, c in col]
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.asarray(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.asarray(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.asarray(value, dtype=float)
    return lp


def solve_highs(
    cost: Sequence[float],
    upper: Sequence[float],
    rows: Sequence[tuple[Sequence[int], Sequence[float], float]],
    *,
    integer: bool,
    time_limit_s: float,
    mip_rel_gap: float = 1e-4,
) -> list[float]:
    """Minimise ``cost . x`` with 0 <= x <= ``upper`` and rows ``sum(coef * x[idx]) <= rhs``, by HiGHS
    (Huangfu & Hall 2018) directly through highspy: no modelling layer between the policy and the solver."""
    n = len(cost)
    if n == 0:
        return []
    lp = highs_lp(cost, upper, rows)
    if integer:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    h = _highs()
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", mip_rel_gap)
    passed = h.passModel(lp)
    ran = h.run()
    status = h.getModelStatus()
    if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit):
        raise RuntimeError(
            f"HiGHS: {h.modelStatusToString(status)} (pass {passed}, run {ran}, {n} columns, {len(rows)} rows)"
        )
    values = list(h.getSolution().col_value)
    if len(values) != n:
        raise RuntimeError("HiGHS: no solution within the time limit")
    return values


def apply_allocations(view: ClusterView, wanted: dict[str, Option]) -> list[Action]:
    """Actions that move the cluster to the allocations ``wanted`` (job -> option; absent = not running).

    Jobs that keep their option keep their nodes (no restart). Every other running job stops (it
    checkpoints). New allocations are then placed by the shared rule, whole-node ones first, then the
    others largest first by best fit — the two-stage placement of Sia (§4.3). An allocation that does not
    fit (fragmentation) is dropped for this round; the job waits for the next one. A running job the policy
    may not move (:func:`locked`) keeps its allocation whatever ``wanted`` says.
    """
    actions: list[Action] = []
    free = list(view.free)
    wanted = dict(wanted)
    for job_id, state in view.running.items():
        if locked(view, job_id):
            wanted[job_id] = state.option  # type: ignore[assignment]
        if wanted.get(job_id) is not state.option:
            actions.append(Stop(job=job_id))
            assert state.option is not None
            for n in state.nodes:
                free[n] += state.option.gpus_per_node
    starts = [(j, o) for j, o in wanted.items() if j not in view.running or view.running[j].option is not o]
    starts.sort(key=lambda jo: (jo[1].whole_nodes == 0, -jo[1].num_gpus, jo[0]))
    for job_id, option in starts:
        nodes = place(view, option, free)
        if nodes is None:
            continue
        for n in nodes:
            free[n] -= option.gpus_per_node
        actions.append(Start(job=job_id, option=option, nodes=nodes))
    return actions


def locked(view: ClusterView, job_id: str) -> bool:
    """A running job no policy may stop: its spec says ``scheduling.preemptible: false``, or it has made its
    ``scheduling.max_moves`` moves (restarts after its first start)."""
    state = view.jobs[job_id]
    job = state.job
    return not job.preemptible or (job.max_moves is not None and state.starts - 1 >= job.max_moves)
