"""One writer per run folder: `<run>/.lock`, an fcntl.flock held for the life of the sweep
that writes the folder, holding who took it (pid, its start time, host, command, time) and
a random token.

- A second sweep into a held folder is refused (exit 2, naming the holder), or waits with
  `--wait`.
- The kernel drops a flock when its holder dies, `kill -9` included, so a dead holder's
  lock is simply taken (its stale details are reported and replaced).
- The lock file is opened without following a link (O_NOFOLLOW; created with O_EXCL where
  new) and must be a regular file with one name: a `.lock` that is a symbolic link, a
  directory, a FIFO or a hard link to another file is refused (exit 2, nothing written),
  since truncating it would truncate whatever it names.
- Processes that work for the holder (SLURM jobs, torchrun ranks under a wrapper that
  holds the folder: moebench/run/slurm.py, moebench/dist_worker.py) do not lock; they present
  the holder's token (an argument, or `MOEBENCH_LOCK_TOKEN`) and write only while the lock
  file still names it. The token alone is not trusted (an exported variable reaches any
  later command): a borrower is honoured only when the holder started it, checked:
  1. on the holder's host, the holder (its pid *and* its start time, so a reused pid is not
     it) is this process or one of its ancestors (the /proc ppid chain); else
  2. this process runs in a SLURM job (`SLURM_JOB_ID`; `SUBMITIT_LOCAL_JOB_ID` for
     submitit's local executor) that the holder recorded as its own in `<run>/.lock-jobs`
     (`RunLock.add_job`, called as each job is submitted; the file names the holder's
     token, so an earlier holder's list validates nothing). A job's rank 0 waits up to
     JOB_WAIT_S for its id to be listed (the holder writes it once submit returns).
  A token given as an argument that fails this writes nothing (LockHeld). The variable
  that fails it is ignored, with a line saying so: a top-level `moebench sweep` with it
  set locks as any sweep does, so while the holder lives it is refused like any second
  sweep, before it reads, cleans or writes anything. While it works, a borrower on the
  holder's host also stops writing once the holder has died.

The lock file is never deleted or replaced (a new inode would be a second lock); its
content is rewritten in place by each holder."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import shlex
import socket
import stat
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

from moebench.util.safe_write import UnsafePath

LOCK_FILE = ".lock"
JOBS_FILE = ".lock-jobs"
TOKEN_ENV = "MOEBENCH_LOCK_TOKEN"
JOB_ENVS = ("SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID")
JOB_WAIT_S = 20.0


class LockHeld(ValueError):
    """The run folder is another sweep's (a ValueError: the CLI's exit 2, before any work)."""


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _read_fd(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
    except (OSError, ValueError):
        return {}


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


def proc_stat(pid: int) -> Optional[tuple[int, str]]:
    """(parent pid, start time in clock ticks since boot) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else (int(fields[1]), fields[19])


def _is_ancestor(pid, start) -> bool:
    """Whether the process `pid` started at `start` is this process or one of its ancestors."""
    cur = os.getpid()
    while cur > 0:
        st = proc_stat(cur)
        if st is None:
            return False
        if cur == pid and st[1] == start:
            return True
        if cur == 1:
            return False
        cur = st[0]
    return False


def _holder_alive(holder: dict) -> bool:
    """False only when the holder is known to be gone (same host, its pid dead or reused)."""
    if holder.get("host") != socket.gethostname() or not holder.get("start"):
        return True  # another host's process: the token in the file is all there is to check
    st = proc_stat(int(holder["pid"]))
    return st is not None and st[1] == holder["start"]


def _job_id() -> Optional[str]:
    return next((os.environ[k] for k in JOB_ENVS if os.environ.get(k)), None)


def describe(holder: dict) -> str:
    if not holder:
        return "a process that left no details"
    return f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}: `{holder.get('command')}`"


def elsewhere(holder: dict) -> bool:
    """Whether the holder's details name another host: its pid cannot be checked from here."""
    return bool(holder) and holder.get("host") != socket.gethostname()


def writer(holder: dict) -> str:
    """The holder as the writer of a run folder, worded from the command it recorded (a sweep,
    `trace --import`, scripts/compact_rows: all take this lock)."""
    return f"`{holder.get('command')}` (pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')})"


def unverified(holder: dict, run_dir) -> str:
    """A holder on another host, which this host cannot check (a run copied mid-sweep, a node
    that died): what its lock says, and what to do if that has ended. No reason to wait."""
    path = shlex.quote(str(Path(run_dir) / LOCK_FILE))
    return (
        f"its lock names pid {holder.get('pid')} on {holder.get('host')} (since {holder.get('since')}, "
        f"`{holder.get('command')}`); if that has ended, the lock is stale: the next moebench command that "
        f"writes the folder takes it, or `: > {path}` clears it"
    )


def holder_now(run_dir) -> dict:
    """Who holds the run folder's lock now, read without taking it (a reader must not race a
    sweep that is starting): the details its holder wrote, or {} where none holds it (no lock
    file; an empty one, as release leaves it; one whose holder on this host is gone). A holder
    on another host is returned as its details say (`elsewhere`): whether it lives cannot be
    checked from here (`unverified` words it). Never opens a link or waits on a FIFO."""
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        holder = _read_fd(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else {}
    finally:
        os.close(fd)
    return holder if isinstance(holder, dict) and holder.get("pid") and _holder_alive(holder) else {}


def _open_lock(path: Path) -> int:
    """The lock file's descriptor, created with O_EXCL where new, never opened through a link
    (O_NOFOLLOW), and only a regular file with one name. UnsafePath otherwise."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC  # CLOEXEC: not inherited by the ranks
    rm = "rm -r" if os.path.isdir(path) and not os.path.islink(path) else "rm"
    todo = f"remove it ({rm} {shlex.quote(str(path))}) or give another --out"
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
            fd = os.open(path, flags | os.O_NONBLOCK)
        except OSError as e:
            if os.path.islink(path):
                raise UnsafePath(
                    f"{path} is a symbolic link (to {os.readlink(path)}): moebench never writes "
                    f"through a link in a run folder; {todo}"
                ) from None
            if os.path.isdir(path):
                raise UnsafePath(f"{path} is a directory, not moebench's lock file: {todo}") from None
            raise UnsafePath(f"{path} cannot be opened as moebench's lock file ({e.strerror}): {todo}") from None
    st = os.fstat(fd)
    why = (
        "is not a regular file"
        if not stat.S_ISREG(st.st_mode)
        else f"has {st.st_nlink} hard links (truncating it would truncate the other names)"
        if st.st_nlink > 1
        else ""
    )
    if why:
        os.close(fd)
        raise UnsafePath(f"{path} {why}: moebench's lock must be a file of its own; {todo}")
    os.set_blocking(fd, True)
    return fd


class RunLock:
    """The lock of one run folder, held (`fd` set) or borrowed from its holder (`fd` None)."""

    def __init__(self, run_dir: Path, token: str, fd: Optional[int]):
        self.run_dir, self.token, self.fd = Path(run_dir), token, fd
        self.path = self.run_dir / LOCK_FILE
        self.jobs: list[str] = []

    @classmethod
    def acquire(
        cls,
        run_dir,
        wait: bool = False,
        command: Optional[str] = None,
        token: Optional[str] = None,
        log: Callable[[str], None] = lambda s: None,
        poll_s: float = 0.5,
    ) -> "RunLock":
        """Take the folder's lock before any work, or work under its holder's when `token`
        (default: $MOEBENCH_LOCK_TOKEN) is the holder's and the holder started this process
        (module docstring). Raises LockHeld unless `wait`; UnsafePath for a `.lock` that is
        a link or not a regular file."""
        run_dir = Path(run_dir)
        if token:  # given by the holder (a SLURM job's argument): borrow, or write nothing
            lock = cls(run_dir, token, None)
            why = lock._not_borrowable(job_wait_s=JOB_WAIT_S)
            if why:
                raise LockHeld(why)
            return lock
        if os.environ.get(TOKEN_ENV):  # honoured only where the holder started this process
            lock = cls(run_dir, os.environ[TOKEN_ENV], None)
            why = lock._not_borrowable(job_wait_s=0.0)
            if not why:
                return lock
            log(f"moebench: {TOKEN_ENV} ignored: {why}")
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_FILE
        fd = _open_lock(path)
        told = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = _read_fd(fd)
                    if not wait:
                        raise LockHeld(
                            f"{run_dir} is being written by another sweep ({describe(holder)}); "
                            "wait for it with --wait, or give another --out"
                        ) from None
                    if not told:
                        log(f"moebench: waiting for {run_dir}: held by {describe(holder)}")
                        told = True
                    time.sleep(poll_s)
            stale = _read_fd(fd)
            if stale.get("pid") and not (stale.get("host") == socket.gethostname() and _alive(stale["pid"])):
                log(
                    f"moebench: {run_dir}: taking the lock of a sweep that ended without releasing it "
                    f"({describe(stale)})"
                )
            me_stat = proc_stat(os.getpid())
            me = {
                "pid": os.getpid(),
                "start": me_stat[1] if me_stat else None,
                "host": socket.gethostname(),
                "token": uuid.uuid4().hex,
                "command": command or " ".join(shlex.quote(a) for a in sys.argv),
                "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(run_dir, str(me["token"]), fd)

    def _not_borrowable(self, job_wait_s: float) -> str:
        """Why this process may not work under the holder's lock with this token, or '' (module
        docstring: the token must be the holder's, and the holder must have started this
        process: an ancestor on its host, or one of its SLURM jobs)."""
        holder = _read(self.path)
        try:
            self.check(holder)
        except LockHeld as e:
            return str(e)
        if (
            holder.get("host") == socket.gethostname()
            and holder.get("start")
            and _is_ancestor(int(holder["pid"]), holder["start"])
        ):
            return ""
        job = _job_id()
        deadline = time.monotonic() + job_wait_s
        while job is not None:
            listed = _read(self.run_dir / JOBS_FILE)
            if listed.get("token") == self.token and job in listed.get("jobs", []):
                return ""
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        return (
            f"{self.run_dir}: its holder's token is honoured only in processes that holder started (its "
            f"descendants, or its SLURM jobs), and this one is neither ({describe(holder)})"
        )

    def check(self, holder: Optional[dict] = None) -> None:
        """Raise LockHeld unless this process may write: it holds the lock, or the lock file
        still names its holder's token and that holder is not known to be dead (checked
        before each write of a borrowed lock)."""
        if self.fd is not None:
            return
        holder = _read(self.path) if holder is None else holder
        if holder.get("token") != self.token or not _holder_alive(holder):
            now = describe(holder) if holder.get("token") != self.token and holder.get("token") else "no holder"
            raise LockHeld(
                f"{self.run_dir}: the sweep this process works for no longer holds the folder "
                f"(now: {now}); nothing written"
            )

    def add_job(self, job_id: str) -> None:
        """Record a SLURM job this holder submitted: its tasks may borrow the lock
        (module docstring). The list is replaced whole (written aside, then renamed)."""
        assert self.fd is not None, "only the holder lists its jobs"
        self.jobs.append(str(job_id))
        path = self.run_dir / JOBS_FILE
        tmp = self.run_dir / f".tmp-lock-jobs-{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, json.dumps({"token": self.token, "jobs": self.jobs}).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if os.path.islink(path) or (path.exists() and not path.is_file()):
            tmp.unlink()
            raise UnsafePath(f"{path} is a link or not a regular file: remove it or give another --out")
        os.replace(tmp, path)

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
