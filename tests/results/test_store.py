"""The store's guarantees and the run lock (docs/design.md, "The store"): torn files are
ignored and cleaned, a skip never hides a measurement, nothing is deleted, one fingerprint
per invocation; one sweep per run folder (a second refuses, or waits with --wait)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from moebench import cli
from moebench.results.lock import LOCK_FILE, LockHeld, RunLock
from moebench.results.store import RunStore, enclosing_run
from tests.run.test_sweep_cpu import children

QUICK = ["runner.reps=3", "runner.warmup=0", "runner.phase_reps=1", "runner.memory=false"]
LOCAL = ["backend=local", "experts=torch", "reduction=experts", "overlap=none", "quant=bf16", "model=tiny", *QUICK]


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def _row(key, t, status, ts, **kw):
    return {"combo_key": key, "tokens_per_rank": t, "status": status, "timestamp": ts, "reason": "", **kw}


def test_a_skip_never_hides_a_measurement_and_nothing_is_deleted(tmp_path):
    store = RunStore(tmp_path)
    store.write_rows("a", [_row("a", 4, "failed", "2026-01-01T00:00:00", run_id="r1")])
    store.write_rows("a", [_row("a", 4, "ok", "2026-01-01T00:00:00", run_id="r2")])  # same second: file order
    store.write_skipped(
        [_row("a", 4, "skipped", "2026-01-03T00:00:00"), _row("b", 4, "skipped", "2026-01-03T00:00:00")]
    )
    store.write_skipped([_row("c", 8, "skipped", "2026-01-04T00:00:00")])  # a narrower sweep's skips
    df = RunStore(tmp_path).load().set_index("combo_key")
    assert df.loc["a", "status"] == "ok"  # the later redo, and no newer skip over it
    assert sorted(df.index) == ["a", "b", "c"]  # the first sweep's skip of b is still there
    assert len(store.load(all_rows=True)) == 4  # both measurements of a kept on disk
    assert store.stored() == {"a": {4: "ok"}}
    # --redo failed re-checks incorrect rows too
    store.write_rows("d", [_row("d", 4, "incorrect", "2026-01-01T00:00:00")])
    assert store.todo_tokens("d", [4], "failed") == [4] and store.todo_tokens("d", [4], "none") == []


@pytest.mark.multiprocess
def test_a_path_climbs_to_the_run_it_lies_in_as_deep_as_the_tool_writes_and_no_further(tmp_path, monkeypatch):
    """enclosing_run: a profiler trace (<run>/traces/profiler/<combo_key>/, the deepest file the tool
    writes below its run) and an nsys capture find their run; a path outside any run, or deeper below
    one than the tool writes, finds none."""
    run = tmp_path / "run"
    (run / "rows").mkdir(parents=True)
    deepest = run / "traces" / "profiler" / "k" / "rank0_T16.json.gz"
    capture = run / "traces" / "nsys" / "ranks_7.1.qdstrm"
    for f in (deepest, capture):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"")
    assert (
        enclosing_run(deepest) == enclosing_run(capture) == enclosing_run(deepest.parent) == enclosing_run(run) == run
    )
    monkeypatch.chdir(run / "traces")
    assert enclosing_run("nsys/ranks_7.1.qdstrm") == run  # a relative path climbs from where it is
    outside = tmp_path / "elsewhere" / "rank0_T16.json.gz"
    outside.parent.mkdir()
    assert enclosing_run(outside) is None and enclosing_run(deepest / "a" / "b") is None


def test_torn_temp_files_are_invisible_and_cleaned_at_start(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["sweep", *LOCAL, "workload.tokens_per_rank=[4]", "--out", str(run)]) == 0
    (run / "rows" / ".tmp-abc.parquet.tmp").write_bytes(b"PAR1 torn")  # as a killed writer leaves it
    assert len(RunStore(run).load()) == 1
    assert cli.main(["report", str(run)]) == 0, capsys.readouterr().err
    # an earlier moebench's temp files ended in .parquet: the next sweep removes them first
    (run / "rows" / ".tmp-old.parquet").write_bytes(b"PAR1 torn, written by an earlier moebench")
    assert len(RunStore(run).load()) == 1
    assert cli.main(["sweep", *LOCAL, "workload.tokens_per_rank=[4]", "--out", str(run)]) == 0
    assert not list((run / "rows").glob(".tmp-*"))
    assert cli.main(["report", str(run)]) == 0, capsys.readouterr().err


@pytest.mark.multiprocess
def test_each_invocation_keeps_its_fingerprint(tmp_path):
    run = tmp_path / "run"
    assert cli.main(["sweep", *LOCAL, "workload.tokens_per_rank=[4]", "--out", str(run)]) == 0
    first = json.loads((run / "env.json").read_text())
    assert cli.main(["sweep", *LOCAL, "workload.tokens_per_rank=[4,8]", "--out", str(run)]) == 0
    envs = sorted((run / "envs").glob("*.json"))
    assert len(envs) == 2 and json.loads((run / "env.json").read_text()) == first  # not rewritten
    df = RunStore(run).load()
    assert set(df.run_id) == {p.stem for p in envs}  # each row names the fingerprint it ran under
    for r in df.itertuples():
        assert RunStore(run).env_of(r.run_id)["env_id"] == r.env_id


def test_rows_of_another_schema_version_refuse_the_sweep_before_any_work(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "rows").mkdir(parents=True)
    pd.DataFrame([dict(_row("k", 4, "ok", "2026-01-01T00:00:00"), schema_version=999)]).to_parquet(
        run / "rows" / "k-T4.parquet"
    )
    before = sorted(p.name for p in run.rglob("*"))
    assert cli.main(["sweep", *LOCAL, "workload.tokens_per_rank=[4]", "--out", str(run)]) == 2
    assert "schema_version 999" in capsys.readouterr().err
    assert sorted(p.name for p in run.rglob("*")) == sorted(before + [LOCK_FILE])  # no env, no rows
    assert children() == []


@pytest.mark.multiprocess
def test_lock_tokens_and_a_dead_holder(tmp_path):
    run = tmp_path / "run"
    with RunLock.acquire(run, command="first") as held:
        with pytest.raises(LockHeld, match=r"pid \d+ on .* `first`.*--wait"):
            RunLock.acquire(run)
        with pytest.raises(LockHeld, match="no longer holds"):
            RunLock.acquire(run, token="not-the-holders")
        child = RunLock.acquire(run, token=held.token)  # a job of the holder's sweep
        child.check()
    with pytest.raises(LockHeld, match="no longer holds"):
        child.check()  # the holder is gone: its jobs write nothing more
    # a holder killed with -9: the kernel dropped its flock; its details are reported, replaced
    code = (
        "import sys, time; from moebench.results.lock import RunLock; "
        f"RunLock.acquire({str(run)!r}, command='doomed'); print('held', flush=True); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    p.kill()
    p.wait()
    said = []
    with RunLock.acquire(run, log=said.append):
        pass
    assert said and "ended without releasing it" in said[0] and "doomed" in said[0]


@pytest.mark.multiprocess
def test_a_second_sweep_into_one_folder_refuses_or_waits_and_no_row_is_stored_twice(tmp_path, capsys):
    run = tmp_path / "run"
    args = [
        "sweep",
        "backend=local",
        "experts=fault",
        "experts.fault=sleep,none",
        "experts.fault_s=0.75",
        "reduction=experts",
        "overlap=none",
        "quant=bf16",
        "model=tiny",
        "workload.tokens_per_rank=[4,8]",
        *QUICK,
        "--out",
        str(run),
    ]
    env = dict(os.environ, TRITON_INTERPRET="0")
    first = subprocess.Popen([sys.executable, "-m", "moebench.cli", *args], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    while time.time() < deadline and not (run / LOCK_FILE).is_file() or not (run / LOCK_FILE).read_text():
        time.sleep(0.1)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"pid {first.pid}" in err and "--wait" in err, err
    waiter = subprocess.Popen(
        [sys.executable, "-m", "moebench.cli", *args, "--wait"], stderr=subprocess.PIPE, text=True, env=env
    )
    assert first.wait(timeout=240) == 0, first.stderr.read()
    out = waiter.communicate(timeout=240)[1]
    assert waiter.returncode == 0 and "waiting for" in out and "0 to run" in out, out
    df = RunStore(run).load(all_rows=True)
    assert len(df) == 4 and not df.duplicated(["combo_key", "tokens_per_rank"]).any()
    assert set(df.status) == {"ok"}


def _descendants(pid: int) -> list[int]:
    from moebench.run.launch import _descendants as desc

    return desc(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.multiprocess
def test_ranks_die_with_their_parent(tmp_path):
    """kill -9 of the sweep process alone (not its group): its ranks do not live on."""
    run = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "moebench.cli",
        "sweep",
        "backend=naive",
        "experts=fault",
        "experts.fault=sleep",
        "experts.fault_s=120",
        "reduction=experts",
        "overlap=none",
        "quant=bf16",
        "model=tiny",
        "workload.tokens_per_rank=[4]",
        *QUICK,
        "--out",
        str(run),
    ]
    p = subprocess.Popen(
        args, stderr=subprocess.DEVNULL, env=dict(os.environ, TRITON_INTERPRET="0"), start_new_session=True
    )
    try:
        deadline, ranks = time.time() + 120, []
        while time.time() < deadline and len(ranks) < 2:  # both ranks (and the resource tracker)
            ranks = [d for d in _descendants(p.pid) if b"spawn_main" in open(f"/proc/{d}/cmdline", "rb").read()]
            time.sleep(0.2)
        assert len(ranks) == 2
        before = _descendants(p.pid)
        time.sleep(2)  # in the sleep fault, past setup
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.time() + 10
        while time.time() < deadline and any(_alive(d) for d in before):
            time.sleep(0.1)
        assert not [d for d in before if _alive(d)], "processes outlived the sweep"
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.multiprocess
def test_the_watchdog_kills_a_rank_whose_parent_is_gone(tmp_path):
    """Without the kernel's death signal (a rank under nsys, whose parent is nsys; a rank of
    torchrun), the lifeline's watchdog thread ends the rank once its starter is gone."""
    pid_file = tmp_path / "grandchild"
    child = (
        "import subprocess, sys, os, time; "
        "g = subprocess.Popen([sys.executable, '-c', "
        "'import os, sys, time; from moebench.run.lifeline import die_with; "
        "die_with(int(sys.argv[1]), pdeathsig=False); time.sleep(60)', str(os.getpid())]); "
        f"open({str(pid_file)!r}, 'w').write(str(g.pid)); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", child])
    deadline = time.time() + 30
    while time.time() < deadline and not (pid_file.is_file() and pid_file.read_text()):
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    time.sleep(1.0)  # its watchdog is running
    assert _alive(grandchild)
    p.kill()
    p.wait()
    deadline = time.time() + 10
    while time.time() < deadline and _alive(grandchild):
        time.sleep(0.05)
    assert not _alive(grandchild)
