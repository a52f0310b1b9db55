"""Environment errors: the machine, not the input or the code, refusing a write (a full
disk, a read-only or foreign-owned folder, `--out` naming a file). Each is reported as one
line naming the path and the cause (docs/design.md, "Environment errors and torn files"):
before any work the command exits 2; a sweep stopped by one keeps the rows it wrote and
exits 1 saying so. `probe` finds them before any work.

Which OSErrors count is decided here and nowhere else (the CLI's error handling and the
sweep's mid-run handling both ask `describe`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Optional

# the temp files' names are the probe's too (moebench/util/probe.py); the store takes them from here
from moebench.util.probe import TMP_PREFIX as TMP_PREFIX
from moebench.util.probe import TMP_SUFFIX as TMP_SUFFIX
from moebench.util.probe import NotMade, TakesNoFiles, open_probe  # safe_dir and check_dir raise NotMade
from moebench.util.safe_write import NO_SUCH, safe_dir

# errno -> the cause as the line states it; any other OSError is a defect and keeps its traceback
CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted (a read-only or immutable folder?)",
    errno.ENOTDIR: "not a directory (a file stands where a folder must be)",
    errno.EISDIR: "is a directory (a folder stands where a file must be)",
    errno.EEXIST: "exists and is not a folder",
    errno.ELOOP: "a symbolic link, which moebench does not write through",
    errno.EIO: "input/output error (a failing disk or a lost network mount?)",
}
# a folder not made (safe_write.NotMade): ENOENT's cause; and what to do where the place refused it
NOT_CREATABLE = "cannot be created here: the file system makes no folders there, as in /proc or /sys"
NO_FILES = "takes no files: the file system makes none there, as in /proc or /sys"  # TakesNoFiles
# ELOOP of a link that leads back to itself (a read follows links: its ELOOP is always this one; a
# write's, moebench's refusal to follow any link, is CAUSES' unless the link loops as well)
LOOPS = "a symbolic link that loops (it leads back to itself, or round other links)"
# ENOENT of a link whose target is missing (dangling): the line names the target, then says what to do
DANGLING = "a symbolic link to a missing file"
LINK_ADVICE = {errno.ELOOP: "remove the link", errno.ENOENT: "restore the target or remove the link"}
GIVE_OUT = "give --out a folder you can write"
ELSEWHERE = (errno.ENOENT, errno.EROFS, errno.EACCES, errno.EPERM)  # not a full disk: that one may be freed


def describe(exc: BaseException, where: Optional[os.PathLike | str] = None) -> Optional[str]:
    """'<path>: <cause>' for an environment error, None for any other exception. `where`
    stands in for the path when the error names none (pyarrow's and write()'s ENOSPC). A folder
    not made is '<folder asked for>: <cause> (<first folder not made> could not be made); give
    --out ...' (read-only, not ours, /proc), the same whether safe_dir met it or check_dir foresaw it.
    A link that loops (ELOOP) is LOOPS where following it never reaches a file, and one whose target is
    missing (ENOENT) is DANGLING, naming the target: what to do about either is LINK_ADVICE's."""
    if isinstance(exc, NotMade):
        if isinstance(exc, TakesNoFiles):
            cause: Optional[str] = NO_FILES
        else:
            cause = NOT_CREATABLE if exc.errno == errno.ENOENT else CAUSES.get(exc.errno or 0)
        if cause is None:
            return None
        first = exc.first or exc.filename  # None: rebuilt from errno and path (with_path), the one asked for
        made = "" if first == exc.filename else f" ({first} could not be made)"
        return f"{exc.filename}: {cause}{made}" + (f"; {GIVE_OUT}" if exc.errno in ELSEWHERE else "")
    if isinstance(exc, OSError) and exc.errno in CAUSES:
        cause = LOOPS if exc.errno == errno.ELOOP and _loops(exc.filename) else CAUSES[exc.errno]
    elif isinstance(exc, OSError) and exc.errno == errno.ENOENT and (target := _dangles(exc.filename)):
        cause = f"{DANGLING} ({target})"  # a missing file is no environment error; a link to one is
    else:
        return None
    path = exc.filename if exc.filename is not None else where
    return f"{os.fsdecode(path)}: {cause}" if path is not None else cause


def _loops(path) -> bool:
    """Whether following the link `path` (a file name, or None: not known) never reaches a file."""
    if path is None:
        return False
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def link_fault(path) -> Optional[int]:
    """ELOOP where the link `path` loops, ENOENT where its target is missing (or lies below a file);
    None where `path` is None, no link, or one that leads somewhere (or whose target may not be looked at:
    its reader says so). The one test of a broken link: describe's wording and store_read.broken_link."""
    if path is None or not os.path.islink(path):
        return None
    try:
        os.stat(path)
    except OSError as e:
        if e.errno in NO_SUCH:
            return errno.ELOOP if e.errno == errno.ELOOP else errno.ENOENT
    return None


def _dangles(path) -> Optional[str]:
    """The target of the link `path` where it leads to no file (a missing one, or one below a file),
    else None (not a link, or a link that leads somewhere, or `path` None)."""
    return os.fsdecode(os.readlink(path)) if link_fault(path) == errno.ENOENT else None


def with_path(exc: OSError, path: os.PathLike | str, replace: bool = False) -> OSError:
    """`exc` naming `path` where it names none (or, `replace`, instead of the name it has):
    the same class and errno, so that the line says which file or folder was refused."""
    if (exc.filename is not None and not replace) or exc.errno is None:
        return exc
    return type(exc)(exc.errno, os.strerror(exc.errno), os.fspath(path))


def probe(folder: os.PathLike | str) -> Path:
    """Create `folder` (with its parents) and a file in it, then remove the file, so that a
    full disk, a read-only folder or a file in the way raises its OSError before any work
    (`probe_in`)."""
    folder = Path(folder)
    safe_dir(folder)  # mkdir -p; a file in the way is NotADirectoryError, /proc NotCreatable
    return probe_in(folder)


def probe_in(folder: os.PathLike | str) -> Path:
    """`probe` of a folder made already (safe_write.safe_dir): a probe file created in it, one byte
    written and synced (a full disk refuses a block, not a name), and removed (probe.open_probe: a
    link by its name is never followed; named like the store's temp files, so that a killed probe's
    leftover in a run folder is removed by the next sweep's clean_temp). A folder that takes no file
    (read-only, not ours, /proc) is NotMade, as check_dir says of it: its line says to give --out
    another folder."""
    folder = Path(folder)
    with open_probe(folder, folder) as fd:
        if fd is not None:  # None: the name was taken, nothing learned (open_probe)
            try:
                os.write(fd, b"\0")
                os.fsync(fd)
            except OSError as e:
                raise with_path(e, folder, replace=True) from e
    return folder
