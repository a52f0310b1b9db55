"""Real torch-profiler traces captured on 2 x H200 (DeepEP HT, deepseek_v3, 4096
tokens per rank, triton experts, rank 0): the parser finds every phase's
kernels, classifies DeepEP's kernels as communication, and shows why ablation
and trace overlap differ (the combine kernel stretches when the shared experts
run beside it). The end of the file pins the parser's figures on every H200
fixture (regression pins, not targets)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from moebench.traces.analyze import overlap_from_trace
from moebench.traces.files import load_traces
from moebench.traces.metrics import summarize
from moebench.traces.model import is_comm_kernel

FIX = Path(__file__).parents[1] / "fixtures" / "traces"
COMBINE = FIX / "h200_deepep_ht_combine_rank0_T4096.json.gz"
NONE = FIX / "h200_deepep_ht_none_rank0_T4096.json.gz"


def kernel_medians(path) -> dict:
    """Median per sample of DeepEP's dispatch / combine kernels and of the shared-expert kernels (µs)."""
    per = defaultdict(lambda: defaultdict(float))
    for k in load_traces(path)[0].kernels:
        if k.sample is None:
            continue
        if "deep_ep::intranode::combine" in k.name:
            per["combine"][k.sample] += k.end_us - k.start_us
        elif "deep_ep::intranode::dispatch" in k.name:
            per["dispatch"][k.sample] += k.end_us - k.start_us
        if "shared_experts" in k.phases:
            per["shared"][k.sample] += k.end_us - k.start_us
    return {n: statistics.median(v.values()) for n, v in per.items()}


def test_phases_and_comm_kernels_of_a_real_deepep_trace():
    s = summarize(load_traces(COMBINE)[0])
    assert s.num_samples == 3
    for phase in ("prepare", "dispatch", "experts", "finalize", "combine", "shared_experts"):
        assert s.phases[phase].gpu_us and s.phases[phase].gpu_us > 0, phase
    assert is_comm_kernel("void deep_ep::intranode::combine<__nv_bfloat16, 2, 768, 4096>(...)")
    # DeepEP's kernels run on their own stream: comm time is on a different lane than the experts
    comm_lanes = {st.lane for st in s.streams if st.comm_us > 0}
    shared_lanes = {st.lane for st in s.streams if st.shared_us > 0}
    assert comm_lanes and shared_lanes and not (comm_lanes & shared_lanes)


def test_trace_overlap_of_the_real_trace():
    # rank 0's figure (the stored row, 0.560, is the mean over both ranks)
    assert overlap_from_trace(COMBINE) == pytest.approx(0.600, abs=0.005)
    assert overlap_from_trace(NONE) == pytest.approx(0.0, abs=1e-9)


def test_combine_kernel_stretches_beside_the_shared_experts():
    alone, beside = kernel_medians(NONE), kernel_medians(COMBINE)
    # same dispatch either way; the combine kernel is >30% longer when shared experts overlap it
    assert beside["dispatch"] == pytest.approx(alone["dispatch"], rel=0.15)
    assert beside["combine"] > 1.3 * alone["combine"]
    assert beside["shared"] > alone["shared"]


def test_shared_gemm_holds_every_sm_before_deepeps_combine_starts():
    """Why overlap=combine hides little without overlap.shared_sm_carveout
    (docs/findings/overlap.md): the shared expert's cuBLAS GEMM is a persistent kernel with one CTA per SM
    (grid 2 x 66 = all 132 SMs of the H200, 1 block per SM), and in every sample DeepEP's
    combine kernel (24 CTAs) gets SMs only after the first shared GEMM has ended."""
    import gzip
    import json

    raw = json.load(gzip.open(COMBINE))["traceEvents"]
    gemms = [e for e in raw if e.get("cat") == "kernel" and e["name"].startswith("nvjet_sm90")]
    assert gemms and all(e["args"]["grid"] == [2, 66, 1] and e["args"]["blocks per SM"] == 1.0 for e in gemms)
    combines = [e for e in raw if e.get("cat") == "kernel" and "intranode::combine<" in e["name"]]
    assert combines and all(e["args"]["grid"] == [24, 1, 1] for e in combines)

    first_shared_end, combine_start = {}, {}
    for k in load_traces(COMBINE)[0].kernels:
        if k.sample is None:
            continue
        if "shared_experts" in k.phases:
            first_shared_end.setdefault(k.sample, k.end_us)
            first_shared_end[k.sample] = min(first_shared_end[k.sample], k.end_us)
        if "deep_ep::intranode::combine" in k.name:
            combine_start[k.sample] = k.start_us
    samples = sorted(set(first_shared_end) & set(combine_start))
    assert len(samples) >= 3
    for s in samples:
        assert combine_start[s] >= first_shared_end[s], (s, combine_start[s], first_shared_end[s])


@pytest.mark.parametrize("experts, combo_key", [("torch", "4908d11138e9"), ("triton", "dfb6438509fd")])
def test_critical_rank_trace_figure_is_nearer_the_ablation_than_the_mean(experts, combo_key):
    """allgather_rs, overlap=combine, 4096 tokens, both ranks' traces (at 2be9ad1): the rank
    whose layer samples span longest (the one the layer waits for) is the row's trace
    figure; it lands nearer the ablation's overlap_fraction (stored row of
    results/archive/trace_vs_ablation-2be9ad1) than the ranks' mean, which the early rank's
    wait-hidden shared experts pull up."""
    import glob

    import pandas as pd

    from moebench.traces.analyze import trace_row

    per_rank = [trace_row(FIX / f"h200_allgather_rs_{experts}_combine_rank{r}_T4096.json.gz") for r in (0, 1)]
    spans = [r["trace_layer_us"] for r in per_rank]
    figs = [r["trace_overlap_fraction"] for r in per_rank]
    crit = max((0, 1), key=lambda i: spans[i])
    root = Path(__file__).parents[2] / "results" / "archive" / "trace_vs_ablation-2be9ad1" / "rows"
    rows = pd.concat(pd.read_parquet(f) for f in glob.glob(str(root / f"{combo_key}-T4096.parquet")))
    ablation = float(rows["overlap_fraction"].iloc[0])
    assert abs(figs[0] - figs[1]) > 0.2  # the ranks disagree
    assert abs(figs[crit] - ablation) < abs(sum(figs) / 2 - ablation)


def test_trace_command_on_a_run_names_the_critical_rank(tmp_path, capsys):
    """`moebench trace <run>` puts a combination's ranks side by side and says whose
    figures the row holds (the same rule as rows.measured_row)."""
    import shutil

    from moebench.report.trace_report import trace_command

    d = tmp_path / "run" / "traces" / "dfb6438509fd"
    d.mkdir(parents=True)
    for r in (0, 1):
        shutil.copy(FIX / f"h200_allgather_rs_triton_combine_rank{r}_T4096.json.gz", d / f"rank{r}_T4096.json.gz")
    assert trace_command(str(tmp_path / "run")) == 0
    out = capsys.readouterr().out
    table = out[out.index("### ranks of") :]
    assert (
        "| 1 (critical) | 7871.8 | 0.0 | 0.399 | 0.399 |" in table and "row figure: rank 1's without the wait" in table
    )


@pytest.mark.parametrize("experts, combo_key", [("torch", "4908d11138e9"), ("triton", "dfb6438509fd")])
def test_matched_overlap_on_real_traces(experts, combo_key):
    """Both ranks' traces at 2be9ad1 (allgather_rs, overlap=combine, 4096 tokens): rank 0 reaches
    the reduce-scatter first, so trimmed, its collectives start with rank 1's; rank 1 waited for
    no collective that ran beside shared experts, so its figure is the row's."""
    from moebench.traces.files import load_traces
    from moebench.traces.matched import matched_overlap, trim_comm_waits

    traces = [load_traces(FIX / f"h200_allgather_rs_{experts}_combine_rank{r}_T4096.json.gz")[0] for r in (0, 1)]
    trimmed, waits, notes = trim_comm_waits(traces)
    assert notes == [] and waits[0] > 500 and waits[1] == 0
    for i in sorted({k.sample for k in traces[0].kernels if k.sample is not None}):
        starts = [[k.start_us for k in t.kernels if k.comm and k.sample == i] for t in trimmed]
        assert len(starts[0]) == len(starts[1]) > 0
        assert all(abs(a - b) < 1e-9 for a, b in zip(sorted(starts[0]), sorted(starts[1]), strict=True))
    m = matched_overlap(traces)
    assert m.critical_rank == 1 and 0.0 <= m.fraction_per_rank[0] <= m.fraction_per_rank[1] <= 1.0


# -- regression pins ------------------------------------------------------------------
# The parser's figures on these captures (moebench/traces/{torch_trace,metrics}.py at the
# commit that added these pins), not targets: they say nothing about what the hardware
# should do, only that a change to the parser or the metrics that moves them was meant.
# Per phase: median over the layer samples of the GPU busy time (µs) of the kernels
# launched inside the phase's range (combine and weight_reduce nest in finalize).
PINNED_PHASE_GPU_US = {
    "allgather_rs_torch_combine_rank0_T4096": {
        "prepare": 6.91016,
        "dispatch": 366.847,
        "experts": 9309.39,
        "finalize": 1427.74,
        "combine": 1427.74,
        "shared_experts": 589.694,
    },
    "allgather_rs_torch_combine_rank1_T4096": {
        "prepare": 6.75098,
        "dispatch": 273.6,
        "experts": 9627.28,
        "finalize": 640.894,
        "combine": 640.894,
        "shared_experts": 637.918,
    },
    "allgather_rs_triton_combine_rank0_T4096": {
        "prepare": 6.75391,
        "dispatch": 274.847,
        "experts": 6659.28,
        "finalize": 806.783,
        "combine": 806.783,
        "shared_experts": 587.196,
    },
    "allgather_rs_triton_combine_rank1_T4096": {
        "prepare": 6.7832,
        "dispatch": 274.688,
        "experts": 6900.95,
        "finalize": 603.324,
        "combine": 603.324,
        "shared_experts": 592.606,
    },
    "deepep_ht_combine_rank0_T4096": {
        "prepare": 31.2002,
        "dispatch": 565.855,
        "experts": 6642.1,
        "finalize": 1232.7,
        "combine": 1232.7,
        "shared_experts": 590.271,
    },
    "deepep_ht_none_rank0_T4096": {
        "prepare": 31.6484,
        "dispatch": 415.198,
        "experts": 6641.87,
        "finalize": 696.927,
        "combine": 696.927,
        "shared_experts": 515.006,
    },
    "nccl_rank0_T1024": {
        "prepare": 7.7915,
        "dispatch": 477.902,
        "experts": 264.191,
        "weight_reduce": 13.6958,
        "finalize": 560.285,
        "combine": 546.605,
        "shared_experts": 174.063,
    },
}
_COMMON = ("trace_overlap_fraction", "intersection_fraction", "shared_us", "comm_us", "overlap_us", "layer_us")
_STRETCH = ("shared_alone_us", "comm_alone_us", "shared_stretch", "comm_stretch", "shared_exposed_us")
# (method, TraceSummary figures): the allgather_rs captures hold ablation samples (stretch-aware
# figure), the older ones do not (plain intersection figure)
PINNED_OVERLAP = {
    "allgather_rs_torch_combine_rank0_T4096": (
        "stretch",
        dict(
            zip(
                _COMMON + _STRETCH,
                (0.726358, 0.61895, 589.694, 1591.93, 364.991, 11597.4, 502.495, 1811.45, 1.17353, 0.878815, 4.47852),
                strict=True,
            )
        ),
    ),
    "allgather_rs_torch_combine_rank1_T4096": (
        "stretch",
        dict(
            zip(
                _COMMON + _STRETCH,
                (0.280536, 0.460046, 637.918, 570.399, 293.472, 11790.1, 520.832, 540.126, 1.22481, 1.05605, 374.72),
                strict=True,
            )
        ),
    ),
    "allgather_rs_triton_combine_rank0_T4096": (
        "stretch",
        dict(
            zip(
                _COMMON + _STRETCH,
                (0.698442, 0.617888, 587.196, 858.462, 362.786, 7826.06, 519.422, 998.493, 1.13048, 0.859757, 84.3213),
                strict=True,
            )
        ),
    ),
    "allgather_rs_triton_combine_rank1_T4096": (
        "stretch",
        dict(
            zip(
                _COMMON + _STRETCH,
                (0.398704, 0.564607, 592.606, 621.856, 338.4, 7871.76, 539.999, 553.12, 1.09742, 1.12427, 324.699),
                strict=True,
            )
        ),
    ),
    "deepep_ht_combine_rank0_T4096": (
        "intersection",
        dict(zip(_COMMON, (0.599698, 0.599698, 590.271, 1484.83, 353.984, 8646.22), strict=True)),
    ),
    "deepep_ht_none_rank0_T4096": (
        "intersection",
        dict(zip(_COMMON, (0.0, 0.0, 515.006, 1115.1, 0.0, 8587.43), strict=True)),
    ),
    "nccl_rank0_T1024": (
        "intersection",
        dict(zip(_COMMON, (0.569686, 0.569686, 174.063, 993.435, 99.1357, 1421.72), strict=True)),
    ),
}
# metrics.matched_overlap over both ranks: (fraction per rank, µs each rank's communication
# waited for the other, critical rank)
PINNED_MATCHED = {
    "torch": ([0.0, 0.282168], [2797.67, 0.0], 1),
    "triton": ([0.0, 0.399191], [749.417, 0.0], 1),
}


def _pin(x):
    return pytest.approx(x, rel=1e-3, abs=1e-9)


def test_pinned_fixtures_are_every_h200_fixture():
    assert sorted(PINNED_PHASE_GPU_US) == sorted(
        p.name[len("h200_") : -len(".json.gz")] for p in FIX.glob("h200_*.json.gz")
    )


@pytest.mark.parametrize("name", sorted(PINNED_PHASE_GPU_US))
def test_pinned_phase_gpu_us_and_overlap(name):
    s = summarize(load_traces(FIX / f"h200_{name}.json.gz")[0])
    assert {p: st.gpu_us for p, st in s.phases.items()} == _pin(PINNED_PHASE_GPU_US[name])
    method, figures = PINNED_OVERLAP[name]
    assert s.method == method
    assert {k: getattr(s, k) for k in figures} == _pin(figures)
    if method != "stretch":
        assert s.shared_alone_us is None and s.comm_alone_us is None and s.comm_stretch is None


@pytest.mark.parametrize("experts", sorted(PINNED_MATCHED))
def test_pinned_matched_overlap(experts):
    from moebench.traces.matched import matched_overlap

    traces = [load_traces(FIX / f"h200_allgather_rs_{experts}_combine_rank{r}_T4096.json.gz")[0] for r in (0, 1)]
    m = matched_overlap(traces)
    fractions, waits, critical = PINNED_MATCHED[experts]
    assert m.fraction_per_rank == _pin(fractions) and m.wait_us_per_rank == _pin(waits)
    assert m.critical_rank == critical and m.fraction == _pin(fractions[critical])
