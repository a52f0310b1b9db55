"""The run folder's write sequence: which of a pair's rows is newest, without the wall clock.

Every row file the store writes gets the next number of `<run>/.row-seq` in its rows'
`write_seq` column (the timestamp stays, for people). A clock stepped back (NTP, `faketime`, a
VM restored) or a run folder carried to a machine whose clock differs would otherwise let an
older measurement hide a newer one.

Several processes may write one folder at once (a sweep's SLURM jobs and torchrun rank 0
write under the holder's lock token, moebench/results/lock.py), so the counter is read and
advanced under an `fcntl.flock` of its own file, held only for that. The file is opened
without following a link (O_NOFOLLOW) and must be a regular file with one name. The number
never goes back: the first number a process takes is past both the file's and the largest
`write_seq` stored (a counter lost, cut short or copied without the rows keeps counting from
the rows), so a resume, a compaction (which keeps each row's `write_seq`) or a folder moved
between machines continues the order. On NFS the flock relies on the server's lock support,
as the run lock does. The numbers order the rows of one folder: row files of several folders
read together (`load_files`) are ordered by numbers of different counters."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from typing import Callable

from moebench.util.safe_write import UnsafePath

SEQ_FILE = ".row-seq"
SEQ_COLUMN = "write_seq"


def _open(path: Path) -> int:
    """The counter's descriptor (created where absent), never through a link, a regular file of its own."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if os.path.islink(path) or os.path.exists(path):
            raise UnsafePath(
                f"{path} cannot be opened as moebench's write sequence ({e.strerror}; a link?): "
                f"remove it (rm {path}), then re-run"
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise UnsafePath(f"{path} is not a file of its own: remove it (rm {path}), then re-run")
    os.set_blocking(fd, True)
    return fd


def _read(fd: int) -> int:
    try:
        return max(int(os.pread(fd, 64, 0).decode().strip() or 0), 0)
    except ValueError:  # cut short or garbled: the rows say where the order stands
        return 0


def next_seq(run_dir: Path, stored_max: Callable[[], int], synced: bool) -> int:
    """The next number of the run folder's write sequence (1, 2, ...), written back before it
    is returned. `stored_max()`: the largest `write_seq` of the stored rows, read (under the
    counter's lock) unless `synced` (this process has read it already) and the counter holds
    a number."""
    fd = _open(Path(run_dir) / SEQ_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by close; held for a read and a write only
        cur = _read(fd)
        if not synced or cur == 0:
            cur = max(cur, stored_max())
        n = cur + 1
        data = str(n).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
        return n
    finally:
        os.close(fd)
