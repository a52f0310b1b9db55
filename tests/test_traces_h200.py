"""Real torch-profiler traces captured on 2 x H200 (DeepEP HT, deepseek_v3, 4096
tokens per rank, triton experts, rank 0): the parser finds every phase's
kernels, classifies DeepEP's kernels as communication, and shows why ablation
and trace overlap differ (the combine kernel stretches when the shared experts
run beside it)."""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from moebench.traces.analyze import overlap_from_trace
from moebench.traces.cli import load_traces
from moebench.traces.metrics import summarize
from moebench.traces.model import is_comm_kernel

FIX = Path(__file__).parent / "fixtures" / "traces"
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
    """Why overlap=combine hides little without overlap.shared_sm_carveout (docs/perf-notes.md,
    run 13): the shared expert's cuBLAS GEMM is a persistent kernel with one CTA per SM
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
    """allgather_rs, overlap=combine, 4096 tokens, both ranks' traces (run 13): the rank
    whose layer samples span longest (the one the layer waits for) is the row's trace
    figure; it lands nearer the ablation's overlap_fraction (stored row of
    results/h200x2-trace_vs_ablation) than the ranks' mean, which the early rank's
    wait-hidden shared experts pull up."""
    import glob

    import pandas as pd

    from moebench.traces.analyze import trace_row

    per_rank = [trace_row(FIX / f"h200_allgather_rs_{experts}_combine_rank{r}_T4096.json.gz") for r in (0, 1)]
    spans = [r["trace_layer_us"] for r in per_rank]
    figs = [r["trace_overlap_fraction"] for r in per_rank]
    crit = max((0, 1), key=lambda i: spans[i])
    root = Path(__file__).parent.parent / "results" / "h200x2-trace_vs_ablation" / "rows"
    rows = pd.concat(pd.read_parquet(f) for f in glob.glob(str(root / f"{combo_key}-T4096.parquet")))
    ablation = float(rows["overlap_fraction"].iloc[0])
    assert abs(figs[0] - figs[1]) > 0.2  # the ranks disagree
    assert abs(figs[crit] - ablation) < abs(sum(figs) / 2 - ablation)


def test_trace_command_on_a_run_names_the_critical_rank(tmp_path, capsys):
    """`moebench trace <run>` puts a combination's ranks side by side and says whose
    figures the row holds (the same rule as rows.measured_row)."""
    import shutil

    from moebench.traces.cli import trace_command

    d = tmp_path / "run" / "traces" / "dfb6438509fd"
    d.mkdir(parents=True)
    for r in (0, 1):
        shutil.copy(FIX / f"h200_allgather_rs_triton_combine_rank{r}_T4096.json.gz", d / f"rank{r}_T4096.json.gz")
    assert trace_command(str(tmp_path / "run")) == 0
    out = capsys.readouterr().out
    table = out[out.index("### ranks of"):]
    assert "| 1 (critical) | 7871.8 | 0.0 | 0.399 | 0.399 |" in table and "row figure: rank 1's without the wait" in table


@pytest.mark.parametrize("experts, combo_key", [("torch", "4908d11138e9"), ("triton", "dfb6438509fd")])
def test_matched_overlap_on_real_traces(experts, combo_key):
    """Both ranks' traces of run 13 (allgather_rs, overlap=combine, 4096 tokens): rank 0 reaches
    the reduce-scatter first, so trimmed, its collectives start with rank 1's; rank 1 waited for
    no collective that ran beside shared experts, so its figure is the row's."""
    from moebench.traces.cli import load_traces
    from moebench.traces.metrics import matched_overlap, trim_comm_waits

    traces = [load_traces(FIX / f"h200_allgather_rs_{experts}_combine_rank{r}_T4096.json.gz")[0] for r in (0, 1)]
    trimmed, waits, notes = trim_comm_waits(traces)
    assert notes == [] and waits[0] > 500 and waits[1] == 0
    for i in sorted({k.sample for k in traces[0].kernels if k.sample is not None}):
        starts = [[k.start_us for k in t.kernels if k.comm and k.sample == i] for t in trimmed]
        assert len(starts[0]) == len(starts[1]) > 0
        assert all(abs(a - b) < 1e-9 for a, b in zip(sorted(starts[0]), sorted(starts[1])))
    m = matched_overlap(traces)
    assert m.critical_rank == 1 and 0.0 <= m.fraction_per_rank[0] <= m.fraction_per_rank[1] <= 1.0
