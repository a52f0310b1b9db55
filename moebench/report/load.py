"""Load a results run into one tidy DataFrame, through the store (moebench/results/store.py:
the only reader of a run folder) and with the column groups of moebench/results/row.py.

A run is a directory ``<run>/rows/*.parquet`` (one file per finished combination, one
row per tokens_per_rank) with ``<run>/env.json`` beside it. ``load_run`` also accepts a
single ``.parquet`` file or a plain directory of parquet files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moebench.config.spec import IDENTITY_COLUMNS as SPEC_COLUMNS
from moebench.results import row as schema
from moebench.results.store import RunStore, TornFile, find_runs, latest, load_files, read_row_file, warn

# A row's identity: the spec's columns (moebench/config/spec.py), the key and the token count;
# run_id / sweep / schema_version say where it came from
IDENTITY_COLUMNS = ["schema_version", "run_id", "sweep", "combo_key", *SPEC_COLUMNS, "tokens_per_rank"]
# the identity a table may show of a row (IDENTITY_COLUMNS less the provenance and the key)
SHOWN_IDENTITY = [c for c in IDENTITY_COLUMNS if c not in ("schema_version", "run_id", "sweep", "combo_key")]
OUTCOME_COLUMNS = ["status", "reason", "rel_err"]
LATENCY_COLUMNS = schema.names("latency", dtype="float")  # median, p20, p80
PHASE_COLUMNS = schema.names("phase")
# the ablation's figures and the trace's (the report's overlap table)
OVERLAP_COLUMNS = schema.names("overlap") + ["trace_overlap_fraction"]
# what the memory tables show (the analytic peak and the allocator's reserve are in the rows too)
MEMORY_COLUMNS = ["workspace_bytes_analytic", "workspace_bytes_peak", "device_bytes_peak"]
RATE_COLUMNS = schema.names("rate", combine=schema.MEAN, dtype="float")[:3]  # tflops, hbm_gbps, nvlink_gbps
PROVENANCE_COLUMNS = ["trace_path", *schema.names("provenance", combine=schema.RUN)]

# A file lacking any of these is malformed: no table can be drawn without them. The
# other columns are optional (filled with NaN / None) so that a report still renders rows
# from an older or newer schema version.
REQUIRED_COLUMNS = [
    "combo_key",
    "backend",
    "experts",
    "reduction",
    "overlap",
    "model",
    "quant",
    "world_size",
    "tokens_per_rank",
    "status",
] + LATENCY_COLUMNS
OPTIONAL_NUMERIC = [c for c in schema.names(dtype="float") if c not in LATENCY_COLUMNS]

# Columns that name a combination in tables and plots, in display order; a table shows
# those that vary within it and names the constant ones in its caption.
COMBO_COLUMNS = ["backend", "experts", "reduction", "overlap", "quant", "model", "world_size"]
# the other identity columns, shown where they vary within a run; "knobs" holds the tags of
# the entries' knobs off their defaults (backend.num_sms=16 -> sms16), as the row stored them
# (the recording's path is not identity: its digest, routing_file_sha256, is)
EXTRA_COMBO_COLUMNS = [c for c in SPEC_COLUMNS if c not in COMBO_COLUMNS and c != "routing_file"] + [
    "timing_mode",
    "knobs",
]
# columns of a row, not of its combination (graph timing runs events above graph_max_tokens)
PER_ROW_COLUMNS = ("timing_mode",)
# what makes a workload: combinations that share these saw the same tokens, so only they
# compete for "fastest" (the routing's keys and the emulated rank included)
WORKLOAD_COLUMNS = (
    "model",
    "world_size",
    "simulate_ep",
    "simulate_rank",
    "routing",
    "skew",
    "imbalance",
    "routing_file_sha256",
    "routing_layer",
    "fill",
    "seed",
)
# the model's sizes: shown only where they vary within one model
MODEL_COLUMNS = ("hidden", "intermediate", "num_experts", "topk", "num_shared_experts", "shared_intermediate")
SHORT_NAMES = {
    "world_size": "world",
    "simulate_ep": "sim_ep",
    "num_experts": "E",
    "intermediate": "inter",
    "timing_mode": "timing",
    "reduction": "red",
    "overlap": "ovl",
}


def _source(path: Path) -> tuple[list[Path] | None, Path | None]:
    """(row files outside a run folder or None for a run folder, run directory or None)."""
    if not path.exists():
        raise ValueError(
            f"results path {path} does not exist: pass a run directory "
            "(with rows/*.parquet), a directory of .parquet files or one file"
        )
    if path.is_file():
        run_dir = path.parent.parent if path.parent.name == "rows" else path.parent
        return [path], run_dir
    store = RunStore(path)
    if store.row_files() or (store.rows_dir / "skipped.parquet").is_file():
        return None, path
    files = sorted(p for p in path.glob("*.parquet") if not p.name.startswith("."))
    if not files:
        raise ValueError(
            f"no results in {path}: expected {store.rows_dir}/*.parquet (run a sweep "
            "first, e.g. `moebench sweep ...`, or point at its output directory)"
        )
    return files, path


def read_rows_file(path: str | Path) -> pd.DataFrame | None:
    """Read one parquet results file through the store's reader; None (and a warning line
    naming it) for a torn file, which the next sweep into the run sets aside and measures
    again; ValueError naming it for a file of some other tool or an unknown schema version."""
    path = Path(path)
    try:
        return read_row_file(path, REQUIRED_COLUMNS)
    except TornFile as exc:
        warn(f"{exc}: the report reads the rest (a sweep into the run moves it aside and measures its rows again)")
        return None


def read_env(run_dir: Path | None) -> dict:
    """The env.json fingerprint of a run directory ({} if there is none), with every
    invocation's under "invocations" (run_id -> fingerprint, envs/*.json): a run resumed on
    another machine or driver holds several, and the environment check reads them all."""
    if run_dir is None:
        return {}
    store = RunStore(run_dir)
    env = store.env()
    # each invocation's fingerprint (one that is not JSON is named and passed over)
    return {**env, "invocations": store.envs()} if env else {}


def load_run(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """Load a run: (one row per combination x tokens_per_rank, env fingerprint dict).

    Rows are read by the store (results/store.py), which also decides which of several rows
    of one (combination, tokens) stands. Times are in µs, memory in bytes, as stored.
    Optional numeric columns that are absent are added as NaN. Rows are sorted by
    combination then tokens_per_rank. Raises ValueError (what to do included) for a missing
    path, no rows or a malformed file.
    """
    files, run_dir = _source(Path(path))
    df = (
        RunStore(path).load(required=REQUIRED_COLUMNS)
        if files is None
        else load_files(files, str(path), required=REQUIRED_COLUMNS)
    )
    if df.empty:
        raise ValueError(f"no rows in {path}: every parquet file is empty or torn; re-run the sweep")
    env = read_env(run_dir)
    for col in OPTIONAL_NUMERIC:
        if col not in df.columns:
            df[col] = np.nan
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    # Plain float64 (NaN, never pd.NA) so that numpy predicates work on every cell.
    for col in LATENCY_COLUMNS + ["tokens_per_rank"]:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    if df["tokens_per_rank"].notna().all():
        df["tokens_per_rank"] = df["tokens_per_rank"].astype("int64")
    for col in IDENTITY_COLUMNS + PROVENANCE_COLUMNS:
        if col not in df.columns:
            df[col] = None
    df["reason"] = df["reason"].fillna("") if "reason" in df.columns else ""
    df["timing_note"] = df["timing_note"].fillna("") if "timing_note" in df.columns else ""
    if "samples_us" not in df.columns:
        df["samples_us"] = None
    df["knobs"] = df["knobs"].fillna("") if "knobs" in df.columns else ""
    order = [c for c in COMBO_COLUMNS + EXTRA_COMBO_COLUMNS if c in df.columns]
    df = df.sort_values(order + ["combo_key", "tokens_per_rank"], na_position="last", kind="stable").reset_index(
        drop=True
    )
    return df, env


def latest_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (combo_key, tokens_per_rank) by the store's precedence (a measured row
    before a skipped one, then the newest), in `df`'s order."""
    return latest(df)


def varying(df: pd.DataFrame, columns: list[str]) -> list[str]:
    """Columns (of ``columns``) that take more than one value in ``df`` (NaN counts)."""
    return [c for c in columns if c in df.columns and df[c].map(fmt_value).nunique() > 1]


def _by_model(df: pd.DataFrame, col: str) -> bool:
    """Whether a MODEL_COLUMNS column takes one value per model (the model names it), or
    the recording's digest one per model and routing (each model replays its own)."""
    keys = ["model"] if col in MODEL_COLUMNS else ["model", "routing"] if col == "routing_file_sha256" else None
    if keys is None or any(k not in df.columns for k in keys):
        return False
    by = [df[k].map(fmt_value) for k in keys]
    return bool((df.groupby(by)[col].agg(lambda s: s.map(fmt_value).nunique()) <= 1).all())


def shown_varying(df: pd.DataFrame, columns: list[str]) -> list[str]:
    """varying() less the model's sizes where the model already tells them apart."""
    return [c for c in varying(df, columns) if not _by_model(df, c)]


def display_columns(df: pd.DataFrame) -> list[str]:
    """Combination columns a table shows: those that vary within ``df`` (the constant
    ones go into the caption, constant_caption); the model where none varies."""
    shown = shown_varying(df, COMBO_COLUMNS + EXTRA_COMBO_COLUMNS)
    return shown or [c for c in ("model",) if c in df.columns]


def constant_caption(df: pd.DataFrame) -> str:
    """'backend=local, experts=triton, ...' for the combination columns that take one
    value in ``df`` (those a table leaves out, display_columns), less the fields at
    their spec default and the model's sizes."""
    from moebench.config.spec import field_default

    parts = []
    shown = set(display_columns(df))
    for c in COMBO_COLUMNS + EXTRA_COMBO_COLUMNS:
        if (
            c in df.columns
            and c not in shown
            and c not in MODEL_COLUMNS
            and len(df)
            and df[c].map(fmt_value).nunique() == 1
        ):
            v = fmt_value(df[c].iloc[0])
            try:
                default = field_default(c)
            except KeyError:
                default = None
            if v in ("-", "", "None") or (default is not None and v == fmt_value(default) and c not in COMBO_COLUMNS):
                continue
            parts.append(f"{c}={v}")
    return ", ".join(parts)


def run_timestamp(run_dir: Path) -> str:
    """The newest row timestamp of a run (ISO text; '' without one), read from the
    timestamp column only."""
    col = RunStore(run_dir).column_values(["timestamp"]).get("timestamp")
    stamps = [str(t) for t in col.dropna()] if col is not None else []
    return max(stamps) if stamps else ""


def newest_run(root: str | Path) -> Path | None:
    """The run under ``root`` (a directory holding rows/*.parquet, at any depth) whose rows
    were written last, by their stored timestamps (not file times: a checkout rewrites those)."""
    timed = sorted((run_timestamp(r), str(r)) for r in find_runs(root))
    return Path(timed[-1][1]) if timed else None


def fmt_value(v) -> str:
    """Identity value as text: integral floats without '.0', NaN as '-'."""
    if v is None or (np.isscalar(v) and pd.isna(v)) or v is pd.NA:
        return "-"
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def combo_labels(
    df: pd.DataFrame, exclude=(), within: pd.DataFrame | None = None, fallback: str | None = None
) -> pd.Series:
    """Short label per row naming its combination: 'local/triton mixtral_8x7b red=finalize'.

    Only columns that vary within ``within`` (default ``df``) enter the label, less
    ``exclude`` (a plot panel's own columns) and the per-row PER_ROW_COLUMNS, so labels
    stay short and still tell the lines of a plot apart. Backend, experts and model show bare
    values; the knobs their tags ('sms16 carve24'). A row that nothing tells apart is
    named ``fallback`` (default: its model).
    """
    if "knobs" not in df.columns:
        df = df.assign(knobs="")
    ref = df if within is None else within
    if "knobs" not in ref.columns:
        ref = ref.assign(knobs="")
    extra = [
        c
        for c in shown_varying(ref, COMBO_COLUMNS + EXTRA_COMBO_COLUMNS)
        if c not in exclude and c not in PER_ROW_COLUMNS
    ]
    if "knobs" in extra and "shared_sm_carveout" in extra:  # the knobs' tags hold the carveout (carve24)
        extra.remove("shared_sm_carveout")

    def label(row) -> str:
        bare = [fmt_value(row[c]) for c in ("backend", "experts") if c in extra]
        parts = ["/".join(bare)] if bare else []
        parts += [fmt_value(row["model"])] if "model" in extra else []
        parts += [
            f"{SHORT_NAMES.get(c, c)}={fmt_value(row[c])}"
            for c in extra
            if c not in ("backend", "experts", "model", "knobs")
        ]
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
    return df.apply(label, axis=1)


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
