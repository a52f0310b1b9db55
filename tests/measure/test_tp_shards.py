"""backend=tp's shards (issue #49): rank r holds the r-th slice of the same whole-layer weights
(routed experts quantized whole, then sliced; shared experts too), so the ranks' partial outputs
sum to the whole layer's; and TP ranks draw the same tokens. In-process: the shards' partial
sums are added by hand where the backend all-reduces them (tests/run/test_tp_ranks.py runs
the all-reduce over gloo ranks)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moebench.kernels.interfaces import KernelContext, LayerShape, QuantSpec
from moebench.kernels.quant import dequant_weight
from moebench.kernels.reference import mlp_fp32, reference_moe, rel_err
from moebench.measure.workload import (
    build_expert_weights,
    build_shared,
    full_shape,
    make_routed,
    reference_expert_fn,
    routing_spec,
    tokens_rank,
)

FULL = LayerShape(hidden=256, intermediate=512, num_experts=4, topk=2, num_shared_experts=1, shared_intermediate=256)
W = 2
CPU = torch.device("cpu")


def ctx(rank: int, quant: str) -> KernelContext:
    shard = dataclasses.replace(
        FULL, intermediate=FULL.intermediate // W, shared_intermediate=FULL.shared_intermediate // W
    )
    return KernelContext(shape=shard, quant=QuantSpec(quant), device=CPU, rank=rank, world_size=W, tp_size=W)


@pytest.mark.parametrize("quant", ["bf16", "fp8_block", "fp8_tensor"])
def test_the_shards_are_slices_of_the_whole_layers_weights(quant):
    ranks = [ctx(r, quant) for r in range(W)]
    assert full_shape(ranks[0]) == FULL and ranks[1].first_local_expert == 0 and ranks[1].num_local_experts == 4
    ref = reference_expert_fn(FULL, QuantSpec(quant), 7, CPU)
    shards = [build_expert_weights(c, 7) for c in ranks]
    i = FULL.intermediate // W
    for e in range(FULL.num_experts):
        w13, w2 = ref(e)
        for r, w in enumerate(shards):
            d13 = dequant_weight(w.w13_ENK[e : e + 1], None if w.w13_scale is None else w.w13_scale[e : e + 1], w.quant)
            d2 = dequant_weight(w.w2_EKI[e : e + 1], None if w.w2_scale is None else w.w2_scale[e : e + 1], w.quant)
            gate, up = w13[r * i : (r + 1) * i], w13[FULL.intermediate + r * i : FULL.intermediate + (r + 1) * i]
            assert torch.equal(d13[0].float(), torch.cat([gate, up]).float())
            assert torch.equal(d2[0].float(), w2[:, r * i : (r + 1) * i].float())


def test_the_shards_partial_outputs_sum_to_the_whole_layer():
    x = torch.randn(9, FULL.hidden).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(FULL.num_experts)[:2] for _ in range(9)])
    w = torch.softmax(torch.randn(9, 2), -1)
    whole_shared = build_shared(FULL, 7, CPU)
    assert whole_shared is not None
    whole = reference_moe(x, w, ids, reference_expert_fn(FULL, QuantSpec(), 7, CPU), None, None)
    whole += mlp_fp32(x, whole_shared.w13_NK, whole_shared.w2_KS)
    total = torch.zeros_like(whole)
    for r in range(W):
        c = ctx(r, "bf16")
        weights = build_expert_weights(c, 7)
        fn = lambda e, weights=weights: (weights.w13_ENK[e], weights.w2_EKI[e])
        shared = build_shared(c.shape, 7, CPU, tp_rank=r, tp_size=W)
        assert shared is not None and shared.w13_NK.shape == (FULL.shared_intermediate, FULL.hidden)
        total += reference_moe(x, w, ids, fn, None, (shared.w13_NK, shared.w2_KS))
    assert rel_err(total, whole) < 1e-5


def test_tp_ranks_draw_rank_0s_tokens():
    spec = routing_spec({"routing": "zipf", "skew": 1.2, "seed": 3, "world_size": 2, "simulate_ep": 1})
    drawn = [make_routed(ctx(r, "bf16").shape, 16, spec, tokens_rank(ctx(r, "bf16")), 2, CPU) for r in range(W)]
    for a, b in zip(drawn[0].inputs, drawn[1].inputs, strict=True):
        assert torch.equal(a, b)
    assert tokens_rank(ctx(1, "bf16")) == 0
    # EP ranks keep their own batches
    ep = KernelContext(shape=FULL, quant=QuantSpec(), device=CPU, rank=1, world_size=2)
    assert tokens_rank(ep) == 1 and ep.first_local_expert == 2
    own = make_routed(FULL, 16, spec, tokens_rank(ep), 2, CPU)
    assert not torch.equal(own.inputs[0], drawn[0].inputs[0])
