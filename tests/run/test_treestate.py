"""Which code ran, where the tree travels without .git (moebench/run/treestate.py,
scripts/copy_tree.sh): a real git repository of this checkout's code, copied by the script,
then the copy's own moebench asked for its fingerprint (`moebench env --json`, in a fresh
process whose code is the copy's), as a GPU machine's run would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from moebench.cli import ab
from moebench.report import results_index
from moebench.report.envinfo import env_summary, tree_label
from moebench.report.flags import run_notes
from moebench.run import treestate

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "copy_tree.sh"
CODE = ("moebench", "conf", "sweeps", "pyproject.toml", ".gitignore")  # what `moebench env` needs
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A fresh git repository holding this checkout's code, committed (a clean clone)."""
    for k, v in GIT_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("MOEBENCH_GIT_SHA", raising=False)
    repo = tmp_path / "repo"
    for rel in _git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard", *CODE).splitlines():
        if (ROOT / rel).is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, repo / rel)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return repo


def _copy(repo: Path, dest: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *(args or [str(dest)])], cwd=repo, capture_output=True, text=True)


def _env_json(tree: Path) -> dict:
    """`moebench env --json` of a tree's own code, run there (no MOEBENCH_GIT_SHA)."""
    env = {k: v for k, v in os.environ.items() if k != "MOEBENCH_GIT_SHA"}
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run(
        [sys.executable, "-m", "moebench.cli", "env", "--json"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)["env"]
    assert info["git_tree"] in ("stamp", "git", "none"), info
    return info


def _edit(path: Path) -> None:
    path.write_text(path.read_text() + "\n# an uncommitted line\n")


@pytest.mark.multiprocess
def test_a_copy_of_a_clean_clone_records_a_clean_tree(repo, tmp_path):
    dest = tmp_path / "copy"
    done = _copy(repo, dest)
    assert done.returncode == 0, done.stderr
    assert not (dest / ".git").exists() and (dest / treestate.STAMP).is_file()
    assert sorted(json.loads((dest / treestate.STAMP).read_text())["files"]) == treestate.listed_files(repo)
    info = _env_json(dest)
    assert info["git_sha"] == _git(repo, "rev-parse", "HEAD")
    assert info["git_dirty"] is False and info["git_tree"] == "stamp"
    assert info["git_diff_sha256"] is None and info["git_diff_paths"] == []
    assert tree_label(info) == "clean" and not run_notes(pd.DataFrame({"git_sha": [info["git_sha"]]}), info)


@pytest.mark.multiprocess
def test_a_copy_of_a_clone_with_an_uncommitted_change_records_dirty(repo, tmp_path):
    _edit(repo / "sweeps" / "default.yaml")
    (repo / "moebench" / "kernels" / "experts" / "mine.py").write_text(
        "# an untracked module: the registry would load it\n"
    )
    source = treestate.tree_state(repo)  # what git says of the clone
    assert source.source == "git" and source.dirty and source.diff_sha256
    dest = tmp_path / "copy"
    assert _copy(repo, dest).returncode == 0
    info = _env_json(dest)
    assert info["git_sha"] == _git(repo, "rev-parse", "HEAD") and info["git_dirty"] is True
    assert info["git_diff_sha256"] == source.diff_sha256  # one state, one digest, from git or the stamp
    assert info["git_diff_paths"] == ["moebench/kernels/experts/mine.py", "sweeps/default.yaml"]
    # the report says so: the run's notes, the environment line, the results index
    notes = run_notes(pd.DataFrame({"git_sha": [info["git_sha"]]}), info, "cand")
    assert any(
        n.startswith("cand: the tree was dirty") and "`sweeps/default.yaml`" in n and source.diff_sha256[:12] in n
        for n in notes
    ), notes
    assert "(dirty)" in env_summary(info)
    run = tmp_path / "results" / "q" / "run"
    run.mkdir(parents=True)
    (run / "env.json").write_text(json.dumps(info))
    assert results_index.read_run(tmp_path / "results", run, {}, "run").tree == "dirty"


@pytest.mark.multiprocess
def test_a_copy_edited_after_the_copy_records_dirty(repo, tmp_path):
    dest = tmp_path / "copy"
    assert _copy(repo, dest).returncode == 0
    _edit(dest / "conf" / "quant" / "bf16.yaml")
    info = _env_json(dest)
    assert info["git_sha"] == _git(repo, "rev-parse", "HEAD") and info["git_dirty"] is True
    assert info["git_diff_paths"] == ["conf/quant/bf16.yaml"]
    assert "1 file changed, added or removed since: conf/quant/bf16.yaml" in info["git_tree_note"]
    assert any("the tree was dirty" in n for n in run_notes(pd.DataFrame({"git_sha": [info["git_sha"]]}), info))


@pytest.mark.parametrize(
    "change, dirty",
    [
        ("edit", True),
        ("add", True),
        ("remove", True),
        ("add an ignored file", False),
        ("edit back", False),
    ],
)
def test_what_counts_as_a_change_after_the_copy(repo, tmp_path, change, dirty):
    dest = tmp_path / "copy"
    assert _copy(repo, dest).returncode == 0
    target = dest / "moebench" / "kernels" / "interfaces.py"
    if change == "edit":
        _edit(target)
    elif change == "add":
        (dest / "conf" / "experts" / "new.yaml").write_text("name: new\n")
    elif change == "remove":
        target.unlink()
    elif change == "add an ignored file":  # what running leaves: bytecode, a runs/ folder (.gitignore)
        (dest / "moebench" / "kernels" / "__pycache__").mkdir(exist_ok=True)
        (dest / "moebench" / "kernels" / "__pycache__" / "x.pyc").write_bytes(b"\0")
        (dest / "runs" / "r").mkdir(parents=True)
        (dest / "runs" / "r" / "env.json").write_text("{}")
    else:
        text = target.read_bytes()
        _edit(target)
        target.write_bytes(text)
    state = treestate.tree_state(dest)
    assert state.source == "stamp" and state.dirty is dirty and (state.diff_sha256 is None) is (not dirty)
    assert bool(state.after_stamp) is dirty  # bytes edited back are no change


def test_a_stamp_in_place_travels_with_a_copy_that_has_no_git(repo, tmp_path):
    """The GPU flow: stamp the checkout in place, then its working tree (the stamp carried with
    it) is copied without .git."""
    _edit(repo / "moebench" / "config" / "paths.py")
    (repo / ".git" / "info" / "exclude").write_text("/local/\n")  # ignored outside .gitignore: the stamp lists it
    (repo / "local" / "big").mkdir(parents=True)
    (repo / "local" / "big" / "lib.so").write_bytes(b"\0")
    assert _copy(repo, None, "--stamp").returncode == 0
    assert json.loads((repo / treestate.STAMP).read_text())["ignored"] == ["local/"]
    assert (repo / treestate.STAMP).is_file() and _git(repo, "status", "--porcelain") == "M moebench/config/paths.py"
    assert treestate.tree_state(repo).source == "git"  # the checkout itself still answers from .git
    dest = tmp_path / "device"
    shutil.copytree(repo, dest, ignore=shutil.ignore_patterns(".git"))
    got, want = treestate.tree_state(dest), treestate.tree_state(repo)
    assert (got.source, got.sha, got.dirty, got.diff_sha256) == ("stamp", want.sha, True, want.diff_sha256)
    assert got.after_stamp == () and want.changed == ("moebench/config/paths.py",)
    # a stale .git in the copy (another history) yields to the stamp its files still match
    _git(dest, "init", "-q")
    _git(dest, "commit", "-q", "--allow-empty", "-m", "other")
    stale = treestate.tree_state(dest)
    assert (stale.source, stale.sha, stale.diff_sha256) == ("stamp", want.sha, want.diff_sha256)
    assert "not the stamp's commit" in stale.note
    # a file written after the stamp (a benchmark's output) with that stale .git: still the stamp's
    # commit, dirty by the new file, not the stale HEAD with every change since counted as dirt
    (dest / "results").mkdir()
    (dest / "results" / "ceilings.json").write_text("{}\n")
    after = treestate.tree_state(dest)
    assert (after.source, after.sha, after.dirty) == ("stamp", want.sha, True)
    assert after.after_stamp == ("results/ceilings.json",)


def test_a_stale_git_that_knows_the_newer_commit_is_not_stale(repo, tmp_path):
    """A checkout whose stamp is older than its HEAD (stamped, then a commit): its .git answers."""
    assert _copy(repo, None, "--stamp").returncode == 0
    _edit(repo / "moebench" / "config" / "paths.py")
    _git(repo, "commit", "-qam", "later")
    (repo / "notes.txt").write_text("x\n")  # a change after the stamp
    state = treestate.tree_state(repo)
    assert (state.source, state.sha) == ("git", _git(repo, "rev-parse", "HEAD"))


def test_a_named_commit_where_nothing_else_says(repo, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(repo, bare, ignore=shutil.ignore_patterns(".git"))
    assert treestate.tree_state(bare).fields()["git_sha"] == "unknown"
    state = treestate.tree_state(bare, "2be9ad1")
    assert (state.sha, state.dirty, state.source) == ("2be9ad1", None, "MOEBENCH_GIT_SHA")
    assert treestate.tree_state(bare, "0936dc4+fold").sha == "unknown"  # free text names no commit
    assert tree_label(state.fields()) == "unknown"
    assert any("not recorded" in n for n in run_notes(pd.DataFrame({"git_sha": ["2be9ad1"]}), state.fields()))
    # a .git whose HEAD is not the named commit: the name wins, the state unknown
    assert treestate.tree_state(repo, "2be9ad1").fields()["git_dirty"] is None


def test_ab_worktrees_record_their_state(repo, tmp_path):
    """`moebench ab` names each worktree's commit in MOEBENCH_GIT_SHA: the worktree's own .git
    then gives the state."""
    sha = _git(repo, "rev-parse", "HEAD")
    tree = tmp_path / "wt"
    _git(repo, "worktree", "add", "-q", "--detach", str(tree), sha)
    code = "import json; from moebench.run.env import git_info; print(json.dumps(git_info()))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=ab.tree_env(tree, sha), capture_output=True, text=True, check=True
    )
    info = json.loads(done.stdout)
    assert (info["git_sha"], info["git_dirty"], info["git_tree"]) == (sha, False, "git")


def test_the_script_refuses_what_it_cannot_do(repo, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    for args, words in (
        ((), "usage"),
        ((str(full),), "not an empty folder"),
        ((str(repo / "sub"),), "git does not ignore it"),
    ):
        done = subprocess.run([str(SCRIPT), *args], cwd=repo, capture_output=True, text=True)
        assert done.returncode == 2 and words in done.stderr, (args, done.stderr)
    assert _copy(repo, repo / "runs" / "tree").returncode == 0  # a folder git ignores is fine
    assert subprocess.run([str(SCRIPT), "--stamp"], cwd=tmp_path, capture_output=True).returncode == 2  # no checkout


@pytest.mark.parametrize(
    "rules",
    [
        None,  # the repository's own .gitignore
        "*.log\n!keep.log\n/top/\nsub/deep/\n**/gen/**\ndocs/*.tmp\n\\#lit\nspace\\ \n",
    ],
)
def test_ignore_rules_agree_with_git(tmp_path, rules):
    """The walk that finds files added to a copy ignores what git ignores (a fresh repository:
    every file untracked, so `git ls-files --others --exclude-standard` lists exactly those)."""
    tree = tmp_path / "t"
    for rel in (
        "a.py",
        "x.log",
        "keep.log",
        "top/f",
        "a/top/f",
        "sub/deep/f",
        "sub/x/deep/f",
        "p/gen/q/f",
        "docs/a.tmp",
        "docs/b/a.tmp",
        "#lit",
        "space ",
        "runs/r",
        "a/runs/r",
        "__pycache__/c.pyc",
        "moebench.egg-info/PKG",
        "examples/p/build/f",
        "x/.lock",
        ".moebench-tree.json",
    ):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(rel)
    (tree / ".gitignore").write_text(rules if rules is not None else (ROOT / ".gitignore").read_text())
    (tree / "sub" / ".gitignore").write_text("*.py\n!/keep.py\n")
    for rel in ("sub/a.py", "sub/keep.py", "sub/y/keep.py"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(rel)
    _git(tree, "init", "-q")
    listed = set(_git(tree, "-c", "core.quotepath=off", "ls-files", "--others", "--exclude-standard").splitlines())
    assert treestate.walk(tree) == listed - {treestate.STAMP}


def _recording_git(tmp_path: Path, monkeypatch) -> Path:
    """A `git` first on PATH that logs each call's arguments and GIT_OPTIONAL_LOCKS, then runs the real git."""
    real, log = shutil.which("git"), tmp_path / "git-calls.log"
    fake = tmp_path / "fakebin" / "git"
    fake.parent.mkdir()
    fake.write_text(
        f'#!/bin/sh\nprintf "%s|%s\\n" "GIT_OPTIONAL_LOCKS=$GIT_OPTIONAL_LOCKS" "$*" >> {log}\nexec {real} "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    return log


def test_git_takes_no_optional_locks(repo, tmp_path, monkeypatch):
    """`git status` refreshes a stale index under `.git/index.lock` unless told not to; a `git
    commit` in the checkout meanwhile would fail on the lock (issue #52)."""
    log = _recording_git(tmp_path, monkeypatch)
    index = repo / ".git" / "index"
    st = (repo / "pyproject.toml").stat()
    os.utime(repo / "pyproject.toml", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # same bytes, new time
    before = index.stat().st_mtime_ns
    state = treestate.tree_state(repo)
    assert (state.source, state.dirty) == ("git", False)
    assert index.stat().st_mtime_ns == before  # the index was not rewritten: no lock was taken
    ab._git(repo, "rev-parse", "HEAD")
    calls = log.read_text().splitlines()
    assert len(calls) >= 4 and any(" status " in c for c in calls), calls
    assert all(c.startswith("GIT_OPTIONAL_LOCKS=0|--no-optional-locks ") for c in calls), calls


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_checkout_git_refuses_as_unsafe_is_recorded_as_such(repo, tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")  # no safe.directory but the test's (GIT_CONFIG_GLOBAL: none)
    stamped = tmp_path / "stamped"
    shutil.copytree(repo, stamped, symlinks=True)
    treestate.write_stamp(stamped)
    for tree in (repo, stamped):  # another user's checkout: git refuses it ("dubious ownership")
        for d, _, files in os.walk(tree):
            for name in [".", *files]:
                os.chown(os.path.join(d, name), 12345, 12345, follow_symlinks=False)
    state = treestate.tree_state(repo)
    assert (state.source, state.sha, state.dirty) == (treestate.UNSAFE, "unknown", None)
    assert "dubious ownership" in state.note and f"safe.directory {repo}" in state.note, state.note
    assert "no .git" not in state.note and "uid 12345" in state.note
    assert tree_label(state.fields()) == "unknown"
    # a stamp there still says which code ran; its note names the refusal
    state = treestate.tree_state(stamped)
    assert state.source == "stamp" and "refuses the checkout" in state.note, state.note
    named = treestate.tree_state(repo, "2be9ad1")
    assert named.source == "MOEBENCH_GIT_SHA" and "refuses the checkout" in named.note, named.note
    # trusted through safe.directory, it is read as any checkout
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "safe.directory")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", str(repo))
    assert treestate.tree_state(repo).source == "git"
