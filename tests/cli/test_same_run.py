"""`moebench compare A A` (a run with itself, or two spellings of one run) warned 'both sides are the
same run', then exited 0 and wrote a report: a typo in a CI gate passed. It is bad input now: one line
saying so and what to pass, exit 2, nothing written. Two copies of a run (a copied folder, the same
run id) are two runs and compare (moebench/cli/report.py _refuse_same_run)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from moebench import cli
from moebench.results.synthetic import synthetic_run


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("spelling", ["twice", "trailing_slash", "relative", "link", "rows_folder", "row_file"])
@pytest.mark.parametrize("cmd", ["compare", "report", "report_run"])
def test_one_run_on_both_sides_is_refused_in_one_line_and_nothing_written(spelling, cmd, tmp_path, capsys, monkeypatch):
    run = synthetic_run(tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    base = str(run)
    cand = {
        "twice": str(run),
        "trailing_slash": f"{run}/",
        "relative": "run",
        "link": str(tmp_path / "alias"),
        "rows_folder": str(run / "rows"),
        "row_file": "",
    }[spelling]
    if spelling == "link":
        os.symlink(run, tmp_path / "alias")
    if spelling == "row_file":
        base = cand = str(sorted((run / "rows").glob("*.parquet"))[0])
    before = _tree(tmp_path)
    argv = {
        "compare": ["compare", base, cand],
        "report": ["report", "--baseline", base, "--candidate", cand],
        "report_run": ["report", cand, "--baseline", base],
    }[cmd]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    name = argv[0]
    assert err.count("\n") == 1 and err.startswith(f"moebench {name}: error: both sides are the same run ("), err
    assert ("--axis FIELD=A:B" in err) == (name == "compare") and "with two runs" in err, err
    assert _tree(tmp_path) == before  # no report folder


def test_a_copy_of_a_run_is_another_run_and_compares(tmp_path, capsys):
    """A copied folder (same run id: a run committed under results/, say) is compared: a copy resumed
    since differs, and its comparison is a finding."""
    run = synthetic_run(tmp_path / "run")
    copy = Path(shutil.copytree(run, tmp_path / "copy"))
    assert cli.main(["compare", str(run), str(copy), "--out", str(tmp_path / "rep")]) == 0
    assert "same run" not in capsys.readouterr().err
    assert (tmp_path / "rep" / "report.md").is_file()
