"""`moebench tune --decisions`: every choice the layer's experts make besides the gathered tiles,
per token count, timed as the layer runs (issue #51).

The options at a token count (tune/decision_options.py: the gathered rows, with the weights by TMA
too, the contiguous rows on Triton and on every Gluon variant, DeepGEMM, and `current`, the baseline).
An option that cannot run here is skipped with its reason (on the CPU: every Gluon variant and
DeepGEMM). A handful of options: all are timed, exhaustively, their samples interleaved
(`final_reps` each, the runner's timing: validity.timing_mode of the combination at that count, as
the sweep times the layer; auto, the default, is graph replays at every size wherever the layer
can be captured, their captures sharing one memory pool; profiler is timed as events), each
checked against the float32 reference first. The fastest Triton option is the
sidecar's entry at that count (kernels/triton/decisions.py); DeepGEMM's switch-over is the
smallest tuned count from which DeepGEMM won at every larger one.

Legend: T tokens per rank, M rows entering the experts (the entries' key).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch

from moebench.kernels.reference import TOLERANCE, reference_moe, rel_err
from moebench.measure import layer as layers
from moebench.measure import timing
from moebench.measure.workload import make_routed, reference_expert_fn, routing_spec
from moebench.tune.decision_options import CURRENT, DEEPGEMM, Option, decision_timing, options_of
from moebench.tune.decision_trials import DecisionStore, Timed, open_store, timed_to_json
from moebench.tune.trials import HOST_PACED_ERROR, retime_host_paced
from moebench.util.words import counted, latency

NAN = float("nan")
TIMING_FAILED = "timing failed"  # a count whose timing raised (e.g. out of memory): not stored, timed again on resume


@dataclass
class DecisionResult:
    """One token count's decisions."""

    tokens: int
    rows: int
    timed: list = field(default_factory=list)  # [Timed]
    not_run: list = field(default_factory=list)  # [(options, why they cannot run here)]
    best: str = ""  # the fastest Triton option
    best_overall: str = ""  # the fastest option (deepgemm included)
    entry: dict = field(default_factory=dict)
    wall_s: float = NAN
    timing: str = ""  # how the count was timed: graph | events | host (decision_timing)
    # the process's GPU memory reserved at its peak while this count's options were built, checked and
    # timed (bytes; NaN: not timed here, or no GPU): the shared graph pool included
    device_peak_bytes: float = NAN

    @property
    def retimed(self) -> str:
        """Why this count's options were timed twice ('' when once): the host paced some option's
        samples the first time, so every option was timed again together and the second timing ranks
        (as check does); each such Timed carries it, stored with it (`_run`)."""
        return next((t.retimed for t in self.timed if t.retimed), "")

    def get(self, name: str) -> Optional[Timed]:
        return next((t for t in self.timed if t.option == name), None)

    def ratio(self, name: str, than: str) -> float:
        """how many times slower `than` is than `name` (than / name)."""
        a, b = self.get(name), self.get(than)
        return b.us / a.us if a is not None and b is not None and a.ok and b.ok else NAN


class DecisionBench:
    """The layer of combination `c` under each option, on `device`."""

    def __init__(self, c, device: torch.device):
        self.c, self.device = c, device
        self.combo = c.combo
        self.layers: dict[Option, layers.Layer] = {}
        q = self.combo["quant"]
        self.tol = TOLERANCE[str(q)]
        self.flush = timing.L2Flusher(device) if device.type == "cuda" else None
        self.warmup = 3 if device.type == "cuda" else 1

    def layer(self, o: Option) -> layers.Layer:
        if o not in self.layers:
            combo = dataclasses.replace(self.combo, experts=o.experts)
            self.layers[o] = layers.build_layer(combo, 0, 1, None, self.device, options=o.opts(), keep_weights=True)
        return self.layers[o]

    def timing(self, T: int) -> str:
        """How run() times T tokens: graph (replays) | events | host (decision_timing)."""
        return decision_timing(self.combo, T, self.device.type)

    def run(self, T: int, opts: list[Option], reps: int, salt: int = 7) -> list[Timed]:
        """Each option checked on T tokens' routing, then all timed interleaved (`reps` samples each).
        The layers are built for this call only (their weights kept: one copy): the workspaces of the
        previous count's do not stay on the GPU."""
        self.layers.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        combo = self.combo
        L0 = self.layer(opts[0])
        routed = make_routed(L0.ctx.shape, T, routing_spec(combo), 0, salt, self.device, combo["simulate_rank"])
        x, w, ids = routed.inputs
        ref_w = reference_expert_fn(L0.ctx.shape, L0.ctx.quant, combo["seed"], self.device)
        kept = range(0, L0.ctx.num_local_experts) if L0.ctx.simulate_ep > 1 else None
        ref = reference_moe(x, w, ids, ref_w, kept)
        out, fns = [], []
        for o in opts:
            t = Timed(o.name)
            try:
                kernel = self.layer(o).kernel
                t.rel_err = rel_err(kernel.forward(x, w, ids, with_shared=False), ref)
                ex = kernel.experts
                t.ran = "/".join(s for s in (getattr(ex, "last_layout", ""), getattr(ex, "last_gemm", "")) if s)
                if not t.rel_err <= self.tol:
                    t.error = f"incorrect: rel_err {t.rel_err:.3g} > {self.tol:g}"
            except Exception as e:  # noqa: BLE001 (a failing option is its trial's error; the others still run)
                t.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            out.append(t)
            if not t.error:
                fns.append((t, (lambda k=kernel: k.forward(x, w, ids, with_shared=False))))
        if fns:
            graph = self.timing(T) == "graph"
            try:
                samples = timing.time_interleaved(
                    [f for _, f in fns],
                    self.device,
                    reps,
                    self.warmup,
                    flush=self.flush,
                    graph=graph,
                    warmup_ms=50.0,
                    share_pool=True,  # one pool for all options' graphs: a layer's temporaries once, not per option
                )
            except Exception as e:  # noqa: BLE001 (e.g. out of memory capturing: every option of this count says so)
                why = f"{TIMING_FAILED} ({'graph replays' if graph else 'eager forwards'}): {type(e).__name__}: "
                why += str(e).splitlines()[0][:200] if str(e) else ""
                for t, _ in fns:
                    t.error = why
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                return out
            for (t, _), s in zip(fns, samples, strict=True):
                t.us, t.p20, t.p80, t.samples = s.median, s.p20, s.p80, [round(v, 3) for v in s.us]
                if s.host_paced and self.device.type == "cuda":
                    t.error = (
                        f"{HOST_PACED_ERROR}: {s.host_paced} of {len(s.us)} samples{s.paced_which()}: "
                        "host time, not ranked"
                    )
        return out


def decide(
    c,
    tokens: list[int],
    rows: dict[int, int],
    tiles: dict[int, dict],
    reps: int,
    device: torch.device,
    log: Callable[[str], None] = lambda s: None,
    bench: Optional[DecisionBench] = None,
    store: Optional[DecisionStore] = None,
) -> list[DecisionResult]:
    """The decisions at each token count (tiles: this tune's winning gathered tile per count).
    With a `store` (decision_trials.py) each count's timings are recorded as they finish and the
    ones stored already (a resumed tune) are read instead of timed, but for a count with an option
    stored host-paced: timed again whole (`_timed`)."""
    bench = bench or DecisionBench(c, device)
    plan = {T: options_of(c.combo, device, tiles.get(T)) for T in tokens}
    n = sum(len(plan[T][0]) for T in tokens)
    log(
        f"tune decisions: {counted(n, 'option')} at {counted(len(tokens), 'token count')}, whole layers checked "
        f"and timed, {counted(reps, 'sample')} each, interleaved per count; a line as each count ends"
    )
    if store is not None:
        keys = [store.key(T, o, reps, bench.timing(T)) for T in tokens for o in plan[T][0]]
        reused = sum(store.get(k) is not None for k in keys)
        if reused:
            log(f"tune decisions: {reused} of {len(keys)} timings reused from {store.path}")
    results = []
    for T in tokens:
        t0 = time.perf_counter()
        opts, skipped = plan[T]
        r = DecisionResult(tokens=T, rows=rows.get(T, T), not_run=skipped, timing=bench.timing(T))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        r.timed, ran = _timed(bench, store, T, opts, reps, log)
        if device.type == "cuda" and ran:  # (a count read back from the store held nothing here)
            r.device_peak_bytes = float(torch.cuda.max_memory_reserved(device))
        ranked = sorted((t for t in r.timed if t.ok and t.option != CURRENT), key=lambda t: t.us)
        triton = [t for t in ranked if t.option != DEEPGEMM]
        if triton:
            r.best = triton[0].option
            r.entry = next(o for o in opts if o.name == r.best).entry()
        r.best_overall = ranked[0].option if ranked else ""
        r.wall_s = time.perf_counter() - t0
        results.append(r)
        why = "".join(f"; skipped {n}: {w}" for n, w in skipped)
        peak = (
            f" (GPU memory reserved at peak {r.device_peak_bytes / 2**30:.1f} GiB)" if r.device_peak_bytes > 0 else ""
        )
        log(f"tune decisions T={T}: {r.best_overall or 'nothing ran'}{peak}{why}")
    return results


def _timed(
    bench: DecisionBench,
    store: Optional[DecisionStore],
    T: int,
    opts: list[Option],
    reps: int,
    log: Callable[[str], None] = lambda s: None,
):
    """([Timed] of `opts` at T, whether any was timed now): the stored ones read, the rest timed
    together (interleaved) and stored. Where any of them, stored or timed now, is host-paced (stored
    so: paced twice in a row, or by a tune from before _run timed such a count once more), every
    option of the count is timed again together, as a fresh count's are (`_run`)."""
    if store is None:
        return _run(bench, T, opts, reps, log), True
    keys = {o: store.key(T, o, reps, bench.timing(T)) for o in opts}
    have = {o: store.get(k) for o, k in keys.items()}
    missing = [o for o in opts if have[o] is None]
    paced = any(t is not None and t.error.startswith(HOST_PACED_ERROR) for t in have.values())
    if not missing and not paced:
        return [have[o] for o in opts], False
    fresh = dict(zip(missing, bench.run(T, missing, reps), strict=True)) if missing else {}
    got = _run(bench, T, opts, reps, log, first=[have[o] or fresh[o] for o in opts])
    for o, t in zip(opts, got, strict=True):
        if t is not have[o] and not t.error.startswith(TIMING_FAILED):  # (a failed timing: again on resume)
            store.add(keys[o], t)
    return got, True


def _run(
    bench: DecisionBench,
    T: int,
    opts: list[Option],
    reps: int,
    log: Callable[[str], None],
    first: Optional[list[Timed]] = None,
):
    """bench.run, and once more when the host paced an option's samples (on an H100 one of 90 graph
    replays at 256 tokens): every option of `opts` again, together (trials.retime_host_paced); the
    second timing ranks, each of its Timed carrying why (`retimed`). `first`: the count's first
    timing where a resumed tune holds it already (`_timed`: the stored, the rest timed now)."""
    got, why = retime_host_paced(
        partial(bench.run, T, opts, reps), [o.name for o in opts], f"tune decisions T={T}", log, first
    )
    if why:  # (else each keeps its own: a stored one why its count was timed twice before)
        for t in got:
            t.retimed = why
    return got


def switch_over(results: list[DecisionResult]) -> Optional[int]:
    """triton_or_deepgemm's deepgemm_min_tokens: the smallest tuned row count from which DeepGEMM won at
    every larger one; one past the largest where it never won at the largest; None where it never ran."""
    timed = sorted((r for r in results if r.get(DEEPGEMM) is not None and r.best_overall), key=lambda r: r.rows)
    if not timed:
        return None
    m = None
    for r in reversed(timed):
        if r.best_overall != DEEPGEMM:
            break
        m = r.rows
    return m if m is not None else timed[-1].rows + 1


@dataclass
class DecisionCheck:
    """--max-regression on the decisions: each count's chosen option against the current one, timed
    again together (fresh interleaved samples, as regression.py checks the tiles)."""

    max_regression: float
    sizes: list = field(default_factory=list)  # [(tokens, chosen Timed, current Timed)]
    retimed: dict = field(default_factory=dict)  # {tokens: why the pair was timed twice (host-paced)}

    def regressions(self) -> list[str]:
        out = []
        for T, got, cur in self.sizes:
            if not got.ok:
                out.append(f"{T} tokens: the chosen {got.option} failed in the check ({got.error or 'no time'})")
            elif cur.ok and got.us > (1 + self.max_regression) * cur.us:
                out.append(
                    f"{T} tokens: chosen {got.option} {latency(got.us)} vs current {latency(cur.us)} = "
                    f"{got.us / cur.us:.3f}x, above {1 + self.max_regression:g}x"
                )
        return out

    @property
    def passed(self) -> bool:
        return not self.regressions()

    def to_json(self) -> dict:
        return {
            "max_regression": self.max_regression,
            "passed": self.passed,
            "regressions": self.regressions(),
            "retimed": {str(T): why for T, why in self.retimed.items()},
            "sizes": [
                {"tokens": T, "chosen": timed_to_json(g), "current": timed_to_json(cu)} for T, g, cu in self.sizes
            ],
        }


def check(
    c,
    results: list[DecisionResult],
    tiles: dict[int, dict],
    reps: int,
    device: torch.device,
    max_regression: float,
    bench: Optional[DecisionBench] = None,
    log: Callable[[str], None] = lambda s: None,
) -> DecisionCheck:
    """Time each count's entry (the Triton option the triton experts will run) against the current
    layer again, interleaved."""
    bench = bench or DecisionBench(c, device)
    out = DecisionCheck(max_regression)
    for r in results:
        if not r.best:
            continue
        opts, _ = options_of(c.combo, device, tiles.get(r.tokens))
        pick = [o for o in opts if o.name in (r.best, CURRENT)]
        # as regression.measure: host time is no figure, one busy moment no verdict
        pair, why = retime_host_paced(
            partial(bench.run, r.tokens, pick, reps, salt=13),
            [o.name for o in pick],
            f"tune decisions check T={r.tokens}",
            log,
        )
        if why:
            out.retimed[r.tokens] = why
        got, cur = sorted(pair, key=lambda t: t.option == CURRENT)
        out.sizes.append((r.tokens, got, cur))
        log(f"tune decisions check T={r.tokens}: {got.option} {latency(got.us)}, current {latency(cur.us)}")
    return out


def for_tune(
    args, results, max_regression: Optional[float], log: Callable[[str], None], out_dir: Optional[Path] = None
):
    """`moebench tune --decisions` after the tile search (search.TuneArgs `args`, its [TokenResult]):
    ([DecisionResult], DecisionCheck or None), on the device the tune's single-process path uses,
    `args.final_reps` interleaved samples per option; recorded in out_dir/decisions.jsonl and, unless
    `args.resume` is off (--fresh), read back from it (decision_trials.py). The check is never stored."""
    from moebench.tune.search import resolve

    c, _ = resolve(args.overrides)
    cuda = c.combo["device"] == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    tiles = {r.tokens: r.best for r in results if r.best is not None}
    rows = {r.tokens: r.key for r in results}
    bench = DecisionBench(c, device)
    store = open_store(out_dir, c, device, args.resume)
    found = decide(c, [r.tokens for r in results], rows, tiles, args.final_reps, device, log, bench, store)
    if max_regression is None:
        return found, None
    return found, check(c, found, tiles, args.final_reps, device, max_regression, bench, log)
