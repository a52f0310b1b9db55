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
RATIO = re.compile(r"\d+\.\d\d × \[\d+\.\d\d, \d+\.\d\d\] \(\d+ pairs?")
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
    shown = figures(md, out)
    assert shown
    for alt, _ in shown:
        assert alt.startswith("CPU pipeline check, not performance: "), alt
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
