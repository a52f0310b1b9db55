"""Two inputs a comparison cannot pair at all: bad input (exit 2, docs/design.md "Exit status"),
with one line saying what to do, rather than a report whose exit 1 a CI gate reads as a regression.

Where two runs share no value of exactly one identity field (a baseline run with reduction=finalize,
a change's run with reduction=experts) and pairing along that field matches rows, the line gives the
exact command that compares them (`moebench compare BASE CAND --axis reduction=finalize:experts`).
It is not run on its own: a gate given two unrelated runs by mistake must not pass on a comparison
nobody asked for, and the command written out names the pairing the report then shows in its title.
"""

from __future__ import annotations

import shlex

import pandas as pd

from moebench.report.columns import COMBINATION_COLUMNS, PER_ROW_COLUMNS, fmt_value
from moebench.report.compare import Comparison
from moebench.report.table import md_text


def field_differences(b: pd.DataFrame, c: pd.DataFrame) -> tuple[list[tuple[str, list, list]], list[str]]:
    """(the identity columns whose values the two frames share none of, as (column, b's values,
    c's values); the other columns whose values differ, as 'col (x vs y)' text)."""
    disjoint, differ = [], []
    for col in [*COMBINATION_COLUMNS, "tokens_per_rank"]:
        if col in PER_ROW_COLUMNS or col not in b.columns or col not in c.columns:
            continue
        vb, vc = set(b[col].map(fmt_value)), set(c[col].map(fmt_value))
        if vb != vc:
            if vb & vc:
                differ.append(f"{col} ({', '.join(sorted(map(md_text, vb)))} vs {', '.join(sorted(map(md_text, vc)))})")
            else:
                disjoint.append((col, sorted(vb), sorted(vc)))
    return disjoint, differ


def disjoint_text(disjoint: list[tuple[str, list, list]]) -> str:
    """'quant (bf16 vs fp8_block), ...' (Markdown-safe)."""
    return ", ".join(
        f"{col} ({', '.join(map(md_text, vb))} vs {', '.join(map(md_text, vc))})" for col, vb, vc in disjoint
    )


def along(base: pd.DataFrame, cand: pd.DataFrame) -> str | None:
    """'FIELD=A:B' where the runs share no value of FIELD alone, one value on each side, and an axis
    along it pairs rows; else None."""
    from moebench.report.axis import compare_axis, parse_axis

    disjoint, _ = field_differences(base, cand)
    if len(disjoint) != 1 or len(disjoint[0][1]) != 1 or len(disjoint[0][2]) != 1:
        return None
    col, (a,), (b,) = disjoint[0]
    try:
        axis = parse_axis(f"{col}={a}:{b}")
        return str(axis) if len(compare_axis(base, axis, cand_df=cand).matched) else None
    except ValueError:  # not a field an axis takes (a model's size), or a value it cannot type
        return None


class NoPairs(ValueError):
    """No candidate row has a baseline partner (require_pairs): bad input for compare and report, a
    broken comparison for ab, whose revisions' rows were measured already."""


def require_pairs(cmp: Comparison, base_df: pd.DataFrame, cand_df: pd.DataFrame, base: str, cand: str) -> None:
    """ValueError (exit 2) where no candidate row has a baseline partner: the inputs do not overlap,
    so nothing was compared and nothing regressed; the message says what to do (module doc)."""
    if len(cmp.matched):
        return
    if cmp.axis is not None:
        where = f" of {cand}" if cmp.axis.across else ""
        raise NoPairs(
            f"--axis {cmp.axis}: no row{where} with {cmp.axis.field}={cmp.axis.b} agrees with one with "
            f"{cmp.axis.field}={cmp.axis.a} in every other identity field and token count: nothing to compare "
            "(pair along the one field the rows differ in)"
        )
    command = f"moebench compare {shlex.quote(base)} {shlex.quote(cand)}"
    if axis := along(base_df, cand_df):
        field = axis.partition("=")[0]
        raise NoPairs(
            f"no row of {cand} matches one of {base}: the runs share no value of {field} only "
            f"({disjoint_text(field_differences(base_df, cand_df)[0])}); compare them along it: "
            f"{command} --axis {shlex.quote(axis)}"
        )
    disjoint, differ = field_differences(base_df, cand_df)
    where = (
        f"the runs share no value of {disjoint_text(disjoint[:3])}"
        if disjoint
        else f"the runs differ in {', '.join(differ[:4])}"
        if differ
        else "their identity columns agree, so the keys differ in a field the rows do not show"
    )
    raise NoPairs(
        f"no row of {cand} matches one of {base}: {where}; compare runs of the same sweep, or pair rows "
        f"that differ in one field with {command} --axis FIELD=A:B"
    )
