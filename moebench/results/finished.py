"""What a sweep and a rank entry share (run/sweep.py, run/dist_worker.py): the work left to
do against what the store holds, and the rows of a finished combination written under the
run's lock."""

from __future__ import annotations

import datetime as dt
from typing import Optional

from moebench.config.spec import Combination
from moebench.results.lock import RunLock
from moebench.results.rank_result import Finished
from moebench.results.row import Status
from moebench.results.rows import measured_row, outcome_row
from moebench.results.store import LOST, NOT_RUN, RunStore


def run_meta(run_id: str, sweep: str, info: dict, env_id: str) -> dict:
    """The provenance columns every row of one invocation carries."""
    return {
        "run_id": run_id,
        "sweep": sweep,
        "gpu": info.get("gpu"),
        "git_sha": info.get("git_sha"),
        "env_id": env_id,
        "timestamp": now_iso(),
    }


def rows_for(fin: Finished, meta: dict) -> list[dict]:
    """Rows of one finished combination: measured, or failed/timeout/oom."""
    c, rows = fin.combo, []
    ws = c.combo.world_size
    failed_at = fin.failure.tokens if fin.failure else None
    for t in fin.tokens:
        ranks = fin.results.get(t, {})
        if len(ranks) == ws:
            rows.append(measured_row(c, t, [ranks[r] for r in sorted(ranks)], meta))
        elif fin.failure:
            st, why = fin.failure.status, fin.failure.reason
            if failed_at is not None and t != failed_at:
                # a lost group's rows stay lost (LOST: a plain resume runs them again)
                lost = LOST if why.startswith(LOST) else ""
                st, why = Status.FAILED, f"{lost}{NOT_RUN}tokens_per_rank={failed_at} failed first ({why[len(lost) :]})"
            rows.append(outcome_row(c, t, st, why, meta))
        else:
            rows.append(outcome_row(c, t, Status.FAILED, "no result from every rank", meta))
    return rows


def plan_work(combos: list[Combination], store: RunStore, redo: str, meta: dict):
    """(skipped rows, [(combination, token counts to run)], rows already stored) of a plan
    against what the store holds."""
    skipped: list[dict] = []
    work: list[tuple[Combination, list[int]]] = []
    stored = store.stored()
    already = 0
    for c in combos:
        for t, why in sorted(c.token_reasons.items()):
            skipped.append(outcome_row(c, t, Status.SKIPPED, why, meta))
        if c.reason:
            skipped.extend(outcome_row(c, t, Status.SKIPPED, c.reason, meta) for t in c.tokens)
            continue
        todo = store.todo_tokens(c.key, c.runnable_tokens, redo, stored)
        already += len(c.runnable_tokens) - len(todo)
        if todo:
            work.append((c, todo))
    return skipped, work, already


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_finished(store: RunStore, fin: Finished, meta: dict, lock: Optional[RunLock] = None) -> list[dict]:
    """The rows of one finished combination, written (under the run's lock) as it ends."""
    rows = rows_for(fin, dict(meta, timestamp=now_iso()))
    if lock is not None:
        lock.check()
    store.write_rows(fin.combo.key, rows)
    return rows
