"""The search's measurements at one token count (search.py runs them): the screening and the
finalists' interleaved timing (`Measurer`, strategy's `measure`) and the winner's check on a second
input (`recheck`), each stored as it finishes (trials.py) and read back on resume, each counted on
the tune's progress bar (progress.py) in layer calls."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Callable, Optional

import torch

from moebench.tune import compile as tcompile
from moebench.tune.progress import Calls, Progress
from moebench.tune.space import config_key
from moebench.tune.trials import Trial, TrialStore
from moebench.util.words import counted


def group_key(cfgs) -> str:
    """The finalists' group: their final trials are reused only for the same set."""
    return hashlib.sha1(repr(sorted(config_key(c) for c in cfgs)).encode()).hexdigest()[:12]


class Measurer:
    """strategy's `measure`: stored trials first, then compile the rest in the pool and
    time them one by one, storing each as it finishes. `bench` None: replay only
    (every trial must be stored already). `progress`: the bar, with the layer calls of each step."""

    def __init__(
        self,
        bench,
        store: TrialStore,
        layer: str,
        T: int,
        args,
        timing_mode: str,
        pool: Optional[tcompile.Pool] = None,
        target=None,
        stats: Optional[tcompile.Stats] = None,
        progress: Optional[Progress] = None,
        log: Callable[[str], None] = lambda s: None,
        calls: Optional[Calls] = None,
    ):
        self.bench, self.store, self.layer, self.T, self.args, self.log = bench, store, layer, T, args, log
        self.timing, self.pool, self.target = timing_mode, pool, target
        self.stats = stats if stats is not None else tcompile.Stats()
        self.progress, self.calls = progress, calls
        self.measured = 0  # trials timed in this process (not read back)

    def _key(self, cfg: dict, phase: str, group: str = "") -> tuple:
        reps = self.args.reps if phase == "screen" else self.args.final_reps
        return (self.layer, self.T, config_key(cfg), phase, reps, self.timing, group)

    def _stamp(self, t: Trial, phase: str, group: str = "") -> Trial:
        t.layer, t.tokens, t.phase, t.group, t.timing = self.layer, self.T, phase, group, self.timing
        t.reps = self.args.reps if phase == "screen" else self.args.final_reps
        return t

    def _missing(self, cfgs, phase, group=""):
        return [c for c in cfgs if self.store.get(self._key(c, phase, group)) is None]

    def _require_bench(self, missing):
        if self.bench is None:
            raise RuntimeError(f"{len(missing)} trials at {self.T} tokens are not stored (a GPU worker failed?)")

    def _work(self, planned: int, trial: bool = False):
        """The bar's account of a step that makes calls (progress.Progress.work), or nothing."""
        return self.progress.work(planned, trial) if self.progress is not None else contextlib.nullcontext()

    def _drop(self, planned: int) -> None:
        """`planned` calls a stored trial spares (read back, not timed)."""
        if self.progress is not None:
            self.progress.reuse(planned)

    def stage(self, words: str) -> None:
        if self.progress is not None:
            self.progress.stage(f"T={self.T}: {words}")

    def precompile(self, cfgs) -> None:
        if self.pool is None or not cfgs or not tcompile.available():
            return
        with tcompile.Recorder() as rec:
            for c in cfgs:
                try:
                    self.bench.dry_run(c)
                except Exception:  # noqa: BLE001 (the timed trial meets it again and records it)
                    pass
        torch.cuda.synchronize(self.bench.layer.device)
        if not rec.jobs:
            return
        self.log(
            f"tune T={self.T}: compiling {len(rec.jobs)} kernels of {len(cfgs)} configs "
            f"on {self.pool.workers} processes"
        )
        st = self.pool.compile(list(rec.jobs.values()), self.target)
        self.stats.add(st)
        if st.errors:
            self.log(f"tune T={self.T}: {len(st.errors)} kernels failed to compile, e.g. {st.errors[0]}")

    def __call__(self, cfgs, phase: str):
        if phase == "final":
            return self._final(cfgs)
        missing = self._missing(cfgs, "screen")
        self.stage("screening")
        if missing:
            self._require_bench(missing)
            self.precompile(missing)
            self.bench.rewarm()
        screen = self.calls.screen() if self.calls is not None else 0
        for c in cfgs:
            key = self._key(c, "screen")
            if self.store.get(key) is not None:
                self._drop(screen)
                continue
            with self._work(screen, trial=True):
                with tcompile.HitCounter(self.stats) if tcompile.available() else contextlib.nullcontext():
                    t = self._stamp(self.bench.trial(c, self.args.reps), "screen")
            self.store.add(t)
            self.measured += 1
        return [self.store.get(self._key(c, "screen")) for c in cfgs]

    def _final(self, cfgs):
        group = group_key(cfgs)
        planned = self.calls.final(len(cfgs)) if self.calls is not None else 0
        if not self._missing(cfgs, "final", group):
            self._drop(planned)
        else:
            self._require_bench(cfgs)
            words = f"{len(cfgs)} finalists again, {counted(self.args.final_reps, 'sample')} each, interleaved"
            self.stage(words)
            self.log(f"tune T={self.T}: timing the {words} (the search's winner stands on these)")
            with self._work(planned):
                timed = self.bench.interleaved(cfgs, self.args.final_reps)
            for t in timed:  # stored together: a kill mid-way leaves none, and the group is timed again
                self.store.add(self._stamp(t, "final", group))
        return [self.store.get(self._key(c, "final", group)) for c in cfgs]

    def recheck(self, layer, cfg: dict) -> tuple[float, str]:
        """(rel_err, error) of cfg on a second input (another routing draw), stored like a trial."""
        k = (self.layer, self.T, config_key(cfg), "recheck", 0, self.timing, "")
        t = self.store.get(k)
        if t is not None:
            self._drop(Calls.RECHECK)
            return t.rel_err, t.error
        if layer is None:
            raise RuntimeError(f"the winner's re-check at {self.T} tokens is not stored (a GPU worker failed?)")
        self.stage("the winner on a second input")
        with self._work(Calls.RECHECK):
            tb = layer.at(self.T, salt=11)
            tb.use(cfg)
            t = Trial(config=dict(cfg), layer=self.layer, tokens=self.T, phase="recheck", reps=0, timing=self.timing)
            try:
                t.rel_err = tb.check()
                if not t.rel_err <= layer.tol:
                    t.error = f"incorrect on a second input: rel_err {t.rel_err:.3g} > {layer.tol:g}"
            except Exception as e:  # noqa: BLE001 (any failure of the second check is the trial's error)
                t.error = f"{type(e).__name__}: {e}"[:200]
        self.store.add(t)
        return t.rel_err, t.error
