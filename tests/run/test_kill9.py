"""20 `kill -9`s of a sweep's whole process group at random times, each followed by a re-run:
no (combination, tokens) stored twice, every file readable, a report that renders, and the
rows of an uninterrupted run."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from moebench import cli
from moebench.results.store import RunStore
from moebench.run.sweep import execute
from tests.run.test_sweep_cpu import children

pytestmark = pytest.mark.multiprocess

KILLS = 20
# each forward sleeps 10 ms (tests/fault_experts.py), so that the sweep spends seconds
# writing rows: kills land before, between and after its combinations
SWEEP = ["backend=local", "experts=fault", "experts.fault=sleep", "experts.fault_s=0.01",
         "reduction=experts,finalize", "overlap=none,dispatch,combine", "workload.seed=0,1",
         "quant=bf16", "model=tiny", "workload.tokens_per_rank=[4,8]", "runner.reps=3", "runner.warmup=0",
         "runner.phase_reps=1", "runner.memory=false"]


COMBOS = 12


def _stored(run) -> int:
    """Row files of the run (combinations stored)."""
    return len(list((run / "rows").glob("*-T*.parquet"))) if (run / "rows").is_dir() else 0


def _rows(run) -> set:
    df = RunStore(run).load()
    return set(zip(df.combo_key, df.tokens_per_rank.astype(int), df.status))


def test_twenty_kill9s_then_a_rerun_store_what_an_uninterrupted_run_does(tmp_path, capsys):
    env = dict(os.environ, TRITON_INTERPRET="0")
    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "moebench.cli", "sweep", *SWEEP, "--out", str(run)]
    rng = random.Random(18)
    t0, mid = time.monotonic(), 0
    for i in range(KILLS):
        before = _stored(run)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        if i % 4 == 0:  # while it starts, plans, takes the lock, writes its fingerprint
            time.sleep(rng.uniform(0.1, 3.0))
        else:  # once this run has stored a combination: while the next ones run and are written
            while p.poll() is None and _stored(run) <= before:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.6))
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it had finished
        p.wait()
        n = _stored(run)
        mid += 0 < n < COMBOS  # killed with some combinations stored and others not
    killing_s = time.monotonic() - t0
    final = subprocess.run(cmd, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert final.returncode == 0, final.stderr

    # every file readable, no temp file left, no pair stored twice
    for f in (run / "rows").iterdir():
        assert not f.name.startswith(".tmp-"), f
        pd.read_parquet(f)
    for f in [*run.glob("*.json"), *(run / "envs").glob("*.json")]:
        json.loads(f.read_text())
    stored = RunStore(run).load(all_rows=True)
    measured = stored[stored.status != "skipped"]
    assert not measured.duplicated(["combo_key", "tokens_per_rank"]).any(), "a row was stored twice"
    assert cli.main(["report", str(run)]) == 0, capsys.readouterr().err

    # the same rows as an uninterrupted run's
    clean, _ = execute(SWEEP, None, str(tmp_path / "clean"), quiet=True)
    assert _rows(run) == _rows(clean)
    assert mid >= 1, "no kill landed while the sweep was writing rows"
    assert len(_rows(clean)) == 2 * COMBOS and {s for *_, s in _rows(clean)} == {"ok"}
    assert children() == []
    print(f"{KILLS} kills in {killing_s:.0f} s, {mid} of them with a sweep part-stored; {len(measured)} rows")
