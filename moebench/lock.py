"""One writer per run folder: `<run>/.lock`, an fcntl.flock held for the life of the sweep
that writes the folder, holding who took it (pid, host, command, time) and a random token.

- A second sweep into a held folder is refused (exit 2, naming the holder), or waits with
  `--wait`.
- The kernel drops a flock when its holder dies, `kill -9` included, so a dead holder's
  lock is simply taken (its stale details are reported and replaced).
- Processes that work for the holder on its behalf (SLURM jobs, torchrun ranks of one
  sweep: moebench/slurm.py, moebench/dist_worker.py) do not lock; they present the
  holder's token (`MOEBENCH_LOCK_TOKEN` or an argument) and write only while the lock
  file still names it. A process without the token is refused like any second sweep.

The lock file is never deleted or replaced (a new inode would be a second lock); its
content is rewritten in place by each holder."""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import shlex
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

LOCK_FILE = ".lock"
TOKEN_ENV = "MOEBENCH_LOCK_TOKEN"


class LockHeld(ValueError):
    """The run folder is another sweep's (a ValueError: the CLI's exit 2, before any work)."""


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


def describe(holder: dict) -> str:
    if not holder:
        return "a process that left no details"
    return (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}: "
            f"`{holder.get('command')}`")


class RunLock:
    """The lock of one run folder, held (`fd` set) or borrowed from its holder (`fd` None)."""

    def __init__(self, run_dir: Path, token: str, fd: Optional[int]):
        self.run_dir, self.token, self.fd = Path(run_dir), token, fd
        self.path = self.run_dir / LOCK_FILE

    @classmethod
    def acquire(cls, run_dir, wait: bool = False, command: Optional[str] = None, token: Optional[str] = None,
                log: Callable[[str], None] = lambda s: None, poll_s: float = 0.5) -> "RunLock":
        """Take the folder's lock before any work, or work under its holder's when `token`
        (default: $MOEBENCH_LOCK_TOKEN) is the holder's. Raises LockHeld unless `wait`."""
        run_dir = Path(run_dir)
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        if token:
            lock = cls(run_dir, token, None)
            lock.check()
            return lock
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the ranks (O_CLOEXEC)
        told = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = _read(path)
                    if not wait:
                        raise LockHeld(f"{run_dir} is being written by another sweep ({describe(holder)}); "
                                       "wait for it with --wait, or give another --out") from None
                    if not told:
                        log(f"moebench: waiting for {run_dir}: held by {describe(holder)}")
                        told = True
                    time.sleep(poll_s)
            stale = _read(path)
            if stale.get("pid") and not (stale.get("host") == socket.gethostname() and _alive(stale["pid"])):
                log(f"moebench: {run_dir}: taking the lock of a sweep that ended without releasing it "
                    f"({describe(stale)})")
            me = {"pid": os.getpid(), "host": socket.gethostname(), "token": uuid.uuid4().hex,
                  "command": command or " ".join(shlex.quote(a) for a in sys.argv),
                  "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(run_dir, me["token"], fd)

    def check(self) -> None:
        """Raise LockHeld unless this process may write: it holds the lock, or the lock file
        still names its holder's token (checked before each write of a borrowed lock)."""
        if self.fd is not None:
            return
        holder = _read(self.path)
        if holder.get("token") != self.token:
            raise LockHeld(f"{self.run_dir}: the sweep this process works for no longer holds the folder "
                           f"(now: {describe(holder) if holder.get('token') else 'no holder'}); nothing written")

    @property
    def env(self) -> dict:
        """What a child process presents to work under this lock."""
        return {TOKEN_ENV: self.token}

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
