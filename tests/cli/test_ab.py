"""moebench ab on the CPU: two commits of a small repository (this checkout's code, then a
trivial change), one tiny combination run by each commit's own worktree, then compared."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from one_combination import ONE_TINY

from moebench import cli

ROOT = Path(__file__).resolve().parents[2]
CODE = ("moebench", "kernels", "conf", "sweeps", "pyproject.toml")  # what a sweep needs of the checkout
TINY = [*ONE_TINY, "runner.device=cpu"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _code_files() -> list[str]:
    """CODE's files: git's list in a checkout, else (an unpacked archive of it) every file
    under CODE but Python's caches."""
    if (ROOT / ".git").exists():
        return _git(ROOT, "ls-files", *CODE).splitlines()
    out = []
    for name in CODE:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        out += [str(f.relative_to(ROOT)) for f in files if "__pycache__" not in f.parts and f.suffix != ".pyc"]
    return out


@pytest.fixture
def two_commits(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    for k, v in {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }.items():
        monkeypatch.setenv(k, v)
    repo = tmp_path / "repo"
    repo.mkdir()
    tracked = _code_files()
    for rel in tracked:
        dst = repo / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    init = repo / "moebench" / "__init__.py"
    # the candidate: a trivial change that shows in its env.json (the fingerprint keeps MOEBENCH_* variables)
    init.write_text(init.read_text() + '\nimport os as _os\n_os.environ.setdefault("MOEBENCH_AB_MARK", "cand")\n')
    _git(repo, "commit", "-qam", "candidate")
    return repo, base, _git(repo, "rev-parse", "HEAD")


@pytest.mark.multiprocess
def test_ab_runs_both_commits_alternately_and_compares(two_commits, tmp_path, capsys):
    repo, base, cand = two_commits
    out = tmp_path / "ab"
    code = cli.main(["ab", base, cand, *TINY, "--repo", str(repo), "--out", str(out), "--format", "json"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err  # 1 only if three CPU samples happen to differ past the threshold
    doc = json.loads(captured.out)
    assert doc["verdict"]["baseline"] == base and doc["verdict"]["candidate"] == cand
    assert doc["verdict"]["rows_ok_on_both_sides"] == 1 and doc["verdict"]["environments_comparable"]
    for side, sha in (("base", base), ("cand", cand)):
        assert list((out / side / "rows").glob("*.parquet")), side
        env = json.loads((out / side / "env.json").read_text())
        assert env["git_sha"] == sha  # each tree's own commit ...
        assert env["env"].get("MOEBENCH_AB_MARK") == ("cand" if side == "cand" else None)  # ... and its own code
    assert (out / "report" / "report.md").read_text().startswith(f"# moebench compare: {cand} vs {base}")
    # alternately: base, then cand, for the one combination
    order = [
        line.split("] ")[1].split(":")[0] for line in captured.err.splitlines() if line.startswith("moebench ab: [")
    ]
    assert order == ["base", "cand"]
    assert not (out / "src" / "base").exists() and _git(repo, "worktree", "list").count("\n") == 0


def test_ab_refuses_an_unknown_revision(two_commits, tmp_path, capsys):
    repo, base, _ = two_commits
    assert cli.main(["ab", base, "no-such-branch", *TINY, "--repo", str(repo), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "'no-such-branch' names no commit" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["sweep", "list"])
def test_a_revision_whose_moebench_fails_stops_ab_as_no_result(command, tmp_path):
    """A worktree's sweep or list that exits 3 (its moebench or the machine failed, not a kernel):
    ab stops there, its own 3 (main.py), not a comparison of what the crash left ("broken", "empty": 1)
    nor bad input (2)."""
    from moebench.cli import ab

    tree = tmp_path / "cand"
    (tree / "moebench" / "cli").mkdir(parents=True)
    (tree / "moebench" / "__init__.py").write_text("")
    (tree / "moebench" / "cli" / "__init__.py").write_text("")
    crash = "print('moebench sweep: failed (RuntimeError: a defect); exit 3: ...', file=sys.stderr)"
    (tree / "moebench" / "cli" / "__main__.py").write_text(f"import sys\n{crash}\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match=rf"cand \(0123456789\): moebench {command} failed \(exit 3, moebench or "):
        ab._moebench(tree, "0123456789" * 4, [command], capture=command == "list")


def test_revisions_whose_rows_never_pair_are_a_broken_comparison_not_bad_input(monkeypatch, tmp_path, capsys):
    """Both revisions were measured when their rows turn out not to pair (the candidate changed the
    combination): ab exits 1 saying so, not 2, which promises nothing ran."""
    import argparse

    from moebench.cli import ab, report
    from moebench.report.overlap import NoPairs

    def no_pairs(*a, **k):
        raise NoPairs("the runs share no value of reduction only (finalize vs experts)")

    monkeypatch.setattr(report, "compare_command", no_pairs)
    args = argparse.Namespace(
        base_rev="HEAD~1", cand_rev="HEAD", threshold=1.05, format="md", fail_on="slower", cpu_verdict=False
    )
    assert ab._compared(args, tmp_path) == 1
    err = capsys.readouterr().err
    assert err.startswith("moebench ab: no row of HEAD pairs with one of HEAD~1: the runs share no value")
