"""One declaration per column (moebench/results/row.py, the spec's fields): a column added there
reaches RankResult, the stored row, load_run and a report table without another edit, and the
store refuses a column declared nowhere."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moebench.results import row
from moebench.results.rank_result import RANK_ONLY, RankResult
from moebench.results.store import RunStore

ROOT = Path(__file__).resolve().parents[2]

# a throwaway column appended to MEASURED before anything else of moebench is imported: a
# rank's figure (max over ranks) that the memory table shows under its short label
ADD_A_COLUMN = r"""
import dataclasses, sys
from moebench.results import row
widget = row._c("widget_bytes", "float", "memory", row.MAX, "a test's column", (row.MEMORY_TABLE,), "widget")
row.MEASURED = (*row.MEASURED, widget)

from moebench.config import compose
from moebench.config.spec import Combination
from moebench.report.load import load_run
from moebench.report.run_tables import memory_table
from moebench.results.rank_result import RankResult
from moebench.results.rows import measured_row
from moebench.results.store import RunStore

assert "widget_bytes" in {f.name for f in dataclasses.fields(RankResult)}
cfg = compose.compose_config(["backend=local", "experts=torch", "model=tiny", "quant=bf16"])
c = Combination(compose.to_combo(cfg), (8,))
MIB = 2.0**20
ranks = [
    RankResult(rank=r, samples_us=[10.0] * 5, workspace_bytes_peak=MIB, widget_bytes=(3 + r) * MIB) for r in (0, 1)
]
meta = dict(run_id="r1", sweep="t", gpu="cpu", git_sha="0" * 40, env_id="e", timestamp="2026-01-01T00:00:00")
stored = measured_row(c, 8, ranks, meta)
assert stored["widget_bytes"] == 4 * MIB, stored["widget_bytes"]
run = sys.argv[1]
(RunStore(run).rows_dir).mkdir(parents=True, exist_ok=True)
RunStore(run).write_rows(c.key, [stored])
df, _ = load_run(run)
assert df["widget_bytes"].tolist() == [4 * MIB], df["widget_bytes"].tolist()
print(memory_table(df))
"""


def test_a_column_declared_once_reaches_rank_result_the_store_and_the_memory_table(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", ADD_A_COLUMN, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    header, _, first = out.stdout.splitlines()[:3]
    assert "| widget MiB |" in header, header
    assert first.endswith("| 4.00 | - |"), first  # widget MiB, then peak / declared


def test_rank_result_is_the_rank_columns_and_its_own_fields():
    names = [f.name for f in dataclasses.fields(RankResult)]
    assert names == [RANK_ONLY[0][0], *(c.name for c in row.rank_columns()), *(n for n, _, _ in RANK_ONLY[1:])]
    r = RankResult(rank=0)
    assert r.status == row.Status.OK and r.trace_overlap_fraction is None and r.samples_us == []


def test_rows_refuses_a_rank_field_it_has_no_rule_for(monkeypatch):
    from moebench.results import rank_result, rows

    odd = row._c("odd_us", "float", "latency", row.SAMPLES, "a rank's figure without a rule", rank=True)
    monkeypatch.setattr(row, "MEASURED", (*row.MEASURED, odd))
    monkeypatch.setattr(rows, "RankResult", rank_result.rank_result_class())
    assert rows.unknown_fields() == ["odd_us"]
    with pytest.raises(ValueError, match="odd_us"):
        rows.measured_row(None, 8, [], {})


def _row(**extra) -> dict:
    return {"combo_key": "k", "tokens_per_rank": 4, "status": "ok", "run_id": "r1", **extra}


def test_the_store_refuses_an_undeclared_column(tmp_path):
    store = RunStore(tmp_path / "run")
    store.rows_dir.mkdir(parents=True)
    for write in (lambda r: store.write_rows("k", [r]), lambda r: store.write_skipped([r])):
        with pytest.raises(ValueError, match=r"undeclared row column\(s\) \['no_such_column'\].*results/row.py"):
            write(_row(no_such_column=1.0))
    assert not store.row_files() and not (store.rows_dir / "skipped.parquet").exists()
    store.write_rows("k", [_row(nsys_capture="", workspace_bytes_peak=1.0)])  # declared ones pass


def test_a_registered_knob_is_a_column(tmp_path, monkeypatch):
    """A plugin's knobs are columns of its rows: a registered knob's name passes the store."""
    from moebench.config import spec

    store = RunStore(tmp_path / "run")
    store.rows_dir.mkdir(parents=True)
    with pytest.raises(ValueError, match="plugin_knob"):
        store.write_rows("k", [_row(plugin_knob=3)])
    monkeypatch.setattr(spec, "knob_meta", lambda: {**spec.builtin_knobs(), "plugin_knob": None})
    store.write_rows("k", [_row(plugin_knob=3)])
    assert len(store.row_files()) == 1
