"""The analysis notebook runs top to bottom on a committed GPU run; it picks the newest run
by its rows' timestamps, not by name."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from moebench.report import newest_run
from moebench.results.synthetic import make_rows, write_run

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "explore_results.ipynb"
COMMITTED = ROOT / "results" / "weight_reduce_memory"  # both reductions, torch and triton, memory measured


def test_explore_results_notebook_runs_on_a_committed_run(monkeypatch):
    monkeypatch.setenv("MOEBENCH_RUN", str(COMMITTED))
    monkeypatch.delenv("MOEBENCH_BASELINE", raising=False)
    # The kernel is a fresh process: let it import this checkout and draw headless.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # raises CellExecutionError on any failing cell

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    markdown = "\n".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert "**Summary:** 24 ok" in markdown  # the reviewer summary's first line
    # the report's opening, through report/answers.py: what each choice does, split by experts
    assert "- `reduction=experts` vs `finalize`: at 4096 tok with experts=torch 0.91 × [" in markdown
    assert "## Fastest per size" in markdown and "## Workspace per reduction placement" in markdown
    assert "| ok | 24 | 8 |" in markdown  # the status table
    assert "| experts | reduction | quant |" in markdown  # latency: only the columns that vary
    assert "workspace analytic MiB" in markdown  # memory
    assert "**Verdict (reduction=finalize vs reduction=experts)" in markdown  # one comparison, along reduction
    # the opening's four figures (effects, latency, workspace, phases) and the comparison's bars
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 5
    assert str(COMMITTED) in "".join(o.get("text", "") for o in outputs)


def test_newest_run_is_the_latest_by_timestamp_not_by_name(tmp_path):
    old, new = make_rows(tokens=(16,)), make_rows(tokens=(16,), seed=1)
    old["timestamp"], new["timestamp"] = "2026-02-01T00:00:00", "2026-03-01T00:00:00"
    write_run(tmp_path / "z_old", old)
    write_run(tmp_path / "a_new", new)
    write_run(tmp_path / "nested" / "m_mid", old.assign(timestamp="2026-02-15T00:00:00"))
    assert newest_run(tmp_path) == tmp_path / "a_new"
    assert newest_run(tmp_path / "nested") == tmp_path / "nested" / "m_mid"
    assert newest_run(tmp_path / "missing") is None
    assert isinstance(pd.read_parquet(next((tmp_path / "a_new" / "rows").glob("*.parquet"))), pd.DataFrame)
