"""A symbolic link that loops among a run's input files (`RUN/rows/x.parquet -> x.parquet`) was worded as
moebench's refusal to write through a link, blaming --out (`environment error: OUT: a symbolic link, which
moebench does not write through`) or, without --out, naming no path and advising --out; then it named the
file but said to make it readable. The line names the looping file and says to remove the link
(moebench/results/writable.py LOOPS; moebench/cli/main.py), and nothing says --out."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from moebench import cli
from moebench.results import writable
from moebench.results.synthetic import synthetic_run


@pytest.mark.parametrize("links", ["itself", "each_other"])
@pytest.mark.parametrize("argv", ["report_out", "report", "compare"])
def test_a_looping_link_among_a_runs_rows_is_named_with_what_to_do(links, argv, tmp_path, capsys):
    run = synthetic_run(tmp_path / "run")
    loop = run / "rows" / "loop.parquet"
    if links == "itself":
        loop.symlink_to(loop.name)
    else:
        loop.symlink_to("other.parquet")
        (run / "rows" / "other.parquet").symlink_to(loop.name)
    out = tmp_path / "x" / "rep"
    args = {
        "report_out": ["report", str(run), "--out", str(out)],
        "report": ["report", str(run)],
        "compare": ["compare", str(synthetic_run(tmp_path / "base")), str(run), "--out", str(out)],
    }[argv]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    named = lines[0].split("environment error: ", 1)[1].split(": a symbolic link")[0]
    assert Path(named) in (loop, run / "rows" / "other.parquet"), err
    assert lines[0].endswith(f": {writable.LOOPS}; remove the link"), err
    assert "--out" not in err and str(out) not in err and "write through" not in err, err
    assert not out.exists() and not (run / "report").exists()


def test_a_write_refused_through_a_link_keeps_its_words(tmp_path):
    """A link moebench will not write through (O_NOFOLLOW's ELOOP) that leads to a file is no loop."""
    target = tmp_path / "target"
    target.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(OSError) as e:
        os.open(link, os.O_WRONLY | os.O_NOFOLLOW)
    assert e.value.errno == errno.ELOOP
    assert writable.describe(e.value) == f"{link}: {writable.CAUSES[errno.ELOOP]}"
    loop = tmp_path / "loop"
    loop.symlink_to(loop.name)
    refused = OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(loop))
    assert writable.describe(refused) == f"{loop}: {writable.LOOPS}"
