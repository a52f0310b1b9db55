"""What each choice does: the effect of one axis value against a baseline value, over the pairs
of rows that differ only in that axis (docs/design.md, "What each choice does").

A pair is two measured rows whose every other combination column and token count agree: the
same workload, the same everything, only `reduction` (say) differs. Its effect is the ratio of
their latency medians; an axis value's effect at a token count is the geometric mean of its
pairs' ratios, with a 95 % bootstrap interval that resamples the pairs and, inside each pair,
each row's timed samples (so one pair still has an honest interval). Where the pairs disagree,
the effect is split by the axis that explains the disagreement best (`experts` is the usual one:
weight-and-reduce inside the experts helps a kernel that fuses it and not one that does not).

Latency here is GPU time only: rows whose samples the host paced (timing_mode `host`) are left
out and counted; a CPU run's effects are computed, and the report says what they are worth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from moebench.report.columns import fmt_series, num_distinct
from moebench.report.stats import resampled_medians
from moebench.util.words import counted

# an interval inside [1/BAND, BAND] is "no difference"; one that straddles a bound is
# "inconclusive"; one beyond a bound is faster / slower (compare's threshold, 5 %)
BAND = 1.05
CONFIDENCE = 0.95
RESAMPLES = 1000
SEED = 0
ROW_CHUNK = 256  # rows whose samples are resampled at once (memory: chunk x RESAMPLES x samples)

FASTER, SLOWER, SAME, UNSURE = "faster", "slower", "no difference", "inconclusive"

# the baseline value of an axis where the run holds it: the choice a change is measured
# against (the separate finalize stage, no overlap, bf16, the torch experts, the local
# backend, the entries' default knobs); otherwise the value with the most measured rows
PREFERRED_BASELINE = {"reduction": "finalize", "overlap": "none", "quant": "bf16", "experts": "torch"}
PREFERRED_BASELINE.update(backend="local", knobs="")
# the axes tried, in this order, to split an effect whose pairs disagree
INTERACTION_ORDER = ("experts", "backend", "quant", "overlap", "reduction")


@dataclass(frozen=True)
class Effect:
    """One axis value against the baseline at one token count (over the pairs of `by`=`by_value`
    where the effect is split, else over every pair)."""

    axis: str
    value: str
    baseline: str
    tokens: int
    ratio: float  # geometric mean of value / baseline latency over the pairs
    lo: float
    hi: float
    pairs: int
    by: str = ""  # the interacting axis the pairs were split by ("" when not split)
    by_value: str = ""
    memory_ratio: float = math.nan  # the pairs' workspace peaks, value's total / baseline's
    memory_delta_bytes: float = math.nan  # their mean difference (bytes)

    @property
    def verdict(self) -> str:
        return classify(self.lo, self.hi)


def classify(lo: float, hi: float) -> str:
    """FASTER / SLOWER where the interval lies beyond a bound of the band, SAME inside it,
    UNSURE where it straddles a bound (or is not finite)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return UNSURE
    if hi < 1 / BAND:
        return FASTER
    if lo > BAND:
        return SLOWER
    if lo >= 1 / BAND and hi <= BAND:
        return SAME
    return UNSURE


def varying_axes(df: pd.DataFrame, axes: list[str]) -> list[str]:
    """The axes (of `axes`, in that order) that take more than one value among `df`'s rows."""
    return [a for a in axes if a in df.columns and num_distinct(df[a]) > 1]


def baseline_value(df: pd.DataFrame, axis: str) -> str:
    """PREFERRED_BASELINE's value where `df` holds it, else the most common value (ties: the
    first in sorted order)."""
    values = fmt_series(df[axis])
    want = PREFERRED_BASELINE.get(axis)
    if want is not None and (values == want).any():
        return want
    counts = values.value_counts()
    return sorted(counts[counts == counts.max()].index)[0]


def _row_medians(samples: list, medians: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[rows, RESAMPLES] bootstrap medians of each row's samples; a row without samples keeps
    its stored median in every resample."""
    out = np.repeat(medians[:, None], RESAMPLES, axis=1).astype(float)
    lengths = np.array([len(s) if isinstance(s, (list, np.ndarray)) else 0 for s in samples])
    for n in sorted(set(lengths.tolist()) - {0}):
        rows = np.flatnonzero(lengths == n)
        idx = rng.integers(0, n, size=(RESAMPLES, n))
        counts = np.stack([np.bincount(d, minlength=n) for d in idx])  # [RESAMPLES, n]: draws of each sample
        for start in range(0, len(rows), ROW_CHUNK):
            part = rows[start : start + ROW_CHUNK]
            x = np.array([np.asarray(samples[i], dtype=float) for i in part])  # [rows, n]
            out[part] = resampled_medians(x, counts)
    return out


def _interval(log_pairs: np.ndarray, rng: np.random.Generator) -> tuple[float, float, int]:
    """(lo, hi, pairs): the CONFIDENCE interval of the pairs' geometric mean ratio, from their
    [pairs, RESAMPLES] bootstrap log ratios: resample b draws the pairs with replacement and
    takes each drawn pair's b-th resample of its rows' medians."""
    n = log_pairs.shape[0]
    pick = rng.integers(0, n, size=(RESAMPLES, n))  # resample the pairs
    cols = np.arange(RESAMPLES)[:, None]
    means = log_pairs[pick, cols].mean(axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return math.exp(lo), math.exp(hi), n


@dataclass
class _Pairs:
    axis: str
    value: str
    tokens: int
    a: np.ndarray  # row positions (value)
    b: np.ndarray  # row positions (baseline)


def pairs(df: pd.DataFrame, axis: str, key: list[str], baseline: str) -> list[_Pairs]:
    """Per (value, tokens), the row positions of the pairs that differ only in `axis`."""
    other = [c for c in key if c != axis and c in df.columns]
    texts = [fmt_series(df[c]) for c in other]
    keys = pd.Series(["\x1f".join(t) for t in zip(*texts, strict=True)] if other else "", index=df.index)
    values = fmt_series(df[axis])
    pos = pd.Series(np.arange(len(df)), index=df.index)
    base = {k: p for k, p, v in zip(keys, pos, values, strict=True) if v == baseline}
    found: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for k, p, v, t in zip(keys, pos, values, df["tokens_per_rank"], strict=True):
        if v == baseline or k not in base:
            continue
        a, b = found.setdefault((v, int(t)), ([], []))
        a.append(p)
        b.append(base[k])
    return [_Pairs(axis, v, t, np.array(a), np.array(b)) for (v, t), (a, b) in sorted(found.items())]


def _effect(
    p: _Pairs, sel: np.ndarray, boot: np.ndarray, point: np.ndarray, mem: np.ndarray, baseline: str, **split
) -> Effect:
    a, b = p.a[sel], p.b[sel]
    rng = np.random.default_rng(SEED)
    log_pairs = np.log(boot[a]) - np.log(boot[b])
    lo, hi, n = _interval(log_pairs, rng)
    ratio = math.exp(float(np.mean(np.log(point[a]) - np.log(point[b]))))
    ma, mb = mem[a], mem[b]
    good = np.isfinite(ma) & np.isfinite(mb) & (ma > 0) & (mb > 0)
    # the pairs' totals: the ratio and the mean difference then agree in sign
    mem_ratio = float(ma[good].sum() / mb[good].sum()) if good.any() else math.nan
    delta = float(np.mean(ma[good] - mb[good])) if good.any() else math.nan
    return Effect(p.axis, p.value, baseline, p.tokens, ratio, lo, hi, n, memory_ratio=mem_ratio,
                  memory_delta_bytes=delta, **split)  # fmt: skip


def axis_effects(df: pd.DataFrame, axes: list[str], key: list[str]) -> list[Effect]:
    """Every varying axis's effects in `df` (measured rows with a GPU-time latency): per value
    and token count, over all pairs, or split by the interacting axis where the pairs disagree
    (two of the split's intervals apart and their ratios more than BAND apart).

    `axes`: the columns whose values are choices (reduction, overlap, experts, backend, quant,
    knobs); `key`: every column that must agree within a pair (the axes and the workload's
    columns; `tokens_per_rank` is added).
    """
    df = df[df["latency_us_median"].map(lambda v: v is not None and v == v and v > 0)].reset_index(drop=True)
    if df.empty:
        return []
    point = df["latency_us_median"].to_numpy(dtype=float)
    samples = df["samples_us"].tolist() if "samples_us" in df.columns else [None] * len(df)
    boot = _row_medians(samples, point, np.random.default_rng(SEED))
    mem = (
        pd.to_numeric(df["workspace_bytes_peak"], errors="coerce").to_numpy(dtype=float)
        if "workspace_bytes_peak" in df.columns
        else np.full(len(df), math.nan)
    )
    key = [*key, "tokens_per_rank"]
    out: list[Effect] = []
    moving = varying_axes(df, axes)
    for axis in moving:
        baseline = baseline_value(df, axis)
        for p in pairs(df, axis, key, baseline):
            whole = _effect(p, np.arange(len(p.a)), boot, point, mem, baseline)
            split = _split(df, p, whole, [a for a in INTERACTION_ORDER if a in moving and a != axis], boot, point, mem)
            # memory over every pair of the token count, also where the latency is split
            out += [replace(e, memory_ratio=whole.memory_ratio, memory_delta_bytes=whole.memory_delta_bytes)
                    for e in split] or [whole]  # fmt: skip
    return out


def _split(df, p: _Pairs, whole: Effect, candidates: list[str], boot, point, mem) -> list[Effect]:
    """The effect per value of the candidate axis whose split separates most (the largest ratio
    between its parts' means, with two parts' intervals apart and beyond BAND); [] when none."""
    best: tuple[float, list[Effect]] = (BAND, [])
    for by in candidates:
        values = fmt_series(df[by]).to_numpy()[p.a]
        parts = [
            _effect(p, np.flatnonzero(values == v), boot, point, mem, whole.baseline, by=by, by_value=v)
            for v in sorted(set(values.tolist()))
        ]
        if len(parts) < 2:
            continue
        lo_part = min(parts, key=lambda e: e.ratio)
        hi_part = max(parts, key=lambda e: e.ratio)
        spread = hi_part.ratio / lo_part.ratio
        if lo_part.hi < hi_part.lo and spread > best[0]:
            best = (spread, parts)
    return best[1]


# -- text -----------------------------------------------------------------------------------------


def decimals(*ends: float) -> int:
    """The decimals (2, else 3, else 4) at which none of `ends` prints as a bound of the band it is
    not (1/BAND prints 0.95, then 0.952), so the label follows from the printed interval:
    [0.949, 0.954] straddles 1/BAND (inconclusive) but at two decimals reads [0.95, 0.95], as if
    inside (compare's fmt_change does the same for its percentages)."""
    bounds = (1 / BAND, BAND)
    d = 2
    while d < 4 and any(v != b and f"{v:.{d}f}" == f"{b:.{d}f}" for v in ends for b in bounds):
        d += 1
    return d


def _number(v: float, d: int) -> str:
    return f"{v:.{d}f}" if 0.1 <= v < 10 else f"{v:.3g}"


def fmt_ratio(r: float, d: int = 2) -> str:
    """`0.69 ×` (`d` decimals; three significant figures below 0.1 and above 10)."""
    if not math.isfinite(r):
        return "- ×"
    return f"{_number(r, d)} ×"


def fmt_interval(lo: float, hi: float, d: int | None = None) -> str:
    """`[0.68, 0.70]`: `d` decimals, by default two or as many as the band's bounds ask
    (`decimals`); three significant figures below 0.1 and above 10."""
    d = decimals(lo, hi) if d is None else d
    return f"[{_number(lo, d)}, {_number(hi, d)}]"


def fmt_mib_delta(b: float) -> str:
    """'+392 MiB', '−1.5 MiB'; a change that rounds to zero '+0.0 MiB', never '−0.0'."""
    mib = b / 2**20
    sign = "−" if round(mib, 1) < 0 else "+"
    return f"{sign}{abs(mib):,.0f} MiB" if abs(mib) >= 10 else f"{sign}{abs(mib):.1f} MiB"


def _phrase(e: Effect) -> str:
    words = "" if e.verdict in (FASTER, SLOWER) else f", {e.verdict}"
    d = decimals(e.lo, e.hi)  # the interval's ends decide the label; the ratio printed alike
    return f"{fmt_ratio(e.ratio, d)} {fmt_interval(e.lo, e.hi, d)} ({counted(e.pairs, 'pair')}{words})"


def effect_lines(effects: list[Effect]) -> list[str]:
    """One Markdown bullet per (axis, value): its effect at each token count, split where the
    pairs disagree, and its workspace beside it where memory was recorded:

    - `reduction=experts` vs `finalize`: at 128 tok 0.97 × [0.96, 0.98] (11 pairs, no difference); at
      4096 tok with experts=deepgemm 0.71 × [0.70, 0.72] (3 pairs), torch 1.01 × [...]; workspace 0.72 ×
      (−392 MiB) at 4096 tok
    """
    lines = []
    groups: dict[tuple[str, str, str], list[Effect]] = {}
    for e in effects:
        groups.setdefault((e.axis, e.value, e.baseline), []).append(e)
    for (axis, value, baseline), es in groups.items():
        parts = []
        for t in sorted({e.tokens for e in es}):
            at = [e for e in es if e.tokens == t]
            if at[0].by:
                split = ", ".join(f"{e.by_value} {_phrase(e)}" for e in at)
                parts.append(f"at {t} tok with {at[0].by}={split}")
            else:
                parts.append(f"at {t} tok {_phrase(at[0])}")
        mem = [e for e in es if math.isfinite(e.memory_ratio)]
        memory = ""
        if mem:
            big = max(mem, key=lambda e: e.tokens)  # the largest token count's
            delta = fmt_mib_delta(big.memory_delta_bytes)
            memory = f"; workspace {fmt_ratio(big.memory_ratio)} ({delta}) at {big.tokens} tok"
        lines.append(f"- `{axis}={value}` vs `{baseline}`: " + "; ".join(parts) + memory)
    return lines
