"""A report of a run that a writer holds (its `.lock`, results/lock.py) says so in report.md near its
top, not only on stderr: a committed report of a partial run tells its reader it is partial."""

from __future__ import annotations

import json
import socket

import pandas as pd

from moebench import cli
from moebench.report import load
from moebench.report.mdsafe import md_code
from moebench.results.lock import LOCK_FILE
from moebench.results.synthetic import make_row, make_rows, write_run

COMMAND = "moebench sweep --out r"
SINCE = "2024-01-01T00:00:00+00:00"


def _held_here(monkeypatch, command: str = COMMAND) -> dict:
    """A live holder on this host (another process's pid), as holder_now reads it."""
    holder = {"pid": 4242, "start": "1", "host": socket.gethostname(), "since": SINCE, "command": command}
    monkeypatch.setattr(load, "holder_now", lambda run_dir: holder)
    return holder


def _top(text: str, blocks: int = 3) -> str:
    """The report's first blocks: the title and what follows it."""
    return "\n\n".join(text.split("\n\n")[:blocks])


def test_report_md_of_a_run_being_written_says_so_near_the_top(tmp_path, monkeypatch, capsys):
    rows = make_rows()
    run, rep = write_run(tmp_path / "run", rows), tmp_path / "rep"
    _held_here(monkeypatch)
    assert cli.main(["report", str(run), "--out", str(rep), "--format", "json"]) == 0
    assert "is still being written by" in capsys.readouterr().err  # stderr, as before
    text = (rep / "report.md").read_text()
    want = (
        f"the run was being written by `{COMMAND}` (pid 4242 on {socket.gethostname()} since {SINCE}) "
        f"when this report was made: {len(rows)} rows read"
    )
    assert want in _top(text), _top(text)
    assert [want in line for line in json.loads((rep / "report.json").read_text())["being_written"]] == [True]


def test_a_finished_run_s_report_says_nothing_of_it(tmp_path, capsys):
    run, rep = write_run(tmp_path / "run", make_rows()), tmp_path / "rep"
    assert cli.main(["report", str(run), "--out", str(rep), "--format", "json"]) == 0
    text = (rep / "report.md").read_text()
    assert "being written" not in text and "partial" not in text.lower()
    assert json.loads((rep / "report.json").read_text())["being_written"] == []


def test_the_holder_s_command_is_escaped_in_report_md(tmp_path, monkeypatch, capsys):
    """The lock's text is the run folder's, like any other: a command holding backticks or
    Markdown neither closes its code span nor starts a block."""
    command = "moebench sweep --out `x`\n# heading | cell"
    run, rep = write_run(tmp_path / "run", make_rows()), tmp_path / "rep"
    _held_here(monkeypatch, command)
    assert cli.main(["report", str(run), "--out", str(rep)]) == 0
    text = (rep / "report.md").read_text()
    assert f"being written by {md_code(command)} (pid 4242" in text
    assert "\n# heading" not in text


def test_a_lock_naming_another_host_reads_as_possibly_partial(tmp_path, capsys):
    """A run copied mid-sweep (or a stale lock) from another host: the lock cannot be checked from
    here, and report.md says what it names and that the run may be partial."""
    rows = make_rows()
    run, rep = write_run(tmp_path / "run", rows), tmp_path / "rep"
    lock = {"pid": 4242, "start": "1", "host": "far-node", "token": "t", "command": COMMAND, "since": SINCE}
    (run / LOCK_FILE).write_text(json.dumps(lock))
    assert cli.main(["report", str(run), "--out", str(rep)]) == 0
    top = _top((rep / "report.md").read_text())
    assert "possibly partial" in top.lower(), top
    assert f"`{COMMAND}` (pid 4242 on far-node since {SINCE})" in top and f"{len(rows)} rows read" in top, top


def test_a_comparison_names_the_side_being_written(tmp_path, monkeypatch, capsys):
    base = write_run(tmp_path / "base", make_rows(seed=0))
    cand = write_run(tmp_path / "cand", make_rows(seed=1))
    holder = _held_here(monkeypatch)
    monkeypatch.setattr(load, "holder_now", lambda run_dir: holder if run_dir.name == "cand" else {})
    rep = tmp_path / "rep"
    cli.main(["compare", str(base), str(cand), "--out", str(rep)])
    top = _top((rep / "report.md").read_text(), 2)
    assert "Partial run (cand)" in top and "being written by" in top, top
    assert "(base)" not in top


def test_capacity_md_of_a_run_being_written_says_so_too(tmp_path, monkeypatch, capsys):
    """`report --capacity` writes capacity.md, a report of the same rows: partial, it says so."""
    rows = pd.DataFrame(
        [
            make_row("local", "triton", "experts", "none", "bf16", t, samples_us=[50.0] * 5, device_bytes_peak=2e9 + t)
            for t in (1024, 8192, 32768)
        ]
    )
    run, rep = write_run(tmp_path / "run", rows), tmp_path / "rep"
    _held_here(monkeypatch)
    assert cli.main(["report", str(run), "--capacity", "--budget", "12GiB", "--out", str(rep)]) == 0
    top = _top((rep / "capacity.md").read_text(), 2)
    assert f"the run was being written by `{COMMAND}`" in top and f"{len(rows)} rows read" in top, top
