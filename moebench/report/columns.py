"""What a report table shows of a row: the column lists, each a query on the one declaration
(results/row.py and the spec's fields, config/spec.py: a column's roles, its short label),
and the helpers that pick a table's columns, caption and labels from the rows it holds.

No list of column names is typed here or elsewhere in the report (tests/project/
test_vocabulary.py): a column takes part in a table because its declaration says so.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from moebench.config.spec import IDENTITY_COLUMNS as SPEC_COLUMNS
from moebench.config.spec import knob_meta
from moebench.results import row as schema

# names a combination in tables and plots, in display order; a table shows those that vary
# within it and names the constant ones in its caption (the axes even at their default)
COMBO_COLUMNS = schema.having(schema.AXIS)
# the other columns that name a combination where they vary: the spec's fields (less the
# recording's path: its digest is identity), the knobs' tags (backend.num_sms=16 -> sms16) and
# the timing that ran
EXTRA_COMBO_COLUMNS = schema.having(schema.COMBO)
COMBINATION_COLUMNS = COMBO_COLUMNS + EXTRA_COMBO_COLUMNS
# a row's, not its combination's (graph timing runs events above graph_max_tokens)
PER_ROW_COLUMNS = tuple(schema.having(schema.PER_ROW))
# how the runner measured (timing, L2 flush, traces, the memory cap), not what the layer is
RUNNER_COLUMNS = tuple(schema.having(schema.RUNNER))
# the competing-workload key: rows equal in these saw the same tokens, so only they compete for
# "fastest" (the report's bold cell, `moebench tune --results`); the axes and the quantization
# are what competes (an `ok` fp8 row passed the reference check as a bf16 one did)
WORKLOAD_COLUMNS = tuple(schema.having(schema.WORKLOAD))
# the model's sizes: shown only where they vary within one model
MODEL_COLUMNS = tuple(schema.having(schema.MODEL_SIZE))
# what competes within a workload: the axes that are no workload (quant among them), then the knobs
AXES = [c for c in COMBO_COLUMNS if c not in WORKLOAD_COLUMNS]
CHOICE_COLUMNS = [*AXES, "knobs"]
BARE_COLUMNS = tuple(schema.having(schema.BARE))  # shown bare in a label: local/triton mixtral
PLACE_COLUMNS = tuple(schema.having(schema.PLACE))  # where a row ran (a compared pair shares it)
# the identity a table may show of a row: the spec's columns and the token count
SHOWN_IDENTITY = [*SPEC_COLUMNS, "tokens_per_rank"]
LATENCY_COLUMNS = schema.names("latency", dtype="float")  # median, p20, p80
PHASE_COLUMNS = schema.names("phase")
# the lists a report, comparison or table reads (samples_us: the bootstrap's intervals, the
# host-paced and clock figures); load_run leaves the rest unread (per-rank figures, each sample's
# clock: at 10,000 rows each list costs as much memory as samples_us)
READ_LISTS = ("samples_us",)
UNREAD_COLUMNS = tuple(c for c in schema.names(dtype="list") if c not in READ_LISTS)
OVERLAP_COLUMNS = schema.having(schema.OVERLAP_TABLE)  # the ablation's figures and the trace's
MEMORY_COLUMNS = schema.having(schema.MEMORY_TABLE)  # (the analytic peak and the reserve are in the rows too)
PROVENANCE_COLUMNS = schema.having(schema.PROVENANCE_TABLE)
ROW_COLUMNS = schema.having(schema.ROWS_TABLE)  # what names a row beside its identity
PAIR_LATENCY_COLUMNS = schema.having(schema.LATENCY_TABLE)  # a compared side's latency cell
ROOFLINE_COLUMNS = schema.having(schema.ROOFLINE)
RECORDING = "routing_file_sha256"  # one per model and routing: each model replays its own recording


def label(col: str) -> str:
    """The short label of a column (`world` for world_size, results/row.py)."""
    return schema.label(col)


def fmt_value(v) -> str:
    """Identity value as text: integral floats without '.0', NaN as '-'."""
    if v is None or (np.isscalar(v) and pd.isna(v)) or v is pd.NA:
        return "-"
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def fmt_series(s: pd.Series) -> pd.Series:
    """`s.map(fmt_value)`, each distinct value formatted once (a 10,000-row run holds a few
    dozen distinct values per identity column: formatting every cell took most of a report)."""
    try:
        codes, uniques = pd.factorize(s, use_na_sentinel=False)
    except TypeError:  # unhashable cells (lists)
        return s.map(fmt_value)
    texts = np.array([fmt_value(v) for v in uniques], dtype=object)
    return pd.Series(texts[codes], index=s.index, dtype=object)


def num_distinct(s: pd.Series) -> int:
    """How many texts `s` shows (fmt_value: 1.0 and 1, NaN and None are one each)."""
    try:
        uniques = pd.unique(s)
    except TypeError:  # unhashable cells (lists)
        return s.map(fmt_value).nunique()
    return len({fmt_value(v) for v in uniques})


def records(df: pd.DataFrame) -> list[dict]:
    """`df.to_dict("records")`, the same values and types (Python scalars), read column by column
    (tolist) instead of boxed cell by cell: 0.4 s instead of 1.5 s for 10,000 rows of 130 columns."""
    cols = list(df.columns)
    if len(set(cols)) != len(cols):  # a name twice: pandas' own way (the last one wins)
        return df.to_dict("records")
    return (
        [dict(zip(cols, row, strict=True)) for row in zip(*(df[c].tolist() for c in cols), strict=True)]
        if cols
        else [{} for _ in range(len(df))]
    )


def varying(df: pd.DataFrame, columns) -> list[str]:
    """Columns (of ``columns``) that take more than one value in ``df`` (NaN counts)."""
    return [c for c in columns if c in df.columns and num_distinct(df[c]) > 1]


def _by_model(df: pd.DataFrame, col: str) -> bool:
    """Whether a MODEL_COLUMNS column takes one value per model (the model names it), or
    the recording's digest one per model and routing (each model replays its own)."""
    keys = ["model"] if col in MODEL_COLUMNS else ["model", "routing"] if col == RECORDING else None
    if keys is None or any(k not in df.columns for k in keys):
        return False
    by = [fmt_series(df[k]) for k in keys]
    return bool((df.groupby(by)[col].agg(num_distinct) <= 1).all())


def shown_varying(df: pd.DataFrame, columns) -> list[str]:
    """varying() less the model's sizes where the model already tells them apart."""
    return [c for c in varying(df, columns) if not _by_model(df, c)]


def display_columns(df: pd.DataFrame) -> list[str]:
    """Combination columns a table shows: those that vary within ``df`` (the constant
    ones go into the caption, constant_caption); the model where none varies."""
    shown = shown_varying(df, COMBINATION_COLUMNS)
    return shown or [c for c in ("model",) if c in df.columns]


def combo_columns(df: pd.DataFrame) -> list[str]:
    """display_columns less the per-row ones: the columns that name a table's combinations."""
    return [c for c in display_columns(df) if c not in PER_ROW_COLUMNS]


def constant_caption(df: pd.DataFrame) -> str:
    """'backend=local, experts=triton, ...' for the combination columns that take one
    value in ``df`` (those a table leaves out, display_columns), less the fields at
    their spec default (the axes aside) and the model's sizes."""
    from moebench.config.spec import field_default

    parts = []
    shown = set(display_columns(df))
    for c in COMBINATION_COLUMNS:
        if c in df.columns and c not in shown and c not in MODEL_COLUMNS and len(df) and num_distinct(df[c]) == 1:
            v = fmt_value(df[c].iloc[0])
            try:
                default = field_default(c)
            except KeyError:
                default = None
            if v in ("-", "", "None") or (default is not None and v == fmt_value(default) and c not in COMBO_COLUMNS):
                continue
            parts.append(f"{c}={v}")
    return ", ".join(parts)


def combo_labels(
    df: pd.DataFrame, exclude=(), within: pd.DataFrame | None = None, fallback: str | None = None
) -> pd.Series:
    """Short label per row naming its combination: 'local/triton mixtral_8x7b red=finalize'.

    Only columns that vary within ``within`` (default ``df``) enter the label, less
    ``exclude`` (a plot panel's own columns) and the per-row PER_ROW_COLUMNS, so labels
    stay short and still tell the lines of a plot apart. The BARE_COLUMNS show bare values
    (backend/experts, then the model); the knobs their tags ('sms16 carve24'), the others
    `<short label>=<value>`. A row that nothing tells apart is named ``fallback`` (default:
    its model).
    """
    if "knobs" not in df.columns:
        df = df.assign(knobs="")
    ref = df if within is None else within
    if "knobs" not in ref.columns:
        ref = ref.assign(knobs="")
    extra = [c for c in shown_varying(ref, COMBINATION_COLUMNS) if c not in exclude and c not in PER_ROW_COLUMNS]
    if "knobs" in extra and "shared_sm_carveout" in extra:  # the knobs' tags hold the carveout (carve24)
        extra.remove("shared_sm_carveout")
    path = [c for c in BARE_COLUMNS if c in extra and c != "model"]  # backend/experts

    def one(row) -> str:
        bare = [fmt_value(row[c]) for c in path]
        parts = ["/".join(bare)] if bare else []
        parts += [fmt_value(row["model"])] if "model" in extra else []
        parts += [f"{label(c)}={fmt_value(row[c])}" for c in extra if c not in BARE_COLUMNS and c != "knobs"]
        if "knobs" in extra and row["knobs"]:
            parts.append(str(row["knobs"]))
        text = " ".join(p for p in parts if p)
        if text:
            return text
        if "knobs" in extra:
            return "default knobs"
        return fmt_value(row.get("model", "")) if fallback is None else fallback

    if not len(df):
        return pd.Series([], dtype=object)
    # one label per distinct combination of the columns it reads (10,000 rows: a few hundred)
    cols = [c for c in dict.fromkeys([*path, *extra, "model", "knobs"]) if c in df.columns]
    keys = [fmt_series(df[c]) if c != "knobs" else df[c].astype(str) for c in cols]
    codes, _ = pd.factorize(pd.Series(list(zip(*keys, strict=True)), index=df.index, dtype=object))
    _, first = np.unique(codes, return_index=True)
    labels = np.array([one(r) for r in df[cols].iloc[first].to_dict("records")], dtype=object)
    return pd.Series(labels[codes], index=df.index, dtype=object)


def phase_sum(row) -> float:
    """The time a row's phases account for (µs): the routed phases plus the shared experts'
    span where it ran outside a communication span (overlap=none, or a backend without a
    dispatch span: the local ones run the shared experts in the layer's own sequence);
    NaN without phases. Rows from before `shared_experts_us` sum the routed phases."""

    def num(col):
        try:
            v = float(row.get(col))
        except (TypeError, ValueError):
            return float("nan")
        return v

    routed = [num(c) for c in PHASE_COLUMNS if c != "shared_experts_us"]
    if not any(np.isfinite(routed)):
        return float("nan")
    total = float(np.nansum(routed))
    shared = num("shared_experts_us")
    nested = str(row.get("overlap")) in ("dispatch", "combine") and np.isfinite(num("dispatch_us"))
    return total + (shared if np.isfinite(shared) and not nested else 0.0)


def knobs_of(row) -> str:
    """'carve24 sms16 gathered gemm=gluon': the overlap's SM carveout and every registered knob
    (kernels/knobs.py, moebench.config.spec.knob_meta) off its default, each as its card's `tag`
    formats it — the labels' own tags (deepep_ht's SM count always: its sweeps compare it); the
    tags load_run read from the label where the run has no knob columns."""
    meta = knob_meta()
    names = [k for k in meta if k in row.index]
    if not any(_present(row[k]) for k in [*names, "shared_sm_carveout"] if k in row.index):
        return str(row.get("knobs", "") or "")
    tags = []
    if _present(row.get("shared_sm_carveout")) and int(row["shared_sm_carveout"]):
        tags.append(f"carve{int(row['shared_sm_carveout'])}")
    for k in names:
        if not _present(row[k]):
            continue
        knob = meta[k]
        v = knob.type(row[k])
        if v != knob.default or (k == "num_sms" and row.get("backend") == "deepep_ht"):
            tags.append(knob.label(v))
    return " ".join(tags)


def _present(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v is not pd.NA


def combination(row) -> str:
    """'local/triton red=experts ovl=none quant=bf16 sms16' (what a cell of the table names)."""
    s = f"{row['backend']}/{row['experts']} red={row['reduction']} ovl={row['overlap']} quant={row['quant']}"
    k = knobs_of(row)
    return f"{s} {k}" if k else s
