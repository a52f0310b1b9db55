"""Reports over a results run: markdown tables, plots, PR report, baseline comparison.

Entry points: ``load_run`` (rows + env), ``tables.*`` (markdown tables), ``plots.*``
(PNGs), ``compare_runs`` / ``axis.compare_axis`` (asv-style verdicts),
``write_report`` (report.md and its plots); the CLI bodies are moebench/cli/report.py.
"""

from moebench.report.compare import Comparison, compare_runs
from moebench.report.document import write_report
from moebench.report.load import load_run, newest_run
from moebench.report.run_tables import (
    latency_table,
    memory_table,
    overlap_table,
    phase_table,
    reasons_table,
    status_table,
)
from moebench.report.stats import mann_whitney_p
from moebench.report.verdict import exit_status

__all__ = [
    "Comparison",
    "compare_runs",
    "exit_status",
    "latency_table",
    "load_run",
    "mann_whitney_p",
    "memory_table",
    "newest_run",
    "overlap_table",
    "phase_table",
    "reasons_table",
    "status_table",
    "write_report",
]
