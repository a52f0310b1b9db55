"""Reports over a results run: markdown tables, plots, PR report, baseline comparison.

Entry points: ``load_run`` (rows + env), ``tables.*`` (markdown tables), ``plots.*``
(PNGs), ``compare_runs`` / ``axis.compare_axis`` (asv-style verdicts),
``write_report`` / ``report_command`` / ``compare_command`` (the CLI bodies).
"""
from .compare import Comparison, compare_runs, exit_status
from .command import compare_command, report_command
from .load import load_run, newest_run
from .markdown import write_report
from .stats import mann_whitney_p
from .tables import (latency_table, memory_table, overlap_table, phase_table,
                     reasons_table, status_table)

__all__ = [
    "Comparison", "compare_command", "compare_runs", "exit_status", "latency_table", "load_run",
    "mann_whitney_p", "memory_table", "newest_run", "overlap_table", "phase_table", "reasons_table",
    "report_command", "status_table", "write_report",
]
