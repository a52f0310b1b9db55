"""Asking a folder, before any work, whether what a writer will make can be made in it, and the
refusals that say why not (`NotMade` and its kinds; moebench/results/writable.py words each as the
environment's one line). safe_write's check_dir and the store's probe (writable.probe_in) both ask
here, so that a folder is refused with the same line whichever command asks.

Two probes, each under a name of moebench's own, never one of the user's:

- a file (`open_probe`), in an existing folder: created with O_CREAT | O_EXCL | O_NOFOLLOW (a link
  by its name is never followed), then closed and removed. It is named like the store's temp files,
  `.tmp-probe-<hex>.tmp` (TMP_PREFIX, PROBE_NAME, TMP_SUFFIX), so that no reader's glob matches it,
  and a leftover of a probe killed before it removed its file is removed by the store's `clean_temp`
  (moebench/results/store.py) where the store looks: the run folder, its rows/ and envs/ (the
  sweep's probe; a report whose --out is the run folder). A leftover in any other folder (a report
  folder, a plot folder) stays there, a hidden file no reader opens;
- a folder (`can_make_in`), where os.access says a folder cannot be made: mkdir of
  `.moebench-probe-<hex>` (PROBE_PREFIX) in the nearest existing folder, to learn why (EACCES, or
  ENOENT where the file system makes no folders, /proc). It is made only where os.access was wrong
  (CAP_DAC_OVERRIDE, NFS, ACLs), and removed at once. Its folder may lie anywhere above --out, where
  no store looks, and `clean_temp` removes files only, so it is named apart: a leftover (a kill
  between mkdir and rmdir, or something put in it meanwhile) stays, and its name says whose it is.
"""

from __future__ import annotations

import errno
import os
import secrets
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# a writer's temp files (the store's, the probe's): never *.parquet, so no reader's glob
# matches a torn one, and the next sweep's clean_temp removes a killed writer's leftover
TMP_PREFIX, TMP_SUFFIX = ".tmp-", ".tmp"
PROBE_NAME = "probe-"  # a probe file's name after TMP_PREFIX: a person reading the folder knows it
PROBE_PREFIX = ".moebench-probe-"  # the folder can_make_in's mkdir asks for: never one of the user's
REFUSING = (errno.EROFS, errno.EACCES, errno.EPERM)  # an existing folder that takes no file: read-only, not ours


class NotMade(OSError):
    """A folder that could not be made (`safe_dir`), or would not be (`check_dir`), or an existing
    one that takes no file (read-only, not ours): the refusal's errno, `filename` the folder asked
    for, `first` the first folder on the way to it that could not be made (the one asked for, or a
    missing parent of it; None: the one asked for, as in one rebuilt from its errno and path alone).
    Both name the same two folders, so that every command's line says the same
    (moebench/results/writable.py words it)."""

    first: str | None = None


class NotCreatable(NotMade, FileNotFoundError):
    """A folder mkdir refused with ENOENT though its parent is there: a file system that makes no
    folders there (/proc), or one removed under it. An environment error (its one line,
    moebench/results/writable.py), where any other ENOENT, a file gone from under a reader, stays
    what it was."""


class TakesNoFiles(NotMade, FileNotFoundError):
    """An existing folder in which a file cannot be created with ENOENT: a file system that makes
    no files there (/proc). Named apart from NotCreatable, whose line speaks of folders."""


def not_made(code: int, asked, first) -> NotMade:
    """The NotMade of errno `code` (NotCreatable for ENOENT), naming `asked` and `first`."""
    err = (NotCreatable if code == errno.ENOENT else NotMade)(code, os.strerror(code), str(asked))
    err.first = str(first)
    return err


@contextmanager
def open_probe(folder, asked) -> Iterator[int | None]:
    """A probe file in the existing `folder` (module doc), open for writing for the `with` block
    (its descriptor), then closed and removed. A folder that takes no file is refused naming
    `asked`, the folder as the user named it: NotMade for a read-only one or one not ours (EROFS,
    EACCES, EPERM), TakesNoFiles where the file system makes none (ENOENT in a folder that is
    there); any other refusal (ENOSPC: no inode left) is its OSError naming `asked`. None instead of
    a descriptor where the name is taken (EEXIST, a name no one can guess): nothing is learned, and
    the writer says what it meets."""
    folder = Path(folder)
    path = folder / f"{TMP_PREFIX}{PROBE_NAME}{uuid.uuid4().hex}{TMP_SUFFIX}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        fd = None
    except OSError as e:  # the folder refused, not the probe's own name
        raise _refusal(e, folder, asked) from e
    if fd is None:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:  # a sweep holding the folder removed it as a leftover (clean_temp)
            pass


def _refusal(e: OSError, folder: Path, asked) -> OSError:
    """What `open_probe` raises for os.open's refusal `e` in `folder` (its docstring)."""
    if e.errno in REFUSING:
        return not_made(e.errno, asked, asked)
    if e.errno == errno.ENOENT and folder.is_dir():  # /proc: the folder is there, no file is made
        err = TakesNoFiles(errno.ENOENT, os.strerror(errno.ENOENT), str(asked))
        err.first = str(asked)
        return err
    if e.errno is None:
        return e
    return type(e)(e.errno, os.strerror(e.errno), str(asked))


def can_make_in(folder: Path, path: Path, first: Path | None) -> None:
    """The NotMade `safe_dir` would meet making `first` in `folder` (None: a file is written in
    `folder`, which is `path`, asked with `open_probe`), naming `path`: a read-only file system, or
    a folder not ours to write. Where os.access says no, mkdir says why: EACCES, or ENOENT for a file
    system that makes no folders (/proc, to a user: os.access refuses it before mkdir is asked).
    mkdir is asked for a folder of moebench's own name in `folder` (PROBE_PREFIX: the errno is the
    same for any name), never `first`, which another process may make meanwhile; one that is made
    all the same (os.access was wrong) is removed at once, and the folder reported as writable."""
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        raise not_made(errno.EROFS, path, first or path)
    if first is None:  # os.access cannot say: root may write in /proc by it, where no file is made
        with open_probe(folder, path):
            return
    if os.access(folder, os.W_OK | os.X_OK):
        return
    probe = Path(folder) / f"{PROBE_PREFIX}{secrets.token_hex(4)}"
    try:
        os.mkdir(probe)  # a link by that name is not followed: EEXIST
    except FileExistsError:  # the name is taken: mkdir did not say, safe_dir will
        return
    except OSError as e:
        raise not_made(e.errno or errno.EACCES, path, first) from None
    try:
        os.rmdir(probe)
    except OSError:  # something was put in it meanwhile: it stays, no error of the user's folder
        pass
