"""`moebench tune`: tile configs for the `triton` experts' gathered GEMMs, per token count.

For each token count of the grid (default vLLM's 18 batch sizes, 1 ... 4096) the search
(strategy.py: successive halving inside a budget, or exhaustive) picks configs of the
pruned space (space.py); each is compiled in a CPU pool (compile.py), checked against
the float32 reference and timed (bench.py); every trial is stored as it finishes
(trials.py), so an interrupted tune resumes. With several GPUs visible, one process a
GPU takes a share of the token counts. The baselines (what the harness runs today, and
the heuristic) compete, so tuning never makes a size slower. files.py writes the result.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from moebench.kernels.experts.triton import CONTIGUOUS_QUANTS
from moebench.kernels.triton.common import interpreting
from moebench.kernels.triton.config import VLLM_BATCH_SIZES, config_block_shape, config_dtype
from moebench.run import plan as planmod
from moebench.tune import compile as tcompile
from moebench.tune import files as tfiles
from moebench.tune import strategy
from moebench.tune.bench import baselines_of, dims_of, rows_of
from moebench.tune.host_words import host_line
from moebench.tune.measurer import Measurer, group_key
from moebench.tune.progress import Calls, Progress, plan_line
from moebench.tune.space import SPACES, config_key, prune, shared_limit_of
from moebench.tune.trials import Trial, TrialStore, open_store, trial_env
from moebench.util.words import latency

TOKENS_KEY = "workload.tokens_per_rank"


@dataclass
class TuneArgs:
    """What `moebench tune` searches and how (the CLI's options)."""

    overrides: list
    space: str = "vllm"
    search: str = "halving"
    budget: float = 0.15  # halving: fraction of the pruned space timed (baselines included)
    reps: int = 10  # samples per timed config
    final_reps: int = 0  # samples of each finalist, interleaved (0: 3 x reps)
    finalists: int = 3
    workers: Optional[int] = None  # compile processes per GPU (None: the cores less one; 0: no pool)
    gpus: Optional[int] = None  # GPUs used (None: every visible one)
    resume: bool = True
    stop_at: Optional[float] = None  # time.monotonic() after which no further token count starts

    def __post_init__(self):
        if self.space not in SPACES:
            raise ValueError(f"--space {self.space!r}; valid: {', '.join(SPACES)}")
        if self.search not in strategy.STRATEGIES:
            raise ValueError(f"--search {self.search!r}; valid: {', '.join(strategy.STRATEGIES)}")
        if self.reps < 1:
            raise ValueError("--reps must be >= 1")
        strategy.budget_of(self.budget, 1)  # validates the fraction
        self.final_reps = self.final_reps or 3 * self.reps


@dataclass
class TokenResult:
    """One token count's outcome: µs are the experts phase's median."""

    @property
    def key(self) -> int:
        """The table entry's token count: the rows the experts see."""
        return self.rows or self.tokens

    tokens: int
    best: Optional[dict]
    best_us: float  # the winner's screening median (the baselines' are comparable)
    final: list = field(default_factory=list)  # finalists' interleaved trials
    baselines: dict = field(default_factory=dict)  # name -> Trial
    num_timed: int = 0  # distinct configs screened, baselines included
    space_timed: int = 0  # of them, configs of the pruned space
    outside: list = field(default_factory=list)  # the baselines outside the space, one a config ('current = heuristic')
    budget: int = 0
    rungs: list = field(default_factory=list)
    recheck_rel_err: float = float("nan")  # the winner on a second input
    rows: int = 0  # rows entering the experts (simulate_rank: M); 0: tokens
    wall_s: float = float("nan")
    errors: dict = field(default_factory=dict)  # error kind -> count

    def speedup(self, name: str = "heuristic") -> float:
        b = self.baselines.get(name)
        return b.us / self.best_us if b is not None and b.ok and self.best_us > 0 else float("nan")


def resolve(overrides: list[str]):
    """(plan.Combination, token counts) of the one layer being tuned."""
    ovs = list(overrides) + ["overlap=none", "reduction=experts"]
    if not any(o.startswith(TOKENS_KEY + "=") for o in overrides):
        ovs.append(f"{TOKENS_KEY}=[{','.join(map(str, VLLM_BATCH_SIZES))}]")
    c = _one_layer(ovs)
    # the configs tuned here are the gathered kernel's: bf16 and fp8_block must not switch to
    # the contiguous layout at large token counts (experts.row_layout=auto)
    if c.combo["quant"] in CONTIGUOUS_QUANTS and c.combo.get("row_layout", "auto") == "auto":
        c = _one_layer(ovs + ["experts.row_layout=gathered"])
    tokens = c.runnable_tokens
    if not tokens:
        raise ValueError(f"no token count of {c.tokens} can run: {c.token_reasons}")
    return c, tokens


def _one_layer(overrides: list[str]):
    combos, _ = planmod.plan(overrides, None)
    if len(combos) != 1:
        raise ValueError(f"`moebench tune` takes one combination; these overrides give {len(combos)}")
    c = combos[0]
    if c.combo["experts"] != "triton" or c.combo["backend"] not in ("local",):
        raise ValueError(
            "moebench tune searches the Triton experts' tiles on one GPU: use experts=triton backend=local "
            "(backend.simulate_ep=N for an EP-N rank's share)"
        )
    if c.combo.get("row_layout", "auto") == "contiguous":
        raise ValueError(
            "experts.row_layout=contiguous runs kernels/triton/contiguous_gemm.py, whose tile is fixed "
            "(DEFAULT_CONFIG, BF16_CONFIG): "
            "`moebench tune` searches the gathered kernel's tiles (moebench/kernels/configs/)"
        )
    if c.reason:
        raise ValueError(f"this combination cannot run here: {c.reason}")
    return c


def bm_prior(topk: int, num_experts: int, T: int) -> Callable[[tuple], float]:
    """Rung 0's order of tiles when it cannot afford them all: BLOCK_SIZE_M nearest the
    mean rows an expert gets (T * P / E, E all the model's experts: a rank's share of the
    pairs over its share of the experts), then 128-wide N and K tiles."""
    rows = max(1.0, T * topk / max(1, num_experts))
    target = min(128, max(16, 2 ** round(math.log2(rows))))
    return lambda t: abs(math.log2(t[0] / target)) + 0.25 * (abs(math.log2(t[1] / 128)) + abs(math.log2(t[2] / 128)))


def run_tokens(
    c,
    tokens: list[int],
    args: TuneArgs,
    store: TrialStore,
    device: torch.device,
    log: Callable[[str], None],
    pool: Optional[tcompile.Pool] = None,
    position: int = 0,
    replay: bool = False,
):
    """Tune `tokens` on `device` (replay: only read the store, as the GPU workers left it;
    `device` then only gives the shared-memory limit): (Pruned, [TokenResult], Stats)."""
    from moebench.tune.bench import LayerBench

    dims = dims_of(c.combo)
    pruned = prune(args.space, dims, shared_limit_of(device))
    if not pruned.kept:
        raise ValueError(f"--space {args.space}: no config is left after pruning ({pruned.summary()})")
    layer = None if replay else LayerBench(c, device)
    target = tcompile.current_target() if layer is not None and device.type == "cuda" else None
    stats = tcompile.Stats()
    size = len(pruned.kept)
    from moebench.measure.layer import layer_shape

    # the rows entering the experts (simulate_rank: the emulated rank's M) key the table and the look-ups
    rows = {T: rows_of(c.combo, layer_shape(c.combo), T) for T in tokens}
    if any(rows[T] != T for T in tokens):
        log(
            "tune: backend.simulate_rank: the experts see "
            + ", ".join(f"{rows[T]} rows at {T}" for T in tokens)
            + " tokens per rank; the table's entries are keyed by those rows"
        )
    bases = {T: baselines_of(dims, c.combo["quant"], rows[T]) for T in tokens}
    nbase = {T: len({config_key(b) for b in bases[T].values()}) for T in tokens}
    budgets = {
        T: strategy.budget_of(args.budget, size, nbase[T]) if args.search == "halving" else size + nbase[T]
        for T in tokens
    }
    calls = Calls(layer.warmup if layer is not None else 1, args.reps, args.final_reps, args.finalists)
    stored = {T: stored_counts(store, c.key, T, args) for T in tokens}  # a resume's: read back, not timed
    credit = {T: calls.reused(budgets[T], *stored[T]) for T in tokens}
    reused = (sum(map(sum, stored.values())), sum(credit.values()))
    if not replay:
        log(plan_line(c.combo["model"], dims, tokens, args.space, size, budgets, calls, reused))
    bar = Progress(
        sum(calls.count(b) for b in budgets.values()) - reused[1],
        f"tune {c.combo['model']}",
        position,
        disable=replay,
        log=log,
        compiles=target is not None,
    )
    log = bar.say  # the lines under the bar, not through it
    if layer is not None:
        layer.tick = bar.tick
    timing_mode = None
    results: list[TokenResult] = []
    try:
        for T in tokens:
            t0 = time.perf_counter()
            if args.stop_at is not None and results:
                per_t = results[-1].wall_s  # the last token count's time (the first ones may be stored)
                if time.monotonic() + per_t > args.stop_at:
                    log(f"tune: the deadline stops it before {T} tokens (about {per_t:.0f} s a token count)")
                    break
            tb = layer.at(T) if layer is not None else None
            timing_mode = tb.timing if tb is not None else _stored_timing(store, c.key, T)
            m = Measurer(
                tb, store, c.key, T, args, timing_mode, pool if target else None, target, stats, bar, log, calls
            )
            with bar.work(calls.count(budgets[T]), credit=credit[T]):  # the count's calls, as made
                res = _search_count(m, layer, T, rows[T], bases[T], budgets[T], pruned, args, dims, c, log)
            res.wall_s = time.perf_counter() - t0
            results.append(res)
            b = f"{latency(res.best_us)}, {res.speedup():.2f}x the heuristic" if res.best else "no config ran"
            log(f"tune T={T}: {tfiles.timed_words(res, len(pruned.kept))}; best {b}")
    except KeyboardInterrupt as e:  # its kind kept: a SIGTERM (cli's Terminated) exits 143, Ctrl-C 130
        raise type(e)(bar.interrupted()) from None
    finally:
        bar.close()
    return pruned, results, stats


def _search_count(m: Measurer, layer, T: int, rows: int, base: dict, budget: int, pruned, args, dims, c, log):
    """One token count: the search (screening, finalists), then the winner on a second input."""
    base_cfgs = [base["current"], base["heuristic"]]
    if args.search == "exhaustive":
        out = strategy.exhaustive(pruned.kept, m, base_cfgs, args.finalists)
    else:
        out = strategy.halving(
            pruned.kept,
            m,
            budget,
            base_cfgs,
            finalists=args.finalists,
            prior=bm_prior(dims.topk, c.combo["num_experts"], rows),
        )
    res = TokenResult(
        tokens=T, rows=rows, best=out.best, best_us=math.nan, num_timed=out.num_timed, budget=budget, rungs=out.rungs
    )
    trials: dict[tuple, Trial] = {}
    for cfg in out.order:
        t = m.store.get(m._key(cfg, "screen"))
        assert t is not None, f"{cfg}: the search screened it, the store has no trial of it"
        trials[config_key(t.config)] = t
    space = {config_key(cfg) for cfg in pruned.kept}
    res.space_timed = sum(k in space for k in trials)
    outside: dict[tuple, list[str]] = {}  # a baseline that is a config of the space counts as the space's
    for name, cfg in base.items():
        res.baselines[name] = trials.get(config_key(cfg))
        if config_key(cfg) not in space:
            outside.setdefault(config_key(cfg), []).append(name)
    res.outside = [" = ".join(names) for names in outside.values()]
    for t in trials.values():
        if t.error:
            kind = t.error.split(":")[0]
            res.errors[kind] = res.errors.get(kind, 0) + 1
    if out.best is not None:
        group = group_key(out.finalists) if len(out.finalists) > 1 else None
        res.final = [m.store.get(m._key(f, "final", group)) for f in out.finalists] if group else []
        # the winner must also pass on a second input; else the next finalist
        ranked = sorted(out.finalists, key=lambda f: out.final_us[out.finalists.index(f)] if out.final_us else 0.0)
        for cand in [out.best] + [f for f in ranked if f != out.best]:
            rel, err = m.recheck(layer, cand)
            if not err:
                res.best, res.best_us, res.recheck_rel_err = cand, trials[config_key(cand)].us, rel
                break
            log(f"tune T={T}: {cand} fails on a second input ({err}); next finalist")
        else:
            res.best = None
    return res


def stored_counts(store: TrialStore, layer: str, T: int, args: TuneArgs) -> tuple[int, int, int]:
    """The stored trials of `layer` at T tokens a resume reads back (of this tune's reps):
    (screened, finals, re-checks)."""
    reps = {"screen": args.reps, "final": args.final_reps, "recheck": 0}
    n = dict.fromkeys(reps, 0)
    for t in store.select(layer, T):
        if reps.get(t.phase) == t.reps:
            n[t.phase] += 1
    return n["screen"], n["final"], n["recheck"]


def _stored_timing(store: TrialStore, layer: str, T: int) -> str:
    for t in store.select(layer, T):
        return t.timing
    raise RuntimeError(f"no stored trials at {T} tokens (a GPU worker failed?)")


def _gpu_main(rank: int, overrides: list, shares: list, args: TuneArgs, out_dir: str, workers: int):
    """One GPU's share of the token counts (a spawned process)."""
    torch.cuda.set_device(rank)
    c, _ = resolve(overrides)
    store = TrialStore(Path(out_dir), trial_env(torch.device("cuda", rank)))
    pool = tcompile.Pool(workers) if workers > 0 else None
    try:
        run_tokens(
            c,
            shares[rank],
            args,
            store,
            torch.device("cuda", rank),
            lambda s: print(f"[gpu{rank}] {s}", file=sys.stderr),
            pool,
            position=rank,
        )
    finally:
        if pool is not None:
            pool.close()


def join_or_stop(ctx) -> None:
    """Wait for the GPUs' processes (torch's ProcessContext). An interrupt here (Ctrl-C, or cli's
    Terminated for a SIGTERM to this process alone) stops them before it goes on: else they would
    keep timing while multiprocessing's exit waited for them."""
    try:
        while not ctx.join():
            pass
    except KeyboardInterrupt:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        for p in ctx.processes:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        raise


def split_tokens(tokens: list[int], num_gpus: int) -> list[list[int]]:
    """Each GPU's token counts: round robin from the largest (the large sizes take longest)."""
    order = sorted(tokens, reverse=True)
    return [sorted(order[i::num_gpus]) for i in range(num_gpus) if order[i::num_gpus]]


def tune(
    args: TuneArgs,
    out_dir: Path,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
    pool: Optional[tcompile.Pool] = None,
):
    """Tune one layer's token counts; trials go to out_dir/trials.jsonl. Returns
    (layer info, Pruned, [TokenResult], compile Stats, wall seconds)."""
    c, tokens = resolve(args.overrides)
    cuda = c.combo["device"] == "cuda"
    ngpu = torch.cuda.device_count() if cuda else 0
    ngpu = min(ngpu, args.gpus) if args.gpus else ngpu
    if cuda and ngpu > 1 and len(tokens) > 1:
        names = {torch.cuda.get_device_name(i) for i in range(ngpu)}
        if len(names) > 1:  # one table from two GPU models, and a replay that finds only one's trials
            raise ValueError(f"the visible GPUs differ ({', '.join(sorted(names))}): tune on one model (--gpus 1)")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    gpu = torch.cuda.get_device_name(device) if cuda else ""
    host = host_line(device.type, interpreting(), args.space, gpu)  # the interpreter times the host
    if host:
        log(host)
    store = open_store(out_dir, device, args.resume, c.key, log)  # says which stored trials it passes over
    tfiles.write_env(out_dir)  # before any trial: an interrupted tune has its environment too
    t0 = time.perf_counter()
    workers = args.workers if args.workers is not None else (tcompile.default_workers(max(1, ngpu)) if cuda else 0)
    if cuda and ngpu > 1 and len(tokens) > 1:
        shares = split_tokens(tokens, ngpu)
        log(f"tune: {len(tokens)} token counts over {ngpu} GPUs")
        join_or_stop(
            torch.multiprocessing.spawn(
                _gpu_main, args=(args.overrides, shares, args, str(out_dir), workers), nprocs=len(shares), join=False
            )
        )
        store.reload()
        pruned, results, stats = run_tokens(c, tokens, args, store, torch.device("cuda", 0), log, replay=True)
    else:
        own = tcompile.Pool(workers) if pool is None and workers > 0 and cuda else None
        try:
            pruned, results, stats = run_tokens(c, tokens, args, store, device, log, own if own is not None else pool)
        finally:
            if own is not None:
                own.close()
    wall = time.perf_counter() - t0
    dims = dims_of(c.combo)

    info = {
        "E": dims.num_experts,
        "N": dims.intermediate,
        "hidden": dims.hidden,
        "topk": dims.topk,
        "dtype": config_dtype(c.combo["quant"]),
        "block_shape": config_block_shape(c.combo["quant"]),
        "model": c.combo["model"],
        "quant": c.combo["quant"],
        "simulate_ep": c.combo["simulate_ep"],
        "simulate_tp": c.combo["simulate_tp"],
        "device": c.combo["device"],
        "layer_key": c.key,
        "overrides": list(c.overrides),
        "cli_overrides": list(args.overrides),
        "space": args.space,
        "space_size": len(pruned.kept),
        "pruning": pruned.summary(),
        "search": args.search,
        "budget": args.budget,
        "reps": args.reps,
        "final_reps": args.final_reps,
        # the tile trials' (bench.py); --decisions times each count as the runner does (its provenance's "timing")
        "timing": f"graph replays up to {c.combo['graph_max_tokens']} tokens, events above" if cuda else "host clock",
        "gpus": max(1, ngpu) if cuda else 0,
        "compile_workers": workers,
    }
    return info, pruned, results, stats, wall
