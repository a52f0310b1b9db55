"""Statistics of a comparison: the rank test, the bootstrap interval of a ratio of
medians and the geometric mean over matched rows (numpy only: scipy is not a dependency).

The interval of a change is a percentile bootstrap: each resample draws both rows'
samples with replacement (fixed seed) and takes candidate median / baseline median. The
geometric mean over rows reuses those resamples (one resample index across every row), so
its interval carries the same noise.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

NUM_RESAMPLES = 1000
CONFIDENCE = 0.95
MIN_SAMPLES = 5  # fewer samples on either side: no rank test, no bootstrap interval
SEED = 0


def samples_of(value) -> np.ndarray:
    """Samples (µs) of a row as a flat float array of finite values; per-rank nested
    lists are flattened."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return np.empty(0)
    try:
        out = np.asarray(value, dtype=float).ravel()
    except ValueError:  # ragged per-rank lists
        parts = [np.ravel(np.asarray(v, dtype=float)) for v in value]
        out = np.concatenate(parts) if parts else np.empty(0)
    return out[np.isfinite(out)]


def mann_whitney_p(a, b) -> float:
    """Two-sided Mann-Whitney U p-value (normal approximation, tie-corrected).

    Returns NaN when either side has fewer than 2 finite samples.
    """
    a, b = samples_of(list(a)), samples_of(list(b))
    n1, n2 = len(a), len(b)
    if n1 < 2 or n2 < 2:
        return float("nan")
    x = np.concatenate([a, b])
    n = n1 + n2
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inverse]  # average rank of each tie group
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    tie = float((counts**3 - counts).sum()) / (n * (n - 1))
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie))
    if sigma == 0:
        return 1.0
    z = max(abs(u1 - n1 * n2 / 2.0) - 0.5, 0.0) / sigma  # 0.5: continuity correction
    return math.erfc(z / math.sqrt(2.0))


def bootstrap_ratios(base, cand, num: int = NUM_RESAMPLES, seed: int = SEED) -> np.ndarray:
    """`num` resampled ratios candidate median / baseline median (empty below MIN_SAMPLES
    samples on either side)."""
    b, c = samples_of(base), samples_of(cand)
    if min(len(b), len(c)) < MIN_SAMPLES:
        return np.empty(0)
    counts_b, counts_c = _draw_counts(len(b), len(c), num, seed)
    return resampled_medians(c[None], counts_c)[0] / resampled_medians(b[None], counts_b)[0]


@functools.lru_cache(maxsize=4)  # a run's rows mostly share one sample count; [num, n] int32 each
def _draw_counts(nb: int, nc: int, num: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """For each side, how often each sample is drawn in each of the `num` resamples ([num, n]):
    the draws `rng.integers(0, n, (num, n))`, the same for every pair of these sample counts
    (one seed), so drawn once per (nb, nc) instead of once per pair."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (nb, nc):
        draws = rng.integers(0, n, (num, n)) + n * np.arange(num)[:, None]
        counts = np.bincount(draws.ravel(), minlength=num * n).reshape(num, n).astype(np.int32)
        counts.setflags(write=False)  # shared by every call (the cache)
        out.append(counts)
    return out[0], out[1]


def resampled_medians(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """[rows, num] medians of each row of `x` [rows, n] resampled by `counts` [num, n] (how often
    each sample is drawn in each resample): the two middle values are where the cumulative counts
    over the row's sorted samples pass the middle; the values np.median of the drawn samples takes,
    without sorting rows x num resamples. The one bootstrap median of compare (one row) and of the
    effects (report/effects.py: rows of one sample count at once)."""
    n = x.shape[1]
    order = np.argsort(x, axis=1, kind="stable")
    cum = np.cumsum(counts[:, order].transpose(1, 0, 2), axis=2)  # [rows, num, n]
    lo, hi = (cum <= (n - 1) // 2).sum(axis=2), (cum <= n // 2).sum(axis=2)
    xs = np.take_along_axis(x, order, axis=1)
    return (np.take_along_axis(xs, lo, axis=1) + np.take_along_axis(xs, hi, axis=1)) / 2.0


def interval(resampled: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile interval of resampled figures; (NaN, NaN) without resamples."""
    if not len(resampled):
        return float("nan"), float("nan")
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(resampled, [tail, 100.0 - tail])
    return float(lo), float(hi)


def geometric_mean(ratios, resampled: Sequence[np.ndarray] = ()) -> tuple[float, float, float]:
    """(geometric mean of `ratios`, interval low, high). The interval comes from the rows'
    resamples (bootstrap_ratios, one array per ratio, all of one length) where every row
    has them, else NaN."""
    r = np.asarray(ratios, dtype=float)
    r = r[np.isfinite(r) & (r > 0)]
    if not len(r):
        return float("nan"), float("nan"), float("nan")
    g = float(np.exp(np.mean(np.log(r))))
    arrays = [a for a in resampled if len(a)]
    if len(arrays) != len(r) or not arrays or len({len(a) for a in arrays}) != 1:
        return g, float("nan"), float("nan")
    boot = np.exp(np.mean(np.log(np.vstack(arrays)), axis=0))
    lo, hi = interval(boot)
    return g, lo, hi


def pct(ratio: float) -> float:
    """A ratio as a change in percent (0.917 -> -8.3)."""
    return (ratio - 1.0) * 100.0
