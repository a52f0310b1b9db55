#!/usr/bin/env python3
"""ruff and mypy over moebench/ and kernels/, against a baseline that only shrinks.

    python scripts/lint_baseline.py                  # CI: exit 1 on a (file, rule) count above the baseline
    python scripts/lint_baseline.py --update         # rewrite the baseline; refuses a count that grew
    python scripts/lint_baseline.py --update --allow-growth   # a moved file, a new ruff or mypy

The baseline (.ci/lint-baseline.json) holds, per file and rule ("ruff:E501", "mypy:arg-type"),
how many violations the code had when it was written: the code predates the linters, and
fixing them all at once would collide with every open branch. A count may fall (the script
says so; `--update` keeps it down), never rise. Files are keyed by their path, so a moved file
counts as new: move it, then `--update --allow-growth`, and the baseline's diff shows the move.

Every `# noqa` (and `# type: ignore`) in these folders names its codes and gives a reason
after them, e.g. `# noqa: F401 (re-exported for callers)`; one that does not is a NOQA-REASON
violation, which no baseline tolerates.

Exit status: 0 no count above the baseline; 1 a count above it (or `--update` refused);
2 bad arguments, no baseline, or ruff / mypy missing or failing.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tokenize
from collections import Counter
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("moebench", "kernels")
BASELINE = Path(".ci") / "lint-baseline.json"
TOOLS = ("ruff", "mypy", "noqa")
NOQA_REASON = "NOQA-REASON"  # never in a baseline: a suppression without its reason always fails
# mypy cannot follow package-dir's moebench.kernels -> kernels/: it checks this tree of links
# instead (moebench/* and moebench/kernels -> kernels/). Under .mypy_cache, which git ignores.
TREE = Path(".mypy_cache") / "moebench-tree"

# suppressions: noqa comments (bare, with codes, after a `ruff:` or `flake8:` file prefix), then
# type-ignore comments with their [codes]; a reason is a word after the codes
NOQA_RE = re.compile(r"#\s*(?:(?:ruff|flake8)\s*:\s*)?noqa(?![\w-])(?P<rest>.*)", re.IGNORECASE)
NOQA_CODES_RE = re.compile(r"\s*:\s*[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*")
IGNORE_RE = re.compile(r"#\s*type\s*:\s*ignore(?P<rest>.*)")
IGNORE_CODES_RE = re.compile(r"\s*\[[\w\-, ]+\]")
REASON_RE = re.compile(r"[A-Za-z]{3,}")  # a word, after the codes and any `-`, `(`, `:`


class Violation(NamedTuple):
    file: str  # relative to the root, '/'-separated
    line: int  # 1-based
    col: int  # 1-based
    rule: str  # "ruff:E501", "mypy:arg-type", NOQA_REASON
    message: str


class Usage(Exception):
    """Bad input or a tool that cannot run: one line, exit 2."""


def python_files(root: Path) -> list[Path]:
    return sorted(p for f in FOLDERS if (root / f).is_dir() for p in (root / f).rglob("*.py")
                  if "__pycache__" not in p.parts)


def _relative(root: Path, path: str) -> str:
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.relative_to(root.resolve())
        except ValueError:
            return p.as_posix()
    return p.as_posix()


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise Usage(f"{module} is not installed here: pip install -e '.[lint]'")


def ruff_violations(root: Path) -> list[Violation]:
    _need("ruff")
    cmd = [sys.executable, "-m", "ruff", "check", "--output-format", "json", "--exit-zero", *FOLDERS]
    p = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    try:
        found = json.loads(p.stdout)
    except json.JSONDecodeError:
        raise Usage(f"ruff failed (exit {p.returncode}): {(p.stderr.strip() or p.stdout.strip())[:500]}") from None
    return [Violation(_relative(root, v["filename"]), v["location"]["row"], v["location"]["column"],
                      f"ruff:{v['code'] or 'syntax-error'}", v["message"]) for v in found]


def _build_tree(root: Path) -> Path:
    """The tree of links mypy checks: <TREE>/moebench/X -> moebench/X, and moebench/kernels -> kernels/."""
    tree = root / TREE
    if tree.exists():
        shutil.rmtree(tree)  # links only: rmtree removes links, never what they point to
    pkg = tree / "moebench"
    pkg.mkdir(parents=True)
    for entry in sorted((root / "moebench").iterdir()):
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry.resolve())
    if (root / "kernels").is_dir() and not (pkg / "kernels").exists():
        (pkg / "kernels").symlink_to((root / "kernels").resolve())
    return pkg


def _from_tree(root: Path, path: str) -> str:
    """A path mypy reported, in the tree of links, as the repository's path."""
    parts = Path(_relative(root, os.path.normpath(path))).parts
    head = (*TREE.parts, "moebench")
    if parts[:len(head)] != head:
        return Path(*parts).as_posix()
    rest = parts[len(head):]
    return Path("kernels", *rest[1:]).as_posix() if rest[:1] == ("kernels",) else Path("moebench", *rest).as_posix()


def mypy_violations(root: Path) -> list[Violation]:
    _need("mypy")
    pkg = _build_tree(root)
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(root / "pyproject.toml"), "--output", "json",
           "--no-error-summary", str(pkg.relative_to(root))]
    p = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    out = []
    for line in p.stdout.splitlines():
        if not line.startswith("{"):
            continue
        v = json.loads(line)
        if v["severity"] == "error":
            out.append(Violation(_from_tree(root, v["file"]), v["line"], v["column"] + 1,
                                 f"mypy:{v['code'] or 'error'}", v["message"]))
    if p.returncode not in (0, 1) or (p.returncode == 1 and not out):
        raise Usage(f"mypy failed (exit {p.returncode}): {(p.stderr.strip() or p.stdout.strip())[:500]}")
    return out


def _missing_reason(comment: str) -> str | None:
    """What a suppression comment lacks, or None when it names its codes and a reason."""
    m = NOQA_RE.search(comment)
    if m:
        codes = NOQA_CODES_RE.match(m.group("rest"))
        if codes is None:
            return "a `# noqa` that names no codes (write `# noqa: CODE (reason)`)"
        what, rest = "# noqa", m.group("rest")[codes.end():]
    else:
        m = IGNORE_RE.search(comment)
        if m is None:
            return None
        codes = IGNORE_CODES_RE.match(m.group("rest"))
        what, rest = "# type: ignore", m.group("rest")[codes.end():] if codes else m.group("rest")
    if REASON_RE.search(rest) is None:
        return f"a `{what}` without a reason after its codes (e.g. `# noqa: F401 (re-exported for callers)`)"
    return None


def noqa_violations(root: Path) -> list[Violation]:
    """Suppressions without a reason, read from comments only (not from strings)."""
    out = []
    for path in python_files(root):
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline))
        except (SyntaxError, tokenize.TokenError, UnicodeDecodeError):
            continue  # ruff reports the file as a syntax error
        for tok in tokens:
            if tok.type == tokenize.COMMENT:
                why = _missing_reason(tok.string)
                if why:
                    out.append(Violation(_relative(root, str(path)), tok.start[0], tok.start[1] + 1, NOQA_REASON,
                                         why))
    return out


def count(violations: list[Violation]) -> dict[str, dict[str, int]]:
    """{file: {rule: number}}, sorted, without NOQA_REASON (which no baseline holds)."""
    c = Counter((v.file, v.rule) for v in violations if v.rule != NOQA_REASON)
    out: dict[str, dict[str, int]] = {}
    for (f, rule), n in sorted(c.items()):
        out.setdefault(f, {})[rule] = n
    return out


def grown(baseline: dict[str, dict[str, int]], violations: list[Violation]) -> list[tuple[str, str, int, int]]:
    """(file, rule, baseline count, count now) for every count above its baseline; NOQA_REASON always."""
    now = Counter((v.file, v.rule) for v in violations)
    return sorted((f, rule, 0 if rule == NOQA_REASON else baseline.get(f, {}).get(rule, 0), n)
                  for (f, rule), n in now.items()
                  if rule == NOQA_REASON or n > baseline.get(f, {}).get(rule, 0))


def shrunk(baseline: dict[str, dict[str, int]], violations: list[Violation]) -> int:
    """How many (file, rule) baseline counts the code is now below."""
    now = Counter((v.file, v.rule) for v in violations)
    return sum(1 for f, rules in baseline.items() for rule, n in rules.items() if now.get((f, rule), 0) < n)


def versions() -> dict[str, str]:
    out = {}
    for tool in ("ruff", "mypy"):
        try:
            out[tool] = importlib.metadata.version(tool)
        except importlib.metadata.PackageNotFoundError:
            out[tool] = "absent"
    return out


def read_baseline(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Usage(f"no baseline at {path}: create it with `python scripts/lint_baseline.py --update "
                    "--allow-growth`") from None
    except json.JSONDecodeError as e:
        raise Usage(f"{path} is not JSON ({e}): resolve its merge conflict, then `--update`") from None
    if not isinstance(data.get("counts"), dict):
        raise Usage(f"{path} has no 'counts' mapping")
    return data


def write_baseline(path: Path, counts: dict[str, dict[str, int]]) -> None:
    data = {
        "about": "scripts/lint_baseline.py: violations per file and rule that CI tolerates, only ever fewer; "
                 "regenerate with `python scripts/lint_baseline.py --update`",
        "versions": versions(),
        "counts": counts,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _report(rows: list[tuple[str, str, int, int]], violations: list[Violation], out) -> None:
    by: dict[tuple[str, str], list[Violation]] = {}
    for v in violations:
        by.setdefault((v.file, v.rule), []).append(v)
    for f, rule, old, new in rows:
        print(f"  {f} {rule}: {old} -> {new}", file=out)
        for v in sorted(by[(f, rule)]):
            print(f"    {v.file}:{v.line}:{v.col}: {v.message}", file=out)


def _totals(violations: list[Violation]) -> str:
    per = Counter(v.rule.split(":")[0] for v in violations if v.rule != NOQA_REASON)
    return ", ".join(f"{tool} {per.get(tool, 0)}" for tool in ("ruff", "mypy"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--update", action="store_true", help="rewrite the baseline from the code as it is")
    ap.add_argument("--allow-growth", action="store_true", help="let --update raise a count")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this script's)")
    ap.add_argument("--baseline", type=Path, help=f"default: ROOT/{BASELINE.as_posix()}")
    ap.add_argument("--tools", default=",".join(TOOLS),
                    help="comma list of ruff, mypy, noqa (default: all; --update needs all)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    path = args.baseline or root / BASELINE
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    try:
        if not tools or set(tools) - set(TOOLS):
            raise Usage(f"--tools takes a comma list of {', '.join(TOOLS)}, not {args.tools!r}")
        if args.update and set(tools) != set(TOOLS):
            raise Usage("--update runs every tool: leave out --tools")
        baseline = {} if args.update and not path.exists() else read_baseline(path)
        counts_before = baseline.get("counts", {})
        # a baseline of ruff only compares ruff's rules: the others' entries are not this run's
        counts_before = {f: {r: n for r, n in rules.items() if r.split(":")[0] in tools}
                         for f, rules in counts_before.items()}
        violations = []
        for tool, run in (("ruff", ruff_violations), ("mypy", mypy_violations), ("noqa", noqa_violations)):
            if tool in tools:
                violations += run(root)
    except Usage as e:
        print(f"lint_baseline: {e}", file=sys.stderr)
        return 2
    old_versions = baseline.get("versions", {})
    for tool, v in versions().items():
        if tool in tools and old_versions.get(tool, v) != v:
            print(f"lint_baseline: the baseline counts {tool} {old_versions[tool]}'s findings, this is {tool} {v}: "
                  "a difference may be the tool's (pip install -e '.[lint]' takes the pinned one)", file=sys.stderr)
    up = grown(counts_before, violations)
    noqa = [r for r in up if r[1] == NOQA_REASON]
    if args.update:
        if noqa or (up and not args.allow_growth):
            up = noqa or up
            print(f"lint_baseline: not updated: {len(up)} (file, rule) count(s) above the baseline"
                  + (" (a NOQA-REASON is never baselined: give the comment its reason)" if noqa else
                     " (--allow-growth takes them, for a moved file or a new tool version)") + ":", file=sys.stderr)
            _report(up, violations, sys.stderr)
            return 1
        write_baseline(path, count(violations))
        print(f"lint_baseline: wrote {path} ({_totals(violations)})")
        return 0
    if up:
        print(f"lint_baseline: {len(up)} (file, rule) count(s) above the baseline ({path.name}):", file=sys.stderr)
        _report(up, violations, sys.stderr)
        print("fix them; a deliberate one takes `# noqa: CODE (reason)` or `# type: ignore[code]  # reason`",
              file=sys.stderr)
        return 1
    fewer = shrunk(counts_before, violations)
    print(f"lint_baseline: no new violation; {len(violations)} known remain ({_totals(violations)})"
          + (f"; {fewer} count(s) fell below the baseline: `python scripts/lint_baseline.py --update` keeps them down"
             if fewer else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
