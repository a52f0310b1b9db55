"""Results store: one Parquet file per finished combination under <run>/rows/, skipped
rows in <run>/rows/skipped.parquet, one environment fingerprint per invocation in
<run>/envs/<run_id>.json (<run>/env.json: the first one, for readers of one fingerprint).

Guarantees (docs/design.md, "The store"): a file is complete or absent (written to a
`.tmp-*.tmp` file, synced, renamed; leftovers of a killed writer are ignored by every
reader and removed at the next start); rows are written as soon as a combination ends;
nothing is overwritten (each invocation writes its own files) or deleted; a measured
row always beats a skipped one, and among measured rows of one (combination, tokens)
the latest written wins (the folder's write sequence, `write_seq`: results/sequence.py, not
the clock). Writers hold the run's lock (moebench/results/lock.py) and never write through a
symbolic link below the run folder (UnsafePath, exit 2).

A torn row file (one that cannot be read as parquet: cut short by a copy or a disk fault,
written by something else) is moved to rows/.corrupt/ by the next sweep, which measures
its rows again; readers warn, naming it, and read the rest. A parquet file lacking a row's
columns is no row file: every reader refuses it, naming it (docs/design.md, "Environment
errors and torn files")."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd

from moebench.results.migrate import migrate
from moebench.results.row import BAD_STATUSES, Status, declared
from moebench.results.sequence import SEQ_COLUMN, SEQ_FILE, next_seq

# the reading side (store_read.py), re-exported: readers outside results/ import them from here
from moebench.results.store_read import (
    CORRUPT_DIR,
    ENV_FILE,
    ENVS_DIR,
    PAIR,
    READ_ADVICE,  # noqa: F401 (re-exported)
    ROWS_DIR,
    SKIPPED_FILE,
    TornFile,
    Unreadable,
    by_precedence,
    check_readable,  # noqa: F401 (re-exported)
    check_run_path,  # noqa: F401 (re-exported)
    enclosing_run,  # noqa: F401 (re-exported)
    find_runs,  # noqa: F401 (re-exported)
    invocation_files,  # noqa: F401 (re-exported)
    invocation_rows,  # noqa: F401 (re-exported)
    is_run_dir,  # noqa: F401 (re-exported)
    latest,  # noqa: F401 (re-exported)
    load_files,  # noqa: F401 (re-exported)
    newest_last,
    not_a_run_file,  # noqa: F401 (re-exported)
    read_all,
    read_env_file,
    read_frame,
    read_row_file,
    reading,
    refuse_broken_link,
    refuse_broken_links,
    run_dir_of,  # noqa: F401 (re-exported)
    warn,
)
from moebench.results.writable import TMP_PREFIX, TMP_SUFFIX, with_path
from moebench.util.safe_write import UnsafePath

REDO_CHOICES = ("none", "failed", "all")
FAILED = BAD_STATUSES  # what --redo failed runs again
# reason prefix of a `failed` row whose process group was lost (a rank or its node gone
# mid-combination, a group that never formed, a SLURM job that ended without a result): not
# the combination's doing, so a plain resume (--redo none) runs it again; stored() says "lost"
LOST = "lost: "
# reason prefix (after LOST where the group was lost) of a row whose token count never ran because an
# earlier count of its combination failed first (torchrun's and SLURM's ranks): nothing was measured,
# so a plain resume runs it too; stored() says "lost"
NOT_RUN = "not run: "


def _fsync(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # once, at import (os.umask is process-wide)


def _no_link(path: Path, root: Path, file: bool = True) -> None:
    """UnsafePath (exit 2) unless `path` can be written without following a link: neither it
    nor a folder between the run folder `root` and it is a symbolic link (a write would land
    outside the run folder), and it is a regular file where it exists. The run folder
    itself may be a link: --out is the user's choice."""
    cur = root
    for part in path.relative_to(root).parts:
        cur = cur / part
        if cur.is_symlink():
            raise UnsafePath(
                f"{cur} is a symbolic link (to {os.readlink(cur)}): moebench never writes through a "
                f"link in a run folder; remove it (rm {cur}) or give another --out"
            )
    if file and path.exists() and not path.is_file():
        raise UnsafePath(
            f"{path} is not a regular file: moebench writes its results there; move it away or give another --out"
        )


def refuse_undeclared(names) -> None:
    """ValueError naming each column of `names` that is neither declared (results/row.py's
    MEASURED, the spec's fields in config/spec.py) nor a registered knob (kernels/knobs.py: a
    plugin's knobs are columns of its rows): a row never stores a column no table can know."""
    unknown = sorted(n for n in names if not declared(n))
    if unknown:
        raise ValueError(
            f"undeclared row column(s) {unknown}: declare each once, in moebench/results/row.py's MEASURED "
            "(a measurement) or as a field of moebench/config/spec.py's Combo (identity), with its roles; "
            "then `python -m moebench.results.row --write`"
        )


def _atomic_write(path: Path, write, root: Optional[Path] = None) -> None:
    """`write(tmp)` then rename over `path`: a reader sees the old file, the new one, or none.
    With `root` (the run folder), never through a link below it (_no_link)."""
    if root is not None:
        _no_link(path, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=path.suffix + TMP_SUFFIX)
    os.close(fd)
    try:
        try:
            write(tmp)
        except OSError as e:  # pyarrow's and write()'s ENOSPC name no file: name the one being written
            raise with_path(e, path) from e
        os.chmod(tmp, 0o666 & ~_UMASK)  # as open() would make it (mkstemp's is 0600)
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _unless_torn(path: Path, read):
    """`read(path)`; None where the file cannot be read as parquet (torn, or not parquet: the next
    sweep sets it aside and redoes its rows), Unreadable naming it where the machine refused the
    read (store_read.reading: an environment error, not the file's fault)."""
    try:
        with reading(path):
            return read(path)
    except Unreadable:
        raise
    except Exception:  # noqa: BLE001 - pyarrow raises several types for a torn file
        return None


class RunStore:
    """A run directory: rows/*.parquet, envs/<run_id>.json, env.json, sweep-<run_id>.json."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.rows_dir = self.dir / ROWS_DIR
        self.envs_dir = self.dir / ENVS_DIR
        self._seq_synced = False  # this process has read the stored rows' largest write_seq

    # -- writing ---------------------------------------------------------------
    def refuse_links(self) -> None:
        """UnsafePath (exit 2) where rows/, envs/ or env.json is a link: checked before any work
        (each write checks its own path again). A link among the run's names that leads to no file (it
        loops, or its target is missing) is Unreadable first, worded as what it is (refuse_broken_links):
        a sweep would otherwise measure a dangling row file's rows again and set the link aside."""
        refuse_broken_links(self.dir)
        for path in (self.rows_dir, self.envs_dir, self.dir / ENV_FILE):
            _no_link(path, self.dir, file=path.suffix == ".json")

    def clean_temp(self) -> list[Path]:
        """Remove writers' leftover temp files (a writer killed between write and rename).
        Call it holding the run's lock, before any work; refuses links first (refuse_links)."""
        self.refuse_links()
        gone = []
        for d in (self.dir, self.rows_dir, self.envs_dir):
            for p in d.glob(f"{TMP_PREFIX}*") if d.is_dir() else ():
                try:
                    p.unlink()
                    gone.append(p)
                except OSError:
                    pass
        return gone

    def next_seq(self) -> int:
        """The run folder's next write sequence number (moebench/results/sequence.py): what orders
        a pair's rows, whatever the clocks said."""
        _no_link(self.dir / SEQ_FILE, self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        n = next_seq(self.dir, self.max_seq, self._seq_synced)
        self._seq_synced = True
        return n

    def max_seq(self) -> int:
        """The largest `write_seq` of the stored rows (0 where none has one)."""
        col = self.column_values([SEQ_COLUMN]).get(SEQ_COLUMN)
        if col is None:
            return 0
        seqs = pd.to_numeric(col, errors="coerce").dropna()
        return int(seqs.max()) if len(seqs) else 0

    def write_rows(self, combo_key: str, rows: list[dict]) -> Path:
        """One file per finished combination and invocation (its token counts in one file);
        a redo writes a file of its own beside the earlier one. Its rows get the folder's next
        `write_seq` (the order of writes, which the precedence reads before the timestamps).
        ValueError for a column that is not declared (refuse_undeclared)."""
        refuse_undeclared({k for r in rows for k in r})
        tokens = "_".join(str(r["tokens_per_rank"]) for r in rows)
        run_id = rows[0].get("run_id") if rows else None
        path = self.rows_dir / f"{combo_key}-T{tokens}{f'-{run_id}' if run_id else ''}.parquet"
        seq = self.next_seq() if rows else 0
        df = pd.DataFrame([{**r, SEQ_COLUMN: seq} for r in rows])
        _atomic_write(path, lambda p: df.to_parquet(p, index=False), self.dir)
        return path

    def write_frame(self, path: Path, df: pd.DataFrame) -> Path:
        """`df` as the parquet file `path` inside the run (whole or absent, never through a link)."""
        _atomic_write(path, lambda p: df.to_parquet(p, index=False), self.dir)
        return path

    def update_rows(self, update) -> int:
        """Rewrite the measured row files in place, each through `update(table)` (a pyarrow
        Table in, a new Table or None for no change out), whole or not at all (atomic); the
        number of files rewritten. Every file is checked before any is rewritten (_refuse_unwritable):
        one the machine refuses to read raises Unreadable, a link or no regular file UnsafePath,
        naming it, with the run as it was; a torn file is left to the next sweep. Then each is read,
        updated and written before the next is read: one table in memory at a time, however many
        rows the run holds (`trace --import` of a big run). What fails then (a read error past a
        file's footer, `update` raising, an undeclared column) stops after the files before it were
        rewritten, each whole: the same command, run again, finishes the rest. Call it holding the
        run's lock, as every writer does (`moebench trace --import` takes it; a sweep holds it)."""
        import pyarrow.parquet as pq

        files = self.row_files()
        self._refuse_unwritable(files)
        changed = 0
        for f in files:
            table = _unless_torn(f, pq.read_table)
            new = update(table) if table is not None else None
            if new is not None:
                refuse_undeclared(set(new.column_names) - set(table.column_names))
                _atomic_write(f, lambda p, t=new: pq.write_table(t, p), self.dir)
                changed += 1
            del table, new  # this file's tables gone before the next is read
        return changed

    def refuse_unreadable(self) -> None:
        """Unreadable (exit 2), naming it, where the machine refuses to read a row file (mode 000, a
        failing disk): what rewrites a run's rows from work of its own (`trace --import`'s exports)
        asks before it starts. A torn file passes (the next sweep redoes it)."""
        self._refuse_unwritable(self.row_files(), links=False)

    def _refuse_unwritable(self, files: list[Path], links: bool = True) -> None:
        """Unreadable where the machine refuses to read one of `files` (its footer: the schema), and,
        with `links`, UnsafePath where one is a link or no regular file (_no_link), which its rewrite
        would refuse: asked of every file before the first is rewritten."""
        import pyarrow.parquet as pq

        for f in files:
            if links:
                _no_link(f, self.dir)
            _unless_torn(f, lambda p: pq.ParquetFile(p).schema_arrow)

    def write_skipped(self, rows: list[dict]) -> Optional[Path]:
        """Merge skipped rows into rows/skipped.parquet: a newer skip replaces an older skip of
        the same (combination, tokens); a pair that has a measured row gets none (a skip never
        hides a measurement); the skipped rows of other combinations stay."""
        refuse_undeclared({k for r in rows for k in r})
        path = self.rows_dir / SKIPPED_FILE
        measured = {(k, int(t)) for k, ts in self.stored().items() for t in ts}
        rows = [r for r in rows if (r["combo_key"], int(r["tokens_per_rank"])) not in measured]
        if not rows:
            return path if path.exists() else None
        seq = self.next_seq()
        new = pd.DataFrame([{**r, SEQ_COLUMN: seq} for r in rows])
        old = self._skipped_rows()
        if old is not None:
            fresh = set(zip(new["combo_key"], new["tokens_per_rank"].astype(int), strict=True))
            keep = [(k, int(t)) not in fresh for k, t in zip(old["combo_key"], old["tokens_per_rank"], strict=True)]
            new = pd.concat([old[keep], new], ignore_index=True)
        _atomic_write(path, lambda p: new.to_parquet(p, index=False), self.dir)
        return path

    def _skipped_rows(self) -> Optional[pd.DataFrame]:
        """rows/skipped.parquet's rows (None without one; a torn one is set aside, saying so:
        its skips are the plan's, which every sweep writes again)."""
        path = self.rows_dir / SKIPPED_FILE
        if not (path.exists() or path.is_symlink()):  # a link that leads nowhere: read_row_file names it
            return None
        try:
            return read_row_file(path)
        except TornFile as e:
            warn(f"{e}: moved to {self.set_aside(path)}")
            return None

    def skipped_keys(self) -> set[str]:
        """The combo_keys of rows/skipped.parquet (none without one)."""
        df = self._skipped_rows()
        return set() if df is None else set(df["combo_key"])

    def torn_files(self) -> list[TornFile]:
        """The row files (skipped.parquet included) that cannot be read as parquet. A link among the
        run's names that leads to no file is none: Unreadable, before any is listed (refuse_broken_links;
        a sweep's --dry-run asks this before it plans)."""
        refuse_broken_links(self.dir)
        torn = []
        for p in [self.rows_dir / SKIPPED_FILE, *self.row_files()]:
            try:
                if p.exists() or p.is_symlink():  # a link that leads nowhere: Unreadable, never set aside
                    read_row_file(p)
            except TornFile as e:
                torn.append(e)
        return torn

    def set_aside(self, path: Path) -> Path:
        """Move a torn file to rows/.corrupt/<name> (<name>.<n> where one is there already):
        kept for a look, out of every reader's way, its rows missing for the plan."""
        corrupt = self.rows_dir / CORRUPT_DIR
        corrupt.mkdir(exist_ok=True)
        if corrupt.is_symlink() or not corrupt.is_dir():  # a move through a link would leave the run folder
            raise ValueError(f"{corrupt} is not a folder of the run (a link?): remove it, then re-run")
        dest, n = corrupt / path.name, 1
        while dest.exists() or dest.is_symlink():
            dest, n = corrupt / f"{path.name}.{n}", n + 1
        os.rename(path, dest)
        _fsync(self.rows_dir)
        return dest

    def set_aside_torn(self) -> list[tuple[TornFile, Path]]:
        """Set every torn row file aside (set_aside); [(what was wrong, where it went)]. Call it
        holding the run's lock, before planning, so that the plan measures their rows again."""
        return [(t, self.set_aside(t.path)) for t in self.torn_files()]

    def write_json(self, name: str, data: dict) -> Path:
        path = self.dir / name
        _atomic_write(
            path, lambda p: Path(p).write_text(json.dumps(data, indent=2, sort_keys=True, default=str)), self.dir
        )
        return path

    def write_env(self, info: dict, run_id: str) -> Path:
        """This invocation's fingerprint as envs/<run_id>.json (its rows' run_id names it);
        env.json, which readers of a single fingerprint use, only where the run has none."""
        path = self.write_json(f"envs/{run_id}.json", {**info, "run_id": run_id})
        first = self.dir / ENV_FILE
        if first.is_symlink() or not first.exists():  # a link: refused by write_json
            self.write_json(ENV_FILE, {**info, "run_id": run_id})
        return path

    # -- reading ---------------------------------------------------------------
    def row_files(self) -> list[Path]:
        """The combinations' row files (a writer's leftover temp file is not one); Unreadable where
        rows/ is a link that leads to no folder (store_read.broken_link), whose rows would read as none."""
        refuse_broken_link(self.rows_dir)
        return sorted(
            p for p in self.rows_dir.glob("*.parquet") if p.name != SKIPPED_FILE and not p.name.startswith(".")
        )

    def env_of(self, run_id: str) -> dict:
        """The fingerprint an invocation measured under ({} for runs written before envs/, or
        where its file is not a JSON object: a warning names it)."""
        return read_env_file(self.envs_dir / f"{run_id}.json")

    def envs(self) -> dict[str, dict]:
        """run_id -> fingerprint of every envs/*.json (a file that is not a JSON object is
        passed over with a warning naming it; Unreadable where envs/ is a link that leads to no folder)."""
        refuse_broken_link(self.envs_dir)
        found = {p.stem: read_env_file(p) for p in sorted(self.envs_dir.glob("*.json")) if not p.name.startswith(".")}
        return {k: v for k, v in found.items() if v}

    def env(self) -> dict:
        """env.json, the first invocation's fingerprint ({} where there is none); ValueError
        naming it where it is not a JSON object; Unreadable where it is a link that leads to no file."""
        path = self.dir / ENV_FILE
        refuse_broken_link(path)
        if not path.is_file():
            return {}
        try:
            with reading(path):
                data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"malformed env file {path}: {e}; fix or delete it") from e
        if not isinstance(data, dict):
            raise ValueError(f"malformed env file {path}: not a JSON object; fix or delete it")
        return data

    def sweep_records(self) -> list[dict]:
        """Each invocation's sweep-<run_id>.json (the sweep, its cli_overrides), by file name."""
        records = []
        for p in sorted(self.dir.glob("sweep-*.json")):
            with reading(p):
                records.append(json.loads(p.read_text()))
        return records

    def column_values(self, names: Iterable[str]) -> pd.DataFrame:
        """Only the columns `names` (those a file has) of every row file, torn and foreign files
        passed over: a cheap read for a column or two (trace paths, labels, timestamps). A file
        the machine refuses to read raises Unreadable, naming it: its rows are not dropped unsaid."""
        import pyarrow.parquet as pq

        def some(path: Path) -> pd.DataFrame:
            cols = [c for c in names if c in pq.ParquetFile(path).schema_arrow.names]
            return pq.read_table(path, columns=cols).to_pandas() if cols else pd.DataFrame()

        frames = [df for f in self.row_files() if (df := _unless_torn(f, some)) is not None and len(df.columns)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(names))

    def stored(self) -> dict[str, dict[int, str]]:
        """combo_key -> {tokens: status} of the measured (not skipped) rows, the newest of
        each pair (older schema versions under their migrated keys); "lost" for a failed row
        whose reason starts with LOST or NOT_RUN (nothing measured: a plain resume runs it)."""
        # a torn file is redone (the sweep sets it aside first and says so: set_aside_torn)
        frames = read_all(newest_last(self.row_files()), warn_torn=False)
        out: dict[str, dict[int, str]] = {}
        frames = [f for f in frames if len(f)]
        if not frames:
            return out
        df = migrate(pd.concat(frames, ignore_index=True), str(self.dir))
        if "reason" not in df.columns:
            df["reason"] = ""
        cols = ["combo_key", "tokens_per_rank", "status", "reason"]
        for key, t, st, why in by_precedence(df)[cols].itertuples(index=False):
            lost = st == Status.FAILED and isinstance(why, str) and why.startswith((LOST, NOT_RUN))
            out.setdefault(key, {})[int(t)] = "lost" if lost else st
        return out

    def todo_tokens(self, combo_key: str, tokens: Iterable[int], redo: str, stored=None) -> list[int]:
        """Token counts of a combination that still need running: not stored, lost (LOST) or not
        run (NOT_RUN), and with `redo` failed the failed ones, with all every one."""
        if redo not in REDO_CHOICES:
            raise ValueError(f"--redo {redo!r}; valid: {', '.join(REDO_CHOICES)}")
        have = (stored if stored is not None else self.stored()).get(combo_key, {})
        todo = []
        for t in tokens:
            st = have.get(t)
            if st in (None, "lost") or redo == "all" or (redo == "failed" and st in FAILED):
                todo.append(t)
        return todo

    def load(self, all_rows: bool = False, required=(*PAIR, "status"), skip=()) -> pd.DataFrame:
        """The rows of the run, one per (combination, tokens): a measured row beats a skipped
        one whatever their times, then the newest wins. `all_rows`: every stored row.
        `required`: the columns without which a file is not a row file (ValueError); `skip`:
        columns not read at all (the report's loader leaves out lists it never reads)."""
        files = newest_last(self.row_files())
        if (self.rows_dir / SKIPPED_FILE).exists() or (self.rows_dir / SKIPPED_FILE).is_symlink():
            files = [self.rows_dir / SKIPPED_FILE, *files]
        df = read_frame(files, warn_torn=True, required=required, skip=skip)
        if df.empty:
            return pd.DataFrame()
        df = migrate(df, str(self.dir))
        if all_rows:
            return df
        return by_precedence(df).drop_duplicates(PAIR, keep="last").reset_index(drop=True)
