"""The store's reading side (store.py re-exports it; readers outside results/ import from
store.py): row files read and refused, torn files passed over with a warning, the precedence
among several rows of one (combination, tokens), fingerprint files."""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from moebench.results.migrate import check_versions, migrate
from moebench.results.row import Status, columns
from moebench.results.sequence import SEQ_COLUMN
from moebench.results.writable import CAUSES, link_fault
from moebench.util.safe_write import NO_SUCH
from moebench.util.words import counted

ROWS_DIR = "rows"  # a run's row files' folder, <run>/rows/ (RunStore.rows_dir)
ENV_FILE = "env.json"  # a run's first fingerprint, <run>/env.json (RunStore.env)
ENVS_DIR = "envs"  # each invocation's fingerprint, <run>/envs/<run_id>.json (RunStore.envs_dir)
# how far below its run the tool writes a file: a profiler-timed combination's trace,
# <run>/traces/profiler/<combo_key>/rank<r>_T<t>.json.gz (measure/capture.py), 4 folders down
RUN_DEPTH = 4
SKIPPED_FILE = "skipped.parquet"
PAIR = ["combo_key", "tokens_per_rank"]
CORRUPT_DIR = ".corrupt"  # under rows/: torn files set aside (no reader's rows/*.parquet glob looks inside)


class TornFile(ValueError):
    """A row file that cannot be read as parquet (`why` says how it failed)."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path}: torn row file ({why})")
        self.path, self.why = Path(path), why


class Unreadable(OSError):
    """An input the machine refused to read (a row file or fingerprint of mode 000, a failing disk),
    naming the file (pyarrow's error names none): the environment's line names it and says to make
    it readable, never to give --out (moebench/cli/main.py), which no write folder helps."""


READ_ADVICE = "make it readable or pass a run you can read"  # what to do about an Unreadable


@contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Turns an environment error (writable.CAUSES) of a read of the input `path` inside the block
    into Unreadable naming `path`; any other OSError passes as it is."""
    try:
        yield
    except Unreadable:
        raise
    except OSError as e:
        if (broken := broken_link(path)) is not None:  # a dangling link's ENOENT: no torn file, no defect
            raise broken from e
        if e.errno not in CAUSES:
            raise
        raise Unreadable(e.errno, os.strerror(e.errno), os.fspath(path)) from e


def broken_link(path: str | Path) -> Optional[Unreadable]:
    """Unreadable naming `path` where it is a symbolic link that leads to no file: ELOOP where it loops,
    ENOENT where its target is missing (writable.describe words both, LINK_ADVICE says what to do);
    None where it is no link or one that leads somewhere. A reader that took either for a missing file
    would drop the rows or the fingerprint it stands for without a word."""
    code = link_fault(path)
    return Unreadable(code, os.strerror(code), os.fspath(path)) if code is not None else None


def refuse_broken_link(path: str | Path) -> None:
    """Raises broken_link's Unreadable where `path` is a link that leads to no file."""
    if (broken := broken_link(path)) is not None:
        raise broken


def refuse_broken_links(run_dir: str | Path) -> None:
    """broken_link's Unreadable for the first link among a run's own names that leads to no file:
    rows/, envs/, env.json, and the files in rows/ and envs/ (a writer's temp files aside): checked
    before any work by every command given the run (check_readable) and by a sweep into it
    (RunStore.refuse_links), so that no reader takes one for a missing file and no sweep measures its
    rows again."""
    run_dir = Path(run_dir)
    for name in (ROWS_DIR, ENVS_DIR, ENV_FILE):
        refuse_broken_link(run_dir / name)
    for folder, suffix in ((run_dir / ROWS_DIR, ".parquet"), (run_dir / ENVS_DIR, ".json")):
        with reading(folder):
            names = sorted(os.listdir(folder)) if folder.is_dir() else []
        for name in names:
            if name.endswith(suffix) and not name.startswith("."):
                refuse_broken_link(folder / name)


A_RUN = "the folder `moebench sweep` wrote, the one holding rows/ and env.json"  # what a run argument takes
# what to do about a file that holds no rows of moebench's, as its reader knows where it lies (`advice`):
MOVE_OUT = "move it out of the run's rows/ folder"  # a file among a run's rows/ (RunStore's readers)
PASS_A_RUN = f"pass {A_RUN}, or its rows/*.parquet files"  # files given in place of a run (load_files)


def given_advice(path: Path) -> str:
    """What to do about a file given in place of a run (load_files) that holds no rows: MOVE_OUT where
    it lies in a run's rows/ folder (run_dir_of's run: reading that run fails on it too), else PASS_A_RUN."""
    return MOVE_OUT if Path(path).parent.name == ROWS_DIR else PASS_A_RUN


def not_a_run_file(path: Path, files: str = "one of its rows/*.parquet files") -> ValueError:
    """The one line for a plain file given where a run goes (report, compare, trace, tune --results):
    '<path>: a file, not a run folder (pass ...)'. `files` names the files the command reads alone."""
    return ValueError(f"{path}: a file, not a run folder (pass {A_RUN}, or {files})")


def check_run_path(path: str | Path) -> Path:
    """`path` as a run, a folder of row files or one row file: ValueError with what to pass where
    nothing is there, and (`not_a_run_file`) for a file that is not a .parquet one, before it is read
    as rows (a README is not a torn row file). A report checks its runs so before its report folder:
    a missing run would otherwise read as that folder's environment error ('not a directory' for
    README.md/x, 'permission denied' for a parent not ours). A run that may not be looked at (below
    a folder the user may not search) says so: no --out helps there."""
    path = Path(path)
    if not check_readable(path):
        raise ValueError(f"results path {path} does not exist: {PASS_A_RUN}")
    if path.is_file() and path.suffix != ".parquet":
        raise not_a_run_file(path)
    return path


def check_readable(path: str | Path, what: str = "a run") -> bool:
    """Whether `path` exists (Path.exists()); ValueError, one line, for one that may not be looked
    at (EACCES: below a folder the user may not search, where Path.exists() raises), which no --out
    helps: 'PATH: cannot be read (Permission denied): pass {what} you can read' (`what`: what the
    command takes there, a run or, for `trace`, a trace file). So is a folder, or its rows/, that
    may not be listed (mode 000, another user's 700), whose files would read as none or as a
    refused write ('RUN/report: permission denied; give --out ...'). A symbolic link on the way that
    leads to no file (`ln -s run run`; one to a missing folder) is no missing path: Unreadable naming
    the link (broken_link), whose line says it loops or dangles and to remove it; so is one among a
    run folder's own names (refuse_broken_links)."""
    for part in [*reversed(Path(path).parents), Path(path)]:
        refuse_broken_link(part)
    try:
        os.stat(path)  # Path.exists() raises EACCES up to Python 3.13, reads it as False from 3.14
    except OSError as e:
        if e.errno in NO_SUCH:
            return False
        raise ValueError(f"{path}: cannot be read ({e.strerror}): pass {what} you can read") from None
    for folder in (Path(path), Path(path) / ROWS_DIR):
        if folder.is_dir() and not os.access(folder, os.R_OK | os.X_OK):
            raise ValueError(f"{folder}: cannot be read ({os.strerror(errno.EACCES)}): pass {what} you can read")
    if Path(path).is_dir():
        refuse_broken_links(path)
    return True


def run_dir_of(path: str | Path) -> Path:
    """The run folder `path` stands for: a folder itself; a row file in a run's rows/ its run (the
    folder holding env.json), a loose parquet file its own folder."""
    path = Path(path)
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == ROWS_DIR else path.parent


def is_run_dir(path: str | Path) -> bool:
    """Whether `path` is a run folder as `moebench sweep` writes it (one holding rows/ or env.json)."""
    return (Path(path) / ROWS_DIR).is_dir() or (Path(path) / ENV_FILE).is_file()


def enclosing_run(path: str | Path) -> Optional[Path]:
    """The nearest run folder (is_run_dir) that `path` is or lies in, made absolute; None outside
    any run. It climbs at most RUN_DEPTH folders: the deepest file the tool writes below its run is
    a profiler trace, <run>/traces/profiler/<combo_key>/rank<r>_T<t>.json.gz (a torch trace,
    <run>/traces/<combo_key>/..., and nsys's captures, <run>/traces/nsys/ranks_<pid>.<n>.*, lie 3
    down), so a file outside any run is not claimed by some folder far above it that holds an
    env.json. (A `trace.dir` of more than two folders puts torch traces deeper: `moebench trace RUN`
    names them from the run.) Not run_dir_of, which maps a run argument (a folder, a row file) to
    the run it stands for without climbing."""
    path = Path(path).absolute()
    return next((d for d in [path, *path.parents][: RUN_DEPTH + 1] if is_run_dir(d)), None)


def warn(text: str) -> None:
    """One warning line on stderr (a reader passing over what it cannot use)."""
    print(f"moebench: warning: {text}", file=sys.stderr)


@contextmanager
def _torn_if_unreadable(path: Path) -> Iterator[None]:
    """Turns a failed parquet read inside the block into TornFile; an environment error
    (writable.CAUSES: the machine refused the read, not the file's fault) is Unreadable naming it."""
    try:
        with reading(path):
            yield
    except Unreadable:
        raise
    except OSError as e:
        raise TornFile(path, f"cannot be read as parquet: {type(e).__name__}") from e
    except Exception as e:  # pyarrow raises several types (ArrowInvalid, ...) for a torn file
        raise TornFile(path, f"cannot be read as parquet: {type(e).__name__}") from e


def read_row_file(path: Path, required=(*PAIR, "status"), advice: str = MOVE_OUT) -> pd.DataFrame:
    """One row file (or skipped.parquet) of a run. Raises TornFile when it cannot be read as
    parquet, ValueError naming it when it holds no rows of moebench's (`required` columns
    missing, a schema version this code does not know), `advice` its last words (MOVE_OUT for a
    file of a run's rows/, PASS_A_RUN for one given in place of a run); an environment error passes."""
    with _torn_if_unreadable(path):
        df = pd.read_parquet(path)
    missing = [c for c in required if c not in df.columns]
    if len(df.columns) and missing:
        raise ValueError(
            f"{path}: missing columns {missing}: not a row file of moebench's store (or of an "
            f"incompatible version); {advice}"
        )
    check_types(df, path, advice)
    check_versions(df, str(path))
    return df


def _numeric_columns() -> dict[str, str]:
    return {c.name: c.dtype for c in columns() if c.dtype in ("int", "float")}


def check_types(df: pd.DataFrame, path: Path, advice: str = MOVE_OUT) -> None:
    """ValueError naming the file, the column and a value where a declared number column
    (results/row.py) holds something else, or a row lacks its combination or token count: a
    corrupt file read on would fail later (`int('four')`) without saying which file it was
    (`advice`: what to do, as read_row_file)."""
    for name in PAIR:
        if name in df.columns and df[name].isna().any():
            raise ValueError(
                f"{path}: {counted(int(df[name].isna().sum()), 'row')} without {name}: the file is corrupt or "
                f"not moebench's; {advice}"
            )
    numeric = _numeric_columns()
    for name in df.columns:
        if name not in numeric or df[name].dtype.kind in "iufb":
            continue
        values = df[name]
        bad = values.map(_not_number)
        if bad.any():
            shown = repr(values[bad].iloc[0])
            raise ValueError(
                f"{path}: column {name} holds {shown[:60]}{'...' if len(shown) > 60 else ''} where a number "
                f"({numeric[name]}) belongs: the file is corrupt or not moebench's; {advice}"
            )


def _not_number(v) -> bool:
    """A cell that is neither missing nor a number (nor text of one)."""
    if v is None or v is pd.NA or isinstance(v, (int, float, np.number)):
        return False
    try:
        float(v)
    except (TypeError, ValueError):
        return True
    return False


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t)


def _check_table_types(table: pa.Table, path: Path, advice: str) -> None:
    """check_types on an Arrow table: only the columns that could fail it are converted to pandas
    (a pair column with a null, or of floats: NaN; a declared number Arrow holds as something else)."""
    numeric = _numeric_columns()
    suspect = [
        n
        for n in table.column_names
        if (n in PAIR and (table.column(n).null_count or pa.types.is_floating(table.schema.field(n).type)))
        or (n in numeric and not _is_number(table.schema.field(n).type))
    ]
    if suspect:
        check_types(table.select(suspect).to_pandas(), path, advice)


def read_row_table(path: Path, required=(*PAIR, "status"), wanted=None, skip=(), advice: str = MOVE_OUT) -> pa.Table:
    """`read_row_file` as an Arrow table, only the `wanted` columns (those of them it has; None:
    all) less those in `skip` (never read from disk): a reader of many files converts their
    concatenation to pandas once (a 1,000-file run took 11 s converting file by file)."""
    keep = None if wanted is None else {*wanted, *required, "schema_version"}
    with _torn_if_unreadable(path), pq.ParquetFile(path) as pf:
        names = pf.schema_arrow.names
        cols = [c for c in names if (keep is None or c in keep) and c not in skip]
        table = pf.read(columns=None if keep is None and not skip else cols)
    missing = [c for c in required if c not in names]
    if names and missing:
        raise ValueError(
            f"{path}: missing columns {missing}: not a row file of moebench's store (or of an "
            f"incompatible version); {advice}"
        )
    _check_table_types(table, path, advice)
    if "schema_version" in names:
        versions = table.column("schema_version").to_numpy(zero_copy_only=False)  # no pandas frame per file
        check_versions(pd.DataFrame({"schema_version": versions}), str(path))
    return table


def read_frame(
    files: list[Path],
    warn_torn: bool,
    required=(*PAIR, "status"),
    wanted=None,
    skip=(),
    advice: str | None = MOVE_OUT,
) -> pd.DataFrame:
    """The rows of `files` in their order as one frame (only the `wanted` columns, where given), the
    tables concatenated before their one conversion to pandas; a torn file is passed over as
    `read_all` does (`advice`: as read_row_file's; None: each file's given_advice). Files whose
    types Arrow cannot unify (an old schema's) are converted one by one and concatenated by pandas,
    as `read_all`'s callers do."""
    tables = []
    for p in files:
        try:
            table = read_row_table(p, required, wanted, skip, advice if advice is not None else given_advice(p))
        except TornFile as e:
            if warn_torn:
                warn(
                    f"{e}: read the rest; the next sweep into the run moves it to rows/{CORRUPT_DIR}/ "
                    "and measures its rows again"
                )
            continue
        if table.num_rows:
            tables.append(table)
    if not tables:
        return pd.DataFrame()
    try:
        return pa.concat_tables(tables, promote_options="permissive").to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return pd.concat([t.to_pandas() for t in tables], ignore_index=True)


def newest_last(files: list[Path]) -> list[Path]:
    """Files in write order (rows of one second's timestamp are ordered by their file)."""

    def mtime(p: Path) -> int:
        try:
            return p.stat().st_mtime_ns
        except OSError:
            return 0

    return sorted(files, key=lambda p: (mtime(p), p.name))


def read_all(files: list[Path], warn_torn: bool, required=(*PAIR, "status")) -> list[pd.DataFrame]:
    """The files' frames; a torn file is passed over (with a warning naming it: `warn_torn`)."""
    frames = []
    for p in files:
        try:
            frames.append(read_row_file(p, required))
        except TornFile as e:
            if warn_torn:
                warn(
                    f"{e}: read the rest; the next sweep into the run moves it to rows/{CORRUPT_DIR}/ "
                    "and measures its rows again"
                )
    return frames


def find_runs(root: str | Path) -> list[Path]:
    """The run folders under `root` (`root` itself included), at any depth: each folder whose
    rows/ holds a row file (*.parquet; a writer's temp file and rows/.corrupt/ are none), sorted."""
    return sorted({p.parent.parent for p in Path(root).rglob("rows/*.parquet") if not p.name.startswith(".")})


def invocation_files(rows_dir: Path, run_id: str, combo_key: str = "*") -> list[Path]:
    """The row files in `rows_dir` one invocation (`run_id`) wrote (of one combination:
    `combo_key`), by name."""
    return sorted(Path(rows_dir).glob(f"{combo_key}-*-{run_id}.parquet"))


def invocation_rows(rows_dir: Path, run_id: str, skip=(), required=("combo_key",)) -> dict[str, pd.DataFrame]:
    """file name -> rows of each row file one invocation wrote, but those named in `skip` (a
    reader following a run as it is written: SLURM jobs' rows); a torn one is passed over (the
    next sweep sets it aside and measures its rows again)."""
    out = {}
    for f in invocation_files(rows_dir, run_id):
        if f.name not in skip:
            try:
                out[f.name] = read_row_file(f, required)
            except TornFile:
                continue
    return out


def read_env_file(path: Path) -> dict:
    """A fingerprint file's object ({} where absent; {} and a warning where it is no JSON object;
    Unreadable naming a link that leads to no file: broken_link)."""
    refuse_broken_link(path)
    if not path.is_file():
        return {}
    try:
        with reading(path):
            data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        warn(f"{path}: not a JSON fingerprint ({type(e).__name__}): passed over")
        return {}
    if not isinstance(data, dict):
        warn(f"{path}: not a JSON object: passed over")
        return {}
    return data


def by_precedence(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in ascending precedence: skipped before measured, then by the run folder's write
    sequence (`write_seq`, moebench/results/sequence.py: the clock may have stepped back between
    two writes), a row without one (written before it existed) first and among those by
    timestamp (a row without one first); stable, so frames concatenated in write order break
    ties."""
    seq = pd.to_numeric(df[SEQ_COLUMN], errors="coerce") if SEQ_COLUMN in df.columns else None
    keys = pd.DataFrame(
        {
            "measured": df["status"] != Status.SKIPPED if "status" in df.columns else True,
            "seq": seq.fillna(-1) if seq is not None else -1,
            "t": df["timestamp"].map(lambda v: v if isinstance(v, str) else "") if "timestamp" in df.columns else "",
        },
        index=df.index,
    )
    return df.loc[keys.sort_values(["measured", "seq", "t"], kind="stable").index]


def latest(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (combination, tokens), the store's precedence deciding (a measured row beats
    a skipped one, then the latest written wins: by_precedence), in `df`'s order."""
    if df.empty:
        return df
    return by_precedence(df).drop_duplicates(PAIR, keep="last").sort_index()


def load_files(files: list[Path], origin: str, required=(*PAIR, "status"), skip=()) -> pd.DataFrame:
    """The rows of row files outside a run folder (a copied file, a folder of them), migrated,
    the newest of each (combination, tokens) by the store's precedence; torn files are passed
    over with a warning. `required`: the columns without which a file is not a row file; `skip`:
    columns not read."""
    df = read_frame(newest_last(list(files)), warn_torn=True, required=required, skip=skip, advice=None)
    if df.empty:
        return df
    df = migrate(df, origin)
    return latest(df).reset_index(drop=True)
