"""Load a results run into one tidy DataFrame, through the store (moebench/results/store.py:
the only reader of a run folder) and with the column groups of moebench/results/row.py.

A run is a directory ``<run>/rows/*.parquet`` (one file per finished combination, one
row per tokens_per_rank) with ``<run>/env.json`` beside it. ``load_run`` also accepts a
single ``.parquet`` file or a plain directory of parquet files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moebench.config.paths import ADHOC
from moebench.report.columns import (  # noqa: F401 (PHASE_COLUMNS, phase_sum: re-exported for their users outside report/)
    COMBINATION_COLUMNS,
    LATENCY_COLUMNS,
    PHASE_COLUMNS,
    PROVENANCE_COLUMNS,
    SHOWN_IDENTITY,
    UNREAD_COLUMNS,
    phase_sum,
)
from moebench.report.mdsafe import md_code, md_text, shell_join
from moebench.results import row as schema
from moebench.results.lock import elsewhere, holder_now, unverified, writer
from moebench.results.store import (
    SKIPPED_FILE,
    RunStore,
    check_run_path,
    find_runs,
    latest,
    load_files,
    run_dir_of,
    warn,
)
from moebench.util.words import counted

# A row's identity: where it came from and which row it is (schema_version, run_id, sweep,
# combo_key), the spec's columns (moebench/config/spec.py) and the token count
IDENTITY_COLUMNS = [*schema.having(schema.ORIGIN), *SHOWN_IDENTITY]
# A file lacking any of these is malformed: no table can be drawn without them. The
# other columns are optional (filled with NaN / None) so that a report still renders rows
# from an older or newer schema version.
REQUIRED_COLUMNS = schema.having(schema.REQUIRED)
OPTIONAL_NUMERIC = [c for c in schema.names(dtype="float") if c not in LATENCY_COLUMNS]


def _source(path: Path) -> tuple[list[Path] | None, Path | None]:
    """(row files outside a run folder or None for a run folder, run directory or None)."""
    if check_run_path(path).is_file():
        return [path], run_dir_of(path)
    store = RunStore(path)
    if store.row_files() or (store.rows_dir / SKIPPED_FILE).is_file():
        return None, path
    files = sorted(p for p in path.glob("*.parquet") if not p.name.startswith("."))
    who, sure = being_written(path) if not files else ("", False)
    if who and sure:
        raise ValueError(
            f"no results in {path} yet: {who} is writing it and has stored no row so far; "
            "wait, then report again: its rows are stored as it goes"
        )
    stopped = _stopped_sweep(store) if not files else ""
    if stopped:
        raise ValueError(
            f"no results in {path} yet: {stopped} and stopped (a SIGTERM, Ctrl-C or crash) before it stored "
            f"any row; the same command resumes it" + (f"; {who}" if who else "")
        )
    if not files:
        raise ValueError(
            f"no results in {path}: expected {store.rows_dir}/*.parquet (run a sweep "
            "first, e.g. `moebench sweep ...`, or point at its output directory)" + (f"; {who}" if who else "")
        )
    return files, path


def _stopped_sweep(store: RunStore) -> str:
    """'`moebench sweep --out RUN ...` started here' where a sweep recorded itself in `store`'s
    folder (sweep-*.json, as it does before its first row), else ''."""
    try:
        records = [r for r in store.sweep_records() if isinstance(r, dict)]
    except (OSError, ValueError):
        return ""
    if not records:
        return ""
    sweep, overrides = records[-1].get("sweep") or {}, records[-1].get("cli_overrides") or []
    name = str(sweep.get("name") or "default") if isinstance(sweep, dict) else "default"
    words = ["moebench", "sweep", *(["--sweep", name] if name not in ("default", ADHOC) else [])]
    command = shell_join([*words, "--out", str(store.dir), *map(str, overrides)])
    return f"{md_code(command)} started here"


def _holder(path: str | Path) -> dict:
    """The lock's holder of the run ``path`` lies in, read without taking the lock (results/lock.py
    holder_now); {} where none holds it, or where it is this process on this host."""
    holder = holder_now(run_dir_of(path))
    return {} if not holder or (holder.get("pid") == os.getpid() and not elsewhere(holder)) else holder


def being_written(path: str | Path) -> tuple[str, bool]:
    """(who is writing the run ``path`` lies in, whether that is known): its lock's holder (_holder).
    A live holder on this host is worded as `lock.writer` does (True); one on another host, which
    cannot be checked from here, as `lock.unverified` does (False: no reason on its own to wait);
    ('', False) where none holds it."""
    holder = _holder(path)
    if not holder:
        return "", False
    if elsewhere(holder):
        return unverified(holder, run_dir_of(path)), False
    return writer(holder), True


WRITING = "being_written"  # the key of load_run's frame's attrs holding its Writing, where one held the run


@dataclass(frozen=True)
class Writing:
    """The writer that held a run's lock when load_run had read its rows: a report of them is of a
    partial run, and says so in its Markdown, not only on stderr. The lock's fields are the run
    folder's text (escaped in ``markdown``)."""

    command: str
    pid: str
    host: str
    since: str
    rows: int  # the rows read
    verified: bool  # a live holder on this host; False: one on another host, not checkable from here

    @classmethod
    def of(cls, holder: dict, rows: int) -> Writing:
        command, pid, host, since = (str(holder.get(k)) for k in ("command", "pid", "host", "since"))
        return cls(command, pid, host, since, rows, verified=not elsewhere(holder))

    def markdown(self, name: str = "") -> str:
        """A quoted line for the top of a report: who was writing the run and how many rows were
        read; ``name`` (Markdown) names the run where a report has two."""
        who = f"{md_code(self.command)} (pid {md_text(self.pid)} on {md_text(self.host)} since {md_text(self.since)})"
        side, rows = f" ({name})" if name else "", counted(self.rows, "row")
        if self.verified:
            return (
                f"> **Partial run{side}**: the run was being written by {who} when this report was made: "
                f"{rows} read; a report made once it finishes reads them all."
            )
        return (
            f"> **Possibly partial{side}**: when this report was made, the run's lock named {who}, a writer "
            f"on another host that cannot be checked from here: {rows} read, perhaps not all (a run copied "
            "mid-sweep; or a stale lock, its writer ended)."
        )


def writing(df: pd.DataFrame) -> Writing | None:
    """The writer that held the run while load_run read ``df`` (None: none did)."""
    found = df.attrs.get(WRITING)
    return found if isinstance(found, Writing) else None


def read_env(run_dir: Path | None) -> dict:
    """The env.json fingerprint of a run directory ({} if there is none), with every
    invocation's under "invocations" (run_id -> fingerprint, envs/*.json): a run resumed on
    another machine or driver holds several, and the environment check reads them all."""
    if run_dir is None:
        return {}
    store = RunStore(run_dir)
    env = store.env()
    # each invocation's fingerprint (one that is not JSON is named and passed over)
    return {**env, "invocations": store.envs()} if env else {}


def load_run(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """Load a run: (one row per combination x tokens_per_rank, env fingerprint dict).

    Rows are read by the store (results/store.py), which also decides which of several rows
    of one (combination, tokens) stands. Times are in µs, memory in bytes, as stored.
    The lists no report, comparison or table reads (columns.UNREAD_COLUMNS: per-rank and
    per-sample lists besides samples_us) are not read from disk: RunStore.load has them.
    Optional numeric columns that are absent are added as NaN. Rows are sorted by
    combination then tokens_per_rank. Raises ValueError (what to do included) for a missing
    path, no rows or a malformed file.
    """
    files, run_dir = _source(Path(path))
    df = (
        RunStore(path).load(required=REQUIRED_COLUMNS, skip=UNREAD_COLUMNS)
        if files is None
        else load_files(files, str(path), required=REQUIRED_COLUMNS, skip=UNREAD_COLUMNS)
    )
    if df.empty:
        raise ValueError(f"no rows in {path}: every parquet file is empty or torn; re-run the sweep")
    # asked after reading: a sweep that holds the run now held it while its rows were read
    holder = _holder(path)
    if holder and not elsewhere(holder):
        warn(
            f"{run_dir_of(path)} is still being written by {writer(holder)}: read the "
            f"{counted(len(df), 'row')} it had stored; report again once it finishes"
        )
    elif holder:
        warn(f"{run_dir_of(path)}: read the {counted(len(df), 'row')} stored; {unverified(holder, run_dir_of(path))}")
    held = Writing.of(holder, len(df)) if holder else None
    env = read_env(run_dir)
    # the columns an older or newer schema lacks, added at once (one by one fragments the frame)
    missing: dict[str, object] = {c: np.nan for c in OPTIONAL_NUMERIC if c not in df.columns}
    missing.update({c: None for c in IDENTITY_COLUMNS + PROVENANCE_COLUMNS if c not in df.columns and c not in missing})
    if missing:
        df = pd.concat([df, pd.DataFrame(missing, index=df.index)], axis=1)
    for col in OPTIONAL_NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    # Plain float64 (NaN, never pd.NA) so that numpy predicates work on every cell.
    for col in LATENCY_COLUMNS + ["tokens_per_rank"]:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    if df["tokens_per_rank"].notna().all():
        df["tokens_per_rank"] = df["tokens_per_rank"].astype("int64")
    # pandas' Arrow-backed text columns as plain objects: the tables read the rows one by one
    # (to_dict), which boxes every Arrow cell anew each time (2.4 s a pass at 10,000 rows, 1.0 s so)
    df = df.astype({c: object for c in df.columns if isinstance(df[c].dtype, pd.StringDtype)})
    df = df.copy()  # one block per dtype again: each column converted above took a block of its own
    df["reason"] = df["reason"].fillna("") if "reason" in df.columns else ""
    df["timing_note"] = df["timing_note"].fillna("") if "timing_note" in df.columns else ""
    if "samples_us" not in df.columns:
        df["samples_us"] = None
    df["knobs"] = df["knobs"].fillna("") if "knobs" in df.columns else ""
    order = [c for c in COMBINATION_COLUMNS if c in df.columns]
    df = df.sort_values(order + ["combo_key", "tokens_per_rank"], na_position="last", kind="stable").reset_index(
        drop=True
    )
    if held is not None:
        df.attrs[WRITING] = held  # the report says so in its Markdown (document.py)
    return df, env


def latest_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (combo_key, tokens_per_rank) by the store's precedence (a measured row
    before a skipped one, then the newest), in `df`'s order."""
    return latest(df)


def run_timestamp(run_dir: Path) -> str:
    """The newest row timestamp of a run (ISO text; '' without one), read from the
    timestamp column only."""
    col = RunStore(run_dir).column_values(["timestamp"]).get("timestamp")
    stamps = [str(t) for t in col.dropna()] if col is not None else []
    return max(stamps) if stamps else ""


def newest_run(root: str | Path) -> Path | None:
    """The run under ``root`` (a directory holding rows/*.parquet, at any depth) whose rows
    were written last, by their stored timestamps (not file times: a checkout rewrites those)."""
    timed = sorted((run_timestamp(r), str(r)) for r in find_runs(root))
    return Path(timed[-1][1]) if timed else None
