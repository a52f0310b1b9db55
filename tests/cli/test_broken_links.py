"""A symbolic link that leads to no file, given as the run or trace itself or standing among a run's own
names (env.json, rows/, envs/, a row file, skipped.parquet): it loops, or its target is missing. Each was
taken for a missing file: `ln -s run run; moebench report run` said "does not exist", `moebench trace`
"no such file or directory"; a looping env.json read as no fingerprint, a looping rows/ as "no results",
a dangling row file as a torn one (which the next sweep set aside, measuring its rows again). Now every
command that reads a run (report, compare, trace, tune --results) and a sweep into it says in one line,
exit 2, before any work, which link it is and what to do (moebench/results/store_read.py broken_link;
writable.LOOPS, DANGLING, LINK_ADVICE)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from one_combination import ONE_TINY

from moebench import cli
from moebench.results import writable
from moebench.results.store import RunStore
from moebench.results.synthetic import synthetic_run

LOOP_LINE = f": {writable.LOOPS}; remove the link"
# one combination (the plan's rows are none of the synthetic run's: nothing is refused for that)
SWEEP = [*ONE_TINY, "runner.memory=false"]


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.fixture(scope="module")
def a_run(tmp_path_factory) -> Path:
    run = synthetic_run(tmp_path_factory.mktemp("made") / "run")
    (run / "envs").mkdir()
    shutil.copy(run / "env.json", run / "envs" / "0123456789.json")
    return run


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if "%|" not in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _dangling_line(link: Path) -> str:
    return f"{link}: {writable.DANGLING} ({os.readlink(link)}); restore the target or remove the link"


def _argv(cmd: str, target: Path, tmp_path: Path) -> list[str]:
    other = tmp_path / "other"
    return {
        "report": ["report", str(target)],
        "compare": ["compare", str(other), str(target), "--out", str(tmp_path / "cmp")],
        "trace": ["trace", str(target)],
        "tune": ["tune", "--results", str(target), "--out", str(tmp_path / "best")],
    }[cmd]


@pytest.mark.parametrize("cmd", ["report", "compare", "trace", "tune"])
def test_a_looping_link_given_as_the_run_is_named_as_the_loop(cmd, tmp_path, capsys, a_run):
    shutil.copytree(a_run, tmp_path / "other")
    for link in (tmp_path / "selfrun", tmp_path / "self.json"):
        link.symlink_to(link.name)
        assert cli.main(_argv(cmd, link, tmp_path)) == 2
        line = _one_line(capsys)
        assert line == f"moebench {cmd}: environment error: {link}{LOOP_LINE}", line
    # below a looping link: the link named, not "does not exist"
    assert cli.main(_argv(cmd, tmp_path / "selfrun" / "rows", tmp_path)) == 2
    assert _one_line(capsys).endswith(f"{tmp_path / 'selfrun'}{LOOP_LINE}")
    dangling = tmp_path / "gone"
    dangling.symlink_to("nowhere")
    assert cli.main(_argv(cmd, dangling, tmp_path)) == 2
    assert _one_line(capsys) == f"moebench {cmd}: environment error: {_dangling_line(dangling)}"
    assert not (tmp_path / "other" / "report").exists() and not (tmp_path / "cmp").exists()


NAMES = ["env.json", "rows", "envs", "rows/x.parquet", "rows/skipped.parquet", "envs/a.json"]


def _break(run: Path, name: str, how: str) -> Path:
    """The run's `name` made a link that loops (`how` loop) or leads to a missing file (dangling);
    a folder or file it replaces is kept beside it (nothing of the run is lost by the test)."""
    link = run / name
    if link.exists():
        link.rename(link.with_name(link.name + ".kept"))
    link.symlink_to(link.name if how == "loop" else "missing" + link.suffix)
    return link


@pytest.mark.parametrize("how", ["loop", "dangling"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("cmd", ["report", "compare", "trace", "tune"])
def test_a_broken_link_among_a_runs_names_is_refused_before_any_work(cmd, name, how, tmp_path, capsys, a_run):
    shutil.copytree(a_run, tmp_path / "other")
    run = tmp_path / "run"
    shutil.copytree(a_run, run)
    link = _break(run, name, how)
    assert cli.main(_argv(cmd, run, tmp_path)) == 2
    line = _one_line(capsys)
    said = f"{link}{LOOP_LINE}" if how == "loop" else _dangling_line(link)
    assert line == f"moebench {cmd}: environment error: {said}", line
    assert not (run / "report").exists() and not (tmp_path / "cmp").exists() and not (tmp_path / "best").exists()


@pytest.mark.parametrize("how", ["loop", "dangling"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_sweep_into_a_run_with_a_broken_link_refuses_and_keeps_its_rows(name, how, dry_run, tmp_path, capsys, a_run):
    run = tmp_path / "run"
    shutil.copytree(a_run, run)
    link = _break(run, name, how)
    before = _files(run)
    assert cli.main(["sweep", *SWEEP, "--out", str(run), *(["--dry-run"] if dry_run else [])]) == 2
    line = _one_line(capsys)
    said = f"{link}{LOOP_LINE}" if how == "loop" else _dangling_line(link)
    assert line == f"moebench sweep: environment error: {said}; nothing was measured", line
    # nothing set aside, rewritten, removed or added but the lock a sweep takes
    after = _files(run)
    assert {k: v for k, v in after.items() if k != ".lock"} == before, (before, after)
    assert link.is_symlink() and not (run / "rows" / ".corrupt").exists()


def _files(run: Path) -> dict[str, object]:
    """Each name below `run` -> a link's target, or a file's bytes (a folder: None)."""
    return {
        str(p.relative_to(run)): os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else None)
        for p in run.rglob("*")
    }


def test_broken_link_tells_a_loop_from_a_missing_target_and_passes_a_good_link(tmp_path):
    from moebench.results.store_read import broken_link

    target = tmp_path / "target.parquet"
    target.write_bytes(b"x")
    good, loop, gone, below = (tmp_path / n for n in ("good", "loop", "gone", "below"))
    good.symlink_to(target)
    loop.symlink_to(loop.name)
    gone.symlink_to("missing.parquet")
    below.symlink_to(f"{target.name}/x")  # below a file: as missing as any
    assert broken_link(good) is None and broken_link(target) is None and broken_link(tmp_path / "none") is None
    assert (broken_link(loop).errno, broken_link(loop).filename) == (errno.ELOOP, str(loop))
    for link in (gone, below):
        assert broken_link(link).errno == errno.ENOENT
        assert writable.describe(broken_link(link)) == f"{link}: {writable.DANGLING} ({os.readlink(link)})"
    # a missing file that is no link is no environment error (its reader says what it is)
    assert writable.describe(FileNotFoundError(errno.ENOENT, "x", str(tmp_path / "none"))) is None


def test_a_row_file_linked_to_a_file_elsewhere_is_read(tmp_path, capsys, a_run):
    run = tmp_path / "run"
    shutil.copytree(a_run, run)
    first = sorted((run / "rows").glob("*.parquet"))[0]
    first.rename(tmp_path / first.name)
    first.symlink_to(tmp_path / first.name)
    assert len(RunStore(run).load()) == len(RunStore(a_run).load())
    assert cli.main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0


@pytest.mark.parametrize("kind", ["loops", "dangles"])
@pytest.mark.parametrize(
    "argv", [["sweep", *SWEEP, "--out"], ["sweep", "--dry-run", *SWEEP, "--out"], ["trace", "--import"]]
)
def test_a_broken_link_as_out_or_import_target_is_said_so(argv, kind, tmp_path, capsys):
    """`--out` a link that loops said "not a directory (a file stands where a folder must be)", and
    `trace --import` of one "no such file or directory": each now names the link and what to do,
    exit 2, nothing made through it."""
    link = tmp_path / "link"
    os.symlink(link.name if kind == "loops" else "nowhere", link)
    assert cli.main([*argv, str(link)]) == 2
    line = _one_line(capsys)
    want = LOOP_LINE if kind == "loops" else f": {writable.DANGLING} (nowhere); restore the target or remove the link"
    assert f"{link}{want}" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"] and os.readlink(link) in ("link", "nowhere")
