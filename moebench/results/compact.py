"""Compaction of a run's row files, under the run's lock: every per-combination file of
rows/ (skipped.parquet aside) merged into one rows/rows.parquet.

Why: a Parquet file carries its schema (~70 columns, pandas metadata) in a footer of about
37 KB, so a one-row file is 90 % footer; results/ holds hundreds of them. Every reader takes
any rows/*.parquet, and a resumed sweep writes its new per-combination files beside
rows.parquet, where the store's precedence decides as before.

Compaction is the one writer that removes row files, so it holds the run's lock like every
writer (moebench/results/lock.py): a folder a sweep is writing is refused (LockHeld) or waited
for (`wait`). The merged file is in place before the files it replaces are moved out (a crash
leaves rows twice, never none: the precedence reads them once), `RunStore.load()` must return
the same rows afterwards, and the run is put back as it was otherwise."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import pandas as pd

from moebench.results.lock import RunLock
from moebench.results.store import RunStore, newest_last, read_row_file

MERGED = "rows.parquet"
ASIDE_PREFIX = ".compact-"  # under rows/: the replaced files until the merge is checked (no reader looks)


def canonical(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in a fixed order and form, to compare two reads of one run."""
    if df.empty:
        return df
    df = df.sort_values(["combo_key", "tokens_per_rank"]).reset_index(drop=True)
    # a column that is null in some files and numeric in others comes back as None or NaN
    # depending on how the files are concatenated: the same missing value
    df = df[sorted(df.columns)].astype(object)
    return df.where(df.notna(), None)


def compact_run(
    run_dir: str | os.PathLike,
    wait: bool = False,
    log: Callable[[str], None] = lambda s: None,
    command: str = "scripts/compact_rows.py",
) -> tuple[int, int]:
    """Merge the run's row files into rows/rows.parquet holding its lock (LockHeld when a
    sweep holds it, unless `wait`); (bytes before, bytes after) of its measured row files.
    A torn row file is an error naming it (a sweep sets it aside first)."""
    with RunLock.acquire(run_dir, wait=wait, command=command, log=log):
        return _compact(RunStore(run_dir))


def _compact(store: RunStore) -> tuple[int, int]:
    store.refuse_links()  # nothing moved or written through a link below the run folder
    files = newest_last(store.row_files())  # write order: ties of one second keep their precedence
    before = sum(f.stat().st_size for f in files)
    if len(files) < 2:
        return before, before
    expected = canonical(store.load())
    merged = pd.concat([read_row_file(f) for f in files], ignore_index=True)
    target = store.rows_dir / MERGED
    aside = Path(tempfile.mkdtemp(dir=store.rows_dir, prefix=ASIDE_PREFIX))
    kept = aside / f"old-{MERGED}"
    if target in files:  # the earlier merge: kept until this one is checked
        os.link(target, kept)
    store.write_frame(target, merged)
    replaced = [f for f in files if f != target]
    for f in replaced:
        f.rename(aside / f.name)
    try:
        pd.testing.assert_frame_equal(canonical(store.load()), expected, check_dtype=False)
    except AssertionError:  # put the run back as it was
        for f in replaced:
            (aside / f.name).rename(f)
        if kept.exists():
            kept.rename(target)
        else:
            target.unlink()
        shutil.rmtree(aside)
        raise
    shutil.rmtree(aside)
    return before, target.stat().st_size
