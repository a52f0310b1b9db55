"""The store's only door for discovery and compaction (issue #47): run folders found under a
root (moebench/results/store_read.py `find_runs`), row files merged under the run's lock
(moebench/results/compact.py) and scripts/compact_rows.py, which calls it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from moebench.results.compact import MERGED, canonical, compact_run
from moebench.results.lock import LockHeld, RunLock
from moebench.results.store import CORRUPT_DIR, RunStore, find_runs, invocation_files, invocation_rows

ROOT = Path(__file__).resolve().parents[2]


def _row(key, t, status, ts, run_id="r1"):
    return {"combo_key": key, "tokens_per_rank": t, "status": status, "timestamp": ts, "reason": "", "run_id": run_id}


def _run(path: Path) -> RunStore:
    store = RunStore(path)
    store.write_rows("a", [_row("a", 4, "failed", "2026-01-01T00:00:00")])
    store.write_rows("a", [_row("a", 4, "ok", "2026-01-01T00:00:00", "r2")])  # one second: file order decides
    store.write_rows("b", [_row("b", 4, "ok", "2026-01-02T00:00:00"), _row("b", 8, "oom", "2026-01-02T00:00:00")])
    store.write_skipped([_row("c", 4, "skipped", "2026-01-03T00:00:00")])
    return store


def _script():
    spec = importlib.util.spec_from_file_location("compact_rows", ROOT / "scripts" / "compact_rows.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runs_are_found_at_any_depth_and_only_with_row_files(tmp_path):
    _run(tmp_path / "x" / "one")
    _run(tmp_path / "two")
    (tmp_path / "empty" / "rows").mkdir(parents=True)
    (tmp_path / "aside" / "rows" / CORRUPT_DIR).mkdir(parents=True)
    (tmp_path / "aside" / "rows" / CORRUPT_DIR / "t.parquet").write_bytes(b"torn")
    assert find_runs(tmp_path) == [tmp_path / "two", tmp_path / "x" / "one"]
    assert find_runs(tmp_path / "two") == [tmp_path / "two"]


def test_one_invocations_rows_as_they_land(tmp_path):
    rows = _run(tmp_path).rows_dir
    got = invocation_rows(rows, "r1")
    assert sorted(got) == ["a-T4-r1.parquet", "b-T4_8-r1.parquet"] and len(got["b-T4_8-r1.parquet"]) == 2
    assert list(invocation_rows(rows, "r1", skip={"a-T4-r1.parquet"})) == ["b-T4_8-r1.parquet"]
    assert [f.name for f in invocation_files(rows, "r2", "a")] == ["a-T4-r2.parquet"]
    (rows / "c-T4-r1.parquet").write_bytes(b"torn")  # cut short: passed over until a sweep sets it aside
    assert sorted(invocation_rows(rows, "r1")) == sorted(got)


def test_compaction_keeps_what_the_store_reads_and_a_later_redo_still_wins(tmp_path):
    store = _run(tmp_path / "run")
    before = canonical(store.load())
    compact_run(store.dir)
    assert [f.name for f in store.row_files()] == [MERGED]
    assert canonical(store.load()).equals(before) and store.stored() == {"a": {4: "ok"}, "b": {4: "ok", 8: "oom"}}
    assert not [p for p in store.rows_dir.iterdir() if p.name.startswith(".")]  # nothing left aside
    store.write_rows("b", [_row("b", 8, "ok", "2026-01-05T00:00:00", "r3")])  # a resumed sweep beside it
    compact_run(store.dir)
    assert [f.name for f in store.row_files()] == [MERGED] and store.stored()["b"] == {4: "ok", 8: "ok"}
    assert not (store.dir / ".lock").read_text()  # released


@pytest.mark.multiprocess
def test_compaction_refuses_or_waits_for_a_run_a_sweep_holds(tmp_path, capsys):
    store = _run(tmp_path / "run")
    files = store.row_files()
    code = (
        "import sys, time; from moebench.results.lock import RunLock; "
        f"lock = RunLock.acquire({str(store.dir)!r}, command='a sweep'); print('held', flush=True); "
        "sys.stdin.readline(); lock.release(); print('released', flush=True); time.sleep(30)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld, match="a sweep"):
            compact_run(store.dir)
        assert store.row_files() == files  # untouched
        assert _script().main([str(tmp_path)]) == 2
        assert "a sweep" in capsys.readouterr().err
        said: list[str] = []
        p.stdin.write("\n")
        p.stdin.flush()
        compact_run(store.dir, wait=True, log=said.append)  # waits for the holder, then compacts
        assert p.stdout.readline().strip() == "released"
        assert [f.name for f in store.row_files()] == [MERGED]
    finally:
        p.kill()
        p.wait()
    with RunLock.acquire(store.dir):  # and the compaction let go of it
        pass


def test_the_script_compacts_each_run_under_a_folder(tmp_path, capsys):
    one, two = _run(tmp_path / "r" / "one"), _run(tmp_path / "two")
    expected = [canonical(s.load()) for s in (one, two)]
    assert _script().main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{one.dir}: " in out and f"{two.dir}: " in out and "KB ->" in out
    assert [canonical(s.load()).equals(e) for s, e in zip((one, two), expected, strict=True)] == [True, True]
    assert [f.name for f in one.row_files()] == [MERGED]
