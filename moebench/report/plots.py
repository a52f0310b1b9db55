"""PNG plots of a comparison (matplotlib, no pyplot: safe headless), as small multiples
(report/plotgrid.py): `plot_comparison` and `plot_comparison_latency` (report/plots_compare.py),
under the one name callers and the notebook use (`plots.plot_comparison`). A run's own figures
are the answers' (report/answer_plots.py).

Every function writes one PNG at ``path`` and returns that path, or returns None (and
writes nothing) when the rows hold nothing to plot.
"""

from __future__ import annotations

from moebench.report.plots_compare import plot_comparison, plot_comparison_latency

__all__ = ["plot_comparison", "plot_comparison_latency"]
