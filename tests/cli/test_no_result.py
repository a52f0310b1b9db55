"""A command that fails in a way no other status names exits 3 (moebench/cli/main.py NO_RESULT;
docs/design.md, "Exit status"), never 1: CI reads a comparison's 1 as "slower" (issue #52: a
decompression-bomb error in a figure of a 10,000-row comparison exited 1, nothing printed) and a
sweep's 1 as a kernel's failure, where moebench itself crashed (Python's own 1)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image

from moebench import cli
from moebench.cli.main import NO_RESULT
from moebench.results.synthetic import synthetic_run
from tests.support.one_combination import ONE_TINY


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


# the commands whose failure was Python's 1 (a traceback, re-raised), each with its body in main.COMMANDS
OTHERS = ["sweep", "run", "list", "trace", "tune", "env"]


@pytest.mark.parametrize("cmd", OTHERS)
def test_a_defect_in_any_other_command_exits_no_result_with_its_traceback(cmd, monkeypatch, capsys):
    from moebench.cli.main import COMMANDS

    def boom(args):
        raise RuntimeError(f"a defect in {cmd}")

    module, function = COMMANDS[cmd]
    monkeypatch.setattr(f"moebench.cli.{module}.{function}", boom)
    assert cli.main([cmd]) == NO_RESULT
    err = capsys.readouterr().err
    assert "Traceback" in err and f"RuntimeError: a defect in {cmd}" in err
    assert err.rstrip().splitlines()[-1] == (
        f"moebench {cmd}: could not finish (RuntimeError: a defect in {cmd}); exit {NO_RESULT}: a failure of moebench "
        "or of the machine, not of the measured kernels (the traceback above)"
    )


ROOT = Path(__file__).resolve().parents[2]
# one single-rank CPU combination of the fault experts (tests/support/fault_experts.py, a plugin in
# every process: conftest.py puts it in MOEBENCH_PLUGIN_MODULES); its fault is given per test
ONE_FAULT = [x.replace("experts=torch", "experts=fault") for x in ONE_TINY] + ["runner.memory=false"]
# the sweep's process with a defect in moebench's own code: storing a finished combination's rows raises
DEFECT = textwrap.dedent(
    """
    import sys
    import moebench.run.sweep

    def write_finished(*args, **kwargs):
        raise RuntimeError("an injected defect in moebench")

    moebench.run.sweep.write_finished = write_finished
    from moebench.cli import main

    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.multiprocess
def test_a_sweep_exits_1_for_a_failed_row_and_3_when_moebench_itself_fails(tmp_path):
    """What a CI job reads from the process: a kernel that raises is a failed row, exit 1; the same
    sweep with moebench failing (a defect in its store's write) is exit 3, its traceback on stderr."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}

    def sweep(prefix: list[str], fault: str, out: str) -> subprocess.CompletedProcess:
        args = [*prefix, "sweep", *ONE_FAULT, f"experts.fault={fault}", "--out", str(tmp_path / out)]
        return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    failed = sweep(["-m", "moebench"], "raise", "failed")
    assert failed.returncode == 1, failed.stderr
    assert "failed=1" in failed.stderr and "Traceback" not in failed.stderr
    crashed = sweep(["-c", DEFECT], "none", "crashed")
    assert crashed.returncode == NO_RESULT, crashed.stderr
    assert "Traceback" in crashed.stderr and "RuntimeError: an injected defect in moebench" in crashed.stderr
    last = crashed.stderr.rstrip().splitlines()[-1]
    assert last.startswith(
        "moebench sweep: could not finish (RuntimeError: an injected defect in moebench); exit 3: "
    ), last
    assert "a failure of moebench or of the machine, not of the measured kernels" in last, last
