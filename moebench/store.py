"""Results store: one Parquet file per finished combination under <run>/rows/, skipped
rows in <run>/rows/skipped.parquet, one environment fingerprint per invocation in
<run>/envs/<run_id>.json (<run>/env.json: the first one, for readers of one fingerprint).

Guarantees (docs/design.md, "The store"): a file is complete or absent (written to a
`.tmp-*.tmp` file, synced, renamed; leftovers of a killed writer are ignored by every
reader and removed at the next start); rows are written as soon as a combination ends;
nothing is overwritten (each invocation writes its own files) or deleted; a measured
row always beats a skipped one, and among measured rows of one (combination, tokens)
the newest wins. Writers hold the run's lock (moebench/lock.py) and never write through a
symbolic link below the run folder (UnsafePath, exit 2)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd

from .lock import UnsafePath
from .migrate import migrate

REDO_CHOICES = ("none", "failed", "all")
FAILED = ("failed", "timeout", "oom", "incorrect")  # what --redo failed runs again
# reason prefix of a `failed` row whose process group was lost (a rank or its node gone
# mid-combination, a group that never formed, a SLURM job that ended without a result): not
# the combination's doing, so a plain resume (--redo none) runs it again; stored() says "lost"
LOST = "lost: "
SKIPPED_FILE = "skipped.parquet"
TMP_PREFIX, TMP_SUFFIX = ".tmp-", ".tmp"  # never *.parquet: no reader's glob matches a torn file
PAIR = ["combo_key", "tokens_per_rank"]


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
            raise UnsafePath(f"{cur} is a symbolic link (to {os.readlink(cur)}): moebench never writes through a "
                             f"link in a run folder; remove it (rm {cur}) or give another --out")
    if file and path.exists() and not path.is_file():
        raise UnsafePath(f"{path} is not a regular file: moebench writes its results there; move it away or "
                         "give another --out")


def _atomic_write(path: Path, write, root: Optional[Path] = None) -> None:
    """`write(tmp)` then rename over `path`: a reader sees the old file, the new one, or none.
    With `root` (the run folder), never through a link below it (_no_link)."""
    if root is not None:
        _no_link(path, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=path.suffix + TMP_SUFFIX)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # as open() would make it (mkstemp's is 0600)
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _newest_last(files: list[Path]) -> list[Path]:
    """Files in write order (rows of one second's timestamp are ordered by their file)."""
    def mtime(p: Path) -> int:
        try:
            return p.stat().st_mtime_ns
        except OSError:
            return 0
    return sorted(files, key=lambda p: (mtime(p), p.name))


def _read_all(files: list[Path], skip_torn: bool) -> list[pd.DataFrame]:
    frames = []
    for p in files:
        try:
            frames.append(pd.read_parquet(p))
        except Exception:
            if not skip_torn:
                raise
    return frames


def _by_precedence(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in ascending precedence: skipped before measured, then by timestamp (stable, so
    frames concatenated in write order break ties)."""
    df = df.copy()
    df["_measured"] = df["status"] != "skipped"
    keys = ["_measured", "timestamp"] if "timestamp" in df.columns else ["_measured"]
    return df.sort_values(keys, kind="stable").drop(columns="_measured")


class RunStore:
    """A run directory: rows/*.parquet, envs/<run_id>.json, env.json, sweep-<run_id>.json."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.rows_dir = self.dir / "rows"
        self.envs_dir = self.dir / "envs"

    # -- writing ---------------------------------------------------------------
    def refuse_links(self) -> None:
        """UnsafePath (exit 2) where rows/, envs/ or env.json is a link: checked before any work
        (each write checks its own path again)."""
        for path in (self.rows_dir, self.envs_dir, self.dir / "env.json"):
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

    def write_rows(self, combo_key: str, rows: list[dict]) -> Path:
        """One file per finished combination and invocation (its token counts in one file);
        a redo writes a file of its own beside the earlier one."""
        tokens = "_".join(str(r["tokens_per_rank"]) for r in rows)
        run_id = rows[0].get("run_id") if rows else None
        path = self.rows_dir / f"{combo_key}-T{tokens}{f'-{run_id}' if run_id else ''}.parquet"
        df = pd.DataFrame(rows)
        _atomic_write(path, lambda p: df.to_parquet(p, index=False), self.dir)
        return path

    def write_skipped(self, rows: list[dict]) -> Optional[Path]:
        """Merge skipped rows into rows/skipped.parquet: a newer skip replaces an older skip of
        the same (combination, tokens); a pair that has a measured row gets none (a skip never
        hides a measurement); the skipped rows of other combinations stay."""
        path = self.rows_dir / SKIPPED_FILE
        measured = {(k, int(t)) for k, ts in self.stored().items() for t in ts}
        rows = [r for r in rows if (r["combo_key"], int(r["tokens_per_rank"])) not in measured]
        if not rows:
            return path if path.exists() else None
        new = pd.DataFrame(rows)
        if path.exists():
            old = pd.read_parquet(path)
            fresh = set(zip(new["combo_key"], new["tokens_per_rank"].astype(int)))
            keep = [(k, int(t)) not in fresh for k, t in zip(old["combo_key"], old["tokens_per_rank"])]
            new = pd.concat([old[keep], new], ignore_index=True)
        _atomic_write(path, lambda p: new.to_parquet(p, index=False), self.dir)
        return path

    def write_json(self, name: str, data: dict) -> Path:
        path = self.dir / name
        _atomic_write(path, lambda p: Path(p).write_text(json.dumps(data, indent=2, sort_keys=True, default=str)),
                      self.dir)
        return path

    def write_env(self, info: dict, run_id: str) -> Path:
        """This invocation's fingerprint as envs/<run_id>.json (its rows' run_id names it);
        env.json, which readers of a single fingerprint use, only where the run has none."""
        path = self.write_json(f"envs/{run_id}.json", {**info, "run_id": run_id})
        first = self.dir / "env.json"
        if first.is_symlink() or not first.exists():  # a link: refused by write_json
            self.write_json("env.json", {**info, "run_id": run_id})
        return path

    # -- reading ---------------------------------------------------------------
    def row_files(self) -> list[Path]:
        """The combinations' row files (a writer's leftover temp file is not one)."""
        return sorted(p for p in self.rows_dir.glob("*.parquet")
                      if p.name != SKIPPED_FILE and not p.name.startswith("."))

    def env_of(self, run_id: str) -> dict:
        """The fingerprint an invocation measured under ({} for runs written before envs/)."""
        path = self.envs_dir / f"{run_id}.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def stored(self) -> dict[str, dict[int, str]]:
        """combo_key -> {tokens: status} of the measured (not skipped) rows, the newest of
        each pair (older schema versions under their migrated keys); "lost" for a failed row
        whose reason starts with LOST."""
        frames = _read_all(_newest_last(self.row_files()), skip_torn=True)  # a torn file is redone
        out: dict[str, dict[int, str]] = {}
        frames = [f for f in frames if len(f)]
        if not frames:
            return out
        df = migrate(pd.concat(frames, ignore_index=True), str(self.dir))
        if "reason" not in df.columns:
            df["reason"] = ""
        cols = ["combo_key", "tokens_per_rank", "status", "reason"]
        for key, t, st, why in _by_precedence(df)[cols].itertuples(index=False):
            lost = st == "failed" and isinstance(why, str) and why.startswith(LOST)
            out.setdefault(key, {})[int(t)] = "lost" if lost else st
        return out

    def todo_tokens(self, combo_key: str, tokens: Iterable[int], redo: str, stored=None) -> list[int]:
        """Token counts of a combination that still need running: not stored, or lost (LOST),
        and with `redo` failed the failed ones, with all every one."""
        if redo not in REDO_CHOICES:
            raise ValueError(f"--redo {redo!r}; valid: {', '.join(REDO_CHOICES)}")
        have = (stored if stored is not None else self.stored()).get(combo_key, {})
        todo = []
        for t in tokens:
            st = have.get(t)
            if st in (None, "lost") or redo == "all" or (redo == "failed" and st in FAILED):
                todo.append(t)
        return todo

    def load(self, all_rows: bool = False) -> pd.DataFrame:
        """The rows of the run, one per (combination, tokens): a measured row beats a skipped
        one whatever their times, then the newest wins. `all_rows`: every stored row."""
        files = _newest_last(self.row_files())
        if (self.rows_dir / SKIPPED_FILE).exists():
            files = [self.rows_dir / SKIPPED_FILE, *files]
        frames = [f for f in _read_all(files, skip_torn=False) if len(f)]
        if not frames:
            return pd.DataFrame()
        df = migrate(pd.concat(frames, ignore_index=True), str(self.dir))
        if all_rows:
            return df
        return _by_precedence(df).drop_duplicates(PAIR, keep="last").reset_index(drop=True)
