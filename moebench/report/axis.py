"""Comparison along one axis within one run: `moebench compare RUN --axis reduction=finalize:experts`,
or across two: `moebench compare BASE CAND --axis reduction=finalize:experts` pairs BASE's rows with
reduction=finalize with CAND's with reduction=experts (a baseline run against a change's run).

A row with FIELD=A pairs with the row of the same token count with FIELD=B whose
combination (moebench.config.spec.from_row) is equal once FIELD is set to B on both: the key of
`combo.replace(FIELD=B)` is compared, never a hand-kept column list. FIELD is a Combo
identity field (reduction, overlap, experts, quant, timing, ...) or a knob (row_layout,
num_sms, ...). Swapping an entry (`experts` or `backend`) changes which knobs apply:
the knobs the two swapped entries declare are dropped on both sides before the keys are
compared (triton's row_layout has no counterpart in deepgemm), so each triton row meets
the deepgemm row that agrees in everything else. Two triton rows that differ only in such
a knob then meet the same deepgemm row: both pairs are listed, each with its knobs.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from moebench.config.names import did_you_mean
from moebench.config.plugins import entry_knobs
from moebench.config.spec import IDENTITY_FIELDS, Combo, from_row, knob_meta
from moebench.report.columns import fmt_value
from moebench.report.compare import SHOWN_COLUMNS, Axis, Comparison, compare_pairs, prepared_rows

ENTRY_FIELDS = ("backend", "experts")  # axes whose values are registered entries with knobs


def parse_axis(text: str) -> Axis:
    """'reduction=finalize:experts' -> Axis('reduction', 'finalize', 'experts')."""
    field, eq, values = str(text).partition("=")
    a, colon, b = values.partition(":")
    if not (eq and colon and field and a and b):
        raise ValueError(f"--axis {text!r}: write FIELD=A:B, e.g. reduction=finalize:experts (baseline A, candidate B)")
    if a == b:
        raise ValueError(f"--axis {text!r}: A and B are the same value")
    names = {f.name for f in IDENTITY_FIELDS}
    if field not in names and field not in knob_meta():
        raise ValueError(
            f"--axis {text!r}: {field!r} is neither an identity field of a combination "
            f"({', '.join(sorted(names))}) nor a knob ({', '.join(sorted(knob_meta()))})"
            + did_you_mean(field, [*names, *knob_meta()])
        )
    return Axis(field.strip(), a.strip(), b.strip())


def _typed(field: str, text: str):
    """The axis value in the field's (or knob's) type: num_sms=16:24 compares ints."""
    meta = knob_meta()
    if field in meta:
        typ = meta[field].type
    else:
        f = next(f for f in dataclasses.fields(Combo) if f.name == field)
        typ = f.type if isinstance(f.type, type) else {"int": int, "float": float, "bool": bool}.get(str(f.type), str)
    if typ is bool:
        return str(text).lower() in ("1", "true", "yes")
    try:
        return typ(text)
    except ValueError:
        raise ValueError(f"--axis {field}={text}: {text!r} is not a {typ.__name__}") from None


def _dropped_knobs(field: str, a, b) -> set[str]:
    """Knobs of the two entries an entry axis swaps (backend / experts)."""
    if field not in ENTRY_FIELDS:
        return set()
    return entry_knobs(field, a) | entry_knobs(field, b)  # an entry not registered here: none known


def _value(combo: Combo, field: str):
    return combo.get(field)


def _set(combo: Combo, field: str, value, dropped: set[str]) -> Combo:
    if field in {f.name for f in dataclasses.fields(Combo)}:
        combo = combo.replace(**{field: value})
    else:
        knobs = dict(combo.knobs)
        knobs[field] = value
        combo = combo.replace(knobs=tuple(sorted(knobs.items())))
    if dropped:
        combo = combo.replace(knobs=tuple((k, v) for k, v in combo.knobs if k not in dropped))
    return combo


def _side(rows: pd.DataFrame, axis: Axis, value, text: str, dropped: set[str], run: str):
    """(the rows of `rows` with FIELD=value, their pairing keys): the combination with the axis set to
    B (the swapped entries' knobs dropped) and the token count; ValueError where none has it."""
    b = _typed(axis.field, axis.b)
    combos = [from_row(r) for r in rows.to_dict("records")]
    values = [_value(c, axis.field) for c in combos]
    if not any(x == value for x in values):
        present = ", ".join(sorted({fmt_value(v) for v in values})) or "none"
        raise ValueError(
            f"--axis {axis}: no row {f'of {run} ' if run else ''}has {axis.field}={text} "
            f"({run or 'this run'} has {axis.field} = {present})"
        )
    keys = pd.Series(
        [
            f"{_set(c, axis.field, b, dropped).key}\x1f{fmt_value(t)}"
            for c, t in zip(combos, rows["tokens_per_rank"], strict=True)
        ],
        dtype=object,
    )
    mine = pd.Series([x == value for x in values])
    return rows[mine].reset_index(drop=True), keys[mine].reset_index(drop=True)


def axis_sides(
    df: pd.DataFrame, axis: Axis, cand_df: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series, pd.Series]:
    """(rows with A, rows with B, their pairing keys): key = the combination with the axis
    set to B (and the swapped entries' knobs dropped) and the token count. With ``cand_df`` the
    rows with A are ``df``'s (the baseline run's) and those with B ``cand_df``'s."""
    a, b = _typed(axis.field, axis.a), _typed(axis.field, axis.b)
    dropped = _dropped_knobs(axis.field, a, b)
    rows = prepared_rows(df)
    two = cand_df is not None
    base, bk = _side(rows, axis, a, axis.a, dropped, "BASE" if two else "")
    cand, ck = _side(prepared_rows(cand_df) if two else rows, axis, b, axis.b, dropped, "CAND" if two else "")
    return base, cand, bk, ck


def compare_axis(
    df: pd.DataFrame,
    axis: Axis | str,
    threshold: float = 1.05,
    alpha: float = 0.05,
    cpu_verdict: bool = False,
    cand_df: pd.DataFrame | None = None,
) -> Comparison:
    """Pairs of rows of one run that differ only in ``axis`` (module doc), compared as
    baseline (A) and candidate (B); with ``cand_df``, ``df``'s rows with A (the baseline run)
    against ``cand_df``'s with B (the candidate run), `Axis.across`. The matched rows show their
    shared identity; a column whose two values differ reads 'A→B' (the axis itself, a dropped knob)."""
    axis = parse_axis(axis) if isinstance(axis, str) else axis
    axis = dataclasses.replace(axis, across=cand_df is not None)
    base, cand, bk, ck = axis_sides(df, axis, cand_df)
    cmp = compare_pairs(base, cand, bk, ck, threshold, alpha, shown="cand", axis=axis, cpu_verdict=cpu_verdict)
    m = cmp.matched
    if len(m):
        b_ident = base.iloc[[i for i, _ in cmp.pairs]][SHOWN_COLUMNS + ["knobs"]].reset_index(drop=True)
        for col in SHOWN_COLUMNS + ["knobs"]:
            if col in ("tokens_per_rank", "timing_mode"):
                continue
            bv, cv = b_ident[col].map(fmt_value), m[col].map(fmt_value)
            differs = bv != cv
            if differs.any():
                m[col] = m[col].astype(object)
                m.loc[differs, col] = [f"{x or '-'}→{y or '-'}" for x, y in zip(bv[differs], cv[differs], strict=True)]
        from moebench.report.columns import combo_labels

        m["label"] = combo_labels(m).values
    if not axis.across:  # two runs: the caller names them (with their side's value)
        cmp.baseline_name, cmp.candidate_name = f"{axis.field}={axis.a}", f"{axis.field}={axis.b}"
    return cmp
