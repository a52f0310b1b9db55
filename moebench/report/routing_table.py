"""The report's "Routing" section: each row's measured imbalance, whatever its routing
(routing/generate.py, docs/routing.md), the emulated rank and its received tokens, the
batched fill, and where replayed routing came from."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moebench.report.columns import WORKLOAD_COLUMNS
from moebench.report.mdsafe import md_code
from moebench.report.run_tables import caption, combo_cells, grid
from moebench.report.table import md_table, md_text
from moebench.results.row import Status


def _f(x, digits: int = 2) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def _cell(r) -> str:
    out = f"{_f(r['imbalance_experts'])} / {_f(r['imbalance_ranks'])}"
    if np.isfinite(r.get("simulated_rank", np.nan)):
        out += f" · r{int(r['simulated_rank'])}:{int(r['received_tokens'])}"
    if np.isfinite(r.get("fill_rows", np.nan)):
        out += f" · fill {_f(r['fill_max'])}"
    return out


def routing_table(df: pd.DataFrame) -> str:
    """Per combination x tokens: max/mean pairs per expert / per rank; with simulate_rank the
    emulated rank and the tokens it received; with workload.fill the busiest expert's fill.
    '' for a run without the routing columns (rows written before them)."""
    if "imbalance_experts" not in df.columns:
        return ""
    ok = df[(df["status"] == Status.OK) & df["imbalance_experts"].notna()]
    if not len(ok):
        return ""
    tokens, cols, rows = grid(ok, _cell)
    # the implementations of one workload saw the same tokens: one line a workload where they agree
    work = [c for c in cols if c in WORKLOAD_COLUMNS]
    lines = {tuple(combo_cells(r, work)) + tuple(cells) for r, cells in rows} if work else set()
    if work and len(lines) == len({tuple(combo_cells(r, work)) for r, _ in rows}):
        cols, seen, out = work, set(), []
        for r, cells in rows:
            line = combo_cells(r, work) + cells
            if tuple(line) not in seen:
                seen.add(tuple(line))
                out.append(line)
        table_rows = sorted(out)
    else:
        table_rows = [combo_cells(r, cols) + cells for r, cells in rows]
    table = md_table(cols + [str(t) for t in tokens], table_rows, ["l"] * len(cols) + ["r"] * len(tokens))
    parts = [
        "Imbalance, max / mean pairs per expert / per rank of the EP split (1.00 / 1.00: even; ranks 1.00 "
        "without a split), over every rank's tokens under an EP backend or simulate_rank, over the one rank's "
        "tokens otherwise"
    ]
    if ok.get("simulated_rank", pd.Series(dtype=float)).notna().any():
        parts.append("r*K*:*M*: simulate_rank ran EP rank *K*, which receives *M* tokens from all N ranks")
    if ok.get("fill_rows", pd.Series(dtype=float)).notna().any():
        parts.append("fill: the busiest local expert's pairs over the batched buffers' rows per expert")
    text = f"{table}\n\n" + caption(ok, "; ".join(parts) + ".")
    if "routing_source" in ok.columns:
        replayed = ok[ok["routing"] == "replay"]
        sources = sorted(
            {
                (str(r.routing_file), str(r.routing_source), str(r.routing_file_sha256)[:12])
                for r in replayed.itertuples()
            }
        )
        for path, source, digest in sources:
            text += (
                f"\n\nReplayed routing from {md_code(path)} (sha256 {md_text(digest)}…): "
                f"{md_text(source) or 'no source recorded'}."
            )
    return text
