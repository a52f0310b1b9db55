"""The markdown report of a run (``<run>/report/report.md`` + PNGs) and the CLI entry.

``moebench report RUN`` prints the status and latency tables and writes the report;
``moebench report --baseline A --candidate B`` (or ``RUN --baseline A``) puts the
comparison first, as a PR description wants it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import plots, tables
from .compare import Comparison, compare_runs, comparison_markdown, \
    latency_comparison_table, summary_line
from .load import load_run

ENV_FIELDS = [  # (label, keys tried in order; a key also matches the tail of a dotted key)
    ("GPU", ["gpu", "gpu_name", "gpu.name", "device_name", "gpus"]),
    ("driver", ["driver", "driver_version", "nvidia_driver"]),
    ("CUDA", ["cuda", "cuda_version", "torch_cuda"]),
    ("NCCL", ["nccl", "nccl_version"]),
    ("torch", ["torch", "torch_version"]),
    ("triton", ["triton", "triton_version"]),
    ("deep_ep", ["deep_ep"]),
    ("deep_gemm", ["deep_gemm"]),
    ("pplx", ["pplx_kernels", "pplx"]),
]
LIBRARIES = ("deep_ep", "deep_gemm", "pplx")
FORMATS = ("md", "markdown", "csv", "json")


@dataclass
class Report:
    """What build_report made: the report path, the rows, env and the comparison."""

    path: Path
    df: pd.DataFrame
    env: dict
    comparison: Comparison | None


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def env_value(env: dict, keys: list[str]):
    """First value of ``keys`` in a (possibly nested) env dict; None if absent."""
    flat = _flatten(env)
    for k in keys:
        for fk, v in flat.items():
            if fk == k or fk.endswith("." + k):
                return v
    return None


def _gpu_text(value, env: dict) -> str | None:
    if isinstance(value, (list, tuple)):
        names = [str(v.get("name", v)) if isinstance(v, dict) else str(v) for v in value]
        uniq = sorted(set(names))
        return f"{len(names)} × {uniq[0]}" if len(uniq) == 1 else ", ".join(names)
    count = env_value(env, ["gpu_count", "num_gpus", "device_count"])
    if value and str(count).isdigit() and int(count) > 1:
        return f"{int(count)} × {value}"
    return None if value is None else str(value)


def _smi_driver(env: dict) -> str | None:
    """Driver version from the fingerprint's nvidia-smi query lines ('name, driver, ...')."""
    lines = env_value(env, ["nvidia_smi"])
    if isinstance(lines, (list, tuple)) and lines and str(lines[0]).count(",") >= 1:
        return str(lines[0]).split(",")[1].strip()
    return None


def env_summary(env: dict, df: pd.DataFrame | None = None) -> str:
    """One line: GPU, driver, CUDA, NCCL, torch, triton, kernel libraries, git sha, host.

    Falls back to the rows' ``gpu`` / ``git_sha`` columns where env.json lacks them.
    """
    parts = []
    for label, keys in ENV_FIELDS:
        value = env_value(env, keys)
        if label == "driver" and value is None:
            value = _smi_driver(env)
        if label == "GPU":
            value = _gpu_text(value, env)
            if value is None and df is not None and df["gpu"].notna().any():
                value = ", ".join(sorted({str(g) for g in df["gpu"].dropna()}))
        if label in LIBRARIES:
            if env:  # without env.json, "not installed" would be a guess
                parts.append(f"{label} {value if value else 'not installed'}")
        elif value is not None:
            parts.append(f"{label} {value}")
    sha = env_value(env, ["git_sha", "sha", "commit"])
    if sha is None and df is not None and df["git_sha"].notna().any():
        sha = df["git_sha"].dropna().iloc[-1]
    if sha:
        dirty = env_value(env, ["dirty", "git_dirty"])
        parts.append(f"git {str(sha)[:10]}" + (" (dirty)" if dirty else ""))
    host = env_value(env, ["hostname", "host"])
    if host:
        parts.append(f"host {host}")
    if not env:
        parts.append("(no env.json: environment unknown)")
    return " · ".join(parts)


def env_differences(base_env: dict, cand_env: dict) -> list[str]:
    """'GPU: A → B' for each ENV_FIELDS entry that differs between two runs."""
    diffs = []
    for label, keys in ENV_FIELDS:
        a, b = env_value(base_env, keys), env_value(cand_env, keys)
        if a != b and (a is not None or b is not None):
            diffs.append(f"{label}: {a} → {b}")
    return diffs


def run_summary(df: pd.DataFrame) -> str:
    """'run r1 (sweep s) · 21 rows · 7 combinations · 2026-01-01 … 2026-01-02'."""
    runs = ", ".join(sorted({str(r) for r in df["run_id"].dropna()})) or "?"
    sweeps = ", ".join(sorted({str(s) for s in df["sweep"].dropna()})) or "?"
    text = (f"run {runs} (sweep {sweeps}) · {len(df)} rows · "
            f"{df['combo_key'].nunique()} combinations")
    stamps = df["timestamp"].dropna().astype(str)
    if len(stamps):
        text += f" · {stamps.min()} … {stamps.max()}"
    return text


def _run_root(path: Path) -> Path:
    """The run directory for a run dir, a rows/ file or a loose parquet file."""
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == "rows" else path.parent


def _image(path: Path | None, alt: str) -> str:
    return f"![{alt}]({path.name})" if path is not None else ""


def build_report(run_dir, out_dir=None, baseline=None, threshold: float = 1.05) -> Report:
    """Write report.md and its PNGs for ``run_dir`` (with a comparison section first when
    ``baseline`` is a run path). ``out_dir`` defaults to ``<run>/report``."""
    run_dir = Path(run_dir)
    df, env = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else _run_root(run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    sections = [f"# moebench report: {_run_root(run_dir).name}",
                f"Environment: {env_summary(env, df)}", run_summary(df)]
    cmp = None
    if baseline is not None:
        base_df, base_env = load_run(baseline)
        cmp = compare_runs(base_df, df, threshold=threshold)
        diffs = env_differences(base_env, env)
        notes = [f"Baseline environment: {env_summary(base_env, base_df)}",
                 "**Environments differ** (compare with care): " + "; ".join(diffs)
                 if diffs else "",
                 _image(plots.plot_comparison(cmp, out / "comparison.png"),
                        "latency ratio per combination")]
        sections.append(comparison_markdown(cmp, baseline_name=_run_root(Path(baseline)).name,
                                            candidate_name=_run_root(run_dir).name,
                                            notes=notes))
        sections.append(f"## This run: {_run_root(run_dir).name}")
    sections += [
        "## Status", tables.status_table(df), tables.reasons_table(df),
        "## Latency", tables.latency_table(df),
        _image(plots.plot_latency(df, out / "latency.png"), "latency vs tokens per rank"),
        "## Phase breakdown", tables.phase_table(df),
        _image(plots.plot_phases(df, out / "phases.png"), "phase breakdown"),
        "## Shared-expert overlap", tables.overlap_table(df),
        _image(plots.plot_overlap(df, out / "overlap.png"), "shared-expert overlap"),
        "## Memory", tables.memory_table(df),
        "## Experts against the roofline", tables.roofline_table(df),
        _image(plots.plot_workspace(df, out / "workspace.png"), "workspace per reduction"),
    ]
    path = out / "report.md"
    path.write_text("\n\n".join(s for s in sections if s) + "\n")
    return Report(path, df, env, cmp)


def write_report(run_dir, out_dir=None, baseline=None, threshold: float = 1.05) -> Path:
    """Write ``<out_dir or run/report>/report.md`` with PNGs beside it; return its path."""
    return build_report(run_dir, out_dir, baseline, threshold).path


def _records(df: pd.DataFrame) -> pd.DataFrame:
    """Rows without list columns (samples_us, per-rank lists), for csv / json output."""
    def is_list(col: pd.Series) -> bool:
        return col.dtype == object and col.map(lambda v: hasattr(v, "__len__")
                                               and not isinstance(v, str)).any()
    return df.drop(columns=[c for c in df.columns if is_list(df[c])])


def report_command(run: str | None, baseline: str | None, candidate: str | None,
                   out: str | None, threshold: float = 1.05, fmt: str = "md") -> int:
    """CLI body of ``moebench report``: write the report and print its tables.

    ``fmt`` picks what goes to stdout: md (markdown tables), csv or json (the rows, or the
    matched comparison rows). The report path goes to stderr. Returns 0; raises
    ValueError (the CLI exits 2) for bad arguments or unreadable results.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if run is not None and candidate is not None and Path(run) != Path(candidate):
        raise ValueError("give the run either as RUN or as --candidate, not both")
    candidate = candidate if candidate is not None else run
    if candidate is None:
        raise ValueError("nothing to report: `moebench report RUN` for one run, or "
                         "`moebench report --baseline A --candidate B` to compare two")
    for p in (candidate, baseline):
        if p is not None and not Path(p).exists():
            raise ValueError(f"results path {p} does not exist: pass a run directory "
                             "(with rows/*.parquet)")
    rep = build_report(candidate, out, baseline, threshold)
    if fmt in ("csv", "json"):
        data = _records(rep.comparison.matched if rep.comparison is not None else rep.df)
        print(data.to_csv(index=False) if fmt == "csv"
              else data.to_json(orient="records", indent=1))
    elif rep.comparison is not None:
        print(summary_line(rep.comparison) + "\n")
        print(latency_comparison_table(rep.comparison))
    else:
        print(f"Environment: {env_summary(rep.env, rep.df)}\n")
        print(tables.status_table(rep.df) + "\n")
        print(tables.latency_table(rep.df))
    print(f"report written to {rep.path}", file=sys.stderr)
    return 0
