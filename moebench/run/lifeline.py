"""Ranks die with the process that started them: a parent killed with `kill -9` cannot
stop its ranks, so each rank stops itself (docs/design.md, "Isolation and resume").

- Linux's parent-death signal (prctl PR_SET_PDEATHSIG = SIGKILL): the kernel kills the rank
  the moment its parent exits. It fires when the parent *thread* that started the rank
  ends, so it is armed only for ranks started from the parent's main thread.
- A watchdog thread (every POLL_S) for every other case (a rank started under `nsys profile`, whose parent
  is nsys; torchrun's ranks and SLURM tasks, whose starting thread is not known; a non-Linux
  system): it polls the starting process and kills this one when it is gone (or is another
  process reusing its pid).

Either is armed at the first line of the rank's process, before its slow imports (torch
takes seconds): a watch armed later would find a parent already gone and read pid 1, which
adopted the rank, as its parent. The launcher's ranks start in `run_watched`;
moebench/dist_worker.py (the `python -m` shim) and moebench/run/slurm.py call `watch_parent` at the top
of the module."""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import sys
import threading
import time
from typing import Optional

PR_SET_PDEATHSIG = 1
POLL_S = 0.5


def _start_time(pid: int) -> Optional[str]:
    """The process's start time (its identity with the pid), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    except (OSError, IndexError):
        if sys.platform.startswith("linux"):
            return None
        try:  # no /proc: the pid alone
            os.kill(pid, 0)
            return "alive"
        except OSError:
            return None


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def die_with(parent_pid: Optional[int], pdeathsig: bool = True, start: Optional[str] = None) -> None:
    """Make this process die when `parent_pid` does (nothing when it is None). `start`: the
    parent's start time as read when this process began, so that a watch armed later still
    means that process (not one reusing its pid)."""
    if not parent_pid:
        return
    if pdeathsig and sys.platform.startswith("linux") and os.getppid() == parent_pid:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
        if armed:
            if os.getppid() != parent_pid:  # it died before the signal was armed
                _die()
            return  # the kernel watches: no thread waking up beside the timed work
    start = start or _start_time(parent_pid)
    if start is None or _start_time(parent_pid) != start:
        _die()

    def watch() -> None:
        while True:
            time.sleep(POLL_S)
            if _start_time(parent_pid) != start:
                _die()

    threading.Thread(target=watch, name="moebench-lifeline", daemon=True).start()


def watch_parent(init_means_gone: bool = False) -> Optional[int]:
    """At the first line of a rank started by someone else (torchrun's agent, a SLURM task's
    starter): die with the process that started it, by the watchdog (which of its threads
    started this one is unknown, and the death signal follows that thread). Returns the pid
    watched. A parent of pid 1 means the starter died before this line ran and init adopted
    this process when `init_means_gone` (a SLURM task: neither slurmstepd nor submitit's
    controller is ever init), and it ends now; otherwise init may be the launcher itself (a
    container whose first process is torchrun), so it is not watched, and a rank orphaned
    that early ends at its process group's start-up deadline (runner.startup_timeout_s: the
    group cannot form without its agent)."""
    ppid = os.getppid()
    if ppid <= 1:
        if init_means_gone:
            print(
                "moebench: the process that started this one is gone (its parent is now pid 1); exiting",
                file=sys.stderr,
                flush=True,
            )
            _die()
        return None
    die_with(ppid, pdeathsig=False, start=_start_time(ppid))
    return ppid


def run_watched(parent_pid: Optional[int], pdeathsig: bool, target: str, *args) -> None:
    """A launcher's rank process: die with `parent_pid` first, then import `target`
    ("module:function", seconds of imports) and call it with `args`. multiprocessing's spawn
    unpickles this function and its arguments (light modules) before anything heavy."""
    die_with(parent_pid, pdeathsig)
    module, func = target.split(":")
    getattr(importlib.import_module(module), func)(*args)
