"""Roofline floor of a row (docs/design.md): the experts' fewest bytes over the GPU's
measured copy bandwidth, or their FLOPs over its measured GEMM peak, whichever is larger.

The ceilings are measurements, never constants: `benchmarks/ceilings.py` writes
`results/ceilings/<gpu-slug>/ceilings.json` on the GPU, and a row takes the file whose `gpu`
is the row's `gpu` (its CUDA device name, as env.json records it). The folder searched is the
repository's `results/ceilings/`, or `$MOEBENCH_CEILINGS_DIR`, or the `root` argument. A row
whose GPU has no file gets no floor: the report says "no ceiling measured for this GPU"
rather than borrowing another GPU's figures. A file measured on the CPU (`--cpu`, a check of
the script and its format) is never read as a GPU's ceiling.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from moebench.config.paths import REPO_ROOT
from moebench.report.mdsafe import md_text

CEILINGS_ENV = "MOEBENCH_CEILINGS_DIR"
SCHEMA = "moebench-ceilings/1"
NO_CEILING = "no ceiling measured for this GPU"
# which measured GEMM peak bounds each quant: every fp8 layout by the fastest fp8 GEMM measured
PEAK_OF_QUANT = {"bf16": "bf16", "fp8_block": "fp8", "fp8_tensor": "fp8"}
FLOOR_COLUMNS = ["hbm_floor_us", "flop_floor_us", "floor_us", "bound", "experts_pct_of_floor", "ceilings_file"]


@dataclass(frozen=True)
class Ceilings:
    """One GPU's measured ceilings (benchmarks/ceilings.py)."""

    gpu: str  # CUDA device name, e.g. "NVIDIA H200"
    device: str  # "cuda"; "cpu" for a format check (--cpu), never a GPU's ceiling
    copy_bytes_per_s: float  # device-to-device copy, read + write bytes per second
    gemm_flops_per_s: dict  # "bf16" / "fp8" -> dense GEMM FLOP/s
    path: Path
    commit: str
    timestamp: str
    # the SM clock (MHz) each GEMM peak ran at ("bf16" / "fp8"; files from before the clock: none)
    clock_mhz: dict = field(default_factory=dict)


def gpu_slug(gpu: str) -> str:
    """The folder name of a GPU's ceilings: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", gpu.strip().lower()).strip("-") or "unknown"


def ceilings_dir(root: str | Path | None = None) -> Path:
    """Where ceilings files are looked up: `root`, else $MOEBENCH_CEILINGS_DIR, else the
    repository's results/ceilings/."""
    return Path(root or os.environ.get(CEILINGS_ENV) or REPO_ROOT / "results" / "ceilings")


def read_ceilings(path: str | Path, require_gpu: bool = True) -> Ceilings:
    """A ceilings.json as benchmarks/ceilings.py writes it. ValueError when it is malformed or,
    with require_gpu, when it was measured on anything but a CUDA device."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable ceilings file ({e})") from e
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(
            f"{path}: schema is {doc.get('schema') if isinstance(doc, dict) else None!r}, "
            f"expected {SCHEMA!r} (written by benchmarks/ceilings.py)"
        )
    if require_gpu and doc.get("device") != "cuda":
        raise ValueError(f"{path}: measured on {doc.get('device')!r}, not a GPU: it is no GPU's ceiling")
    c = doc.get("ceilings") or {}
    copy, gemm = c.get("copy_bytes_per_s"), c.get("gemm_flops_per_s") or {}
    numbers = [copy] + [gemm.get(k) for k in ("bf16", "fp8")]
    if not all(isinstance(x, (int, float)) and np.isfinite(x) and x > 0 for x in numbers) or not doc.get("gpu"):
        raise ValueError(
            f"{path}: needs gpu, ceilings.copy_bytes_per_s and ceilings.gemm_flops_per_s "
            f"bf16 and fp8 as positive numbers"
        )
    return Ceilings(
        str(doc["gpu"]),
        str(doc.get("device")),
        float(cast(float, copy)),  # checked a positive number above
        {k: float(gemm[k]) for k in ("bf16", "fp8")},
        path,
        str(doc.get("commit") or "unknown"),
        str(doc.get("timestamp") or ""),
        {
            k: float(v)
            for k, v in (c.get("sm_clock_mhz") or {}).items()
            if k in ("bf16", "fp8") and isinstance(v, (int, float)) and np.isfinite(v) and v > 0
        },
    )


def find_ceilings(gpu, root: str | Path | None = None) -> Ceilings | None:
    """The ceilings measured on a GPU of this name (case and spacing ignored), the newest where
    several were; None where none was (or `gpu` is missing / "cpu")."""
    if not isinstance(gpu, str) or not gpu.strip() or gpu.strip().lower() == "cpu":
        return None
    found = []
    for p in sorted(ceilings_dir(root).glob("*/ceilings.json")):
        c = read_ceilings(p, require_gpu=False)
        if c.device != "cuda":  # a CPU check of the format: never a GPU's ceiling
            continue
        if " ".join(c.gpu.lower().split()) == " ".join(gpu.lower().split()):
            found.append(c)
    return max(found, key=lambda c: c.timestamp) if found else None


def add_floor(df: pd.DataFrame, root: str | Path | None = None) -> pd.DataFrame:
    """Adds `hbm_floor_us`, `flop_floor_us`, `floor_us` (µs), `bound` ('memory' | 'compute'),
    `experts_pct_of_floor` (floor / experts_us * 100: 100 means the experts phase runs at the
    floor) and `ceilings_file`, from the ceilings of each row's `gpu`. Rows whose GPU has no
    measured ceilings keep NaN floors, an empty bound and no file."""
    out = df.copy()
    gpus = out["gpu"] if "gpu" in out else pd.Series(np.nan, index=out.index)
    found = {g: find_ceilings(g, root) for g in gpus.dropna().unique()}
    ceil = gpus.map(lambda g: found.get(g))
    copy = ceil.map(lambda c: c.copy_bytes_per_s if c else np.nan).astype(float)
    peak = pd.Series(
        [
            c.gemm_flops_per_s.get(PEAK_OF_QUANT.get(q, ""), np.nan) if c else np.nan
            for c, q in zip(ceil, out["quant"], strict=True)
        ],
        index=out.index,
        dtype=float,
    )
    # the GEMM peak at the row's clock where both are known: a compute-bound kernel's rate goes as
    # the SM clock (docs/design.md, "Derived rates and the roofline"); 1 elsewhere
    peak_clock = pd.Series(
        [
            c.clock_mhz.get(PEAK_OF_QUANT.get(q, ""), np.nan) if c else np.nan
            for c, q in zip(ceil, out["quant"], strict=True)
        ],
        index=out.index,
        dtype=float,
    )
    row_clock = pd.to_numeric(out.get("sm_clock_mhz_median", pd.Series(np.nan, index=out.index)), errors="coerce")
    out["flop_clock_scale"] = (row_clock / peak_clock).where(lambda x: np.isfinite(x) & (x > 0), 1.0)
    out["hbm_floor_us"] = out["expert_bytes"] / copy * 1e6
    out["flop_floor_us"] = out["expert_flops"] / (peak * out["flop_clock_scale"]) * 1e6
    out["floor_us"] = out[["hbm_floor_us", "flop_floor_us"]].max(axis=1, skipna=False)
    has = out["floor_us"].notna()
    out["bound"] = np.where(~has, "", np.where(out["hbm_floor_us"] >= out["flop_floor_us"], "memory", "compute"))
    out["experts_pct_of_floor"] = out["floor_us"] / out["experts_us"] * 100
    out["ceilings_file"] = ceil.map(lambda c: _shown_path(c.path) if c else "")
    return out


def _shown_path(p: Path) -> str:
    try:
        return p.resolve().relative_to(REPO_ROOT.resolve()).as_posix()
    except ValueError:
        return p.as_posix()


def ceilings_caption(df: pd.DataFrame, root: str | Path | None = None) -> str:
    """One sentence per GPU of the rows: the ceilings used and their file, or that none was
    measured (the floor columns then stay empty)."""
    parts = []
    for gpu in df["gpu"].dropna().unique() if "gpu" in df else []:
        c = find_ceilings(gpu, root)
        if c is None:
            # the rows' gpu is a run folder's text: escaped (moebench/report/mdsafe.py)
            parts.append(
                f"{md_text(gpu)}: {NO_CEILING} (`benchmarks/ceilings.py` on it writes "
                f"results/ceilings/{gpu_slug(gpu)}/ceilings.json), so its floor columns are empty."
            )
        else:
            parts.append(
                f"Floor with the ceilings measured on {c.gpu} (`{_shown_path(c.path)}`, commit "
                f"{c.commit[:10]}): {c.copy_bytes_per_s / 1e12:.2f} TB/s copy (read + write); "
                f"{c.gemm_flops_per_s['bf16'] / 1e12:.0f} / {c.gemm_flops_per_s['fp8'] / 1e12:.0f} "
                "TFLOP/s bf16 / fp8 GEMMs."
                + (
                    " The GEMM peaks ran at "
                    + " / ".join(f"{c.clock_mhz[k]:.0f}" for k in ("bf16", "fp8") if k in c.clock_mhz)
                    + " MHz; a row with its own median SM clock gets its FLOP floor from the peak scaled to "
                    "that clock (compute-bound rows' % of floor reads the kernel, not the clock)."
                    if c.clock_mhz
                    else " No clock recorded with these peaks: FLOP floors are not scaled to a row's clock."
                )
            )
    if "gpu" not in df or df["gpu"].isna().any():
        parts.append(f"Rows without a `gpu`: {NO_CEILING}, so their floor columns are empty.")
    return " ".join(parts)
