"""Rows of older schema versions, upgraded on load (report, compare, resume).

Schema 1 stored part of the identity (no shared-expert sizes, skew, trace, graph or
flush settings, knobs only as columns some versions had) and keyed combinations on a
fixed list of fields. A schema-1 row is migrated by composing its stored `overrides`
again under the defaults schema 1 had (runner.timing=events), renamed keys spelled as
today, on the device it ran on; the Combo so recovered must agree with every identity
column the row stored, else the row keeps a key of its own (`v1-<old key>`), which
pairs only with rows of the same old combination. Newer or unknown versions are refused.

Rows of any version that ran on the CPU before its timing had a name of its own read
`timing_mode` `events` (CHANGELOG 0.3): a CPU has no events, its host clock timed them, and
they load as `cpu`, as newer CPU rows are stored.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np
import pandas as pd

from moebench.config.compose import check_values, compose_config, rename, to_combo
from moebench.config.spec import Combo
from moebench.results.row import SCHEMA_VERSION

KNOWN_VERSIONS = (1, SCHEMA_VERSION)
# what schema 1 stored of the identity, as (row column, Combo field or knob)
V1_CHECKED = (
    ("backend", "backend"),
    ("experts", "experts"),
    ("reduction", "reduction"),
    ("overlap", "overlap"),
    ("model", "model"),
    ("num_experts", "num_experts"),
    ("topk", "topk"),
    ("hidden", "hidden"),
    ("intermediate", "intermediate"),
    ("quant", "quant"),
    ("world_size", "world_size"),
    ("simulate_ep", "simulate_ep"),
    ("routing", "routing"),
    ("seed", "seed"),
    ("device", "device"),
    ("shared_sm_carveout", "shared_sm_carveout"),
    ("num_sms", "num_sms"),
    ("dispatch_nvl_chunk", "dispatch_nvl_chunk"),
    ("combine_nvl_chunk", "combine_nvl_chunk"),
    ("row_layout", "row_layout"),
    ("fp8_layout", "row_layout"),
)
V1_DEFAULTS = ("runner.timing=events",)  # schema 1's default timing


def check_versions(df: pd.DataFrame, where: str) -> None:
    """Refuse rows of a schema version this code does not know (a newer moebench wrote them)."""
    if "schema_version" not in df.columns or not len(df):
        return
    versions = sorted({int(v) for v in pd.to_numeric(df["schema_version"], errors="coerce").dropna()})
    unknown = [v for v in versions if v not in KNOWN_VERSIONS]
    if unknown or df["schema_version"].isna().any():
        shown: list = unknown or ["missing"]
        raise ValueError(
            f"{where}: rows of schema_version {shown[0]}; this moebench reads versions "
            f"{', '.join(map(str, KNOWN_VERSIONS))}: use the moebench that wrote them, or re-run"
        )


def _split_overrides(text: str) -> list[str]:
    """The stored 'a=1 b=[16, 64]' back into overrides (a value may hold spaces)."""
    out: list[str] = []
    for part in str(text).split(" "):
        if "=" in part.split("[")[0] or not out:
            out.append(part)
        else:
            out[-1] += " " + part
    return [o for o in out if o]


@lru_cache(maxsize=4096)
def v1_combo(overrides: str, device: str) -> Combo:
    """The Combo a schema-1 row's overrides compose to today (ValueError if they do not)."""
    ovs = [rename(o).lstrip("+") for o in _split_overrides(overrides)]
    keys = {o.partition("=")[0] for o in ovs}
    ovs += [d for d in V1_DEFAULTS if d.partition("=")[0] not in keys]
    cfg = compose_config(ovs)
    check_values(cfg)
    return to_combo(cfg, device=device)


def _same(stored, value) -> bool:
    if stored is None or (isinstance(stored, float) and np.isnan(stored)):
        return True  # a column this row's version did not store
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(stored) == float(value)
        except (TypeError, ValueError):
            return False
    return str(stored) == str(value)


def migrate_v1_row(row: dict) -> tuple[Combo | None, str]:
    """(the row's Combo, '') or (None, why it cannot be recovered)."""
    try:
        combo = v1_combo(row.get("overrides") or "", str(row.get("device") or "cpu"))
    except ValueError as e:
        return None, f"its overrides do not compose today: {e}"
    for column, name in V1_CHECKED:
        if column in row and not _same(row[column], combo.get(name, row[column])):
            return None, f"{column}={row[column]!r} but its overrides give {combo.get(name)!r}"
    return combo, ""


def cpu_timing(df: pd.DataFrame) -> pd.DataFrame:
    """CPU rows stored as timing_mode `events` (before the CPU's mode had its name) as `cpu`."""
    if not {"device", "timing_mode"} <= set(df.columns):
        return df
    old = df["device"].astype(str).eq("cpu") & df["timing_mode"].astype(str).eq("events")
    if not old.any():
        return df
    df = df.copy()
    df.loc[old, "timing_mode"] = "cpu"
    return df


def migrate(df: pd.DataFrame, where: str = "results") -> pd.DataFrame:
    """Rows of any known version as schema-2 rows (a frame of schema-2 rows comes back as is, but
    for cpu_timing)."""
    check_versions(df, where)
    if not len(df) or "schema_version" not in df.columns:
        return df
    df = cpu_timing(df)
    old = pd.to_numeric(df["schema_version"]) == 1
    if not old.any():
        return df
    df = df.copy()
    failed = 0
    updates: dict[int, dict] = {}
    for i, row in df[old].iterrows():
        row = row.to_dict()
        combo, why = migrate_v1_row(row)
        if combo is None:
            failed += 1
            updates[i] = {"combo_key": f"v1-{row.get('combo_key')}", "migration_note": why}
            continue
        cols = combo.columns()
        cols.pop("label")  # the stored label stays: it is what the run printed
        updates[i] = {**cols, "combo_key_v1": row.get("combo_key"), "migration_note": ""}
    for col in sorted({c for u in updates.values() for c in u}):
        if col not in df.columns:
            df[col] = None
        df[col] = df[col].astype(object)
    for i, u in updates.items():
        for col, v in u.items():
            df.at[i, col] = v
    df.loc[old, "schema_version"] = SCHEMA_VERSION
    if failed:
        warnings.warn(
            f"{where}: {failed} schema-1 rows keep their old keys (v1-...): their stored overrides no "
            "longer compose to the combination they ran",
            stacklevel=2,
        )
    return df
