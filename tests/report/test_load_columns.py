"""The report's loader reads only the columns a report uses (issue #52): the per-rank and
per-sample lists no report, comparison or table reads stay on disk, and no module of the report
or the commands starts reading one without the loader being told."""

from __future__ import annotations

import re
from pathlib import Path

from moebench.report.columns import READ_LISTS, UNREAD_COLUMNS
from moebench.report.load import load_run
from moebench.results import row as schema
from moebench.results.store import RunStore
from moebench.results.synthetic import many_rows, write_run

ROOT = Path(__file__).resolve().parents[2]


def test_the_unread_lists_stay_on_disk(tmp_path):
    rows = many_rows(3, tokens=(16, 64)).assign(latency_us_per_rank=[[1.0, 2.0]] * 6)
    run = write_run(tmp_path / "run", rows)
    stored = RunStore(run).load()
    assert {"latency_us_per_rank", "sm_clock_mhz_samples"} <= set(UNREAD_COLUMNS) & set(stored.columns)
    df, _ = load_run(run)
    assert not set(UNREAD_COLUMNS) & set(df.columns)
    assert "samples_us" in df.columns and len(df) == len(stored)


def test_no_report_module_reads_a_column_the_loader_leaves_out():
    assert set(READ_LISTS) <= set(schema.names(dtype="list"))  # the lists kept are stored lists
    readers = [*(ROOT / "moebench" / "report").glob("*.py"), *(ROOT / "moebench" / "cli").glob("*.py")]
    for path in readers:
        text = path.read_text()
        for col in UNREAD_COLUMNS:
            assert not re.search(rf"\b{col}\b", text), f"{path.name} reads {col}: take it out of UNREAD_COLUMNS"
