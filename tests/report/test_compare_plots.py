"""comparison.png / comparison_latency.png say what they draw: the title names how the bars beyond
40 were chosen as they were (a CPU run calls nothing), the legend lists only colours drawn, and a
CPU run's figures say they are a pipeline check, as a single run's report figures do."""

from __future__ import annotations

import pytest

from moebench.report import plots_compare
from moebench.report.answer_frame import CPU_PREFIX
from moebench.report.compare import compare_runs
from moebench.results.synthetic import make_rows

TOKENS = tuple(range(16, 16 * 16, 16))  # 15 token counts a combination: beyond 40 pairs


@pytest.fixture
def drawn(monkeypatch):
    """Each figure's title and legend labels, as plot_* laid them out (the figure not written)."""
    seen: dict = {}

    def save(fig, path):
        seen[path] = (fig._suptitle.get_text(), [t.get_text() for lg in fig.legends for t in lg.get_texts()])
        return path

    monkeypatch.setattr(plots_compare, "save", save)
    return seen


def _cmp(device: str, scale: float = 1.0):
    base = make_rows(tokens=TOKENS, seed=0).assign(device=device)
    cand = make_rows(tokens=TOKENS, seed=1, scale=scale).assign(device=device)
    return compare_runs(base, cand)


def test_a_cpu_comparison_is_titled_a_pipeline_check_with_only_its_legend_entry(drawn):
    cmp = _cmp("cpu", scale=1.3)
    drawn_rows, total = plots_compare.bar_rows(cmp)
    assert (drawn_rows["verdict"] == "cpu").all() and total > plots_compare.MAX_BARS
    plots_compare.plot_comparison(cmp, "lat")
    plots_compare.plot_comparison_latency(cmp, "lines")
    title, legend = drawn["lat"]
    assert title.startswith(CPU_PREFIX) and "called" not in title, title
    assert f"({plots_compare.MAX_BARS} of {total} rows: the largest changes; in combination order)" in title
    assert legend == ["no verdict (CPU time)"], legend
    assert drawn["lines"][0].startswith(CPU_PREFIX), drawn["lines"][0]


def test_a_gpu_comparison_names_the_changes_called_and_no_cpu_caveat(drawn):
    cmp = _cmp("cuda", scale=1.3)
    num_slower = int((cmp.matched["verdict"] == "slower").sum())
    assert num_slower > plots_compare.MAX_BARS // 2
    plots_compare.plot_comparison(cmp, "lat")
    title, legend = drawn["lat"]
    assert not title.startswith(CPU_PREFIX)
    assert f"rows: the {plots_compare.MAX_BARS} changes called; in combination order)" in title, title
    assert "slower" in legend and "faster" not in legend and "no significant change" not in legend, legend
