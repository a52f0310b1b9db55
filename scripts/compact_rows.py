"""Compact the rows of committed run directories: every per-combination file of a run's
rows/ (skipped.parquet aside) merged into one rows/rows.parquet.

Why: a Parquet file carries its schema (~70 columns, pandas metadata) in a footer of about
37 KB, so a one-row file is 90 % footer; results/ holds hundreds of them. Readers take any
rows/*.parquet (moebench.results.store.RunStore, moebench report, moebench trace), and a resumed
sweep writes its new per-combination files beside rows.parquet, where the newest row of a
(combination, tokens) wins as before. The script checks that RunStore.load() returns the
same rows after the merge and leaves a run untouched otherwise.

    python scripts/compact_rows.py results/<folder> [...]   # run directories, or folders holding them
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

from moebench.results.store import RunStore

MERGED = "rows.parquet"


def _canonical(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return df
    df = df.sort_values(["combo_key", "tokens_per_rank"]).reset_index(drop=True)
    # a column that is null in some files and numeric in others comes back as None or NaN
    # depending on how the files are concatenated: the same missing value
    df = df[sorted(df.columns)].astype(object)
    return df.where(df.notna(), None)


def compact(run_dir: Path) -> tuple[int, int]:
    """Merge run_dir/rows/*.parquet (not skipped.parquet) into rows/rows.parquet.
    Returns (bytes before, bytes after) of the measured row files."""
    store = RunStore(run_dir)
    files = store.row_files()
    before = sum(f.stat().st_size for f in files)
    if len(files) < 2:
        return before, before
    expected = _canonical(store.load())
    merged = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    with tempfile.TemporaryDirectory(dir=run_dir) as tmp:
        out = Path(tmp) / MERGED
        merged.to_parquet(out, index=False)
        for f in files:
            f.rename(Path(tmp) / f"old-{f.name}")
        out.rename(store.rows_dir / MERGED)
        try:
            pd.testing.assert_frame_equal(_canonical(store.load()), expected, check_dtype=False)
        except AssertionError:
            (store.rows_dir / MERGED).unlink()
            for f in files:
                (Path(tmp) / f"old-{f.name}").rename(f)
            raise
    return before, (store.rows_dir / MERGED).stat().st_size


def run_dirs(path: Path) -> list[Path]:
    return sorted(p.parent for p in path.rglob("rows") if p.is_dir())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", type=Path)
    args = p.parse_args(argv)
    for path in args.paths:
        for run in run_dirs(path):
            b, a = compact(run)
            print(f"{run}: {b / 1024:.0f} KB -> {a / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
