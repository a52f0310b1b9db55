"""RunStore.update_rows (`trace --import`'s rewrite of a run's rows): every row file checked before any
is rewritten, then one file at a time, read, updated and written, so that its memory does not grow with
the run (it held every changed table until the last was read)."""

from __future__ import annotations

import gc
import os
import weakref

import pandas as pd
import pyarrow as pa
import pytest

from moebench.results import store
from moebench.results.store import RunStore
from moebench.util.safe_write import UnsafePath

KEYS = ("a", "b", "c", "d")


def _run(tmp_path):
    run = tmp_path / "run"
    (run / "rows").mkdir(parents=True)
    for key in KEYS:
        row = {"combo_key": key, "tokens_per_rank": 4, "status": "ok", "trace_path": "", "latency_us_median": 1.0}
        pd.DataFrame([row]).to_parquet(run / "rows" / f"{key}-T4.parquet", index=False)
    return run


def _traced(table: pa.Table) -> pa.Table:
    """Every row's trace_path set: a change to each file."""
    i = table.column_names.index("trace_path")
    return table.set_column(i, "trace_path", pa.array(["traces/x.json"] * len(table), pa.string()))


def test_each_file_is_written_before_the_next_is_read_and_no_earlier_table_stays(tmp_path, monkeypatch):
    run = _run(tmp_path)
    events: list[str] = []
    real_write = store._atomic_write

    def write(path, *a, **kw):
        events.append(f"write {path.name}")
        return real_write(path, *a, **kw)

    monkeypatch.setattr(store, "_atomic_write", write)
    seen: list[weakref.ref] = []

    def update(table: pa.Table) -> pa.Table:
        gc.collect()
        alive = [r() for r in seen if r() is not None]
        assert not alive, f"{len(alive)} table(s) of earlier files still held"
        events.append(f"update {table.column('combo_key')[0].as_py()}")
        new = _traced(table)
        seen.extend((weakref.ref(table), weakref.ref(new)))
        return new

    assert RunStore(run).update_rows(update) == len(KEYS)
    assert events == [e for k in KEYS for e in (f"update {k}", f"write {k}-T4.parquet")]
    assert set(RunStore(run).load()["trace_path"]) == {"traces/x.json"}


@pytest.mark.parametrize("bad", ["link", "folder"])
def test_a_row_file_that_is_a_link_or_no_file_refuses_before_any_is_rewritten(bad, tmp_path):
    """The last file a link (to a row file outside the run) or a folder: the rewrite of the first ones
    had happened before the write of that one refused (UnsafePath), a half-updated run."""
    run = _run(tmp_path)
    last = run / "rows" / "z-T4.parquet"
    if bad == "link":
        outside = tmp_path / "outside.parquet"
        os.replace(run / "rows" / "d-T4.parquet", outside)
        last.symlink_to(outside)
    else:
        last.mkdir()
    before = {f: f.read_bytes() for f in (run / "rows").glob("*.parquet") if f.is_file() and not f.is_symlink()}
    with pytest.raises(UnsafePath, match="z-T4.parquet"):
        RunStore(run).update_rows(_traced)
    assert {f: f.read_bytes() for f in before} == before
