"""Every CPU-valid one-rank combination matches the float32 reference on several
seeds and routings, including experts that receive no token; simulate_ep keeps
exactly the pairs routed to the kept experts. (Multi-rank combinations are
checked end to end in test_sweep_cpu.py.)"""

from __future__ import annotations

import itertools

import pytest
import torch

from moebench.kernels import registry
from moebench.kernels.interfaces import KernelContext, LayerShape, QuantSpec
from moebench.kernels.modular import MoEKernel
from moebench.kernels.prepare_finalize._common import localize_ids
from moebench.kernels.reference import TOLERANCE, reference_moe, rel_err
from moebench.measure.workload import build_expert_weights, build_shared, make_inputs, reference_expert_fn

SHAPE = LayerShape(hidden=256, intermediate=128, num_experts=8, topk=2, num_shared_experts=1, shared_intermediate=128)
CASES = [("local", "torch", red) for red in ("experts", "finalize")] + [("local_batched", "torch_batched", "finalize")]


def build(backend, experts, reduction, overlap, quant, seed, simulate_ep=1, shape=SHAPE):
    ctx = KernelContext(shape=shape, quant=QuantSpec(quant), device=torch.device("cpu"), simulate_ep=simulate_ep)
    w = build_expert_weights(ctx, seed)
    pf = registry.get_backend(backend)(ctx)
    ex = registry.get_experts(experts)(w, reduction, ctx)
    return ctx, MoEKernel(pf, ex, build_shared(shape, seed, ctx.device), overlap)


@pytest.mark.parametrize("backend, experts, reduction", CASES)
@pytest.mark.parametrize("quant", ["bf16", "fp8_block", "fp8_tensor"])
def test_matches_reference(backend, experts, reduction, quant):
    for seed, routing, T in itertools.product((0, 1), ("uniform", "balanced", "zipf"), (1, 33)):
        overlap = ("none", "combine")[seed]
        ctx, k = build(backend, experts, reduction, overlap, quant, seed)
        x, w, ids = make_inputs(SHAPE, T, routing, 1.5, seed, 0, 1, ctx.device)
        y = k(x, w, ids)
        ref = reference_moe(
            x,
            w,
            ids,
            reference_expert_fn(SHAPE, ctx.quant, seed, ctx.device),
            shared=(k.shared.w13_NK.float(), k.shared.w2_KS.float()),
        )
        err = rel_err(y, ref)
        assert err <= TOLERANCE[quant], (seed, routing, overlap, T, err)
        if T == 1:  # most experts got no token
            assert torch.unique(ids).numel() <= SHAPE.topk


def test_experts_without_tokens_and_all_on_one_expert():
    ctx, k = build("local", "torch", "finalize", "none", "bf16", 0)
    x, w, _ = make_inputs(SHAPE, 9, "uniform", 1.0, 0, 0, 1, ctx.device)
    ids = torch.tensor([[3, 5]] * 9)  # experts 0,1,2,4,6,7 idle
    ref = reference_moe(
        x,
        w,
        ids,
        reference_expert_fn(SHAPE, ctx.quant, 0, ctx.device),
        shared=(k.shared.w13_NK.float(), k.shared.w2_KS.float()),
    )
    assert rel_err(k(x, w, ids), ref) <= 2e-2


@pytest.mark.parametrize("backend, experts, reduction", CASES)
def test_simulate_ep_keeps_exactly_the_pairs_of_the_kept_experts(backend, experts, reduction):
    sim = 4
    ctx, k = build(backend, experts, reduction, "none", "bf16", 3, simulate_ep=sim)
    assert ctx.num_local_experts == SHAPE.num_experts // sim and ctx.first_local_expert == 0
    x, w, ids = make_inputs(SHAPE, 40, "uniform", 1.0, 3, 0, 1, ctx.device)
    # the prepare keeps exactly the pairs routed to experts [0, E/sim)
    prepared = k.pf.prepare(x, w, ids, None)
    kept_pairs = int((ids < SHAPE.num_experts // sim).sum())
    if prepared.expert_num_tokens_E is not None:
        assert int(prepared.expert_num_tokens_E.sum()) == kept_pairs
    else:
        assert int((prepared.topk_ids_MP >= 0).sum()) == kept_pairs
    kept = range(0, SHAPE.num_experts // sim)
    ref = reference_moe(
        x,
        w,
        ids,
        reference_expert_fn(SHAPE, ctx.quant, 3, ctx.device),
        kept_experts=kept,
        shared=(k.shared.w13_NK.float(), k.shared.w2_KS.float()),
    )
    assert rel_err(k(x, w, ids), ref) <= 2e-2
    # and differs from the all-experts output (the dropped pairs mattered)
    full = reference_moe(
        x,
        w,
        ids,
        reference_expert_fn(SHAPE, ctx.quant, 3, ctx.device),
        shared=(k.shared.w13_NK.float(), k.shared.w2_KS.float()),
    )
    assert rel_err(full, ref) > 0.1


def test_localize_ids():
    ids = torch.tensor([[0, 5], [7, 2]])
    assert localize_ids(ids, 4, 4).tolist() == [[-1, 1], [3, -1]]


def test_routings_are_valid_and_seeded():
    for routing in ("uniform", "balanced", "zipf"):
        x, w, ids = make_inputs(SHAPE, 64, routing, 1.5, 0, 0, 1, "cpu")
        x2, w2, ids2 = make_inputs(SHAPE, 64, routing, 1.5, 0, 0, 1, "cpu")
        assert torch.equal(ids, ids2) and torch.equal(x, x2)
        assert ids.shape == (64, 2) and (ids >= 0).all() and (ids < 8).all()
        assert (ids[:, 0] != ids[:, 1]).all(), "top-k experts of a token are distinct"
        assert torch.allclose(w.sum(1), torch.ones(64))
    _, _, bal = make_inputs(SHAPE, 64, "balanced", 1.0, 0, 0, 1, "cpu")
    counts = torch.bincount(bal.flatten(), minlength=8)
    assert counts.max() - counts.min() <= 1
    _, _, z = make_inputs(SHAPE, 512, "zipf", 2.0, 0, 0, 1, "cpu")
    zc = torch.bincount(z.flatten(), minlength=8).sort(descending=True).values
    assert zc[0] > 2 * zc[-1], "zipf routing has hot experts"


def test_workspace_shapes_differ_by_reduction():
    _, ke = build("local", "torch", "experts", "none", "bf16", 0)
    _, kf = build("local", "torch", "finalize", "none", "bf16", 0)
    T = 64
    diff = kf.workspace_bytes(T) - ke.workspace_bytes(T)
    assert diff == T * (SHAPE.topk - 1) * SHAPE.hidden * 2


def test_shared_experts_carveout_is_refused_below_zero_and_a_no_op_on_the_cpu():
    from moebench.kernels.modular import SharedExperts

    g = torch.Generator().manual_seed(0)
    w13, w2 = torch.randn(64, 32, generator=g).bfloat16(), torch.randn(32, 32, generator=g).bfloat16()
    x = torch.randn(5, 32, generator=g).bfloat16()
    before = torch._C._get_sm_carveout_experimental()
    assert torch.equal(SharedExperts(w13, w2, sm_carveout=8)(x), SharedExperts(w13, w2)(x))
    assert torch._C._get_sm_carveout_experimental() == before
    with pytest.raises(ValueError, match=">= 0"):
        SharedExperts(w13, w2, sm_carveout=-1)


def test_shared_experts_add_to_is_the_sum_rounded_once():
    """add_to (the layer without overlap): out += the shared experts' output inside the down GEMM
    (issue #34: no [T, K] output, no add kernel) — out + shared(x) within one bf16 rounding, the
    float32 sum closer still; and the forward declares no [T, K] shared output then."""
    from moebench.kernels.modular import SharedExperts
    from moebench.kernels.reference import silu_and_mul

    g = torch.Generator().manual_seed(1)
    w13, w2 = (torch.randn(64, 32, generator=g) / 4).bfloat16(), (torch.randn(32, 32, generator=g) / 4).bfloat16()
    x, base = torch.randn(7, 32, generator=g).bfloat16(), torch.randn(7, 32, generator=g).bfloat16()
    sh = SharedExperts(w13, w2)
    out = base.clone()
    sh.add_to(out, x)
    y = sh(x).float()
    twice = base.float() + y
    assert not torch.equal(out, base)
    # each side rounds its terms and their sum to bf16: apart by at most a few half-ulps of the terms
    assert ((out.float() - twice).abs() <= (base.float().abs() + y.abs()) * 2**-7 + 1e-3).all()
    exact = base.float() + silu_and_mul(x.float() @ w13.float().t()) @ w2.float().t()
    assert (out.float() - exact).abs().max() <= (twice.bfloat16().float() - exact).abs().max() * 1.5 + 1e-2
    assert sh.transient_bytes(7) - sh.transient_bytes(7, into_output=True) == 2 * 7 * 32


def test_layer_adds_shared_experts_in_place_only_without_overlap():
    """overlap=none: the shared experts run last and add into the output (add_to); overlap=combine
    computes them beside the combine and adds their output: the same layer within bf16 rounding."""
    ctx, kn = build("local", "torch", "experts", "none", "bf16", 1)
    _, kc = build("local", "torch", "experts", "combine", "bf16", 1)
    assert kn.shared_last and not kc.shared_last
    x, tw, ids = make_inputs(SHAPE, 16, "uniform", 1.0, 1, 0, 1, ctx.device)
    a, b = kn(x, tw, ids), kc(x, tw, ids)
    assert not torch.equal(a, kn(x, tw, ids, with_shared=False))
    assert rel_err(a, b.float()) < 1e-2
    assert kc.analytic_peak_bytes(16) - kn.analytic_peak_bytes(16) == 2 * 16 * SHAPE.hidden
