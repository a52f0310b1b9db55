"""The axis effects (report/effects.py) on a run whose effects are known: quant=fp8 exactly 0.5 x
bf16 on every pair, overlap with no effect, and reduction=experts 0.5 x finalize with triton and
1.0 x with torch (an interaction the effect must split by experts)."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pandas as pd
import pytest

from moebench.report import effects as fx

AXES = ["backend", "experts", "reduction", "overlap", "quant", "knobs"]
KEY = ["backend", "experts", "reduction", "overlap", "quant", "model", "world_size", "knobs"]


def known_run(noise: float = 0.002, samples: int = 20) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for experts, reduction, overlap, quant, tokens in itertools.product(
        ("triton", "torch"), ("finalize", "experts"), ("none", "combine"), ("bf16", "fp8"), (128, 4096)
    ):
        base = {"triton": 100.0, "torch": 300.0}[experts] * tokens / 128
        base *= 0.5 if quant == "fp8" else 1.0
        base *= 0.5 if (reduction == "experts" and experts == "triton") else 1.0
        s = base * (1 + noise * rng.standard_normal(samples))
        rows.append(dict(backend="local", experts=experts, reduction=reduction, overlap=overlap, quant=quant,
                         model="tiny", world_size=1, knobs="", tokens_per_rank=tokens, samples_us=list(s),
                         latency_us_median=float(np.median(s)),
                         workspace_bytes_peak=float(2**30 if reduction == "finalize" else 2**29)))  # fmt: skip
    return pd.DataFrame(rows)


def by(effects, **want):
    return [e for e in effects if all(getattr(e, k) == v for k, v in want.items())]


def test_an_exact_half_reads_0_50_with_an_interval_around_it():
    eff = fx.axis_effects(known_run(), AXES, KEY)
    for t in (128, 4096):
        (e,) = by(eff, axis="quant", value="fp8", tokens=t)
        assert e.baseline == "bf16" and not e.by and e.pairs == 8
        assert e.lo <= 0.5 <= e.hi and e.hi - e.lo < 0.01 and e.verdict == fx.FASTER
    line = next(x for x in fx.effect_lines(eff) if x.startswith("- `quant=fp8` vs `bf16`"))
    assert "at 128 tok 0.50 × [" in line and "(8 pairs)" in line


def test_an_axis_without_effect_is_no_difference():
    eff = fx.axis_effects(known_run(), AXES, KEY)
    for e in by(eff, axis="overlap"):
        assert e.value == "combine" and e.baseline == "none" and not e.by
        assert e.verdict == fx.SAME and e.lo <= 1.0 <= e.hi
    line = next(x for x in fx.effect_lines(eff) if x.startswith("- `overlap=combine` vs `none`"))
    assert line.count("no difference") == 2


def test_an_interaction_is_split_by_the_axis_that_explains_it():
    eff = fx.axis_effects(known_run(), AXES, KEY)
    parts = by(eff, axis="reduction", value="experts", tokens=4096)
    assert {e.by for e in parts} == {"experts"}
    half, same = (next(e for e in parts if e.by_value == v) for v in ("triton", "torch"))
    assert half.lo <= 0.5 <= half.hi and half.verdict == fx.FASTER
    assert same.lo <= 1.0 <= same.hi and same.verdict == fx.SAME
    line = next(x for x in fx.effect_lines(eff) if x.startswith("- `reduction=experts` vs `finalize`"))
    assert "with experts=torch 1.00 × [" in line and "triton 0.50 × [" in line
    assert "workspace 0.50 × (−512 MiB) at 4096 tok" in line


def test_one_pair_still_has_an_interval_from_its_samples():
    run = known_run(noise=0.05)
    one = run[(run.experts == "triton") & (run.overlap == "none") & (run.reduction == "finalize")]
    eff = fx.axis_effects(one, AXES, KEY)
    (e,) = by(eff, axis="quant", tokens=128)
    assert e.pairs == 1 and e.lo < e.ratio < e.hi and e.hi / e.lo > 1.01


@pytest.mark.parametrize(
    ("lo", "hi", "verdict"),
    [(0.5, 0.6, fx.FASTER), (1.1, 1.2, fx.SLOWER), (0.96, 1.04, fx.SAME), (0.9, 1.0, fx.UNSURE),
     (1.0, 1.2, fx.UNSURE), (math.nan, 1.0, fx.UNSURE)],
)  # fmt: skip
def test_the_band_decides_the_words(lo, hi, verdict):
    assert fx.classify(lo, hi) == verdict


def test_baseline_is_the_preferred_value_or_the_most_common():
    df = pd.DataFrame({"reduction": ["experts", "finalize", "experts"], "backend": ["b", "a", "a"]})
    assert fx.baseline_value(df, "reduction") == "finalize"
    assert fx.baseline_value(df, "backend") == "a"


def test_a_row_without_a_latency_never_enters():
    run = known_run()
    run.loc[0, "latency_us_median"] = math.nan
    eff = fx.axis_effects(run, AXES, KEY)
    assert sum(e.pairs for e in by(eff, axis="quant", tokens=128)) == 7


def test_the_sections_explanation_prints_only_the_runs_figures():
    """The explanation above the effects once showed `0.69 ×` and `[0.68, 0.70]` as its example, read
    as this run's figures in every report: every ratio in the section comes from the run."""
    from moebench.report.answers import effect_section

    lines, eff = effect_section(known_run(), cpu=False)
    how = lines[1]
    assert "ratio × [low, high] (n pairs)" in how
    assert not re.search(r"\d\.\d+ ×|\[\d\.\d+, \d\.\d+\]", how), how
    assert eff and any("0.50 × [" in x for x in lines[2:])


def test_the_effects_figure_keys_its_colours_below_the_panel(tmp_path, monkeypatch):
    """effects.png's legend names the band and what green, red and grey mean, and sits outside
    the panel: inside, it covered the last error bar."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from moebench.report import answer_plots as ap

    drawn = []
    real_save = ap.finish
    monkeypatch.setattr(ap, "finish", lambda fig, *a, **k: drawn.append(fig) or real_save(fig, *a, **k))
    effects = [
        fx.Effect("quant", "fp8_block", "bf16", 64, 1.30, 1.15, 1.48, 3),  # slower: red
        fx.Effect("experts", "triton", "torch", 64, 0.5, 0.45, 0.55, 3),  # faster: green
        fx.Effect("overlap", "dispatch", "none", 64, 1.40, 1.02, 1.50, 3),  # across the band: grey, at the bottom right
    ]
    assert ap.plot_effects(effects, tmp_path / "effects.png") is not None
    (fig,) = drawn
    FigureCanvasAgg(fig).draw()
    (ax,) = fig.axes
    assert ax.get_legend() is None and len(fig.legends) == 1
    legend = fig.legends[0]
    words = " | ".join(t.get_text() for t in legend.get_texts())
    for what in ("no difference (±5 %)", "faster", "slower", "inside or across the band"):
        assert what in words, words
    colours = {
        t.get_text().split(":")[0]: h.get_color()
        for h, t in zip(legend.legend_handles, legend.get_texts(), strict=True)
        if t.get_text().split(":")[0] != "band"
    }
    assert colours == {"faster": "C2", "slower": "C3", "no call": "0.45"}
    assert not legend.get_window_extent().overlaps(ax.get_window_extent())


@pytest.mark.parametrize(
    ("lo", "hi", "printed"),
    [(0.9457, 0.9517, "0.9487 × [0.9457, 0.9517] (3 pairs)"),  # below 1/1.05 = 0.95238: faster
     (0.949, 0.954, "0.951 × [0.949, 0.954] (3 pairs, inconclusive)"),  # across it
     (0.9527, 0.957, "0.955 × [0.953, 0.957] (3 pairs, no difference)"),  # inside
     (1.005, 1.0549, "1.030 × [1.005, 1.055] (3 pairs, inconclusive)"),  # across 1.05
     (0.68, 0.70, "0.69 × [0.68, 0.70] (3 pairs)")],  # far from both: two decimals
)  # fmt: skip
def test_an_interval_on_a_bound_prints_the_decimals_its_label_reads(lo, hi, printed):
    """The committed H200 run printed `0.95 × [0.95, 0.95] (3 pairs)` for an interval of [0.9457,
    0.9517], wholly below 1/1.05: at two decimals both ends read as the bound 0.95, which says
    neither faster nor inconclusive. An end that prints as a bound gets a decimal more (up to four)."""
    e = fx.Effect("reduction", "experts", "finalize", 128, math.sqrt(lo * hi), lo, hi, 3)
    (line,) = fx.effect_lines([e])
    assert line == f"- `reduction=experts` vs `finalize`: at 128 tok {printed}", line


def test_the_printed_interval_gives_the_label_its_true_ends_give():
    """Over intervals whose ends sweep both bounds of the band in steps of 0.0001, the label read
    off the printed ends (parsed back) is the label of the true ends."""
    grid = np.round(np.arange(0.94, 0.96, 0.0001), 4).tolist() + np.round(np.arange(1.04, 1.06, 0.0001), 4).tolist()
    for lo in grid[::7]:
        for hi in grid:
            if hi < lo:
                continue
            text = fx.fmt_interval(lo, hi)
            a, b = (float(x) for x in text.strip("[]").split(", "))
            assert fx.classify(a, b) == fx.classify(lo, hi), (lo, hi, text)
