"""One tidy row per (combination, tokens per rank), aggregated over ranks:
the max over ranks for latency (per sample, since ranks start each sample
together), per-rank values kept in list columns."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from moebench.config.plugins import provenance
from moebench.config.spec import Combination
from moebench.results import row as schema
from moebench.results.rank_result import RankResult
from moebench.results.row import PHASES, SCHEMA_VERSION, Status
from moebench.traces.matched import CRITICAL_SPAN_TIE, critical_rank  # noqa: F401 (rows.critical_rank: its users)
from moebench.traces.metrics import METHOD_MATCHED

NAN = float("nan")
# the ablation's overlap_fraction interval (rows.overlap_interval): a 90 % percentile
# bootstrap over sample indices, with a fixed seed so that a row is reproducible
OVERLAP_CI = 0.90
OVERLAP_RESAMPLES = 1000
OVERLAP_SEED = 0
OVERLAP_MIN_SAMPLES = 5


def identity(c: Combination, tokens: int) -> dict:
    """The row's identity columns: every column of the spec (moebench/config/spec.py), the token
    count and the overrides it was planned from."""
    return {
        "schema_version": SCHEMA_VERSION,
        **c.combo.columns(),
        "tokens_per_rank": int(tokens),
        "overrides": " ".join(c.overrides),
    }


def _elementwise_max(lists: list[list[float]]) -> list[float]:
    n = min(len(x) for x in lists)
    return [max(x[i] for x in lists) for i in range(n)]


def _q(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p)) if xs else NAN


# RankResult fields (results/rank_result.py) by how measured_row combines them: by their column's
# rule (max, mean, rank 0's routing) or by a rule of its own below; a field in neither is an error
_OWN_RULE = frozenset(
    {
        "rank",
        "status",
        "reason",
        "timing_mode",
        "timing_note",
        "samples_us",
        "no_shared_samples_us",
        "shared_samples_us",
        "phases_us",
        "trace_overlap_fraction",
        "trace_intersection_fraction",
        "trace_layer_us",
        "trace_matched_overlap_per_rank",
        "trace_wait_us_per_rank",
        "trace_path",
        "trace_error",
        "trace_overlap_method",
        "row_layout_used",
        "contiguous_gemm_used",
        "tuned_files",
        "sm_clock_mhz_samples",
        "clock_reasons",
        "clock_note",
        "kernel_us",
        "profiler_trace_path",
    }
)


def _by_column_rule() -> set[str]:
    """The rank's columns measured_row combines by their declared rule."""
    return {
        c.name
        for c in schema.rank_columns()
        if c.combine in (schema.MAX, schema.MEAN) or (c.combine == schema.SAME and c.group == "routing")
    }


def unknown_fields() -> list[str]:
    """RankResult fields measured_row would not put in a row (none: every field has a rule)."""
    known = _OWN_RULE | _by_column_rule()
    return [f.name for f in dataclasses.fields(RankResult) if f.name not in known]


def _values(ranks: list, key: str) -> list:
    """The ranks' values of `key` (a phase, or a RankResult field), NaN and None left out."""
    vals = [r.phases_us.get(key) if key in PHASES else getattr(r, key) for r in ranks]
    return [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]


def _max(ranks: list, key: str) -> float:
    vals = _values(ranks, key)
    return float(max(vals)) if vals else NAN


def _mean(ranks: list, key: str) -> float:
    vals = _values(ranks, key)
    return float(sum(vals) / len(vals)) if vals else NAN


def overlap_fraction(layer_us, no_shared_us, shared_us):
    """clamp(1 − (layer − no_shared) / shared, 0, 1) from the three medians (µs), elementwise
    over arrays; NaN where shared ≤ 0 or a median is NaN (docs/design.md, "Overlap by ablation")."""
    layer, no_shared, shared = (np.asarray(x, dtype=float) for x in (layer_us, no_shared_us, shared_us))
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.clip(1.0 - (layer - no_shared) / shared, 0.0, 1.0)
    return np.where(shared > 0, frac, NAN)


def overlap_interval(samples_us, no_shared_samples_us, shared_samples_us) -> tuple[float, float]:
    """(lo, hi): the OVERLAP_CI percentile bootstrap interval of overlap_fraction, or NaNs
    below OVERLAP_MIN_SAMPLES samples.

    Inputs are the interleaved samples (µs) of the layer, the layer without its shared
    experts and the shared experts alone, sample i of each taken back to back. Each
    resample draws sample indices with replacement and keeps the three samples of an
    index together, so drift that moves a whole triplet cancels in the exposed time as
    it does in the point estimate; it then takes the three medians and overlap_fraction.
    """
    n = min(len(samples_us), len(no_shared_samples_us), len(shared_samples_us))
    if n < OVERLAP_MIN_SAMPLES:
        return NAN, NAN
    x_3N = np.array([samples_us[:n], no_shared_samples_us[:n], shared_samples_us[:n]], dtype=float)
    if not np.isfinite(x_3N).all():
        return NAN, NAN
    idx_BN = np.random.default_rng(OVERLAP_SEED).integers(0, n, size=(OVERLAP_RESAMPLES, n))
    med_3B = np.median(x_3N[:, idx_BN], axis=2)  # [3, resamples]: ~10 ms at 80 samples
    frac = overlap_fraction(med_3B[0], med_3B[1], med_3B[2])
    frac = frac[np.isfinite(frac)]
    if not len(frac):
        return NAN, NAN
    tail = 100 * (1 - OVERLAP_CI) / 2
    lo, hi = np.percentile(frac, [tail, 100 - tail])
    return float(lo), float(hi)


def empty_measurements() -> dict:
    """The measured columns of row.py at their defaults (provenance comes with the run's meta)."""
    prov = set(schema.names("provenance"))
    return {k: v for k, v in schema.empty().items() if k not in prov}


def outcome_row(c: Combination, tokens: int, status: str, reason: str, meta: dict, rel_err: float = NAN) -> dict:
    """A row without measurements (skipped / failed / timeout / oom)."""
    row = {**identity(c, tokens), **provenance(c), **empty_measurements(), **per_rank_columns(0), **meta}
    row.update(status=Status(status).value, reason=reason, rel_err=rel_err)  # a plain string to Parquet
    return row


def clock_columns(ranks: list) -> dict:
    """The clock group's own rules (measure/clock.py): each sample's clock is the slowest rank's,
    the band is the min / median / max of those, the NVML reasons are the ranks' union."""
    clocks = [r.sm_clock_mhz_samples for r in ranks]
    per_sample = [float(min(c)) for c in zip(*clocks, strict=False)] if all(clocks) else []
    finite = [c for c in per_sample if c == c]
    out: dict[str, Any] = {f"sm_clock_mhz_{q}": _q(finite, p) for q, p in (("min", 0), ("median", 50), ("max", 100))}
    out["sm_clock_mhz_samples"] = per_sample
    out["clock_reasons"] = ",".join(sorted({x for r in ranks for x in (r.clock_reasons or "").split(",") if x}))
    out["clock_note"] = next((r.clock_note for r in ranks if r.clock_note), "")
    return out


def per_rank_columns(n: int) -> dict:
    """The list columns with one value per rank (NaN each until measured)."""
    return {c: [NAN] * n for c in schema.names(combine=schema.PER_RANK)}


def measured_row(c: Combination, tokens: int, ranks: list[RankResult], meta: dict) -> dict:
    """Aggregate the per-rank results of one (combination, tokens). ValueError for a RankResult
    field without a rule here (a column declared `rank` in row.py whose combine rule is not
    max, mean or routing's same): say how its ranks combine."""
    if unknown := unknown_fields():
        raise ValueError(
            f"RankResult field(s) {unknown}: results/rows.py has no rule to combine them over ranks; "
            "declare their column in results/row.py with combine max or mean, or add the rule to rows.py"
        )
    row = {**identity(c, tokens), **provenance(c), **empty_measurements(), **per_rank_columns(len(ranks)), **meta}
    row["rel_err"] = _max(ranks, "rel_err")  # a bad row keeps it
    bad = [r for r in ranks if r.status != Status.OK]
    if bad:
        row.update(status=Status(bad[0].status).value, reason=bad[0].reason)  # a plain string to Parquet
        return row
    row["status"] = Status.OK.value
    for k in schema.names(group="phase"):  # each rank's phases_us
        row[k] = _max(ranks, k.removesuffix("_us"))
    for k in _by_column_rule() & set(schema.names(combine=schema.MAX)):
        row[k] = _max(ranks, k)
    # one rank paced by its host makes the row's figure host time (its samples are the max)
    modes = {r.timing_mode for r in ranks}
    row["timing_mode"] = "host" if "host" in modes else ranks[0].timing_mode
    row["timing_note"] = next(
        (r.timing_note for r in ranks if r.timing_mode == row["timing_mode"] and r.timing_note), ""
    )
    samples = _elementwise_max([r.samples_us for r in ranks])
    row["samples_us"] = samples
    row["latency_us_median"] = _q(samples, 50)
    row["latency_us_p20"] = _q(samples, 20)
    row["latency_us_p80"] = _q(samples, 80)
    row["latency_us_per_rank"] = [_q(r.samples_us, 50) for r in ranks]
    row.update(clock_columns(ranks))
    if all(r.shared_samples_us is not None for r in ranks):
        shared = _elementwise_max([r.shared_samples_us for r in ranks])
        no_shared = _elementwise_max([r.no_shared_samples_us for r in ranks])
        row["shared_us"] = _q(shared, 50)
        row["latency_no_shared_us"] = _q(no_shared, 50)
        # overlap by ablation (docs/design.md): what the shared experts add to the layer
        row["shared_exposed_us"] = row["latency_us_median"] - row["latency_no_shared_us"]
        row["overlap_fraction"] = float(
            overlap_fraction(row["latency_us_median"], row["latency_no_shared_us"], row["shared_us"])
        )
        # the layer takes ~20x the shared experts at prefill sizes, so percent-level noise in
        # the two latency medians moves the fraction by tens of points: say how far
        if row["overlap_fraction"] == row["overlap_fraction"]:
            row["overlap_fraction_lo"], row["overlap_fraction_hi"] = overlap_interval(samples, no_shared, shared)
    for k in _by_column_rule() & set(schema.names(combine=schema.MEAN)):
        row[k] = _mean(ranks, k)
    # without every rank's span (below), the trace figures are the ranks' mean
    for k in ("trace_overlap_fraction", "trace_intersection_fraction"):
        row[k] = _mean(ranks, k)
    # trace figures: the critical rank's, as the ablation's latency is the max over ranks.
    # A rank that reaches the combine early hides its shared experts in its wait for the
    # other rank, which sets the layer's end: the rank whose layer samples span longest in
    # its trace. Without every rank's span, the ranks' mean (docs/findings/trace-vs-ablation.md).
    crit = critical_rank([r.trace_layer_us for r in ranks])
    if crit is not None:
        row["trace_critical_rank"] = crit
        for k in ("trace_overlap_fraction", "trace_intersection_fraction"):
            v = getattr(ranks[crit], k)
            row[k] = float(v) if v is not None else NAN
    # derived per rank (docs/design.md); the row holds the mean (trace figures: see above)
    fields = {f.name for f in dataclasses.fields(RankResult)}
    for col in schema.names(combine=schema.PER_RANK):
        if (k := col.removesuffix("_per_rank")) in fields:  # the rest are set above and below
            row[col] = [float(v) if (v := getattr(r, k)) is not None else NAN for r in ranks]
    # several ranks with every trace readable on rank 0: the overlap on communication intervals
    # trimmed of the wait for the last rank (traces/metrics.py), of the rank that waited least
    # (the critical path; docs/findings/trace-vs-ablation.md)
    row["trace_wait_us_per_rank"] = [NAN] * len(ranks)
    row["trace_trimmed_overlap_per_rank"] = [NAN] * len(ranks)
    matched = ranks[0].trace_matched_overlap_per_rank
    waits = ranks[0].trace_wait_us_per_rank
    ok = matched and waits and len(matched) == len(waits) == len(ranks)
    matched = matched if ok and all(v is not None and v == v for v in matched) else None
    if matched:
        crit = min(range(len(waits)), key=lambda r: waits[r])
        row["trace_critical_rank"] = crit
        row["trace_overlap_fraction"] = float(matched[crit])
        v = ranks[crit].trace_intersection_fraction
        row["trace_intersection_fraction"] = float(v) if v is not None else NAN
        row["trace_trimmed_overlap_per_rank"] = [float(v) for v in matched]
        row["trace_wait_us_per_rank"] = [float(v) for v in waits]
    row["trace_path"] = ranks[crit if crit is not None else 0].trace_path
    row["trace_error"] = "; ".join(sorted({r.trace_error for r in ranks if r.trace_error}))
    # stretch | intersection; "mixed" when the ranks' traces disagree (the mean then mixes two figures)
    methods = {r.trace_overlap_method for r in (ranks if crit is None else [ranks[crit]]) if r.trace_overlap_method}
    row["trace_overlap_method"] = methods.pop() if len(methods) == 1 else ("mixed" if methods else "")
    if matched:
        row["trace_overlap_method"] = METHOD_MATCHED
    for k in sorted(_by_column_rule() & set(schema.names(group="routing", combine=schema.SAME))):
        row[k] = getattr(ranks[0], k)  # rank 0's (the same on every rank)
    # experts=triton + bf16 / fp8_block: the row layout apply() ran ("mixed" when the ranks differ)
    for k in ("row_layout_used", "contiguous_gemm_used"):  # (and its contiguous GEMMs' kernels)
        used = {getattr(r, k) or "" for r in ranks}
        row[k] = used.pop() if len(used) == 1 else "mixed"
    # the Triton experts' tuned files (None: experts that read none; kernels/triton/config.py)
    named = {r.tuned_files for r in ranks}
    row["tuned_files"] = named.pop() if len(named) == 1 else "mixed"
    if ranks[0].kernel_us is not None:  # profiler mode: per-rank communication kernel durations (JSON)
        row["kernel_us"] = [r.kernel_us or "{}" for r in ranks]
    return row
