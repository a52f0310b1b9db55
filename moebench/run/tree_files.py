"""The files of a tree as git would list them without git: gitignore rules (IgnoreRules) and
a walk that applies them (run/treestate.py's stamp and its check after a copy)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

STAMP = ".moebench-tree.json"


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
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            j = pattern.index("]", i + 2)
            body = pattern[i + 1 : j]
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
            sub = path[len(r.base) + 1 :] if r.base else path
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


def outermost_ignored(extra: set[str], kept: dict) -> list[str]:
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


def known_ignored(path: str, ignored: list[str]) -> bool:
    return any(path == i or (i.endswith("/") and path.startswith(i)) for i in ignored)
