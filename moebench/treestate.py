"""Which code ran: the commit a tree came from, whether its files differed from it, and a
digest of the difference, also where the tree was copied to a machine without its `.git`.

Two sources; the environment fingerprint (moebench/env.py) records what they say:

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

    python -m moebench.treestate copy DEST [--root DIR]   # scripts/copy_tree.sh DEST
    python -m moebench.treestate stamp [--root DIR]       # scripts/copy_tree.sh --stamp
    python -m moebench.treestate show [--root DIR]        # the state env.json would record

Standard library only: scripts/copy_tree.sh runs it without torch.
"""
from __future__ import annotations

import argparse
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

STAMP = ".moebench-tree.json"
FORMAT = 1
LISTED = 20  # paths named in a fingerprint; the digest covers them all
HEX40 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class TreeState:
    """What env.json records of the code that ran (`fields()`)."""

    sha: str = "unknown"  # the commit, 40 hex digits (7+ when only MOEBENCH_GIT_SHA names it), or "unknown"
    dirty: Optional[bool] = None  # None: whether the files were the commit's is not known
    diff_sha256: Optional[str] = None  # the difference's digest (module doc); None when clean or unknown
    source: str = "none"  # git | stamp | MOEBENCH_GIT_SHA | none
    note: str = ""
    changed: tuple[str, ...] = ()  # the first LISTED paths that differ from the commit
    after_stamp: tuple[str, ...] = ()  # stamp only: paths changed, added or removed since it

    def fields(self) -> dict:
        return {"git_sha": self.sha, "git_dirty": self.dirty, "git_diff_sha256": self.diff_sha256,
                "git_tree": self.source, "git_tree_note": self.note, "git_diff_paths": list(self.changed)}


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


def _git(root: Path, *args: str) -> Optional[bytes]:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


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
    return sorted({p for p in paths if p != STAMP and os.path.lexists(root / p)
                   and (os.path.islink(root / p) or not (root / p).is_dir())})


def differences(now: dict[str, Optional[str]], head_of) -> dict[str, Optional[str]]:
    """The paths whose blob now (None: gone) is not HEAD's (`head_of(path)`, None: not in HEAD)."""
    return {p: b for p, b in now.items() if b != head_of(p)}


def from_git(root: Path, head: str) -> TreeState:
    """The state of a checkout: the paths `git status` lists, compared with HEAD by content."""
    status = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
                  "--ignore-submodules")
    if status is None:
        return TreeState(sha=head, source="git", note="git status failed: whether the tree was the commit's is not known")
    listed = [e[3:] for e in _paths(status) if len(e) > 3 and not e.endswith("/") and e[3:] != STAMP]
    blobs = head_blobs(root)
    diff = differences({p: blob_id(root / p) for p in listed}, blobs.get)
    return TreeState(sha=head, dirty=bool(diff), diff_sha256=digest(diff), source="git",
                     changed=tuple(sorted(diff)[:LISTED]))


# -- .gitignore rules, for a tree without .git -------------------------------------------

def _glob_regex(pattern: str) -> str:
    """A gitignore glob as a regex: `*` and `?` stay within a path segment, `**` spans them."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2:]:
            j = pattern.index("]", i + 2)
            body = pattern[i + 1:j]
            out.append("[" + ("^" + body[1:] if body[:1] == "!" else body).replace("\\", "\\\\") + "]")
            i = j + 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Rule:
    base: str  # the folder of its .gitignore, "" at the root
    regex: re.Pattern
    anchored: bool  # matched against the path below `base`, else against the name alone
    dir_only: bool
    negate: bool


class IgnoreRules:
    """The .gitignore files met while walking a tree (parents first), gitignore's semantics:
    the last rule that matches decides; a folder ignored is not entered."""

    def __init__(self):
        self.rules: list[_Rule] = []

    def add(self, base: str, text: str) -> None:
        for line in text.splitlines():
            line = re.sub(r"(?<!\\)\s+$", "", line)
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            line = line[1:] if negate else line
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            line = line.lstrip("/")
            if line:
                self.rules.append(_Rule(base, re.compile(_glob_regex(line) + r"\Z"), anchored, dir_only, negate))

    def ignored(self, path: str, is_dir: bool) -> bool:
        verdict = False
        for r in self.rules:
            if r.base and not path.startswith(r.base + "/"):
                continue
            sub = path[len(r.base) + 1:] if r.base else path
            if (r.dir_only and not is_dir) or not r.regex.match(sub if r.anchored else sub.rsplit("/", 1)[-1]):
                continue
            verdict = not r.negate
        return verdict


def walk(root: Path, skip: tuple[str, ...] = ()) -> set[str]:
    """The files below `root` its .gitignore files do not ignore (`.git` and the folders in
    `skip`, "dir/", aside): what `git ls-files --others --exclude-standard` would list there
    with an empty index."""
    root, rules, out = Path(root), IgnoreRules(), set()
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root).as_posix()
        rel = "" if rel == "." else rel
        if ".gitignore" in files:
            rules.add(rel, (Path(folder) / ".gitignore").read_text(errors="replace"))
        keep = []
        for d in sorted(dirs):
            p = f"{rel}/{d}" if rel else d
            if d == ".git":
                continue
            if os.path.islink(Path(folder) / d):  # git keeps a link to a folder as a file
                files.append(d)
            elif p + "/" not in skip and not rules.ignored(p, True):
                keep.append(d)
        dirs[:] = keep
        for f in files:
            p = f"{rel}/{f}" if rel else f
            if f != ".git" and p != STAMP and not rules.ignored(p, False):
                out.add(p)
    return out


def _outermost(extra: set[str], kept: dict) -> list[str]:
    """Paths ignored by rules outside .gitignore (info/exclude, core.excludesFile), each as
    its outermost folder that holds no kept file ("dir/"), else the file itself."""
    held = {q.as_posix() for p in kept for q in Path(p).parents}
    out = set()
    for p in extra:
        cur = Path(p)
        while cur.parent != Path(".") and cur.parent.as_posix() not in held:
            cur = cur.parent
        out.add(cur.as_posix() + ("/" if cur.as_posix() != p else ""))
    return sorted(out)


def _known_ignored(path: str, ignored: list[str]) -> bool:
    return any(path == i or (i.endswith("/") and path.startswith(i)) for i in ignored)


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
        "format": FORMAT, "commit": head, "dirty": bool(diff), "git_diff_sha256": digest(diff),
        "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "files": files,
        "head": {p: blobs.get(p) for p in sorted(diff)},  # HEAD's blob where it is not the file's (None: untracked)
        "ignored": _outermost(walk(root) - set(files), files),
    }


def write_stamp(root: Path) -> Path:
    """Write the stamp of the checkout `root` in place (root/STAMP, which git ignores)."""
    stamp = make_stamp(root)
    out = Path(root) / STAMP
    out.write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
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
    added = sorted(p for p in walk(root, skip) - set(files) if not _known_ignored(p, ignored))
    now.update({p: blob_id(root / p) for p in added})
    now.update({p: None for p in head if p not in now})  # deleted at stamping and still gone
    diff = differences(now, lambda p: head[p] if p in head else files.get(p))
    after = sorted(after + added)
    note = f"stamp of {stamp.get('written', '?')}"
    if after:
        shown = ", ".join(after[:LISTED]) + (f" (+{len(after) - LISTED} more)" if len(after) > LISTED else "")
        note += f"; {len(after)} file(s) changed, added or removed since: {shown}"
    return TreeState(sha=stamp["commit"], dirty=bool(diff), diff_sha256=digest(diff), source="stamp", note=note,
                     changed=tuple(sorted(diff)[:LISTED]), after_stamp=tuple(after))


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
    stamp, why = read_stamp(root)
    state = from_git(root, head) if head else None
    if stamp is not None and (state is None or stamp["commit"] != head):
        stamped = from_stamp(root, stamp)
        if state is None or not stamped.after_stamp or older_than(root, head, stamp["commit"]):
            state = stamped if state is None else replace(stamped, note=f"{stamped.note}; the .git here is at "
                                                                        f"{head[:12]}, not the stamp's commit")
    if named:
        agrees = state is not None and re.fullmatch(r"[0-9a-f]{7,40}", named) and state.sha.startswith(named)
        if state is not None and state.source == "stamp" and not agrees:
            state = replace(state, note=f"{state.note}; MOEBENCH_GIT_SHA={named!r} is not the stamp's commit")
        elif not agrees:
            commit = named if re.fullmatch(r"[0-9a-f]{7,40}", named) else "unknown"
            where = f"the .git here is at {head[:12]}" if head else "no .git or stamp here"
            state = TreeState(sha=commit, source="MOEBENCH_GIT_SHA",
                              note=f"MOEBENCH_GIT_SHA={named!r}" + ("" if commit != "unknown" else " names no commit")
                              + f"; {where}: whether the files were the commit's is not known")
    if state is None:
        state = TreeState(note=why or f"no .git and no {STAMP} here (scripts/copy_tree.sh writes one): "
                                      "which code ran is not recorded")
    return state


def copy_tree(root: Path, dest: Path) -> dict:
    """Copy the checkout `root`'s files (listed_files) to the new or empty folder `dest` with
    their stamp; ValueError where a file changed during the copy, or `dest` would add files
    to the checkout itself."""
    root, dest = Path(root).resolve(), Path(dest).resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest} is not an empty folder: give a new or empty one")
    if dest.is_relative_to(root) and _git(root, "check-ignore", "-q", str(dest)) is None:
        raise ValueError(f"{dest} lies in the checkout and git does not ignore it: the copy would change "
                         "the tree it stamps (use a folder git ignores, e.g. .gpu/tree, or one outside)")
    stamp = make_stamp(root)
    for p in stamp["files"]:
        (dest / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / p, dest / p, follow_symlinks=False)
    (dest / STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    moved = from_stamp(dest, stamp).after_stamp
    if moved:
        raise ValueError(f"{len(moved)} file(s) changed during the copy ({', '.join(moved[:LISTED])}): copy again")
    return stamp


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m moebench.treestate", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("stamp", "copy", "show"), help="stamp: write ROOT/" + STAMP + "; copy DEST: "
                   "the checkout's files to DEST with their stamp; show: the state env.json would record")
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
