"""Which code ran: the commit a tree came from, whether its files differed from it, and a
digest of the difference, also where the tree was copied to a machine without its `.git`.

Two sources; the environment fingerprint (moebench/run/env.py) records what they say:

- a git checkout whose top level is the tree: HEAD, and the paths `git status` lists whose
  content differs from HEAD's;
- a stamp, `.moebench-tree.json` at the tree's root, written by `scripts/copy_tree.sh` (a
  copy with its stamp, or `--stamp` in place before the tree travels without `.git`): the
  commit, every file's hash (the manifest) and HEAD's hashes where they differ. Reading it
  rehashes the listed files and walks the tree for new ones (the tree's .gitignore rules,
  plus what git ignored at stamping by rules outside them), so that a file changed, added or
  removed after the stamp makes the tree dirty.

A file is compared by its git blob id (sha1 of "blob <size>\\0" and its bytes; a symlink's
target): a file edited back to the committed bytes is clean, a mode change is no difference.
`git_diff_sha256` digests the difference from the commit: sha256 of the sorted lines
"<path>\\0<the file's blob id now, or '-' where it is gone>\\n" of the paths that differ, so
one tree state has one digest whether git or a stamp reports it; None when clean or unknown.

    python -m moebench.run.treestate copy DEST [--root DIR]   # scripts/copy_tree.sh DEST
    python -m moebench.run.treestate stamp [--root DIR]       # scripts/copy_tree.sh --stamp
    python -m moebench.run.treestate show [--root DIR]        # the state env.json would record

Standard library only: scripts/copy_tree.sh runs it without torch.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from moebench.run.tree_files import STAMP, known_ignored, outermost_ignored, walk
from moebench.util.arg_errors import OneLineErrors
from moebench.util.safe_write import replace_text
from moebench.util.words import counted

FORMAT = 1
LISTED = 20  # paths named in a fingerprint; the digest covers them all
HEX40 = re.compile(r"[0-9a-f]{40}")
UNSAFE = "git-unsafe"  # a source: a .git that git refuses to read (another user's, not in safe.directory)


@dataclass(frozen=True)
class TreeState:
    """What env.json records of the code that ran (`fields()`)."""

    sha: str = "unknown"  # the commit, 40 hex digits (7+ when only MOEBENCH_GIT_SHA names it), or "unknown"
    dirty: Optional[bool] = None  # None: whether the files were the commit's is not known
    diff_sha256: Optional[str] = None  # the difference's digest (module doc); None when clean or unknown
    source: str = "none"  # git | stamp | MOEBENCH_GIT_SHA | UNSAFE | none
    note: str = ""
    changed: tuple[str, ...] = ()  # the first LISTED paths that differ from the commit
    after_stamp: tuple[str, ...] = ()  # stamp only: paths changed, added or removed since it

    def fields(self) -> dict:
        return {
            "git_sha": self.sha,
            "git_dirty": self.dirty,
            "git_diff_sha256": self.diff_sha256,
            "git_tree": self.source,
            "git_tree_note": self.note,
            "git_diff_paths": list(self.changed),
        }


# -- hashing and git -------------------------------------------------------------------


def blob_id(path: Path) -> Optional[str]:
    """git's object id of a file's bytes (a symlink: its target's name); None when absent."""
    try:
        data = os.fsencode(os.readlink(path)) if os.path.islink(path) else Path(path).read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    h = hashlib.sha1(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def digest(diff: dict[str, Optional[str]]) -> Optional[str]:
    """sha256 of the paths that differ from the commit with their blob ids now (module doc)."""
    if not diff:
        return None
    text = "".join(f"{p}\0{diff[p] or '-'}\n" for p in sorted(diff))
    return hashlib.sha256(text.encode()).hexdigest()


def git_env() -> dict[str, str]:
    """The environment of every git this module runs: no optional locks (GIT_OPTIONAL_LOCKS=0,
    as --no-optional-locks): `git status` would otherwise take `.git/index.lock` to refresh the
    index, and a `git commit` in the checkout meanwhile fails on it."""
    return dict(os.environ, GIT_OPTIONAL_LOCKS="0")


def _run_git(root: Path, *args: str) -> Optional[subprocess.CompletedProcess]:
    try:
        return subprocess.run(
            ["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True, timeout=60, env=git_env()
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def _git(root: Path, *args: str) -> Optional[bytes]:
    done = _run_git(root, *args)
    return done.stdout if done is not None and done.returncode == 0 else None


def git_refusal(root: Path) -> str:
    """Why git refuses the checkout at `root` as unsafe (another user's: "dubious ownership",
    until `safe.directory` trusts it), or "" (no refusal: no .git, no git, or git reads it)."""
    done = _run_git(root, "rev-parse", "--git-dir")
    err = os.fsdecode(done.stderr) if done is not None and done.returncode else ""
    if "dubious ownership" not in err and "safe.directory" not in err:
        return ""
    at = re.search(r"repository at '([^']*)'", err)
    if at and Path(at[1]).resolve() not in (Path(root).resolve(), Path(root).resolve() / ".git"):
        return ""  # a checkout around `root` (a copy lying in it) says nothing of the tree
    try:
        owner = f"owned by uid {os.stat(root).st_uid}, this process is uid {os.geteuid()}"
    except OSError:
        owner = "another user's"
    return (
        f"git refuses the checkout at {root} as unsafe (dubious ownership: {owner}); "
        f"`git config --global --add safe.directory {root}` trusts it"
    )


def git_head(root: Path) -> Optional[str]:
    """HEAD's commit where `root` is the top level of a git work tree (a copy lying inside
    another checkout is not one: that checkout's HEAD says nothing of it)."""
    top, head = _git(root, "rev-parse", "--show-toplevel"), _git(root, "rev-parse", "--verify", "-q", "HEAD")
    if top is None or head is None or Path(os.fsdecode(top.strip())).resolve() != Path(root).resolve():
        return None
    sha = head.decode().strip()
    return sha if HEX40.fullmatch(sha) else None


def older_than(root: Path, head: str, commit: str) -> bool:
    """Whether the .git at `root` (HEAD `head`) predates `commit`: it does not know the commit
    (a copy that travelled with a .git from before it), or HEAD is its ancestor."""
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        return True
    return _git(root, "merge-base", "--is-ancestor", head, commit) is not None


def _paths(out: Optional[bytes]) -> list[str]:
    return [os.fsdecode(p) for p in (out or b"").split(b"\0") if p]


def head_blobs(root: Path) -> dict[str, str]:
    """path -> blob id of every file of HEAD."""
    out = {}
    for entry in _paths(_git(root, "ls-tree", "-r", "-z", "--full-tree", "HEAD")):
        meta, _, path = entry.partition("\t")
        _, kind, oid = meta.split()
        if kind == "blob":
            out[path] = oid
    return out


def listed_files(root: Path) -> list[str]:
    """What a copy takes: the tracked files still there and the untracked ones git does not ignore."""
    paths = _paths(_git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"))
    return sorted(
        {
            p
            for p in paths
            if p != STAMP and os.path.lexists(root / p) and (os.path.islink(root / p) or not (root / p).is_dir())
        }
    )


def differences(now: dict[str, Optional[str]], head_of) -> dict[str, Optional[str]]:
    """The paths whose blob now (None: gone) is not HEAD's (`head_of(path)`, None: not in HEAD)."""
    return {p: b for p, b in now.items() if b != head_of(p)}


def from_git(root: Path, head: str) -> TreeState:
    """The state of a checkout: the paths `git status` lists, compared with HEAD by content."""
    status = _git(
        root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", "--ignore-submodules"
    )
    if status is None:
        return TreeState(
            sha=head, source="git", note="git status failed: whether the tree was the commit's is not known"
        )
    listed = [e[3:] for e in _paths(status) if len(e) > 3 and not e.endswith("/") and e[3:] != STAMP]
    blobs = head_blobs(root)
    diff = differences({p: blob_id(root / p) for p in listed}, blobs.get)
    return TreeState(
        sha=head, dirty=bool(diff), diff_sha256=digest(diff), source="git", changed=tuple(sorted(diff)[:LISTED])
    )


# -- .gitignore rules, for a tree without .git -------------------------------------------


# -- the stamp ---------------------------------------------------------------------------


def make_stamp(root: Path) -> dict:
    """The stamp of a checkout as it is now (ValueError where `root` is no checkout's top level)."""
    root = Path(root).resolve()
    head = git_head(root)
    if head is None:
        raise ValueError(f"{root} is not the top level of a git checkout with a commit: nothing to stamp")
    files = {p: b for p in listed_files(root) if (b := blob_id(root / p)) is not None}
    blobs = head_blobs(root)
    diff = differences({**{p: None for p in blobs}, **files}, blobs.get)
    return {
        "format": FORMAT,
        "commit": head,
        "dirty": bool(diff),
        "git_diff_sha256": digest(diff),
        "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "files": files,
        "head": {p: blobs.get(p) for p in sorted(diff)},  # HEAD's blob where it is not the file's (None: untracked)
        "ignored": outermost_ignored(walk(root) - set(files), files),
    }


def write_stamp(root: Path) -> Path:
    """Write the stamp of the checkout `root` in place (root/STAMP, which git ignores)."""
    stamp = make_stamp(root)
    out = Path(root) / STAMP
    replace_text(out, json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    return out


def read_stamp(root: Path) -> tuple[Optional[dict], str]:
    """(the stamp at root, "") or (None, why not)."""
    path = Path(root) / STAMP
    if not path.is_file():
        return None, ""
    try:
        stamp = json.loads(path.read_text())
        assert stamp.get("format") == FORMAT and HEX40.fullmatch(stamp.get("commit", "")), "unknown format"
        assert isinstance(stamp.get("files"), dict) and isinstance(stamp.get("head"), dict)
    except (OSError, ValueError, AssertionError) as e:
        return None, f"{STAMP} unreadable ({type(e).__name__}: {e})"
    return stamp, ""


def from_stamp(root: Path, stamp: dict) -> TreeState:
    """The state of a tree from its stamp, checked against the files there now."""
    root = Path(root)
    files, head, ignored = stamp["files"], stamp["head"], stamp.get("ignored", [])
    now = {p: blob_id(root / p) for p in files}
    after = [p for p in files if now[p] != files[p]]
    skip = tuple(i for i in ignored if i.endswith("/"))  # not entered: a carried build may be large
    added = sorted(p for p in walk(root, skip) - set(files) if not known_ignored(p, ignored))
    now.update({p: blob_id(root / p) for p in added})
    now.update({p: None for p in head if p not in now})  # deleted at stamping and still gone
    diff = differences(now, lambda p: head[p] if p in head else files.get(p))
    after = sorted(after + added)
    note = f"stamp of {stamp.get('written', '?')}"
    if after:
        shown = ", ".join(after[:LISTED]) + (f" (+{len(after) - LISTED} more)" if len(after) > LISTED else "")
        note += f"; {counted(len(after), 'file')} changed, added or removed since: {shown}"
    return TreeState(
        sha=stamp["commit"],
        dirty=bool(diff),
        diff_sha256=digest(diff),
        source="stamp",
        note=note,
        changed=tuple(sorted(diff)[:LISTED]),
        after_stamp=tuple(after),
    )


def tree_state(root: Path, named: Optional[str] = None) -> TreeState:
    """The code at `root`: its .git, else its stamp; `named` (MOEBENCH_GIT_SHA) where neither
    says. A .git whose HEAD is not the stamp's commit yields to the stamp where its files still
    match the stamp, or where the .git predates the stamp's commit (a stale .git travelled with
    the copy: a file written after the stamp, e.g. a benchmark's output, is then dirt on top of
    the stamp's commit, not of the stale HEAD); a named commit that is not the .git's HEAD wins
    with the state unknown (older GPU copies carried a stale .git and no stamp)."""
    root = Path(root)
    named = (named or "").strip()
    named = "" if named.lower() == "unknown" else named  # a script's unset placeholder names nothing
    head = git_head(root)
    refused = "" if head else git_refusal(root)  # a .git git will not read is not "no .git"
    stamp, why = read_stamp(root)
    state = from_git(root, head) if head else None
    if stamp is not None and (state is None or stamp["commit"] != head):
        stamped = from_stamp(root, stamp)
        # (state is None whenever head is: the `head is None` tests only tell the type checker)
        if state is None or head is None or not stamped.after_stamp or older_than(root, head, stamp["commit"]):
            state = (
                stamped
                if state is None or head is None
                else replace(stamped, note=f"{stamped.note}; the .git here is at {head[:12]}, not the stamp's commit")
            )
        if refused and state is not None:
            state = replace(state, note=f"{state.note}; {refused}")
    if named:
        agrees = state is not None and re.fullmatch(r"[0-9a-f]{7,40}", named) and state.sha.startswith(named)
        if state is not None and state.source == "stamp" and not agrees:
            state = replace(state, note=f"{state.note}; MOEBENCH_GIT_SHA={named!r} is not the stamp's commit")
        elif not agrees:
            commit = named if re.fullmatch(r"[0-9a-f]{7,40}", named) else "unknown"
            where = f"the .git here is at {head[:12]}" if head else refused or "no .git or stamp here"
            state = TreeState(
                sha=commit,
                source="MOEBENCH_GIT_SHA",
                note=f"MOEBENCH_GIT_SHA={named!r}"
                + ("" if commit != "unknown" else " names no commit")
                + f"; {where}: whether the files were the commit's is not known",
            )
    if state is None and refused:
        state = TreeState(source=UNSAFE, note=f"{refused}: which code ran is not recorded")
    if state is None:
        state = TreeState(
            note=why or f"no .git and no {STAMP} here (scripts/copy_tree.sh writes one): which code ran is not recorded"
        )
    return state


def copy_tree(root: Path, dest: Path) -> dict:
    """Copy the checkout `root`'s files (listed_files) to the new or empty folder `dest` with
    their stamp; ValueError where a file changed during the copy, or `dest` would add files
    to the checkout itself."""
    root, dest = Path(root).resolve(), Path(dest).resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest} is not an empty folder: give a new or empty one")
    if dest.is_relative_to(root) and _git(root, "check-ignore", "-q", str(dest)) is None:
        raise ValueError(
            f"{dest} lies in the checkout and git does not ignore it: the copy would change "
            "the tree it stamps (use a folder git ignores, e.g. .gpu/tree, or one outside)"
        )
    stamp = make_stamp(root)
    for p in stamp["files"]:
        (dest / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / p, dest / p, follow_symlinks=False)
    replace_text(dest / STAMP, json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    moved = from_stamp(dest, stamp).after_stamp
    if moved:
        raise ValueError(
            f"{counted(len(moved), 'file')} changed during the copy ({', '.join(moved[:LISTED])}): copy again"
        )
    return stamp


def main(argv=None) -> int:
    p = OneLineErrors(prog="python -m moebench.run.treestate", description=__doc__.splitlines()[0])
    p.add_argument(
        "action",
        choices=("stamp", "copy", "show"),
        help="stamp: write ROOT/" + STAMP + "; copy DEST: "
        "the checkout's files to DEST with their stamp; show: the state env.json would record",
    )
    p.add_argument("dest", nargs="?", type=Path, help="copy: the new or empty folder to copy to")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the tree (default: the current folder)")
    args = p.parse_args(argv)
    if args.action == "show":
        print(json.dumps(tree_state(args.root, os.environ.get("MOEBENCH_GIT_SHA")).fields(), indent=2))
        return 0
    if (args.action == "copy") != (args.dest is not None):
        p.error("copy takes DEST, and only copy does")
    try:
        if args.action == "copy":
            stamp, where = copy_tree(args.root, args.dest), args.dest
        else:
            stamp, where = json.loads(write_stamp(args.root).read_text()), args.root / STAMP
    except ValueError as e:
        print(f"treestate: error: {e}", file=sys.stderr)
        return 2
    state = f"dirty (diff {stamp['git_diff_sha256'][:12]})" if stamp["dirty"] else "clean"
    print(f"{where}: {stamp['commit'][:12]} {state}, {len(stamp['files'])} files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
