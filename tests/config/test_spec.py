"""One definition of a combination (moebench/config/spec.py): the key, label, stored columns and
compare's matching derive from it; committed rows keep keys that their stored fields
recompute; the row schema is pinned."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moebench.config import spec
from moebench.report.compare import compare_runs
from moebench.report.load import load_run
from moebench.results import row as rowschema
from moebench.results.migrate import migrate, migrate_v1_row
from moebench.results.synthetic import make_row, samples_from, write_run
from moebench.run import plan

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "row_schema.json"


def _committed_runs() -> list[Path]:
    return sorted({p.parent.parent for p in (ROOT / "results").rglob("rows/*.parquet")})


def _run_rows(run: Path) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in sorted((run / "rows").glob("*.parquet"))], ignore_index=True)


def test_identity_fields_are_columns_and_the_key_covers_them():
    fields = {f.name for f in spec.IDENTITY_FIELDS}
    assert fields <= set(spec.IDENTITY_COLUMNS)  # every identity field is stored
    assert {
        "skew",
        "num_shared_experts",
        "shared_intermediate",
        "trace",
        "l2_flush",
        "graph_max_tokens",
        "timing",
        "memory_budget",
    } <= fields
    (c,), _ = plan.plan(["backend=local", "experts=torch", "model=tiny"], None)
    for f in spec.IDENTITY_FIELDS:  # changing any identity field changes the key
        v = getattr(c.combo, f.name)
        other = (not v) if isinstance(v, bool) else v + "_x" if isinstance(v, str) else v + 1
        assert c.combo.replace(**{f.name: other}).key != c.key, f.name
    for f in ("reps", "warmup", "timeout_s", "trace_dir"):  # how long, not what: the same combination
        v = getattr(c.combo, f)
        assert c.combo.replace(**{f: v * 2 if not isinstance(v, str) else v + "x"}).key == c.key


def _two_runs(tmp_path, base_changes: dict, cand_changes: dict, name: str):
    rng = np.random.default_rng(0)
    rows_a = [
        make_row(
            "local",
            "torch",
            "experts",
            "none",
            "bf16",
            t,
            samples_us=samples_from(100 + t, 0.01, 20, rng),
            **base_changes,
        )
        for t in (16, 64)
    ]
    rows_b = [
        make_row(
            "local",
            "torch",
            "experts",
            "none",
            "bf16",
            t,
            samples_us=samples_from(100 + t, 0.01, 20, rng),
            **cand_changes,
        )
        for t in (16, 64)
    ]
    a = write_run(tmp_path / f"{name}_a", pd.DataFrame(rows_a))
    b = write_run(tmp_path / f"{name}_b", pd.DataFrame(rows_b))
    return load_run(a)[0], load_run(b)[0]


@pytest.mark.parametrize(
    "base, cand",
    [
        ({"routing": "zipf", "skew": 1.2}, {"routing": "zipf", "skew": 3.0}),  # the wrong pairing
        ({}, {"shared_sm_carveout": 24}),
        ({"knobs_set": {"num_sms": 24}}, {"knobs_set": {"num_sms": 16}}),
        ({}, {"timing": "graph"}),
        ({}, {"trace": "torch"}),
    ],
)
def test_compare_pairs_no_rows_of_combinations_that_differ_in_one_field_or_knob(tmp_path, base, cand):
    a, b = _two_runs(tmp_path, base, cand, "x")
    cmp = compare_runs(a, b)
    assert len(cmp.matched) == 0 and len(cmp.only_baseline) == 2 and len(cmp.only_candidate) == 2
    same = compare_runs(a, a)
    assert len(same.matched) == 2


def test_plans_that_differ_only_in_a_knob_have_different_keys():
    ovs = [
        "backend=deepep_ht",
        "experts=torch",
        "reduction=finalize",
        "overlap=combine",
        "model=deepseek_v3",
        "runner.device=cpu",
    ]
    (a,), _ = plan.plan(ovs + ["backend.num_sms=16"], None)
    (b,), _ = plan.plan(ovs + ["backend.num_sms=24"], None)
    (c,), _ = plan.plan(ovs + ["overlap.shared_sm_carveout=24"], None)
    assert len({a.key, b.key, c.key}) == 3
    (d,), _ = plan.plan(ovs, None)
    assert d.key == b.key  # 24 is the default: left out of the key


def test_every_committed_row_recomputes_its_key():
    """Schema-2 rows: their stored identity columns give their key again. Schema-1 rows: their
    stored overrides compose to a Combo that agrees with every identity column they stored,
    whose key is the one migration gives them; distinct old keys stay distinct."""
    runs = _committed_runs()
    assert len(runs) >= 20
    checked = 0
    for run in runs:
        df = _run_rows(run)
        migrated = migrate(df, str(run))
        for (_, row), (_, new) in zip(df.iterrows(), migrated.iterrows(), strict=True):
            row, new = row.to_dict(), new.to_dict()
            if int(row["schema_version"]) == rowschema.SCHEMA_VERSION:
                assert spec.from_row(row).key == row["combo_key"], (run, row["label"])
            else:
                combo, why = migrate_v1_row(row)
                assert combo is not None, (run, row.get("label"), why)
                assert new["combo_key"] == combo.key and new["combo_key_v1"] == row["combo_key"]
                assert spec.from_row(new).key == new["combo_key"]  # what it is stored as from now on
            checked += 1
        old_to_new = migrated.groupby("combo_key_v1")["combo_key"].nunique() if "combo_key_v1" in migrated else None
        if old_to_new is not None:
            assert (old_to_new == 1).all(), run  # one old combination, one new key
            new_to_old = migrated.groupby("combo_key")["combo_key_v1"].nunique()
            assert (new_to_old == 1).all(), run  # no two old combinations collapse into one
    assert checked > 500


# slow tier: ~40 runs' rows loaded and compared pairwise (80-90 s beside other work); the default
# tier's: the synthetic pairs above, and every committed row's key (test_every_committed_row_recomputes_its_key)
# identity columns some committed runs predate (their rows hold None where a newer run stores the
# default: the key is the same, the column is not compared)
ADDED_SINCE = {
    "simulate_tp",
    "model_config_sha256",
    "simulate_rank",
    "imbalance",
    "routing_file",
    "routing_file_sha256",
    "routing_layer",
    "fill",
}


@pytest.mark.slow
def test_compare_over_committed_runs_pairs_only_equal_keys_and_identities():
    """Each committed run against each other of its folder: every matched pair has one key and
    the same identity columns on both sides."""
    from moebench.report.load import IDENTITY_COLUMNS

    runs = [r for r in _committed_runs() if "archive" not in r.parts]
    loaded = {r: load_run(r)[0] for r in runs}
    from moebench.results import row as schema

    # which row it is and where it came from (schema_version, run_id, sweep, combo_key, write_seq)
    cols = [c for c in IDENTITY_COLUMNS if c not in schema.having(schema.ORIGIN)]
    pairs = 0
    for a in runs:
        for b in runs:
            # each pair once (b against a pairs the same rows), its identities compared column by column
            if a.parent != b.parent or not a < b:
                continue
            cmp = compare_runs(loaded[a], loaded[b])
            base = loaded[a].drop_duplicates(["combo_key", "tokens_per_rank"], keep="last")
            got = cmp.matched.merge(
                base,
                on=["combo_key", "tokens_per_rank"],
                how="left",
                suffixes=("", "@base"),
                indicator=True,
                validate="many_to_one",
            )
            assert (got["_merge"] == "both").all(), (a, b)
            for col in cols:
                if col in base.columns and col != "tokens_per_rank":
                    if col in ADDED_SINCE and (got[col].isna().all() or got[f"{col}@base"].isna().all()):
                        continue  # one run predates the column: its default keeps the key
                    differ = got[col].map(str) != got[f"{col}@base"].map(str)
                    assert not differ.any(), (a, b, col, got.loc[differ, [col, f"{col}@base"]].head())
            pairs += len(got)
    assert pairs > 0


# both families (1 rank, 2 gloo ranks), ok and skipped rows
SCHEMA_SWEEP = ["backend=local,naive", "experts=torch,torch_batched", "reduction=finalize", "overlap=none,combine"]


def _cpu_sweep(out, overrides=SCHEMA_SWEEP):
    from moebench.results.store import RunStore
    from moebench.run.sweep import execute

    run_dir, _ = execute(
        [
            *overrides,
            "quant=bf16",
            "model=tiny",
            "workload.tokens_per_rank=[4]",
            "runner.reps=2",
            "runner.warmup=0",
            "runner.phase_reps=1",
        ],
        "default",
        str(out),
        quiet=True,
    )
    return RunStore(run_dir).load()


def _compatible(observed: str, dtype: str) -> bool:
    return observed in ("null", dtype) or (observed == "int" and dtype == "float")


def test_the_generated_schema_files_match_row_py():
    """tests/golden/row_schema.json and docs/design.md's column table are generated from
    moebench/results/row.py: an edit to either by hand, or a column added to row.py without
    `python -m moebench.results.row --write`, fails here."""
    assert GOLDEN.read_text() == rowschema.golden_text(), "run `python -m moebench.results.row --write`"
    design = (ROOT / "docs" / "design.md").read_text()
    assert design == rowschema.design_text(design), "run `python -m moebench.results.row --write`"
    assert rowschema.main([]) == 0


@pytest.mark.multiprocess
def test_row_schema_is_pinned(tmp_path):
    """The columns a real CPU sweep writes are exactly row.py's, each of its declared type
    (NaN / None where not measured): a column written without a Column in row.py, or one
    row.py names that no row carries, fails here. A change of a column's meaning bumps
    rowschema.SCHEMA_VERSION with a migration (moebench/results/migrate.py)."""
    df = _cpu_sweep(tmp_path / "run")
    assert {"ok", "skipped"} <= set(df["status"])
    declared = {c.name: c.dtype for c in rowschema.columns()}
    assert sorted(df.columns) == sorted(declared), _diff(declared, {c: "?" for c in df.columns})
    wrong = {c: (_kind(df[c]), declared[c]) for c in df.columns if not _compatible(_kind(df[c]), declared[c])}
    assert not wrong, wrong
    assert set(df["status"]) <= set(rowschema.STATUSES)
    assert json.loads(GOLDEN.read_text())["schema_version"] == rowschema.SCHEMA_VERSION


@pytest.mark.multiprocess
def test_a_column_added_to_row_py_reaches_the_rows_the_golden_file_and_the_docs(tmp_path, monkeypatch):
    """What the contributor guide promises: one Column in row.MEASURED and the sweep writes
    it (its default until some code measures it), the report reads it, and the generated
    golden schema and design table list it."""
    extra = rowschema.Column("throwaway_us", "float", "latency", rowschema.MAX, "a column added by a test")
    monkeypatch.setattr(rowschema, "MEASURED", (*rowschema.MEASURED, extra))
    assert '"throwaway_us": "float"' in rowschema.golden_text()
    design = (ROOT / "docs" / "design.md").read_text()
    assert "| `throwaway_us` | float | latency | max | a column added by a test |" in rowschema.design_text(design)
    assert rowschema.golden_text() != GOLDEN.read_text()  # the check would now ask for --write
    df = _cpu_sweep(tmp_path / "run", ["backend=local", "experts=torch", "reduction=finalize", "overlap=none"])
    assert "throwaway_us" in df.columns and df["throwaway_us"].isna().all()
    loaded, _ = load_run(tmp_path / "run")
    assert "throwaway_us" in loaded.columns


def _kind(col: pd.Series) -> str:
    vals = [v for v in col if v is not None and not (isinstance(v, float) and np.isnan(v))]
    if not vals:
        return "null"
    kinds = {
        "list"
        if isinstance(v, (list, np.ndarray))
        else "bool"
        if isinstance(v, (bool, np.bool_))
        else "int"
        if isinstance(v, (int, np.integer))
        else "float"
        if isinstance(v, (float, np.floating))
        else "str"
        for v in vals
    }
    if kinds == {"int", "float"}:
        return "float"
    return "|".join(sorted(kinds))


def _diff(golden: dict, now: dict) -> str:
    added = sorted(set(now) - set(golden))
    gone = sorted(set(golden) - set(now))
    changed = sorted(k for k in set(now) & set(golden) if now[k] != golden[k])
    return f"added {added}, removed {gone}, changed {[(k, golden[k], now[k]) for k in changed]}"
