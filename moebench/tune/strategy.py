"""How `moebench tune` picks the configs it times: exhaustive, or successive halving
over tile shapes with a knob hill-climb, inside a budget of distinct configs.

Halving ("halving"), for a pruned space and a budget B (distinct configs timed, the
baselines included):

  rung 0   every tile shape (BM, BN, BK) is timed with one or two knob settings
           (GROUP_SIZE_M, num_warps, num_stages) near (1, 4, 3) and (16, 8, 4): two
           while that costs at most 60 % of B;
  rung r   the best 1/eta of the surviving tiles (by their best time) stay; each gets
           up to eta**r new configs: the untried one-step knob neighbours of its best
           config, then its untried knob settings nearest to that best; the leading
           tile also tries its neighbour tiles (one step in BM, BN or BK) with its best
           knobs, so a tile that rung 0 misjudged for its knobs can come back;
  final    the best `finalists` configs are timed again, interleaved, with more
           samples; the fastest median there wins.

The tile decides most of the time (which rows are padding, how often weights are
read); the knobs move it by up to ~15 % (results/tune: num_stages 3 -> 4 cost
16 % on one tile), so tiles are ranked first and only the good ones get knob trials.
Stops when B is spent or no survivor has untried configs. Deterministic: the same
measurements give the same picks, which is what lets a tune resume from its stored
trials (trials.py).

`measure(configs, phase)` returns one result per config (with `.us`, µs, inf or NaN
when the config failed; one with an `.error`, e.g. host-paced samples, ranks as failed),
phase "screen" or "final" (interleaved, more samples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from moebench.tune.space import KNOB_KEYS, TILE_KEYS, config_key

RUNG0_KNOBS = (
    {"GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3},
    {"GROUP_SIZE_M": 16, "num_warps": 8, "num_stages": 4},
)
RUNG0_SHARE = 0.6  # rung 0 may take this much of the budget with two settings a tile
STRATEGIES = ("halving", "exhaustive")


@dataclass
class Outcome:
    """What a search timed and picked. `screen` maps config key -> µs (inf: failed)."""

    best: Optional[dict]
    screen: dict = field(default_factory=dict)
    order: list = field(default_factory=list)  # configs in the order they were timed
    finalists: list = field(default_factory=list)
    final_us: list = field(default_factory=list)
    rungs: list = field(default_factory=list)  # [{"rung", "tiles", "timed"}]

    @property
    def num_timed(self) -> int:
        return len(self.screen)


def _us(r) -> float:
    """A result's µs for ranking: inf where it failed or carries an error (a trial whose figure
    is host time keeps its µs for reading, and ranks as failed)."""
    us = float(getattr(r, "us", float("nan")))
    return us if math.isfinite(us) and not getattr(r, "error", "") else math.inf


class _Timer:
    """Runs `measure` on configs not yet screened and records the results."""

    def __init__(self, measure: Callable, out: Outcome):
        self.measure, self.out = measure, out

    def screen(self, cfgs: Sequence[dict]) -> None:
        new, seen = [], set()
        for c in cfgs:
            k = config_key(c)
            if k not in self.out.screen and k not in seen:
                new.append(dict(c))
                seen.add(k)
        if not new:
            return
        for c, r in zip(new, self.measure(new, "screen"), strict=True):
            self.out.screen[config_key(c)] = _us(r)
            self.out.order.append(c)

    def us(self, cfg: dict) -> float:
        return self.out.screen.get(config_key(cfg), math.inf)


def _finish(timer: _Timer, measure: Callable, finalists: int) -> Outcome:
    out = timer.out
    ok = sorted((c for c in out.order if math.isfinite(timer.us(c))), key=lambda c: (timer.us(c), config_key(c)))
    if not ok:
        return out
    out.finalists = ok[: max(1, finalists)]
    if len(out.finalists) == 1:
        out.final_us = [timer.us(out.finalists[0])]
        out.best = dict(out.finalists[0])
        return out
    out.final_us = [_us(r) for r in measure(out.finalists, "final")]
    i = min(range(len(out.finalists)), key=lambda j: (out.final_us[j], j))
    out.best = dict(out.finalists[i]) if math.isfinite(out.final_us[i]) else dict(out.finalists[0])
    return out


def exhaustive(
    configs: Sequence[dict], measure: Callable, baselines: Sequence[dict] = (), finalists: int = 3
) -> Outcome:
    """Time every config (and the baselines), then the best `finalists` again."""
    timer = _Timer(measure, Outcome(best=None))
    timer.screen(list(baselines) + list(configs))
    timer.out.rungs.append(
        {"rung": 0, "tiles": len({config_key(c)[:3] for c in configs}), "timed": timer.out.num_timed}
    )
    return _finish(timer, measure, finalists)


def _axis_values(configs: Sequence[dict]) -> dict[str, list[int]]:
    keys = TILE_KEYS + KNOB_KEYS
    return {k: sorted({int(c[k]) for c in configs}) for k in keys}


def _index(cfg: dict, values: dict[str, list[int]], keys: Sequence[str]) -> tuple[int, ...]:
    """Position of each axis value (values outside the space: the nearest position)."""
    out = []
    for k in keys:
        vs = values[k]
        v = int(cfg[k])
        out.append(vs.index(v) if v in vs else min(range(len(vs)), key=lambda i: abs(math.log2(vs[i]) - math.log2(v))))
    return tuple(out)


def _distance(a: dict, b: dict, values: dict[str, list[int]], keys: Sequence[str]) -> int:
    return sum(abs(x - y) for x, y in zip(_index(a, values, keys), _index(b, values, keys), strict=True))


def halving(
    configs: Sequence[dict],
    measure: Callable,
    budget: int,
    baselines: Sequence[dict] = (),
    eta: int = 3,
    finalists: int = 3,
    prior: Optional[Callable[[tuple], float]] = None,
) -> Outcome:
    """Successive halving over tiles (module doc). `budget`: distinct configs to time,
    baselines included; `prior(tile) -> score` (lower first) orders the tiles when rung 0
    cannot afford them all."""
    if budget < 1:
        raise ValueError("--budget leaves no config to time: raise it")
    configs = [dict(c) for c in configs]
    if not configs:
        return exhaustive([], measure, baselines, finalists)
    values = _axis_values(configs)
    in_space = {config_key(c) for c in configs}
    tiles: dict[tuple, list[dict]] = {}
    for c in configs:
        tiles.setdefault(tuple(int(c[k]) for k in TILE_KEYS), []).append(c)
    timer = _Timer(measure, Outcome(best=None))
    left = lambda: budget - timer.out.num_timed

    # rung 0: the baselines, then one or two settings per tile
    timer.screen(list(baselines))
    order = sorted(tiles, key=lambda t: (prior(t) if prior else 0.0, t))
    per_tile = 2 if 2 * len(order) <= RUNG0_SHARE * left() else 1
    order = order[: max(1, min(len(order), int(RUNG0_SHARE * left()) // per_tile or 1))]
    rung0 = []
    for t in order:
        picks = []
        for target in RUNG0_KNOBS[:per_tile]:
            want = dict(zip(TILE_KEYS, t, strict=True), **target)
            pick = min(tiles[t], key=lambda c: (_distance(c, want, values, KNOB_KEYS), config_key(c)))
            if pick not in picks:
                picks.append(pick)
        rung0 += picks
    timer.screen(rung0[: max(0, left())])
    timer.out.rungs.append({"rung": 0, "tiles": len(order), "timed": timer.out.num_timed})

    def tile_best(t) -> Optional[dict]:
        tried = [c for c in tiles[t] if config_key(c) in timer.out.screen]
        return min(tried, key=lambda c: (timer.us(c), config_key(c))) if tried else None

    def ranked(ts):
        return sorted(
            (t for t in ts if tile_best(t) is not None and math.isfinite(timer.us(tile_best(t)))),
            key=lambda t: (timer.us(tile_best(t)), t),
        )

    def add(batch: list[dict], c) -> bool:
        if config_key(c) in in_space and config_key(c) not in timer.out.screen and c not in batch:
            batch.append(c)
            return True
        return False

    survivors = ranked(order)
    rung = 0
    while survivors and left() > 0:
        rung += 1
        survivors = survivors[: max(1, math.ceil(len(survivors) / eta))]
        share = max(1, min(eta**rung, left() // len(survivors)))
        lead = tile_best(survivors[0])
        batch: list[dict] = []
        for i, t in enumerate(survivors):
            best = tile_best(t)
            assert lead is not None and best is not None  # ranked() keeps only tiles with a best
            # the leader's knobs first (knob effects carry over between tiles), then the
            # untried knob settings nearest to this tile's best
            n = int(add(batch, dict(best, **{k: lead[k] for k in KNOB_KEYS})))
            untried = [c for c in tiles[t] if config_key(c) not in timer.out.screen and c not in batch]
            untried.sort(key=lambda c: (_distance(c, best, values, KNOB_KEYS), config_key(c)))
            for c in untried[: max(0, share - n)]:
                add(batch, c)
            if i < 2:  # the two leading tiles' neighbour tiles, with their knobs
                for k in TILE_KEYS:
                    for step in (-1, 1):
                        vs, j = values[k], values[k].index(int(best[k])) + step
                        if 0 <= j < len(vs):
                            add(batch, dict(best, **{k: vs[j]}))
        batch = batch[: left()]
        if not batch:
            break
        timer.screen(batch)
        timer.out.rungs.append({"rung": rung, "tiles": len(survivors), "timed": timer.out.num_timed})
        # a neighbour tile that beat a survivor joins them
        survivors = ranked(set(survivors) | {tuple(int(c[k]) for k in TILE_KEYS) for c in batch})
    return _finish(timer, measure, finalists)


def budget_of(fraction: float, space_size: int, num_baselines: int = 0, minimum: int = 4) -> int:
    """Distinct configs a halving search may time, baselines included: `fraction` of the
    space, or the baselines and `minimum` configs of a space too small for that."""
    if not 0 < fraction <= 1:
        raise ValueError(f"--budget {fraction}: a fraction of the space in (0, 1]")
    return max(int(fraction * space_size), min(space_size, minimum) + num_baselines)
