"""Which code a committed run measured, as results/README.md shows it: the commit and whether the
files were that commit's, per invocation, from the run's fingerprints (env.json and envs/*.json:
envinfo.env_commit and tree_label), corrected where the run's own record shows that a fingerprint
read a stale `.git` (a device's copy of the tree that carried an older `.git` beside the stamp of
the commit it ran, before moebench/run/treestate.py preferred the stamp):

- **a stamp's reading**: a fingerprint read from a tree stamp (`git_tree` "stamp") whose note names
  the `.git` beside it ("the .git here is at <sha>", treestate.tree_state) marks the fingerprints
  read from that `.git` (`git_tree` "git", that HEAD) in the same run as stale: the stamp's commit
  stands for them, and their clean / dirty state, computed against the stale HEAD, is unknown;
- **the caveats**: the run folder's own caveats.md stating ``Which code ran: commit `<sha>`, clean``
  (or dirty) settles both for every invocation of the run: where a person checked (a diff digest
  recomputed) what no fingerprint could say. Its text says how it was established.

The caveats win over the stamp's reading, which wins over the fingerprints as stored."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from moebench.report.envinfo import env_commit, tree_label

CAVEATS = "caveats.md"
# the caveat's statement, e.g. "- **Which code ran: commit `16c72ff`, clean.** The rows say ..."
DECLARED = re.compile(r"Which code ran: commit `([0-9a-f]{7,40})`, (clean|dirty)\b")
# treestate.tree_state's note where a stamp won over the .git beside it
STALE_GIT = re.compile(r"the \.git here is at ([0-9a-f]{7,40}), not the stamp's commit")


def declared(run_dir: Path) -> Optional[tuple[str, str]]:
    """(commit, "clean" | "dirty") the run folder's caveats.md states, or None; ValueError where
    it states two different ones."""
    p = Path(run_dir) / CAVEATS
    found = set(DECLARED.findall(p.read_text())) if p.is_file() else set()
    if len(found) > 1:
        raise ValueError(
            f"{p} states {len(found)} different commits for the code that ran "
            f"({', '.join(sorted(f'{c} {t}' for c, t in found))}): keep one"
        )
    return next(iter(found), None)


def _stale_heads(envs: list[dict]) -> dict[str, str]:
    """HEAD of a stale .git -> the commit of the stamp read beside it, from the stamp readings."""
    out = {}
    for e in envs:
        if isinstance(e, dict) and e.get("git_tree") == "stamp" and e.get("git_sha"):
            m = STALE_GIT.search(str(e.get("git_tree_note") or ""))
            if m and not str(e["git_sha"]).startswith(m.group(1)):
                out[m.group(1)] = str(e["git_sha"])
    return out


def invocations(envs: list[dict], run_dir: Optional[Path] = None) -> list[tuple[str, str]]:
    """(commit or "unknown", "clean" | "dirty" | "unknown") of each fingerprint, in order,
    corrected as the module says; the caveats of `run_dir` where given."""
    stated = declared(run_dir) if run_dir is not None else None
    if stated is not None:
        return [stated for _ in envs] or [stated]
    stale = _stale_heads(envs)
    out = []
    for e in envs:
        sha = str(env_commit(e)[0] or "unknown")
        head = next(
            (h for h in stale if isinstance(e, dict) and e.get("git_tree") == "git" and sha.startswith(h)), None
        )
        out.append((stale[head], "unknown") if head else (sha, tree_label(e)))
    return out


def tree(labels: list[str]) -> str:
    """A run's tree over its invocations: dirty if one was, clean only if every one was."""
    seen = set(labels) or {"unknown"}
    return "dirty" if "dirty" in seen else ("unknown" if "unknown" in seen else "clean")
