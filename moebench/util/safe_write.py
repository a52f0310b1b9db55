"""Files moebench writes inside a run folder (or the folder --out names) are created without
following links: a symbolic link planted where a report, a plot or a row goes would
otherwise make moebench overwrite, or create, a file outside the folder. Reading may follow
links (a run folder reached through one reads as usual); writing may not.

The rule, for every writer:

- the folder the user named (the run folder, or --out) may itself be a link: it is theirs;
- below it, every folder on the way to the file is a real folder: `safe_dir(base, *parts)`
  creates the missing ones and refuses a link (or a file) in their place;
- the file itself is never a link, nor a hard link of another file, nor a FIFO: `write_text` /
  `write_bytes` / `open_write` refuse those untouched, then write a new temp file beside it
  (O_CREAT | O_EXCL | O_NOFOLLOW, `.<name>.<pid>.<hex>.tmp`) and rename it over the old one:
  a reader, or a full disk, never leaves a half-written file (a truncated plot), only the old
  one or the new one; the temp file is removed when the write fails. `replace_text` /
  `replace_bytes` do the same, but replace a hard-linked file (the other name keeps its text);
- a write the machine refuses (ENOSPC, EACCES, ...) raises its OSError naming the file, never
  the temp file or nothing (moebench/results/writable.py makes it the CLI's one line);
- `refuse_links(folder, names)` checks, before any work, that none of the files a command
  will write is a link, so that it stops before it has written anything;
- `remove_files(folder, names)` removes files by name from the folder's top level (a report's
  earlier figures): regular files of their own only, looked up in the folder opened once; a link
  stays as it is (unlink never follows one);
- `check_dir(base, *parts)` is `safe_dir` without making any of those folders: a command checks its
  output folder with it before reading its inputs, and makes the folder only once it has something
  to write, so that a refused command leaves no empty folder behind (`check_dir_below` /
  `safe_dir_below`: the same for a full path below `base`). Where os.access refuses, it asks mkdir
  why with a probe folder of its own name, removed at once if it is made; an output folder that
  exists already is asked with a probe file, made and removed, named like the store's temp files
  (root may write in /proc by os.access, where no file is made). Both probes, their names and which
  leftover the store's clean_temp removes: moebench/util/probe.py.

A refusal is `UnsafePath` (also named `LinkRefused`), a ValueError: one line naming the path, and the CLI exits 2.
Usable by any writer of a run folder (the store's rows and env files, the lock): give it
the run folder as `base`.

    check_dir(run, "report")                          # before reading the inputs: nothing made
    out = safe_dir(run, "report")                     # <run>/report, a real folder
    refuse_links(out, ["report.md", "latency.png"])   # before any work
    write_text(out / "report.md", text)
    remove_files(out, ["phases.png"])                 # an earlier report's, if a regular file
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat
from pathlib import Path
from typing import Iterable

# the refusals live with the probes that raise them (probe.py); named here too, where importers find them
from moebench.util.probe import NotCreatable as NotCreatable
from moebench.util.probe import NotMade as NotMade
from moebench.util.probe import TakesNoFiles as TakesNoFiles
from moebench.util.probe import can_make_in, not_made


class UnsafePath(ValueError):
    """A write that would go through a symbolic link, or into something that is not a regular
    file of its own (a hard-linked file, a folder, a FIFO): one line, exit 2. The one class
    for every such refusal (the store's, the lock's, the report's)."""


LinkRefused = UnsafePath  # the name report and trace writers use

# the errnos Path.exists() and Path.is_dir() read as "no such path" up to Python 3.13 (pathlib's own
# list, private); from 3.14 they read every OSError so, as os.path.isdir() and os.path.exists() do,
# EACCES included, which a folder the user may not search answers and a line must tell apart
NO_SUCH = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


def _first_missing(path: Path) -> Path:
    """The first folder mkdir -p of `path` makes: `path`, or its topmost missing parent."""
    first = path
    for above in path.parents:
        if os.path.lexists(above):
            break
        first = above
    return first


def _refused(path, what: str = "is a symbolic link") -> LinkRefused:
    return LinkRefused(
        f"{path} {what}: moebench writes no file through a link, so that nothing outside the "
        "run folder (or --out) changes; remove it, or give --out DIR"
    )


def _not_regular(path) -> UnsafePath:
    return UnsafePath(f"{path} is not a regular file: moebench writes only files of its own there")


def _check_dir(path: Path, asked: Path, first: Path) -> None:
    """`path` exists as a real folder, or not at all (then it is created by the caller). One that
    may not be looked at (EACCES: its folder is not searchable, /root to a user) is NotMade, naming
    `asked` and `first`, the first folder not made, as mkdir's refusal would."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno is None:
            raise
        raise not_made(e.errno, asked, first) from None
    if stat.S_ISLNK(st.st_mode):
        raise _refused(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} is not a folder: moebench writes its files in a folder of that name")


def safe_dir(base, *parts) -> Path:
    """`base`/`parts`, each folder below `base` a real one: created where missing (mode 0777 less
    the umask), a LinkRefused for a link in its place. `base` is created (with its parents) as
    mkdir -p would, links in it followed: it is the folder the user named. Returns the path; where
    `base` itself is a link, by the folder it names (so that the files' own folder is no link)."""
    path = Path(base)
    names = _names_below(base, path, parts)
    asked = path.joinpath(*names)  # as the user would name it: a line names it so
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file (or a dangling link) by that name, or on the way
        # an environment error (moebench/results/writable.py): the CLI's one line names the path, exit 2
        raise _not_a_dir(path) from None
    except OSError as e:  # read-only, not ours; ENOENT (parents=True): a folder the system will not make
        if e.errno is None:
            raise
        raise not_made(e.errno, asked, _first_missing(path)) from e
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    first = Path(base)  # each folder below `base` as the user would name it
    for name in names:
        path, first = path / name, first / name
        _check_dir(path, asked, first)
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError as e:
            if e.errno is None:
                raise
            raise not_made(e.errno, asked, first) from e
        _check_dir(path, asked, first)  # a link made in between is refused too
    return path


def _names_below(base, path: Path, parts) -> list[str]:
    """The folder names of `parts` in order, each of them checked to stay below `base` (`path`:
    where `base` resolved to; ValueError for a '..' or an absolute part)."""
    names = []
    for part in parts:
        for name in Path(part).parts:
            if name in ("..", "/") or name.startswith("/"):
                raise ValueError(f"{path / part}: a folder below {base} must not leave it ({part!r})")
            names.append(name)
    return names


def _not_a_dir(path: Path) -> NotADirectoryError:
    return NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))


def _is_dir(path: Path, asked: Path, base: Path) -> bool:
    """Whether `path` (`base` or a folder above it) is a folder, as Path.is_dir() says; one that may
    not be looked at (EACCES: a folder above it the user may not search, /root to a user), where
    Path.is_dir() raises a bare PermissionError, is what safe_dir's mkdir -p of `base` meets: NotMade,
    naming the folder asked for and the first one not made (moebench/results/writable.py words it)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as e:
        if e.errno in NO_SUCH:  # Path.is_dir()'s False
            return False
        if e.errno is None:
            raise
        raise not_made(e.errno, asked, _first_missing(base)) from None


def check_dir(base, *parts) -> Path:
    """What `safe_dir(base, *parts)` would return, checked without making any of its folders: the
    refusals it would raise (a link or a file below `base`, a file at or above it) and the environment
    errors a write would meet in the nearest existing folder (read-only, not ours) or above it (a
    folder not searchable, where mkdir -p meets EACCES: NotMade as safe_dir's). Then the
    inputs are read, and `safe_dir` makes the folder only once there is something to write."""
    path = Path(base)
    if os.path.lexists(path) and not path.is_dir():  # a file, or a dangling link, by that name
        raise _not_a_dir(path)
    names = _names_below(base, path, parts)
    asked = path.joinpath(*names)  # the folder named in a refusal, as safe_dir names it
    if not _is_dir(path, asked, path):
        for above in path.parents:
            if _is_dir(above, asked, path):
                can_make_in(above, asked, _first_missing(path))
                return asked
            if os.path.lexists(above):  # a file on the way
                raise _not_a_dir(path)
        return asked
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    deepest, first, named = path, None, Path(base)  # named: `path` as the user would name it
    for name in names:
        path, named = path / name, named / name
        _check_dir(path, asked, first or named)
        if first is None and path.is_dir():
            deepest = path
        elif first is None:
            first = named
    can_make_in(deepest, asked, first)
    return path


def _parts_below(base, path) -> tuple[str, ...]:
    """The folder names from `base` down to `path` (ValueError if `path` is not below `base`)."""
    try:
        return Path(path).relative_to(base).parts
    except ValueError:
        raise ValueError(f"{path} is not below {base}") from None


def safe_dir_below(base, path) -> Path:
    """`safe_dir` for a full `path` that lies below `base` (ValueError if it does not)."""
    return safe_dir(base, *_parts_below(base, path))


def check_dir_below(base, path) -> Path:
    """`check_dir` for a full `path` that lies below `base` (ValueError if it does not)."""
    return check_dir(base, *_parts_below(base, path))


def refuse_links(folder, names: Iterable[str]) -> None:
    """LinkRefused when a file `folder`/name that a command will write is a symbolic link, or a
    hard link of another file, or a folder on the way to it is a symbolic link: checked before
    any work, so that nothing is written."""
    for name in names:
        path = Path(folder) / name
        for p in [*reversed(path.relative_to(folder).parents[:-1]), path.relative_to(folder)]:
            if os.path.islink(Path(folder) / p):
                raise _refused(Path(folder) / p)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            raise _refused(path, f"is a hard link of another file ({st.st_nlink} names)")


def remove_files(folder, names: Iterable[str]) -> list[str]:
    """Remove each `folder`/name (a name in `folder` itself, no path) that is a regular file of its own;
    a link, a folder, a FIFO or a hard link of another file stays untouched, as a write refuses them
    (a command that writes one of `names` refused it before any work: refuse_links). The folder is
    opened once and each name looked up and removed in it: nothing is followed below it, and unlink
    never follows a link. Returns the names removed; an OSError (EACCES, EROFS) names the file."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    removed = []
    try:
        for name in names:
            assert os.sep not in name and name not in ("", ".", ".."), name  # the folder's own files only
            try:
                st = os.lstat(name, dir_fd=fd)
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    os.unlink(name, dir_fd=fd)
                    removed.append(name)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise _named(e, Path(folder) / name) from e
    finally:
        os.close(fd)
    return removed


def _check_target(path: Path) -> None:
    """Refuse, before writing anything, what `path` must not be: a link (or one for its folder), a
    hard link of another file, a FIFO or socket; a folder is an environment error (EISDIR)."""
    if os.path.islink(path.parent):
        raise _refused(path.parent)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise _refused(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path)
    if st.st_nlink > 1:
        raise _refused(path, f"is a hard link of another file ({st.st_nlink} names)")


def _named(e: OSError, path: Path) -> OSError:
    """`e` naming `path`, the file the command writes (not its temp file, nor nothing: pyarrow's
    and write()'s ENOSPC name none)."""
    if e.errno is None:
        return e
    return type(e)(e.errno, os.strerror(e.errno), str(path))


def _write_all(f, data: bytes) -> None:
    """Every byte of `data` to the open file `f` (the point where a full disk refuses a block)."""
    f.write(data)


class _AtomicFile(io.BufferedWriter):
    """A binary file written under a temp name beside `path`, renamed over it when closed after
    success (or as a context manager, when its block ends without an exception); removed instead
    when the block raises, or the write or the rename fails."""

    def __init__(self, path: Path):
        self.final = path
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise _named(e, path) from e
        super().__init__(io.FileIO(fd, "wb", closefd=True))

    def __exit__(self, kind, value, tb):
        if kind is not None:
            self.discard()
        else:
            self.commit()
        return None

    def discard(self) -> None:
        """Close and remove the temp file (after a failure: the old file stays as it was)."""
        try:
            super().close()  # a flush the disk refuses again: the temp file goes all the same
        except OSError:
            pass
        finally:
            self.tmp.unlink(missing_ok=True)

    def commit(self) -> None:
        """Flush, sync and rename the temp file over the file; an OSError names the file."""
        try:
            self.flush()
            os.fsync(self.fileno())
            super().close()
            os.replace(self.tmp, self.final)
        except OSError as e:
            self.discard()
            raise _named(e, self.final) from e


def _write(path: Path, data: bytes) -> Path:
    f = _AtomicFile(path)
    try:
        _write_all(f, data)
    except BaseException as e:
        f.discard()
        if isinstance(e, OSError):
            raise _named(e, path) from e
        raise
    f.commit()
    return path


def write_bytes(path, data: bytes) -> Path:
    """Write `data` to `path` whole or not at all: a temp file beside it renamed over it, never
    through a link, nor over a hard-linked file or a FIFO (module doc); an OSError names `path`."""
    path = Path(path)
    _check_target(path)
    return _write(path, data)


def open_write(path):
    """A binary file object for `path`, used as a context manager: written under a temp name,
    renamed over `path` when the block ends without an exception (module doc)."""
    path = Path(path)
    _check_target(path)
    return _AtomicFile(path)


def append_text(path, text: str) -> Path:
    """Append `text` (UTF-8) to `path` (created if missing) without following a link: a log or
    manifest several writers extend line by line."""
    path = Path(path)
    if os.path.islink(path.parent):
        raise _refused(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666)
    except OSError:
        if os.path.islink(path):
            raise _refused(path) from None
        raise
    with os.fdopen(fd, "ab") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise _not_regular(path)
        f.write(text.encode("utf-8"))
    return path


def write_text(path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` (created or emptied) without following a link (module doc)."""
    return write_bytes(path, text.encode("utf-8"))


def replace_bytes(path, data: bytes) -> Path:
    """`write_bytes`, but a hard-linked file is replaced (a new file under the name: the other
    name keeps its text). A link at `path` or its folder is refused."""
    path = Path(path)
    if os.path.islink(path.parent):
        raise _refused(path.parent)
    if os.path.islink(path):
        raise _refused(path)
    return _write(path, data)


def replace_text(path, text: str) -> Path:
    """`replace_bytes` of `text` as UTF-8."""
    return replace_bytes(path, text.encode("utf-8"))
