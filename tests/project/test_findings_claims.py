"""The headline figures of docs/findings/*.md, recomputed from the committed data.

Each claim is a passage of a findings file with its figures as format fields, and a query of
the committed results (rows, JSON, logs) that gives those figures. The test fills the passage
with the query's figures and asserts that the file contains it (whitespace and line breaks
aside): a figure edited in the doc without its data, or data replaced without the doc, fails.
A figure's tolerance is its stated precision: the recomputed value, rounded as the doc writes
it, must be the doc's figure. Figures that no committed data holds (the GPU suite's printed
ratios, figures quoted against the ceilings read before results/ceilings/ held any) are not
claims here; their docs say so. Floors use the committed ceilings
(results/ceilings/nvidia-h200/ceilings.json) through moebench.report.roofline, as reports do.
"""

from __future__ import annotations

import functools
import json
import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import pytest
from findings_floors import (  # the floors' queries, at the committed ceilings
    bf16_16384,
    bf16_gemms_alone,
    busy,
    busy_ranges,
    busy_vs_replay_points,
    deepgemm_16384,
    first_session,
    fold_line,
    gemm_ranges,
    graph_replays,
    h200,
    hbm_floor_us,
    mixtral_decode_tiles,
    mixtral_gemm_fall,
    pct_of_hbm_floor,
    predicted_16384,
    quant_fix_qwen3_16,
    quant_floor,
    qwen3_above_floor,
    read_mostly,
    shared_expert_floor,
    split_line,
    target_misses,
    tflops,
    tuned_prefill,
)

from moebench.results.store import RunStore

REPO = Path(__file__).resolve().parents[2]
RESULTS, FINDINGS = REPO / "results", REPO / "docs" / "findings"


@dataclass(frozen=True)
class Claim:
    doc: str  # a file of docs/findings/
    passage: str  # the doc's text, each figure a format field
    query: Callable[[], Sequence]  # the figures, in the passage's order, from committed data


def normalized(text: str) -> str:
    return " ".join(text.split())


@functools.cache
def doc(name: str) -> str:
    return normalized((FINDINGS / name).read_text())


@functools.cache
def rows(run: str) -> pd.DataFrame:
    return RunStore(RESULTS / run).load()


def signed(x: float, digits: int = 1) -> str:
    """'+2.1' / '−0.7' as the docs write a signed figure (a minus sign, not a hyphen)."""
    s = f"{x:+.{digits}f}"
    return s.replace("-", "−")


def spaced(n: float) -> str:
    """54087 -> '54 087', the docs' thousands."""
    return f"{int(n):,}".replace(",", " ")


def pct_diff(a: float, b: float) -> float:
    return 100 * (a / b - 1)


# --- timing.md: results/timing_modes, results/default_sweep --------------------------------


@functools.cache
def timing_modes() -> dict:
    return {r["case"]: r for r in json.loads((RESULTS / "timing_modes" / "timing_modes_h200x1.json").read_text())}


def default_sweep_graph_rows():
    df = rows("default_sweep/h200x1")
    sel = df[
        (df.status == "ok")
        & (df.tokens_per_rank == 128)
        & (df.experts == "triton_or_deepgemm")
        & (df.quant == "fp8_block")
        & (df.reduction == "experts")
    ].set_index("overlap")
    assert (sel.loc[["none", "combine"], "timing_mode"] == "graph").all()
    spread = max(sel.loc[o, "latency_us_p80"] / sel.loc[o, "latency_us_p20"] for o in ("none", "combine"))
    return [sel.loc["none", "latency_us_median"], sel.loc["combine", "latency_us_median"], spread]


def graph_vs_cudagraph():
    t = timing_modes()
    cases = ["dsv3_ep8_tod_fp8_none", "dsv3_ep8_tod_fp8_combine", "mixtral_triton_bf16", "qwen3_triton_fp8"]
    d = [signed(pct_diff(t[c]["graph_us"], t[c]["cudagraph_bench_us"])) for c in cases]
    first = t[cases[0]]
    return [d[0], first["graph_us"], first["cudagraph_bench_us"], *d[1:]]


@functools.cache
def validation():
    """benchmarks/timing_validation.py's table of results/timing_modes/validation_h200x1."""
    from moebench.report.load import load_run

    tv = _bench("timing_validation")
    df, _ = load_run(RESULTS / "timing_modes" / "validation_h200x1")
    ok = df[df.status == "ok"]
    assert len(ok) == 150 and (ok.host_paced_samples == 0).all()  # "no sample ... was host-paced"
    return tv, tv.by_timing(df)


def events_over_graph():
    tv, t = validation()
    r = t["events_over_graph"]
    bad, checked = tv.order_failures(t)
    assert not bad and not tv.ratio_failures(t)
    return [r.min(), r.max(), len(r), checked, checked]


def events_over_graph_by_size():
    _, t = validation()
    pct = lambda x: f"{100 * (x - 1):.1f}"
    g = t.groupby("tokens_per_rank")["events_over_graph"]
    return [pct(g.min()[16]), pct(g.max()[16]), pct(g.min()[16384]), pct(g.max()[16384])]


def qwen3_1024_order():
    _, t = validation()
    sel = t[(t.model == "qwen3_30b_a3b") & (t.quant == "fp8_block") & (t.tokens_per_rank == 1024)].set_index("experts")
    return [
        sel.loc["triton", "graph_us"] / sel.loc["deepgemm", "graph_us"],
        sel.loc["deepgemm", "graph_us"],
        sel.loc["triton", "graph_us"],
    ]


def default_held():
    tv = _bench("timing_validation")
    # the pair measured in one call at 16c72ff
    m = tv.default_pairs(
        RESULTS / "default_sweep" / "h200x1_held_16c72ff", RESULTS / "default_sweep" / "h200x1_held_events"
    )
    assert len(m) == 138 and (m["timing_mode_auto"] == "graph").all()
    for run in ("h200x1_held_16c72ff", "h200x1_held_events", "h200x1_held"):
        ok = rows(f"default_sweep/{run}")
        assert (ok[ok.status == "ok"].host_paced_samples == 0).all(), run
    return [len(m), m["events_over_auto"].min(), m["events_over_auto"].max()]


def default_phase_sums():
    """16c72ff's run (no shared-expert phase yet) against d751099's (shared_experts_us recorded)."""
    from moebench.report.load import PHASE_COLUMNS, phase_sum

    df = rows("default_sweep/h200x1_held_16c72ff")
    ok = df[(df.status == "ok") & (df.tokens_per_rank == 4096)]
    routed = (
        ok[[c for c in PHASE_COLUMNS if c in ok.columns and c != "shared_experts_us"]].sum(axis=1)
        / ok.latency_us_median
    )
    off = routed[(routed - 1).abs() > 0.25]
    now = rows("default_sweep/h200x1_held")
    now = now[now.status == "ok"]
    assert (now.timing_mode == "graph").all() and len(now) == 138
    every = now.apply(phase_sum, axis=1) / now.latency_us_median
    shared = now[now.tokens_per_rank == 4096].shared_experts_us.median()
    return [len(off), off.min(), off.max(), shared, every.min(), every.max()]


# --- deepep-pplx.md: results/deepep_vs_own_benchmarks, results/deepep_ll, results/pplx_race ---


def _bench(module: str):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return __import__(module)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def kernels_per_rank(run: str, names: dict) -> dict:
    """(quant, overlap) -> [{kernel: µs} per rank], from the rows' profiler kernel times."""
    sums = _bench("_deepep_compare").kernel_sums
    return {
        (r.quant, r.overlap): [sums(json.loads(k), names) for k in r.kernel_us]
        for r in rows(run).itertuples()
        if r.status == "ok"
    }


def ht_line(kernel: str, quant: str, deepep_key: str):
    ht = _bench("deepep_ht_profiler")
    ref = ht.parse_intranode((RESULTS / "deepep_vs_own_benchmarks/ht/deepep_test_intranode.log").read_text())
    ours = [
        k[kernel]
        for k in kernels_per_rank(
            "deepep_vs_own_benchmarks/ht", {"dispatch": "intranode::dispatch<", "combine": "intranode::combine<"}
        )[(quant, "none")]
    ]
    theirs = ref[deepep_key]["default"]
    return [theirs, *ours, *(signed(pct_diff(x, theirs)) for x in ours)]


def ht_combine():
    ref, r0, r1, d0, d1 = ht_line("combine", "bf16", "combine")
    assert d0 == d1  # the doc gives one difference for both ranks
    best = _bench("deepep_ht_profiler").parse_intranode(
        (RESULTS / "deepep_vs_own_benchmarks/ht/deepep_test_intranode.log").read_text()
    )["combine"]["best"]
    fp8 = [
        k["combine"]
        for k in kernels_per_rank(
            "deepep_vs_own_benchmarks/ht", {"dispatch": "intranode::dispatch<", "combine": "intranode::combine<"}
        )[("fp8_block", "none")]
    ]
    return [ref, best, r0, r1, *fp8, d0]


def low_latency():
    ll = _bench("deepep_ll_profiler")
    ref = ll.parse_low_latency((RESULTS / "deepep_vs_own_benchmarks/ll/deepep_test_low_latency.log").read_text())
    ours = kernels_per_rank(
        "deepep_vs_own_benchmarks/ll", {"dispatch": "internode_ll::dispatch", "combine": "internode_ll::combine"}
    )
    single, dhook, chook = ours[("fp8_block", "none")], ours[("fp8_block", "dispatch")], ours[("fp8_block", "combine")]
    r0, r1 = ref[0], ref[1]
    return [
        r1["dispatch"],
        single[1]["dispatch"],
        r1["combine"],
        single[1]["combine"],
        r0["dispatch_hook"],
        r1["dispatch_hook"],
        dhook[0]["dispatch"],
        dhook[1]["dispatch"],
        r0["combine_hook"],
        r1["combine_hook"],
        chook[0]["combine"],
        chook[1]["combine"],
        single[0]["dispatch"],
        single[0]["combine"],
    ]


def deepep_ll_layers():
    df = rows("deepep_ll")
    ok = df[df.status == "ok"]
    ms = lambda sel: ok[sel].latency_us_median / 1e3
    fp8, bf16 = (
        ms((ok.experts == "triton_batched") & (ok.quant == "fp8_block")),
        ms((ok.experts == "triton_batched") & (ok.quant == "bf16")),
    )
    torch_b = ms(ok.experts == "torch_batched")
    assert torch_b.max() - torch_b.min() < 0.1  # one figure for every size
    return [fp8.min(), fp8.max(), bf16.min(), bf16.max(), torch_b.median()]


def pplx_race():
    intra = rows("pplx_race/intra").set_index("tokens_per_rank")
    inter = rows("pplx_race/inter").set_index("tokens_per_rank")
    assert list(intra.status) == ["ok", "incorrect", "incorrect"] and inter.loc[512, "status"] == "ok"
    return [intra.loc[132, "rel_err"], intra.loc[133, "rel_err"], intra.loc[512, "rel_err"], inter.loc[512, "rel_err"]]


# --- trace-vs-ablation.md: results/trace_vs_ablation/run_a..run_e ----------------------------


@functools.cache
def trace_runs() -> pd.DataFrame:
    df = pd.concat([rows(f"trace_vs_ablation/run_{r}").assign(run=r) for r in "abcde"])
    ok = df[(df.status == "ok") & (df.overlap == "combine")].copy()
    ok["error_pts"] = (ok.overlap_fraction - ok.trace_overlap_fraction).abs() * 100
    ok["reps"] = ok.samples_us.map(len)
    return ok.sort_values("run")


def trace_cells(experts: str, carveout: int) -> list[str]:
    out, t = [], trace_runs()
    for r in t[(t.experts == experts) & (t.shared_sm_carveout == carveout)].itertuples():
        lo, hi = getattr(r, "overlap_fraction_lo", np.nan), getattr(r, "overlap_fraction_hi", np.nan)
        interval = f" [{lo:.2f}–{hi:.2f}]" if np.isfinite(lo) else ""  # run_a predates the interval
        out.append(f"{r.overlap_fraction:.3f}{interval} / {r.trace_overlap_fraction:.3f} ({r.error_pts:.1f})")
    assert len(out) == 5
    return out


def trace_errors(experts: str, carveouts: tuple[int, ...]):
    t = trace_runs()
    e = t[(t.experts == experts) & t.shared_sm_carveout.isin(carveouts)].error_pts
    return [int((e <= 10).sum()), len(e), e.max()]


def trace_spread():
    t = trace_runs()
    tri = t[t.experts == "triton"]
    g = {c: tri[tri.shared_sm_carveout == c] for c in (0, 24)}
    spread = [100 * (x.overlap_fraction.max() - x.overlap_fraction.min()) for x in g.values()]
    return [
        g[24].trace_overlap_fraction.min(),
        g[24].trace_overlap_fraction.max(),
        g[24].overlap_fraction.min(),
        g[24].overlap_fraction.max(),
        g[0].trace_overlap_fraction.min(),
        g[0].trace_overlap_fraction.max(),
        g[0].overlap_fraction.min(),
        g[0].overlap_fraction.max(),
        t.reps.min(),
        t.reps.max(),
        min(spread),
        max(spread),
    ]


def slow_machines():
    t = trace_runs().set_index(["experts", "shared_sm_carveout", "run"])
    miss = [t.loc[("triton", 24, r)] for r in "ad"]
    fast = trace_runs()[(trace_runs().experts == "triton") & trace_runs().run.isin(["b", "c"])]
    fast24 = [t.loc[("triton", 24, r), "shared_us"] for r in "bc"]
    e = t.loc[("triton", 24, "e")]
    return [
        miss[0].latency_us_median / 1e3,
        miss[1].latency_us_median / 1e3,
        fast.latency_us_median.min() / 1e3,
        fast.latency_us_median.max() / 1e3,
        min(m.shared_us for m in miss),
        max(m.shared_us for m in miss),
        min(fast24),
        max(fast24),
        e.latency_us_median / 1e3,
        e.error_pts,
    ]


# --- memory.md: results/weight_reduce_memory ----------------------------------------------


@functools.cache
def capacity(run: str) -> pd.DataFrame:
    from moebench.report.capacity import capacity_frame

    return capacity_frame(rows(f"weight_reduce_memory/{run}"), 12 * 2**30).set_index(
        ["model", "simulate_ep", "quant", "experts", "reduction"]
    )


def fits(model: str, ep: int, quant: str, experts: str):
    cap = capacity("capacity_h200x1")
    e, f = cap.loc[(model, ep, quant, experts, "experts")], cap.loc[(model, ep, quant, experts, "finalize")]
    return e.max_tokens / f.max_tokens, spaced(e.max_tokens), spaced(f.max_tokens), e.ws_slope / 1024, f.ws_slope / 1024


def allocator_ratio():
    df = rows("weight_reduce_memory")
    tri = df[(df.status == "ok") & (df.experts == "triton")]
    ratio = tri.workspace_bytes_peak / tri.analytic_peak_bytes
    at4096 = tri[tri.tokens_per_rank == 4096].pivot(index="quant", columns="reduction", values="workspace_bytes_peak")
    saving = at4096["finalize"] - at4096["experts"]
    assert saving.nunique() == 1  # both quants
    return [ratio.min(), ratio.max(), len(tri), spaced(saving.iloc[0])]


def saving_per_token():
    cap = capacity("capacity_h200x1")
    s = (cap.xs("finalize", level="reduction").ws_slope - cap.xs("experts", level="reduction").ws_slope) / 1024
    dsv3, qwen = s.xs("deepseek_v3", level="model"), s.xs("qwen3_30b_a3b", level="model")
    assert dsv3.round(1).nunique() == 1 and qwen.round(1).nunique() == 1  # every experts implementation and share
    return [dsv3.iloc[0], qwen.iloc[0], (8 - 1) * 2048 * 2 / 1024]  # qwen3: topk 8, K 2048, bf16 rows


def fit_points():
    cap = capacity("capacity_h200x1")
    many, two = cap[cap.ws_points >= 3], cap[cap.ws_points == 2]
    level = two.index.get_level_values
    assert set(level("quant")) == {"bf16"} and set(level("experts")) == {"triton"}
    return [len(many), 100 * many.ws_resid.max(), len(two)]


def capped_line(experts: str, quant: str, reduction: str):
    r = capacity("capacity_h200x1_confirmed").loc[("deepseek_v3", 8, quant, experts, reduction)]
    assert "disagrees" not in r.confirmed
    ok, oom = re.fullmatch(r"ok at (\d+), oom at (\d+)", r.confirmed).groups()
    return [experts, quant, reduction, spaced(r.max_tokens_reserved), spaced(r.max_tokens), spaced(ok), spaced(oom)]


# --- routing.md -------------------------------------------------------------------------------


def _routing_latency(model: str, routing: str, tokens: int, experts: str, column: str = "latency_us_median"):
    df = rows("routing/h200x1")
    (v,) = df[
        (df.status == "ok")
        & (df.model == model)
        & (df.routing == routing)
        & (df.tokens_per_rank == tokens)
        & (df.experts == experts)
    ][column]
    return float(v)


def routing_ratios(model: str, tokens: int, routings: Sequence[str], a: str = "triton", b: str = "deepgemm"):
    return [_routing_latency(model, r, tokens, a) / _routing_latency(model, r, tokens, b) for r in routings]


def routing_hot_rank_cost():
    lat = functools.partial(_routing_latency, "deepseek_v3")
    df = rows("routing/h200x1")
    (hot,) = df[
        (df.status == "ok")
        & (df.model == "deepseek_v3")
        & (df.routing == "zipf")
        & (df.tokens_per_rank == 4096)
        & (df.experts == "deepgemm")
    ].imbalance_experts
    return [
        lat("imbalanced_ranks", 4096, "deepgemm") / lat("uniform", 4096, "deepgemm"),
        lat("imbalanced_ranks", 4096, "triton") / lat("uniform", 4096, "triton"),
        hot,
        lat("zipf", 4096, "deepgemm") / lat("uniform", 4096, "deepgemm"),
        lat("zipf", 4096, "triton") / lat("uniform", 4096, "triton"),
    ]


def routing_experts_phase():
    u, h = (_routing_latency("deepseek_v3", r, 4096, "deepgemm", "experts_us") for r in ("uniform", "imbalanced_ranks"))
    return [u, h, h / u]


# --- README.md ---------------------------------------------------------------------------------


def run_log_runs():
    heads = re.findall(r"^## Runs? (\d+)(?:–(\d+))?", (FINDINGS / "run-log.md").read_text(), re.M)
    nums = sorted({n for a, b in heads for n in range(int(a), int(b or a) + 1)})
    assert nums == list(range(1, len(nums) + 1)), nums  # numbered 1..N without a gap
    return [nums[-1]]


CLAIMS = {
    "routing/dsv3-128": Claim(
        "routing.md",
        "under uniform routing (triton ÷ deepgemm {:.3f}), one hot expert ({:.3f}) "
        "and the replayed recording ({:.3f}), and level with or behind it under Zipf routing "
        "({:.3f}) and one hot rank ({:.3f})",
        lambda: routing_ratios(
            "deepseek_v3", 128, ["uniform", "imbalanced_experts", "replay", "zipf", "imbalanced_ranks"]
        ),
    ),
    "routing/qwen3-16": Claim(
        "routing.md",
        "the two tie under uniform routing ({:.3f}), one hot expert ({:.3f}) and "
        "the replay ({:.3f}), and Triton is 15–16 % ahead under Zipf ({:.3f}) and one hot rank "
        "({:.3f})",
        lambda: routing_ratios(
            "qwen3_30b_a3b", 16, ["uniform", "imbalanced_experts", "replay", "zipf", "imbalanced_ranks"]
        ),
    ),
    "routing/batched": Claim(
        "routing.md",
        "DeepSeek-V3 at 128 tokens, Triton ahead under uniform routing ({:.3f}) and "
        "behind under one hot rank ({:.3f}); qwen3 at 4096, DeepGEMM's masked GEMM ahead under "
        "uniform routing ({:.3f}) and behind under one hot expert ({:.3f})",
        lambda: (
            routing_ratios("deepseek_v3", 128, ["uniform", "imbalanced_ranks"], "triton_batched", "deepgemm_masked")
            + routing_ratios(
                "qwen3_30b_a3b", 4096, ["uniform", "imbalanced_experts"], "triton_batched", "deepgemm_masked"
            )
        ),
    ),
    "routing/hot-rank-cost": Claim(
        "routing.md",
        "takes {:.2f}× (deepgemm) and {:.2f}× (triton) its uniform time at "
        "4096 tokens per rank on DeepSeek-V3; Zipf routing (skew 1.2, the hottest expert at "
        "{:.1f}× the mean) {:.2f}× and {:.2f}×",
        routing_hot_rank_cost,
    ),
    "routing/experts-phase": Claim(
        "routing.md",
        "DeepGEMM's experts phase: {:.0f} µs uniform, {:.0f} µs with one hot rank ({:.2f}×, predicted 2.0×)",
        routing_experts_phase,
    ),
    "timing/held-vs-graph": Claim(
        "timing.md",
        "Held eager events read **{:.3f}–{:.3f} × graph replays** of the same layer over {} layer × size pairs",
        lambda: events_over_graph()[:3],
    ),
    "timing/auto-order": Claim(
        "timing.md",
        "as the graph rows do at all {} sizes where those differ by more than 3 %",
        lambda: events_over_graph()[3:4],
    ),
    "timing/held-by-size": Claim(
        "timing.md", "+{}–{} % at 16 tokens, falling to +{}–{} % at 16384", events_over_graph_by_size
    ),
    "timing/qwen3-1024": Claim(
        "timing.md", "deepgemm is {:.2f} × faster ({:.1f} vs {:.1f} µs in graph replays)", qwen3_1024_order
    ),
    "timing/default-held": Claim(
        "timing.md",
        "The default sweep on one H200 now reads {} graph rows, none host-bound, "
        "none host-paced; forced held events read {:.3f}–{:.3f} × them",
        default_held,
    ),
    "timing/phase-sums": Claim(
        "timing.md",
        "The default sweep's {} `phases≠latency` rows at 4096 tokens (phase sum "
        "{:.2f}–{:.2f} of the graph latency) were no timing defect: the phase columns had no place "
        "for DeepSeek-V3's shared expert, ~{:.0f} µs at 4096 tokens. Measured at d751099, where the rows "
        "record it, every row's phases sum to {:.2f}–{:.2f} of its latency",
        default_phase_sums,
    ),
    "timing/default-sweep-graph": Claim(
        "timing.md",
        "the default sweep read `overlap=none` {:.1f} µs and "
        "`overlap=combine` {:.1f} µs (p80/p20 ≤ {:.3f}) in graph replays",
        default_sweep_graph_rows,
    ),
    "timing/graph-vs-independent": Claim(
        "timing.md",
        "moebench / independent = {:.3f}, {:.3f}, {:.3f} and {:.3f} on four",
        lambda: [r["graph_vs_replay_events"] for r in timing_modes().values()],
    ),
    "timing/graph-vs-cudagraph": Claim(
        "timing.md", "here {} % ({:.1f} vs {:.1f} µs), {} %, {} % and {} %", graph_vs_cudagraph
    ),
    "timing/warm-l2": Claim(
        "timing.md",
        "without it moebench's replays read {:.1f} µs",
        lambda: [timing_modes()["dsv3_ep8_tod_fp8_none"]["graph_warm_us"]],
    ),
    "timing/host-bound": Claim(
        "timing.md",
        "takes the host {:.2f}–{:.2f} ms to enqueue (`host_enqueue_us`) while its kernels are busy "
        "{:.2f} ms (profiler, the union of the two streams' kernel intervals): the GPU waits for launches, so event "
        "timings read the host's launch rate ({:.0f} µs with `overlap=none`, {:.0f} µs with `combine`",
        lambda: (
            lambda n, c: [
                min(n["host_enqueue_us"], c["host_enqueue_us"]) / 1e3,
                max(n["host_enqueue_us"], c["host_enqueue_us"]) / 1e3,
                n["gpu_busy_us"] / 1e3,
                n["events_us"],
                c["events_us"],
            ]
        )(timing_modes()["dsv3_ep8_tod_fp8_none"], timing_modes()["dsv3_ep8_tod_fp8_combine"]),
    ),
    "timing/qwen3-decode": Claim(
        "timing.md",
        "qwen3 fp8 at 64 tokens: enqueue {:.0f} µs, kernels {:.0f} µs, events {:.0f} µs, graph {:.1f} µs",
        lambda: [
            timing_modes()["qwen3_triton_fp8"][k] for k in ("host_enqueue_us", "gpu_busy_us", "events_us", "graph_us")
        ],
    ),
    "deepep/ht-dispatch-bf16": Claim(
        "deepep-pplx.md",
        "| dispatch bf16 | {:.1f} µs | {:.1f} / {:.1f} | {} % / {} % |",
        lambda: ht_line("dispatch", "bf16", "dispatch_bf16"),
    ),
    "deepep/ht-dispatch-fp8": Claim(
        "deepep-pplx.md",
        "| dispatch fp8 | {:.1f} µs | {:.1f} / {:.1f} | {} % / {} % |",
        lambda: ht_line("dispatch", "fp8_block", "dispatch_fp8"),
    ),
    "deepep/ht-combine": Claim(
        "deepep-pplx.md",
        "| combine bf16 | {:.1f} µs (best {:.1f}) | {:.1f} / {:.1f} ({:.1f} / {:.1f} in the fp8 run) | {} % |",
        ht_combine,
    ),
    "deepep/low-latency": Claim(
        "deepep-pplx.md",
        "Rank 1: dispatch {:.1f} (DeepEP) vs {:.1f} µs (moebench), combine {:.1f} vs {:.1f} µs; "
        "the hook variants (send + receive, rank 0 / rank 1, DeepEP vs moebench) {:.1f} / {:.1f} vs {:.1f} / {:.1f} "
        "and {:.1f} / {:.1f} vs {:.1f} / {:.1f} (`ll/comparison.md`). Rank 0's single kernels read {:.0f} and "
        "{:.0f} µs",
        low_latency,
    ),
    "deepep/ll-layer": Claim(
        "deepep-pplx.md",
        "triton_batched with fp8 dispatch {:.2f}–{:.2f} ms per layer at 16–128 "
        "tokens, bf16 {:.2f}–{:.2f} ms. torch_batched computes every row of the [E, X, K] buffer "
        "(X = 1024), hence {:.1f} ms",
        deepep_ll_layers,
    ),
    "deepep/pplx-race": Claim(
        "deepep-pplx.md",
        "intranode at 132 tokens rel_err {:.4f} (`ok`), 133 tokens {:.3f} "
        "(`incorrect`: one token of 133 mixed), 512 tokens {:.2f}; internode at 512 tokens "
        "{:.4f} (`ok`)",
        pplx_race,
    ),
    "trace/triton-errors": Claim(
        "trace-vs-ablation.md",
        "in {} of {} out-of-sample runs (errors {:.1f}, {:.1f}, {:.1f}, {:.1f}, {:.1f} points; mean {:.1f})",
        lambda: (lambda e: [int((e <= 10).sum()), len(e), *e, e.mean()])(
            trace_runs()[(trace_runs().experts == "triton") & (trace_runs().shared_sm_carveout == 0)].error_pts
        ),
    ),
    "trace/carveout-and-torch": Claim(
        "trace-vs-ablation.md",
        "With the 24-SM carveout it holds in {} of {} (worst {:.1f}); with the `torch` "
        "experts, whose layer syncs the host so that one rank's collective waits milliseconds for the other, in "
        "{} of {} (worst {:.1f})",
        lambda: trace_errors("triton", (24,)) + trace_errors("torch", (0, 24)),
    ),
    "trace/reproducibility": Claim(
        "trace-vs-ablation.md",
        "with the carveout ({:.3f}–{:.3f}, where the ablation read {:.3f}–{:.3f}) and as "
        "much without it ({:.3f}–{:.3f} against {:.3f}–{:.3f}, at {}–{} samples); the ablation of a triton "
        "combination moves {:.0f}–{:.0f} points between runs",
        trace_spread,
    ),
    **{
        f"trace/table-{e}-{c}": Claim(
            "trace-vs-ablation.md",
            f"| {e}, {c} | " + " | ".join(["{}"] * 5) + " |",
            functools.partial(trace_cells, e, c),
        )
        for e, c in (("triton", 0), ("triton", 24), ("torch", 0), ("torch", 24))
    },
    "trace/slow-machines": Claim(
        "trace-vs-ablation.md",
        "slower ({:.2f} / {:.2f} ms against {:.2f}–{:.2f} ms in `run_b` and `run_c`): there "
        "the standalone shared experts took {:.0f}–{:.0f} µs instead of {:.0f}–{:.0f}, and both moves raise the "
        "ablation figure, while the trace figure stayed at 0.39–0.42. `run_e`'s layer was slow too ({:.2f} ms) and "
        "agreed within {:.1f} points",
        slow_machines,
    ),
    "memory/allocator": Claim(
        "memory.md",
        "within 5 %: {:.3f}–{:.3f} in all {} rows of deepseek_v3's EP-8 share",
        lambda: allocator_ratio()[:3],
    ),
    "memory/saving-4096": Claim("memory.md", "({} B at 4096 tokens", lambda: allocator_ratio()[3:]),
    "memory/ep8-fp8": Claim(
        "memory.md",
        "fits {:.2f}× the tokens per rank with the reduction in the experts as in "
        "the finalize (fp8_block: {} vs {} tokens, {:.1f} vs {:.1f} KiB a token",
        lambda: fits("deepseek_v3", 8, "fp8_block", "triton_or_deepgemm"),
    ),
    "memory/ep8-bf16-ep16-qwen3": Claim(
        "memory.md",
        "and {:.2f}× in bf16 ({} vs {}); its EP-16 share the same per token with half the weights' "
        "workspaces ({} vs {}; {} vs {}); qwen3_30b_a3b {:.2f}× in bf16 ({} vs {}) and {:.2f}× in fp8_block ({} vs {})",
        lambda: [
            *fits("deepseek_v3", 8, "bf16", "triton")[:3],
            *fits("deepseek_v3", 16, "fp8_block", "deepgemm")[1:3],
            *fits("deepseek_v3", 16, "bf16", "triton")[1:3],
            *fits("qwen3_30b_a3b", 1, "bf16", "triton")[:3],
            *fits("qwen3_30b_a3b", 1, "fp8_block", "deepgemm")[:3],
        ],
    ),
    "memory/saving-per-token": Claim(
        "memory.md",
        "bytes a token: {:.1f} KiB for DeepSeek-V3, {:.1f} KiB for qwen3 (formula {:.1f})",
        saving_per_token,
    ),
    "memory/fit-points": Claim(
        "memory.md",
        "The {} lines through three or four points (deepgemm and "
        "triton_or_deepgemm at 1024–131 072 tokens; triton fp8_block on its contiguous rows at "
        "8192–131 072) fit them within {:.1f} %. The {} triton bf16 lines have two",
        fit_points,
    ),
    **{
        f"memory/capped-{x}-{q}-{r}": Claim(
            "memory.md", "| {} {} | {} | {} – {} | {} | {} |", functools.partial(capped_line, x, q, r)
        )
        for x, q in (
            ("triton", "bf16"),
            ("triton", "fp8_block"),
            ("deepgemm", "fp8_block"),
            ("triton_or_deepgemm", "fp8_block"),
        )
        for r in ("experts", "finalize")
    },
    **{
        f"roofline/busy-{q}": Claim(
            "triton-roofline.md",
            "| {} | {:.0f} / {:.0f} / {:.0f} | {:.0f} / {:.0f} / {:.0f} | {:.0f} / {:.0f} / {:.0f} |",
            functools.partial(pct_of_hbm_floor, q),
        )
        for q in ("bf16", "fp8_block")
    },
    "roofline/busy-ranges": Claim(
        "triton-roofline.md",
        "run at {:.0f}–{:.0f} % of the HBM floor in bf16 and {:.0f}–{:.0f} % "
        "of it in fp8_block, by kernel busy time (`reduction=experts`; `finalize` within {} "
        "points)",
        busy_ranges,
    ),
    "roofline/target-misses": Claim(
        "triton-roofline.md",
        "bf16 misses only mixtral at 64 tokens ({:.0f} %); fp8_block misses qwen3 at 16, 64 and 256 "
        "tokens ({:.0f}, {:.0f}, {:.0f} %), mixtral at 256 ({:.0f} %; "
        "{:.0f} % at 128) and deepseek_v3 at 16 ({:.0f} %)",
        target_misses,
    ),
    "roofline/fold": Claim(
        "triton-roofline.md",
        "from 542 to 497 µs in graph replays ({:.0f} → {:.0f} % of the floor by layer latency)",
        lambda: fold_line("mixtral_8x7b", 256),
    ),
    "roofline/bf16-16384": Claim(
        "triton-roofline.md",
        "At 16384 tokens bf16 reaches {:.1f} % of the measured {:.0f} TFLOP/s on qwen3 (contiguous "
        "layout), {:.1f} % on deepseek_v3's EP-8 share (gathered, tuned tiles) "
        "and {:.0f} % on mixtral (contiguous): the "
        "60 % target holds, by {:.1f} and {:.1f} points on the first two",
        lambda: (lambda b: [b[1], tflops(h200())[0], b[4], b[6], b[1] - 60, b[4] - 60])(bf16_16384()),
    ),
    "roofline/gemms-alone": Claim(
        "triton-roofline.md", "The GEMMs alone reach {:.0f}–{:.0f} % (mixtral's {:.0f}–{:.0f} %)", bf16_gemms_alone
    ),
    "roofline/ceilings": Claim(
        "triton-roofline.md",
        "device-to-device copy {:.2f} TB/s read + write; GEMMs {:.0f} TFLOP/s bf16, {:.0f} fp8",
        lambda: [h200().copy_bytes_per_s / 1e12, *tflops(h200())],
    ),
    "roofline/floor-us": Claim(
        "triton-roofline.md",
        "share {:.1f} / {:.1f} / {:.1f} µs (bf16) and {:.1f} / {:.1f} / {:.1f} "
        "µs (fp8_block) at 16 / 64 / 256 tokens; qwen3 fp8_block {:.1f} / {:.1f} / {:.1f} µs; "
        "mixtral fp8_block {:.1f} µs",
        hbm_floor_us,
    ),
    "roofline/read-mostly": Claim(
        "triton-roofline.md",
        "deepseek_v3 bf16 at 64 tokens reads {:.0f} %, {:.2f} TB/s of mostly weight reads",
        read_mostly,
    ),
    "roofline/graph-replays": Claim(
        "triton-roofline.md",
        "qwen3 bf16 {:.0f} / {:.0f} / {:.0f} %, fp8_block {:.0f} / {:.0f} / {:.0f} %; mixtral bf16 "
        "{:.0f} / {:.0f} / {:.0f} %; deepseek_v3 bf16 {:.0f} / {:.0f} / {:.0f} %, "
        "fp8_block {:.0f} / {:.0f} / {:.0f} %; "
        "mixtral fp8_block with its installed decode tiles {:.0f} / {:.0f} / {:.0f} / {:.0f} % at 16 / 64 / 128 / 256 "
        "tokens, {:.0f} % at 256 after the fold",
        graph_replays,
    ),
    "roofline/16384": Claim(
        "triton-roofline.md",
        "% of {:.0f} TFLOP/s: qwen3 {:.0f} µs ({:.1f} %; gathered {:.1f} %), "
        "deepseek_v3 {:.1f} µs ({:.1f} %), mixtral {:.0f} µs ({:.0f} %)",
        lambda: [tflops(h200())[0], *bf16_16384()],
    ),
    "roofline/busy-vs-replay": Claim(
        "triton-roofline.md",
        "up to {:.0f} points at 16 tokens in fp8 (deepseek_v3: {:.0f} % busy, {:.0f} % replayed)",
        busy_vs_replay_points,
    ),
    "roofline/mixtral-gemms": Claim(
        "triton-roofline.md",
        "mixtral's GEMMs fall from {:.0f}–{:.0f} % of their floor at 4 "
        "rows per expert (16 tokens) to {:.0f}–{:.0f} % at 64 rows",
        mixtral_gemm_fall,
    ),
    "roofline/predicted-16384": Claim(
        "triton-roofline.md",
        "predicted qwen3 ~{} µs ({:.0f} % of {:.0f} TFLOP/s), deepseek ~{} ({:.0f} %), mixtral ~{} ({:.0f} %)",
        predicted_16384,
    ),
    "roofline/first-session": Claim(
        "triton-roofline.md", "the eager experts phase read {:.0f}–{:.0f} % of the floor at ≤ 256 tokens", first_session
    ),
    "fp8-decode/gemm-ranges": Claim(
        "fp8-decode.md",
        "at 16 tokens the GEMMs run at {:.0f}–{:.0f} % of their floor, at 256 tokens at {:.0f}–{:.0f} %",
        gemm_ranges,
    ),
    "fp8-decode/fold": Claim(
        "fp8-decode.md",
        "542 to 497 µs (−8.4 %; {:.0f} → {:.0f} % of the floor by layer latency)",
        lambda: fold_line("mixtral_8x7b", 256),
    ),
    **{
        f"fp8-decode/split-{m}-{t}": Claim(
            "fp8-decode.md",
            "| {} {} | {:.1f} | {:.1f} ({:.0f} %) | {:.1f} ({:.0f} %) | {:.1f} ({:.0f} %) | {:.1f} |",
            functools.partial(split_line, m, t),
        )
        for m in ("qwen3_30b_a3b", "mixtral_8x7b")
        for t in (16, 64, 128, 256)
    },
    "fp8-decode/above-floor": Claim(
        "fp8-decode.md",
        "First explanation (from graph replays): qwen3's ~{:.0f}–{:.0f} µs above the floor",
        lambda: qwen3_above_floor()[:2],
    ),
    "fp8-decode/above-floor-split": Claim(
        "fp8-decode.md",
        "At 16 tokens qwen3's {:.0f} µs above the floor in graph replays split into ~19 µs outside the "
        "experts phase (routing, prepare, launch gaps), 12 µs of small kernels and ~{:.0f} µs of GEMM. "
        "At 256 tokens the "
        "GEMMs are the larger part: qwen3's take {:.0f} µs over their floor",
        lambda: qwen3_above_floor()[2:],
    ),
    "fp8-decode/fold-mixtral-64": Claim(
        "fp8-decode.md",
        "| mixtral 64 | 397.6 | 394.6 / 394.0 | −0.8 % | {:.1f} → {:.1f} |",
        lambda: fold_line("mixtral_8x7b", 64),
    ),
    "fp8-decode/fold-mixtral-256": Claim(
        "fp8-decode.md",
        "| mixtral 256 | 542.1 | 496.2 / 497.2 | **−8.4 %** | {:.1f} → {:.1f} |",
        lambda: fold_line("mixtral_8x7b", 256),
    ),
    "fp8-decode/fold-qwen3-64": Claim(
        "fp8-decode.md",
        "| qwen3 64 | 193.2 | 193.6 / 193.2 | 0 | {:.1f} |",
        lambda: (lambda a, b: [a] if f"{a:.1f}" == f"{b:.1f}" else [a, b])(*fold_line("qwen3_30b_a3b", 64)),
    ),
    "fp8-decode/fold-qwen3-256": Claim(
        "fp8-decode.md",
        "| qwen3 256 | 228.3 | 223.7 / 223.0 | −2.2 % | {:.1f} → {:.1f} |",
        lambda: fold_line("qwen3_30b_a3b", 256),
    ),
    "deepgemm/fp8-ceiling": Claim(
        "triton-vs-deepgemm.md",
        "fp8 compute floor {:.0f} TFLOP/s, the H200's measured fp8 ceiling",
        lambda: deepgemm_16384()[:1],
    ),
    "deepgemm/16384": Claim(
        "triton-vs-deepgemm.md",
        "DeepGEMM reached {:.0f} TFLOP/s ({:.0f} % of it) on deepseek_v3's "
        "EP-8 share and {:.0f} ({:.0f} %) on mixtral at 16384 tokens",
        lambda: deepgemm_16384()[1:],
    ),
    "deepgemm/quant-floor": Claim("triton-vs-deepgemm.md", "floor {:.0f} MB / {:.2f} TB/s = {:.0f} µs", quant_floor),
    "deepgemm/quant-fix": Claim(
        "triton-vs-deepgemm.md",
        "moved qwen3's fp8_block layer at 16 tokens from {:.0f} to {:.0f} % of the floor in graph replays",
        quant_fix_qwen3_16,
    ),
    "torch/mixtral-64": Claim(
        "triton-vs-torch.md",
        "mixtral bf16 at 64 tokens, where the Triton experts reach {:.0f} % of the HBM floor",
        lambda: [busy("mixtral_8x7b", "bf16", 64).experts_pct_of_floor],
    ),
    "tuning/mixtral-prefill": Claim(
        "tuning.md",
        "mixtral_8x7b (22097 → 18650 µs, 522 → {:.0f} TFLOP/s, {:.1f} % of the measured {:.0f})",
        lambda: [*tuned_prefill()["mixtral_8x7b"], tflops(h200())[0]],
    ),
    "tuning/prefill-measured": Claim(
        "tuning.md",
        "Against the H200's measured {:.0f} TFLOP/s (the FLOPs of the expected pairs over the best tile's "
        "time): qwen3 {:.0f} %, deepseek_v3 {:.1f} %, mixtral {:.1f} %",
        lambda: [tflops(h200())[0], *(tuned_prefill()[m][1] for m in ("qwen3_30b_a3b", "deepseek_v3", "mixtral_8x7b"))],
    ),
    "tuning/prefill-fp8": Claim(
        "tuning.md",
        "qwen3 fp8_block: 4165 → 4157 µs ({:.0f} TFLOP/s, {:.0f} % of the {:.0f} TFLOP/s fp8 ceiling)",
        lambda: [*tuned_prefill()["qwen3_30b_a3b_fp8"], tflops(h200())[1]],
    ),
    "tuning/decode-tiles": Claim(
        "tuning.md", "(64 tokens: {:.0f} → {:.0f} % of the {:.1f} µs floor)", mixtral_decode_tiles
    ),
    "overlap/shared-floor": Claim(
        "overlap.md",
        "= {:.0f} GFLOP: {:.0f} µs at the H200's measured {:.0f} TFLOP/s on 132 SMs, {:.0f} µs on 108",
        lambda: shared_expert_floor()[:4],
    ),
    "overlap/shared-faster": Claim(
        "overlap.md",
        "their 2 × H200 machine ran its bf16 GEMMs at {:.0f} TFLOP/s or more",
        lambda: shared_expert_floor()[4:],
    ),
    "overlap/carveout-floor": Claim(
        "overlap.md", "(591–602 µs, under the {:.0f} µs floor", lambda: shared_expert_floor()[3:4]
    ),
    "readme/ceilings": Claim(
        "README.md",
        "device-to-device copy {:.2f} TB/s (read + write, a 2 GiB copy), bf16 GEMM {:.0f} "
        "TFLOP/s (`torch.matmul`, best of 4096³, 8192³ and 16384³), fp8 GEMM {:.0f} TFLOP/s",
        lambda: [h200().copy_bytes_per_s / 1e12, *tflops(h200())],
    ),
    "readme/shared-faster": Claim(
        "README.md",
        "the shared expert's bf16 GEMMs ran at {:.0f} TFLOP/s on the 2 × H200 machine "
        "of `results/sm_budget`, above the committed {:.0f}",
        lambda: [shared_expert_floor()[4], tflops(h200())[0]],
    ),
    "readme/roofline": Claim(
        "README.md",
        "decode: bf16 at {:.0f}–{:.0f} % of the HBM floor, fp8_block {:.0f}–{:.0f} % by kernel busy time; "
        "16384 tokens: bf16 {:.0f}–{:.0f} % of the measured {:.0f} TFLOP/s",
        lambda: [
            *busy_ranges()[:4],
            *(lambda b: [min(b[1], b[4], b[6]), max(b[1], b[4], b[6])])(bf16_16384()),
            tflops(h200())[0],
        ],
    ),
    "readme/run-log": Claim("README.md", "the chronological log of the GPU runs (runs 1–{})", run_log_runs),
}


@pytest.mark.parametrize("name", list(CLAIMS))
def test_the_findings_figure_recomputes_from_the_committed_data(name):
    claim = CLAIMS[name]
    figures = list(claim.query())
    assert len(figures) == sum(1 for _, f, _, _ in string.Formatter().parse(claim.passage) if f is not None)
    expected = normalized(claim.passage.format(*figures))
    assert expected in doc(claim.doc), (
        f"docs/findings/{claim.doc} should read, from the committed data:\n  {expected}\n"
        "(either the doc's figure or the data changed: correct the one that is wrong)"
    )


def test_the_claims_cover_the_findings_with_many_figures():
    fields = sum(1 for c in CLAIMS.values() for _, f, _, _ in string.Formatter().parse(c.passage) if f is not None)
    docs = {c.doc for c in CLAIMS.values()}
    assert fields >= 15 and len(CLAIMS) >= 15, (fields, len(CLAIMS))
    assert {"timing.md", "deepep-pplx.md", "trace-vs-ablation.md", "memory.md", "triton-roofline.md"} <= docs


def test_a_changed_figure_fails_its_claim():
    """The check can fail: the figures the docs had before they were recomputed are not there."""
    claim = CLAIMS["timing/graph-vs-cudagraph"]
    assert normalized(claim.passage.format("+2.0", 440.6, 431.5, "1.6", "0.1", "1.8")) not in doc("timing.md")
    assert "Rank 1: dispatch 27.1 (DeepEP) vs 27.7 µs (moebench)" not in doc("deepep-pplx.md")
    assert "0.350–0.372 in six measurements" not in doc("trace-vs-ablation.md")
    # the busy-time table and the DeepGEMM figures as they read at the ceilings quoted before
    table = CLAIMS["roofline/busy-bf16"]
    assert normalized(table.passage.format("bf16", 96, 99, 87, 104, 77, 93, 98, 109, 102)) not in doc(
        "triton-roofline.md"
    )
    assert normalized(CLAIMS["deepgemm/16384"].passage.format(845, 60, 1140, 81)) not in doc("triton-vs-deepgemm.md")


def test_no_floor_waits_for_ceilings_to_be_measured():
    """The ceilings are committed: no findings file still marks a figure as waiting for them."""
    for path in FINDINGS.glob("*.md"):
        assert "to be re-read" not in path.read_text(), path.name
