"""Files in a run that a reader cannot use (issue 31, items 8 and 12; docs/design.md,
"Environment errors and torn files"): a torn row file or skipped.parquet is set aside by the
next sweep (rows/.corrupt/, one line) and its rows measured again, and every reader (the
store's load, report, compare) warns in one line naming it and reads the rest; a parquet
file of another tool, or of an unknown schema version, is an error naming the file; a
fingerprint in envs/ that is not JSON is passed over with a line naming it."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from moebench import cli
from moebench.report.load import load_run
from moebench.results.store import CORRUPT_DIR, SKIPPED_FILE, RunStore
from moebench.results.synthetic import synthetic_run

QUICK = ["runner.reps=3", "runner.warmup=0", "runner.phase_reps=1", "runner.memory=false"]
# one combination to measure and one skipped (DeepGEMM needs fp8_block): a row file and skipped.parquet
SWEEP = [
    "backend=local",
    "experts=torch,deepgemm",
    "reduction=experts",
    "overlap=none",
    "quant=bf16",
    "model=tiny",
    "workload.tokens_per_rank=[4]",
    *QUICK,
]


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def _row(key, t, status, ts="2026-01-01T00:00:00", **kw):
    return {"combo_key": key, "tokens_per_rank": t, "status": status, "timestamp": ts, "reason": "", **kw}


def _tear(path) -> None:
    """Cut a file in half, as a copy cut short or a disk fault leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _warnings(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("moebench: warning:")]


def test_the_stores_readers_warn_about_a_torn_file_and_read_the_rest(tmp_path, capsys):
    store = RunStore(tmp_path)
    store.write_rows("a", [_row("a", 4, "ok")])
    torn = store.write_rows("b", [_row("b", 4, "ok")])
    store.write_skipped([_row("c", 4, "skipped")])
    _tear(torn)
    (store.rows_dir / SKIPPED_FILE).write_bytes(b"not parquet")
    df = store.load()
    assert list(df["combo_key"]) == ["a"]
    lines = _warnings(capsys.readouterr().err)
    assert len(lines) == 2 and any(f"{torn}: torn row file" in ln for ln in lines)
    assert any(f"{store.rows_dir / SKIPPED_FILE}: torn row file" in ln for ln in lines)
    assert store.stored() == {"a": {4: "ok"}}  # planning sees b missing: it is measured again
    # set aside, not deleted; a second torn file of the same name does not replace the first
    moved = store.set_aside_torn()
    assert sorted(dest.name for _, dest in moved) == sorted([torn.name, SKIPPED_FILE])
    assert all(dest.parent == store.rows_dir / CORRUPT_DIR and dest.exists() for _, dest in moved)
    torn.write_bytes(b"PAR1 torn again")
    ((_, again),) = store.set_aside_torn()
    assert again.name == f"{torn.name}.1" and (store.rows_dir / CORRUPT_DIR / torn.name).exists()
    assert list(store.load()["combo_key"]) == ["a"] and _warnings(capsys.readouterr().err) == []


def test_report_and_compare_warn_in_one_line_and_read_the_rest(tmp_path, capsys):
    base, cand = synthetic_run(tmp_path / "base"), synthetic_run(tmp_path / "cand")
    whole = len(load_run(cand)[0])
    victim = sorted((cand / "rows").glob("*.parquet"))[0]
    held = len(pd.read_parquet(victim))
    _tear(victim)
    assert cli.main(["report", str(cand)]) == 0
    err = capsys.readouterr().err
    assert len(_warnings(err)) == 1 and f"{victim}: torn row file" in err and "Traceback" not in err
    assert len(load_run(cand)[0]) == whole - held
    capsys.readouterr()
    code = cli.main(["compare", str(base), str(cand), "--fail-on", "slower,broken"])
    err = capsys.readouterr().err
    assert code == 0 and len(_warnings(err)) == 1 and f"{victim}: torn row file" in err


@pytest.mark.multiprocess
def test_a_sweep_sets_a_torn_file_aside_says_so_and_measures_its_rows_again(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["sweep", *SWEEP, "--out", str(run)]) == 0
    store = RunStore(run)
    (row_file,) = store.row_files()
    _tear(row_file)
    _tear(store.rows_dir / SKIPPED_FILE)
    capsys.readouterr()
    assert cli.main(["sweep", *SWEEP, "--out", str(run)]) == 0
    err = capsys.readouterr().err
    moved = [ln for ln in err.splitlines() if "torn row file" in ln]
    assert len(moved) == 2 and all("moved to" in ln and f"rows/{CORRUPT_DIR}/" in ln for ln in moved)
    assert any(str(row_file) in ln for ln in moved)
    assert "ok=1" in err  # measured again
    assert (store.rows_dir / CORRUPT_DIR / row_file.name).exists()
    assert (store.rows_dir / CORRUPT_DIR / SKIPPED_FILE).exists()
    df = store.load()
    assert sorted(df["status"]) == ["ok", "skipped"]  # the skip written again, the row measured again
    assert cli.main(["report", str(run)]) == 0
    assert _warnings(capsys.readouterr().err) == []  # nothing torn is left in a reader's way


def test_a_foreign_parquet_is_an_error_naming_it(tmp_path, capsys):
    run = synthetic_run(tmp_path / "run")
    foreign = run / "rows" / "from-elsewhere.parquet"
    pd.DataFrame({"a": [1, 2]}).to_parquet(foreign)
    before = sorted((run / "rows").iterdir())
    for argv in (
        ["report", str(run)],
        ["compare", str(run), str(synthetic_run(tmp_path / "b"))],
        ["sweep", *SWEEP, "--out", str(run)],
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        lines = [ln for ln in err.strip().splitlines() if "%|" not in ln]
        assert len(lines) == 1 and f"{foreign}: missing columns" in lines[0], (argv, err)
        assert lines[0].endswith("move it out of the run's rows/ folder"), lines[0]
    assert sorted((run / "rows").iterdir()) == before  # the sweep wrote nothing and moved nothing
    # the file itself given, where it lies in the run's rows/: the same advice (the run fails on it too)
    assert cli.main(["report", str(foreign), "--out", str(tmp_path / "r")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{foreign}: missing columns" in line and line.endswith("move it out of the run's rows/ folder"), line
    # a copy of it given outside any rows/ folder: what to pass instead
    loose = tmp_path / "from-elsewhere.parquet"
    shutil.copy(foreign, loose)
    assert cli.main(["report", str(loose), "--out", str(tmp_path / "r")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{loose}: missing columns" in line and line.endswith("or its rows/*.parquet files"), line
    # a folder of other parquet given as a run: no rows/ folder to move it out of; what to pass instead
    other = tmp_path / "other"
    other.mkdir()
    pd.DataFrame({"a": [1, 2]}).to_parquet(other / "x.parquet")
    assert cli.main(["report", str(other)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "missing columns" in line and "rows/ folder" not in line and "pass the folder `moebench sweep` wrote" in line
    assert not (other / "report").exists()
    # rows of a schema version this code does not know: the error names their file, not only the run
    foreign.unlink()
    newer = sorted((run / "rows").glob("*.parquet"))[0]
    pd.read_parquet(newer).assign(schema_version=99).to_parquet(newer)
    assert cli.main(["report", str(run)]) == 2
    assert f"{newer}: rows of schema_version 99" in capsys.readouterr().err


def test_a_fingerprint_that_is_not_json_is_named(tmp_path, capsys):
    run = synthetic_run(tmp_path / "run")
    (run / "envs").mkdir(exist_ok=True)
    bad = run / "envs" / "0123456789.json"
    bad.write_text("{not json")
    assert RunStore(run).env_of("0123456789") == {}
    lines = _warnings(capsys.readouterr().err)
    assert len(lines) == 1 and f"{bad}: not a JSON fingerprint" in lines[0]
    assert cli.main(["report", str(run)]) == 0
    lines = _warnings(capsys.readouterr().err)
    assert len(lines) == 1 and str(bad) in lines[0]
