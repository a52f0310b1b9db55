"""Where a sweep's time goes (issue #33): each row's `harness_*_s` columns (run/worker.py's
Stopwatch) and the line a sweep prints (run/harness_time.py)."""

from __future__ import annotations

import math
import os
import time

import pytest
import torch

from moebench.results import row as schema
from moebench.run import plan, worker
from moebench.run.harness_time import STAGES, HarnessTally
from moebench.run.messages import Task


def test_stopwatch_adds_each_stage_and_the_total_holds_setup_and_start():
    clock = worker.Stopwatch(torch.device("cpu"))
    time.sleep(0.02)
    assert clock.lap("check") >= 0.02
    time.sleep(0.01)
    clock.lap("timing")
    clock.lap("check")  # a stage met twice adds up
    res = clock.stamp(worker.RankResult(rank=0, harness_setup_s=1.0, harness_start_s=float("nan")))
    assert res.harness_check_s >= 0.02 and res.harness_timing_s >= 0.01
    assert res.harness_total_s == pytest.approx(1.0 + res.harness_check_s + res.harness_timing_s)
    assert math.isnan(res.harness_start_s)  # unknown stays unknown; the total leaves it out


def test_process_age_is_this_process_lifetime():
    age = worker.process_age_s()
    if not os.path.exists("/proc/self/stat"):
        assert math.isnan(age)
        return
    assert 0 < age < time.clock_gettime(time.CLOCK_BOOTTIME)  # below the host's uptime (suspend included)
    time.sleep(0.05)
    assert worker.process_age_s() >= age + 0.04


def test_each_row_of_a_combination_says_where_its_time_went(tmp_path):
    combos, _ = plan.plan(
        [
            "backend=local",
            "experts=torch",
            "model=tiny",
            "reduction=experts",
            "overlap=none",
            "runner.device=cpu",
            "runner.reps=3",
            "runner.warmup=1",
            "workload.tokens_per_rank=[4,8]",
        ]
    )
    (c,) = combos
    out = [
        r
        for _, r in worker.run_combination(
            Task(0, c.combo, (4, 8)), 0, 1, None, torch.device("cpu"), str(tmp_path), start_s=2.5
        )
        if r is not None
    ]
    first, second = out
    assert first.status == second.status == "ok"
    # setup and start once per combination: on its first row, 0 on the others
    assert first.harness_setup_s > 0 and second.harness_setup_s == 0.0
    assert first.harness_start_s == 2.5 and second.harness_start_s == 0.0
    for r in out:
        stages = [getattr(r, col) for col, _ in STAGES]
        assert all(v >= 0 for v in stages), stages
        assert r.harness_check_s > 0 and r.harness_timing_s > 0  # runner.check and the samples ran
        assert r.harness_phases_s > 0 and r.harness_probe_s >= 0  # the phase forwards; no probe on the CPU
        assert r.harness_total_s == pytest.approx(sum(stages))
    # the timed samples happen inside the timing stage
    assert sum(second.samples_us) * 1e-6 <= second.harness_timing_s


def test_the_columns_are_the_rank_result_fields():
    from moebench.results.rank_result import RankResult

    cols = schema.names(group="harness")
    assert cols == [col for col, _ in STAGES] + ["harness_total_s"]
    assert all(hasattr(RankResult(rank=0), c) for c in cols)


def _row(total, samples_us=(), **stages):
    r = {col: 0.0 for col, _ in STAGES}
    r.update(stages, harness_total_s=total, samples_us=list(samples_us))
    return r


def test_the_sweep_line_sums_the_rows_and_names_the_share_of_timed_samples(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    tally = HarnessTally()
    assert tally.line() == ""  # nothing measured: no line
    import numpy as np

    tally.add(
        [
            _row(6.0, [500_000.0, 500_000.0], harness_start_s=2.0, harness_setup_s=1.0, harness_timing_s=3.0),
            # rows read back from a SLURM job's files hold their samples as NumPy arrays
            {**_row(3.0, harness_check_s=1.0, harness_timing_s=2.0), "samples_us": np.array([250_000.0, 750_000.0])},
            {"status": "skipped", "harness_total_s": float("nan")},
        ]
    )  # a skipped row: not counted
    now[0] += 10.0
    line = tally.line()
    assert "10.0 s wall for 2 measured rows" in line
    assert "rank starts 2.0 s, setup 1.0 s, checks 1.0 s, timing 5.0 s" in line and "memory" not in line
    assert "timed samples themselves 2.00 s (20 % of the wall)" in line and "the rest 1.0 s" in line


def test_jobs_side_by_side_say_so_rather_than_a_negative_rest(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    tally = HarnessTally()
    tally.add([_row(8.0, harness_timing_s=8.0), _row(8.0, harness_timing_s=8.0)])
    now[0] = 9.0
    assert "jobs ran side by side" in tally.line()
