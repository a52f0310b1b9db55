"""Triton config search for the `triton` experts: for each token count, every
candidate tile config is checked against the float32 reference, then its
experts phase is timed; the fastest correct one is written in vLLM's file
format (kernels/triton/config.py), so the harness and vLLM both pick it up.

Legend: T tokens, E local experts, I intermediate, K hidden, P top-k.
"""
from __future__ import annotations

import itertools
import json
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from .. import plan as planmod
from .. import timing
from ..kernels.experts.triton import CONTIGUOUS_QUANTS
from ..kernels.reference import reference_moe, rel_err
from ..kernels.triton.config import (
    CONFIG_DIR,
    config_block_shape,
    config_dtype,
    config_file_name,
    get_config,
)
from ..kernels.reference import TOLERANCE
from ..layer import build_layer
from ..workload import make_inputs, reference_expert_fn

# The search spaces, vLLM's axes. "small" is for the Triton interpreter and smoke runs;
# "decode" (few rows per expert: weight-bandwidth bound, wide weight tiles) and
# "prefill" (thousands of tokens: compute bound, 128-row tiles) are the two ends of
# "default", small enough to search several layers inside one GPU lease.
SPACES = {
    "small": dict(BLOCK_SIZE_M=[16, 32], BLOCK_SIZE_N=[64], BLOCK_SIZE_K=[64], GROUP_SIZE_M=[1], num_warps=[4], num_stages=[2]),
    # BLOCK_SIZE_M up to 64: at a mean of 16-64 rows per expert, a tile as tall as the busiest
    # expert reads its weights once where 16-row tiles read them two or more times
    "decode": dict(BLOCK_SIZE_M=[16, 32, 64], BLOCK_SIZE_N=[32, 64, 128, 256], BLOCK_SIZE_K=[64, 128, 256],
                   GROUP_SIZE_M=[1], num_warps=[4, 8], num_stages=[3, 4, 5]),
    "prefill": dict(BLOCK_SIZE_M=[128], BLOCK_SIZE_N=[128, 256], BLOCK_SIZE_K=[64, 128], GROUP_SIZE_M=[1, 16],
                    num_warps=[4, 8], num_stages=[3, 4]),
    "default": dict(BLOCK_SIZE_M=[16, 32, 64, 128], BLOCK_SIZE_N=[64, 128, 256], BLOCK_SIZE_K=[64, 128],
                    GROUP_SIZE_M=[1, 16], num_warps=[4, 8], num_stages=[3, 4, 5]),
}


def candidates(space: str, tokens: int, topk: int, num_experts: int, max_block_k: Optional[int] = None) -> list[dict]:
    """The space's configs, less BLOCK_SIZE_M tiles far larger than an expert's
    average rows (T * P / E over all E experts, at least 16): they only compute padding;
    and less K tiles wider than `max_block_k` (fp8_block: a K tile stays inside one
    scale group, so the experts would clamp it and re-run a config already tried)."""
    if space not in SPACES:
        raise ValueError(f"--space {space!r}; valid: {', '.join(SPACES)}")
    axes = SPACES[space]
    rows = max(16, tokens * topk / max(1, num_experts))
    out = []
    for values in itertools.product(*axes.values()):
        cfg = dict(zip(axes, values))
        if cfg["BLOCK_SIZE_M"] > 2 * rows and cfg["BLOCK_SIZE_M"] > min(axes["BLOCK_SIZE_M"]):
            continue
        if max_block_k is not None and cfg["BLOCK_SIZE_K"] > max_block_k:
            continue
        out.append(cfg)
    return out


@dataclass
class Trial:
    config: dict
    us: float = float("nan")  # median µs of the experts phase
    rel_err: float = float("nan")
    error: str = ""


@dataclass
class TokenResult:
    tokens: int
    default: Trial
    trials: list[Trial] = field(default_factory=list)

    @property
    def best(self) -> Optional[Trial]:
        ok = [t for t in self.trials if not t.error]
        return min(ok, key=lambda t: t.us) if ok else None


def _one_layer(overrides: list[str]):
    """The composed config of the one combination being tuned."""
    combos, _ = planmod.plan(overrides, None)
    if len(combos) != 1:
        raise ValueError(f"`moebench tune` takes one combination; these overrides give {len(combos)}")
    c = combos[0]
    if c.combo["experts"] != "triton" or c.combo["backend"] not in ("local",):
        raise ValueError("moebench tune searches the Triton experts' tiles on one GPU: use experts=triton backend=local "
                         "(backend.simulate_ep=N for an EP-N rank's share)")
    if c.combo.get("row_layout", "auto") == "contiguous":
        raise ValueError("experts.row_layout=contiguous runs kernels/triton/contiguous_gemm.py, whose tile is fixed "
                         "(DEFAULT_CONFIG, BF16_CONFIG): `moebench tune` searches the gathered kernel's tiles (kernels/configs/)")
    if c.reason:
        raise ValueError(f"this combination cannot run here: {c.reason}")
    return c


def tune(
    overrides: list[str],
    space: str = "default",
    reps: int = 20,
    warmup: int = 3,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> tuple[dict, list[TokenResult]]:
    """Search tiles for each of workload.tokens_per_rank; returns (layer info, results)."""
    if space not in SPACES:  # before the layer is built: that alone takes tens of seconds in the interpreter
        raise ValueError(f"--space {space!r}; valid: {', '.join(SPACES)}")
    # the configs tuned here are the gathered kernel's: bf16 and fp8_block must not switch to
    # the contiguous layout at large token counts (experts.row_layout=auto)
    ovs = list(overrides) + ["overlap=none", "reduction=experts"]
    c = _one_layer(ovs)
    if c.combo["quant"] in CONTIGUOUS_QUANTS and c.combo.get("row_layout", "auto") == "auto":
        c = _one_layer(ovs + ["experts.row_layout=gathered"])
    device = torch.device("cuda", torch.cuda.current_device()) if c.combo["device"] == "cuda" else torch.device("cpu")
    layer = build_layer(c.combo, 0, 1, None, device)
    ctx, weights, kernel = layer.ctx, layer.weights, layer.kernel
    experts, shape, quant = kernel.experts, ctx.shape, ctx.quant
    E, I, P = ctx.num_local_experts, shape.intermediate, shape.topk
    tol = TOLERANCE[quant.name]
    ref_w = reference_expert_fn(shape, quant, c.combo["seed"], device)
    kept = range(0, E) if ctx.simulate_ep > 1 else None
    flush = timing.L2Flusher(device) if device.type == "cuda" else None
    graph_max = c.combo["graph_max_tokens"]
    results = []
    for T in c.tokens:
        x, w, ids = make_inputs(shape, T, c.combo["routing"], c.combo["skew"], c.combo["seed"], 0, 7, device)
        ref = reference_moe(x, w, ids, ref_w, kept)
        prepared = kernel.pf.prepare(x, w, ids, experts.input_quant)
        dims = kernel._dims(prepared.x.shape[0])
        ws13, ws2, out = (torch.empty(s, dtype=experts.workspace_dtype, device=device) for s in experts.workspace_shapes(*dims))
        final = torch.empty(T, shape.hidden, dtype=torch.bfloat16, device=device)
        # decode sizes: CUDA-graph replays, as the sweeps time them (eager, a few launches of
        # tiny kernels time the host: qwen3 fp8 tiles tuned so were slower in graphs, docs/findings/tuning.md)
        graph = device.type == "cuda" and T <= graph_max

        def trial(cfg: dict) -> Trial:
            # experts built for this tile (a value in their context, nothing shared is changed)
            tiled = type(experts)(weights, experts.reduction,
                                  dataclasses.replace(ctx, options={**ctx.options, "triton_config": dict(cfg)}))
            t = Trial(config=dict(cfg))
            out.fill_(float("nan"))  # a tile that skips rows must not pass on the last trial's output
            final.fill_(float("nan"))
            try:
                tiled.apply(out, prepared, ws13, ws2)
                kernel.pf.finalize(final, out, prepared, tiled.finalize_weight_and_reduce())
                t.rel_err = rel_err(final, ref)
                if not t.rel_err <= tol:
                    t.error = f"incorrect: rel_err {t.rel_err:.3g} > {tol:g}"
                    return t
                s = timing.time_samples(lambda: tiled.apply(out, prepared, ws13, ws2), device, reps, warmup, flush=flush,
                                        graph=graph, warmup_ms=50.0)
                t.us = s.median
            except Exception as e:  # e.g. a tile that needs more shared memory than the SM has
                t.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            return t

        # what the harness runs today (an installed file, else the heuristic) competes too
        base = get_config(E, I, T, config_dtype(quant.name), config_block_shape(quant.name), P)
        res = TokenResult(tokens=T, default=trial(base))
        res.trials.append(res.default)  # so tuning never makes it worse
        max_bk = quant.block_k if quant.is_block else None
        cands = [cfg for cfg in candidates(space, T, P, shape.num_experts, max_bk) if cfg != base]
        for i, cfg in enumerate(cands):
            res.trials.append(trial(cfg))
            if (i + 1) % 10 == 0 or i + 1 == len(cands):
                b = res.best
                log(f"tune T={T}: {i + 1}/{len(cands)} configs, best {b.us:.1f} µs" if b else f"tune T={T}: {i + 1}/{len(cands)}")
        results.append(res)
    info = {
        "E": E, "N": I, "dtype": config_dtype(quant.name), "block_shape": config_block_shape(quant.name),
        "model": c.combo["model"], "quant": quant.name, "simulate_ep": ctx.simulate_ep, "device": device.type,
        "overrides": c.overrides, "space": space, "reps": reps,
        "timing": f"graph replays up to {graph_max} tokens, events above" if device.type == "cuda" else "events",
    }
    return info, results


def write(info: dict, results: list[TokenResult], out_dir: Path, install: bool = False) -> Path:
    """<out>/configs/<vLLM name>.json (best config per token count) and <out>/tune.json (every trial)."""
    best = {str(r.tokens): r.best.config for r in results if r.best}
    detail = {
        "layer": info,
        "results": [
            {"tokens": r.tokens, "default": vars(r.default), "best": vars(r.best) if r.best else None,
             "trials": [vars(t) for t in r.trials]}
            for r in results
        ],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    # first: when no config ran, the trials' errors are what the user needs to read
    (out_dir / "tune.json").write_text(json.dumps(detail, indent=2, default=str) + "\n")
    if not best:
        raise ValueError(f"no candidate config ran correctly: nothing to write (the trials' errors: {out_dir / 'tune.json'})")
    name = config_file_name(info["E"], info["N"], info["dtype"], info["block_shape"])
    cfg_dir = out_dir / "configs"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    path = cfg_dir / name
    path.write_text(json.dumps(best, indent=2, sort_keys=True) + "\n")
    if install:  # merge: keep the installed file's other token counts
        target = CONFIG_DIR / name
        merged = json.loads(target.read_text()) if target.exists() else {}
        merged.update(best)
        target.write_text(json.dumps(dict(sorted(merged.items(), key=lambda kv: int(kv[0]))), indent=2) + "\n")
    return path


def summary(results: list[TokenResult]) -> str:
    """Markdown: per token count, the current config's time, the best config and its speed-up."""
    lines = ["| tokens | current µs | best µs | speed-up | best config | configs ok / tried |", "|---:|---:|---:|---:|---|---:|"]
    for r in results:
        b = r.best
        ok = sum(1 for t in r.trials if not t.error)
        if b is None:
            lines.append(f"| {r.tokens} | {r.default.us:.1f} | – | – | none ran | 0 / {len(r.trials)} |")
            continue
        cfg = " ".join(f"{k.replace('BLOCK_SIZE_', 'B').replace('GROUP_SIZE_', 'G')}={v}" for k, v in b.config.items())
        speedup = r.default.us / b.us if r.default.us == r.default.us else float("nan")
        lines.append(f"| {r.tokens} | {r.default.us:.1f} | {b.us:.1f} | {speedup:.2f}x | {cfg} | {ok} / {len(r.trials)} |")
    return "\n".join(lines)
