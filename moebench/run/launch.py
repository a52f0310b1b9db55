"""One process group per combination family: ranks started with
torch.multiprocessing (one per GPU on CUDA, gloo ranks on CPU), a hard timeout
per combination after which the whole group is killed, a crashed rank becomes a
`failed` row, and the next combination starts in a clean group. This engine starts and
watches the ranks; what a failure's row says is run/outcome.py's `decide`."""

from __future__ import annotations

import os
import queue as queue_mod
import shlex
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional

import torch.multiprocessing as mp

from moebench.config.spec import Combination
from moebench.results.rank_result import Failure, Finished
from moebench.run.lifeline import run_watched
from moebench.run.messages import Done, Error, Exited, Result, Started, Task
from moebench.run.outcome import Death, Observed, decide, peer_lost
from moebench.run.worker import rank_main

STARTUP_S = 180.0  # process start, imports, process-group init (on top of a combination's timeout)
EXIT_GRACE_S = 30.0
NSYS_EXIT_GRACE_S = 600.0  # nsys writes its report and SQLite export after the rank exits
# never enable NVLink multicast on shared machines
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target: Callable, world: int, args: tuple, timeout_s: float) -> list:
    """Spawn `world` processes target(rank, port, *args, queue) (a script's own ranks, e.g.
    benchmarks/), each putting one result on the queue; the results in arrival order.
    A rank that crashes or a result missing after `timeout_s` kills every rank and raises."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    out: list[Any] = []  # each rank's result, as it arrives
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < world:
            try:
                out.append(q.get(timeout=1.0))
            except queue_mod.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"ranks {'exited with ' + str(dead) if dead else f'gave no result in {timeout_s:.0f} s'}"
                    ) from None
        for p in procs:
            p.join(60)
        return out
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)


def _descendants(pid: int) -> list[int]:
    """Live descendants of `pid` (Linux /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill(procs) -> None:
    """Terminate the ranks and anything they started (e.g. a rank under nsys)."""
    for p in procs:
        if p.is_alive() and p.pid:
            for c in _descendants(p.pid):
                try:
                    os.kill(c, signal.SIGKILL)
                except OSError:
                    pass
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


class _GroupState:
    """Messages of one process group, kept per combination index: ranks report
    through one queue, each with its own feeder thread, so a fast rank's message
    for combination i+1 may arrive before a slow rank's "done" for i."""

    def __init__(self, work, world_size: int):
        self.ws = world_size
        self.fins = [Finished(c, toks) for c, toks in work]
        self.done: dict[int, set] = {}
        self.exited: set[int] = set()
        self.current = 0
        self.failure: Optional[Failure] = None
        self.failure_idx: Optional[int] = None  # which combination the error came from
        self.polls = 0
        self.started: set[int] = set()  # combinations some rank has started (the first: start-up is over)
        self.seen_dead: dict[int, int] = {}  # rank -> the poll its death was first seen at
        self.dead_before_failure: Optional[set] = None  # ranks seen dead before the first error came

    def observe(self, procs) -> None:
        """Note the ranks that died (non-zero exit) since the last poll."""
        self.polls += 1
        for r, p in enumerate(procs):
            if p.exitcode not in (None, 0) and r not in self.seen_dead:
                self.seen_dead[r] = self.polls

    def take(self, msg) -> None:
        if isinstance(msg, Started):
            self.started.add(msg.idx)
        elif isinstance(msg, Result):
            self.fins[msg.idx].results.setdefault(msg.tokens, {})[msg.rank] = msg.result
        elif isinstance(msg, Done):
            self.done.setdefault(msg.idx, set()).add(msg.rank)
        elif isinstance(msg, Exited):
            self.exited.add(msg.rank)
        elif isinstance(msg, Error) and self.failure is None:
            self.failure = Failure(msg.status, f"rank {msg.rank}: {msg.reason}", msg.tokens)
            self.failure_idx = msg.idx
            self.dead_before_failure = set(self.seen_dead)

    def pop_finished(self) -> list[Finished]:
        """Combinations every rank has finished, in order."""
        out = []
        while self.current < len(self.fins) and len(self.done.get(self.current, ())) == self.ws:
            out.append(self.fins[self.current])
            self.current += 1
        return out


def _drain(q, st: _GroupState, wait_s: float = 0.5) -> None:
    """Take the messages still in flight (an error, a last result)."""
    time.sleep(wait_s)
    try:
        while True:
            st.take(q.get_nowait())
    except queue_mod.Empty:
        pass


def _dead(procs, st: _GroupState, wait_s: float = 1.0) -> tuple[Death, ...]:
    """Ranks that ended without reporting and caused the failure. A rank's error about a closed
    connection follows a peer's death, so then the death is waited for briefly and named
    first. A rank's own error (anything else) is the cause: only deaths seen before it came
    are named, since a peer that dies after it is its consequence (gloo aborts a rank whose
    peer left: SIGABRT, which under load can come before the launcher kills the group)."""
    own = st.failure is not None and not peer_lost(st.failure.reason)
    deadline = time.monotonic() + wait_s
    while True:
        st.observe(procs)
        dead = [
            r
            for r in st.seen_dead
            if r not in st.exited
            and not (st.failure is not None and st.failure.reason.startswith(f"rank {r}:"))
            and not (own and r not in (st.dead_before_failure or ()))
        ]
        if dead or time.monotonic() > deadline or st.failure is None or own:
            break
        time.sleep(0.05)
    # the first seen first; of those seen together, an abort (a peer's consequence) last
    dead.sort(key=lambda r: (st.seen_dead[r], procs[r].exitcode == -signal.SIGABRT, r))
    return tuple(Death(r, procs[r].exitcode) for r in dead)


def _died(procs, st: _GroupState, wait_s: float = 1.0) -> str:
    """'rank r died with exit code c (SIG)' for the ranks _dead names, else ''."""
    return "; ".join(d.text() for d in _dead(procs, st, wait_s))


def _rest(fin: Finished) -> list[int]:
    """The token counts after the one that failed (OOM, timeout, a crash), which run in a fresh
    process group rather than inherit its failure: `fin` keeps the counts up to the failed one.
    None ([]) where the failure was no token count's (the layer's setup, the group's start-up)."""
    failed_at = fin.failure.tokens if fin.failure is not None else None
    if failed_at is None or failed_at not in fin.tokens:
        return []
    i = fin.tokens.index(failed_at)
    rest = fin.tokens[i + 1 :]
    fin.tokens, fin.rest_follows = fin.tokens[: i + 1], bool(rest)
    return rest


def execution_order(work: list[tuple[Combination, list[int]]]) -> list[tuple[Combination, list[int]]]:
    """The order a sweep runs its work in, stable: families together; inside one, the same hidden
    size adjacent (backends that cache buffers per size, e.g. DeepEP, reuse them) and one model's
    combinations adjacent (a worker keeps one model's expert weights: models that alternate rebuild
    them at every combination)."""
    return sorted(work, key=lambda w: (w[0].family, w[0].combo.hidden, w[0].combo.model))


class Launcher:
    """Runs lists of (combination, token counts) and reports each one finished."""

    def __init__(
        self,
        run_dir: str,
        on_finished: Callable[[Finished], None],
        should_stop: Callable[[], bool] = lambda: False,
        should_abort: Callable[[], bool] = lambda: False,
    ):
        """`should_stop`: stop after the combination in flight (Ctrl-C); `should_abort`: stop
        now (SIGTERM), the combination in flight cancelled with its ranks and given no row."""
        self.run_dir = run_dir
        self.on_finished = on_finished
        self.should_stop = should_stop
        self.should_abort = should_abort
        for k, v in SAFE_ENV.items():
            os.environ.setdefault(k, v)

    def run(self, work: list[tuple[Combination, list[int]]]) -> None:
        """Group consecutive work of one family into a process group; after a
        failure or timeout the group is killed and restarted for the rest."""
        work = execution_order(work)
        i = 0
        while i < len(work) and not self.should_stop():
            fam = work[i][0].family
            j = i
            while j < len(work) and work[j][0].family == fam:
                j += 1
            pending = work[i:j]
            while pending and not self.should_stop():
                pending = self._run_group(pending)
            i = j

    def _run_group(self, work: list[tuple[Combination, list[int]]]) -> list:
        """Run until the work is done, or until one combination fails / times out;
        return the work still to do."""
        procs, q, wrapper = self._start(work)
        try:
            return self._watch(
                work,
                procs,
                q,
                _GroupState(work, work[0][0].combo.world_size),
                NSYS_EXIT_GRACE_S if wrapper else EXIT_GRACE_S,
            )
        finally:
            _kill(procs)
            q.close()
            if wrapper:  # nsys has written what it will: each row names its report, or says why none
                from moebench.run.nsys_import import resolve_nsys_rows

                resolve_nsys_rows(self.run_dir)

    def _start(self, work: list[tuple[Combination, list[int]]]) -> tuple[list, Any, Optional[str]]:
        """The group's ranks, started (under nsys where asked: the wrapper script), and the
        queue they report on."""
        c0 = work[0][0]
        ws, device = c0.combo.world_size, c0.combo.device
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        wrapper = self._nsys_wrapper(work)
        if wrapper:
            ctx.set_executable(wrapper)
        payload = [Task(i, c.combo, tuple(toks)) for i, (c, toks) in enumerate(work)]
        port = free_port()
        # ranks die with this process (moebench/run/lifeline.py), armed before a rank imports
        # torch; the kernel's death signal only when started from the main thread (it fires
        # when the starting thread ends)
        life = (os.getpid(), threading.current_thread() is threading.main_thread())
        procs = [
            ctx.Process(
                target=run_watched,
                args=(
                    *life,
                    f"{rank_main.__module__}:{rank_main.__name__}",
                    r,
                    ws,
                    device,
                    port,
                    payload,
                    q,
                    self.run_dir,
                ),
                daemon=True,
            )
            for r in range(ws)
        ]
        try:
            for p in procs:
                p.start()
        finally:
            if wrapper:
                ctx.set_executable(sys.executable)
        return procs, q, wrapper

    def _watch(self, work: list, procs: list, q, st: _GroupState, grace_s: float) -> list:
        """Take the ranks' messages until the work is done, the sweep stops, or a rank fails,
        dies or times out; the work still to do."""
        deadline = time.monotonic() + STARTUP_S + work[0][0].combo.timeout_s
        while True:
            if self.should_abort():  # what finished is written; the rest is the next invocation's
                _kill(procs)
                return work[st.current :]
            try:
                msg = q.get(timeout=0.5)
            except queue_mod.Empty:
                msg = None
            now = time.monotonic()
            if msg is not None:
                st.take(msg)
                if isinstance(msg, Started) and msg.idx == st.current:
                    deadline = now + work[msg.idx][0].combo.timeout_s
                if not isinstance(msg, Error):
                    before = st.current
                    if self._report(st, procs, grace_s):
                        return []
                    if st.current != before:
                        deadline = now + STARTUP_S + work[st.current][0].combo.timeout_s
                        if self.should_stop():
                            _kill(procs)
                            return work[st.current :]
                    continue
            st.observe(procs)
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode is not None and r not in st.exited]
            if st.failure is None and not dead and now <= deadline:
                continue
            if self.should_abort():  # a rank that got the SIGTERM too: no row for that
                _kill(procs)
                return work[st.current :]
            return self._fail(work, procs, q, st, grace_s)

    def _report(self, st: _GroupState, procs: list, grace_s: float) -> bool:
        """Report the combinations every rank has finished; True (the ranks joined) once the
        group's work is all done."""
        for fin in st.pop_finished():
            self.on_finished(fin)
        if st.current == len(st.fins):
            self._join(procs, grace_s)
            return True
        return False

    def _fail(self, work: list, procs: list, q, st: _GroupState, grace_s: float) -> list:
        """A rank failed, died or timed out: collect what is in flight, give the combination
        its row (run/outcome.py decides it), kill the group; the work still to do."""
        _drain(q, st)
        if self._report(st, procs, grace_s):
            return []
        bad = st.current
        if st.failure is not None and st.failure_idx is not None and st.failure_idx > st.current:
            # a fast rank failed in a later combination while this one's last
            # "done" was still in flight: blame the one that failed, redo this one
            bad = st.failure_idx
        fin = st.fins[bad]
        # the token count in flight: the first without every rank's result
        at = next((t for t in fin.tokens if len(fin.results.get(t, {})) < st.ws), None)
        timeout_s = work[st.current][0].combo.timeout_s
        # no rank began the group's first combination: its start-up hung (imports, plugins, init)
        startup_s = STARTUP_S + timeout_s if bad == 0 and not st.started else 0.0
        fin.failure = decide(  # a start-up's failure is no token count's: every count's row says it
            Observed(
                error=st.failure,
                deaths=_dead(procs, st),
                tokens=None if startup_s else at,
                timeout_s=timeout_s,
                startup_s=startup_s,
            )
        )
        _kill(procs)
        rest = _rest(fin)
        self.on_finished(fin)
        return work[st.current : bad] + ([(fin.combo, rest)] if rest else []) + work[bad + 1 :]

    def _nsys_wrapper(self, work) -> Optional[str]:
        """With trace=nsys and nsys on PATH, ranks start under `nsys profile`
        (a wrapper script as the spawn executable). A rank process runs every row of
        the group, so the capture is an NVTX range that repeats: the worker opens it
        around the timed work of each row, and nsys writes one capture per row and
        rank, `traces/nsys/ranks_<pid>.<n>.*` (traces/nsys.py `nsys_rank_prefix`)."""
        if not any(c.combo.trace == "nsys" for c, _ in work):
            return None
        from moebench.traces.nsys import nsys_available, nsys_rank_dir, nsys_rank_prefix

        if not nsys_available():
            return None  # the worker writes torch traces; sweep.py said why
        out_dir = nsys_rank_dir(self.run_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        script = out_dir / "rank_under_nsys.sh"
        prefix = " ".join(shlex.quote(a) for a in nsys_rank_prefix(self.run_dir))
        script.write_text(f'#!/bin/sh\nexec {prefix} {shlex.quote(sys.executable)} "$@"\n')
        script.chmod(0o755)
        return str(script)

    @staticmethod
    def _join(procs, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
