"""The overlap ablation's parts: the layer without shared experts keeps its overlap
mode's async path, and the row's trace figures are the critical rank's (the ranks'
mean when their trace spans tie or are missing)."""

from __future__ import annotations

import torch

from moebench.config import compose
from moebench.measure.layer import build_layer
from moebench.measure.workload import make_inputs
from moebench.results import rows
from moebench.results.rank_result import RankResult
from moebench.run import plan


def _layer(overlap: str):
    cfg = compose.compose_config(
        ["backend=local", "experts=torch", "model=tiny", "reduction=finalize", "quant=bf16", f"overlap={overlap}"]
    )
    kernel = build_layer(compose.to_combo(cfg), 0, 1, None, torch.device("cpu")).kernel
    assert kernel.shared is not None
    return kernel


def _rr(ranks: list[dict]) -> list[RankResult]:
    """The ranks' results as the queue carries them."""
    return [RankResult(rank=i, **r) for i, r in enumerate(ranks)]


def _spy(kernel):
    calls, depth = [], [0]
    for name in ("prepare", "prepare_async", "finalize", "finalize_async"):
        orig = getattr(kernel.pf, name)

        def wrapped(*a, _orig=orig, _name=name, **k):  # the layer's calls, not the backend's own
            if depth[0] == 0:
                calls.append(_name)
            depth[0] += 1
            try:
                return _orig(*a, **k)
            finally:
                depth[0] -= 1

        setattr(kernel.pf, name, wrapped)
    shared = kernel.shared
    kernel.shared = lambda x: calls.append("shared") or shared(x)
    kernel.shared.transient_bytes = shared.transient_bytes
    return calls


def test_without_shared_experts_the_async_path_stays_and_nothing_runs_in_its_gap():
    for overlap, async_name in (("dispatch", "prepare_async"), ("combine", "finalize_async")):
        kernel = _layer(overlap)
        x, w, ids = make_inputs(kernel.pf.ctx.shape, 8, "uniform", 1.0, 0, 0, 1, torch.device("cpu"))
        with_shared = kernel(x, w, ids)
        calls = _spy(kernel)
        without = kernel(x, w, ids, with_shared=False)
        assert async_name in calls and "shared" not in calls, (overlap, calls)
        calls.clear()
        again = kernel(x, w, ids)
        assert async_name in calls and "shared" in calls, (overlap, calls)
        torch.testing.assert_close(again, with_shared)
        assert not torch.equal(without, with_shared)


def test_none_runs_the_plain_path_either_way():
    kernel = _layer("none")
    x, w, ids = make_inputs(kernel.pf.ctx.shape, 8, "uniform", 1.0, 0, 0, 1, torch.device("cpu"))
    calls = _spy(kernel)
    kernel(x, w, ids, with_shared=False)
    assert "prepare_async" not in calls and "finalize_async" not in calls and "shared" not in calls


def test_row_takes_the_critical_ranks_trace_figures():
    """The rank whose layer samples span longest in its trace sets the layer's end, as the
    max over ranks sets the ablation's latency: its figures are the row's."""
    combos, _ = plan.plan(["backend=naive", "experts=torch", "model=tiny", "overlap=combine", "runner.device=cpu"])
    base = {
        "status": "ok",
        "rel_err": 1e-3,
        "samples_us": [10.0, 11.0],
        "no_shared_samples_us": [9.0, 9.5],
        "shared_samples_us": [2.0, 2.0],
    }
    ranks = [
        {
            **base,
            "trace_overlap_fraction": 0.73,
            "trace_intersection_fraction": 0.9,
            "trace_layer_us": 11597.0,
            "trace_path": "traces/k/rank0_T8.json",
            "trace_overlap_method": "intersection",
        },
        {
            **base,
            "trace_overlap_fraction": 0.28,
            "trace_intersection_fraction": 0.5,
            "trace_layer_us": 11790.0,
            "trace_path": "traces/k/rank1_T8.json",
            "trace_overlap_method": "stretch",
        },
    ]
    row = rows.measured_row(combos[0], 8, _rr(ranks), {})
    assert row["trace_critical_rank"] == 1
    assert row["trace_overlap_fraction"] == 0.28 and row["trace_intersection_fraction"] == 0.5
    # the path and method of the rank whose figures the row holds
    assert row["trace_path"].endswith("rank1_T8.json") and row["trace_overlap_method"] == "stretch"
    assert row["trace_overlap_fraction_per_rank"] == [0.73, 0.28]
    assert row["trace_layer_us_per_rank"] == [11597.0, 11790.0]
    ranks[0]["trace_layer_us"] = 12000.0
    assert rows.measured_row(combos[0], 8, _rr(ranks), {})["trace_overlap_fraction"] == 0.73
    # spans within CRITICAL_SPAN_TIE: no critical rank, the mean
    ranks[0]["trace_layer_us"] = 11790.0 * (1 + rows.CRITICAL_SPAN_TIE / 2)
    tied = rows.measured_row(combos[0], 8, _rr(ranks), {})
    assert tied["trace_critical_rank"] != tied["trace_critical_rank"]  # NaN
    assert abs(tied["trace_overlap_fraction"] - (0.73 + 0.28) / 2) < 1e-9


def test_row_takes_the_matched_figure_of_the_rank_that_waited_least():
    """With every rank's trace read on rank 0 (trace_matched_overlap_per_rank, trace_wait_us_per_rank),
    the row holds the trimmed figure of the rank its peers waited for, whatever the spans say."""
    combos, _ = plan.plan(["backend=naive", "experts=torch", "model=tiny", "overlap=combine", "runner.device=cpu"])
    base = {"status": "ok", "rel_err": 1e-3, "samples_us": [10.0, 11.0], "trace_overlap_method": "stretch"}
    ranks = [
        {
            **base,
            "trace_overlap_fraction": 0.73,
            "trace_intersection_fraction": 0.9,
            "trace_layer_us": 12000.0,
            "trace_matched_overlap_per_rank": [0.1, 0.35],
            "trace_wait_us_per_rank": [800.0, 0.0],
        },
        {**base, "trace_overlap_fraction": 0.28, "trace_intersection_fraction": 0.5, "trace_layer_us": 11000.0},
    ]
    row = rows.measured_row(combos[0], 8, _rr(ranks), {})
    assert row["trace_critical_rank"] == 1 and row["trace_overlap_fraction"] == 0.35
    assert row["trace_overlap_method"] == "stretch_matched"
    assert row["trace_intersection_fraction"] == 0.5  # the same rank's plain figure
    assert row["trace_trimmed_overlap_per_rank"] == [0.1, 0.35] and row["trace_wait_us_per_rank"] == [800.0, 0.0]
    assert row["trace_overlap_fraction_per_rank"] == [0.73, 0.28]  # untrimmed, as each rank read it
    ranks[0]["row_layout_used"], ranks[1]["row_layout_used"] = "contiguous", "gathered"
    assert (
        row["row_layout_used"] == "" and rows.measured_row(combos[0], 8, _rr(ranks), {})["row_layout_used"] == "mixed"
    )
    # a rank's figure missing: back to the span rule (rank 0's span is the longest)
    ranks[0]["trace_matched_overlap_per_rank"] = [0.1, None]
    row = rows.measured_row(combos[0], 8, _rr(ranks), {})
    assert row["trace_critical_rank"] == 0 and row["trace_overlap_fraction"] == 0.73
    assert row["trace_overlap_method"] == "stretch"


def test_row_takes_the_ranks_mean_trace_figures_without_spans():
    combos, _ = plan.plan(["backend=naive", "experts=torch", "model=tiny", "overlap=combine", "runner.device=cpu"])
    base = {
        "status": "ok",
        "rel_err": 1e-3,
        "samples_us": [10.0, 11.0],
        "no_shared_samples_us": [9.0, 9.5],
        "shared_samples_us": [2.0, 2.0],
    }
    ranks = [
        {**base, "trace_overlap_fraction": 0.8, "trace_intersection_fraction": 0.9},
        {**base, "trace_overlap_fraction": 0.3, "trace_intersection_fraction": 0.5},
    ]
    row = rows.measured_row(combos[0], 8, _rr(ranks), {})
    assert abs(row["trace_overlap_fraction"] - 0.55) < 1e-9
    assert abs(row["trace_intersection_fraction"] - 0.7) < 1e-9
    assert row["shared_us"] == 2.0 and abs(row["overlap_fraction"] - (1 - (10.5 - 9.25) / 2.0)) < 1e-9
    assert row["trace_overlap_fraction_per_rank"] == [0.8, 0.3]  # the mean hides how far the ranks differ


def test_row_says_when_the_ranks_trace_methods_differ():
    combos, _ = plan.plan(["backend=naive", "experts=torch", "model=tiny", "overlap=combine", "runner.device=cpu"])
    base = {"status": "ok", "rel_err": 1e-3, "samples_us": [10.0]}
    same = [{**base, "trace_overlap_method": "stretch"}, {**base, "trace_overlap_method": "stretch"}]
    assert rows.measured_row(combos[0], 8, _rr(same), {})["trace_overlap_method"] == "stretch"
    mixed = [{**base, "trace_overlap_method": "stretch"}, {**base, "trace_overlap_method": "intersection"}]
    assert rows.measured_row(combos[0], 8, _rr(mixed), {})["trace_overlap_method"] == "mixed"
    assert rows.measured_row(combos[0], 8, _rr([base, base]), {})["trace_overlap_method"] == ""
