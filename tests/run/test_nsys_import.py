"""trace=nsys rows name a report that exists or say why none (traces/nsys_import.py), and
`moebench trace --import` turns real captures into SQLite exports. The real-capture tests run
where scripts/install_nsys.sh --download has installed Nsight Systems into .deps/ (else skip)."""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from moebench import cli
from moebench.config.paths import REPO_ROOT
from moebench.run import nsys_import
from moebench.run.nsys_import import nsys_info, read_captures, resolve_nsys_rows
from moebench.traces.nsys import record_capture

INSTALL = REPO_ROOT / "scripts" / "install_nsys.sh"


def _tools_or_skip():
    try:
        return nsys_import.host_tools()
    except ValueError as e:
        pytest.skip(f"no Nsight Systems host tools here ({e})")


def _target_nsys_or_skip() -> str:
    if not (REPO_ROOT / ".deps" / "nsys-target" / "target-linux-x64.tar.xz").is_file():
        pytest.skip("no pruned target: scripts/install_nsys.sh --download")
    env = subprocess.run(["bash", str(INSTALL), "--target-env"], capture_output=True, text=True, check=True).stdout
    path = env.split("export PATH=", 1)[1].split("$", 1)[0]
    return str(Path(path) / "nsys")


def _run_with_rows(tmp_path, keys) -> Path:
    """A run directory with one row per (combo_key, tokens) as the sweep writes it for trace=nsys."""
    run = tmp_path / "run"
    (run / "rows").mkdir(parents=True)
    for key, tokens in keys:
        pd.DataFrame(
            [{"combo_key": key, "tokens_per_rank": tokens, "status": "ok", "trace_path": "", "latency_us_median": 1.0}]
        ).to_parquet(run / "rows" / f"{key}-T{tokens}.parquet", index=False)
    return run


def _rows(run) -> pd.DataFrame:
    return pd.read_parquet(run / "rows").sort_values(["combo_key", "tokens_per_rank"]).reset_index(drop=True)


def test_each_row_names_a_file_that_exists_or_says_why(tmp_path):
    run = _run_with_rows(tmp_path, [("a", 4), ("b", 4), ("c", 4), ("d", 4), ("e", 4)])
    nsys_dir = run / "traces" / "nsys"
    record_capture(run, 11, 1, "a", 4, 0, "torch.cuda.nvtx")  # exported
    record_capture(run, 11, 2, "b", 4, 0, "torch.cuda.nvtx")  # raw capture only (a target-only nsys)
    record_capture(run, 11, 3, "c", 4, 0, "torch.cuda.nvtx")  # nothing written
    record_capture(run, 11, None, "d", 4, 0, None)  # no NVTX API: no range pushed
    record_capture(run, 11, 4, "e", 4, 0, "nvtx package")  # a range nsys does not record
    record_capture(run, 12, 1, "a", 4, 1, "torch.cuda.nvtx")  # rank 1: rows name rank 0's report
    (nsys_dir / "ranks_11.1.sqlite").write_bytes(b"SQLite format 3\0")
    (nsys_dir / "ranks_11.2.qdstrm.xz").write_bytes(b"")
    counts = resolve_nsys_rows(run)
    assert counts == {"report": 1, "raw": 1, "none": 3}
    df = _rows(run)
    assert list(df.trace_path) == ["traces/nsys/ranks_11.1.sqlite", "", "", "", ""]
    assert list(df.nsys_capture) == ["", "traces/nsys/ranks_11.2.qdstrm.xz", "", "", ""]
    why = list(df.trace_error)
    assert why[0] == "" and "moebench trace --import" in why[1]
    assert "nsys wrote no file for capture 3 of rank process 11" in why[2]
    assert "no NVTX API" in why[3] and "nvtx package" in why[4]
    for p in df.trace_path:
        assert not p or (run / p).is_file()
    # idempotent, and a later export is picked up
    assert resolve_nsys_rows(run) == counts
    (nsys_dir / "ranks_11.2.sqlite").write_bytes(b"SQLite format 3\0")
    resolve_nsys_rows(run)
    assert _rows(run).trace_path[1] == "traces/nsys/ranks_11.2.sqlite" and _rows(run).trace_error[1] == ""


def test_rows_of_earlier_versions_are_checked_too(tmp_path):
    """Rows that named `ranks_<pid>.<n>.nsys-rep` without looking: kept only if the file exists."""
    run = _run_with_rows(tmp_path, [("a", 4)])
    f = next((run / "rows").glob("*.parquet"))
    df = pd.read_parquet(f)
    df["trace_path"] = ["traces/nsys/ranks_5.1.nsys-rep"]
    df.to_parquet(f, index=False)
    resolve_nsys_rows(run)
    row = _rows(run).iloc[0]
    assert row.trace_path == "" and "nsys wrote no file for capture 1 of rank process 5" in row.trace_error


def test_torch_rows_are_left_alone(tmp_path):
    run = _run_with_rows(tmp_path, [("a", 4)])
    before = (run / "rows" / "a-T4.parquet").read_bytes()
    assert resolve_nsys_rows(run) == {"report": 0, "raw": 0, "none": 0}
    assert (run / "rows" / "a-T4.parquet").read_bytes() == before


def test_which_nsys(tmp_path, monkeypatch):
    """The Nsight Compute copy is named as such; a 2024.2 target under a 13.0 driver gets its note."""

    def fake(folder: Path, version: str) -> None:
        folder.mkdir(parents=True)
        (folder / "nsys").write_text(f"#!/bin/sh\necho 'NVIDIA Nsight Systems version {version}'\n")
        (folder / "nsys").chmod(0o755)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}/usr/bin{os.pathsep}/bin")

    fake(tmp_path / "nsight-compute-2025.3.1" / "host" / "target-linux-x64", "2025.3.1.1-123")
    info = nsys_info(driver_cuda="13.0")
    assert info["kind"] == "ncu-bundled" and "collects no CUDA events" in info["note"]
    fake(tmp_path / "nsight-systems" / "target-linux-x64", "2024.2.3.38-242334140272v0")
    info = nsys_info(driver_cuda="13.0")
    assert info["version"] == "2024.2.3.38" and info["kind"] == "target"
    assert "works, with nsys's note" in info["note"] and "moebench trace --import" in info["note"]
    fake(tmp_path / "old" / "target-linux-x64", "2023.4.4.54-234433681190v0")
    assert "not usable" in nsys_info(driver_cuda="13.0")["note"]
    monkeypatch.setenv("PATH", "/nonexistent")
    assert nsys_info()["path"] is None


def test_import_without_tools_says_how_to_get_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MOEBENCH_QDSTRM_IMPORTER", str(tmp_path / "nope"))
    (tmp_path / "x.qdstrm").write_bytes(b"")
    assert cli.main(["trace", "--import", str(tmp_path)]) == 2
    assert "scripts/install_nsys.sh --download" in capsys.readouterr().err


# -- with the real Nsight Systems (installed by scripts/install_nsys.sh) ------------------------
@pytest.mark.slow
def test_import_a_real_capture_and_update_its_row(tmp_path, capsys):
    """The pruned target captures a CPU process (NVTX only) into a .qdstrm, brought back as
    .qdstrm.xz; `moebench trace --import RUN` exports it and the row names the export."""
    nsys = _target_nsys_or_skip()
    _tools_or_skip()
    run = _run_with_rows(tmp_path, [("k", 8)])
    nsys_dir = run / "traces" / "nsys"
    nsys_dir.mkdir(parents=True)
    p = subprocess.run(
        [
            nsys,
            "profile",
            "--trace=nvtx",
            "--sample=none",
            "--cpuctxsw=none",
            "-o",
            str(nsys_dir / "ranks_7.1"),
            sys.executable,
            "-c",
            "print('captured')",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (nsys_dir / "ranks_7.1.qdstrm").is_file(), p.stdout + p.stderr
    assert not (nsys_dir / "ranks_7.1.nsys-rep").exists(), "the target alone cannot import"
    with open(nsys_dir / "ranks_7.1.qdstrm", "rb") as src, lzma.open(nsys_dir / "ranks_7.1.qdstrm.xz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (nsys_dir / "ranks_7.1.qdstrm").unlink()
    record_capture(run, 7, 1, "k", 8, 0, "torch.cuda.nvtx")
    resolve_nsys_rows(run)
    assert _rows(run).nsys_capture[0] == "traces/nsys/ranks_7.1.qdstrm.xz"

    assert cli.main(["trace", "--import", str(run)]) == 0
    out = capsys.readouterr().out
    assert "ranks_7.1.sqlite" in out and "rows with a report 1" in out
    row = _rows(run).iloc[0]
    assert row.trace_path == "traces/nsys/ranks_7.1.sqlite" and row.trace_error == "" and row.nsys_capture == ""
    assert not (nsys_dir / "ranks_7.1.qdstrm").exists(), "the inflated copy is removed"
    import sqlite3

    con = sqlite3.connect(run / row.trace_path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"StringIds", "PROCESSES", "META_DATA_CAPTURE", "META_DATA_EXPORT"} <= tables
    assert read_captures(run)[("k", 8, 0)]["n"] == 1


def test_moebench_env_says_which_nsys_and_which_nvtx_api(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nsys
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    assert "profilers:" in out and "nsys          missing" in out and "trace=nsys falls back to trace=torch" in out
    assert "nvtx ranges" in out
    from moebench.run.env import profiler_info

    info = profiler_info()
    assert info["nsys"]["path"] is None and info["nvtx_api"] in ("torch.cuda.nvtx", "nvtx package", None)


def test_a_real_repeat_capture_export_holds_the_default_domain_ranges(capsys):
    """cpu_nsys_repeat_capture.sqlite (fixtures/traces/nvtx_repeat.c under the pruned target with
    the importer beside it): one capture of a repeat series, opened by the default-domain range
    `moebench/timed` matched by message; the parser names moebench's ranges without the prefix."""
    from moebench.traces.nsys import parse_nsys_sqlite

    path = Path(__file__).parents[1] / "fixtures" / "traces" / "cpu_nsys_repeat_capture.sqlite"
    trace = parse_nsys_sqlite(path)
    assert [r.name for r in trace.ranges] == ["timed", "combo/abc"] and trace.combos() == ["abc"]
    assert trace.notes == [] and trace.kernels == []
    assert 19_000 < trace.ranges[1].dur_us < 40_000  # the 20 ms sleep inside
    assert cli.main(["trace", str(path)]) == 0
    assert "no GPU activity in the trace" in capsys.readouterr().out


def test_import_of_a_run_with_nothing_to_import_is_refused(tmp_path, capsys):
    """A run none of whose rows was nsys-traced, with no capture under it: exit 2 saying so and what
    to do (it printed 'rows with a report 0, ... without 0' and exit 0), its rows unchanged."""
    run = _run_with_rows(tmp_path, [("a", 4), ("b", 4)])
    before = {f.name: f.read_bytes() for f in (run / "rows").iterdir()}
    assert cli.main(["trace", "--import", str(run)]) == 2
    err = capsys.readouterr().err
    assert "none of its rows was traced with nsys" in err and "trace.name=nsys" in err
    assert {f.name: f.read_bytes() for f in (run / "rows").iterdir()} == before
