"""The bootstrap's median (report/stats.py resampled_medians, compare's and the effects' one):
each resample's value is np.median of the samples that resample draws, for odd and even sample
counts (an even count takes the mean of the two middle values, not one of them) and with ties."""

from __future__ import annotations

import numpy as np
import pytest

from moebench.report.stats import _draw_counts, bootstrap_ratios, resampled_medians


def _drawn(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The samples one resample draws: each sample of `x` as often as `counts` says."""
    return np.repeat(x, counts)


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 30, 31])
@pytest.mark.parametrize("ties", [False, True])
def test_resampled_medians_are_np_median_of_the_drawn_samples(n, ties):
    rng = np.random.default_rng(n)
    x = rng.lognormal(3.0, 0.3, size=(4, n))
    if ties:
        x = x.round(0)  # many equal samples
    idx = rng.integers(0, n, size=(200, n))
    counts = np.stack([np.bincount(d, minlength=n) for d in idx])  # [resamples, n]
    got = resampled_medians(x, counts)
    assert got.shape == (4, 200)
    want = np.array([[np.median(_drawn(row, c)) for c in counts] for row in x])
    np.testing.assert_array_equal(got, want)


def test_resampled_medians_differ_from_the_mean_and_one_middle_value():
    """The cases the check above guards: an even count whose two middle values differ."""
    x = np.array([[1.0, 2.0, 10.0, 40.0]])
    once = np.ones((1, 4), dtype=int)
    assert resampled_medians(x, once)[0, 0] == 6.0  # not 2 or 10 (one middle), not 13.25 (the mean)


def test_bootstrap_ratios_are_the_ratio_of_the_drawn_medians():
    rng = np.random.default_rng(0)
    base, cand = rng.lognormal(3.0, 0.2, 12), rng.lognormal(3.0, 0.2, 9)
    counts_b, counts_c = _draw_counts(12, 9, 50, 0)
    want = [
        np.median(_drawn(cand, cc)) / np.median(_drawn(base, cb)) for cb, cc in zip(counts_b, counts_c, strict=True)
    ]
    np.testing.assert_array_equal(bootstrap_ratios(base, cand, num=50), want)
