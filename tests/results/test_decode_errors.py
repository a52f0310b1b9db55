"""A row file whose columns hold the wrong types is an error naming the file (issue #52 item 7):
every reader (the store's load and stored, report, compare, a sweep's plan) says which file and
which column, one line, exit 2, instead of `invalid literal for int()` from deep in a read."""

from __future__ import annotations

import pandas as pd
import pytest

from moebench import cli
from moebench.results.store import RunStore
from moebench.results.synthetic import synthetic_run
from tests.results.test_torn_files import SWEEP


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.mark.parametrize(
    "column,value,needle",
    [
        ("tokens_per_rank", "four", "column tokens_per_rank holds 'four' where a number (int) belongs"),
        ("latency_us_median", "fast", "column latency_us_median holds 'fast' where a number (float) belongs"),
        ("combo_key", None, "rows without combo_key"),
    ],
)
def test_a_row_file_with_corrupt_column_types_is_named(tmp_path, capsys, column, value, needle):
    run = synthetic_run(tmp_path / "run")
    bad = sorted((run / "rows").glob("*.parquet"))[0]
    df = pd.read_parquet(bad)
    df[column] = pd.Series([value] * len(df), dtype=object)
    df.to_parquet(bad)
    store = RunStore(run)
    for read in (store.load, store.stored):
        with pytest.raises(ValueError, match="corrupt or not moebench's") as e:
            read()
        assert str(e.value).startswith(f"{bad}: ") and needle in str(e.value), e.value
    before = sorted((run / "rows").iterdir())
    for argv in (
        ["report", str(run)],
        ["compare", str(run), str(synthetic_run(tmp_path / "b"))],
        ["sweep", *SWEEP, "--out", str(run)],
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        lines = [ln for ln in err.strip().splitlines() if "%|" not in ln]
        assert len(lines) == 1 and f"{bad}: " in lines[0] and needle in lines[0], (argv, err)
    assert sorted((run / "rows").iterdir()) == before  # the sweep wrote nothing and moved nothing


def test_numbers_written_as_text_or_missing_are_no_error(tmp_path):
    run = synthetic_run(tmp_path / "run")
    f = sorted((run / "rows").glob("*.parquet"))[0]
    df = pd.read_parquet(f)
    df["latency_us_p20"] = pd.Series([None] * len(df), dtype=object)  # a measurement a row lacks
    df["rel_err"] = df["rel_err"].map(lambda v: "nan" if pd.isna(v) else str(v))  # numbers as text
    df.to_parquet(f)
    assert len(RunStore(run).load()) == len(RunStore(synthetic_run(tmp_path / "b")).load())
