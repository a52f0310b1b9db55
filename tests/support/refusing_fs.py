"""A folder that refuses to have a folder made in it, the same for root and for a user
(tests/cli/test_refused_input.py, tests/util/test_hostile_folders.py).

The real ones are not the same: root may write in /proc (os.access says yes; mkdir -p then
answers ENOENT), where a user is told EACCES by os.access before mkdir is asked; and a chmod
binds no root. So each refusal is made where moebench asks (moebench/util/safe_write.py):
os.mkdir raises its errno, and the check that makes nothing (check_dir) sees it too: a read-only
file system through os.statvfs, a folder not ours through os.access; /proc as a user sees both
(os.access says no, mkdir answers ENOENT), as root does mkdir's ENOENT only. A folder a user may
not search (/root to a user): nothing below it can be looked at (stat and lstat answer EACCES, so
Path.exists() raises where os.path.lexists() says False), nor made, missing parent or not. A
file is created in none of them (os.open with O_CREAT answers the same errno), so that an
existing --out there refuses the probe file a sweep or a report writes before any work."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

from moebench.results.writable import CAUSES, NOT_CREATABLE

# kind -> (the errno mkdir answers, the cause the environment's one line states)
REFUSALS = {
    "not_creatable": (errno.ENOENT, NOT_CREATABLE),  # /proc to root: no folder is made there
    "not_creatable_user": (errno.ENOENT, NOT_CREATABLE),  # /proc to a user: not ours, and no folder is made
    "read_only": (errno.EROFS, CAUSES[errno.EROFS]),  # a read-only file system
    "not_ours": (errno.EACCES, CAUSES[errno.EACCES]),  # a folder this user may not write
    "not_searchable": (errno.EACCES, CAUSES[errno.EACCES]),  # /root to a user: nothing below it is seen
}


def _is(path, folder: Path) -> bool:
    return isinstance(path, (str, os.PathLike)) and Path(path) == folder


def _below(path, folder: Path) -> bool:
    return isinstance(path, (str, os.PathLike)) and folder in Path(path).parents


def refusing(monkeypatch, folder: Path, kind: str) -> Path:
    """Make `folder`, then have it refuse, as `kind` says, every folder made inside it; return it."""
    code = REFUSALS[kind][0]
    folder.mkdir()
    mkdir, statvfs, access, stat, lstat, open_ = os.mkdir, os.statvfs, os.access, os.stat, os.lstat, os.open
    unsearchable = kind == "not_searchable"

    def refused_mkdir(path, *args, **kwargs):
        # as the kernel does, a missing parent is ENOENT first (mkdir -p then asks for the parent),
        # but where the folder may not be searched: EACCES before it looks for the parent
        if _below(path, folder) and (unsearchable or Path(path).parent.is_dir()):
            raise OSError(code, os.strerror(code), str(path))  # FileNotFoundError, PermissionError, ...
        return mkdir(path, *args, **kwargs)

    def refused_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and _below(path, folder):
            raise OSError(code, os.strerror(code), str(path))
        return open_(path, flags, *args, **kwargs)

    def unsearched(real):
        def look(path, *args, **kwargs):
            if _below(path, folder):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real(path, *args, **kwargs)

        return look

    def read_only(path):
        return SimpleNamespace(f_flag=os.ST_RDONLY) if _is(path, folder) else statvfs(path)

    def not_ours(path, mode, **kwargs):
        return False if _is(path, folder) or _below(path, folder) else access(path, mode, **kwargs)

    monkeypatch.setattr(os, "mkdir", refused_mkdir)
    monkeypatch.setattr(os, "open", refused_open)
    if kind == "read_only":
        monkeypatch.setattr(os, "statvfs", read_only)
    if kind in ("not_ours", "not_creatable_user", "not_searchable"):
        monkeypatch.setattr(os, "access", not_ours)
    if unsearchable:
        monkeypatch.setattr(os, "stat", unsearched(stat))
        monkeypatch.setattr(os, "lstat", unsearched(lstat))
    return folder
