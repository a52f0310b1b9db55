"""Results store: one Parquet file per finished combination under
<run>/rows/, skipped rows in <run>/rows/skipped.parquet, env.json beside them.
Rows are written as soon as a combination ends (a crash later loses nothing);
a re-run of the same sweep skips what is stored unless told to redo it."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd

from .migrate import migrate

REDO_CHOICES = ("none", "failed", "all")
FAILED = ("failed", "timeout", "oom")


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class RunStore:
    """A run directory: rows/*.parquet, env.json, sweep.json."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.rows_dir = self.dir / "rows"

    # -- writing ---------------------------------------------------------------
    def write_rows(self, combo_key: str, rows: list[dict]) -> Path:
        """One file per finished combination (its token counts in one file)."""
        tokens = "_".join(str(r["tokens_per_rank"]) for r in rows)
        path = self.rows_dir / f"{combo_key}-T{tokens}.parquet"
        df = pd.DataFrame(rows)
        _atomic_write(path, lambda p: df.to_parquet(p, index=False))
        return path

    def write_skipped(self, rows: list[dict]) -> Optional[Path]:
        """Skipped rows are cheap to re-derive: one file, rewritten by every invocation."""
        path = self.rows_dir / "skipped.parquet"
        if not rows:
            if path.exists():
                path.unlink()
            return None
        df = pd.DataFrame(rows)
        _atomic_write(path, lambda p: df.to_parquet(p, index=False))
        return path

    def write_json(self, name: str, data: dict) -> Path:
        path = self.dir / name
        _atomic_write(path, lambda p: Path(p).write_text(json.dumps(data, indent=2, sort_keys=True, default=str)))
        return path

    # -- reading ---------------------------------------------------------------
    def row_files(self) -> list[Path]:
        """The combinations' row files (a writer's leftover temp file is not one)."""
        return sorted(p for p in self.rows_dir.glob("*.parquet")
                      if p.name != "skipped.parquet" and not p.name.startswith("."))

    def stored(self) -> dict[str, dict[int, str]]:
        """combo_key -> {tokens: status} of the measured (not skipped) rows (older schema
        versions under their migrated keys)."""
        frames = []
        for p in self.row_files():
            try:
                frames.append(pd.read_parquet(p))
            except Exception:  # a torn file is redone, not trusted
                continue
        out: dict[str, dict[int, str]] = {}
        if not frames:
            return out
        df = migrate(pd.concat(frames, ignore_index=True), str(self.dir))
        df = df[["combo_key", "tokens_per_rank", "status", "timestamp"]].sort_values("timestamp", kind="stable")
        for key, t, st, _ in df.itertuples(index=False):  # the newest row of each wins
            out.setdefault(key, {})[int(t)] = st
        return out

    def todo_tokens(self, combo_key: str, tokens: Iterable[int], redo: str, stored=None) -> list[int]:
        """Token counts of a combination that still need running."""
        if redo not in REDO_CHOICES:
            raise ValueError(f"--redo {redo!r}; valid: {', '.join(REDO_CHOICES)}")
        have = (stored if stored is not None else self.stored()).get(combo_key, {})
        todo = []
        for t in tokens:
            st = have.get(t)
            if st is None or redo == "all" or (redo == "failed" and st in FAILED):
                todo.append(t)
        return todo

    def load(self) -> pd.DataFrame:
        """All rows of the run; for a (combination, tokens) stored twice the newest wins."""
        files = self.row_files() + ([self.rows_dir / "skipped.parquet"] if (self.rows_dir / "skipped.parquet").exists() else [])
        if not files:
            return pd.DataFrame()
        frames = [pd.read_parquet(p) for p in files]
        df = migrate(pd.concat(frames, ignore_index=True), str(self.dir))
        # measured rows win over skipped ones, then the newest wins
        df["_measured"] = df["status"] != "skipped"
        df = df.sort_values(["_measured", "timestamp"] if "timestamp" in df else ["_measured"]).drop(columns="_measured")
        return df.drop_duplicates(["combo_key", "tokens_per_rank"], keep="last").reset_index(drop=True)
