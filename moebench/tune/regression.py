"""`moebench tune --max-regression X`: the tuned table against the current one, timed
together in the same call, before `--install` may install it (vLLM's batched-MoE tuner
refuses a tuned config that regresses the default the same way).

At every token count the tuned table has an entry for, the tuned config and the one the
layer uses today (`bench.baselines_of`'s "current": an installed file's nearest entry, else
the heuristic, looked up now, when the install would happen) run on the tune's workload
(the combination's model, quant, routing, seed, simulate_ep; the search's input) with their
samples interleaved, `--final-reps` each, as the finalists are timed (`TokenBench.interleaved`:
each config checked against the reference first). A size regresses when the tuned median is
more than X (a fraction) above the current one, or when the tuned config fails there; a size
whose tuned entry is the current config has nothing to time and passes. A config whose samples
the host paced after the timing loop's retakes fails (its figure is host time:
bench.TokenBench._record): the pair is then timed once more (`retimed` says why), and where the
second timing is host-paced too the tuned one regresses, and a current one cannot be regressed from. The ratio's 95 %
interval is the comparison's bootstrap (report/stats.py), given for reading: the decision
rests on the medians, as the search's own did.

Never read from or written to the trial store: a resumed tune times its check again.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Callable

from moebench.tune.progress import Progress
from moebench.tune.space import config_key
from moebench.tune.trials import json_num, retime_host_paced
from moebench.util.words import agree, counted, latency

NAN = float("nan")


def parse_max_regression(text: str) -> float:
    """--max-regression's value: a fraction >= 0 (0.02 allows 2 % slower)."""
    try:
        x = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"--max-regression {text!r}: give a fraction >= 0, e.g. 0.02 for 2 %") from None
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"--max-regression {text}: give a finite fraction >= 0, e.g. 0.02 for 2 %")
    return x


@dataclass
class SizeCheck:
    """One token count: the tuned entry against the current config (µs: interleaved medians)."""

    tokens: int
    tuned: dict
    current: dict
    tuned_us: float = NAN
    current_us: float = NAN
    ci_lo: float = NAN  # 95 % bootstrap interval of tuned / current
    ci_hi: float = NAN
    tuned_error: str = ""
    current_error: str = ""
    tuned_samples: list = field(default_factory=list)
    current_samples: list = field(default_factory=list)
    retimed: str = ""  # why the pair was timed a second time (its first samples host-paced), else ''

    @property
    def same(self) -> bool:
        """The tuned entry is the config the layer runs today: installing it changes nothing here."""
        return config_key(self.tuned) == config_key(self.current)

    @property
    def ratio(self) -> float:
        """tuned / current median (1 when they are one config; NaN when either did not run)."""
        if self.same:
            return 1.0
        ok = math.isfinite(self.tuned_us) and math.isfinite(self.current_us) and self.current_us > 0
        return self.tuned_us / self.current_us if ok else NAN


def regressed(s: SizeCheck, max_regression: float) -> bool:
    """The decision at one size: the tuned config failed, or its median is more than
    `max_regression` (a fraction) above the current config's. A current config that did
    not run cannot be regressed from."""
    if s.same:
        return False
    if s.tuned_error or not math.isfinite(s.tuned_us):
        return True
    if s.current_error or not math.isfinite(s.current_us):
        return False
    return s.ratio > 1.0 + max_regression


@dataclass
class Check:
    """The check over every tuned token count."""

    max_regression: float
    reps: int  # samples of each config at each size
    timing: str  # graph | events | host (TokenBench.timing of the first size)
    sizes: list = field(default_factory=list)  # [SizeCheck]

    @property
    def regressions(self) -> list[SizeCheck]:
        return [s for s in self.sizes if regressed(s, self.max_regression)]

    @property
    def passed(self) -> bool:
        return not self.regressions

    def lines(self) -> list[str]:
        """One line per size that regresses (what the refusal prints)."""
        return [size_line(s, self.max_regression) for s in self.regressions]

    def verdict(self) -> str:
        """One line: passed or refused, with the worst ratio."""
        timed = [s for s in self.sizes if math.isfinite(s.ratio) and not s.same]
        worst = max(timed, key=lambda s: s.ratio, default=None)
        tail = f"; worst {worst.ratio:.3f}x at {worst.tokens} tokens" if worst else ""
        if self.timing == "host":  # the CPU, Triton's interpreter: a verdict on nothing a GPU runs
            tail += "; host time (the interpreter's), not a GPU's"
        n, x = len(self.sizes), f"{self.max_regression:g} ({self.max_regression * 100:g} %)"
        if self.passed:
            return f"--max-regression {x}: passed at {counted(n, 'token count')} against the current configs{tail}"
        regress = agree(len(self.regressions), "regresses", "regress")
        return f"--max-regression {x}: {len(self.regressions)} of {counted(n, 'token count')} {regress}{tail}"

    def table(self) -> str:
        """Markdown: per size the tuned and current medians (in the unit that reads best, words.latency),
        their ratio and its interval."""
        rows = ["| tokens | tuned | current | tuned / current [95 % CI] | check |", "|---:|---:|---:|---:|---|"]
        for s in self.sizes:
            if s.same:
                rows.append(f"| {s.tokens} | – | – | 1 (same config) | ok |")
                continue
            ci = f" [{s.ci_lo:.3f}, {s.ci_hi:.3f}]" if math.isfinite(s.ci_lo) else ""
            r = f"{s.ratio:.3f}{ci}" if math.isfinite(s.ratio) else "–"
            why = s.tuned_error or (f"current failed: {s.current_error}" if s.current_error else "")
            if s.retimed and not why:
                why = "timed twice: the first pair host-paced"
            verdict = "REGRESSED" if regressed(s, self.max_regression) else "ok"
            rows.append(
                f"| {s.tokens} | {latency(s.tuned_us)} | {latency(s.current_us)} | {r} | {verdict}"
                f"{' (' + why + ')' if why else ''} |"
            )
        return "\n".join(rows)

    def to_json(self) -> dict:
        """tune.json's "regression_check" (NaN as None)."""
        sizes = []
        for s in self.sizes:
            d = {k: json_num(v) for k, v in asdict(s).items()}
            d.update(same=s.same, ratio=json_num(s.ratio), regressed=regressed(s, self.max_regression))
            sizes.append(d)
        return {
            "max_regression": self.max_regression,
            "passed": self.passed,
            "reps": self.reps,
            "timing": self.timing,
            "sizes": sizes,
        }


def size_line(s: SizeCheck, x: float) -> str:
    """One size that regresses, in words (what a refusal prints)."""
    if s.tuned_error or not math.isfinite(s.tuned_us):
        twice = ", timed twice" if s.retimed else ""
        return f"{s.tokens} tokens: the tuned config failed in the check ({s.tuned_error or 'no time'}{twice})"
    ci = f" [95 % CI {s.ci_lo:.3f}, {s.ci_hi:.3f}]" if math.isfinite(s.ci_lo) else ""
    return (
        f"{s.tokens} tokens: tuned {latency(s.tuned_us)} vs current {latency(s.current_us)} = {s.ratio:.3f}x{ci}, "
        f"above {1 + x:g}x"
    )


def interval(current_samples, tuned_samples) -> tuple[float, float]:
    """95 % bootstrap interval of median(tuned) / median(current) (NaN below report.stats.MIN_SAMPLES)."""
    from moebench.report.stats import bootstrap_ratios
    from moebench.report.stats import interval as percentile_interval

    return percentile_interval(bootstrap_ratios(current_samples, tuned_samples))


def measure(
    c, entries: dict[int, dict], reps: int, device, max_regression: float, log: Callable[[str], None] = lambda s: None
) -> Check:
    """Time each tuned entry ({token count: config}) against the layer's current config at
    that count, `reps` interleaved samples each, on combination `c` (plan.Combination) on
    `device`; the current config is looked up now (kernels/configs/, MOEBENCH_TRITON_CONFIG_DIR)."""
    from moebench.tune.bench import LayerBench, baselines_of, dims_of, rows_of

    dims = dims_of(c.combo)
    layer = LayerBench(c, device)
    check = Check(max_regression=max_regression, reps=reps, timing="")
    for T in sorted(entries):
        rows = rows_of(c.combo, layer.shape, T)  # what the look-up keys on (simulate_rank: M)
        s = SizeCheck(tokens=T, tuned=dict(entries[T]), current=baselines_of(dims, c.combo["quant"], rows)["current"])
        check.sizes.append(s)
    pairs = [s for s in check.sizes if not s.same]
    calls = 2 * (1 + layer.warmup + reps)  # a pair: each checked, warmed up and sampled `reps` times
    log(
        f"tune check: the tuned entry against the current config at {counted(len(pairs), 'token count')}, "
        f"{counted(reps, 'sample')} each, interleaved (about {counted(calls * len(pairs), 'layer call')})"
    )
    bar = Progress(calls * len(pairs), "tune check", log=log)
    layer.tick = bar.tick
    try:
        for s in check.sizes:
            if s.same:
                bar.say(f"tune check T={s.tokens}: the tuned config is the current one")
                continue
            _time_pair(layer, s, reps, check, bar)
    finally:
        bar.close()
    return check


def _time_pair(layer, s: SizeCheck, reps: int, check: Check, bar: Progress) -> None:
    """One size's tuned and current configs timed interleaved (twice where the host paced them)."""
    bar.stage(f"T={s.tokens}")
    tb = layer.at(s.tokens)
    check.timing = check.timing or tb.timing
    # host time is no figure, one busy moment no verdict: a host-paced pair is timed once more
    timed = partial(tb.interleaved, [s.tuned, s.current], reps)
    with bar.work(2 * (1 + layer.warmup + reps)):
        (tuned, cur), s.retimed = retime_host_paced(timed, ["tuned", "current"], f"tune check T={s.tokens}", bar.say)
    s.tuned_us, s.tuned_error, s.tuned_samples = tuned.us, tuned.error, list(tuned.samples)
    s.current_us, s.current_error, s.current_samples = cur.us, cur.error, list(cur.samples)
    s.ci_lo, s.ci_hi = interval(s.current_samples, s.tuned_samples)
    bar.say(f"tune check T={s.tokens}: tuned {latency(s.tuned_us)}, current {latency(s.current_us)}")


def check_tune(args, results, max_regression: float, log: Callable[[str], None] = lambda s: None) -> Check:
    """The check of a finished tune (search.TuneArgs `args`, its [search.TokenResult]): its
    winners against the current configs on the tune's combination, `args.final_reps` samples
    each, on the GPU the tune's single-process path uses (the current one), or the CPU."""
    import torch

    from moebench.tune.search import resolve

    c, _ = resolve(args.overrides)
    cuda = c.combo["device"] == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    entries = {r.tokens: r.best for r in results if r.best is not None}
    return measure(c, entries, args.final_reps, device, max_regression, log)
