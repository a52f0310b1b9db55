"""One tidy row per (combination, tokens per rank), aggregated over ranks:
the max over ranks for latency (per sample, since ranks start each sample
together), per-rank values kept in list columns."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from . import SCHEMA_VERSION
from .plan import Combination
from .traces.metrics import METHOD_MATCHED

STATUSES = ("ok", "skipped", "failed", "timeout", "oom", "incorrect")
PHASES = ("prepare", "dispatch", "experts", "weight_reduce", "combine")
# trace layer spans closer than this (relative) name no critical rank (rows.measured_row)
CRITICAL_SPAN_TIE = 0.005
NAN = float("nan")


def identity(c: Combination, tokens: int) -> dict:
    k = c.combo
    return {
        "schema_version": SCHEMA_VERSION,
        "combo_key": c.key,
        "label": c.label,
        "backend": k["backend"], "experts": k["experts"], "reduction": k["reduction"], "overlap": k["overlap"],
        "model": k["model"], "num_experts": k["num_experts"], "topk": k["topk"], "hidden": k["hidden"],
        "intermediate": k["intermediate"], "quant": k["quant"], "world_size": k["world_size"],
        "simulate_ep": k["simulate_ep"], "tokens_per_rank": int(tokens), "routing": k["routing"],
        "seed": k["seed"], "timing_mode": k["timing_mode"], "device": k["device"],
        # knobs beside the axes (plan.Combination.label tags them when off their defaults)
        "num_sms": k["num_sms"], "dispatch_nvl_chunk": k.get("dispatch_nvl_chunk", 0),
        "combine_nvl_chunk": k.get("combine_nvl_chunk", 0), "shared_sm_carveout": k.get("shared_sm_carveout", 0),
        "fp8_layout": k.get("fp8_layout", "auto"),
        "overrides": " ".join(c.overrides),
    }


def _elementwise_max(lists: list[list[float]]) -> list[float]:
    n = min(len(x) for x in lists)
    return [max(x[i] for x in lists) for i in range(n)]


def _q(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p)) if xs else NAN


def _values(ranks: list[dict], key: str) -> list:
    return [r[key] for r in ranks if r.get(key) is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]


def _max(ranks: list[dict], key: str) -> float:
    vals = _values(ranks, key)
    return float(max(vals)) if vals else NAN


def _mean(ranks: list[dict], key: str) -> float:
    vals = _values(ranks, key)
    return float(sum(vals) / len(vals)) if vals else NAN


def critical_rank(spans: list) -> Optional[int]:
    """The rank whose layer samples span longest in its trace (µs per rank), or None: one
    rank, a span missing, or the two longest within CRITICAL_SPAN_TIE of each other."""
    if len(spans) < 2 or not all(isinstance(s, (int, float)) and s == s for s in spans):
        return None
    order = sorted(range(len(spans)), key=lambda i: spans[i], reverse=True)
    if spans[order[0]] - spans[order[1]] <= CRITICAL_SPAN_TIE * spans[order[0]]:
        return None
    return order[0]


def empty_measurements() -> dict:
    row = {
        "status": None, "reason": "", "rel_err": NAN,
        "latency_us_median": NAN, "latency_us_p20": NAN, "latency_us_p80": NAN,
        "samples_us": [], "latency_us_per_rank": [],
        "shared_us": NAN, "latency_no_shared_us": NAN, "shared_exposed_us": NAN,
        "overlap_fraction": NAN, "trace_overlap_fraction": NAN, "trace_intersection_fraction": NAN,
        "trace_critical_rank": NAN,
        "trace_overlap_method": "",
        "workspace_bytes_analytic": NAN, "workspace_bytes_peak": NAN, "device_bytes_peak": NAN,
        "analytic_peak_bytes": NAN, "tflops": NAN, "hbm_gbps": NAN, "nvlink_gbps": NAN,
        "expert_flops": NAN, "expert_bytes": NAN, "trace_path": "", "fp8_layout_used": "",
    }
    for p in PHASES:
        row[f"{p}_us"] = NAN
    return row


def outcome_row(c: Combination, tokens: int, status: str, reason: str, meta: dict, rel_err: float = NAN) -> dict:
    """A row without measurements (skipped / failed / timeout / oom)."""
    assert status in STATUSES, status
    row = {**identity(c, tokens), **empty_measurements(), **meta}
    row.update(status=status, reason=reason, rel_err=rel_err)
    return row


def measured_row(c: Combination, tokens: int, ranks: list[dict], meta: dict) -> dict:
    """Aggregate the per-rank results of one (combination, tokens)."""
    row = {**identity(c, tokens), **empty_measurements(), **meta}
    row["rel_err"] = _max(ranks, "rel_err")
    bad = [r for r in ranks if r.get("status") != "ok"]
    if bad:
        row.update(status=bad[0].get("status", "failed"), reason=bad[0].get("reason", ""))
        return row
    row["status"] = "ok"
    row["timing_mode"] = ranks[0].get("timing_mode", row["timing_mode"])
    samples = _elementwise_max([r["samples_us"] for r in ranks])
    row["samples_us"] = samples
    row["latency_us_median"] = _q(samples, 50)
    row["latency_us_p20"] = _q(samples, 20)
    row["latency_us_p80"] = _q(samples, 80)
    row["latency_us_per_rank"] = [_q(r["samples_us"], 50) for r in ranks]
    for p in PHASES:
        row[f"{p}_us"] = _max(ranks, p)
    if all("shared_samples_us" in r for r in ranks):
        row["shared_us"] = _q(_elementwise_max([r["shared_samples_us"] for r in ranks]), 50)
        row["latency_no_shared_us"] = _q(_elementwise_max([r["no_shared_samples_us"] for r in ranks]), 50)
        # overlap by ablation (DESIGN.md): what the shared experts add to the layer
        row["shared_exposed_us"] = row["latency_us_median"] - row["latency_no_shared_us"]
        if row["shared_us"] > 0:
            row["overlap_fraction"] = min(1.0, max(0.0, 1.0 - row["shared_exposed_us"] / row["shared_us"]))
    for k in ("workspace_bytes_analytic", "workspace_bytes_peak", "device_bytes_peak", "analytic_peak_bytes"):
        row[k] = _max(ranks, k)
    for k in ("tflops", "hbm_gbps", "nvlink_gbps", "trace_overlap_fraction", "trace_intersection_fraction",
              "expert_flops", "expert_bytes"):
        row[k] = _mean(ranks, k)
    # trace figures: the critical rank's, as the ablation's latency is the max over ranks.
    # A rank that reaches the combine early hides its shared experts in its wait for the
    # other rank, which sets the layer's end: the rank whose layer samples span longest in
    # its trace. Without every rank's span, the ranks' mean (docs/perf-notes.md, run 13).
    crit = critical_rank([r.get("trace_layer_us") for r in ranks])
    if crit is not None:
        row["trace_critical_rank"] = crit
        for k in ("trace_overlap_fraction", "trace_intersection_fraction"):
            v = ranks[crit].get(k)
            row[k] = float(v) if v is not None else NAN
    # derived per rank (DESIGN.md); the row holds the mean (trace figures: see above)
    for k in ("tflops", "hbm_gbps", "nvlink_gbps", "trace_overlap_fraction", "trace_layer_us"):
        row[f"{k}_per_rank"] = [float(r.get(k, NAN)) for r in ranks]
    # several ranks with every trace readable on rank 0: the overlap on communication intervals
    # trimmed of the wait for the last rank (traces/metrics.py), of the rank that waited least
    # (the critical path; docs/perf-notes.md, session 4)
    row["trace_wait_us_per_rank"] = [NAN] * len(ranks)
    row["trace_trimmed_overlap_per_rank"] = [NAN] * len(ranks)
    matched = ranks[0].get("trace_matched_overlap_per_rank")
    waits = ranks[0].get("trace_wait_us_per_rank")
    ok = matched and waits and len(matched) == len(waits) == len(ranks)
    matched = matched if ok and all(v is not None and v == v for v in matched) else None
    if matched:
        crit = min(range(len(waits)), key=lambda r: waits[r])
        row["trace_critical_rank"] = crit
        row["trace_overlap_fraction"] = float(matched[crit])
        v = ranks[crit].get("trace_intersection_fraction")
        row["trace_intersection_fraction"] = float(v) if v is not None else NAN
        row["trace_trimmed_overlap_per_rank"] = [float(v) for v in matched]
        row["trace_wait_us_per_rank"] = [float(v) for v in waits]
    row["trace_path"] = ranks[crit if crit is not None else 0].get("trace_path", "")
    # stretch | intersection; "mixed" when the ranks' traces disagree (the mean then mixes two figures)
    methods = {r.get("trace_overlap_method") for r in (ranks if crit is None else [ranks[crit]])
               if r.get("trace_overlap_method")}
    row["trace_overlap_method"] = methods.pop() if len(methods) == 1 else ("mixed" if methods else "")
    if matched:
        row["trace_overlap_method"] = METHOD_MATCHED
    # experts=triton + fp8_block: the row layout apply() ran ("mixed" when the ranks differ)
    layouts = {r.get("fp8_layout_used") or "" for r in ranks}
    row["fp8_layout_used"] = layouts.pop() if len(layouts) == 1 else "mixed"
    if "kernel_us" in ranks[0]:  # profiler mode: per-rank communication kernel durations
        row["kernel_us"] = [r.get("kernel_us", "{}") for r in ranks]
    return row
