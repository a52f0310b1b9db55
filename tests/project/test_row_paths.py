"""A committed row names a file only if the file is committed: every `*_path` column of the
rows under results/ (trace_path, profiler_trace_path, ...) is empty or names a file that exists
relative to its run folder (where moebench writes them) or to the repository. Rows whose
traces were not kept say so in their caveats.md, not with a path to nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"


def _named(rows_file: Path) -> list[tuple[str, str]]:
    """(column, value) of every non-empty string in a row file's *_path columns."""
    schema = pq.read_schema(rows_file)
    cols = [c for c in schema.names if c.endswith("_path")]
    table = pq.read_table(rows_file, columns=cols)
    return [(c, v) for c in cols for v in table.column(c).to_pylist() if isinstance(v, str) and v.strip()]


def missing_files(root: Path) -> list[str]:
    out = []
    for f in sorted(root.rglob("rows/*.parquet")):
        run = f.parent.parent
        for col, value in _named(f):
            if not ((run / value).is_file() or (REPO / value).is_file()):
                out.append(f"{f.relative_to(root)}: {col} = {value}")
    return out


def test_committed_rows_name_only_files_that_exist():
    files = list(RESULTS.rglob("rows/*.parquet"))
    assert len(files) > 40  # the walk finds the committed runs
    bad = missing_files(RESULTS)
    assert not bad, (
        f"{len(bad)} committed row(s) name files that are not in the repository (commit the file, "
        "or empty the column and say so in the run's caveats.md):\n" + "\n".join(bad[:20])
    )


def test_the_check_sees_a_missing_trace(tmp_path):
    import pandas as pd

    run = tmp_path / "q" / "run"
    (run / "rows").mkdir(parents=True)
    (run / "traces" / "k").mkdir(parents=True)
    (run / "traces" / "k" / "rank0_T4.json").write_text("{}")
    pd.DataFrame(
        {
            "trace_path": ["traces/k/rank0_T4.json", "", None],
            "profiler_trace_path": ["", "traces/profiler/k/rank0_T8.json.gz", ""],
            "reason": ["a/b.json", "", ""],
        }
    ).to_parquet(run / "rows" / "rows.parquet")
    assert missing_files(tmp_path) == [
        "q/run/rows/rows.parquet: profiler_trace_path = traces/profiler/k/rank0_T8.json.gz"
    ]
