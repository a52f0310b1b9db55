"""Reports over a results run: markdown tables, plots, PR report, baseline comparison.

Entry points: ``load_run`` (rows + env), ``tables.*`` (markdown tables), ``plots.*``
(PNGs), ``compare_runs`` (asv-style verdicts), ``write_report`` / ``report_command``.
"""
from .compare import Comparison, compare_runs, comparison_markdown, mann_whitney_p
from .load import load_run
from .markdown import report_command, write_report
from .tables import (latency_table, memory_table, overlap_table, phase_table,
                     reasons_table, status_table)

__all__ = [
    "Comparison", "compare_runs", "comparison_markdown", "latency_table", "load_run",
    "mann_whitney_p", "memory_table", "overlap_table", "phase_table", "reasons_table",
    "report_command", "status_table", "write_report",
]
