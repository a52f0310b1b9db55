"""Every suppression names its codes and says why: a `# noqa: CODE (reason)` or a
`# type: ignore[code]  # reason` (docs/design.md, "Lint and types"). ruff's PGH004 refuses a
blanket noqa and RUF100 a stale one; neither asks for the reason, which this test does, over
every Python file of the repository that ruff checks."""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# suppressions: noqa comments (bare, with codes, after a `ruff:` or `flake8:` file prefix), then
# type-ignore comments with their [codes]; a reason is a word after the codes
NOQA_RE = re.compile(r"#\s*(?:(?:ruff|flake8)\s*:\s*)?noqa(?![\w-])(?P<rest>.*)", re.IGNORECASE)
NOQA_CODES_RE = re.compile(r"\s*:\s*[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*")
IGNORE_RE = re.compile(r"#\s*type\s*:\s*ignore(?P<rest>.*)")
IGNORE_CODES_RE = re.compile(r"\s*\[[\w\-, ]+\]")
REASON_RE = re.compile(r"[A-Za-z]{3,}")  # a word, after the codes and any `-`, `(`, `:`


def missing_reason(comment: str) -> str | None:
    """What a suppression comment lacks, or None when it names its codes and a reason."""
    m = NOQA_RE.search(comment)
    if m:
        codes = NOQA_CODES_RE.match(m.group("rest"))
        if codes is None:
            return "a `# noqa` that names no codes (write `# noqa: CODE (reason)`)"
        what, rest = "# noqa", m.group("rest")[codes.end() :]
    else:
        m = IGNORE_RE.search(comment)
        if m is None:
            return None
        codes = IGNORE_CODES_RE.match(m.group("rest"))
        what, rest = "# type: ignore", m.group("rest")[codes.end() :] if codes else m.group("rest")
    if REASON_RE.search(rest) is None:
        return f"a `{what}` without a reason after its codes (e.g. `# noqa: F401 (re-exported for callers)`)"
    return None


def violations(text: str) -> list[tuple[int, str]]:
    """(line, what is missing) of each suppression without a reason; comments only, not strings."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and (why := missing_reason(tok.string)):
            out.append((tok.start[0], why))
    return out


def python_files() -> list[Path]:
    """The tracked and untracked-but-not-ignored .py files: what `ruff check .` reads."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # ruff's own default excludes: a virtual environment inside the checkout is not the repository's code
    skip = {".venv", "venv", ".git", ".tox", ".nox", "build", "dist", "site-packages", "node_modules", "__pypackages__"}
    return [ROOT / p for p in listed if (ROOT / p).is_file() and not skip & set(Path(p).parts)]


def test_a_noqa_or_type_ignore_without_reason_is_found():
    text = (
        "import os  # noqa: F401\n"  # 1: codes, no reason
        "import sys  # noqa\n"  # 2: blanket
        "import re  # noqa: F401 (re-exported for callers)\n"
        "import json  # noqa: E402,F401 - kept for callers\n"
        "x = '# noqa: F401'  # a string is no comment\n"
        "y: int = ''  # type: ignore[assignment]\n"  # 6: code, no reason
        "z: int = ''  # type: ignore[assignment]  # a stub's mistake\n"
        "w = 1  # ruff: noqa: E501\n"  # 8
    )
    found = violations(text)
    assert [line for line, _ in found] == [1, 2, 6, 8]
    assert "names no codes" in found[1][1]


def test_every_suppression_here_gives_its_reason():
    files = python_files()
    assert len(files) > 300, len(files)
    bad = [f"{p.relative_to(ROOT)}:{line}: {why}" for p in files for line, why in violations(p.read_text())]
    assert not bad, "\n".join(bad)
