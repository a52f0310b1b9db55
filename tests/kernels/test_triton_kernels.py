"""The `triton` / `triton_batched` experts and their kernels, checked against the
float32 reference; on a machine without CUDA through Triton's interpreter.

Shapes are tiny (K=256, I=128, E=8, P=2, T<=16) and tile configs large enough
that each kernel runs a handful of programs: the interpreter is slow.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from unittest import mock

import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

from moebench.kernels.experts.triton import CONTIGUOUS_MIN_PAIRS_PER_EXPERT
from moebench.kernels.interfaces import (
    FP8_DTYPE,
    ExpertWeights,
    KernelContext,
    LayerShape,
    QuantSpec,
)
from moebench.kernels.modular import MoEKernel
from moebench.kernels.prepare_finalize.local import LocalPrepareFinalize
from moebench.kernels.prepare_finalize.local_batched import LocalBatchedPrepareFinalize
from moebench.kernels.quant import (
    dequant_weight,
    quant_fp8_per_tensor,
    quant_fp8_per_token_group,
    quant_weights,
)
from moebench.kernels.reference import reference_moe, rel_err, silu_and_mul
from moebench.kernels.registry import get_experts
from moebench.kernels.triton import config as tconfig
from moebench.kernels.triton.activation import silu_and_mul as triton_silu_and_mul
from moebench.kernels.triton.align import (
    max_padded_rows,
    moe_align_block_size,
)
from moebench.kernels.triton.contiguous_gemm import contiguous_gemm
from moebench.kernels.triton.deepgemm_layout import contiguous_scratch_numel, permute_contiguous
from moebench.kernels.triton.moe import (
    alloc_bytes,
    standard_scratch_numel,
    standard_ws2_tail_rows,
)
from moebench.kernels.triton.quant import per_tensor_quant_fp8, per_token_group_quant_fp8

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {"bf16": 2e-2, "fp8_block": 6e-2, "fp8_tensor": 1e-1}
K, I, E, P, T = 256, 128, 8, 2, 16
# few programs per launch; BLOCK_K 64 puts two K tiles in one 128-wide scale group
CFG = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=2, num_warps=4, num_stages=2)
CFG_BK64 = dict(CFG, BLOCK_SIZE_K=64)


def make_layer(
    quant: str,
    simulate_ep: int = 1,
    config: dict | None = CFG,
    seed: int = 0,
    K: int = K,
    I: int = I,
    row_layout: str = "auto",
):
    """(ctx, local ExpertWeights, e -> fp32 dequantized (w13, w2) of global expert e)."""
    q = QuantSpec(quant)
    ctx = KernelContext(LayerShape(K, I, E, P), q, DEV, simulate_ep=simulate_ep, options={"row_layout": row_layout})
    if config is not None:
        ctx.options["triton_config"] = config
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, K, generator=g) * K**-0.5).to(DEV)
    w2 = (torch.randn(E, K, I, generator=g) * I**-0.5).to(DEV)
    a, sa = quant_weights(w13, q)
    b, sb = quant_weights(w2, q)

    def ref_weights(e):
        s13 = None if sa is None else sa[e : e + 1]
        s2 = None if sb is None else sb[e : e + 1]
        return dequant_weight(a[e : e + 1], s13, q)[0], dequant_weight(b[e : e + 1], s2, q)[0]

    n = ctx.num_local_experts
    loc = lambda s: None if s is None else s[:n].contiguous()
    w = ExpertWeights(a[:n].contiguous(), b[:n].contiguous(), loc(sa), loc(sb), q)
    return ctx, w, ref_weights


def make_inputs(routing: str, num_tokens: int = T, seed: int = 1, K: int = K):
    """hidden [T, K] bf16, topk weights [T, P] fp32, topk ids [T, P] int64.

    uniform: random distinct experts; skewed: every token's first pair on expert 0,
    experts 1 and E-1 never chosen (with simulate_ep=2 too, a local expert has no token)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, K, generator=g).to(torch.bfloat16)
    logits = torch.randn(num_tokens, E, generator=g)
    if routing == "skewed":
        logits[:, 0] += 100.0
        logits[:, [1, E - 1]] -= 100.0
    ids = torch.topk(logits, P, dim=1).indices
    if routing == "skewed":  # the skewed cases exist for these empty experts
        assert (ids[:, 0] == 0).all() and not ((ids == 1) | (ids == E - 1)).any(), ids
    w = torch.rand(num_tokens, P, generator=g) + 0.1
    w = w / w.sum(1, keepdim=True)
    return x.to(DEV), w.to(DEV), ids.to(DEV)


KERNELS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(tconfig.__file__))) + os.sep


@contextlib.contextmanager
def recorded_allocations():
    """Yields a list that collects the caching-allocator bytes (512-byte blocks) of each
    tensor code under kernels/ creates with torch.empty / torch.zeros in the block: a
    CPU has no allocator statistics, and the Triton experts' apply() allocates through these alone."""
    sizes: list[int] = []

    def recording(fn):
        def alloc(*args, **kwargs):
            t = fn(*args, **kwargs)
            if sys._getframe(1).f_code.co_filename.startswith(KERNELS_DIR):
                sizes.append(alloc_bytes(t.untyped_storage().nbytes()))
            return t

        return alloc

    with (
        mock.patch.object(torch, "empty", recording(torch.empty)),
        mock.patch.object(torch, "zeros", recording(torch.zeros)),
    ):
        yield sizes


def run_layer(
    layout, quant, reduction, simulate_ep=1, routing="uniform", prequant=True, config=CFG, K=K, I=I, row_layout="auto"
):
    """Experts.apply on NaN-filled workspaces (its allocations against transient_bytes),
    then the backend's finalize -> rel_err vs reference."""
    ctx, w, ref_weights = make_layer(quant, simulate_ep, config, K=K, I=I, row_layout=row_layout)
    batched = layout == "batched"
    pf = (LocalBatchedPrepareFinalize if batched else LocalPrepareFinalize)(ctx)
    experts = get_experts("triton_batched" if batched else "triton")(w, reduction, ctx)
    x, tw, ids = make_inputs(routing, K=K)
    # prequant=False: the dispatch carries bf16 and the experts quantize
    prepared = pf.prepare(x, tw, ids, experts.input_quant if prequant else None)
    rows = prepared.x.shape[1] if batched else prepared.x.shape[0]
    shapes = experts.workspace_shapes(rows, 2 * I, K, P, ctx.num_local_experts)
    # NaN everywhere: anything read before it is written poisons the result
    ws13, ws2, out = (torch.full(s, float("nan"), dtype=torch.bfloat16, device=DEV) for s in shapes)
    with recorded_allocations() as allocated:
        experts.apply(out, prepared, ws13, ws2)
    # what apply() allocated beyond the workspaces is what it declares
    assert sum(allocated) == experts.transient_bytes(rows, 2 * I, K, P, ctx.num_local_experts), allocated
    if row_layout != "auto":
        assert experts.last_layout == row_layout
    if not batched and quant in ("bf16", "fp8_block"):  # no GPU: the contiguous GEMMs are Triton's (auto)
        assert experts.last_gemm == ("triton/triton" if experts.last_layout == "contiguous" else "")
    if not batched and reduction == "finalize":
        local = prepared.topk_ids_MP.reshape(-1) >= 0
        rows_RK = out.view(-1, K)
        assert torch.isfinite(rows_RK).all()
        assert (rows_RK[~local] == 0).all(), "rows of non-local pairs must be zero"
    y = torch.empty(T, K, dtype=torch.bfloat16, device=DEV)
    pf.finalize(y, out, prepared, experts.finalize_weight_and_reduce())
    ref = reference_moe(x, tw, ids, ref_weights, kept_experts=range(ctx.num_local_experts))
    return rel_err(y, ref)


# -- end to end ---------------------------------------------------------------

STANDARD_CASES = [
    # (quant, reduction, simulate_ep, routing, prequant, config)
    ("bf16", "experts", 1, "skewed", True, CFG),
    ("bf16", "experts", 2, "uniform", True, CFG),  # non-local pairs in the atomic reduce
    ("bf16", "finalize", 2, "uniform", True, None),  # the default heuristic config
    ("bf16", "finalize", 2, "skewed", True, CFG),  # zero rows of non-local pairs beside an empty local expert
    ("fp8_block", "experts", 1, "skewed", True, CFG_BK64),
    ("fp8_block", "finalize", 2, "uniform", False, CFG),  # experts quantize a bf16 input
    ("fp8_tensor", "experts", 2, "skewed", False, CFG),
    ("fp8_tensor", "finalize", 1, "uniform", True, CFG),
    ("fp8_tensor", "finalize", 2, "skewed", True, CFG),
]


@pytest.mark.parametrize("quant,reduction,simulate_ep,routing,prequant,config", STANDARD_CASES)
def test_standard_matches_reference(quant, reduction, simulate_ep, routing, prequant, config):
    err = run_layer("standard", quant, reduction, simulate_ep, routing, prequant, config)
    assert err <= TOL[quant], f"rel_err {err:.3g} > {TOL[quant]}"


@pytest.mark.parametrize("quant", ["bf16", "fp8_block"])
@pytest.mark.parametrize("atomic", [False, True], ids=["store", "weighted-atomic-add"])
def test_the_weights_by_tma_equal_the_pointer_loads(quant, atomic):
    """gemm.py's B_TMA (a tuned decision: the gathered kernel's weight tiles through a host TMA
    descriptor over w as [E * N, K]) gives the pointer path's output bit for bit: the same tiles in
    the same order, in both epilogues (store, and the down GEMM's weighted atomic add); N past the
    last whole tile (the descriptor's rows run into the next expert's or its zero fill, never
    stored)."""
    from moebench.kernels.triton import align, gemm
    from moebench.kernels.triton import quant as tq

    g = torch.Generator().manual_seed(3)
    E, N, Kx, M = 4, 192, 256, 12
    w = torch.randn(E, N, Kx, generator=g) * 0.05
    x = torch.randn(M, Kx, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:P] for _ in range(M)]).to(torch.int32)
    cfg = dict(CFG, BLOCK_SIZE_K=128 if quant == "fp8_block" else 64)
    if quant == "fp8_block":
        ws = torch.rand(E, -(-N // 128), Kx // 128, generator=g) * 0.01 + 0.005
        w, (a, a_s), mode = w.to(FP8_DTYPE), tq.per_token_group_quant_fp8(x, 128), gemm.QUANT_BLOCK
    else:
        ws, w, a, a_s, mode = None, w.to(torch.bfloat16), x, None, gemm.QUANT_NONE
    sorted_ids, expert_ids, num_post = align.moe_align_block_size(ids, E, cfg["BLOCK_SIZE_M"])
    tw = torch.rand(M * P, generator=g)
    outs = []
    for b_tma in (False, True):
        c = torch.zeros((M, N) if atomic else (M * P, N), dtype=torch.float32 if atomic else torch.bfloat16)
        gemm.invoke_fused_moe_gemm(
            a,
            a_s,
            w,
            ws,
            c,
            sorted_ids,
            expert_ids,
            num_post,
            M * P,
            dict(cfg, B_TMA=b_tma),
            quant=mode,
            a_row_div=P,
            c_row_div=P if atomic else 1,
            topk_weights=tw if atomic else None,
            atomic_add=atomic,
        )
        outs.append(c)
    assert outs[0].abs().sum() > 0 and torch.equal(outs[0], outs[1])
    assert gemm.b_tma_error(w[:, :, :200], cfg) is not None  # a strided view: no descriptor


@pytest.mark.parametrize("quant", ["bf16", "fp8_block"])
def test_the_layer_with_the_weights_by_tma_matches_the_reference(quant):
    """The whole gathered layer with B_TMA in its tile (as the tuner's gathered-btma option runs it)."""
    cfg = dict(CFG_BK64 if quant == "bf16" else CFG, B_TMA=True)
    err = run_layer("standard", quant, "experts", 2, "uniform", True, cfg, row_layout="gathered")
    assert err <= TOL[quant], f"rel_err {err:.3g} > {TOL[quant]}"


@pytest.mark.parametrize(
    "reduction,simulate_ep,routing,prequant",
    [
        ("experts", 1, "skewed", True),  # an expert without rows, one with most
        ("finalize", 2, "uniform", False),  # pairs of other ranks; the permute quantizes a bf16 input
        ("finalize", 2, "skewed", True),  # pairs of other ranks beside an empty local expert
    ],
)
def test_standard_fp8_block_contiguous_layout(reduction, simulate_ep, routing, prequant):
    err = run_layer("standard", "fp8_block", reduction, simulate_ep, routing, prequant, row_layout="contiguous")
    assert err <= TOL["fp8_block"], f"rel_err {err:.3g} > {TOL['fp8_block']}"


@pytest.mark.parametrize(
    "reduction,simulate_ep,routing,K_,I_",
    [
        ("experts", 2, "skewed", K, I),  # pairs of other ranks, an expert without rows
        ("finalize", 1, "uniform", K, I),
        ("finalize", 2, "uniform", 128, 256),  # hidden < intermediate: ws13 holds the wider activation
        ("finalize", 2, "skewed", K, I),  # pairs of other ranks beside an empty local expert
        ("experts", 1, "skewed", 384, 128),  # N = 384 for the down GEMM: BLOCK_SIZE_N falls back to 128
    ],
)
def test_standard_bf16_contiguous_layout(reduction, simulate_ep, routing, K_, I_):
    err = run_layer("standard", "bf16", reduction, simulate_ep, routing, row_layout="contiguous", K=K_, I=I_)
    assert err <= TOL["bf16"], f"rel_err {err:.3g} > {TOL['bf16']}"


def test_row_layout_choice():
    ctx, w, _ = make_layer("fp8_block", simulate_ep=2)
    ex = get_experts("triton")(w, "experts", ctx)
    local = ctx.num_local_experts  # 4 of 8: about half of a row's picks are local
    need = CONTIGUOUS_MIN_PAIRS_PER_EXPERT["fp8_block"] * local * 2 // P  # rows for that many local pairs per expert
    assert not ex.contiguous(need - 1, P) and ex.contiguous(need, P)
    dims = (2 * I, K, P, local)
    mp = max_padded_rows(need * P, local, 128)
    assert ex.workspace_shapes(need, *dims)[:2] == ((mp, (K + K // 32) // 2), (mp, max(2 * I, K)))
    # gathered: ws2's activation rows, then the rows that hold the sort scratch
    bm = ex._config(need - 1, P)["BLOCK_SIZE_M"]
    tail = standard_ws2_tail_rows(need - 1, P, local, bm, I)
    assert 0 < tail * I * 2 - 4 * standard_scratch_numel(need - 1, P, local, bm) <= 2 * I + 16
    assert ex.workspace_shapes(need - 1, *dims)[:2] == (((need - 1) * P, 2 * I), ((need - 1) * P + tail, I))
    ctx.options["row_layout"] = "gathered"
    assert not get_experts("triton")(w, "experts", ctx).contiguous(need, P)
    ctx.options["row_layout"] = "contiguous"
    assert get_experts("triton")(w, "experts", ctx).contiguous(1, P)
    ctx.options["row_layout"] = "sorted"
    with pytest.raises(ValueError, match="gathered"):
        get_experts("triton")(w, "experts", ctx).contiguous(1, P)
    bf16_ctx, bf16_w, _ = make_layer("bf16", simulate_ep=2)
    bf16 = get_experts("triton")(bf16_w, "experts", bf16_ctx)
    bneed = CONTIGUOUS_MIN_PAIRS_PER_EXPERT["bf16"] * local * 2 // P
    assert not bf16.contiguous(bneed - 1, P) and bf16.contiguous(bneed, P)
    mp = max_padded_rows(bneed * P, local, 128)
    assert bf16.workspace_shapes(bneed, *dims)[:2] == ((mp, K), (mp, max(2 * I, K)))  # bf16 rows: no scales
    tctx, tw, _ = make_layer("fp8_tensor", row_layout="contiguous")
    with pytest.raises(ValueError, match="fp8_tensor"):
        get_experts("triton")(tw, "experts", tctx).contiguous(need, P)
    tctx.options["row_layout"] = "auto"
    assert not get_experts("triton")(tw, "experts", tctx).contiguous(10**6, P)


@pytest.mark.parametrize(
    "cfg,programs,quant",
    [
        (dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64), 3, "fp8_block"),  # persistent: programs walk several tiles
        (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256), None, "fp8_block"),  # a tile spans two weight-scale blocks
        (dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128), 5, "bf16"),
        # issue #35's option: only the row tiles in use walked (BOUNDED)
        # (M = 160: expert 3 gets more than 128 pairs, so its segment has a second row tile)
        (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BOUNDED=True, M=160), 3, "fp8_block"),
        (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BOUNDED=True), None, "fp8_block"),
        (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BOUNDED=True, M=160), 5, "bf16"),
    ],
)
def test_contiguous_gemm(cfg, programs, quant):
    g = torch.Generator().manual_seed(3)
    cfg = dict(cfg)
    M, Kc, N, Ec = cfg.pop("M", 40), 256, 256, 4
    x = torch.randn(M, Kc, generator=g).to(torch.bfloat16).to(DEV)
    ids = torch.randint(0, Ec, (M, P), generator=g, dtype=torch.int32)
    ids[ids == 2] = 3  # expert 2 gets no row
    ids[0, 0] = -1  # a pair of another rank
    ids = ids.to(DEV)
    mp = max_padded_rows(M * P, Ec, 128)
    a = torch.empty(mp, Kc, dtype=FP8_DTYPE, device=DEV)
    a_s = torch.empty(Kc // 128, mp, device=DEV).t()
    scratch = torch.empty(contiguous_scratch_numel(M * P, Ec, 128), dtype=torch.int32, device=DEV)
    lay = permute_contiguous(x, None, ids, Ec, 128, a, a_s, scratch)
    w = (torch.randn(Ec, N, Kc, generator=g) * 0.1).to(FP8_DTYPE).to(DEV)
    ws = (torch.rand(Ec, N // 128, Kc // 128, generator=g) + 0.5).to(DEV)
    c = torch.full((mp, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    rows = lay.m_indices_Mp.long()
    valid = rows >= 0
    assert int(valid.sum()) == M * P - 1
    if quant == "bf16":  # the same rows and weights, dequantized to bf16
        a = (a.float() * a_s.repeat_interleave(128, 1)).to(torch.bfloat16)
        w = (w.float() * ws.repeat_interleave(128, 1).repeat_interleave(128, 2)).to(torch.bfloat16)
        a_s = ws = None
        af, wf = a.float(), w.float()
    else:
        af = a.float() * a_s.repeat_interleave(128, 1)
        wf = w.float() * ws.repeat_interleave(128, 1).repeat_interleave(128, 2)
    m_idx = lay.m_indices_Mp
    bounded = cfg.get("BOUNDED")
    if bounded:  # rows past the rows in use given a real expert: only a bounded walk leaves them unwritten
        m_idx = m_idx.clone()
        m_idx[int(lay.num_post) :] = 0
    contiguous_gemm(a, a_s, w, ws, c, m_idx, config=cfg, num_programs=programs, rows_in_use=lay.num_post)
    ref = torch.einsum("rk,rnk->rn", af[valid], wf[rows[valid]])
    assert rel_err(c[valid], ref) < 1e-2
    used = int(lay.num_post)  # every expert's segment, 128-padded; the rows past it untouched
    # BOUNDED's premise: every 128-row tile below the rows in use starts on a valid row
    assert used % 128 == 0 and bool(valid[0:used:128].all()) and not bool(valid[used:].any())
    if M > 128:
        assert int(rows[valid].bincount().max()) > 128  # an expert with two row tiles
    assert (
        c[used:].isnan().all()
    )  # padding tiles: skipped (CHECK) or, numbered as expert 0 above, never walked (BOUNDED)


# weight scales in [0.5, 1.5): a tile that reads another group's scale, or one scale for a
# tile spanning two groups, misses by far more than fp8 rounding. 64/128-wide tiles take
# one scale per K tile (folded into the row scales), 256-wide tiles one per column group;
# N = 200 wraps the last tile's columns
FP8_GEMM_CASES = [(bn, n) for bn in (64, 128, 256) for n in (256, 384, 200)]


def _block_fp8_weights(g, e, n, k):
    w = (torch.randn(e, n, k, generator=g) * 0.1).to(FP8_DTYPE)
    ws = torch.rand(e, (n + 127) // 128, k // 128, generator=g) + 0.5
    wf = w.float() * ws.repeat_interleave(128, 1)[:, :n].repeat_interleave(128, 2)
    return w.to(DEV), ws.to(DEV), wf


@pytest.mark.parametrize("layout", ["gathered", "batched"])
@pytest.mark.parametrize("block_n,N", FP8_GEMM_CASES)
def test_block_fp8_gemm_weight_scales_per_tile_width(layout, block_n, N):
    from moebench.kernels.triton import gemm

    g = torch.Generator().manual_seed(block_n + N)
    Kc, Ec = 256, 3
    w, ws, wf = _block_fp8_weights(g, Ec, N, Kc)
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=128, GROUP_SIZE_M=2)
    if layout == "gathered":
        rows = 20
        ids = torch.randint(0, Ec, (rows, P), generator=g)
        a = (torch.randn(rows, Kc, generator=g) * 0.5).to(FP8_DTYPE)
        a_s = torch.rand(rows, Kc // 128, generator=g) + 0.5
        sorted_ids, expert_ids, num_post = moe_align_block_size(ids.to(DEV), Ec, 16)
        c = torch.full((rows * P, N), float("nan"), dtype=torch.bfloat16, device=DEV)
        gemm.invoke_fused_moe_gemm(
            a.to(DEV),
            a_s.to(DEV),
            w,
            ws,
            c,
            sorted_ids,
            expert_ids,
            num_post,
            rows * P,
            cfg,
            quant=gemm.QUANT_BLOCK,
            a_row_div=P,
        )
        af = a.float() * a_s.repeat_interleave(128, 1)
        ref = torch.einsum("rk,rnk->rn", af[torch.arange(rows * P) // P], wf[ids.reshape(-1)])
        assert rel_err(c.cpu(), ref) < 1e-2
    else:
        X, counts = 24, torch.tensor([5, 0, 24], dtype=torch.int32)
        a = (torch.randn(Ec, X, Kc, generator=g) * 0.5).to(FP8_DTYPE)
        a_s = torch.rand(Ec, X, Kc // 128, generator=g) + 0.5
        c = torch.full((Ec, X, N), float("nan"), dtype=torch.bfloat16, device=DEV)
        gemm.invoke_batched_moe_gemm(a.to(DEV), a_s.to(DEV), w, ws, c, counts.to(DEV), cfg, quant=gemm.QUANT_BLOCK)
        af = a.float() * a_s.repeat_interleave(128, 2)
        for e, n in enumerate(counts.tolist()):
            if n:
                assert rel_err(c[e, :n].cpu(), af[e, :n] @ wf[e].T) < 1e-2, e


BATCHED_CASES = [
    ("bf16", 2, "skewed", True),
    ("fp8_block", 1, "skewed", True),
    ("fp8_block", 2, "uniform", False),
    ("fp8_tensor", 2, "skewed", True),
    ("fp8_tensor", 1, "uniform", False),
]


@pytest.mark.parametrize("quant,simulate_ep,routing,prequant", BATCHED_CASES)
def test_batched_matches_reference(quant, simulate_ep, routing, prequant):
    err = run_layer("batched", quant, "finalize", simulate_ep, routing, prequant)
    assert err <= TOL[quant], f"rel_err {err:.3g} > {TOL[quant]}"


@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
def test_batched_quantizes_a_bf16_input_into_the_output(quant):
    """Behind pplx / deepep_ll fp8_tensor travels bf16: the batched experts quantize it into
    the output's bytes (read by the gate/up GEMM before the down GEMM writes there), so
    apply() allocates no [E, X, K] copy: run_layer checks its allocations against
    transient_bytes, which at DeepSeek-V3's EP-8 share (X = 1024) is the fp8_tensor scratch."""
    err = run_layer("batched", quant, "finalize", simulate_ep=2, routing="skewed", prequant=False)
    assert err <= TOL[quant], f"rel_err {err:.3g} > {TOL[quant]}"
    ctx, w, _ = make_layer(quant)
    ex = get_experts("triton_batched")(w, "finalize", ctx)
    assert ex.transient_bytes(1024, 4096, 7168, 8, 32) == (0 if quant == "fp8_block" else 512)
    assert ex.transient_bytes(0, 4096, 7168, 8, 32) == 0  # no rows: apply returns before allocating


@pytest.mark.parametrize("quant", ["bf16", "fp8_block"])
def test_batched_on_pplx_sized_buffers(quant):
    """The buffers pplx hands DeepSeek-V3 on 2 ranks: X = 2 x 512 = 1024 rows an expert,
    with the config the experts pick from X (the heuristic's 64 x 128 tiles, GROUP_SIZE_M 8);
    counts 48 (one M tile, as at 512 tokens), 130 (a partial third tile) and X (every tile).
    Rows past a count hold NaN (bf16 rows, fp8 scales), as stale buffer rows may."""
    from moebench.kernels.quant import dequant_activations, quant_activations
    from moebench.kernels.triton.moe import fused_moe_batched

    q = QuantSpec(quant)
    En, X, Kx, Ix = 3, 1024, 256, 128
    cfg = tconfig.get_config(
        128, 2048, X, tconfig.config_dtype(quant), tconfig.config_block_shape(quant), device="nowhere"
    )
    assert (cfg["BLOCK_SIZE_M"], cfg["GROUP_SIZE_M"]) == (64, 8), cfg
    g = torch.Generator().manual_seed(5)
    a, sa = quant_weights((torch.randn(En, 2 * Ix, Kx, generator=g) * Kx**-0.5).to(DEV), q)
    b, sb = quant_weights((torch.randn(En, Kx, Ix, generator=g) * Ix**-0.5).to(DEV), q)
    w = ExpertWeights(a, b, sa, sb, q)
    counts = torch.tensor([48, 130, X], dtype=torch.int32, device=DEV)
    x = torch.randn(En, X, Kx, generator=g).to(torch.bfloat16).to(DEV)
    rows = torch.arange(X, device=DEV)[None, :] < counts[:, None]
    if q.is_block:
        xq, xs = quant_activations(x.view(-1, Kx), q)
        xin = dequant_activations(xq, xs, q).view(En, X, Kx)
        xq, xs = xq.view(En, X, Kx), xs.view(En, X, -1)
        xs = xs.masked_fill(~rows[..., None], float("nan"))
    else:
        xq, xs, xin = x.masked_fill(~rows[..., None], float("nan")), None, x.float()
    ws13 = torch.full((En, X, 2 * Ix), float("nan"), dtype=torch.bfloat16, device=DEV)
    ws2 = torch.full((En, X, Ix), float("nan"), dtype=torch.bfloat16, device=DEV)
    out = torch.full((En, X, Kx), float("nan"), dtype=torch.bfloat16, device=DEV)
    fused_moe_batched(xq, xs, counts, w, out, ws13, ws2, cfg)
    for e, n in enumerate(counts.tolist()):
        w13 = dequant_weight(a[e : e + 1], None if sa is None else sa[e : e + 1], q)[0]
        w2 = dequant_weight(b[e : e + 1], None if sb is None else sb[e : e + 1], q)[0]
        ref = silu_and_mul(xin[e, :n].float() @ w13.T) @ w2.T
        assert rel_err(out[e, :n], ref) <= TOL[quant], (e, n)


@pytest.mark.parametrize(
    "layout,reduction,quant", [("standard", "experts", "bf16"), ("batched", "finalize", "fp8_tensor")]
)
def test_sizes_off_the_tile_grid(layout, reduction, quant):
    """K=200, I=72: masked K tiles, N (144, 200) not a multiple of BLOCK_N, I not of the SiLU tile."""
    err = run_layer(layout, quant, reduction, simulate_ep=2, routing="skewed", K=200, I=72)
    assert err <= TOL[quant], f"rel_err {err:.3g} > {TOL[quant]}"


@pytest.mark.parametrize(
    "layout,reduction", [("standard", "experts"), ("standard", "finalize"), ("batched", "finalize")]
)
def test_moe_kernel_forward(layout, reduction):
    """Through MoEKernel (its own workspaces), fp8_block, simulate_ep=2."""
    ctx, w, ref_weights = make_layer("fp8_block", simulate_ep=2)
    pf = (LocalBatchedPrepareFinalize if layout == "batched" else LocalPrepareFinalize)(ctx)
    experts = get_experts("triton_batched" if layout == "batched" else "triton")(w, reduction, ctx)
    x, tw, ids = make_inputs("skewed")
    y = MoEKernel(pf, experts)(x, tw, ids)
    ref = reference_moe(x, tw, ids, ref_weights, kept_experts=range(ctx.num_local_experts))
    assert rel_err(y, ref) <= TOL["fp8_block"]


# -- kernels ------------------------------------------------------------------


@pytest.mark.parametrize("block_m", [16, 32])
def test_align_block_size(block_m):
    g = torch.Generator().manual_seed(3)
    num_e = 6
    ids = torch.randint(-1, num_e - 1, (13, 3), generator=g)  # -1 pairs, expert 5 empty
    ids[:8, 0] = 0  # skewed
    sorted_ids, expert_ids, num_post = moe_align_block_size(ids.to(DEV), num_e, block_m)
    n = int(num_post)
    flat = ids.reshape(-1)
    counts = torch.bincount(flat[flat >= 0], minlength=num_e)
    assert n == int(((counts + block_m - 1) // block_m * block_m).sum())
    seen = []
    for b in range(n // block_m):
        e = int(expert_ids[b])
        assert 0 <= e < num_e and counts[e] > 0
        for pair in sorted_ids[b * block_m : (b + 1) * block_m].tolist():
            if pair != flat.numel():  # padding sentinel
                assert int(flat[pair]) == e
                seen.append(pair)
    assert sorted(seen) == torch.nonzero(flat >= 0).squeeze(1).tolist()


def test_activation_quant_matches_torch():
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(24, 256, generator=g) * 3).to(torch.bfloat16).to(DEV)
    q, s = per_token_group_quant_fp8(x)
    q_ref, s_ref = quant_fp8_per_token_group(x)
    torch.testing.assert_close(s, s_ref)
    assert q.dtype == FP8_DTYPE and (q.float() == q_ref.float()).float().mean() > 0.999
    q, s = per_tensor_quant_fp8(x)
    q_ref, s_ref = quant_fp8_per_tensor(x)
    torch.testing.assert_close(s, s_ref)
    assert (q.float() == q_ref.float()).float().mean() > 0.999


def test_silu_and_mul_matches_reference():
    g = torch.Generator().manual_seed(5)
    rows, block_m = 20, 16
    h = torch.randn(rows, 2 * I, generator=g).to(torch.bfloat16).to(DEV)
    ids = torch.zeros(rows, 1, dtype=torch.long, device=DEV)
    ids[3] = -1  # not local: its row must not be touched
    sorted_ids, _, num_post = moe_align_block_size(ids, 1, block_m)
    out = torch.full((rows, I), 7.0, dtype=torch.bfloat16, device=DEV)
    triton_silu_and_mul(h, out, sorted_ids=sorted_ids, num_post=num_post, num_pairs=rows)
    ref = silu_and_mul(h.float())
    keep = torch.arange(rows, device=DEV) != 3
    assert rel_err(out[keep], ref[keep]) < 1e-2
    assert (out[3] == 7.0).all()


def test_kernels_compile_for_sm90():
    """The interpreter skips Triton's frontend checks and GPU passes: lower every
    kernel variant to an sm_90 cubin (no GPU needed; ptxas ships with triton)."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "moebench.kernels.triton.compile_check", "--quick", "--arch", "90"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


def test_compile_check_flags_a_kernel_whose_wgmmas_ptxas_serializes():
    """issue #35's Gluon kernels exist to keep WGMMAs in flight beside the promotion: ptxas's
    serialization warnings (C751x) are what compile_check fails the warp-specialized one on.
    The pipelined kernel draws them (its partial tiles swap registers inside a WGMMA chain),
    the warp-specialized one does not, with its block scales one or two K steps ahead or its
    output TMA-stored. (A process without TRITON_INTERPRET, as the test above.)"""
    pytest.importorskip("triton.backends.nvidia")
    code = """if True:
        from moebench.kernels.triton import compile_check as cc
        from moebench.kernels.triton import gluon_contiguous as g
        consts = dict(K=2048, GROUP_N=128, GROUP_SIZE_M=8, STAGES=4)
        from moebench.kernels.triton.gluon_pipelined import gluon_fp8_pipelined_kernel

        pipelined = cc._compile(gluon_fp8_pipelined_kernel, g.signature_types(), dict(consts, num_warps=8), 90, 8, 1)
        assert "C751" in cc._wgmma_serialized(pipelined.asm["ptx"], 90)
        # (scales 1 or 2 K steps ahead; a TMA-store epilogue)
        for ahead, epi_tma in ((1, False), (2, False), (1, True)):
            types, epi = g.ws_constexprs(epi_tma)
            ws = cc._compile(g._gluon_fp8_ws_kernel, dict(g.signature_types(), **types),
                             dict(consts, num_warps=4, SCALE_AHEAD=ahead, **epi), 90, 4, 1)
            assert cc._wgmma_serialized(ws.asm["ptx"], 90) == ""
            assert ws.metadata.num_warps == 12  # a producer warp group and two math warp groups
        print("ok")
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout[-4000:] + res.stderr[-4000:]


# -- configs, validity, workspaces --------------------------------------------


def test_config_file_name_matches_vllm():
    name = tconfig.config_file_name(128, 768, "fp8_w8a8", [128, 128], device="NVIDIA H200")
    assert name == "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert (
        tconfig.config_file_name(32, 2048, None, None, device="NVIDIA_H200")
        == "E=32,N=2048,device_name=NVIDIA_H200.json"
    )
    assert (
        tconfig.config_file_name(8, 128, "fp8_w8a8", None, device="x") == "E=8,N=128,device_name=x,dtype=fp8_w8a8.json"
    )


def test_config_lookup_nearest(tmp_path, monkeypatch):
    def entry(bm):
        return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=64, BLOCK_SIZE_K=256, GROUP_SIZE_M=1, num_warps=4, num_stages=3)

    data = {"1": entry(16), "64": entry(32), "1024": entry(128)}
    name = tconfig.config_file_name(8, 128, "fp8_w8a8", [128, 128], device="testgpu")
    (tmp_path / name).write_text(json.dumps(data))
    monkeypatch.setenv(tconfig.CONFIG_DIR_ENV, str(tmp_path))
    get = lambda m: tconfig.get_config(8, 128, m, "fp8_w8a8", [128, 128], device="testgpu")
    assert get(1)["BLOCK_SIZE_M"] == 16
    assert get(40)["BLOCK_SIZE_M"] == 32
    assert get(600)["BLOCK_SIZE_M"] == 128
    assert get(5000)["BLOCK_SIZE_M"] == 128  # above the largest entry: the largest entry
    # a file tuned at one large size decides only sizes within 2x below it
    only = tconfig.config_file_name(128, 768, None, None, device="testgpu")
    (tmp_path / only).write_text(json.dumps({"16384": dict(entry(128), BLOCK_SIZE_N=256, BLOCK_SIZE_K=64)}))
    one = lambda m: tconfig.get_config(128, 768, m, None, None, device="testgpu")
    assert one(16384)["BLOCK_SIZE_N"] == 256 and one(9000)["BLOCK_SIZE_N"] == 256 and one(40000)["BLOCK_SIZE_N"] == 256
    assert one(16) == tconfig.default_config(16, 128, 768) and one(16)["BLOCK_SIZE_M"] <= 32
    assert one(4096) == tconfig.default_config(4096, 128, 768)
    assert get(64)["BLOCK_SIZE_K"] == 128  # capped to the 128-wide scale group
    # no file: the heuristic (small M memory-bound, large M compute-bound)
    small = tconfig.get_config(128, 768, 16, None, None, device="nowhere")
    large = tconfig.get_config(128, 768, 16384, None, None, device="nowhere")
    assert small["BLOCK_SIZE_M"] <= 32 and large["BLOCK_SIZE_M"] >= 64 and large["BLOCK_SIZE_N"] == 128


def test_supports(monkeypatch):
    combo = dict(
        backend="local",
        experts="triton",
        reduction="experts",
        overlap="none",
        quant="bf16",
        model="tiny",
        device="cpu",
        hidden=256,
        intermediate=128,
        num_experts=8,
        topk=2,
    )
    cls, bcls = get_experts("triton"), get_experts("triton_batched")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "CUDA" in cls.supports(combo)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert cls.supports(combo) is None
    assert cls.supports(dict(combo, quant="fp8_tensor", intermediate=96)) is None
    assert "quant=bf16 or fp8_block" in cls.supports(dict(combo, quant="fp8_tensor", row_layout="gathered"))
    assert "multiples of 128" in cls.supports(dict(combo, quant="bf16", intermediate=96, row_layout="contiguous"))
    assert bcls.supports(dict(combo, reduction="finalize")) is None
    # the contract's rules, kept in validity.validate: fp8_block's multiples of 128, batched -> finalize
    from moebench.config import validity
    from moebench.config.compose import compose_config, to_combo

    base = to_combo(compose_config(["backend=local", "experts=triton", "model=tiny"]), device="cpu")
    assert "multiples of 128" in validity.validate(base.replace(quant="fp8_block", intermediate=96))
    assert "only reduction=finalize" in validity.validate(
        base.replace(backend="local_batched", experts="triton_batched")
    )


def test_workspace_shapes_and_reduction_saving():
    ctx, w, _ = make_layer("bf16", config=None)
    ex = get_experts("triton")(w, "experts", ctx)
    fin = get_experts("triton")(w, "finalize", ctx)
    Mt, N, topk = 64, 2 * I, 8
    bytes_of = lambda e: sum(torch.Size(s).numel() for s in e.workspace_shapes(Mt, N, K, topk, E)) * 2
    tail = standard_ws2_tail_rows(Mt, topk, E, ex._config(Mt, topk)["BLOCK_SIZE_M"], I)
    assert ex.workspace_shapes(Mt, N, K, topk, E) == ((Mt * topk, N), (Mt * topk + tail, I), (Mt, K))
    assert fin.workspace_shapes(Mt, N, K, topk, E)[2] == (Mt, topk, K)
    assert bytes_of(fin) - bytes_of(ex) == Mt * (topk - 1) * K * 2
    # K <= P * I: the fp32 reduce accumulator lives in ws13 and the sort scratch in ws2's tail:
    # nothing is transient
    assert ex.transient_bytes(Mt, N, K, topk, E) == fin.transient_bytes(Mt, N, K, topk, E) == 0
    bat = get_experts("triton_batched")(w, "finalize", ctx)
    assert bat.workspace_shapes(32, N, K, topk, E) == ((E, 32, N), (E, 32, I), (E, 32, K))
