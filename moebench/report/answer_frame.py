"""The frame every figure of a report's answers shares (report/answer_plots.py, report/phase_plot.py):
a figure 990 px wide and at most MAX_PX tall, its title (the answer in words and numbers, "CPU
pipeline check, not performance: " first on a CPU run), the PNG written, and what it left out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure as MplFigure

from moebench.util.pngfile import DPI, save_figure

MAX_PX = (2000, 1800)  # width, height
WIDTH_IN = 9.0  # ~990 px at moebench's dpi
CPU_PREFIX = "CPU pipeline check, not performance: "
MAX_PANELS = 4  # token counts or workloads a figure draws a panel each
# names the rows of a figure, telling apart only what varies among them (report.columns.combo_labels)
Labeller = Callable[[pd.DataFrame], pd.Series]


@dataclass(frozen=True)
class Figure:
    """A written figure: its file, its title (the Markdown image's alt text) and what it left out."""

    path: Path
    title: str
    left_out: str = ""

    def markdown(self) -> str:
        tail = f" *{self.left_out}*" if self.left_out else ""
        return f"![{self.title}]({self.path.name}){tail}"


def frame(height_in: float, ncols: int = 1, nrows: int = 1):
    """(figure, its axes as a flat list): WIDTH_IN wide, `height_in` tall up to MAX_PX's height."""
    height_in = min(height_in, MAX_PX[1] / DPI - 0.05)
    fig = MplFigure(figsize=(WIDTH_IN, height_in), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    return fig, axes


def finish(fig: MplFigure, path, title: str, cpu: bool, left_out: str = "") -> Figure:
    """The figure titled (the CPU prefix on a CPU run) and written at `path`."""
    title = (CPU_PREFIX if cpu else "") + title
    fig.suptitle(title, fontsize=10, wrap=True)
    return Figure(save_figure(fig, path), title, left_out)


def tokens_log2(ax, tokens: list[int]) -> None:
    """Tokens per rank on a log-2 axis, labelled with the run's own token counts."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(tokens, [str(t) for t in tokens])
    ax.minorticks_off()
    ax.set_xlabel("tokens per rank")


def us_text(x: float) -> str:
    """A time in µs as a title says it: 1,211 or 42.5."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"
