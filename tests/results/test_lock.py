"""A run folder's lock and writes never follow a link (issue #31, items 1 and 9): a `.lock`
that is a symbolic link, a directory, a FIFO or a hard link is refused with one line and
exit 2 by `sweep`, `run` and `moebench.dist_worker`, its target untouched; so are a
symlinked rows/, envs/, env.json or row file. The lock's token is honoured only in
processes its holder started (descendants, or SLURM jobs it listed): a top-level sweep with
MOEBENCH_LOCK_TOKEN set is refused like any second sweep and touches nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pandas as pd
import pytest
from one_combination import ONE_TINY

from moebench import cli
from moebench.results.lock import JOBS_FILE, LOCK_FILE, TOKEN_ENV, LockHeld, RunLock, UnsafePath
from moebench.results.store import RunStore
from moebench.run import dist_worker
from tests.run.test_sweep_cpu import children

LOCAL = [*ONE_TINY, "runner.memory=false"]


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def _one_line_exit_2(capsys, code: int, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert all(w in err for w in words), err
    return err


def _dist_worker(run, monkeypatch) -> int:
    """moebench.dist_worker as torchrun would start a group of one (backend=local)."""
    for k, v in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29599",
    }.items():
        monkeypatch.setenv(k, v)
    return dist_worker.main([*LOCAL, "--out", str(run)])


@pytest.mark.parametrize("entry", ["sweep", "run", "dist_worker"])
def test_a_symlinked_lock_is_refused_and_its_target_untouched(entry, tmp_path, capsys, monkeypatch):
    run, victim = tmp_path / "r", tmp_path / "victim"
    run.mkdir()
    victim.write_text("keep\n")
    (run / LOCK_FILE).symlink_to(victim)
    if entry == "dist_worker":
        code = _dist_worker(run, monkeypatch)
    else:
        code = cli.main([entry, *LOCAL, "--out", str(run)])
    _one_line_exit_2(capsys, code, str(run / LOCK_FILE), "symbolic link", "--out")
    assert victim.read_text() == "keep\n"
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]  # nothing written
    assert children() == []


def test_a_lock_that_is_a_directory_a_fifo_or_a_hard_link_is_refused(tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / LOCK_FILE).mkdir()
    _one_line_exit_2(capsys, cli.main(["sweep", *LOCAL, "--out", str(run)]), "is a directory", "rm -r")
    (run / LOCK_FILE).rmdir()
    os.mkfifo(run / LOCK_FILE)
    _one_line_exit_2(capsys, cli.main(["sweep", *LOCAL, "--out", str(run)]), "not a regular file")
    (run / LOCK_FILE).unlink()
    other = tmp_path / "other"
    other.write_text("keep\n")
    os.link(other, run / LOCK_FILE)
    _one_line_exit_2(capsys, cli.main(["sweep", *LOCAL, "--out", str(run)]), "2 hard links")
    assert other.read_text() == "keep\n"
    # a lock created afresh is O_EXCL's own file, and a later sweep opens it again
    (run / LOCK_FILE).unlink()
    with RunLock.acquire(run, command="first"):
        assert os.stat(run / LOCK_FILE).st_nlink == 1


@pytest.mark.parametrize("link", ["rows", "envs", "env.json"])
def test_a_symlinked_folder_or_env_json_refuses_the_sweep_before_any_work(link, tmp_path, capsys):
    run, elsewhere = tmp_path / "r", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    target = elsewhere / "env.json" if link == "env.json" else elsewhere
    if link == "env.json":
        target.write_text("{}")
    (run / link).symlink_to(target)
    _one_line_exit_2(capsys, cli.main(["sweep", *LOCAL, "--out", str(run)]), str(run / link), "symbolic link")
    assert [p.name for p in elsewhere.iterdir()] == (["env.json"] if link == "env.json" else [])
    assert target.read_text() == "{}" if link == "env.json" else True
    assert not list(run.glob("sweep-*.json")) and children() == []


def test_the_store_never_writes_through_a_symlinked_row_file(tmp_path):
    store, victim = RunStore(tmp_path / "r"), tmp_path / "victim"
    victim.write_text("keep")
    store.rows_dir.mkdir(parents=True)
    (store.rows_dir / "k-T4-r1.parquet").symlink_to(victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        store.write_rows("k", [{"combo_key": "k", "tokens_per_rank": 4, "status": "ok", "run_id": "r1"}])
    assert victim.read_text() == "keep" and not list(store.rows_dir.glob(".tmp-*"))


HOLDER = """
import os, subprocess, sys, time
from moebench.results.lock import RunLock
lock = RunLock.acquire(sys.argv[1], command="holder")
lock.add_job("4242")
open(os.path.join(sys.argv[1], "rows", ".tmp-inflight.parquet.tmp"), "w").write("half written")
child = ("import sys; from moebench.results.lock import RunLock; "
         "l = RunLock.acquire(sys.argv[1]); print('borrowed' if l.fd is None else 'locked', flush=True)")
out = subprocess.run([sys.executable, "-c", child, sys.argv[1]], env=dict(os.environ, **lock.env),
                     capture_output=True, text=True).stdout.strip()
print(lock.token, out, flush=True)
time.sleep(120)
"""


def _borrow(run, token, **env) -> str:
    code = (
        "import sys; from moebench.results import lock; from moebench.results.lock import RunLock, LockHeld\n"
        "lock.JOB_WAIT_S = 1.0  # a job's rank 0 waits this long for its id to be listed\n"
        "try:\n    RunLock.acquire(sys.argv[1], token=sys.argv[2]); print('borrowed')\n"
        "except LockHeld as e:\n    print('refused:', e)"
    )
    full = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID")}
    p = subprocess.run(
        [sys.executable, "-c", code, str(run), token],
        env=dict(full, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return p.stdout.strip() + p.stderr.strip()


@pytest.mark.multiprocess
def test_the_lock_token_is_honoured_only_where_its_holder_started_the_process(tmp_path, capsys, monkeypatch):
    run = tmp_path / "r"
    (run / "rows").mkdir(parents=True)
    pd.DataFrame([{"combo_key": "x", "tokens_per_rank": 4, "status": "skipped", "reason": "theirs"}]).to_parquet(
        run / "rows" / "skipped.parquet"
    )
    skipped_before = (run / "rows" / "skipped.parquet").read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        token, child = holder.stdout.readline().split()
        assert child == "borrowed"  # a process the holder started, with the variable: works under its lock
        # a top-level sweep with the holder's token in its environment: refused like any second sweep
        monkeypatch.setenv(TOKEN_ENV, token)
        code = cli.main(["sweep", *LOCAL, "--out", str(run)])
        err = capsys.readouterr().err
        assert code == 2 and "is being written by another sweep" in err and "holder" in err, err
        assert f"{TOKEN_ENV} ignored" in err
        assert (run / "rows" / ".tmp-inflight.parquet.tmp").read_text() == "half written"  # not cleaned
        assert (run / "rows" / "skipped.parquet").read_bytes() == skipped_before  # not rewritten
        assert not list(run.glob("sweep-*.json")) and not (run / "envs").exists()
        monkeypatch.delenv(TOKEN_ENV)
        # the token as an argument: a process outside the holder's tree only in a job it listed
        assert _borrow(run, token, SLURM_JOB_ID="4242") == "borrowed"
        assert _borrow(run, token, SUBMITIT_LOCAL_JOB_ID="4242") == "borrowed"
        assert "refused" in _borrow(run, token, SLURM_JOB_ID="999")  # listed jobs only
        assert "refused" in _borrow(run, token) and "started" in _borrow(run, token)
        assert "refused" in _borrow(run, "not-the-token", SLURM_JOB_ID="4242")
        # a borrower on the holder's host stops writing once the holder is dead, kill -9 included
        borrowed = RunLock(run, token, None)
        borrowed.check()
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with pytest.raises(LockHeld, match="no longer holds"):
            borrowed.check()
    finally:
        holder.kill()
        holder.wait()
    assert (run / JOBS_FILE).is_file()


HOLDS = """
import sys, time
from moebench.results.lock import RunLock
RunLock.acquire(sys.argv[1], command="moebench sweep --out r")
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.multiprocess
def test_a_report_of_a_run_a_sweep_is_writing_names_the_sweep(tmp_path, capsys):
    """A report of a run another process's sweep holds says so, read without taking the lock: with
    no row stored yet, exit 2 naming the holder and to wait (not "run a sweep first"); with rows,
    the report of those, and a line saying they are the rows stored so far (on stderr and at the top of
    report.md). A holder killed with -9 leaves its details in the lock file, but is no writer."""
    from moebench.results.synthetic import make_rows, write_run

    run, rep = tmp_path / "r", tmp_path / "rep"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDS, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code = cli.main(["report", str(run), "--out", str(rep)])
        err = _one_line_exit_2(
            capsys,
            code,
            f"no results in {run} yet: `moebench sweep --out r` (pid {holder.pid} on ",
            "is writing it and has stored no row so far",
        )
        assert "wait, then report again" in err and "run a sweep first" not in err and not rep.exists()
        write_run(run, make_rows())
        assert cli.main(["report", str(run), "--out", str(rep)]) == 0
        err = capsys.readouterr().err
        assert f"{run} is still being written by `moebench sweep --out r` (pid {holder.pid} on " in err, err
        assert f"read the {len(make_rows())} rows it had stored; report again once it finishes" in err
        # and so does report.md, for whoever reads it later (a committed report)
        said = f"being written by `moebench sweep --out r` (pid {holder.pid} on "
        assert said in (rep / "report.md").read_text()
        holder.kill()
        holder.wait()
        assert '"pid"' in (run / LOCK_FILE).read_text()  # the dead holder's details stay
        assert cli.main(["report", str(run), "--out", str(rep)]) == 0
        assert "being written" not in capsys.readouterr().err
        assert "being written" not in (rep / "report.md").read_text()
    finally:
        holder.kill()
        holder.wait()


def test_the_holder_is_read_without_taking_the_lock_or_following_a_link(tmp_path):
    from moebench.results.lock import holder_now

    run = tmp_path / "r"
    with RunLock.acquire(run, command="mine") as lock:
        assert holder_now(run)["token"] == lock.token
        assert lock.fd is not None  # still held: reading it took nothing
    assert holder_now(run) == {}  # released: the file emptied
    other = tmp_path / "other"
    with RunLock.acquire(other, command="theirs"):
        (run / LOCK_FILE).unlink()
        (run / LOCK_FILE).symlink_to(other / LOCK_FILE)
        assert holder_now(run) == {}
    assert holder_now(tmp_path / "none") == {}


def _lock_of_another_host(run) -> None:
    """The lock file a holder on another node leaves (a run copied mid-sweep, a node that died):
    its details, no flock held here."""
    import json

    run.mkdir(parents=True, exist_ok=True)
    (run / LOCK_FILE).write_text(
        json.dumps(
            {
                "pid": 4242,
                "start": "123",
                "host": "far-node-that-died",
                "token": "t",
                "command": "moebench trace --import x",
                "since": "2024-01-01T00:00:00+00:00",
            }
        )
    )


def test_a_holder_on_another_host_is_worded_as_unverified(tmp_path):
    """Its pid cannot be checked from here: holder_now returns it, and it is worded as what the lock
    names, from its own command, and what to do if that has ended."""
    from moebench.results.lock import elsewhere, holder_now, unverified

    run = tmp_path / "r"
    _lock_of_another_host(run)
    holder = holder_now(run)
    assert holder["host"] == "far-node-that-died" and elsewhere(holder)
    line = unverified(holder, run)
    assert "its lock names pid 4242 on far-node-that-died (since 2024-01-01T00:00:00+00:00, " in line
    assert "`moebench trace --import x`); if that has ended, the lock is stale: " in line
    assert str(run / LOCK_FILE) in line


def test_a_report_of_a_run_whose_lock_names_another_host_does_not_wait_for_it(tmp_path, capsys):
    """A stale lock from another host (a run copied mid-sweep, a node that died) said "still being
    written, wait" forever: with no rows it is the usual "no results" (exit 2, what the lock names
    said, never "wait"); with rows, the report of them (exit 0), a line saying what the lock names."""
    from moebench.results.synthetic import make_rows, write_run

    run, rep = tmp_path / "r", tmp_path / "rep"
    _lock_of_another_host(run)
    code = cli.main(["report", str(run), "--out", str(rep)])
    err = _one_line_exit_2(capsys, code, f"no results in {run}: expected", "run a sweep first", "lock is stale")
    assert "wait" not in err and "being written" not in err
    write_run(run, make_rows())
    assert cli.main(["report", str(run), "--out", str(rep)]) == 0
    err = capsys.readouterr().err
    assert f"read the {len(make_rows())} rows stored; its lock names pid 4242 on far-node-that-died" in err, err
    assert "being written" not in err and (rep / "report.md").is_file()


def test_a_report_of_a_sweep_stopped_before_its_first_row_says_rerunning_resumes(tmp_path, capsys):
    """A sweep SIGTERMed before it stored a row leaves sweep-*.json and env.json, no rows: `report`
    said "run a sweep first", as of an empty folder. It names the recorded command and that rerunning
    it resumes (exit 2)."""
    import json

    run, rep = tmp_path / "r", tmp_path / "rep"
    run.mkdir()
    (run / "env.json").write_text(json.dumps({"gpu": "cpu"}))
    record = {"cli_overrides": ["quant=bf16"], "run_id": "abc", "sweep": {"name": "routing", "overrides": {}}}
    (run / "sweep-abc.json").write_text(json.dumps(record))
    code = cli.main(["report", str(run), "--out", str(rep)])
    err = _one_line_exit_2(
        capsys,
        code,
        f"no results in {run} yet: `moebench sweep --sweep routing --out {run} quant=bf16` started here and stopped",
        "before it stored any row; the same command resumes it",
    )
    assert "run a sweep first" not in err
