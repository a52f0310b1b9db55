"""Analysis notebooks run top to bottom against a synthetic results run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from moebench.report.synthetic import synthetic_run

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "explore_results.ipynb"


def test_explore_results_notebook_runs(tmp_path, monkeypatch):
    run = synthetic_run(tmp_path / "run")
    monkeypatch.setenv("MOEBENCH_RUN", str(run))
    # The kernel is a fresh process: let it import this checkout and draw headless.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError on any failing cell

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    markdown = "\n".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert "| backend | experts |" in markdown  # the latency table
    assert "| ok | 12 | 4 |" in markdown  # the status summary
    assert "70%" in markdown  # the overlap table
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
    assert str(run) in "".join(o.get("text", "") for o in outputs)
