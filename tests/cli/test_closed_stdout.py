"""A command whose stdout's reader has gone (`moebench compare ... | head -3`) ran into BrokenPipeError:
a traceback, and compare's and report's exit 3 ('no verdict on the runs'), list's and env's 1, where the
report had been written. moebench/cli/main.py discards the rest of the output instead: no traceback,
nothing said of it, and the status the command gives anyway (a CI gate piping compare into head reads
its verdict)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moebench import cli
from moebench.results.synthetic import synthetic_run

ROOT = Path(__file__).resolve().parents[2]


def _piped(argv: list[str], tmp_path: Path, read_first_line: bool) -> tuple[int, str]:
    """(exit status, stderr) of `python -m moebench ARGV` (the console script) whose stdout is a pipe
    the reader closes: after the first line it reads (head's way, which the command may outrun when its
    output fits the pipe), or before the command writes anything (so that every write meets the closed
    pipe, whatever the timing)."""
    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        if read_first_line:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moebench", *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr
            )
            assert proc.stdout is not None
            proc.stdout.readline()
            proc.stdout.close()
        else:
            read, write = os.pipe()
            os.close(read)
            proc = subprocess.Popen([sys.executable, "-m", "moebench", *argv], cwd=ROOT, stdout=write, stderr=stderr)
            os.close(write)
        rc = proc.wait(timeout=300)
    return rc, err.read_text()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return synthetic_run(base / "base"), synthetic_run(base / "same"), synthetic_run(base / "slower", scale=3.0)


@pytest.mark.multiprocess  # moebench in a subprocess, its stdout a pipe
@pytest.mark.parametrize(
    "case, status, read_first_line",
    [
        ("list", 0, False),
        ("report", 0, False),
        ("compare_clean", 0, False),
        ("compare_slower", 1, False),
        ("compare_slower", 1, True),
        ("help", 0, False),
    ],
)
def test_a_closed_stdout_ends_the_command_with_its_own_status_and_no_traceback(
    case, status, read_first_line, runs, tmp_path
):
    base, same, slower = runs
    argv = {
        "list": ["list"],
        "report": ["report", str(base), "--out", str(tmp_path / "rep")],
        "compare_clean": ["compare", str(base), str(same), "--out", str(tmp_path / "rep")],
        "compare_slower": ["compare", str(base), str(slower), "--out", str(tmp_path / "rep")],
        "help": ["sweep", "--help"],
    }[case]
    rc, err = _piped(argv, tmp_path, read_first_line)
    assert rc == status, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Broken pipe" not in err, err
    assert "exit 3" not in err and "Exception ignored" not in err, err
    if case != "list" and case != "help":
        assert (tmp_path / "rep" / "report.md").is_file()  # the report written all the same


def test_output_after_the_reader_went_is_discarded_in_process(runs, tmp_path, capsys, monkeypatch):
    """The same in process: a stdout whose every write raises BrokenPipeError (no file under it to put
    devnull on) costs compare nothing; sys.stdout is the caller's again afterwards."""
    base, _, slower = runs

    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            raise OSError("no file")

    gone = Gone()
    monkeypatch.setattr(sys, "stdout", gone)
    assert cli.main(["compare", str(base), str(slower), "--out", str(tmp_path / "rep")]) == 1
    assert sys.stdout is gone
    err = capsys.readouterr().err
    assert "Traceback" not in err and "exit 1: " in err


@pytest.mark.multiprocess  # moebench in a subprocess, its stderr a pipe
@pytest.mark.parametrize("both", [False, True])
def test_a_closed_stderr_ends_a_clean_compare_with_0(both, runs, tmp_path):
    """stderr's reader gone (`moebench compare A B 2>&1 | head`, or stderr alone a closed pipe): the
    line saying where the report went met BrokenPipeError, `_no_result`'s own line failed too, and
    Python exited 1, read by a CI gate as "slower". The clean comparison exits 0 all the same."""
    base, same, _ = runs
    out = tmp_path / "stdout.txt"
    read, write = os.pipe()
    os.close(read)  # closed before the command writes anything, whatever the timing
    argv = ["compare", str(base), str(same), "--out", str(tmp_path / "rep")]
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moebench", *argv], cwd=ROOT, stdout=write if both else stdout, stderr=write
        )
        os.close(write)
        rc = proc.wait(timeout=300)
    assert rc == 0, out.read_text()
    assert (tmp_path / "rep" / "report.md").is_file()
