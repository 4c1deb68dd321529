"""The one fitter of the step-time model's parameters from measured runs.

A :class:`FitPoint` is one measured run, prepared: its :class:`~frenzy_opt.prediction.stepterms.StepTerms`,
the GPU type and links it is priced on, and its measured seconds per iteration. A :class:`Parameter` is one
number of :class:`~frenzy_opt.prediction.steptime.StepTimeModel` (how to read it from a model, how to write
it into one, and its physical range): an efficiency (:func:`efficiency_parameter`), an entry of a
per-runtime table (:func:`per_runtime_parameter`) or a plain field (:func:`scalar_parameter`).

:func:`fit_points` finds the parameters minimising the sum of squared ``log(predicted / measured)`` (a
relative error, symmetric in over- and under-prediction) plus an optional weak pull towards the starting
parameters, by Levenberg-Marquardt (Marquardt 1963) over the logarithms of the parameters with a numerical
Jacobian, each clipped to its range. ``frenzy calibrate`` and the step-time validation's cross-validation
(:mod:`frenzy_opt.validation.steptime_validation`) and the closed loop's recalibration
(:mod:`frenzy_opt.prediction.closedloop`) all fit with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.hardware.topology import Links
from frenzy_opt.prediction.stepterms import StepTerms
from frenzy_opt.prediction.steptime import DEFAULT_EFFICIENCY, MAX_RELATIVE_EFFICIENCY, StepTimeModel


@dataclass(frozen=True, slots=True)
class FitPoint:
    """One measured run as the fit sees it: what it computes, where, and its measured seconds per iteration."""

    terms: StepTerms
    gpu: GpuType
    links: Links
    measured_s: float


@dataclass(frozen=True, slots=True)
class Parameter:
    """One fitted number of the model: ``get`` reads it, ``put`` writes it, ``[lo, hi]`` is its range."""

    name: str
    get: Callable[[StepTimeModel], float]
    put: Callable[[StepTimeModel, float], StepTimeModel]
    lo: float
    hi: float


def efficiency_parameter(
    key: str, *, start: float | None = None, lo: float = 0.02, hi: float = MAX_RELATIVE_EFFICIENCY
) -> Parameter:
    """The matmul efficiency stored under ``key`` (an architecture, a GPU type, or ``f"{gpu}@{precision}"``:
    the keys :meth:`StepTimeModel.efficiency_of` reads, or ``"*"``); an absent entry starts from ``start``,
    else from :data:`DEFAULT_EFFICIENCY`."""
    default = start if start is not None else DEFAULT_EFFICIENCY
    return Parameter(
        f"efficiency[{key}]",
        lambda m: m.efficiency.get(key, default),
        lambda m, v: replace(m, efficiency={**m.efficiency, key: v}),
        lo,
        hi,
    )


def per_runtime_parameter(name: str, runtime: str, lo: float, hi: float, start: float | None = None) -> Parameter:
    """The ``runtime`` entry of one of :class:`StepTimeModel`'s per-runtime tables (``name``); an absent
    entry starts from ``start``, else from the model's fall-back for the runtime."""

    def get(m: StepTimeModel) -> float:
        table: dict[str, float] = getattr(m, name)
        return table.get(runtime, start) if start is not None else m.per_runtime(name, runtime)

    def put(m: StepTimeModel, v: float) -> StepTimeModel:
        values: dict[str, Any] = {name: {**getattr(m, name), runtime: v}}
        return replace(m, **values)

    return Parameter(f"{name}[{runtime}]", get, put, lo, hi)


def scalar_parameter(name: str, lo: float, hi: float) -> Parameter:
    """A plain float field of :class:`StepTimeModel` (``fp8_efficiency``, ...)."""

    def put(m: StepTimeModel, v: float) -> StepTimeModel:
        values: dict[str, Any] = {name: v}
        return replace(m, **values)

    return Parameter(name, lambda m: float(getattr(m, name)), put, lo, hi)


def fit_points(
    points: Sequence[FitPoint],
    params: Sequence[Parameter],
    model: StepTimeModel,
    *,
    prior_weight: float = 0.0,
    iterations: int = 60,
    absolute: bool = False,
) -> StepTimeModel:
    """``model`` with ``params`` set to minimise ``sum(log(predicted / measured)^2)`` over ``points`` plus
    ``prior_weight^2`` times the squared distance of the log-parameters from their starting values (module
    docstring); each parameter starts from its value in ``model``, clipped to its range.

    ``absolute``: minimise ``sum(|log(predicted / measured)|)`` instead, by iteratively reweighted least
    squares (each run's squared residual weighted by the inverse of its last absolute residual, floored at
    :data:`IRLS_FLOOR`; Schlossmacher 1973, "An iterative technique for absolute deviations curve fitting",
    JASA 68:857): a median-like fit that one outlying run does not drag."""
    if not points:
        raise ValueError("a fit needs at least one measured run")
    lo = np.log([p.lo for p in params])
    hi = np.log([p.hi for p in params])
    x = np.clip(np.log([p.get(model) for p in params]), lo, hi)
    measured = np.log([pt.measured_s for pt in points])

    def model_at(v: np.ndarray) -> StepTimeModel:
        m = model
        for p, value in zip(params, np.exp(v), strict=True):
            m = p.put(m, float(value))
        return m

    def log_errors(v: np.ndarray) -> np.ndarray:
        m = model_at(v)
        pred = [pt.terms.evaluate(pt.gpu, pt.links, m).total_s for pt in points]
        return np.log(pred) - measured

    x0 = x.copy()
    weights = np.ones(len(points))
    for _ in range(IRLS_ROUNDS if absolute else 1):
        scale = np.sqrt(weights)

        def residuals(v: np.ndarray, scale: np.ndarray = scale) -> np.ndarray:
            # A weak pull towards the starting point keeps parameters the runs barely inform where they were.
            return np.concatenate([scale * log_errors(v), prior_weight * (v - x0)])

        x = _levenberg_marquardt(residuals, x, lo, hi, iterations)
        weights = 1.0 / np.maximum(np.abs(log_errors(x)), IRLS_FLOOR)
    return model_at(x)


IRLS_ROUNDS = 12
IRLS_FLOOR = 1e-3
"""Absolute log errors below this (0.1 %) weigh as this: the reweighting stays finite for a run fitted exactly."""


def _levenberg_marquardt(
    residuals: Callable[[np.ndarray], np.ndarray], x: np.ndarray, lo: np.ndarray, hi: np.ndarray, iterations: int
) -> np.ndarray:
    """The point in the box [lo, hi] from ``x`` that the damped Gauss-Newton steps of Levenberg-Marquardt
    (Marquardt 1963) reach on ``sum(residuals^2)``, with forward-difference Jacobians."""
    damping = 1e-2
    current = residuals(x)
    cost = float(current @ current)
    for _ in range(iterations):
        jac = np.empty((current.size, x.size))
        for j in range(x.size):
            step = np.zeros_like(x)
            step[j] = 1e-5
            jac[:, j] = (residuals(x + step) - current) / 1e-5
        a = jac.T @ jac
        g = jac.T @ current
        improved = False
        for _ in range(10):
            delta = np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-9), -g)
            trial = np.clip(x + delta, lo, hi)
            r = residuals(trial)
            c = float(r @ r)
            if c < cost:
                x, current, cost, improved = trial, r, c, True
                damping = max(damping / 3, 1e-7)
                break
            damping *= 4
        if not improved or float(np.max(np.abs(delta))) < 1e-6:
            break
    return x
