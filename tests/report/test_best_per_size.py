"""`moebench tune --results`' table and figure (report/best_per_size.py): the fastest combination
per size with its margin to the runner-up and that margin's 95 % interval, knobs named by each
card's tag, the table's test named apart from the report's, the heatmap's cells holding their text.
The command on a committed run is tested with the tune (tests/tune/test_tune.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def test_results_margin_interval_on_a_synthetic_run(tmp_path):
    from moebench.report.best_per_size import best_per_size
    from moebench.report.load import load_run
    from moebench.results.synthetic import make_row, write_run

    rng = np.random.default_rng(0)
    rows = [
        make_row("local", "triton", "experts", "none", "bf16", 64, samples_us=100 * np.exp(rng.normal(0, 0.01, 30))),
        make_row("local", "torch", "experts", "none", "bf16", 64, samples_us=120 * np.exp(rng.normal(0, 0.01, 30))),
        make_row("local", "triton", "experts", "none", "bf16", 256, samples_us=200 * np.exp(rng.normal(0, 0.05, 30))),
        make_row("local", "torch", "experts", "none", "bf16", 256, samples_us=201 * np.exp(rng.normal(0, 0.05, 30))),
        make_row("local", "triton", "finalize", "none", "bf16", 256, samples_us=None, status="failed", reason="boom"),
    ]

    def knob_row(us: float, tail: str, **knob):
        """The 64-token triton row with a knob off its default: it competes as its own entry."""
        samples = us * np.exp(rng.normal(0, 0.01, 30))
        key = f"local/triton/experts/none/bf16/tiny/1/{tail}"
        return make_row("local", "triton", "experts", "none", "bf16", 64, samples_us=samples, combo_key=key, **knob)

    rows += [knob_row(105, "gathered", row_layout="gathered"), knob_row(130, "gemm=gluon", contiguous_gemm="gluon")]
    df, _ = load_run(write_run(tmp_path / "run", pd.DataFrame(rows)))
    best = best_per_size(df).set_index("tokens_per_rank")
    clear, tie = best.loc[64], best.loc[256]
    assert clear.combination == "local/triton red=experts ovl=none quant=bf16" and clear.candidates == 4
    assert clear.runner_up == "local/triton red=experts ovl=none quant=bf16 gathered"
    assert clear.clear_win and 1.0 < clear.margin_lo <= clear.margin <= clear.margin_hi < 1.1
    assert tie.candidates == 2 and not tie.clear_win and tie.margin_lo < 1.0 < tie.margin_hi
    from moebench.report.best_per_size import combination  # the gluon row: its own entry, named by its tag

    gluon = df[df.combo_key.str.endswith("gemm=gluon")].iloc[0]
    assert combination(gluon) == "local/triton red=experts ovl=none quant=bf16 gemm=gluon"


def test_results_table_names_its_test_apart_from_the_reports_fastest(tmp_path):
    """tune --results' column is the margin's 95 % interval above 1, not the report's p20–p80
    test: a row both noisy and far apart in samples reads 'yes' here and 'no clear fastest' there,
    so the header and key name the test (no bare 'clear')."""
    from moebench.report.best_per_size import best_per_size, table
    from moebench.report.summary import wins
    from moebench.results.synthetic import make_row

    rng = np.random.default_rng(0)
    # 1 % apart by median, 5 % spread, 400 samples: the ratio's interval is above 1, p20–p80 overlap
    rows = [
        make_row("local", "triton", "experts", "none", "bf16", 64, samples_us=100 * np.exp(rng.normal(0, 0.05, 400))),
        make_row("local", "torch", "experts", "none", "bf16", 64, samples_us=101 * np.exp(rng.normal(0, 0.05, 400))),
    ]
    df = pd.DataFrame(rows)
    best = best_per_size(df)
    assert bool(best.iloc[0].clear_win)
    assert any("no clear fastest" in w and "p20–p80" in w for w in wins(df))
    text = table(best)
    header = text.splitlines()[0]
    assert "| CI > 1 |" in header and "| clear |" not in header
    assert "95 % bootstrap interval lies above 1" in text and "p20–p80 intervals are apart" in text


def test_the_winners_knob_tags_are_the_cards_own():
    """best_per_size names a combination's knobs as the labels do (each card's Knob.tag), for
    every registered knob: a float column read back from Parquet prints as its knob's type, a
    knob at its default prints nothing, deepep_ht's SM count always prints."""
    import pandas as pd

    from moebench.report.best_per_size import knobs_of

    row = pd.Series(
        dict(
            backend="local",
            experts="triton_or_deepgemm",
            deepgemm_min_tokens=512.0,
            shared_sm_carveout=24.0,
            contiguous_gemm="auto",
            row_layout="gathered",
            num_sms=float("nan"),
        )
    )
    assert knobs_of(row) == "carve24 gathered dgmin512"
    assert knobs_of(pd.Series(dict(backend="deepep_ht", experts="triton", num_sms=24.0, row_layout="auto"))) == "sms24"
    assert knobs_of(pd.Series(dict(backend="local", knobs="from the label"))) == "from the label"


def test_results_heatmap_cells_hold_their_text_and_print_the_interval_to_3_decimals(tmp_path, monkeypatch):
    """Each cell's text stays inside its cell (the longest winner names, with knobs), and a clear
    win of a few tenths of a percent prints an interval that is visibly above 1 ([1.001, 1.006],
    not [1.00, 1.01])."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    import moebench.util.pngfile as pngfile
    from moebench.report.best_per_size import heatmap

    figs = []
    monkeypatch.setattr(pngfile, "save_figure", lambda fig, path, **kw: figs.append(fig) or path)
    cell = dict(backend="local", experts="triton_or_deepgemm", reduction="experts", overlap="dispatch")
    best = pd.DataFrame(
        [
            dict(model=m, tokens_per_rank=t, quant="fp8_block", knobs=k, margin=1.002, margin_lo=1.001, margin_hi=1.006)
            | dict(clear_win=True, **cell)
            for m in ("deepseek_v3", "mixtral_8x7b")
            for t, k in ((128, ""), (4096, "carve24 sms16 gathered gemm=gluon"), (16384, ""))
        ]
    )
    heatmap(best, tmp_path / "best_per_size.png")
    (fig,) = figs
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    cell_px = ax.get_window_extent().width / 3, ax.get_window_extent().height / 2
    texts = [t for t in ax.texts if t.get_text()]
    assert len(texts) == 6
    for t in texts:
        box = t.get_window_extent()
        assert box.width < cell_px[0] and box.height < cell_px[1], (t.get_text(), box, cell_px)
    assert all("[1.001, 1.006]" in t.get_text() for t in texts)


def test_a_run_with_no_gpu_time_says_what_would_give_it_in_the_reports_words(tmp_path):
    """`tune --results` on a run of host-time rows said 'measure on a GPU with runner.timing=auto',
    its own wording beside the report's (time_basis.GPU_TIME_ADVICE), and the same words to a CPU run."""
    from moebench.report.best_per_size import best_per_size
    from moebench.report.time_basis import CPU_ADVICE, GPU_TIME_ADVICE
    from moebench.results.synthetic import make_row

    def rows(**extra):
        return pd.DataFrame(
            [
                make_row("local", e, "experts", "none", "bf16", 16, samples_us=[100.0, 101.0], **extra)
                for e in ("torch", "triton")
            ]
        )

    # rows from before the hold at a decode size: host time (eager-decode)
    with pytest.raises(ValueError, match="nothing to rank") as old:
        best_per_size(rows(host_enqueue_us=np.nan))
    assert str(old.value).endswith(f"nothing to rank; {GPU_TIME_ADVICE['eager-decode']}"), old.value
    with pytest.raises(ValueError, match="nothing to rank") as cpu:
        best_per_size(rows(device="cpu"))
    assert str(cpu.value).endswith(f"nothing to rank; {CPU_ADVICE}"), cpu.value
