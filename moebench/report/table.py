"""One table, three outputs: markdown for people, csv and json for programs.

A ``Table`` holds its raw values (µs, bytes, ratios: unrounded) in ``data`` and, for
markdown, a list of ``Column`` s that format a cell from a row. csv and json write
``data`` as it is, so a number read back from them is the number the markdown cell
rounds.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from moebench.report.columns import records as row_records
from moebench.report.mdsafe import md_text, one_line  # noqa: F401  (md_text: the escape of a run folder's text, for callers)


def md_escape(text) -> str:
    """Text kept inside one markdown table cell: a `|` not escaped already gets its backslash,
    line breaks show as ⏎. Only the cell's bounds: our own cells (numbers, bold) pass as they are,
    so a value read from a run folder is `md_text`-ed (moebench/report/mdsafe.py) before it is a cell."""
    return re.sub(r"(?<!\\)((?:\\\\)*)\|", r"\1\\|", one_line(text)).strip()


def md_table(headers: list[str], rows: list[list], align: list[str] | None = None) -> str:
    """A GitHub markdown table; ``align`` holds 'l' or 'r' per column (default: l)."""
    align = align or ["l"] * len(headers)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(md_escape(h) for h in headers) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(md_escape(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


@dataclass
class Column:
    """A markdown column: its header, how a cell reads from the row, alignment."""

    header: str
    cell: Callable[[dict], str]
    align: str = "l"


@dataclass
class Table:
    name: str
    data: pd.DataFrame
    columns: list[Column]
    caption: str = ""
    empty: str = "_None._"
    notes: list[str] = field(default_factory=list)  # markdown lines after the caption

    def markdown(self) -> str:
        if not len(self.data):
            return self.empty
        rows = [[c.cell(r) for c in self.columns] for r in row_records(self.data)]
        text = md_table([c.header for c in self.columns], rows, [c.align for c in self.columns])
        return "\n\n".join([text, *(x for x in [self.caption, *self.notes] if x)])

    def csv(self) -> str:
        return _plain(self.data).to_csv(index=False)

    def records(self) -> list[dict]:
        return [{k: _json_value(v) for k, v in r.items()} for r in row_records(_plain(self.data))]


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """Lists (flags) as ';'-joined text, so that csv stays one value a cell."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object and out[c].map(lambda v: isinstance(v, (list, tuple))).any():
            out[c] = out[c].map(lambda v: ";".join(map(str, v)) if isinstance(v, (list, tuple)) else v)
    return out


def _json_value(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return None if not math.isfinite(float(v)) else float(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    if v is pd.NA or v is None:
        return None
    return v


def to_json(doc: dict) -> str:
    """A report document (tables as lists of records) as JSON text; NaN as null."""

    def default(o):
        if isinstance(o, Table):
            return o.records()
        if isinstance(o, (np.integer, np.floating, np.bool_)):
            return _json_value(o)
        return str(o)

    return json.dumps(_clean(doc), indent=1, default=default, ensure_ascii=False)


def _clean(o):
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, Table):
        return o.records()
    return o
