"""Which of a pair's rows is newest is the run folder's write sequence (`write_seq`,
moebench/results/sequence.py), not the wall clock (issue #52): a redo after the clock stepped
back wins; rows written before the sequence keep the timestamp rule; the order survives
compaction, a lost counter and several processes writing one folder at once."""

from __future__ import annotations

import multiprocessing
import os

import pandas as pd
import pytest

from moebench import cli
from moebench.results import finished
from moebench.results.compact import compact_run
from moebench.results.sequence import SEQ_COLUMN, SEQ_FILE
from moebench.results.store import RunStore, load_files
from moebench.util.safe_write import UnsafePath
from tests.results.test_store import LOCAL

DAY = 86400


def _row(key, t, status, ts, run_id="r1"):
    return {"combo_key": key, "tokens_per_rank": t, "status": status, "timestamp": ts, "reason": "", "run_id": run_id}


def _back(path, days=1):
    """The file's times as a clock stepped back by `days` would have set them."""
    st = os.stat(path)
    os.utime(path, (st.st_atime - days * DAY, st.st_mtime - days * DAY))


def test_a_redo_written_after_the_clock_stepped_back_wins(tmp_path):
    store = RunStore(tmp_path)
    store.write_rows("a", [_row("a", 4, "failed", "2026-01-02T00:00:00")])
    # the redo, a day "earlier" by the clock: its timestamp and its file's mtime are older
    _back(store.write_rows("a", [_row("a", 4, "ok", "2026-01-01T00:00:00", "r2")]))
    df = RunStore(tmp_path).load()
    assert list(df.status) == ["ok"] and list(df.run_id) == ["r2"]
    assert RunStore(tmp_path).stored() == {"a": {4: "ok"}}
    assert sorted(RunStore(tmp_path).load(all_rows=True)[SEQ_COLUMN]) == [1, 2]
    # a copy of the row files read outside the folder keeps the order too
    assert list(load_files(RunStore(tmp_path).row_files(), "copy").run_id) == ["r2"]


def test_rows_written_before_the_sequence_keep_the_timestamp_rule(tmp_path):
    store = RunStore(tmp_path)
    store.rows_dir.mkdir()
    # an earlier moebench's files, no write_seq: the newer timestamp wins, whatever the file order
    pd.DataFrame([_row("a", 4, "ok", "2026-01-02T00:00:00", "new")]).to_parquet(store.rows_dir / "a-T4-new.parquet")
    pd.DataFrame([_row("a", 4, "failed", "2026-01-01T00:00:00", "old")]).to_parquet(store.rows_dir / "a-T4-old.parquet")
    _back(store.rows_dir / "a-T4-new.parquet")
    assert list(store.load().run_id) == ["new"]
    # a row written with the sequence is newer than every row without it, whatever its timestamp
    store.write_rows("a", [_row("a", 4, "incorrect", "2025-01-01T00:00:00", "seq")])
    assert list(RunStore(tmp_path).load().run_id) == ["seq"]
    assert RunStore(tmp_path).stored() == {"a": {4: "incorrect"}}


def test_the_order_survives_compaction_and_a_lost_counter(tmp_path):
    store = RunStore(tmp_path)
    store.write_rows("a", [_row("a", 4, "failed", "2026-01-03T00:00:00")])
    store.write_rows("a", [_row("a", 4, "ok", "2026-01-02T00:00:00", "r2")])
    store.write_rows("b", [_row("b", 4, "ok", "2026-01-02T00:00:00", "r2")])
    compact_run(tmp_path)
    assert [f.name for f in store.row_files()] == ["rows.parquet"]
    assert list(RunStore(tmp_path).load().sort_values("combo_key").run_id) == ["r2", "r2"]
    # the counter lost (or the rows copied without it): a new writer counts on from the rows
    (tmp_path / SEQ_FILE).unlink()
    store = RunStore(tmp_path)
    store.write_rows("a", [_row("a", 4, "timeout", "2026-01-01T00:00:00", "r3")])
    assert (tmp_path / SEQ_FILE).read_text() == "4"
    assert list(RunStore(tmp_path).load().sort_values("combo_key").run_id) == ["r3", "r2"]
    # a counter behind the rows (an older copy of the folder's) is overtaken by them at a process's first write
    (tmp_path / SEQ_FILE).write_text("1")
    assert RunStore(tmp_path).next_seq() == 5


def _take(run_dir, n, q):
    store = RunStore(run_dir)
    q.put([store.next_seq() for _ in range(n)])


def test_writers_of_one_folder_at_once_never_share_a_number(tmp_path):
    # a sweep's SLURM jobs write one folder at once under the holder's token (results/lock.py)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_take, args=(tmp_path, 25, q)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [n for _ in procs for n in q.get(timeout=60)]
    for p in procs:
        p.join(timeout=60)
    assert sorted(got) == list(range(1, 101))


def test_the_counter_is_never_written_through_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("7")
    run = tmp_path / "run"
    run.mkdir()
    (run / SEQ_FILE).symlink_to(outside)
    with pytest.raises(UnsafePath, match="symbolic link"):
        RunStore(run).write_rows("a", [_row("a", 4, "ok", "2026-01-01T00:00:00")])
    assert outside.read_text() == "7" and not (run / "rows").exists()


@pytest.mark.multiprocess
def test_a_sweep_redone_under_a_clock_a_day_back_keeps_the_redo(tmp_path, monkeypatch):
    """`moebench sweep`, then the same with `--redo all` under a clock stepped back a day
    (`faketime -1d`): the redo's rows are the run's."""
    run = tmp_path / "run"
    args = ["sweep", *LOCAL, "workload.tokens_per_rank=[4,8]", "--out", str(run)]
    monkeypatch.setattr(finished, "now_iso", lambda: "2026-06-02T00:00:00+00:00")
    assert cli.main(args) == 0
    monkeypatch.setattr(finished, "now_iso", lambda: "2026-06-01T00:00:00+00:00")
    assert cli.main([*args, "--redo", "all"]) == 0
    for f in RunStore(run).row_files():
        if "2026-06-01" in str(pd.read_parquet(f).timestamp[0]):
            _back(f)  # the redo's files carry the stepped clock's times too
    df = RunStore(run).load()
    assert len(df) == 2 and set(df.timestamp) == {"2026-06-01T00:00:00+00:00"}, df[["timestamp", SEQ_COLUMN]]
    assert len(RunStore(run).load(all_rows=True)) == 4
