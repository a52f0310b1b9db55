"""Inputs and weights of one measured layer: seeded, so every rank can rebuild
any expert's weights for the float32 reference without communication.

Legend: T tokens, P top-k, K hidden, I intermediate, N = 2I, E experts, S shared width.
"""
from __future__ import annotations

import torch

from moebench.kernels.interfaces import ExpertWeights, KernelContext, LayerShape, QuantSpec
from moebench.kernels.modular import SharedExperts
from moebench.kernels.quant import dequant_weight, quant_weights

ROUTINGS = ("uniform", "balanced", "zipf")


def _gen(seed: int, *salt: int, device="cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    s = seed
    for x in salt:
        s = (s * 1_000_003 + x + 1) % (2**62)
    g.manual_seed(s)
    return g


def expert_weights_bf16(shape: LayerShape, e: int, seed: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Global expert e's bf16 weights (w13 [N, K], w2 [K, I]); scaled so outputs stay O(1)."""
    g = _gen(seed, 1, e, device=device)
    K, I = shape.hidden, shape.intermediate
    w13 = torch.randn(2 * I, K, generator=g, device=device) * K**-0.5
    w2 = torch.randn(K, I, generator=g, device=device) * I**-0.5
    return w13.to(torch.bfloat16), w2.to(torch.bfloat16)


def build_expert_weights(ctx: KernelContext, seed: int) -> ExpertWeights:
    """This rank's local experts, quantized as ctx.quant says."""
    first, E = ctx.first_local_expert, ctx.num_local_experts
    w13s, w2s = zip(*(expert_weights_bf16(ctx.shape, first + i, seed, ctx.device) for i in range(E)))
    w13_q, w13_s = quant_weights(torch.stack(w13s), ctx.quant)
    w2_q, w2_s = quant_weights(torch.stack(w2s), ctx.quant)
    return ExpertWeights(w13_ENK=w13_q, w2_EKI=w2_q, w13_scale=w13_s, w2_scale=w2_s, quant=ctx.quant)


def reference_expert_fn(shape: LayerShape, quant: QuantSpec, seed: int, device):
    """e -> fp32 (w13, w2) exactly as the layer stores them (dequantized fp8)."""
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    # keep every expert only while all of them fit in 2 GiB of fp32 (DeepSeek-V3 needs 45 GB)
    keep = shape.num_experts * 3 * shape.hidden * shape.intermediate * 4 <= 2 * 2**30

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


def build_shared(shape: LayerShape, seed: int, device, sm_carveout: int = 0) -> SharedExperts | None:
    """The shared experts fused into one bf16 MLP of width num_shared * shared_intermediate
    (`sm_carveout`: SMs its GEMMs leave free, see SharedExperts)."""
    if shape.num_shared_experts == 0:
        return None
    g = _gen(seed, 2, device=device)
    K, S = shape.hidden, shape.num_shared_experts * shape.shared_intermediate
    w13 = (torch.randn(2 * S, K, generator=g, device=device) * K**-0.5).to(torch.bfloat16)
    w2 = (torch.randn(K, S, generator=g, device=device) * S**-0.5).to(torch.bfloat16)
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
