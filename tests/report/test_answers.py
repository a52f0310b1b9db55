"""The report's opening answers the questions (report/answers.py, docs/design.md "What a report
answers"): on the committed GPU runs its first 40 lines hold what each choice does and the fastest
per size, the tables sit folded below, every figure is within 2,000 x 1,800 px and says a number
in its title, on a CPU run each title says it is a pipeline check, and a run of any size keeps its
figures within the budget (10,000 rows in the slow tier)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from moebench.report.answers import CHOICES
from moebench.report.document import build_report
from moebench.results.synthetic import make_row, samples_from, write_run

ROOT = Path(__file__).resolve().parents[2]
RUNS = ("default_sweep/h200x1_held", "weight_reduce_memory")
RATIO = re.compile(r"\d+\.\d{2,4} × \[\d+\.\d{2,4}, \d+\.\d{2,4}\] \(\d+ pairs?")
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+\.png)\)")
MAX_W, MAX_H = 2000, 1800


def figures(md: str, folder: Path) -> list[tuple[str, Path]]:
    return [(alt, folder / name) for alt, name in IMAGE.findall(md)]


def check_figures(folder: Path, md: str) -> None:
    """Every PNG in the folder within the size limits; every image the Markdown shows exists and
    its title (alt text) holds a number."""
    pngs = sorted(folder.glob("*.png"))
    assert pngs
    for png in pngs:
        with Image.open(png) as im:
            assert im.width <= MAX_W and im.height <= MAX_H, (png.name, im.size)
    for alt, path in figures(md, folder):
        assert path.is_file(), path
        assert re.search(r"\d", alt), f"{path.name}: its title says no number: {alt!r}"


@pytest.mark.parametrize("name", RUNS)
def test_a_committed_gpu_run_opens_with_the_answers(tmp_path, name):
    run = ROOT / "results" / name
    out = tmp_path / "report"
    build_report(run, out)
    md = (out / "report.md").read_text()
    head = md.splitlines()[:40]
    text = "\n".join(head)
    assert "## What each choice does" in text and "## Fastest per size" in text
    df = pd.concat(pd.read_parquet(p) for p in (run / "rows").glob("*.parquet"))
    ok = df[df["status"] == "ok"]
    varying = [a for a in CHOICES if a in ok.columns and ok[a].astype(str).nunique() > 1]
    assert varying
    for axis in varying:  # a line per varying axis: its effects with their intervals, or why none
        lines = [x for x in head if x.startswith((f"- `{axis}=", f"- `{axis}`:"))]
        assert lines, f"no line for {axis} in the first 40 lines"
        assert any(RATIO.search(x) for x in lines) or "no pair of rows differs only in" in lines[0]
    fastest = text.partition("## Fastest per size")[2]
    assert re.search(r"^- .* tok: (fastest|no clear fastest)", fastest, re.M)
    # what is not an answer is folded: the skip reasons and the full tables
    folded = md.partition("## Everything else")[2]
    for heading in ("## Status", "## Latency", "## Memory"):
        block = folded.partition(heading)[0].rpartition("<details>")[2]
        assert "</details>" not in block, f"{heading} is not inside a <details> block"
    assert "| status | reason |" in folded.partition("## Latency")[0] or "_All rows are ok._" in folded
    check_figures(out, md)


def test_reduction_inside_the_experts_is_said_with_its_numbers(tmp_path):
    """The held run's finding, said in the opening: weight-and-reduce inside the experts is
    0.71 x finalize's latency for deepgemm and 0.79 x for triton at 4096 tokens, 1.01 x for torch."""
    out = tmp_path / "report"
    build_report(ROOT / "results" / "default_sweep" / "h200x1_held", out)
    line = next(x for x in (out / "report.md").read_text().splitlines() if x.startswith("- `reduction=experts`"))
    at = line.partition("at 4096 tok with experts=")[2]
    assert at.startswith("deepgemm 0.71 × [0.71, 0.71] (3 pairs)")
    assert "torch 1.01 × [1.01, 1.01] (9 pairs, no difference)" in at and "triton 0.79 × [0.77, 0.81]" in at


def cpu_run(path: Path) -> Path:
    rng = np.random.default_rng(0)
    rows = [
        make_row(b, e, r, o, q, t, samples_us=samples_from(100.0 + t, 0.02, 10, rng), device="cpu")
        for (b, e, r, o, q), t in itertools.product(
            [("local", e, r, "none", "bf16") for e in ("torch", "triton") for r in ("finalize", "experts")], (16, 64)
        )
    ]
    return write_run(path, pd.DataFrame(rows))


def test_a_cpu_run_says_every_figure_is_a_pipeline_check(tmp_path):
    out = tmp_path / "report"
    build_report(cpu_run(tmp_path / "run"), out)
    md = (out / "report.md").read_text()
    assert "## What each choice does (CPU: a pipeline check, not performance)" in md
    fastest = md.partition("## Fastest per size\n\n")[2].partition("\n")[0]
    assert fastest == "- no fastest named: 8 ok rows are CPU time (pipeline checks, not performance figures)"
    shown = figures(md, out)
    assert shown
    for alt, _ in shown:
        assert alt.startswith("CPU pipeline check, not performance: "), alt
    check_figures(out, md)


def test_a_cpu_run_draws_no_fastest_phases_and_says_why(tmp_path):
    """A CPU report said 'no fastest named' yet phases.png was titled 'the fastest of each workload',
    its noise winner's phases adding up to 2.4 × its latency: on a CPU the figure is left out, and
    the phase table says why."""
    from moebench.report.phase_plot import CPU_NO_FIGURE

    rng = np.random.default_rng(1)
    rows = [
        make_row("local", "torch", r, "none", "bf16", t, samples_us=samples_from(100.0 + t, 0.02, 10, rng),
                 device="cpu", prepare_us=80.0, experts_us=160.0, combine_us=20.0)
        for r in ("finalize", "experts") for t in (16, 64)
    ]  # fmt: skip
    out = tmp_path / "report"
    build_report(write_run(tmp_path / "run", pd.DataFrame(rows)), out)
    md = (out / "report.md").read_text()
    assert "phases.png" not in md and not (out / "phases.png").exists()
    table = md.partition("## Phase breakdown")[2].partition("</details>")[0]
    assert CPU_NO_FIGURE in table and "no row is the fastest" in CPU_NO_FIGURE, table
    check_figures(out, md)


def big_run(path: Path, models: int, seed: int, scale: float = 1.0) -> Path:
    """A synthetic run of models x 24 combinations x 10 token counts (models=42: 10,080 rows)."""
    rng = np.random.default_rng(seed)
    combos = list(
        itertools.product(("torch", "triton"), ("finalize", "experts"), ("none", "dispatch", "combine"),
                          ("bf16", "fp8_block"))
    )  # fmt: skip
    rows = []
    for m in range(models):
        for i, (e, r, o, q) in enumerate(combos):
            for t in (2**k for k in range(4, 14)):
                med = scale * (40 + 0.5 * t) * (0.7 if e == "triton" else 1) * (1 + 0.01 * ((m + i) % 7))
                rows.append(
                    make_row("local", e, r, o, q, t, samples_us=samples_from(med, 0.02, 20, rng), model=f"m{m}")
                )
    return write_run(path, pd.DataFrame(rows))


def report_and_compare_stay_in_budget(tmp_path: Path, models: int) -> None:
    a, b = big_run(tmp_path / "a", models, 0), big_run(tmp_path / "b", models, 1, scale=1.03)
    build_report(a, tmp_path / "ra")
    check_figures(tmp_path / "ra", (tmp_path / "ra" / "report.md").read_text())
    build_report(b, tmp_path / "rc", baseline=a)
    check_figures(tmp_path / "rc", (tmp_path / "rc" / "report.md").read_text())
    names = {p.name for p in (tmp_path / "rc").glob("*.png")}
    assert {"comparison.png", "comparison_latency.png", "effects.png", "latency.png"} <= names


def test_a_run_of_many_rows_keeps_every_figure_in_budget(tmp_path):
    """The default tier's sibling of the 10,000-row test: 960 rows, past every figure's budget
    (effects, combinations, panels, the comparison's bars)."""
    report_and_compare_stay_in_budget(tmp_path, models=4)


@pytest.mark.slow
def test_two_runs_of_ten_thousand_rows_keep_every_figure_in_budget(tmp_path):
    report_and_compare_stay_in_budget(tmp_path, models=42)


def test_a_run_of_several_models_names_each_ones_fastest(tmp_path):
    """A run of two models (the tuner's after sweep): the fastest figure ranked rows of different
    models against each other and drew the small model alone ("Fastest at 16384 tok: deepgemm
    deepseek_v2_lite"). Each workload gets its panel and its own fastest, here a different expert."""
    rng = np.random.default_rng(3)
    rows = []
    for model, scale, quick in (("small", 1.0, "triton"), ("large", 8.0, "torch")):
        for e, t in itertools.product(("torch", "triton"), (256, 1024, 4096)):
            med = scale * (40 + 0.5 * t) * (0.8 if e == quick else 1.0)
            s = samples_from(med, 0.01, 20, rng)
            phases = dict(prepare_us=0.05 * med, experts_us=0.9 * med, combine_us=0.05 * med)
            rows.append(make_row("local", e, "experts", "none", "bf16", t, samples_us=s, model=model, **phases))
    out = tmp_path / "report"
    build_report(write_run(tmp_path / "run", pd.DataFrame(rows)), out)
    md = (out / "report.md").read_text()
    shown = dict((p.name, alt) for alt, p in figures(md, out))
    latency = shown["latency.png"]
    assert latency.startswith("Fastest at each workload's largest size: ")
    assert "large: torch, " in latency and "small: triton, " in latency, latency
    phases = shown["phases.png"]
    assert re.search(r"large: experts \d+ % of the phases \(torch, 4096 tok\)", phases), phases
    assert re.search(r"small: experts \d+ % of the phases \(triton, 4096 tok\)", phases), phases
    check_figures(out, md)


def test_the_workloads_drawn_are_spread_over_the_models():
    """Ten workloads, two models × five routings: the four panels take both models in turn (the
    routing run's figures once showed deepseek_v3's first four routings and no qwen3)."""
    from moebench.report.workloads import spread

    groups = [(f"{m} · routing={r}", pd.DataFrame()) for m in ("deepseek_v3", "qwen3") for r in "abcde"]
    names = [n for n, _ in spread(groups, 4)]
    assert names == ["deepseek_v3 · routing=a", "qwen3 · routing=a", "deepseek_v3 · routing=b", "qwen3 · routing=b"]


def test_each_workloads_panel_has_its_baseline_and_names_a_combination_alike(tmp_path, monkeypatch):
    """Model A varies the experts and the reduction, model B the experts alone: B's triton row is
    labelled with its reduction as A's are (a label per panel said just `triton`), each panel draws
    its own workload's baseline (the run-wide one belonged to one model only), and one combination
    has one colour and line style in every panel."""
    from moebench.report import answer_plots as ap
    from moebench.report.answers import baseline_key
    from moebench.report.columns import combo_labels

    rng = np.random.default_rng(5)
    rows = []
    for model, combos in (("A", [("torch", "finalize"), ("triton", "finalize"), ("triton", "experts")]),
                          ("B", [("torch", "finalize"), ("triton", "finalize")])):  # fmt: skip
        for (e, r), t in itertools.product(combos, (16, 64, 256, 1024)):
            med = (100 + t) * (0.8 if e == "triton" else 1.0) * (0.9 if r == "experts" else 1.0)
            rows.append(
                make_row("local", e, r, "none", "bf16", t, samples_us=samples_from(med, 0.01, 10, rng), model=model)
            )
    ok = pd.DataFrame(rows)
    ok["status"] = "ok"
    drawn = {}
    real_save = ap.finish
    monkeypatch.setattr(
        ap,
        "finish",
        lambda fig, path, title, cpu, left_out="": (
            drawn.setdefault("fig", fig) and real_save(fig, path, title, cpu, left_out)
        ),
    )
    made = ap.plot_fastest(ok, combo_labels, tmp_path / "latency.png", False, baseline_key)
    assert made is not None and made.title.startswith("Fastest at each workload's largest size: A: ")
    panels = drawn["fig"].axes
    legends = [
        {t.get_text(): h for h, t in zip(ax.get_legend().legend_handles, ax.get_legend().get_texts(), strict=True)}
        for ax in panels
    ]
    for names in legends:
        assert any(n.endswith("(baseline)") for n in names), names
        assert "triton red=finalize" in {n.removesuffix(" (baseline)") for n in names}, names
    style = [{n.removesuffix(" (baseline)"): (h.get_color(), h.get_linestyle()) for n, h in d.items()} for d in legends]
    assert style[0]["triton red=finalize"] == style[1]["triton red=finalize"]
    assert style[0]["torch red=finalize"] == style[1]["torch red=finalize"]


def test_a_phase_has_one_colour_in_every_phase_figure_whichever_phases_a_run_has(tmp_path, monkeypatch):
    """phases.png colours each phase as the trace timelines do (report/timeline.py PHASE_COLORS),
    not by its position among the phases a run happens to have: a run without dispatch and one
    with it draw experts, weight reduce and combine alike."""
    from matplotlib.colors import to_hex

    from moebench.report import phase_plot
    from moebench.report.columns import combo_labels
    from moebench.report.timeline import PHASE_COLORS

    rng = np.random.default_rng(3)
    drawn = []
    real_save = phase_plot.finish
    monkeypatch.setattr(phase_plot, "finish", lambda fig, *a, **k: drawn.append(fig) or real_save(fig, *a, **k))
    for with_dispatch in (False, True):
        rows = []
        for e in ("torch", "triton"):
            phases = dict(experts_us=60.0, weight_reduce_us=20.0, combine_us=10.0)
            phases |= dict(dispatch_us=15.0) if with_dispatch else {}
            rows.append(
                make_row("local", e, "experts", "none", "bf16", 64, samples_us=samples_from(100, 0.01, 10, rng))
                | phases
            )
        ok = pd.DataFrame(rows).assign(status="ok")
        assert phase_plot.plot_phase_fastest(ok, combo_labels, tmp_path / f"phases{with_dispatch}.png") is not None
    for fig in drawn:
        handles, names = fig.axes[0].get_legend_handles_labels()
        colours = {
            n: to_hex(h.patches[0].get_facecolor())
            for h, n in zip(handles, names, strict=True)
            if n != "layer latency (median)"
        }
        assert colours == {n: PHASE_COLORS[n.replace(" ", "_")] for n in colours}, colours
        assert {"experts", "weight reduce", "combine"} <= set(colours)
