"""contract.theilsen gives exactly what scipy.stats.theilslopes gives (scipy: dev only)."""

import math

import numpy as np
import pytest
from scipy.stats import theilslopes as scipy_theilslopes

from contract.theilsen import theilslopes

# The classifier's confidence (0.95 by default; any in (0.5, 1) may be set), and the early-stop
# looks' Bonferroni levels as `contract.earlystop` computes them for m looks.
CONFIDENCES = [0.95, 0.9, 0.99] + [1.0 - (1.0 - 0.95) / m for m in (2, 3, 5, 8, 13, 20, 40)]


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def series(rng: np.random.Generator, n: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Block floors as the classifier sees them: noisy, rounded (ties), stepped, flat."""
    x = np.sort(rng.uniform(0, 300, n))
    y = 500 + rng.normal(0, 3, n).cumsum() * 0.3 + x * rng.uniform(-0.2, 0.5)
    if kind == "rounded":  # MiB figures with ties in y, steps with ties in x
        x, y = np.round(x / 10) * 10, np.round(y)
    elif kind == "step":
        y = np.where(x > x[n // 2], y + 40, y)
    elif kind == "flat":
        y = np.full(n, 512.0)
    return x, y


@pytest.mark.parametrize("kind", ["noisy", "rounded", "step", "flat"])
def test_every_number_equals_scipys(kind: str) -> None:
    rng = np.random.default_rng(sum(map(ord, kind)))
    compared = 0
    for _ in range(400):
        n = int(rng.integers(2, 61))
        x, y = series(rng, n, kind)
        for confidence in CONFIDENCES:
            ours = theilslopes(y, x, alpha=confidence)
            theirs = scipy_theilslopes(y, x, alpha=confidence)
            pairs = zip(ours, theirs, strict=True)
            assert all(same(a, float(b)) for a, b in pairs), (n, confidence, ours, theirs)
            compared += 1
    assert compared == 400 * len(CONFIDENCES)


def test_the_interval_is_the_slopes_at_sens_indices() -> None:
    """A case worked by hand: five points on a line, one off it."""
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    y = np.array([0.0, 1.0, 2.0, 3.0, 10.0])
    fit = theilslopes(y, x, alpha=0.95)
    # Ten pairwise slopes: six of 1 (the line), 2.5, 3, 4 and 7 (to the outlier); the median
    # is 1. At 95 % Sen's sigma is 4.08, so the bounds are slopes 0 and 9: the extremes.
    assert fit.slope == 1.0 and fit.intercept == 0.0
    assert (fit.low_slope, fit.high_slope) == (1.0, 7.0)


def test_bad_input_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="^x and y must have length at least 2$"):
        theilslopes(np.array([1.0]), np.array([0.0]))
    with pytest.raises(ValueError, match="^x and y have different lengths$"):
        theilslopes(np.array([1.0, 2.0]), np.array([0.0, 1.0, 2.0]))
