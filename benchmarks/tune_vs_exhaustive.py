"""The halving search against exhaustive search on the same pruned space, then the
vLLM-grid tiles, in one GPU call (issue #21's evidence).

    python benchmarks/tune_vs_exhaustive.py --out DIR [--deadline-s 490] [--layers dsv3,qwen3]

Per layer (deepseek_v3's EP-8 share in fp8_block at 16 and 4096 tokens, qwen3_30b_a3b
bf16 at 256), in one process with one compile pool:

  1. halving     `moebench tune --search halving` (budget 0.15)  -> DIR/<layer>/halving/
  2. exhaustive  the same pruned space, reps and final rung      -> DIR/<layer>/exhaustive/
                 (run after 1: the configs the search compiled are in Triton's cache)
  3. compare     both picks and the heuristic, interleaved, --compare-reps samples
  4. grid        halving over vLLM's 18 batch sizes into DIR/<layer>/grid/ (1's trials
                 are reused), token count by token count until the deadline; before
                 the next layer's step 1

DIR/summary.json and DIR/summary.md hold the numbers; both are rewritten after every
step, so a call cut short still reports what it finished, and the same command with
DIR carried back resumes from the stored trials.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moebench.kernels.triton.config import VLLM_BATCH_SIZES  # noqa: E402 (after sys.path takes this checkout)
from moebench.report.best_per_size import ratio_interval  # noqa: E402 (after sys.path takes this checkout)
from moebench.tune import compile as tcompile  # noqa: E402 (after sys.path takes this checkout)
from moebench.tune import files  # noqa: E402 (after sys.path takes this checkout)
from moebench.tune.search import TuneArgs, resolve, tune  # noqa: E402 (after sys.path takes this checkout)
from moebench.util.arg_errors import OneLineErrors, script_prog  # noqa: E402 (after sys.path takes this checkout)

LAYERS = {
    "dsv3": (["model=deepseek_v3", "backend.simulate_ep=8", "quant=fp8_block"], [16, 4096]),
    "qwen3": (["model=qwen3_30b_a3b", "quant=bf16"], [256]),
}
BASE = ["experts=triton", "backend=local", "runner.device=cuda"]


def _tokens(ts) -> str:
    return f"workload.tokens_per_rank=[{','.join(map(str, ts))}]"


class Clock:
    """Seconds left before the deadline, and rates learnt as the call goes (compile
    core-seconds a kernel, seconds a timed trial) to decide what still fits."""

    def __init__(self, deadline_s: float, workers: int):
        self.t0, self.deadline, self.workers = time.perf_counter(), deadline_s, workers
        self.kernel_s, self.trial_s = 1.5, 0.05  # first guesses (sm_90 compiles, graph replays)

    def left(self) -> float:
        return self.deadline - (time.perf_counter() - self.t0)

    def learn(self, stats, trials: int, timing_s: float) -> None:
        if stats.kernels >= 20:
            self.kernel_s = stats.core_s / stats.kernels
        if trials >= 20:
            self.trial_s = max(0.01, timing_s / trials)

    def estimate(self, kernels: int, trials: int, overhead_s: float = 15.0) -> float:
        return kernels * self.kernel_s / self.workers + trials * self.trial_s + overhead_s


def run_tune(overrides, tokens, out, pool, **kw):
    args = TuneArgs(overrides=BASE + overrides + [_tokens(tokens)], **kw)
    info, pruned, results, stats, wall = tune(args, out, pool=pool)
    path = files.write(
        info, results, out, extra={"wall_s": wall, "compile": asdict(stats), "environment": files.environment()}
    )
    return info, pruned, results, stats, wall, path


def compare(overrides, T: int, picks: dict, reps: int) -> dict:
    """The picks timed interleaved (A B C A B C ...): medians and ratios with intervals."""
    import torch

    from moebench.tune.bench import LayerBench

    c, _ = resolve(BASE + overrides + [_tokens([T])])
    names = [n for n, cfg in picks.items() if cfg is not None]
    unique = []
    for n in names:
        if picks[n] not in unique:
            unique.append(picks[n])
    dev = torch.device("cuda", torch.cuda.current_device()) if c.combo["device"] == "cuda" else torch.device("cpu")
    tb = LayerBench(c, dev).at(T)
    trials = tb.interleaved(unique, reps)
    by = {n: trials[unique.index(picks[n])] for n in names}
    out = {n: {"config": t.config, "us": t.us, "rel_err": t.rel_err, "error": t.error} for n, t in by.items()}
    out["same_pick"] = picks.get("halving") is not None and picks.get("halving") == picks.get("exhaustive")
    for a, b in (("halving", "exhaustive"), ("heuristic", "halving"), ("heuristic", "exhaustive")):
        if a in by and b in by and by[a].ok and by[b].ok:
            lo, hi = ratio_interval(by[b].samples, by[a].samples)
            out[f"{a}/{b}"] = {"ratio": by[a].us / by[b].us, "lo": lo, "hi": hi}
    return out


def evidence(name, a, out, pool, clock, summary, kw, save) -> None:
    """Steps 1-3 for one layer."""
    ovs, ev_tokens = LAYERS[name]
    old = summary.get("previous", {}).get("layers", {}).get(name, {})
    if all(str(T) in old.get("compare", {}) for T in ev_tokens):  # a previous call finished it: keep its wall times
        summary["layers"][name] = {k: v for k, v in old.items() if k != "grid"}
        return
    L = summary["layers"].setdefault(name, {"overrides": BASE + ovs, "evidence_tokens": ev_tokens})
    # 1. the search
    info, pruned, res_h, st_h, wall_h, _ = run_tune(
        ovs, ev_tokens, out / name / "halving", pool, search="halving", **kw
    )
    timed = sum(r.num_timed for r in res_h)
    clock.learn(st_h, timed, max(0.0, wall_h - st_h.wall_s))
    L.update(
        space_size=info["space_size"],
        pruning=info["pruning"],
        halving={"wall_s": wall_h, "compile": asdict(st_h), "per_tokens": _per(res_h, info["space_size"])},
    )
    save()
    # 2. exhaustive on the same space (not skipped unless hopeless: it is the evidence; the
    # grid is what a short call gives up)
    need = clock.estimate(2 * info["space_size"], info["space_size"] * len(ev_tokens))
    L["exhaustive_estimate_s"] = need
    if clock.left() < 0.25 * need:
        summary["skipped"].append(f"{name} exhaustive: needs ~{need:.0f} s, {clock.left():.0f} s left")
        save()
        return
    _, _, res_e, st_e, wall_e, _ = run_tune(ovs, ev_tokens, out / name / "exhaustive", pool, search="exhaustive", **kw)
    clock.learn(st_e, sum(r.num_timed for r in res_e), max(0.0, wall_e - st_e.wall_s))
    L["exhaustive"] = {"wall_s": wall_e, "compile": asdict(st_e), "per_tokens": _per(res_e, info["space_size"])}
    save()
    # 3. the picks side by side
    L["compare"] = {}
    for T in ev_tokens:
        h, e = _pick(res_h, T), _pick(res_e, T)
        heur = h.baselines["heuristic"].config if h and h.baselines.get("heuristic") else None
        L["compare"][str(T)] = compare(
            ovs,
            T,
            {"halving": h.best if h else None, "exhaustive": e.best if e else None, "heuristic": heur},
            a.compare_reps,
        )
        save()


def grid(name, out, pool, clock, summary, kw, grid_tokens, save) -> None:
    """Step 4 for one layer: the halving search over the grid, until the deadline."""
    ovs, ev_tokens = LAYERS[name]
    L = summary["layers"].get(name)
    old = summary.get("previous", {}).get("layers", {}).get(name, {}).get("grid")
    if L and old and set(grid_tokens) <= set(old["tokens"]):  # a previous call finished it
        L["grid"] = old
        return
    if not L or "space_size" not in L or clock.left() < 30:
        summary["skipped"].append(f"{name} grid: {clock.left():.0f} s left")
        return
    g = out / name / "grid"
    g.mkdir(parents=True, exist_ok=True)
    if not (g / "trials.jsonl").exists():
        shutil.copy(out / name / "halving" / "trials.jsonl", g / "trials.jsonl")
    order = list(ev_tokens) + [T for T in grid_tokens if T not in ev_tokens]
    info, _, res, st, wall, path = run_tune(
        ovs, order, g, pool, search="halving", stop_at=time.monotonic() + clock.left(), **kw
    )
    done = sorted(r.tokens for r in res)
    L["grid"] = {
        "tokens": done,
        "file": str(path),
        "covers_grid": set(VLLM_BATCH_SIZES) <= set(done),
        "wall_s": wall,
        "compile": asdict(st),
        "per_tokens": _per(sorted(res, key=lambda r: r.tokens), L["space_size"]),
    }
    if set(grid_tokens) - set(done):
        summary["skipped"].append(f"{name} grid: {sorted(set(grid_tokens) - set(done))} not reached")
    save()


def _pick(results, T):
    for r in results:
        if r.tokens == T:
            return r
    return None


def main(argv=None) -> int:
    p = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", default="dsv3,qwen3")
    p.add_argument("--deadline-s", type=float, default=490.0, help="stop starting work after this many seconds")
    p.add_argument("--reps", type=int, default=5, help="samples per screened config (both searches)")
    p.add_argument("--final-reps", type=int, default=20)
    p.add_argument("--compare-reps", type=int, default=30)
    p.add_argument("--budget", type=float, default=0.15)
    p.add_argument("--workers", type=int, default=0, help="compile processes (0: all cores)")
    p.add_argument("--grid", default=",".join(map(str, VLLM_BATCH_SIZES)), help="token counts of the files (step 4)")
    p.add_argument(
        "--smoke", action="store_true", help="the tiny model on the CPU interpreter, small space (a dry run)"
    )
    a = p.parse_args(argv)
    if a.smoke:  # every step on a layer the interpreter runs in seconds
        LAYERS.clear()
        LAYERS["tiny"] = (["model=tiny", "quant=bf16", "runner.device=cpu"], [4])
        BASE[:] = ["experts=triton", "backend=local"]
        a.layers, kw_space = "tiny", {"space": "small", "workers": 0}
    else:
        kw_space = {}
    grid_tokens = [int(t) for t in a.grid.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    workers = a.workers or tcompile.default_workers(0)
    pool = tcompile.Pool(workers) if not a.smoke else None
    clock = Clock(a.deadline_s, workers)
    summary = {
        "deadline_s": a.deadline_s,
        "reps": a.reps,
        "final_reps": a.final_reps,
        "budget": a.budget,
        "compile_workers": workers,
        "environment": files.environment(),
        "layers": {},
        "skipped": [],
    }
    kw = dict(reps=a.reps, final_reps=a.final_reps, budget=a.budget, **kw_space)
    if (out / "summary.json").exists():  # a previous call's, carried back to resume
        prev = json.loads((out / "summary.json").read_text())
        n = len(list(out.glob("summary-call*.json"))) + 1
        (out / f"summary-call{n}.json").write_text(json.dumps(prev, indent=2) + "\n")
        summary["previous"] = {"layers": prev.get("layers", {}), "elapsed_s": prev.get("elapsed_s")}

    def save():
        summary["elapsed_s"] = time.perf_counter() - clock.t0
        keep = {k: v for k, v in summary.items() if k != "previous"}
        (out / "summary.json").write_text(json.dumps(keep, indent=2, default=str) + "\n")
        (out / "summary.md").write_text(markdown(summary) + "\n")

    try:
        for name in a.layers.split(","):  # a layer's grid right after its evidence: the cheap one finishes first
            for step, fn in (
                ("evidence", functools.partial(evidence, name, a, out, pool, clock, summary, kw, save)),
                ("grid", functools.partial(grid, name, out, pool, clock, summary, kw, grid_tokens, save)),
            ):
                try:
                    fn()
                except KeyboardInterrupt:
                    raise
                except Exception as e:  # noqa: BLE001 (any failure is recorded in the summary; the next step still runs)
                    summary.setdefault("errors", []).append(f"{name} {step}: {type(e).__name__}: {e}")
                    traceback.print_exc()
                    save()
    except KeyboardInterrupt:
        summary["skipped"].append("interrupted (the call's time limit): the trials so far are stored")
    finally:
        save()
        if pool is not None:
            pool.close()
    print(markdown(summary))
    return 0


def _per(results, space_size) -> dict:
    out = {}
    for r in results:
        h = r.baselines.get("heuristic")
        out[str(r.tokens)] = {
            "timed": r.num_timed,
            "space": space_size,
            "fraction": r.num_timed / space_size,
            "budget": r.budget,
            "best": r.best,
            "best_us": r.best_us,
            "heuristic_us": h.us if h is not None else None,
            "speedup_vs_heuristic": r.speedup("heuristic"),
            "wall_s": r.wall_s,
            "rungs": r.rungs,
            "errors": r.errors,
            "recheck_rel_err": r.recheck_rel_err,
        }
    return out


def _f(v, fmt="{:.1f}") -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def markdown(s: dict) -> str:
    lines = [
        f"# halving vs exhaustive (screen reps {s['reps']}, final {s['final_reps']}, budget {s['budget']}, "
        f"{s['compile_workers']} compile workers; {_f(s.get('elapsed_s'), '{:.0f}')} s)",
        "",
    ]
    for name, L in s["layers"].items():
        lines.append(f"## {name}: {' '.join(L['overrides'])}")
        lines.append(f"pruned space: {L.get('pruning', '?')}")
        for mode in ("halving", "exhaustive"):
            if mode in L:
                c = L[mode]["compile"]
                lines.append(
                    f"- {mode}: {L[mode]['wall_s']:.0f} s wall, {c['kernels']} kernels compiled "
                    f"({c['core_s']:.0f} core-s, {c['wall_s']:.0f} s), cache hits {c['hits']}, misses {c['misses']}"
                )
        lines.append("")
        lines.append(
            "| tokens | halving timed | exhaustive timed | halving / exhaustive [95 % CI] | heuristic / halving |"
        )
        lines.append("|---:|---:|---:|---|---|")
        for T in L.get("evidence_tokens", []):
            h = L.get("halving", {}).get("per_tokens", {}).get(str(T), {})
            e = L.get("exhaustive", {}).get("per_tokens", {}).get(str(T), {})
            c = L.get("compare", {}).get(str(T), {})
            he, hh = c.get("halving/exhaustive"), c.get("heuristic/halving")
            same = " (same config)" if c.get("same_pick") else ""
            lines.append(
                f"| {T} | {h.get('timed', '–')} ({_f(h.get('fraction'), '{:.1%}')}) | {e.get('timed', '–')} | "
                + (f"{he['ratio']:.3f} [{_f(he['lo'], '{:.3f}')}, {_f(he['hi'], '{:.3f}')}]{same}" if he else "–")
                + " | "
                + (f"{hh['ratio']:.3f} [{_f(hh['lo'], '{:.3f}')}, {_f(hh['hi'], '{:.3f}')}]" if hh else "–")
                + " |"
            )
        g = L.get("grid")
        if g:
            lines += [
                "",
                f"grid: {len(g['tokens'])} sizes{' (covers vLLM grid)' if g['covers_grid'] else ''}: {g['file']}",
                "",
                "| tokens | timed | best µs | heuristic µs | speed-up |",
                "|---:|---:|---:|---:|---:|",
            ]
            for T, r in g["per_tokens"].items():
                lines.append(
                    f"| {T} | {r['timed']} | {_f(r['best_us'])} | {_f(r['heuristic_us'])} | "
                    f"{_f(r['speedup_vs_heuristic'], '{:.2f}x')} |"
                )
        lines.append("")
    if s["skipped"]:
        lines += ["skipped:"] + [f"- {x}" for x in s["skipped"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
