"""`kill -9`s of a sweep's whole process group, each followed by a re-run: no (combination,
tokens) stored twice, every file readable, a report that renders, and the rows of an
uninterrupted run. The default tier kills once, while the sweep writes rows; the slow tier
(`-m slow`) kills 20 times at random times, some during start-up."""

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
from moebench.run.plan import plan
from tests.run.test_sweep_cpu import children

pytestmark = pytest.mark.multiprocess

# each forward sleeps 10 ms (tests/support/fault_experts.py), so that the sweep spends seconds
# writing rows: kills land before, between and after its combinations
SWEEP = [
    "backend=local",
    "experts=fault",
    "experts.fault=sleep",
    "experts.fault_s=0.01",
    "reduction=experts,finalize",
    "overlap=none,dispatch,combine",
    "workload.seed=0,1",
    "quant=bf16",
    "model=tiny",
    "workload.tokens_per_rank=[4,8]",
    "runner.reps=3",
    "runner.warmup=0",
    "runner.phase_reps=1",
    "runner.memory=false",
]


COMBOS = 12


def _stored(run) -> int:
    """Row files of the run (combinations stored)."""
    return len(list((run / "rows").glob("*-T*.parquet"))) if (run / "rows").is_dir() else 0


def _rows(run) -> set:
    df = RunStore(run).load()
    return set(zip(df.combo_key, df.tokens_per_rank.astype(int), df.status, strict=True))


@pytest.mark.parametrize("kills", [1, pytest.param(20, marks=pytest.mark.slow)])
def test_kill9s_then_a_rerun_store_what_an_uninterrupted_run_does(kills, tmp_path, capsys):
    env = dict(os.environ, TRITON_INTERPRET="0")
    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "moebench.cli", "sweep", *SWEEP, "--out", str(run)]
    rng = random.Random(18)
    t0, mid = time.monotonic(), 0
    for i in range(kills):
        before = _stored(run)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        if i % 4 == 0 and kills > 1:  # while it starts, plans, takes the lock, writes its fingerprint
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

    # the rows of an uninterrupted run: every planned (combination, tokens) once, ok (planned, not
    # run again: a clean run of this sweep is a minute of a 2-core machine)
    combos, _ = plan(SWEEP, None)
    assert len(combos) == COMBOS
    assert _rows(run) == {(c.key, t, "ok") for c in combos for t in (4, 8)}
    assert mid >= 1, "no kill landed while the sweep was writing rows"
    assert children() == []
    print(f"{kills} kills in {killing_s:.0f} s, {mid} of them with a sweep part-stored; {len(measured)} rows")
