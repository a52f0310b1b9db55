"""Ranks die with the process that started them: a parent killed with `kill -9` cannot
stop its ranks, so each rank stops itself (docs/design.md, "Isolation and resume").

- Linux's parent-death signal (prctl PR_SET_PDEATHSIG = SIGKILL): the kernel kills the rank
  the moment its parent exits. It fires when the parent *thread* that started the rank
  ends, so it is armed only for ranks started from the parent's main thread.
- A watchdog thread (every POLL_S) for every other case (a rank started under `nsys profile`, whose parent
  is nsys; a non-Linux system): it polls the starting process and kills this one when it
  is gone (or is another process reusing its pid)."""
from __future__ import annotations

import ctypes
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


def die_with(parent_pid: Optional[int], pdeathsig: bool = True) -> None:
    """Make this process die when `parent_pid` does (nothing when it is None)."""
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
    start = _start_time(parent_pid)
    if start is None:
        _die()

    def watch() -> None:
        while True:
            time.sleep(POLL_S)
            if _start_time(parent_pid) != start:
                _die()

    threading.Thread(target=watch, name="moebench-lifeline", daemon=True).start()
