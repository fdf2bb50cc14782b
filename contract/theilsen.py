"""The Theil-Sen slope and Sen's confidence interval, as ``scipy.stats.theilslopes`` computes
them (its default ``method="separate"``), in numpy and the standard library.

The classifier (`engine.analysis`) and the early-stop rules (`contract.earlystop`) fit their
block floors with it. ``scipy.stats`` took 0.7 s of CPU to import, in every process that
judges a run (`bisect-cli run`, `serve`, each runner that looks for an early stop); numpy
alone takes 0.1 s.

The rules, in code order, are scipy's (1.17), step for step:

1. The slope is the median of the pairwise slopes ``(y_j - y_i) / (x_j - x_i)`` over the
   pairs with ``x_j > x_i``; the intercept is ``median(y) - slope * median(x)``.
2. The interval follows Sen (1968), eq. 2.6: ``sigma^2 = (n(n-1)(2n+5) - sum over the runs of
   tied x and of tied y of k(k-1)(2k+5)) / 18``; with ``z`` the normal quantile of
   ``alpha / 2`` (``alpha`` = 1 - confidence), the bounds are the sorted slopes at indices
   ``round((N + z sigma) / 2) - 1`` and ``round((N - z sigma) / 2)``, clipped to the
   slopes, N being their number. Where sigma is not a number, the bounds are NaN.

The one difference: ``z`` comes from `statistics.NormalDist` (Wichura's AS241), scipy's from
Cephes' ``ndtri``; they differ by at most 3e-15, so an index differs only where
``(N -+ z sigma) / 2`` lies that close to a half. tests/test_theilsen.py compares the two on
thousands of series, ties included, at the confidences the classifier and the early-stop
looks use: every number equal.

`grouped_theilslopes` is the same fit over several series that share a slope but not a level
(runs of one candidate too short to judge alone, `engine.pooled`): the seasonal Kendall slope
of Hirsch, Slack and Smith (1982). Its pairs are those within one series only (a pair across
two runs would compare two baselines, not growth); sigma^2 is the sum of each series' own;
the bounds are read off the sorted within-series slopes exactly as in rule 2.
"""

from __future__ import annotations

import warnings
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

_NORMAL = NormalDist()


class TheilSen(NamedTuple):
    slope: float
    intercept: float
    low_slope: float
    high_slope: float


def _tie_term(values: np.ndarray) -> float:
    """Sum of k(k-1)(2k+5) over the runs of k > 1 equal values."""
    _, counts = np.unique(values, return_counts=True)
    ties = counts[counts > 1]
    return float(sum(int(k) * (int(k) - 1) * (2 * int(k) + 5) for k in ties))


def _slopes(y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, float]:
    """The pairwise slopes over the pairs with x_j > x_i, and the series' sigma^2 (rule 2)."""
    y = np.array(y, dtype=float).ravel()
    x = np.array(x, dtype=float).ravel()
    if len(x) != len(y):
        raise ValueError("x and y have different lengths")
    if len(x) < 2:
        raise ValueError("x and y must have length at least 2")
    dx = x[:, np.newaxis] - x
    dy = y[:, np.newaxis] - y
    rising = dx > 0
    n = len(y)
    sigsq = 1 / 18.0 * (n * (n - 1) * (2 * n + 5) - _tie_term(x) - _tie_term(y))  # scipy's order
    return dy[rising] / dx[rising], sigsq


def _bounds(slopes: np.ndarray, sigsq: float, alpha: float) -> tuple[float, float]:
    """Sen's interval from the sorted slopes (rule 2)."""
    if alpha > 0.5:
        alpha = 1.0 - alpha
    z = _NORMAL.inv_cdf(alpha / 2.0)
    pairs = len(slopes)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # sigma of a negative: NaN
            sigma = np.sqrt(sigsq)
        upper = min(int(np.round((pairs - z * sigma) / 2.0)), pairs - 1)
        lower = max(int(np.round((pairs + z * sigma) / 2.0)) - 1, 0)
        low, high = slopes[[lower, upper]]
    except (ValueError, IndexError):
        low, high = np.nan, np.nan
    return float(low), float(high)


def theilslopes(y: np.ndarray, x: np.ndarray, alpha: float = 0.95) -> TheilSen:
    """The fit of `y` against `x` with its `alpha` confidence interval (rules 1-2)."""
    slopes, sigsq = _slopes(y, x)
    slopes.sort()
    slope = np.median(slopes)
    yy, xx = np.asarray(y, dtype=float).ravel(), np.asarray(x, dtype=float).ravel()
    intercept = np.median(yy) - slope * np.median(xx)
    low, high = _bounds(slopes, sigsq, alpha)
    return TheilSen(float(slope), float(intercept), low, high)


def grouped_theilslopes(
    series: list[tuple[np.ndarray, np.ndarray]], alpha: float = 0.95
) -> TheilSen:
    """One slope over several (y, x) series, each with its own level (the module docstring);
    the intercept is NaN: the series have none in common."""
    fits = [_slopes(y, x) for y, x in series]
    slopes = np.sort(np.concatenate([f[0] for f in fits]))
    if not len(slopes):
        raise ValueError("no series has two distinct x")
    low, high = _bounds(slopes, sum(f[1] for f in fits), alpha)
    return TheilSen(float(np.median(slopes)), float("nan"), low, high)
