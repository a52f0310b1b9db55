"""Faults between the ranks of a group someone else started (run/dist_worker.py): a rank
blocked in a collective cannot take part in another, so errors and the abort travel through
the process group's key-value store (`Channel`); rank 0's `LeadRows` writes the combination in
flight, from its loop or its watchdog thread, with run/outcome.py deciding a failure's row.
Imports the standard library only at load (a torchrun rank imports it before torch)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Callable, NoReturn, Optional

ABORT_WAIT_S = 60.0  # a failed non-zero rank waits this long for rank 0 to write the row
POLL_S = 0.5


class Channel:
    """Errors and the abort between ranks, through the process group's store."""

    def __init__(self, prefix: str):
        import torch.distributed as dist

        self.store = dist.distributed_c10d._get_default_store() if dist.is_initialized() else None
        self.prefix = prefix

    def post_error(self, idx: int, status, reason: str, tokens) -> None:
        """A non-zero rank's error for rank 0 (JSON: the status as its word)."""
        if self.store is not None:
            self.store.set(f"{self.prefix}/error/{idx}", json.dumps([status, reason, tokens]))

    def error(self, idx: int) -> Optional[tuple]:
        key = f"{self.prefix}/error/{idx}"
        if self.store is None or not self.store.check([key]):
            return None
        from moebench.results.row import Status

        status, reason, tokens = json.loads(self.store.get(key))
        return Status(status), reason, tokens

    def abort(self) -> None:
        if self.store is not None:
            self.store.set(f"{self.prefix}/abort", "1")

    def aborted(self) -> bool:
        return self.store is not None and self.store.check([f"{self.prefix}/abort"])


def abort_group(chan: Channel) -> NoReturn:
    """Rank 0, its rows written: every rank exits 1. Rank 0 last, once its peers (which poll
    every POLL_S) are gone, so that torchrun's agents see the group fail together."""
    chan.abort()
    time.sleep(3 * POLL_S)
    exit_now(1)


def exit_now(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class LeadRows:
    """Rank 0's side of the group: the combination in flight, shared by the loop that runs it
    and the watchdog thread; whichever ends it writes its rows, holding `lock`."""

    def __init__(self, work: list, store, meta: dict, lock, chan: Channel, log: Callable[[str], None]):
        self.work, self.store, self.meta, self.run_lock, self.chan, self.log = work, store, meta, lock, chan, log
        self.lock = threading.Lock()
        self.idx: Optional[int] = None
        self.deadline = float("inf")
        self.results: dict = {}  # tokens -> {rank: RankResult}, as gathered so far
        self.mine: dict = {}  # tokens -> rank 0's own RankResult, as they come
        self.written: list[dict] = []

    def begin(self, idx: int) -> None:
        with self.lock:
            self.idx, self.results, self.mine = idx, {}, {}
            self.deadline = time.monotonic() + self.work[idx][0].combo.timeout_s

    def gathered(self, tokens: int, results: list) -> None:
        with self.lock:
            self.results[tokens] = dict(enumerate(results))

    def end(self) -> None:
        """The combination ran on every rank: its rows."""
        with self.lock:
            self._write(None)
            self.idx = None

    def fail(self, error) -> NoReturn:
        """Holding `lock`: the combination's rows for what went wrong (`error`, a rank's Failure;
        None: its deadline passed), run/outcome.py deciding; then every rank exits 1."""
        from moebench.run.outcome import Observed, decide

        assert self.idx is not None
        self._write(
            decide(
                Observed(
                    error=error,
                    tokens=self._in_flight(),
                    group_end="ended",
                    sees_exits=False,
                    timeout_s=self.work[self.idx][0].combo.timeout_s,
                )
            )
        )
        abort_group(self.chan)

    def watch(self) -> None:
        """The watchdog: a rank's posted error, or the deadline passed, ends the combination."""
        from moebench.results.rank_result import Failure

        while True:
            time.sleep(POLL_S)
            with self.lock:
                if self.idx is None:
                    continue
                err = self.chan.error(self.idx)
                if err is None and time.monotonic() < self.deadline:
                    continue
                self.fail(Failure(*err) if err else None)

    def _write(self, failure) -> None:
        from moebench.results.finished import write_finished
        from moebench.results.rank_result import Finished

        assert self.idx is not None
        c, toks = self.work[self.idx]
        rows = write_finished(
            self.store, Finished(c, list(toks), dict(self.results), failure), self.meta, self.run_lock
        )
        self.written.extend(rows)
        self.log(f"  {c.label}: " + ", ".join(f"T={r['tokens_per_rank']} {r['status']}" for r in rows))

    def _in_flight(self) -> Optional[int]:
        """The token count rank 0 had not finished (its peers may be further behind)."""
        assert self.idx is not None
        return next((t for t in self.work[self.idx][1] if t not in self.mine), None)


def follow(chan: Channel) -> NoReturn:
    """A rank other than 0: exit 1 once rank 0 has written a failure's rows."""
    while True:
        time.sleep(POLL_S)
        if chan.aborted():
            exit_now(1)


def not_formed(e: Exception, rank: int, work: list, store, meta: dict, run_dir: str, token: Optional[str]) -> NoReturn:
    """The group did not form in time: rank 0 says so in the first combination's rows (a plain
    resume retries them); every rank exits 1."""
    from moebench.results.finished import write_finished
    from moebench.results.lock import LockHeld, RunLock
    from moebench.results.rank_result import Finished
    from moebench.run.outcome import Observed, decide

    print(f"moebench worker: {e}", file=sys.stderr)
    if rank == 0 and work:
        try:
            c, toks = work[0]
            lock = RunLock.acquire(run_dir, token=token) if token else None
            write_finished(store, Finished(c, list(toks), {}, decide(Observed(not_formed=str(e)))), meta, lock)
        except LockHeld as held:
            print(f"moebench worker: {held}", file=sys.stderr)
    exit_now(1)


def raised(e: BaseException, rank: int, i: int, tokens, chan: Channel, rows: Optional[LeadRows]) -> NoReturn:
    """This rank raised in combination `i`: a rank other than 0 posts its error and waits for
    rank 0 to write it; rank 0 writes the first error posted (a peer's, its cause) or its own."""
    from moebench.results.rank_result import Failure
    from moebench.run.outcome import raised_status

    status, reason = raised_status(e), f"rank {rank}: {type(e).__name__}: {e}"[:500]
    traceback.print_exc()
    if rows is None:
        chan.post_error(i, status, reason, tokens)
        deadline = time.monotonic() + ABORT_WAIT_S
        while time.monotonic() < deadline and not chan.aborted():
            time.sleep(POLL_S)
        exit_now(1)
    time.sleep(1.0)  # a peer that raised first (the cause of this error) has posted by now
    with rows.lock:
        peer = chan.error(i)
        rows.fail(Failure(*peer) if peer else Failure(status, reason, tokens))
