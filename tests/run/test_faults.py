"""Fault injection on CPU (tests/support/fault_experts.py, registered only by the tests): two gloo
ranks over backend=naive, one fault per combination, a clean combination after them in the
same sweep. Each fault gives its status and reason, the other rows are intact, no process is
left, and the combination after a fault runs clean in a fresh process group."""

from __future__ import annotations

import pytest

from moebench.results.store import RunStore
from moebench.run.sweep import execute
from tests.run.test_sweep_cpu import children

BASE = [
    "backend=naive",
    "experts=fault",
    "reduction=experts",
    "overlap=none",
    "quant=bf16",
    "model=tiny",
    "workload.tokens_per_rank=[4,8]",
    "experts.fault_rank=1",
    "runner.reps=3",
    "runner.warmup=0",
    "runner.phase_reps=1",
    "runner.memory=false",
]

pytestmark = pytest.mark.multiprocess


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def _by_fault(run_dir) -> dict:
    df = RunStore(run_dir).load()
    assert not df.duplicated(["combo_key", "tokens_per_rank"]).any()
    out = {}
    for fault, rows in df.groupby(df["overrides"].str.extract(r"experts.fault=(\w+)", expand=False)):
        out[fault] = {int(r.tokens_per_rank): (r.status, r.reason) for r in rows.itertuples()}
    return out


def _check_raise(rows):
    # a raise in a rank: failed, with the rank and its message; the combination's later token
    # count runs in a fresh group (and raises there too): each row says what happened to it
    for t in (4, 8):
        assert rows["raise"][t] == ("failed", "rank 1: RuntimeError: injected failure on rank 1")


def _check_kill(rows):
    # a rank that kills itself: failed, naming the dead rank and its signal before the
    # closed connection its peer then reports
    st, why = rows["kill"][4]
    assert st == "failed" and why.startswith("rank 1 died with exit code -9 (SIGKILL)"), why


def _check_oom(rows):
    # real memory exhaustion under RLIMIT_AS in rank 1: the CPU allocator's error is oom
    st, why = rows["oom"][4]
    assert st == "oom" and "can't allocate memory" in why and why.startswith("rank 1:"), why


def _check_desync(rows):
    # ranks disagreeing on a collective's shape: on gloo the mismatch aborts the rank that
    # receives too much (SIGABRT) -- failed; were it to hang instead, the timeout would say so
    st, why = rows["desync"][4]
    assert st in ("failed", "timeout"), why
    if st == "failed":
        assert "rank" in why and ("died" in why or "mismatch" in why or "size" in why), why
    print(f"desync gave {st}: {why[:120]}")


def _check_wrong(rows):
    # wrong numbers: incorrect at every token count, with the error and the tolerance
    for t in (4, 8):
        st, why = rows["wrong"][t]
        assert st == "incorrect" and why.startswith("rel_err") and "> 0.02 (bf16)" in why, why


CHECKS = {"raise": _check_raise, "kill": _check_kill, "oom": _check_oom, "desync": _check_desync, "wrong": _check_wrong}


# the default tier: a rank killed by a signal and real memory exhaustion (a raise, wrong numbers
# and a timeout: tests/run/test_sweep_cpu.py); the slow tier every crashing fault in one sweep
@pytest.mark.parametrize(
    "faults",
    [
        pytest.param(["kill", "oom", "none"], id="kill-oom"),
        pytest.param(["raise", "kill", "oom", "desync", "wrong", "none"], id="all", marks=pytest.mark.slow),
    ],
)
def test_crashing_faults_give_their_status_and_the_next_combination_runs_clean(faults, tmp_path):
    run_dir, counts = execute([*BASE, f"experts.fault={','.join(faults)}"], None, str(tmp_path / "crash"), quiet=True)
    rows = _by_fault(run_dir)
    assert set(rows) == set(faults) and all(set(r) == {4, 8} for r in rows.values()), rows
    for fault in faults[:-1]:
        CHECKS[fault](rows)
    # after all of it, a clean combination in a fresh group
    assert rows["none"] == {4: ("ok", ""), 8: ("ok", "")}
    # each token count of a faulty combination meets its fault (the later one in a fresh group)
    assert counts["ok"] == 2 and counts["oom"] == 2 and counts["incorrect"] == 2 * ("wrong" in faults)
    assert counts.exit_code() == 1
    assert children() == []


# one rank in a barrier its peer never reaches; one stuck: the group killed at runner.timeout_s
# (the default tier's timeout: a sleeping rank, tests/run/test_sweep_cpu.py)
@pytest.mark.slow
def test_hanging_faults_time_out_and_the_next_combination_runs_clean(tmp_path):
    faults = ["hang_collective", "stuck_rank", "none"]
    run_dir, counts = execute(
        [*BASE, f"experts.fault={','.join(faults)}", "runner.timeout_s=10"], None, str(tmp_path / "hang"), quiet=True
    )
    rows = _by_fault(run_dir)
    for fault in ("hang_collective", "stuck_rank"):  # one rank in a barrier its peer never reaches; one stuck
        for t in (4, 8):  # the later count timed out on its own, in a fresh group
            st, why = rows[fault][t]
            assert st == "timeout" and why == "no result within 10 s: the process group was killed", (fault, why)
    assert rows["none"] == {4: ("ok", ""), 8: ("ok", "")}
    assert counts.exit_code() == 1
    assert children() == []


def test_an_out_of_memory_token_count_does_not_condemn_the_later_ones(tmp_path):
    """Issue #52 item 4: T=16 runs out of memory (a real allocation failure under RLIMIT_AS in
    rank 1); T=8 after it is measured in a fresh process group, and a re-run has nothing left."""
    ovs = [*BASE, "experts.fault=oom", "experts.fault_rows=24", "workload.tokens_per_rank=[4,16,8]"]
    run_dir, counts = execute(ovs, None, str(tmp_path / "oom"), quiet=True)
    (rows,) = _by_fault(run_dir).values()
    assert rows[4] == ("ok", "") and rows[8] == ("ok", ""), rows
    st, why = rows[16]
    assert st == "oom" and why.startswith("rank 1:") and "can't allocate memory" in why, rows
    assert counts["ok"] == 2 and counts["oom"] == 1 and counts.exit_code() == 1
    _, again = execute(ovs, None, str(tmp_path / "oom"), quiet=True)
    assert sum(again.values()) == 0  # every count stored, none waits behind the failed one
    assert children() == []
