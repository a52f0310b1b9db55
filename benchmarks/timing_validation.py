"""Does the default figure time the GPU? Reads a run of sweeps/timing_validation.yaml (the same
layers under forced runner.timing=events, forced graph and auto) and prints, per combination and
size, events ÷ graph, with the criteria of docs/findings/timing.md:

- events ÷ graph in [0.99, 1.10] wherever the layer captures (both ok): held eager forwards
  read the GPU's time, which a graph replay minus its launch gaps bounds from below;
- auto orders triton and deepgemm as the graph rows do wherever the graph rows differ by more
  than 3 %.

    python benchmarks/timing_validation.py RUN [--markdown] [--default-sweeps AUTO_RUN EVENTS_RUN]

--default-sweeps pairs two runs of the README's `moebench sweep` (the default timing, then
`runner.timing=events`) row by row and adds their events ÷ auto (graph) ratios. Exit status 1
when a criterion fails, so the figures in the findings are the script's, not a hand's.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from moebench.report.load import latest_rows, load_run
from moebench.util.arg_errors import OneLineErrors, script_prog

LO, HI = 0.99, 1.10
ORDER_GAP = 1.03
WHAT = ["model", "simulate_ep", "experts", "quant", "reduction", "overlap", "tokens_per_rank"]


def by_timing(df: pd.DataFrame) -> pd.DataFrame:
    """One row per layer and size, a column per requested timing: median µs, the mode that ran."""
    ok = latest_rows(df)
    ok = ok[ok["status"] == "ok"]
    what = [c for c in WHAT if c in ok.columns]
    med = ok.pivot_table(index=what, columns="timing", values="latency_us_median", aggfunc="first")
    mode = ok.pivot_table(index=what, columns="timing", values="timing_mode", aggfunc="first")
    out = med.add_suffix("_us").join(mode.add_suffix("_mode"))
    if {"events_us", "graph_us"} <= set(out.columns):
        out["events_over_graph"] = out["events_us"] / out["graph_us"]
    return out.reset_index()


def ratio_failures(t: pd.DataFrame) -> list[str]:
    """Rows whose events ÷ graph lies outside [LO, HI] (both timed as asked)."""
    bad = []
    for _, r in t.iterrows():
        x = r.get("events_over_graph")
        if r.get("graph_mode") == "graph" and r.get("events_mode") == "events" and np.isfinite(x) and not LO <= x <= HI:
            bad.append(f"{r['model']} {r['experts']} {r['quant']} {int(r['tokens_per_rank'])}: events ÷ graph {x:.3f}")
    return bad


def order_failures(t: pd.DataFrame) -> tuple[list[str], int]:
    """(failures, pairs checked): sizes where graph rows of triton and deepgemm differ by more than
    ORDER_GAP and auto's rows order them the other way."""
    bad, checked = [], 0
    keys = [c for c in ("model", "simulate_ep", "quant", "reduction", "overlap", "tokens_per_rank") if c in t.columns]
    for k, g in t.groupby(keys):
        g = g.set_index("experts")
        if not {"triton", "deepgemm"} <= set(g.index):
            continue
        gt, gd = g.loc["triton", "graph_us"], g.loc["deepgemm", "graph_us"]
        if not (np.isfinite(gt) and np.isfinite(gd)) or max(gt, gd) / min(gt, gd) <= ORDER_GAP:
            continue
        checked += 1
        at, ad = g.loc["triton", "auto_us"], g.loc["deepgemm", "auto_us"]
        if (gt < gd) != (at < ad):
            bad.append(
                f"{dict(zip(keys, k, strict=True))}: graph triton {gt:.1f} vs deepgemm {gd:.1f}, "
                f"auto {at:.1f} vs {ad:.1f}"
            )
    return bad, checked


def default_pairs(auto_run: str, events_run: str) -> pd.DataFrame:
    """The default sweep under auto against the same sweep with runner.timing=events, matched on
    everything but the timing: events ÷ auto per row, with the modes that ran."""
    a, _ = load_run(auto_run)
    e, _ = load_run(events_run)
    what = [
        c
        for c in ("backend", "experts", "reduction", "overlap", "quant", "model", "simulate_ep", "tokens_per_rank")
        if c in a.columns
    ]
    a, e = latest_rows(a), latest_rows(e)
    a, e = a[a["status"] == "ok"], e[e["status"] == "ok"]
    m = a[what + ["latency_us_median", "timing_mode"]].merge(
        e[what + ["latency_us_median", "timing_mode"]], on=what, suffixes=("_auto", "_events")
    )
    m["events_over_auto"] = m["latency_us_median_events"] / m["latency_us_median_auto"]
    return m


def markdown(t: pd.DataFrame) -> str:
    lines = [
        "| model | experts | quant | tokens | events µs | graph µs | events ÷ graph | auto µs (mode) |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for _, r in t.sort_values(["model", "quant", "experts", "tokens_per_rank"]).iterrows():
        f = lambda v: f"{v:.1f}" if np.isfinite(v) else "–"
        lines.append(
            f"| {r['model']} | {r['experts']} | {r['quant']} | {int(r['tokens_per_rank'])} | "
            f"{f(r.get('events_us', np.nan))} | {f(r.get('graph_us', np.nan))} | "
            f"{r.get('events_over_graph', np.nan):.3f} | {f(r.get('auto_us', np.nan))} ({r.get('auto_mode', '')}) |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--default-sweeps", nargs=2, metavar=("AUTO_RUN", "EVENTS_RUN"))
    args = ap.parse_args(argv)
    df, _ = load_run(args.run)
    t = by_timing(df)
    if args.markdown:
        print(markdown(t))
    else:
        with pd.option_context("display.width", 200, "display.max_rows", 500):
            print(t.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    bad = ratio_failures(t)
    order_bad, checked = order_failures(t)
    r = t["events_over_graph"].dropna() if "events_over_graph" in t else pd.Series(dtype=float)
    print(
        f"\nevents ÷ graph over {len(r)} layer x size: {r.min():.3f} … {r.max():.3f} "
        f"(criterion [{LO}, {HI}]); {len(bad)} outside"
    )
    print(
        f"auto orders triton and deepgemm as graph rows do: {checked - len(order_bad)} of {checked} sizes "
        f"where the graph rows differ by > {ORDER_GAP - 1:.0%}"
    )
    for line in bad + order_bad:
        print("  FAIL " + line)
    if args.default_sweeps:
        m = default_pairs(*args.default_sweeps)
        graph = m[m["timing_mode_auto"] == "graph"]
        x = graph["events_over_auto"]
        out = graph[(x < LO) | (x > HI)]
        print(
            f"\ndefault sweep, events ÷ auto over {len(graph)} rows auto timed by graph replays: "
            f"{x.min():.3f} … {x.max():.3f}; {len(out)} outside [{LO}, {HI}]"
        )
        for _, o in out.iterrows():
            print(
                f"  FAIL {o['backend']}/{o['experts']}/{o['reduction']}/{o['overlap']}/{o['quant']} "
                f"{int(o['tokens_per_rank'])}: {o['events_over_auto']:.3f}"
            )
        bad += [str(i) for i in out.index]
    return 1 if bad or order_bad else 0


if __name__ == "__main__":
    sys.exit(main())
