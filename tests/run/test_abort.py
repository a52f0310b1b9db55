"""A second Ctrl-C aborts a sweep now: one line on stderr, exit 130, the ranks and SLURM jobs of the
combination in flight gone (moebench/run/sweep.py Aborted, moebench/cli/main.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from moebench.run import slurm


class _Stderr:
    """A child's stderr read as it comes (a pipe left unread would block the child)."""

    def __init__(self, pipe):
        self.data, self._pipe = b"", pipe
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for chunk in iter(lambda: os.read(self._pipe.fileno(), 4096), b""):
            self.data += chunk

    def wait_for(self, text: bytes, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.data and time.monotonic() < deadline:
            time.sleep(0.05)
        assert text in self.data, self.data.decode(errors="replace")

    def join(self) -> str:
        self._thread.join(timeout=30)
        return self.data.decode(errors="replace")


def _group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.multiprocess
def test_a_second_ctrl_c_leaves_one_line_and_exits_130(tmp_path):
    fired = tmp_path / "fired"  # created by the rank as it enters its 120 s sleep (MOEBENCH_FAULT_ONCE)
    args = [
        sys.executable,
        "-m",
        "moebench.cli",
        "sweep",
        "backend=local",
        "experts=fault",
        "experts.fault=sleep",
        "experts.fault_s=120",
        "reduction=experts",
        "overlap=none",
        "quant=bf16",
        "model=tiny",
        "workload.tokens_per_rank=[4]",
        "runner.reps=3",
        "runner.warmup=1",
        "runner.phase_reps=2",
        "--out",
        str(tmp_path / "run"),
    ]
    env = dict(os.environ, TRITON_INTERPRET="0", MOEBENCH_FAULT_ONCE=str(fired))
    # a process group of its own, signalled whole as a terminal's Ctrl-C signals the foreground one
    p = subprocess.Popen(args, stderr=subprocess.PIPE, env=env, start_new_session=True)
    err = _Stderr(p.stderr)
    try:
        deadline = time.monotonic() + 120
        while not fired.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fired.exists(), err.data.decode(errors="replace")
        os.killpg(p.pid, signal.SIGINT)
        err.wait_for(b"Ctrl-C again to abort now", 30)
        before = len(err.data)
        os.killpg(p.pid, signal.SIGINT)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = err.join()
    after = [line for line in re.split(r"[\r\n]", err.data[before:].decode(errors="replace")) if line.strip()]
    assert rc == 130, text
    assert "Traceback" not in text
    assert len(after) == 1 and after[0].startswith("moebench sweep: aborted (Ctrl-C again)"), after
    assert "Re-run the same command to resume" in after[0]
    assert _group_gone(p.pid, 15), "a rank outlived the abort"


class _Job:
    def __init__(self, job_id: str):
        self.job_id, self.cancelled = job_id, False

    def done(self) -> bool:
        return False

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True


@pytest.mark.parametrize("where", ["polling", "between rows"])
def test_an_abort_cancels_the_slurm_jobs(tmp_path, monkeypatch, where):
    """Aborted raised while run_jobs polls, or in the sweep's loop between two rows (the generator
    closed): no job outlives the sweep's lock."""
    jobs = []
    monkeypatch.setattr(slurm, "_executor", lambda opts, run_dir: None)
    monkeypatch.setattr(slurm, "_submit", lambda *a: jobs.append(_Job(str(len(jobs)))) or jobs[-1])
    monkeypatch.setattr(slurm, "POLL_S", 0.01)
    rows = tmp_path / "rows"
    rows.mkdir()
    if where == "between rows":
        pd.DataFrame([{"label": "a", "combo_key": "ka"}]).to_parquet(rows / "ka-T4-r1.parquet")
    store = SimpleNamespace(dir=tmp_path, rows_dir=rows)
    lock = SimpleNamespace(token="t", add_job=lambda job_id: None)
    work = [(SimpleNamespace(family=f, key=f"k{f}"), [4]) for f in ("f1", "f2")]
    calls = []

    def should_stop():
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt  # the second Ctrl-C's Aborted, raised where the main thread is
        return False

    gen = slurm.run_jobs(work, store, {"run_id": "r1"}, lock, SimpleNamespace(), should_stop=should_stop)
    if where == "polling":
        with pytest.raises(KeyboardInterrupt):
            next(gen)
    else:
        assert next(gen)[0] == "a"
        assert not any(j.cancelled for j in jobs)
        gen.close()  # what the sweep's finally does when the abort comes in its loop
    assert len(jobs) == 2 and all(j.cancelled for j in jobs)
