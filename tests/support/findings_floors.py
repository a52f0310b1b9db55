"""The queries behind tests/project/test_findings_claims.py's floor figures: every floor, "% of floor" and
"% of the GEMM ceiling" the findings quote, recomputed from the committed rows (and traces,
benchmark JSON, tune.json) at the H200's committed ceilings (results/ceilings/nvidia-h200),
through moebench.report.roofline as `moebench report` computes them. Each function returns the
figures of one passage, in its order; units as the docs write them (µs, %, TFLOP/s, TB/s)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from moebench.results.store import RunStore

RESULTS = Path(__file__).resolve().parents[2] / "results"


@functools.cache
def rows(run: str) -> pd.DataFrame:
    return RunStore(RESULTS / run).load()


CEILINGS = RESULTS / "ceilings"
MODELS = ("qwen3_30b_a3b", "mixtral_8x7b", "deepseek_v3")


@functools.cache
def h200():
    """The H200's committed ceilings, as `moebench report` finds them for a row's `gpu`."""
    from moebench.report.roofline import find_ceilings

    c = find_ceilings("NVIDIA H200", CEILINGS)
    assert c is not None and c.path.resolve() == (CEILINGS / "nvidia-h200" / "ceilings.json").resolve()
    return c


def tflops(c) -> tuple[float, float]:
    return c.gemm_flops_per_s["bf16"] / 1e12, c.gemm_flops_per_s["fp8"] / 1e12


@functools.cache
def floors(run: str) -> pd.DataFrame:
    """The run's ok rows with moebench's floor columns (µs, %) at the committed ceilings."""
    from moebench.report.roofline import add_floor

    df = rows(run)
    out = add_floor(df[df.status == "ok"], CEILINGS)
    assert (out.gpu == h200().gpu).all() and out.floor_us.notna().all(), run
    return out


def pick(run: str, **match) -> pd.Series:
    """The one floored row of `run` whose columns equal `match`."""
    df = floors(run)
    sel = df[np.logical_and.reduce([df[k] == v for k, v in match.items()])]
    assert len(sel) == 1, (run, match, len(sel))
    return sel.iloc[0]


def busy(model: str, quant: str, tokens: int, reduction: str = "experts") -> pd.Series:
    """Kernel busy time of the Triton experts (`runner.timing=profiler`), memory-bound here."""
    run = "triton_vs_torch/profiler_deepseek_v3" if model == "deepseek_v3" else "triton_vs_torch/profiler"
    r = pick(run, experts="triton", reduction=reduction, model=model, quant=quant, tokens_per_rank=tokens)
    assert r.bound == "memory"
    return r


def pct_of_hbm_floor(quant: str):
    return [quant, *(busy(m, quant, t).experts_pct_of_floor for m in MODELS for t in (16, 64, 256))]


def busy_ranges():
    """The busy-time table's range per quant, and how far `finalize` reads from `experts`."""
    out = []
    for q in ("bf16", "fp8_block"):
        p = [busy(m, q, t).experts_pct_of_floor for m in MODELS for t in (16, 64, 256)]
        out += [min(p), max(p)]
    gap = max(
        abs(busy(m, q, t).experts_pct_of_floor - busy(m, q, t, "finalize").experts_pct_of_floor)
        for m in MODELS
        for q in ("bf16", "fp8_block")
        for t in (16, 64, 256)
    )
    return [*out, int(np.ceil(gap))]


def target_misses():
    """The busy-time cells under issue #5's 80 %: exactly those the doc names, in its order."""
    miss = [
        (m, q, t)
        for q in ("bf16", "fp8_block")
        for m in MODELS
        for t in (16, 64, 256)
        if busy(m, q, t).experts_pct_of_floor < 80
    ]
    named = [
        ("mixtral_8x7b", "bf16", 64),
        ("qwen3_30b_a3b", "fp8_block", 16),
        ("qwen3_30b_a3b", "fp8_block", 64),
        ("qwen3_30b_a3b", "fp8_block", 256),
        ("mixtral_8x7b", "fp8_block", 256),
        ("deepseek_v3", "fp8_block", 16),
    ]
    assert miss == named, miss
    m128 = pick("fp8_decode_kernels", model="mixtral_8x7b", tokens_per_rank=128).experts_pct_of_floor
    p = [busy(*c).experts_pct_of_floor for c in named]
    return [*p[:5], m128, p[5]]


def hbm_floor_us():
    d = [busy("deepseek_v3", q, t).hbm_floor_us for q in ("bf16", "fp8_block") for t in (16, 64, 256)]
    q3 = [busy("qwen3_30b_a3b", "fp8_block", t).hbm_floor_us for t in (16, 64, 256)]
    return [*d, *q3, busy("mixtral_8x7b", "fp8_block", 16).hbm_floor_us]


def read_mostly():
    """The busy-time table's highest cell and the bytes per second it moved (TB/s)."""
    r = max(
        (busy(m, q, t) for m in MODELS for q in ("bf16", "fp8_block") for t in (16, 64, 256)),
        key=lambda r: r.experts_pct_of_floor,
    )
    assert (r.model, r.quant, r.tokens_per_rank) == ("deepseek_v3", "bf16", 64)
    return [r.experts_pct_of_floor, r.expert_bytes / r.experts_us / 1e6]


def layer_pct(run: str, model: str, quant: str, tokens) -> list:
    """floor / layer latency (%), graph replays: a lower bound on the experts' own figure."""
    out = []
    for t in tokens:
        r = pick(run, experts="triton", model=model, quant=quant, tokens_per_rank=t)
        assert r.timing_mode == "graph"
        out.append(r.floor_us / r.latency_us_median * 100)
    return out


def graph_replays():
    q3m, d3 = "triton_roofline/qwen3_mixtral", "triton_roofline/deepseek_v3"
    dec = (16, 64, 256)
    return [
        *layer_pct(q3m, "qwen3_30b_a3b", "bf16", dec),
        *layer_pct(q3m, "qwen3_30b_a3b", "fp8_block", dec),
        *layer_pct(q3m, "mixtral_8x7b", "bf16", dec),
        *layer_pct(d3, "deepseek_v3", "bf16", dec),
        *layer_pct(d3, "deepseek_v3", "fp8_block", dec),
        *layer_pct("fp8_decode_tiles/mixtral/installed", "mixtral_8x7b", "fp8_block", (16, 64, 128, 256)),
        *layer_pct("fp8_scale_fold/B2", "mixtral_8x7b", "fp8_block", (256,)),
    ]


def busy_vs_replay_points():
    """The largest gap (points of the floor) between busy time and graph replays at 16 tokens in fp8."""
    gaps = {
        m: busy(m, "fp8_block", 16).experts_pct_of_floor
        - layer_pct(
            "triton_roofline/deepseek_v3" if m == "deepseek_v3" else "triton_roofline/qwen3_mixtral",
            m,
            "fp8_block",
            (16,),
        )[0]
        for m in MODELS
    }
    assert max(gaps, key=gaps.get) == "deepseek_v3"
    d = busy("deepseek_v3", "fp8_block", 16).experts_pct_of_floor
    return [gaps["deepseek_v3"], d, d - gaps["deepseek_v3"]]


def bf16_16384():
    """% of the bf16 GEMM ceiling at 16384 tokens (compute-bound: floor / experts phase)."""
    q3c = pick("bf16_layouts", model="qwen3_30b_a3b", row_layout="contiguous", tokens_per_rank=16384)
    q3g = pick("bf16_layouts", model="qwen3_30b_a3b", row_layout="gathered", tokens_per_rank=16384)
    mxc = pick("bf16_layouts", model="mixtral_8x7b", row_layout="contiguous", tokens_per_rank=16384)
    d3 = pick("triton_roofline/deepseek_v3", experts="triton", quant="bf16", tokens_per_rank=16384)
    assert {q3c.bound, q3g.bound, mxc.bound, d3.bound} == {"compute"}
    return [
        q3c.experts_us,
        q3c.experts_pct_of_floor,
        q3g.experts_pct_of_floor,
        d3.experts_us,
        d3.experts_pct_of_floor,
        mxc.experts_us,
        mxc.experts_pct_of_floor,
    ]


def bf16_gemms_alone():
    """The bf16 grouped GEMMs alone (BF16_CONFIG's tile), % of the bf16 ceiling: qwen3 and
    deepseek_v3, then mixtral."""
    bench = json.loads((RESULTS / "bf16_layouts" / "bf16_contiguous.json").read_text())
    pct = {
        (b["model"], b["gemm"]): 100 * b["tflops"] / tflops(h200())[0]
        for b in bench
        if b.get("kernel") == "128x256x64 g8 w8 s3 persist" and b["tokens"] == 16384
    }
    two = [v for (m, _), v in pct.items() if m != "mixtral_8x7b"]
    mx = [v for (m, _), v in pct.items() if m == "mixtral_8x7b"]
    assert len(two) == 4 and len(mx) == 2
    return [min(two), max(two), min(mx), max(mx)]


@functools.cache
def gemm_split() -> dict:
    """fp8_decode_kernels' traces: (model, tokens) -> (gate/up µs, down µs), medians over the
    samples of the two fused_moe kernels in each sample's experts phase (first gate/up, then down)."""
    from moebench.traces.model import attribute
    from moebench.traces.torch_trace import parse_torch_trace

    out = {}
    for r in floors("fp8_decode_kernels").itertuples():
        path = (
            RESULTS
            / "fp8_decode_kernels"
            / "traces"
            / "profiler"
            / r.combo_key_v1
            / f"rank0_T{r.tokens_per_rank}.json.gz"
        )
        per_sample: dict = {}
        for k in attribute(parse_torch_trace(path)).kernels:
            if k.sample is not None and k.phase == "experts" and k.name == "fused_moe_kernel":
                per_sample.setdefault(k.sample, []).append(k)
        assert len(per_sample) == 20 and all(len(v) == 2 for v in per_sample.values())
        gemms = [sorted(v, key=lambda k: k.start_us) for v in per_sample.values()]
        out[(r.model, r.tokens_per_rank)] = (
            float(np.median([g[0].dur_us for g in gemms])),
            float(np.median([g[1].dur_us for g in gemms])),
        )
    return out


def split_line(model: str, tokens: int):
    """One row of fp8-decode.md's table: each GEMM against its share of the experts' HBM floor
    (gate/up 2/3, down 1/3: their weight bytes)."""
    r = pick("fp8_decode_kernels", model=model, tokens_per_rank=tokens)
    up, down = gemm_split()[(model, tokens)]
    floor = r.hbm_floor_us
    return [
        model.split("_")[0],
        tokens,
        r.experts_us,
        floor,
        r.experts_pct_of_floor,
        up,
        100 * floor * 2 / 3 / up,
        down,
        100 * floor / 3 / down,
        r.experts_us - up - down,
    ]


def gemm_pct(model: str, tokens: int) -> tuple[float, float]:
    up, down = gemm_split()[(model, tokens)]
    floor = pick("fp8_decode_kernels", model=model, tokens_per_rank=tokens).hbm_floor_us
    return 100 * floor * 2 / 3 / up, 100 * floor / 3 / down


def gemm_ranges():
    at = {t: [p for m in ("qwen3_30b_a3b", "mixtral_8x7b") for p in gemm_pct(m, t)] for t in (16, 256)}
    return [min(at[16]), max(at[16]), min(at[256]), max(at[256])]


def mixtral_gemm_fall():
    a, b = gemm_pct("mixtral_8x7b", 16), gemm_pct("mixtral_8x7b", 256)
    return [min(a), max(a), min(b), max(b)]


def qwen3_above_floor():
    """qwen3 fp8_block: graph latency − floor at 16 / 64 / 256 tokens, and the GEMMs' µs over
    their floor at 16 and 256 (busy time)."""
    above = [
        r.latency_us_median - r.floor_us
        for r in (
            pick(
                "triton_roofline/qwen3_mixtral",
                experts="triton",
                model="qwen3_30b_a3b",
                quant="fp8_block",
                tokens_per_rank=t,
            )
            for t in (16, 64, 256)
        )
    ]
    over = [
        sum(gemm_split()[("qwen3_30b_a3b", t)])
        - pick("fp8_decode_kernels", model="qwen3_30b_a3b", tokens_per_rank=t).hbm_floor_us
        for t in (16, 256)
    ]
    return [min(above), max(above), above[0], over[0], over[1]]


def fold_line(model: str, tokens: int):
    """fp8-decode.md's fold table, % of floor: before (A) → after (B2, the run the text quotes)."""
    a, b = (layer_pct(f"fp8_scale_fold/{x}", model, "fp8_block", (tokens,))[0] for x in ("A", "B2"))
    return [a, b]


def first_session():
    """The first session's eager experts phase (Triton, reduction=experts, ≤ 256 tokens)."""
    p = pd.concat([floors(r) for r in ("archive/triton_vs_torch-47c4fdc", "archive/weight_reduce_memory-47c4fdc")])
    p = p[(p.experts == "triton") & (p.reduction == "experts") & (p.tokens_per_rank <= 256)]
    assert len(p) == 18 and (p.timing_mode == "events").all()
    return [p.experts_pct_of_floor.min(), p.experts_pct_of_floor.max()]


def deepgemm_16384():
    c = h200()
    out = [tflops(c)[1]]
    for model in ("deepseek_v3", "mixtral_8x7b"):
        r = pick("triton_vs_deepgemm", experts="deepgemm", model=model, tokens_per_rank=16384)
        assert r.bound == "compute"
        out += [r.expert_flops / r.experts_us / 1e6, r.experts_pct_of_floor]
    return out


def quant_floor():
    """The prepare's activation quantization at 16384 × 7168: bf16 read + fp8 written, over the copy ceiling."""
    moved = 16384 * 7168 * (2 + 1)
    return [moved / 1e6, h200().copy_bytes_per_s / 1e12, moved / h200().copy_bytes_per_s * 1e6]


def quant_fix_qwen3_16():
    before = layer_pct("archive/triton_roofline-3fa0d9b", "qwen3_30b_a3b", "fp8_block", (16,))[0]
    return [before, layer_pct("triton_roofline/qwen3_mixtral", "qwen3_30b_a3b", "fp8_block", (16,))[0]]


@functools.cache
def tuned_prefill() -> dict:
    """results/tune/<name>/tune.json's best tile at 16384 tokens: TFLOP/s (the expected pairs,
    tokens · topk / EP share) and % of its quant's GEMM ceiling, by moebench.report.roofline."""
    from moebench.report.roofline import add_floor

    out = {}
    for name in ("qwen3_30b_a3b", "deepseek_v3", "mixtral_8x7b", "qwen3_30b_a3b_fp8"):
        t = json.loads((RESULTS / "tune" / name / "tune.json").read_text())
        layer, best = t["layer"], t["results"][0]
        shape = rows("bf16_layouts").query("model == @layer['model']").iloc[0]
        assert best["tokens"] == 16384 and shape.num_experts // layer["simulate_ep"] == layer["E"]
        flops = 2 * best["tokens"] * shape.topk / layer["simulate_ep"] * 3 * shape.hidden * shape.intermediate
        row = pd.DataFrame(
            {
                "gpu": [h200().gpu],
                "quant": [layer["quant"]],
                "expert_flops": [flops],
                "expert_bytes": [np.nan],
                "experts_us": [best["best"]["us"]],
            }
        )
        f = add_floor(row, CEILINGS).iloc[0]
        out[name] = (flops / best["best"]["us"] / 1e6, 100 * f.flop_floor_us / f.experts_us)
    return out


def mixtral_decode_tiles():
    h = pick("fp8_decode_tiles/mixtral/heuristic", model="mixtral_8x7b", tokens_per_rank=64)
    t = pick("fp8_decode_tiles/mixtral/tuned", model="mixtral_8x7b", tokens_per_rank=64)
    assert h.floor_us == t.floor_us
    return [h.floor_us / h.latency_us_median * 100, t.floor_us / t.latency_us_median * 100, h.floor_us]


def shared_expert_floor():
    """overlap.md: the shared expert's GEMMs at 4096 tokens over the bf16 ceiling, on 132 and 108 SMs,
    and the rate the plain test's shared expert reached alone (TFLOP/s, fastest rank)."""
    flop = 2 * 4096 * 7168 * 4096 + 2 * 4096 * 2048 * 7168  # gate+up (N = 2 · 2048), down
    bf16 = h200().gemm_flops_per_s["bf16"]
    plain = json.loads((RESULTS / "sm_budget" / "plain_test" / "deepep_overlap_plain.json").read_text())["rows"]
    alone = min(r["shared"] for r in plain if r["tokens"] == 4096 and r["carveout"] == 0)
    carved = min(r["shared"] for r in plain if r["tokens"] == 4096 and r["carveout"] == 24)
    assert flop / carved * 132 / 108 > flop / alone  # on 108 SMs it ran faster still, per SM
    return [flop / 1e9, flop / bf16 * 1e6, bf16 / 1e12, flop / bf16 * 1e6 * 132 / 108, flop / alone / 1e6]


def predicted_16384():
    """triton-roofline.md's predictions at 16384 tokens (µs, as the doc states them) against the bf16 ceiling."""
    out = []
    for run, model, us in (
        ("bf16_layouts", "qwen3_30b_a3b", 2650),
        ("triton_roofline/deepseek_v3", "deepseek_v3", 3070),
        ("bf16_layouts", "mixtral_8x7b", 18700),
    ):
        sel = floors(run)
        r = sel[
            (sel.experts == "triton") & (sel.model == model) & (sel.quant == "bf16") & (sel.tokens_per_rank == 16384)
        ]
        assert r.flop_floor_us.nunique() == 1  # the layouts route the same pairs
        out += [us, 100 * r.flop_floor_us.iloc[0] / us]
    return [*out[:2], tflops(h200())[0], *out[2:]]
