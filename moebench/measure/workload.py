"""Inputs and weights of one measured layer: seeded, so every rank can rebuild
any expert's weights for the float32 reference without communication.

Legend: T tokens, P top-k, K hidden, I intermediate, N = 2I, E experts, S shared width.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from moebench.config.limits import REFERENCE_KEEP_BYTES
from moebench.kernels import registry
from moebench.kernels.interfaces import ExpertWeights, KernelContext, LayerShape, QuantSpec
from moebench.kernels.modular import SharedExperts
from moebench.kernels.quant import dequant_weight, quant_weights
from moebench.routing import generate
from moebench.routing.generate import SYNTHETIC as ROUTINGS
from moebench.routing.generate import gen as _gen


def expert_weights_bf16(shape: LayerShape, e: int, seed: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Global expert e's bf16 weights (w13 [N, K], w2 [K, I]); scaled so outputs stay O(1)."""
    g = _gen(seed, 1, e, device=device)
    K, I = shape.hidden, shape.intermediate
    w13 = torch.randn(2 * I, K, generator=g, device=device) * K**-0.5
    w2 = torch.randn(K, I, generator=g, device=device) * I**-0.5
    return w13.to(torch.bfloat16), w2.to(torch.bfloat16)


def full_shape(ctx: KernelContext) -> LayerShape:
    """The whole layer's shape: ctx.shape, the widths times ctx.tp_size (a TP rank's shape is its shard)."""
    s, n = ctx.shape, ctx.tp_size
    return dataclasses.replace(s, intermediate=s.intermediate * n, shared_intermediate=s.shared_intermediate * n)


def tp_slice(t: torch.Tensor, dim: int, rank: int, size: int, halves: int = 1) -> torch.Tensor:
    """Rank `rank`'s 1/`size` of `t` along `dim`, split in each of `halves` equal parts (w13's
    gate and up rows: vLLM's MergedColumnParallelLinear shard); the identity for size 1."""
    if size == 1:
        return t
    parts = t.chunk(halves, dim)
    return torch.cat([p.chunk(size, dim)[rank] for p in parts], dim).contiguous()


def _shard_expert(ctx: KernelContext, e: int, seed: int):
    """(w13, w13 scale, w2, w2 scale) of global expert e [1, ...], quantized whole and then sliced to
    this rank's TP shard: rank r's slice of the weights every rank draws, so the ranks' partial
    outputs sum to the whole layer's (quantized once, as a checkpoint is: fp8_block's 128 x 128
    blocks fall inside one shard where the shard's width is a multiple of 128, which validity asks;
    fp8_tensor keeps the expert's one scale)."""
    r, n, q = ctx.rank, ctx.tp_size, ctx.quant
    w13, w2 = expert_weights_bf16(full_shape(ctx), e, seed, ctx.device)
    w13_q, w13_s = quant_weights(w13.unsqueeze(0), q)
    w2_q, w2_s = quant_weights(w2.unsqueeze(0), q)
    block = w13_s is not None and q.is_block
    return (
        tp_slice(w13_q, 1, r, n, 2),
        tp_slice(w13_s, 1, r, n, 2) if block else w13_s,
        tp_slice(w2_q, 2, r, n),
        tp_slice(w2_s, 2, r, n) if block else w2_s,
    )


def build_expert_weights(ctx: KernelContext, seed: int) -> ExpertWeights:
    """This rank's local experts, quantized as ctx.quant says (a TP rank's: its shard of each)."""
    first, E = ctx.first_local_expert, ctx.num_local_experts
    if ctx.tp_size > 1:
        parts = [_shard_expert(ctx, first + i, seed) for i in range(E)]
        w13_q, w13_s, w2_q, w2_s = (None if p[0] is None else torch.cat(p) for p in zip(*parts, strict=True))
        assert w13_q is not None and w2_q is not None
        return ExpertWeights(w13_ENK=w13_q, w2_EKI=w2_q, w13_scale=w13_s, w2_scale=w2_s, quant=ctx.quant)
    w13s, w2s = zip(*(expert_weights_bf16(ctx.shape, first + i, seed, ctx.device) for i in range(E)), strict=True)
    w13_q, w13_s = quant_weights(torch.stack(w13s), ctx.quant)
    w2_q, w2_s = quant_weights(torch.stack(w2s), ctx.quant)
    return ExpertWeights(w13_ENK=w13_q, w2_EKI=w2_q, w13_scale=w13_s, w2_scale=w2_s, quant=ctx.quant)


# The expert weights of the last combination a rank process built, on its device (one entry):
# the family's next combinations of the same model, quant, seed and expert share use them again
# (issue #33). The worker drops them before it frees the device for a combination that needs
# others, so that a row's device memory never holds two sets.
_weights: dict = {}


def weights_key(ctx: KernelContext, seed: int) -> tuple:
    """What a rank's expert weights depend on."""
    tp = (ctx.tp_size, ctx.rank) if ctx.tp_size > 1 else ()  # a TP rank's shard of the whole layer
    return (ctx.shape, ctx.quant, seed, ctx.first_local_expert, ctx.num_local_experts, str(ctx.device), *tp)


def kept_expert_weights(ctx: KernelContext, seed: int) -> ExpertWeights:
    """build_expert_weights, kept for the next combination of the same weights_key."""
    key = weights_key(ctx, seed)
    w = _weights.get(key)
    if w is None:
        _weights.clear()
        w = _weights[key] = build_expert_weights(ctx, seed)
    return w


def drop_kept_weights(unless: Optional[tuple] = None) -> None:
    """Forget the kept expert weights, except those of `unless` (a weights_key)."""
    for k in [k for k in _weights if k != unless]:
        del _weights[k]


def reference_expert_fn(shape: LayerShape, quant: QuantSpec, seed: int, device):
    """e -> fp32 (w13, w2) exactly as the layer stores them (dequantized fp8)."""
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    # keep every expert only while all of them fit in 2 GiB of fp32 (DeepSeek-V3 needs 45 GB)
    keep = shape.num_experts * 3 * shape.hidden * shape.intermediate * 4 <= REFERENCE_KEEP_BYTES

    def fn(e: int):
        if e in cache:
            return cache[e]
        w13, w2 = expert_weights_bf16(shape, e, seed, device)
        q13, s13 = quant_weights(w13.unsqueeze(0), quant)
        q2, s2 = quant_weights(w2.unsqueeze(0), quant)
        out = (dequant_weight(q13, s13, quant)[0], dequant_weight(q2, s2, quant)[0])
        if keep:
            cache[e] = out
        return out

    return fn


def build_shared(
    shape: LayerShape, seed: int, device, sm_carveout: int = 0, tp_rank: int = 0, tp_size: int = 1
) -> SharedExperts | None:
    """The shared experts fused into one bf16 MLP of width num_shared * shared_intermediate
    (`sm_carveout`: SMs its GEMMs leave free, see SharedExperts). With `tp_size` > 1, `shape` is
    a TP rank's (its shard's width) and the MLP is rank `tp_rank`'s slice of the whole one."""
    if shape.num_shared_experts == 0:
        return None
    g = _gen(seed, 2, device=device)
    K, S = shape.hidden, shape.num_shared_experts * shape.shared_intermediate * tp_size
    w13 = (torch.randn(2 * S, K, generator=g, device=device) * K**-0.5).to(torch.bfloat16)
    w2 = (torch.randn(K, S, generator=g, device=device) * S**-0.5).to(torch.bfloat16)
    w13, w2 = tp_slice(w13, 0, tp_rank, tp_size, 2), tp_slice(w2, 1, tp_rank, tp_size)
    return SharedExperts(w13, w2, sm_carveout=sm_carveout)


def make_inputs(
    shape: LayerShape, num_tokens: int, routing: str, skew: float, seed: int, rank: int, salt: int, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden [T, K] bf16, topk_weights [T, P] fp32 summing to 1, topk_ids [T, P] int64).

    uniform: each token picks P distinct experts uniformly; balanced: pairs
    dealt round-robin so every expert gets the same count (+-1); zipf: expert
    popularity ~ 1 / rank^skew (a few hot experts, many cold ones).
    """
    if routing not in ROUTINGS:
        raise ValueError(f"workload.routing={routing!r}; valid: {', '.join(ROUTINGS)}")
    T, E, P = num_tokens, shape.num_experts, shape.topk
    g = _gen(seed, 3, rank, salt, T)  # routing on the CPU: same ids on any device
    x = torch.randn(T, shape.hidden, generator=g).to(torch.bfloat16)
    if routing == "balanced":
        start = rank * T * P
        # P consecutive ids per token: distinct within a token since P <= E
        ids = (torch.arange(T * P) + start).reshape(T, P) % E
    else:
        if routing == "uniform":
            probs = torch.ones(T, E)
        else:
            pop = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** skew
            perm = torch.randperm(E, generator=_gen(seed, 4))  # which experts are hot
            probs = pop[torch.argsort(perm)].float().expand(T, E).contiguous()
        ids = torch.multinomial(probs, P, replacement=False, generator=g)
    logits = torch.randn(T, P, generator=g)
    w = torch.softmax(logits, dim=-1)
    return x.to(device), w.to(device), ids.to(torch.int64).to(device)


@dataclass
class Routed:
    """One rank's inputs for one token count (`inputs`: hidden, weights, ids on the device) and
    what the routing was: the pairs per global expert of the whole EP-N run (every rank's
    tokens where this process knows them: one rank, or the emulated run of simulate_rank), the
    replay window, the emulated rank and the tokens it receives."""

    inputs: tuple
    expert_pairs: torch.Tensor  # [E] on the CPU
    window: str = ""
    simulated_rank: Optional[int] = None
    received_tokens: Optional[int] = None


def tokens_rank(ctx: KernelContext) -> int:
    """The rank whose tokens this rank draws: its own (each EP rank holds its own batch), rank 0's
    under TP (TP ranks see the same batch: vLLM's TP group runs one sequence of tokens)."""
    return 0 if ctx.tp_size > 1 else ctx.rank


def routing_spec(combo) -> generate.RoutingSpec:
    """The combination's routing (a Combo, or any mapping with its fields); its EP size is the
    split's (kernels/split.py: a TP backend's ranks split no experts, EP size 1)."""
    layer = combo.get("routing_layer", -1)
    return generate.RoutingSpec(
        name=combo["routing"],
        skew=float(combo["skew"]),
        imbalance=float(combo.get("imbalance", 1.0)),
        seed=int(combo["seed"]),
        ep_size=registry.ep_split(combo).ep,
        file=combo.get("routing_file", "") or "",
        layer=None if layer is None or layer < 0 else layer,
    )


def _one_rank(shape: LayerShape, T: int, spec: generate.RoutingSpec, rank: int, salt: int, recording):
    """(x, w, ids, window) of rank `rank` on the CPU."""
    if spec.name in ROUTINGS:
        x, w, ids = make_inputs(shape, T, spec.name, spec.skew, spec.seed, rank, salt, "cpu")
        return x, w, ids, ""
    ids, recorded, where = generate.route(spec, shape.num_experts, shape.topk, T, rank, salt, recording)
    g = _gen(spec.seed, 3, rank, salt, T)
    x = torch.randn(T, shape.hidden, generator=g).to(torch.bfloat16)
    w = recorded if recorded is not None else torch.softmax(torch.randn(T, shape.topk, generator=g), dim=-1)
    return x, w.float(), ids, where


class _Kept:
    """Tensors kept on the CPU by key, the least recently used dropped first once they hold
    more than `max_bytes` (the newest always stays)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.items: "OrderedDict[tuple, tuple[Any, int]]" = OrderedDict()

    def get(self, key: tuple, make: Callable[[], Any], nbytes: Callable[[Any], int]) -> Any:
        hit = self.items.pop(key, None)
        if hit is None:
            value = make()
            hit = (value, nbytes(value))
        self.items[key] = hit
        while len(self.items) > 1 and sum(n for _, n in self.items.values()) > self.max_bytes:
            self.items.popitem(last=False)
        return hit[0]


# A rank process runs a family of combinations, many of them over one workload: their inputs
# and float32 references are the same draws and sums, so each is made once and kept, on the CPU
# (never counted in a row's device memory), for the combinations after it (issue #33).
_routed = _Kept(2 << 30)
_references = _Kept(4 << 30)


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _to(t: torch.Tensor, device) -> torch.Tensor:
    return t.to(device, copy=True)  # a copy, also on the CPU: the kept one stays as drawn


def make_routed(
    shape: LayerShape, T: int, spec: generate.RoutingSpec, rank: int, salt: int, device, simulate_rank: str = ""
) -> Routed:
    """Rank `rank`'s T tokens as `spec` routes them (`_draw`), on `device`: drawn once per
    process and kept for the next combinations of the same workload."""
    kept = _routed.get(
        (shape, T, spec, rank, salt, simulate_rank),
        lambda: _draw(shape, T, spec, rank, salt, simulate_rank),
        lambda r: _nbytes(*r.inputs),
    )
    return dataclasses.replace(kept, inputs=tuple(_to(t, device) for t in kept.inputs))


def cached_reference(key: tuple, compute: Callable[[], torch.Tensor], device) -> torch.Tensor:
    """The float32 reference output of `key` (a workload: shape, quant, seed, tokens, routing,
    rank, salt, kept experts, shared experts), computed once per process and kept on the CPU;
    on `device`, a copy."""
    return _to(_references.get(key, lambda: compute().cpu(), _nbytes), device)


def _draw(
    shape: LayerShape, T: int, spec: generate.RoutingSpec, rank: int, salt: int, simulate_rank: str = ""
) -> Routed:
    """Rank `rank`'s T tokens as `spec` routes them, on the CPU. With `simulate_rank` (one GPU,
    simulate_ep=N): every one of the N ranks routes T tokens, and the inputs are the tokens
    rank K (or the hottest) receives from all of them, ids renamed so its experts are the
    layer's 0 .. E/N-1 (generate.rotate)."""
    recording = None
    if spec.name == "replay":
        from moebench.routing import file

        recording = file.load(spec.file, spec.layer, shape.num_experts, shape.topk)
    E = shape.num_experts
    if not simulate_rank:
        x, w, ids, where = _one_rank(shape, T, spec, rank, salt, recording)
        return Routed((x, w, ids.to(torch.int64)), generate.expert_pairs(ids, E), where)
    N = spec.ep_size
    parts = [_one_rank(shape, T, spec, r, salt, recording) for r in range(N)]
    ids_all = torch.cat([p[2] for p in parts])
    k = generate.pick_rank(generate.rank_pairs(ids_all, E, N), simulate_rank)
    rows = generate.receive(ids_all, E, N, k)
    x = torch.cat([p[0] for p in parts])[rows]
    w = torch.cat([p[1] for p in parts])[rows]
    ids = generate.rotate(ids_all[rows], E, N, k)
    window = ""
    if recording is not None:  # rank r reads the window after rank r-1's: one span of N·T rows
        from moebench.routing.file import window as span

        window = span(recording, N * T, 0, spec.seed)[1]
    return Routed((x, w, ids), generate.expert_pairs(ids_all, E), window, k, int(rows.numel()))
