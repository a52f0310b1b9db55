"""A comparison's command that fails exits 3 (moebench/cli/main.py NO_RESULT; docs/design.md,
"Exit status"), never 1: CI reads 1 as "slower" (issue #52: a decompression-bomb error in a
figure of a 10,000-row comparison exited 1, nothing printed)."""

from __future__ import annotations

import pytest
from PIL import Image

from moebench import cli
from moebench.cli.main import NO_RESULT
from moebench.results.synthetic import synthetic_run


@pytest.fixture
def runs(tmp_path):
    return synthetic_run(tmp_path / "base"), synthetic_run(tmp_path / "cand", scale=3.0)  # 3x slower


def test_a_crash_inside_compare_exits_no_result_not_1(runs, tmp_path, capsys, monkeypatch):
    base, cand = runs
    assert cli.main(["compare", str(base), str(cand), "--out", str(tmp_path / "ok")]) == 1  # slower, as it is

    def boom(*a, **kw):
        raise Image.DecompressionBombError("Image size (200000000 pixels) exceeds limit")

    monkeypatch.setattr("moebench.report.compare.compare_runs", boom)
    capsys.readouterr()
    assert NO_RESULT not in (0, 1, 2)
    assert cli.main(["compare", str(base), str(cand), "--out", str(tmp_path / "x")]) == NO_RESULT
    err = capsys.readouterr().err
    assert "Traceback" in err and "DecompressionBombError" in err
    assert "moebench compare: could not produce the comparison or report (DecompressionBombError: " in err
    assert f"exit {NO_RESULT}: no verdict on the runs" in err


def test_a_crash_inside_report_and_a_non_environment_oserror_exit_no_result(runs, tmp_path, capsys, monkeypatch):
    base, _ = runs

    def boom(*a, **kw):
        raise MemoryError

    monkeypatch.setattr("moebench.report.document.run_doc", boom)
    assert cli.main(["report", str(base), "--out", str(tmp_path / "r")]) == NO_RESULT
    assert "moebench report: could not produce the comparison or report (MemoryError: )" in capsys.readouterr().err

    def odd(*a, **kw):
        raise OSError(95, "Operation not supported")  # no environment error: a defect's OSError

    monkeypatch.setattr("moebench.report.document.run_doc", odd)
    assert cli.main(["report", str(base), "--out", str(tmp_path / "r2")]) == NO_RESULT


def test_another_command_still_raises(monkeypatch):
    def boom(args):
        raise RuntimeError("a defect in list")

    monkeypatch.setattr("moebench.cli.listing.list_command", boom)
    with pytest.raises(RuntimeError, match="a defect in list"):
        cli.main(["list"])
