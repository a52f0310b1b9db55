"""A run's workloads for its figures: the rows that saw the same tokens (the model, world size,
routing and the other report.columns.WORKLOAD_COLUMNS that vary), each named by what tells it
apart; a figure ranks combinations only within one (report/answer_plots.py)."""

from __future__ import annotations

import pandas as pd

from moebench.report.columns import WORKLOAD_COLUMNS, combo_labels, fmt_series, shown_varying


def workloads(ok: pd.DataFrame, within: pd.DataFrame | None = None) -> list[tuple[str, pd.DataFrame]]:
    """The run's workloads, [(name, rows)] in name order: the rows of each value of the workload
    columns (model, world size, routing, ...) that vary within `within` (default `ok`: a figure of
    the GPU-time rows names them as the run's text does), named by those values (the model bare, the
    others `column=value`, a digest by its first 8 characters, a missing value left out); one
    unnamed group where none varies."""
    ref = ok if within is None else within
    cols = shown_varying(ref, WORKLOAD_COLUMNS)  # less what the model names (a recording per model)
    if not cols or not len(ok):
        return [("", ok)]
    texts = pd.DataFrame({c: fmt_series(ok[c]) for c in cols}, index=ok.index)

    def named(r) -> str:
        parts = (
            v if c == "model" else f"{c}={v[:8] if c.endswith('_sha256') else v}"
            for c, v in r.items()
            if v not in ("", "-")
        )
        return " · ".join(parts)

    name = texts.apply(named, axis=1)
    return [(str(n), ok.loc[g.index]) for n, g in ok.groupby(name, sort=True)]


def workload_names(rows: pd.DataFrame) -> pd.Series:
    """Each row's workload name (`workloads`: what varies among `rows`), '' where `rows` hold one."""
    out = pd.Series("", index=rows.index, dtype=object)
    for name, g in workloads(rows):
        out.loc[g.index] = name
    return out


def spread(groups: list[tuple[str, pd.DataFrame]], limit: int) -> list[tuple[str, pd.DataFrame]]:
    """Up to `limit` workloads, taken in turn from each model (the name's first part), so that a run
    of two models and five routings shows both models, not one model's first four."""
    buckets: dict[str, list] = {}
    for g in groups:
        buckets.setdefault(g[0].split(" · ")[0], []).append(g)
    order = [b[i] for i in range(max(map(len, buckets.values()))) for b in buckets.values() if i < len(b)]
    return order[:limit]


def union_labels(rows: pd.DataFrame) -> pd.Series:
    """Labels of `rows` (several workloads' panels) naming the combination alike in every panel:
    the columns that vary over all of them, less the workload's own."""
    return combo_labels(rows, exclude=set(WORKLOAD_COLUMNS), within=rows, fallback="the one combination")
