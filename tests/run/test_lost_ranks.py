"""Lost ranks, signals and start-up (issue #31, items 4, 5, 6, 10, 11, 12): ranks watch their
starter from their first line, so killing torchrun's agent or a SLURM job during the ranks'
start-up leaves none behind; a process group that does not form within
runner.startup_timeout_s fails its combination with a row saying so and the sweep goes on;
SIGTERM stops a sweep now (exit 143, the combination in flight cancelled, SLURM jobs
cancelled, finished rows kept, a resume completes); a rank lost mid-combination under torchrun
is a `lost:` row that a plain resume runs again, the token counts measured before it kept; a
SLURM job that stored nothing is counted once; a peer's abort after a rank's own error is not
named as the cause."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from moebench import cli
from moebench.results.finished import rows_for
from moebench.results.lock import RunLock
from moebench.results.rank_result import Failure, Finished
from moebench.results.store import LOST, RunStore
from moebench.run.launch import _descendants, _died, _GroupState, free_port, peer_lost
from moebench.run.messages import Error
from moebench.run.plan import plan
from moebench.run.slurm import clip

QUICK = ["runner.reps=3", "runner.warmup=0", "runner.phase_reps=1", "runner.memory=false"]
NAIVE = ["backend=naive", "experts=fault", "reduction=experts", "overlap=none", "quant=bf16", "model=tiny", *QUICK]


def _env(**kw):
    return dict(os.environ, TRITON_INTERPRET="0", **kw)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    return bool(stat) and stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def _wait_gone(pids, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _poll(what, timeout_s: float = 120.0, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"not seen within {timeout_s:g} s")


def _tasks(root: int) -> list[int]:
    """submitit's tasks (and their controller) under `root`, the tasks by their rank order."""
    tasks = [d for d in _descendants(root) if b"submitit.core._submit" in _read(f"/proc/{d}/cmdline")]
    return sorted(tasks, key=lambda d: b"SUBMITIT_LOCAL_GLOBALID=1" in _read(f"/proc/{d}/environ"))


def _kill_all(pids) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def _sweep(run, *args, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "moebench.cli", "sweep", *args, "--out", str(run)],
        stderr=subprocess.PIPE,
        text=True,
        env=_env(**env),
        start_new_session=True,
    )


def _nodes(cmd, env, timeout_s: float = 240.0):
    """Both torchrun "nodes" run to their end: (processes, stderr texts). Their stderr is read
    as it comes (a node blocked on a full pipe would look like a hang); past `timeout_s` every
    process of theirs gets SIGABRT (PYTHONFAULTHANDLER prints each rank's stacks: where it
    waited) and then SIGKILL, and the test fails with what they printed."""
    import threading

    procs = [
        subprocess.Popen(cmd(n), stderr=subprocess.PIPE, text=True, env=env, start_new_session=True) for n in (0, 1)
    ]
    errs = [[], []]
    readers = [
        threading.Thread(target=lambda p=p, e=e: e.extend(p.stderr), daemon=True)
        for p, e in zip(procs, errs, strict=True)
    ]
    for r in readers:
        r.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    hung = [p for p in procs if p.poll() is None]
    if hung:
        tree = [d for p in procs for d in _descendants(p.pid)]
        for sig, pause in ((signal.SIGABRT, 3.0), (signal.SIGKILL, 0.0)):
            for pid in tree + [p.pid for p in procs]:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            time.sleep(pause)
    for p, r in zip(procs, readers, strict=True):
        p.wait()
        r.join(5.0)
    text = ["".join(e) for e in errs]
    assert not hung, f"torchrun nodes still running after {timeout_s:g} s; their stderr:\n" + "\n----\n".join(text)
    return procs, text


# slow tier: torchrun end to end; the default tier's cover of the lifeline's watchdog (no kernel
# death signal): tests/results/test_store.py::test_the_watchdog_kills_a_rank_whose_parent_is_gone
@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchrun_ranks_die_with_an_agent_killed_during_their_start_up(tmp_path):
    """The issue's reproduction: the agent killed while its ranks import torch."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    agent = subprocess.Popen(
        [
            torchrun,
            "--nnodes=1",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "-m",
            "moebench.dist_worker",
            "--out",
            str(tmp_path / "orph"),
            *NAIVE,
            "experts.fault=sleep",
            "experts.fault_s=60",
            "workload.tokens_per_rank=[4]",
        ],
        stderr=subprocess.DEVNULL,
        env=_env(),
        start_new_session=True,
    )
    ranks = []
    try:
        ranks = _poll(
            lambda: (
                [d for d in _descendants(agent.pid) if b"moebench.dist_worker" in _read(f"/proc/{d}/cmdline")][:2]
                if len(_descendants(agent.pid)) >= 2
                else None
            )
        )
        time.sleep(1.0)  # past their first line, inside torch's import (seconds)
        agent.kill()
        agent.wait()
        assert _wait_gone(ranks) == [], "torchrun's ranks outlived their agent"
    finally:
        _kill_all([agent.pid, *ranks])


# slow tier: SLURM end to end; the default tier's: the SLURM executor (tests/run/test_distributed.py),
# `lost:` rows and their resume (test_lost_rows_stay_lost_for_every_token_count_and_a_plain_resume_retries_them)
@pytest.mark.slow
@pytest.mark.multiprocess
def test_slurm_tasks_die_with_their_job_and_the_sweep_stores_one_lost_row(tmp_path):
    """submitit's local controller (the job) killed while its tasks start: they end, and the
    sweep writes one `lost:` row for the job that stored nothing, counted once."""
    run = tmp_path / "s"
    p = _sweep(
        run,
        "--slurm",
        "--slurm-cluster",
        "local",
        *NAIVE,
        "experts.fault=sleep",
        "experts.fault_s=60",
        "workload.tokens_per_rank=[4]",
    )
    tasks = []
    try:
        tasks = _poll(lambda: (lambda t: t if len(t) == 2 else None)(_tasks(p.pid)))
        controller = next(d for d in _descendants(p.pid) if b"submitit.local._local" in _read(f"/proc/{d}/cmdline"))
        time.sleep(0.3)
        os.kill(controller, signal.SIGKILL)
        assert _wait_gone(tasks) == [], "SLURM tasks outlived their job"
        err = p.communicate(timeout=120)[1]
        assert p.returncode == 1, err
        assert "failed=1 " in err, err  # one row, counted once
        df = RunStore(run).load()
        (reason,) = df.reason
        assert df.status.tolist() == ["failed"] and reason.startswith(f"{LOST}SLURM job "), reason
        assert "INTERRUPTED" in reason and "\n" not in reason and len(reason) < 800, reason
        assert RunStore(run).todo_tokens(df.combo_key[0], [4], "none") == [4]  # a plain resume retries it
    finally:
        _kill_all([p.pid, *tasks])


@pytest.mark.multiprocess
def test_a_rank_lost_before_the_group_forms_fails_its_combination_and_the_sweep_goes_on(tmp_path):
    """A SLURM task killed during start-up: its peer's group does not form within
    runner.startup_timeout_s, rank 0 writes the row saying so, the lock is freed."""
    run = tmp_path / "s"
    t0 = time.monotonic()
    p = _sweep(
        run,
        "--slurm",
        "--slurm-cluster",
        "local",
        *NAIVE,
        "experts.fault=none",
        "workload.tokens_per_rank=[4]",
        "runner.startup_timeout_s=5",
    )
    try:
        second = _poll(lambda: (lambda t: t[1] if len(t) == 2 else None)(_tasks(p.pid)))
        os.kill(second, signal.SIGKILL)
        err = p.communicate(timeout=120)[1]
        assert p.returncode == 1, err
        assert time.monotonic() - t0 < 100  # not gloo's 30-minute default
        df = RunStore(run).load()
        (reason,) = df.reason
        assert df.status.tolist() == ["failed"], reason
        assert reason.startswith(
            f"{LOST}the process group of 2 ranks did not form within 5 s (runner.startup_timeout_s)"
        ), reason
        with RunLock.acquire(run):  # freed
            pass
        assert not _descendants(p.pid)
    finally:
        _kill_all([p.pid])


def test_startup_timeout_is_a_typed_runner_key_outside_the_identity(capsys):
    (a,), _ = plan(["backend=local", "experts=torch", "model=tiny"], None)
    (b,), _ = plan(["backend=local", "experts=torch", "model=tiny", "runner.startup_timeout_s=7.5"], None)
    assert a.combo.startup_timeout_s == 30.0 and b.combo.startup_timeout_s == 7.5 and a.key == b.key
    assert cli.main(["list", "backend=local", "runner.startup_timeout_s=0"]) == 2
    assert "runner.startup_timeout_s=0" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_sigterm_stops_the_sweep_now_with_143_and_a_resume_completes(tmp_path):
    run = tmp_path / "t"
    args = [
        "backend=local",
        "experts=fault",
        "experts.fault=none,sleep",
        "experts.fault_s=60",
        "reduction=experts",
        "overlap=none",
        "quant=bf16",
        "model=tiny",
        "workload.tokens_per_rank=[4]",
        *QUICK,
    ]
    once = dict(MOEBENCH_FAULT_ONCE=str(tmp_path / "fired"))  # the sleep holds the first run only
    p = _sweep(run, *args, **once)
    ranks = []
    try:
        _poll(lambda: list((run / "rows").glob("*-T4-*.parquet")) if (run / "rows").is_dir() else None)
        ranks = _descendants(p.pid)
        p.send_signal(signal.SIGTERM)
        err = p.communicate(timeout=30)[1]
        assert p.returncode == 143, err
        assert "terminated (SIGTERM)" in err and "Re-run the same command to resume" in err, err
        assert _wait_gone(ranks, 2.0) == []
        df = RunStore(run).load()
        assert df.status.tolist() == ["ok"]  # the finished combination; none for the cancelled one
        again = subprocess.run(
            [sys.executable, "-m", "moebench.cli", "sweep", *args, "--out", str(run)],
            stderr=subprocess.PIPE,
            text=True,
            env=_env(**once),
            timeout=240,
        )
        assert again.returncode == 0 and "1 to run" in again.stderr, again.stderr
        assert RunStore(run).load().status.tolist() == ["ok", "ok"]
    finally:
        _kill_all([p.pid, *ranks])


# slow tier: SLURM end to end; the default tier's SIGTERM: the test above, without SLURM
@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigterm_cancels_a_sweeps_slurm_jobs(tmp_path):
    run = tmp_path / "s"
    p = _sweep(
        run,
        "--slurm",
        "--slurm-cluster",
        "local",
        *NAIVE,
        "experts.fault=sleep",
        "experts.fault_s=60",
        "workload.tokens_per_rank=[4]",
    )
    tasks = []
    try:
        tasks = _poll(lambda: (lambda t: t if len(t) == 2 else None)(_tasks(p.pid)))
        everything = _descendants(p.pid)
        p.send_signal(signal.SIGTERM)
        err = p.communicate(timeout=60)[1]
        assert p.returncode == 143 and "SLURM jobs too" in err, err
        assert _wait_gone(everything, 2.0) == [], "a cancelled job's processes lived on"
        assert len(RunStore(run).load()) == 0
    finally:
        _kill_all([p.pid, *tasks])


# slow tier: torchrun end to end; the default tier's: two torchrun nodes (tests/run/test_distributed.py),
# `lost:` rows, a peer's lost connection and their resume (the unit tests below)
@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_torchrun_rank_lost_mid_combination_is_a_lost_row_a_plain_resume_runs_again(tmp_path):
    """Two torchrun "nodes" of one rank each; node 1's rank dies at the second token count
    (once). Rank 0 keeps the first count's measured row and stores the second as lost; the
    same commands again run that one only."""
    run, port = tmp_path / "tr", free_port()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = lambda n: [
        torchrun,
        "--nnodes=2",
        "--nproc-per-node=1",
        f"--node-rank={n}",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        "-m",
        "moebench.dist_worker",
        "--out",
        str(run),
        *NAIVE,
        "experts.fault=kill",
        "experts.fault_rank=1",
        "experts.fault_rows=16",
        "workload.tokens_per_rank=[4,8]",
    ]
    env = _env(MOEBENCH_FAULT_ONCE=str(tmp_path / "fired"), PYTHONFAULTHANDLER="1")
    nodes, errs = _nodes(cmd, env)
    assert [p.returncode for p in nodes] == [1, 1], errs
    rows = {int(r.tokens_per_rank): (r.status, r.reason) for r in RunStore(run).load().itertuples()}
    assert rows[4] == ("ok", ""), rows  # measured before the loss: not "not run"
    st, why = rows[8]
    assert st == "failed" and why.startswith(f"{LOST}rank 0: ") and peer_lost(why), why  # gloo: closed or reset
    again, errs = _nodes(cmd, env)
    assert [p.returncode for p in again] == [0, 0] and "1 to run on 2 ranks" in errs[0], errs
    df = RunStore(run).load()
    assert sorted(zip(df.tokens_per_rank, df.status, strict=True)) == [(4, "ok"), (8, "ok")]


def test_lost_rows_stay_lost_for_every_token_count_and_a_plain_resume_retries_them(tmp_path):
    (c,), _ = plan(["backend=local", "experts=torch", "model=tiny", "workload.tokens_per_rank=[4,8]"], None)
    meta = {"run_id": "r1", "sweep": "s", "gpu": None, "git_sha": None, "env_id": "e", "timestamp": "t"}
    lost = rows_for(Finished(c, [4, 8], {}, Failure("failed", f"{LOST}rank 0: Connection closed by peer", 4)), meta)
    assert [r["reason"].startswith(LOST) for r in lost] == [True, True]
    assert lost[1]["reason"].startswith(f"{LOST}not run: tokens_per_rank=4 failed first (rank 0: "), lost[1]
    failed = rows_for(Finished(c, [4, 8], {}, Failure("failed", "rank 0: RuntimeError: a kernel bug", 4)), meta)
    store = RunStore(tmp_path)
    store.write_rows(c.key, failed)
    # the kernel's own failure waits for --redo failed; the count that never ran after it does not (NOT_RUN)
    assert store.todo_tokens(c.key, [4, 8], "none") == [8] and store.todo_tokens(c.key, [4, 8], "failed") == [4, 8]
    store.write_rows("other", [dict(r, combo_key="other") for r in lost])
    assert store.stored()["other"] == {4: "lost", 8: "lost"}
    assert store.todo_tokens("other", [4, 8], "none") == [4, 8]


def test_a_reason_is_cut_at_a_sentence_and_says_where_the_rest_is():
    text = "First sentence here. " * 10 + "A last sentence that would be cut in the middle of it."
    out = clip(text, 120, "/x/job_0_log.err")
    assert len(out) <= 120 and out.endswith("more chars in /x/job_0_log.err)"), out
    assert out.split(" … (")[0].endswith("here."), out
    n = int(out.split(" … (")[1].split()[0])
    assert len(out.split(" … (")[0]) + n == len(text.strip())
    assert clip("short.", 120, "f") == "short."


def _procs(*codes):
    return [SimpleNamespace(exitcode=c) for c in codes]


def test_a_peer_aborting_after_a_ranks_own_error_is_not_named_as_the_cause():
    """The flaky fault test's race (issue #31, item 11): rank 1 raises, and gloo then aborts
    rank 0 (SIGABRT) before the group is killed. The row names rank 1's error only, however
    the launcher's polls fall; a rank that dies first is still named before its peer's
    error about the closed connection."""
    work = [(object(), [4, 8])]
    procs = _procs(None, 0)
    st = _GroupState(work, 2)
    st.observe(procs)
    st.take(Error(0, 1, "failed", "RuntimeError: injected failure on rank 1", 4))
    procs[0].exitcode = -signal.SIGABRT  # gloo's EnforceNotMet on rank 0, after the error came
    assert _died(procs, st, wait_s=0.2) == ""
    # a rank killed first: its peer's error is about the closed connection, the death is named
    procs = _procs(None, None)
    st = _GroupState(work, 2)
    st.observe(procs)
    procs[1].exitcode = -signal.SIGKILL
    st.observe(procs)
    st.take(Error(0, 0, "failed", "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:1234", 4))
    assert _died(procs, st, wait_s=0.2) == "rank 1 died with exit code -9 (SIGKILL)"
    # both dead at one poll, no error: the kill first, gloo's abort (its consequence) after
    procs = _procs(-signal.SIGABRT, -signal.SIGKILL)
    st = _GroupState(work, 2)
    assert _died(procs, st, wait_s=0.2) == (
        "rank 1 died with exit code -9 (SIGKILL); rank 0 died with exit code -6 (SIGABRT)"
    )
