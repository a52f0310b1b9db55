"""Issue #34, the host's side of a forward: what is cached per size equals what is
computed afresh, and the one-kernel id localization equals the torch form exactly
(the Triton kernel through the interpreter)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from moebench.kernels import registry
from moebench.kernels.interfaces import KernelContext, LayerShape, QuantSpec
from moebench.kernels.modular import MoEKernel
from moebench.kernels.prepare_finalize._common import localize_ids, localize_ids_torch
from moebench.measure.workload import build_expert_weights, make_inputs

SHAPE = LayerShape(hidden=256, intermediate=128, num_experts=8, topk=2, num_shared_experts=0, shared_intermediate=0)


def _layer(experts="triton", quant="bf16", simulate_ep=1, options=None):
    ctx = KernelContext(
        shape=SHAPE, quant=QuantSpec(quant), device=torch.device("cpu"), simulate_ep=simulate_ep, options=options or {}
    )
    w = build_expert_weights(ctx, 0)
    pf = registry.get_backend("local")(ctx)
    ex = registry.get_experts(experts)(w, "experts", ctx)
    return MoEKernel(pf, ex, None, "none")


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("first, num_local", [(0, 8), (0, 2), (4, 4), (6, 2)])
def test_localize_kernel_equals_torch(dtype, first, num_local):
    from moebench.kernels.triton.routing import localize_ids_triton

    g = torch.Generator().manual_seed(first * 10 + num_local)
    for M in (0, 1, 37, 700):
        ids = torch.randint(-1, 10, (M, 3), generator=g).to(dtype)
        got = localize_ids_triton(ids, first, num_local)
        want = localize_ids_torch(ids, first, num_local)
        assert got.dtype == want.dtype == torch.int64 and got.shape == want.shape
        assert torch.equal(got, want), (M, first, num_local)


def test_localize_every_expert_local_is_the_identity():
    ids = torch.tensor([[0, 7], [3, 5]])
    assert localize_ids(ids, 0, 8, 8) is ids  # no kernel, no copy
    assert torch.equal(localize_ids(ids, 0, 8, 8), localize_ids_torch(ids, 0, 8))
    assert torch.equal(localize_ids(ids.int(), 0, 8, 8), localize_ids_torch(ids, 0, 8))  # int32: converted
    assert localize_ids(ids, 4, 4, 8).tolist() == [[-1, 3], [-1, 1]]  # not all local: localized


@pytest.mark.parametrize("quant", ["bf16", "fp8_block"])
def test_workspace_views_cached_equal_uncached(quant):
    k = _layer(quant=quant)
    for T in (1, 16, 64):
        x, w, ids = make_inputs(SHAPE, T, "uniform", 1.0, 0, 0, 1, "cpu")
        prepared = k.pf.prepare(x, w, ids, k.experts.input_quant)
        first = k._workspaces(prepared, T)
        again = k._workspaces(prepared, T)
        assert all(a is b for a, b in zip(first, again, strict=True))  # cached: the same views
        rows = prepared.x.shape[0]
        shapes = k.experts.workspace_shapes(*k._dims(rows))
        assert [tuple(v.shape) for v in first] == [tuple(s) for s in shapes]
        # each view starts its buffer, as the uncached carve-up did
        assert [v.data_ptr() for v in first] == [k._ws[n].data_ptr() for n in ("ws13", "ws2", "out")]
        y = k(x, w, ids)
        k.clear_workspaces()
        assert not k._ws_views and not k._ws
        assert torch.equal(k(x, w, ids), y)  # fresh buffers, the same result


def test_workspace_views_follow_a_grown_buffer():
    k = _layer()
    x, w, ids = make_inputs(SHAPE, 4, "uniform", 1.0, 0, 0, 1, "cpu")
    small = k._workspaces(k.pf.prepare(x, w, ids, None), 4)
    x2, w2, ids2 = make_inputs(SHAPE, 512, "uniform", 1.0, 0, 0, 1, "cpu")
    k._workspaces(k.pf.prepare(x2, w2, ids2, None), 512)  # grows every buffer
    again = k._workspaces(k.pf.prepare(x, w, ids, None), 4)
    assert again[0] is not small[0] and again[0].data_ptr() == k._ws["ws13"].data_ptr()


def test_contiguous_decision_cached_equals_uncached():
    for layout in ("auto", "gathered", "contiguous"):
        ex = _layer(options={"row_layout": layout}).experts
        for M in (1, 64, 4096, 65536):
            assert ex.contiguous(M, 2) == ex._contiguous(M, 2)
            assert ex.contiguous(M, 2) == ex._contiguous(M, 2)  # the cached answer
    bad = _layer(options={"row_layout": "nope"}).experts
    for _ in range(2):  # a bad option raises every time (an error is not cached)
        with pytest.raises(ValueError, match="row_layout"):
            bad.contiguous(8, 2)


@pytest.mark.parametrize("experts", ["triton", "torch"])
def test_experts_write_the_output_directly_with_the_same_result(experts):
    """local + reduction=experts: the experts write out_TK, the finalize's copy is skipped."""
    k = _layer(experts=experts)
    x, w, ids = make_inputs(SHAPE, 24, "uniform", 1.0, 0, 0, 1, "cpu")
    copies = []
    orig = torch.Tensor.copy_

    def spy(self, src, *a, **kw):
        copies.append(src.data_ptr())
        return orig(self, src, *a, **kw)

    direct = k(x, w, ids)
    k.pf.noop_finalize_copies = False  # the finalize's copy, as before
    torch.Tensor.copy_ = spy
    try:
        copied = k(x, w, ids)
        k.pf.noop_finalize_copies = True
        n = len(copies)
        again = k(x, w, ids)
    finally:
        torch.Tensor.copy_ = orig
    out_ws = k._ws["out"].data_ptr()
    assert out_ws in copies[:n] and out_ws not in copies[n:]  # the out workspace is copied only before
    assert torch.equal(direct, copied) and torch.equal(again, copied)


@pytest.mark.parametrize("block_m", [16, 64, 128])
@pytest.mark.parametrize("M, P, E", [(1, 1, 1), (32, 8, 128), (37, 4, 8), (200, 8, 32), (0, 2, 4)])
def test_one_launch_align_equals_two(monkeypatch, M, P, E, block_m):
    """The counting program that also scatters (few pairs) gives the two-kernel path's
    layout: the same padded rows, block experts, and pairs per block (as sets: their order
    inside an expert comes from atomics)."""
    from align_layouts import one_and_two_launch_layouts  # tests/ (conftest puts it on the path)

    g = torch.Generator().manual_seed(M * 7 + E)
    ids = torch.randint(-1, E, (M, P), generator=g)
    one, n = one_and_two_launch_layouts(monkeypatch, ids, E, block_m)
    # and the layout is right: every local pair once, in its expert's blocks; padding holds the sentinel
    s, e = one[0][:n], one[1][: n // block_m].repeat_interleave(block_m)
    real = s < M * P
    flat = ids.reshape(-1)
    assert sorted(s[real].tolist()) == [i for i in range(M * P) if flat[i] >= 0]
    assert torch.equal(flat[s[real].long()], e[real].long())
    assert (s[~real] == M * P).all()


def test_host_integer_helpers_equal_tritons():
    """common.cdiv / next_power_of_2 (plain functions) give triton.cdiv's / next_power_of_2's values."""
    import triton

    from moebench.kernels.triton.common import cdiv, next_power_of_2

    for a in (0, 1, 2, 15, 16, 17, 1000, 2**31 + 5):
        assert next_power_of_2(a) == triton.next_power_of_2(a)
        for b in (1, 2, 16, 128, 1024):
            assert cdiv(a, b) == triton.cdiv(a, b)


@pytest.mark.parametrize("scaled", ["none", "rows", "tensor"])
@pytest.mark.parametrize("M, P, E, X", [(37, 4, 8, 40), (64, 8, 16, 6), (1, 2, 1, 4), (0, 2, 4, 8), (200, 2, 32, 64)])
def test_batched_layout_kernels_equal_torch(scaled, M, P, E, X):
    """to_batched in two Triton launches gives the torch form's buffers, counts and slot maps
    (x rows past a count are unwritten in both: compared only where counted)."""
    from moebench.kernels.interfaces import FP8_DTYPE
    from moebench.kernels.prepare_finalize._common import to_batched, to_batched_fused

    g = torch.Generator().manual_seed(M + E + X)
    ids = torch.randint(-1, E, (M, P), generator=g)
    K, G = 256, 2
    x = torch.randn(M, K, generator=g).to(torch.bfloat16 if scaled == "none" else FP8_DTYPE)
    scale = {"none": None, "rows": torch.rand(M, G, generator=g), "tensor": torch.rand(1, generator=g)}[scaled]
    want = to_batched(x, scale, ids, E, X)
    got = to_batched_fused(x, scale, ids, E, X)
    n = want.expert_num_tokens_E
    assert got.expert_num_tokens_E.dtype == torch.int32 and torch.equal(got.expert_num_tokens_E, n)
    for a, b in (
        (got.handle.slot_token_EX, want.handle.slot_token_EX),
        (got.handle.slot_k_EX, want.handle.slot_k_EX),
        (got.handle.pair_row_MP, want.handle.pair_row_MP),
    ):
        assert a.dtype == b.dtype and torch.equal(a, b)
    counted = torch.arange(X)[None, :] < n[:, None].long()  # [E, X]
    bits = torch.uint8 if x.element_size() == 1 else torch.int16
    assert got.x.shape == want.x.shape and torch.equal(got.x.view(bits)[counted], want.x.view(bits)[counted])
    if scaled == "rows":
        assert torch.equal(got.x_scale, want.x_scale)  # 1.0 past the counts in both
    elif scaled == "tensor":
        assert got.x_scale is scale and want.x_scale is scale
    else:
        assert got.x_scale is None and want.x_scale is None
    assert got.handle.num_tokens == want.handle.num_tokens == M


def test_workspace_views_kept_on_the_tensor_equal_a_fresh_carve(monkeypatch):
    """moe.ws_view: the view of a workspace's bytes is made once per (offset, shape, dtype) and
    equals the carve it replaced (the same bytes, shape, strides, dtype)."""
    from moebench.kernels.interfaces import FP8_DTYPE
    from moebench.kernels.triton import common, moe

    ws = torch.empty(4096, dtype=torch.bfloat16)
    for offset, shape, dtype in [
        (0, (16, 64), torch.bfloat16),
        (0, (8, 128), FP8_DTYPE),
        (1024, (4, 8), torch.float32),
        (0, (2, 3, 64), torch.bfloat16),
    ]:
        v = moe.ws_view(ws, offset, shape, dtype)
        fresh = common.carve(common.as_bytes(ws), offset, shape, dtype)
        assert moe.ws_view(ws, offset, torch.Size(shape), dtype) is v  # kept: the same view object
        assert (v.data_ptr(), v.shape, v.stride(), v.dtype) == (
            fresh.data_ptr(),
            fresh.shape,
            fresh.stride(),
            fresh.dtype,
        )
    other = torch.empty(4096, dtype=torch.bfloat16)  # views live on their own tensor
    assert moe.ws_view(other, 0, (16, 64), torch.bfloat16).data_ptr() == other.data_ptr()
    monkeypatch.setattr(moe, "MAX_VIEWS", 2)
    for rows in range(1, 6):  # bounded: a full memo starts again
        moe.ws_view(other, 0, (rows, 64), torch.bfloat16)
        assert len(other._moebench_views) <= 2
    with pytest.raises(AssertionError):
        moe.ws_view(ws, 0, (4097,), torch.bfloat16)  # past the buffer: refused, as carve does


def test_group_quant_same_result_for_any_leading_dims():
    """per_token_group_quant_fp8 passes a 2-D tensor as it is and flattens others: the same
    values and scales either way, into given outputs of either rank too."""
    from moebench.kernels.triton.quant import per_token_group_quant_fp8

    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 256, generator=g).to(torch.bfloat16)
    q2, s2 = per_token_group_quant_fp8(x, 128)
    q3, s3 = per_token_group_quant_fp8(x.view(3, 4, 256), 128)
    assert q3.shape == (3, 4, 256) and s3.shape == (3, 4, 2)
    assert torch.equal(q3.view(torch.uint8).view(12, 256), q2.view(torch.uint8)) and torch.equal(s3.view(12, 2), s2)
    out, out_s = torch.empty(3, 4, 256, dtype=q2.dtype), torch.empty(3, 4, 2)
    per_token_group_quant_fp8(x, 128, out=out.view(12, 256), out_scale=out_s.view(12, 2))
    assert torch.equal(out.view(torch.uint8).view(12, 256), q2.view(torch.uint8)) and torch.equal(out_s.view(12, 2), s2)
    wide = torch.randn(12, 512, generator=g).to(torch.bfloat16)  # rows with a stride past K
    qw, sw = per_token_group_quant_fp8(wide[:, :256], 128)
    qc, sc = per_token_group_quant_fp8(wide[:, :256].contiguous(), 128)
    assert torch.equal(qw.view(torch.uint8), qc.view(torch.uint8)) and torch.equal(sw, sc)


def test_align_non_contiguous_ids_equal_contiguous():
    """moe_align_block_size passes contiguous ids as they are and flattens the others by a copy:
    the same layout either way."""
    from moebench.kernels.triton import align

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(-1, 8, (4, 37), generator=g).t()  # [37, 4], not contiguous
    assert not ids.is_contiguous()
    got = [t.clone() for t in align.moe_align_block_size(ids, 8, 16)]
    want = [t.clone() for t in align.moe_align_block_size(ids.contiguous(), 8, 16)]
    n = int(want[2])
    assert int(got[2]) == n and torch.equal(got[1][: n // 16], want[1][: n // 16])
    assert torch.equal(got[0][:n].view(-1, 16).sort(1).values, want[0][:n].view(-1, 16).sort(1).values)


def test_gluon_gemms_set_up_once_and_no_import_per_forward(monkeypatch):
    """Issue #46: where a Gluon kernel is picked (forced here: the CPU has none), the triton experts
    set up each weight's GEMM in __init__ (gluon_contiguous.GluonGemm: kernel, constexprs, the
    weight's TMA descriptors); a forward imports nothing Gluon and launches both GEMMs through
    launch.py (stubbed: Gluon runs on an SM90 GPU only) with the weights' descriptors it holds."""
    import builtins
    import dataclasses

    from moebench.kernels.experts import triton as experts_triton
    from moebench.kernels.triton import gluon_contiguous as gc
    from moebench.kernels.triton import gluon_wide

    shape = dataclasses.replace(SHAPE, intermediate=256)  # gate/up's N (512) apart from down's (K, 256)
    kernels = {2 * shape.intermediate: "gluon", shape.hidden: "gluon_wide"}
    monkeypatch.setattr(experts_triton, "contiguous_gemm_kernel", lambda mode, quant, cap, n: kernels[n])
    monkeypatch.setattr(gc, "num_sms", lambda device: 4)
    launches = []

    def fake_launch(fn, grid, *args, **kw):
        launches.append((fn, grid, args, kw))
        (args[3].base if fn is gluon_wide.gluon_fp8_wide_kernel else args[2]).zero_()  # c: what comes next reads it

    monkeypatch.setattr(gc, "launch", fake_launch)
    ctx = KernelContext(
        shape=shape,
        quant=QuantSpec("fp8_block"),
        device=torch.device("cpu"),
        simulate_ep=1,
        options={"row_layout": "contiguous"},
    )
    experts = registry.get_experts("triton")(build_expert_weights(ctx, 0), "experts", ctx)
    layer = MoEKernel(registry.get_backend("local")(ctx), experts, None, "none")
    gluons = experts._gluons[experts._default_plan]
    assert [g.w for g in gluons] == [experts._contiguous_w.w13, experts._contiguous_w.w2]
    x, w, ids = make_inputs(shape, 64, "uniform", 1.0, 0, 0, 1, "cpu")
    layer(x, w, ids)
    imported = []
    real_import = builtins.__import__

    def counting_import(name, globals=None, locals=None, fromlist=(), level=0):
        imported.append((name, fromlist))
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", counting_import)
    layer(x, w, ids)
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert not [i for i in imported if "gluon" in i[0] or any("gluon" in f for f in i[1] or ())], imported
    assert experts.last_gemm == "gluon/gluon_wide"
    assert [fn for fn, *_ in launches] == [gc._gluon_fp8_ws_kernel, gluon_wide.gluon_fp8_wide_kernel] * 2
    (_, _, ws1, kw1), (_, _, wide1, _), (_, _, ws2, _), (_, _, wide2, _) = launches
    assert ws1[1] is ws2[1] and wide1[1:3] == wide2[1:3] and wide1[1] is wide2[1]  # the weights' descriptors: kept
    assert ws1[0] is not ws2[0]  # a's: built per call
    assert kw1 == dict(
        K=SHAPE.hidden, GROUP_N=128, GROUP_SIZE_M=8, STAGES=4, num_warps=4, SCALE_AHEAD=1, EPILOGUE_TMA=True
    )
