"""A symbolic link that leads to no file given as the run or trace itself: it loops, or its target is
missing. It was taken for a missing file: `ln -s run run; moebench report run` said "does not exist",
`moebench trace` "no such file or directory". Now report, compare, trace and tune --results say in one
line, exit 2, before any work, which link it is and what to do (moebench/results/store_read.py
broken_link; writable.LOOPS, DANGLING, LINK_ADVICE)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from moebench import cli
from moebench.results import writable
from moebench.results.synthetic import synthetic_run

LOOP_LINE = f": {writable.LOOPS}; remove the link"


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
