"""Rows of token counts that never ran because an earlier count of their combination failed first
(torchrun's and SLURM's ranks write them: results/finished.py) hold no measurement: a plain resume
runs them, as it runs lost rows (issue #52 item 4); the failed count itself waits for --redo failed."""

from __future__ import annotations

from moebench.results.store import LOST, NOT_RUN, RunStore


def _row(t, status, reason):
    return {
        "combo_key": "k",
        "tokens_per_rank": t,
        "status": status,
        "timestamp": "2026-01-01T00:00:00",
        "reason": reason,
    }


def test_not_run_rows_count_as_to_run_on_a_plain_resume(tmp_path):
    store = RunStore(tmp_path)
    first = "tokens_per_rank=1000000 failed first (rank 0: OutOfMemoryError: ...)"
    rows = [
        _row(16, "ok", ""),
        _row(1000000, "oom", "rank 0: OutOfMemoryError: ..."),
        _row(64, "failed", f"{NOT_RUN}{first}"),
        _row(128, "failed", f"{LOST}{NOT_RUN}{first}"),
    ]
    store.write_rows("k", rows)
    assert store.todo_tokens("k", [16, 1000000, 64, 128], "none") == [64, 128]
    assert store.todo_tokens("k", [16, 1000000, 64, 128], "failed") == [1000000, 64, 128]
