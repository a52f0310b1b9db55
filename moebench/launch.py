"""One process group per combination family: ranks started with
torch.multiprocessing (one per GPU on CUDA, gloo ranks on CPU), a hard timeout
per combination after which the whole group is killed, a crashed rank becomes a
`failed` row, and the next combination starts in a clean group."""
from __future__ import annotations

import os
import queue as queue_mod
import shlex
import sys
from pathlib import Path
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch.multiprocessing as mp

from .plan import Combination
from .worker import rank_main

STARTUP_S = 180.0  # process start, imports, process-group init (on top of a combination's timeout)
EXIT_GRACE_S = 30.0
# never enable NVLink multicast on shared machines
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass
class Finished:
    """What one combination produced: per tokens, the per-rank results; or why not."""

    combo: Combination
    tokens: list[int]
    results: dict = field(default_factory=dict)  # tokens -> {rank: result}
    failure: Optional[dict] = None  # {"status", "reason", "tokens"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(procs) -> None:
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


class Launcher:
    """Runs lists of (combination, token counts) and reports each one finished."""

    def __init__(self, run_dir: str, on_finished: Callable[[Finished], None], should_stop: Callable[[], bool] = lambda: False):
        self.run_dir = run_dir
        self.on_finished = on_finished
        self.should_stop = should_stop
        for k, v in SAFE_ENV.items():
            os.environ.setdefault(k, v)

    def run(self, work: list[tuple[Combination, list[int]]]) -> None:
        """Group consecutive work of one family into a process group; after a
        failure or timeout the group is killed and restarted for the rest."""
        work = sorted(work, key=lambda w: w[0].family)
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
        c0 = work[0][0]
        ws, device = c0.combo["world_size"], c0.combo["device"]
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        wrapper = self._nsys_wrapper(work)
        if wrapper:
            ctx.set_executable(wrapper)
        payload = [
            (i, {"key": c.key, "cfg": c.cfg, "combo": c.combo, "tokens": toks}) for i, (c, toks) in enumerate(work)
        ]
        port = free_port()
        procs = [
            ctx.Process(target=rank_main, args=(r, ws, device, port, payload, q, self.run_dir), daemon=True)
            for r in range(ws)
        ]
        try:
            for p in procs:
                p.start()
        finally:
            if wrapper:
                ctx.set_executable(sys.executable)
        current = 0
        fin = Finished(work[0][0], work[0][1])
        done_ranks: set[int] = set()
        exited: set[int] = set()
        deadline = time.monotonic() + STARTUP_S + work[0][0].cfg["runner"]["timeout_s"]
        try:
            while True:
                try:
                    kind, idx, rank, data = q.get(timeout=0.5)
                except queue_mod.Empty:
                    kind = None
                now = time.monotonic()
                if kind == "start" and idx == current:
                    deadline = now + work[current][0].cfg["runner"]["timeout_s"]
                elif kind == "result":
                    tokens, res = data
                    fin.results.setdefault(tokens, {})[rank] = res
                elif kind == "done":
                    done_ranks.add(rank)
                    if len(done_ranks) == ws:
                        self.on_finished(fin)
                        current += 1
                        done_ranks = set()
                        if current == len(work):
                            self._join(procs, q, ws, exited)
                            return []
                        fin = Finished(work[current][0], work[current][1])
                        deadline = now + STARTUP_S + work[current][0].cfg["runner"]["timeout_s"]
                        if self.should_stop():
                            _kill(procs)
                            return work[current:]
                elif kind == "error":
                    fin.failure = {**data, "reason": f"rank {rank}: {data['reason']}"}
                    _kill(procs)
                    self.on_finished(fin)
                    return work[current + 1 :]
                elif kind == "exit":
                    exited.add(rank)
                if kind is None:
                    dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode is not None and r not in exited]
                    if dead:
                        time.sleep(0.5)  # an error message may still be in flight
                        try:
                            while True:
                                kind, idx, rank, data = q.get_nowait()
                                if kind == "result":
                                    fin.results.setdefault(data[0], {})[rank] = data[1]
                                elif kind == "error":
                                    fin.failure = {**data, "reason": f"rank {rank}: {data['reason']}"}
                                    break
                        except queue_mod.Empty:
                            pass
                        if fin.failure is None:
                            r, code = dead[0]
                            sig = f" ({signal.Signals(-code).name})" if code < 0 else ""
                            fin.failure = {"status": "failed", "reason": f"rank {r} died with exit code {code}{sig}", "tokens": None}
                        _kill(procs)
                        self.on_finished(fin)
                        return work[current + 1 :]
                    if now > deadline:
                        _kill(procs)
                        t = work[current][0].cfg["runner"]["timeout_s"]
                        fin.failure = {"status": "timeout", "reason": f"no result within {t:g} s: the process group was killed", "tokens": None}
                        self.on_finished(fin)
                        return work[current + 1 :]
        finally:
            _kill(procs)
            q.close()

    def _nsys_wrapper(self, work) -> Optional[str]:
        """With trace=nsys and nsys on PATH, ranks start under `nsys profile`
        (a wrapper script as the spawn executable); one report per rank process."""
        if not any(c.combo.get("trace") == "nsys" for c, _ in work):
            return None
        from .traces.nsys import nsys_available, nsys_prefix

        if not nsys_available():
            return None  # the worker writes torch traces; sweep.py said why
        out_dir = Path(self.run_dir) / "traces" / "nsys"
        out_dir.mkdir(parents=True, exist_ok=True)
        script = out_dir / "rank_under_nsys.sh"
        prefix = " ".join(shlex.quote(a) for a in nsys_prefix(out_dir / "ranks_%p"))
        script.write_text(f"#!/bin/sh\nexec {prefix} {shlex.quote(sys.executable)} \"$@\"\n")
        script.chmod(0o755)
        return str(script)

    @staticmethod
    def _join(procs, q, ws, exited) -> None:
        deadline = time.monotonic() + EXIT_GRACE_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
