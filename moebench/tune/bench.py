"""One layer's experts on one device, checked and timed under a given tile config.

`TokenBench.trial` checks a config against the float32 reference (fresh NaN-filled
outputs, so a tile that skips rows cannot pass on the last trial's output), then
times the experts phase: CUDA-graph replays up to runner.graph_max_tokens, as
`runner.timing=graph` sweeps time decode sizes (eager launches of a few tiny kernels
time the host), CUDA events above, an L2 flush before each sample.

Legend: T tokens, P top-k, K hidden, I intermediate, E local experts.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional, Sequence

import torch

from moebench.kernels import registry
from moebench.kernels.interfaces import QuantSpec
from moebench.kernels.reference import TOLERANCE, reference_moe, rel_err
from moebench.kernels.triton.config import config_dtype, default_config, get_config
from moebench.measure import layer as layers
from moebench.measure import timing
from moebench.measure.workload import make_routed, reference_expert_fn, routing_spec
from moebench.tune.space import LayerDims
from moebench.tune.trials import HOST_PACED_ERROR, Trial


def build_layer(combo, device):
    """The one place the tuner gets its layer from (one rank, no process group)."""
    return layers.build_layer(combo, 0, 1, None, device)


class LayerBench:
    """The experts of combination `c` (plan.Combination) on `device`."""

    def __init__(self, c, device: torch.device, warmup: Optional[int] = None):
        # off the GPU (the interpreter) there is no clock or cache to warm: one call
        self.c, self.device = c, device
        self.warmup = warmup if warmup is not None else (3 if device.type == "cuda" else 1)
        layer = build_layer(c.combo, device)
        self.ctx, self.kernel = layer.ctx, layer.kernel
        self.experts, self.shape, self.quant = self.kernel.experts, self.ctx.shape, self.ctx.quant
        self.tol = TOLERANCE[self.quant.name]
        self.ref_w = reference_expert_fn(self.shape, self.quant, c.combo["seed"], device)
        self.kept = range(0, self.ctx.num_local_experts) if self.ctx.simulate_ep > 1 else None
        self.flush = timing.L2Flusher(device) if device.type == "cuda" else None
        self.graph_max = c.combo["graph_max_tokens"]
        self.tick: Callable[[int], None] = lambda n: None  # layer calls made (progress.Progress.tick)

    def at(self, T: int, salt: int = 7) -> "TokenBench":
        return TokenBench(self, T, salt)


def dims_of(combo: dict) -> LayerDims:
    """The layer's GEMM dimensions from a flat combination (plan.flat_combo), one rank's
    share of the experts (KernelContext.num_local_experts: local backends, world size 1)."""
    q = QuantSpec(combo["quant"])
    split = registry.ep_split(combo)  # the one TP-replaces-EP rule
    return LayerDims(
        num_experts=combo["num_experts"] // split.ep,
        intermediate=combo["intermediate"] // split.tp,  # the rank's shard (vLLM's N)
        hidden=combo["hidden"],
        topk=combo["topk"],
        operand_bytes=1 if q.is_fp8 else 2,
        block_shape=(q.block_n, q.block_k) if q.is_block else None,
    )


def rows_of(combo, shape, T: int, salt: int = 7) -> int:
    """The rows that enter the experts at T tokens per rank: T, or with backend.simulate_rank the
    M tokens the emulated rank receives (what the experts' config look-up keys on, so what a
    tuned table's entry is keyed by). Drawn on the CPU as TokenBench draws them."""
    if not combo["simulate_rank"]:
        return T
    routed = make_routed(shape, T, routing_spec(combo), 0, salt, "cpu", combo["simulate_rank"])
    return routed.inputs[0].shape[0]


def baselines_of(dims: LayerDims, quant_name: str, T: int) -> dict[str, dict]:
    """What the harness runs today at T tokens (an installed file, else the heuristic) and the heuristic."""
    dt, bs = config_dtype(quant_name), list(dims.block_shape) if dims.block_shape else None
    E, I, P = dims.num_experts, dims.intermediate, dims.topk
    return {"current": get_config(E, I, T, dt, bs, P), "heuristic": default_config(T, E, I, dt, bs, P)}


class TokenBench:
    def __init__(self, layer: LayerBench, T: int, salt: int = 7):
        self.layer, self.T = layer, T
        L, c, dev = layer, layer.c, layer.device
        # the combination's routing (docs/routing.md); with simulate_rank the M rows the emulated rank receives
        x, w, ids = make_routed(L.shape, T, routing_spec(c.combo), 0, salt, dev, c.combo["simulate_rank"]).inputs
        self.rows = x.shape[0]
        self.ref = reference_moe(x, w, ids, L.ref_w, L.kept)
        self.prepared = L.kernel.pf.prepare(x, w, ids, L.experts.input_quant)
        self.dims = dims = L.kernel._dims(self.prepared.x.shape[0])
        self.ws13, self.ws2, self.out = (
            torch.empty(s, dtype=L.experts.workspace_dtype, device=dev) for s in L.experts.workspace_shapes(*dims)
        )
        self.final = torch.empty(self.rows, L.shape.hidden, dtype=torch.bfloat16, device=dev)
        self.graph = dev.type == "cuda" and T <= L.graph_max
        self.timing = "graph" if self.graph else ("events" if dev.type == "cuda" else "host")
        self._warm = True  # the first timed config of a batch warms the clock longer

    def rewarm(self) -> None:
        """The next timed config warms the clock longer (a batch starts after a compile pause)."""
        self._warm = True

    def use(self, cfg: Optional[dict]) -> None:
        """The experts run `cfg` (None: their own look-up) from now on: a context of their own
        with the tile in its options; the layer's shared context is left as it is."""
        ex, ctx = self.layer.experts, self.layer.ctx
        ex.ctx = ctx if cfg is None else dataclasses.replace(ctx, options={**ctx.options, "triton_config": dict(cfg)})
        ex.__dict__.pop("_config_cache", None)
        # ws2's tail holds the sort scratch, sized by BLOCK_SIZE_M: a larger tile needs a larger ws2
        # (else the experts would allocate it every call, which the layer does not)
        shape2 = ex.workspace_shapes(*self.dims)[1]
        if math.prod(shape2) > self.ws2.numel():
            self.ws2 = torch.empty(shape2, dtype=ex.workspace_dtype, device=self.ws2.device)

    def apply(self) -> None:
        self.layer.experts.apply(self.out, self.prepared, self.ws13, self.ws2)

    def dry_run(self, cfg: dict) -> None:
        """Run the experts once under cfg (inside compile.Recorder: records what to compile)."""
        self.use(cfg)
        self.apply()

    def check(self) -> float:
        L = self.layer
        self.out.fill_(float("nan"))
        self.final.fill_(float("nan"))
        self.apply()
        L.tick(1)
        L.kernel.pf.finalize(self.final, self.out, self.prepared, L.experts.finalize_weight_and_reduce())
        return rel_err(self.final, self.ref)

    def trial(self, cfg: dict, reps: int) -> Trial:
        """Check cfg, then time it (`reps` samples); errors are caught into the trial."""
        t0 = time.perf_counter()
        t = Trial(config=dict(cfg), tokens=self.T, reps=reps, timing=self.timing)
        try:
            self.use(cfg)
            t.rel_err = self.check()
            if not t.rel_err <= self.layer.tol:
                t.error = f"incorrect: rel_err {t.rel_err:.3g} > {self.layer.tol:g}"
            else:
                self._record(t, self._time([self.apply], reps)[0])
        except Exception as e:  # noqa: BLE001 (any failing config is the trial's error, e.g. a tile past shared memory)
            t.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        t.seconds = time.perf_counter() - t0
        return t

    def interleaved(self, cfgs: Sequence[dict], reps: int) -> list[Trial]:
        """The configs' samples interleaved (A B C A B C ...), each checked first."""
        out = []
        for cfg in cfgs:
            t = Trial(config=dict(cfg), tokens=self.T, reps=reps, timing=self.timing, phase="final")
            try:
                self.use(cfg)
                t.rel_err = self.check()
                if not t.rel_err <= self.layer.tol:
                    t.error = f"incorrect: rel_err {t.rel_err:.3g} > {self.layer.tol:g}"
            except Exception as e:  # noqa: BLE001 (any failing config is the trial's error; the others still run)
                t.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            out.append(t)
        ok = [t for t in out if not t.error]

        def bound(cfg):
            ex, ctx = self.layer.experts, self.layer.ctx
            own = dataclasses.replace(ctx, options={**ctx.options, "triton_config": dict(cfg)})

            def fn():  # under graph capture this runs once, at capture
                ex.ctx = own
                ex.__dict__.pop("_config_cache", None)
                self.apply()

            return fn

        if ok:
            t0 = time.perf_counter()
            # graph mode captures each callable with its config set: replays need no host work
            for t, s in zip(ok, self._time([bound(dict(t.config)) for t in ok], reps), strict=True):
                self._record(t, s)
                t.seconds = (time.perf_counter() - t0) / len(ok)
        return out

    def _record(self, t: Trial, s: timing.Samples) -> None:
        """A timed trial's figures; one with host-paced samples (left after the timing loop's
        retakes with doubled holds) gets an error: its figure may be the host's launches, so
        it never wins (its figures stay, for reading)."""
        t.us, t.p20, t.p80, t.samples = s.median, s.p20, s.p80, [round(v, 3) for v in s.us]
        t.host_paced = float(s.host_paced) if self.layer.device.type == "cuda" else float("nan")
        if s.host_paced:
            t.error = (
                f"{HOST_PACED_ERROR}: {s.host_paced} of {len(s.us)} samples{s.paced_which()} started on the GPU "
                "before the host had enqueued them, with the hold doubled twice: host time, not ranked"
            )

    def _time(self, fns, reps: int) -> list[timing.Samples]:
        L = self.layer
        warm_ms = 50.0 if self._warm else 5.0
        self._warm = False
        # the host clock calls its barrier between samples, outside the timed call: off the GPU the
        # progress bar moves sample by sample there (seconds a call in the interpreter); on a GPU a
        # barrier would change how samples are taken, so the calls count when the timing ends
        host = L.device.type != "cuda"
        out = timing.time_interleaved(
            fns,
            L.device,
            reps,
            L.warmup,
            barrier=(lambda: L.tick(1)) if host else None,
            flush=L.flush,
            graph=self.graph,
            warmup_ms=warm_ms,
        )
        L.tick((L.warmup + (0 if host else reps)) * len(fns))
        return out
