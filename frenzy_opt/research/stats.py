"""Confidence intervals over repeated simulations (``frenzy simulate --seeds N``, ``frenzy compare``).

The 95 % confidence interval of a mean from ``n`` independent runs is mean ± t(0.975, n − 1) · s / √n, with
``s`` the sample standard deviation (divisor n − 1) and t the Student-t quantile (Student 1908; the
two-sided interval of NIST/SEMATECH e-Handbook of Statistical Methods, §7.2.2.1). The quantile is computed
here, without SciPy, by bisection on the Student-t distribution function for integer degrees of freedom
(Abramowitz & Stegun 1964, 26.7.3 and 26.7.4, exact finite sums).

Two policies run on the same seeds (or the same workload files) are compared **paired**: the same interval
of the mean of the per-seed differences, with n − 1 degrees of freedom (the paired t interval; Student
1908 applied it to paired differences, the Cushny–Peebles sleep data). Pairing removes the variation
between workloads that both policies share: where the two policies' results move together from seed to
seed, it is much narrower than the two separate intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def student_t_central(t: float, df: int) -> float:
    """A(t | df) = P(|T| <= t) for Student's t with ``df`` >= 1 degrees of freedom (A&S 26.7.3, 26.7.4)."""
    assert df >= 1 and t >= 0
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:
        # A&S 26.7.3: (2/pi)[theta + sin cos (1 + 2/3 cos^2 + ... + (2·4···(df-3))/(1·3···(df-2)) cos^(df-3))]
        total, term = 0.0, 1.0
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        series = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
        return 2 / math.pi * (theta + series)
    # A&S 26.7.4: sin theta [1 + 1/2 cos^2 + (1·3)/(2·4) cos^4 + ... + (1·3···(df-3))/(2·4···(df-2)) cos^(df-2)]
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return math.sin(theta) * total


def student_t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom, to 1e-12."""
    assert 0.5 < p < 1 and df >= 1
    central = 2 * p - 1  # P(|T| <= t) = 2p - 1
    low, high = 0.0, 1.0
    while student_t_central(high, df) < central:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if student_t_central(mid, df) < central:
            low = mid
        else:
            high = mid
        if high - low < 1e-12:
            break
    return (low + high) / 2


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def ci95_half_width(values: Sequence[float]) -> float | None:
    """Half-width of the Student-t 95 % confidence interval of the mean of ``values`` (module docstring);
    None with fewer than two values (no spread to estimate)."""
    n = len(values)
    if n < 2 or any(math.isnan(v) for v in values):
        return None
    m = mean(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return student_t_quantile(0.975, n - 1) * s / math.sqrt(n)


@dataclass(frozen=True, slots=True, kw_only=True)
class PairedDifference:
    """The mean of paired differences ``x_i - y_i`` and its Student-t 95 % half-width (module docstring)."""

    mean: float
    half_width: float | None
    """None with fewer than two pairs."""
    n: int

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval mean ± half-width lies entirely on one side of zero (False without one)."""
        return self.half_width is not None and abs(self.mean) > self.half_width


def paired_ci95(x: Sequence[float], y: Sequence[float]) -> PairedDifference:
    """Paired differences x_i − y_i (e.g. one policy's and another's average JCT on the same seed or
    workload): their mean and 95 % half-width; ``ValueError`` if the lengths differ or nothing is paired."""
    if len(x) != len(y) or not x:
        raise ValueError(f"paired_ci95: needs two equal, non-empty sequences, got {len(x)} and {len(y)}")
    diffs = [a - b for a, b in zip(x, y, strict=True)]
    return PairedDifference(mean=mean(diffs), half_width=ci95_half_width(diffs), n=len(diffs))


def relative_reductions(x: Sequence[float], y: Sequence[float]) -> list[float]:
    """Per pair, 1 − x_i / y_i: how much lower x is than y, as a fraction of y (positive = x lower)."""
    if len(x) != len(y):
        raise ValueError(f"relative_reductions: lengths differ, {len(x)} and {len(y)}")
    return [1 - a / b for a, b in zip(x, y, strict=True)]
