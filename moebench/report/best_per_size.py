"""`moebench tune --results RUN`: the fastest valid combination per model x tokens per
rank of a results run, its margin over the runner-up with an interval. Only rows whose
latency is GPU time compete (report/time_basis.py figure_basis): host-time rows (the host paced
the samples) and CPU rows are left out, and the command says how many. A competing row some of
whose samples the host paced (up to moebench.config.limits.HOST_PACED_MAX of them) is marked
with the count (`‡ 5/30`) wherever it stands as best or runner-up, and the command names them.

Competing: every `ok` combination (backend, experts, reduction, overlap, quant, the shared
experts' SM carveout and every knob of the entries, kernels/knobs.py) that saw the same
workload (the columns results/row.py gives the WORKLOAD role: model, world size, simulate_ep
and simulate_rank, the routing and its parameters, seed; the report's bold cell uses the same)
and the token count. `ok` rows passed the reference check, a quantized one included: it
competes with bf16. The margin is runner-up median / best median; its 95 % interval a
bootstrap of that ratio of medians, resampling each row's `samples_us` (2,000 draws, seeded).
The table's `CI > 1` says the interval's low end is above 1 (the runner-up is slower beyond
the resampling's chance): another test than the report's "fastest" (report/summary.py wins),
which asks the two rows' p20–p80 intervals to be apart (usually stricter), so a row may pass
here and read "no clear fastest" there; the table's key says so. Rows are told apart by
`combo_key`; a combination stored twice at one size counts once (load_run keeps the last
written).

Writes <out>/best_per_size.json and <out>/best_per_size.png (default out: <RUN>/report, or for
a run committed under results/ `runs/reports/<its path>/report`, as `moebench report` does).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from moebench.report.columns import AXES, WORKLOAD_COLUMNS, combination, knobs_of, label, records
from moebench.results.row import Status
from moebench.util.words import counted

# what must match for two rows to compete: the workload (results/row.py's WORKLOAD role, the
# report's bold cell's too); what competes: columns.AXES, the axes that are no workload (quant among them)
SETTING = list(WORKLOAD_COLUMNS)
DRAWS = 2000


def ratio_interval(best_us, runner_us, draws: int = DRAWS, seed: int = 0, conf: float = 0.95) -> tuple[float, float]:
    """Bootstrap interval of median(runner) / median(best) (NaN, NaN without samples)."""
    a, b = np.asarray(best_us, dtype=float), np.asarray(runner_us, dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) < 2 or len(b) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ma = np.median(rng.choice(a, size=(draws, len(a))), axis=1)
    mb = np.median(rng.choice(b, size=(draws, len(b))), axis=1)
    r = mb / ma
    lo, hi = np.quantile(r, [(1 - conf) / 2, 1 - (1 - conf) / 2])
    return float(lo), float(hi)


def best_per_size(df: pd.DataFrame) -> pd.DataFrame:
    """One row per setting x tokens_per_rank: the best ok combination, its median (µs),
    the runner-up's, the margin with its interval, and how many competed."""
    from moebench.report.flags import paced_mark
    from moebench.report.time_basis import GPU, figure_basis, gpu_time_advice

    ok = df[df["status"] == Status.OK]
    ok = ok[np.isfinite(ok["latency_us_median"].astype(float))]
    if ok.empty:
        raise ValueError("no ok rows in this run: nothing to rank (run `moebench report RUN` for the failures)")
    rs = records(ok)
    basis = [figure_basis(r) for r in rs]
    left_out = [why for b, why in basis if b != GPU]
    advice = [gpu_time_advice(r) for r, (b, _) in zip(rs, basis, strict=True) if b != GPU]
    ok = ok[[b == GPU for b, _ in basis]]
    if ok.empty:
        # the report's wording (time_basis.GPU_TIME_ADVICE) of what would give GPU time
        raise ValueError(f"no ok row of this run is GPU time ({basis[0][1]}): nothing to rank; {advice[0]}")
    setting = [c for c in SETTING if c in ok.columns]
    rows = []
    for key, g in ok.groupby(setting + ["tokens_per_rank"], sort=True, dropna=False):
        g = g.sort_values(["latency_us_median", "combo_key"], kind="stable")
        first = g.iloc[0]
        row = dict(zip(setting + ["tokens_per_rank"], key, strict=True))
        row.update({k: first[k] for k in AXES})
        row["knobs"] = knobs_of(first)
        row["combination"] = combination(first)
        row["combo_key"] = first["combo_key"]
        row["best_us"] = float(first["latency_us_median"])
        row["best_paced"] = paced_mark(first)  # '‡ 5/30': host-paced latency samples ('' for none)
        row["candidates"] = len(g)
        row["runner_up_paced"] = ""
        if len(g) > 1:
            second = g.iloc[1]
            row["runner_up"] = combination(second)
            row["runner_up_us"] = float(second["latency_us_median"])
            row["runner_up_paced"] = paced_mark(second)
            row["margin"] = row["runner_up_us"] / row["best_us"]
            lo, hi = ratio_interval(_samples(first), _samples(second))
            row["margin_lo"], row["margin_hi"] = lo, hi
        else:
            row.update(
                runner_up="",
                runner_up_us=float("nan"),
                margin=float("nan"),
                margin_lo=float("nan"),
                margin_hi=float("nan"),
            )
        row["clear_win"] = bool(row["margin_lo"] > 1.0) if math.isfinite(row["margin_lo"]) else False
        rows.append(row)
    best = pd.DataFrame(rows)
    best.attrs["left_out"] = left_out  # why each ok row that did not compete was left out
    best.attrs["advice"] = advice  # and what would give it GPU time (time_basis.gpu_time_advice)
    return best


def _samples(row) -> list:
    s = row.get("samples_us")
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return []
    return [float(v) for v in s]


def _setting_label(r, vary: list[str]) -> str:
    return " ".join([str(r["model"]), *(f"{label(c)}={r[c]}" for c in vary if c != "model")])


def table(best: pd.DataFrame) -> str:
    """Markdown, one row per setting x tokens; the rows' text escaped (moebench/report/mdsafe.py md_text)."""
    from moebench.report.mdsafe import md_text

    vary = [c for c in SETTING if c in best.columns and best[c].astype(str).nunique() > 1]
    lines = [
        "| setting | tokens | best | µs | runner-up | µs | margin [95 % CI] | CI > 1 | n |",
        "|---|---:|---|---:|---|---:|---|:-:|---:|",
    ]
    for _, r in best.iterrows():
        m = (
            "–"
            if not math.isfinite(r["margin"])
            else (
                f"{r['margin']:.3f}"
                + (f" [{r['margin_lo']:.3f}, {r['margin_hi']:.3f}]" if math.isfinite(r["margin_lo"]) else "")
            )
        )
        ru = f"{r['runner_up_us']:.1f}" if math.isfinite(r["runner_up_us"]) else "–"
        bu = f"{r['best_us']:.1f}" + (f" {r['best_paced']}" if r.get("best_paced") else "")
        ru += f" {r['runner_up_paced']}" if r.get("runner_up_paced") else ""
        lines.append(
            f"| {md_text(_setting_label(r, vary))} | {int(r['tokens_per_rank'])} | {md_text(r['combination'])} | "
            f"{bu} | {md_text(r['runner_up']) if r['runner_up'] else '–'} | {ru} | {m} | "
            f"{'yes' if r['clear_win'] else 'no'} | {int(r['candidates'])} |"
        )
    return "\n".join([*lines, "", KEY])


# names the test under the table: `moebench report`'s "fastest" is another (module doc)
KEY = (
    "margin = runner-up median / best median; CI > 1: its 95 % bootstrap interval lies above 1. "
    "`moebench report` calls a fastest only where the two rows' p20–p80 intervals are apart (another "
    'test, usually stricter): a row may pass here and read "no clear fastest" there.'
)


def paced_lines(best: pd.DataFrame) -> list[str]:
    """A line naming the best and runner-up rows with host-paced latency samples, with their counts
    ([] for none): they compete as GPU time, but never silently."""
    hits = [
        f"{r[who]} at {int(r['tokens_per_rank'])} tokens ({r[f'{mark}_paced'].removeprefix('‡ ')})"
        for _, r in best.iterrows()
        for who, mark in (("combination", "best"), ("runner_up", "runner_up"))
        if r.get(f"{mark}_paced")
    ]
    if not hits:
        return []
    return [
        f"‡ host-paced latency samples (paced/samples; the GPU started them before the host had enqueued "
        f"them): {'; '.join(hits)}: ranked as GPU time, their medians may hold host launch gaps"
    ]


def cell_text(r) -> str:
    """A heatmap cell: the winner one choice a line (knobs wrapped), its margin and interval to
    3 decimals (a clear win may sit at [1.001, 1.006], which 2 decimals print as [1.00, 1.01])."""
    import textwrap

    name = [f"{r['backend']}/{r['experts']}", f"red={r['reduction']} ovl={r['overlap']}", str(r["quant"])]
    name += textwrap.wrap(str(r["knobs"]), 24) if r["knobs"] else []
    margin = f"×{r['margin']:.3f}" if math.isfinite(r["margin"]) else "alone"
    ci = [f"[{r['margin_lo']:.3f}, {r['margin_hi']:.3f}]"] if math.isfinite(r["margin_lo"]) else []
    return "\n".join([*name, margin, *ci])


def heatmap(best: pd.DataFrame, path: Path) -> Optional[Path]:
    """Settings x tokens; colour: the margin; each cell: the winner, its margin and interval."""
    from matplotlib.figure import Figure

    from moebench.util.pngfile import save_figure

    vary = [c for c in SETTING if c in best.columns and best[c].astype(str).nunique() > 1]
    best = best.assign(setting=[_setting_label(r, vary) for _, r in best.iterrows()])
    settings = list(dict.fromkeys(best["setting"]))
    tokens = sorted({int(t) for t in best["tokens_per_rank"]})
    grid = np.full((len(settings), len(tokens)), np.nan)
    cells = []
    for _, r in best.iterrows():
        i, j = settings.index(r["setting"]), tokens.index(int(r["tokens_per_rank"]))
        grid[i, j] = r["margin"] if math.isfinite(r["margin"]) else 1.0
        cells.append((j, i, cell_text(r), r["clear_win"], grid[i, j]))
    # each cell as wide as its longest line and as tall as its lines (7 pt: ~0.065 in a character, 0.17 a line)
    chars = max(len(line) for _, _, txt, _, _ in cells for line in txt.splitlines())
    lines = max(txt.count("\n") + 1 for _, _, txt, _, _ in cells)
    fig = Figure(
        figsize=(max(6.0, max(1.6, 0.065 * chars) * len(tokens) + 3.0), max(2.5, 0.17 * lines * len(settings) + 1.2))
    )
    ax = fig.add_subplot(1, 1, 1)
    vmax = max(1.2, float(np.nanmax(grid)) if np.isfinite(grid).any() else 1.2)
    im = ax.imshow(grid, cmap="Greens", vmin=1.0, vmax=vmax, aspect="auto")
    dark = 1.0 + 0.6 * (vmax - 1.0)
    for j, i, txt, clear, v in cells:
        ax.text(
            j,
            i,
            txt,
            ha="center",
            va="center",
            fontsize=7,
            fontweight="bold" if clear else "normal",
            color="white" if v > dark else "black",
        )
    ax.set_xticks(range(len(tokens)), [str(t) for t in tokens])
    ax.set_yticks(range(len(settings)), settings)
    ax.set_xlabel("tokens per rank")
    ax.set_title("best combination per size: margin = runner-up / best median (bold: 95 % CI above 1)", fontsize=10)
    fig.colorbar(im, ax=ax, label="margin over the runner-up")
    return save_figure(fig, path, bbox_inches="tight")


def results_command(run: str, out: Optional[str]) -> int:
    from moebench.report.document import report_out
    from moebench.report.load import load_run
    from moebench.util.safe_write import refuse_links, write_text

    df, _ = load_run(run)
    best = best_per_size(df)
    out_dir = report_out(run, out)  # no link below the run folder or --out (moebench/util/safe_write.py)
    refuse_links(out_dir, ["best_per_size.json", "best_per_size.png"])  # before anything is written
    records = json.loads(best.to_json(orient="records"))
    write_text(
        out_dir / "best_per_size.json", json.dumps({"run": str(run), "draws": DRAWS, "rows": records}, indent=2) + "\n"
    )
    png = heatmap(best, out_dir / "best_per_size.png")
    print(table(best))
    for line in paced_lines(best):
        print(f"\n{line}")
    if best.attrs.get("left_out"):
        why = best.attrs["left_out"]
        tip = f"; {best.attrs['advice'][0]}" if best.attrs.get("advice") else ""
        print(f"\nnot ranked: {counted(len(why), 'ok row')} whose latency is no GPU time ({why[0]}){tip}")
    print(f"\n{out_dir / 'best_per_size.json'}, {png}")
    return 0
