"""The `deepgemm*` experts' own code on the CPU: the Triton layout kernels run in
Triton's interpreter and `deep_gemm` is a stand-in written from the 2.8.2 sources
(csrc/apis/gemm.hpp, csrc/apis/layout.hpp, the SM90 scheduler and 1D2D kernel):

* contiguous: A [M, K] rows, grouped_layout either the expert of each row (-1:
  padding; BLOCK_M = the mk alignment, each 64-row half computed when its first
  row's id >= 0, else stored as zeros) or, with use_psum_layout, the end row of
  each expert (expert g's rows start at align(end[g-1], 128));
* masked: A [G, X, K]; whole 128-row tiles of the [G*X, N] view are stored, so a
  tile past an expert's rows lands on the next expert's (processed in reverse
  order here, so that such an overwrite shows);
* rows computed from padding are NaN here (garbage on the GPU), so reading one
  breaks the comparison with the reference;
* activation scales that are not MN-major and TMA-aligned are counted as the
  transposes DeepGEMM would allocate.

The GPU suite (tests/gpu/test_deepgemm.py) runs the real library.
"""

from __future__ import annotations

import os
import sys
import types

import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

from moebench.kernels.experts import _deep_gemm
from moebench.kernels.interfaces import FP8_DTYPE, KernelContext, LayerShape, PreparedTokens, QuantSpec
from moebench.kernels.modular import MoEKernel
from moebench.kernels.prepare_finalize._common import localize_ids
from moebench.kernels.reference import reference_moe, rel_err
from moebench.kernels.registry import get_backend, get_experts
from moebench.kernels.triton.align import max_padded_rows
from moebench.kernels.triton.deepgemm_layout import contiguous_scratch_numel, permute_contiguous
from moebench.measure.workload import build_expert_weights, make_inputs, reference_expert_fn

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SHAPE = LayerShape(hidden=256, intermediate=128, num_experts=8, topk=2)
TOL = 6e-2  # fp8_block (docs/design.md)
TRITON_CFG = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=2, num_warps=4, num_stages=2)


# ---------------------------------------------------------------------------
# the stand-in


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def _mn_major_tma_aligned(sf: torch.Tensor) -> bool:
    """get_mn_major_tma_aligned_tensor's test for 'no transpose needed'."""
    b = sf if sf.dim() == 3 else sf.unsqueeze(0)
    _, mn, k = b.shape
    a = _align(mn, 4)
    return (b.stride(0) == a * k or sf.dim() == 2) and b.stride(1) == 1 and b.stride(2) == a


def _dequant_b(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    G, N, K = w.shape
    assert s.dtype == torch.float32 and s.shape == (G, -(-N // 128), K // 128) and s.is_contiguous(), s.shape
    full = s.repeat_interleave(128, 1)[:, :N].repeat_interleave(128, 2)[:, :, :K]
    return w.float() * full


def _dequant_a(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x.float() * s.float().repeat_interleave(128, -1)


class FakeDeepGemm(types.ModuleType):
    def __init__(self):
        super().__init__("deep_gemm")
        self.__version__ = "2.8.2+fake"
        self.calls: list[str] = []
        self.transposes = 0

    @staticmethod
    def get_mk_alignment_for_contiguous_layout():
        return 128

    def _sfa(self, sf, mn, k, groups=None):
        assert sf.dtype == torch.float32
        assert sf.dim() == (3 if groups else 2) and sf.shape[-2] == mn and sf.shape[-1] == k // 128, sf.shape
        if not _mn_major_tma_aligned(sf):
            self.transposes += 1

    def m_grouped_fp8_gemm_nt_contiguous(
        self,
        a,
        b,
        d,
        grouped_layout,
        recipe=None,
        recipe_a=None,
        recipe_b=None,
        compiled_dims="nk",
        disable_ue8m0_cast=False,
        use_psum_layout=False,
        ensure_zero_padding=True,
        expected_m_for_psum_layout=None,
        epilogue=None,
    ):
        self.calls.append("contiguous")
        (x, sfa), (w, sfb) = a, b
        M, K = x.shape
        G, N, K2 = w.shape
        assert x.dtype == FP8_DTYPE and w.dtype == FP8_DTYPE and x.stride(1) == 1 and w.is_contiguous()
        assert K == K2 and d.dtype == torch.bfloat16 and d.shape == (M, N) and d.stride(1) == 1
        assert grouped_layout.dtype == torch.int32 and grouped_layout.is_contiguous()
        assert grouped_layout.shape == ((G,) if use_psum_layout else (M,))
        assert M % 128 == 0
        self._sfa(sfa, M, K)
        wf = _dequant_b(w, sfb)
        gl = grouped_layout.tolist()
        if use_psum_layout:
            end = 0
            for g in range(G):
                start, end = _align(end, 128), gl[g]
                assert start <= end <= M, (g, start, end, M)  # else DeepGEMM's uint32 block count wraps
                hi = _align(end, 128)
                if hi > start:
                    d[start:hi] = (_dequant_a(x[start:hi], sfa[start:hi]) @ wf[g].T).to(d.dtype)
                    d[end:hi] = float("nan")
        else:
            for r0 in range(0, M, 64):
                e = gl[r0 // 128 * 128]
                if gl[r0] < 0:
                    d[r0 : r0 + 64] = 0
                    continue
                d[r0 : r0 + 64] = (_dequant_a(x[r0 : r0 + 64], sfa[r0 : r0 + 64]) @ wf[max(e, 0)].T).to(d.dtype)
                pad = torch.tensor(gl[r0 : r0 + 64]) < 0
                d[r0 : r0 + 64][pad.to(d.device)] = float("nan")

    def m_grouped_fp8_gemm_nt_masked(
        self,
        a,
        b,
        d,
        masked_m,
        expected_m,
        recipe=None,
        recipe_a=None,
        recipe_b=None,
        compiled_dims="nk",
        disable_ue8m0_cast=False,
        epilogue=None,
    ):
        self.calls.append("masked")
        (x, sfa), (w, sfb) = a, b
        G, X, K = x.shape
        _, N, _ = w.shape
        assert x.dtype == FP8_DTYPE and x.stride(2) == 1 and x.stride(0) == X * K
        assert d.dtype == torch.bfloat16 and d.shape == (G, X, N) and d.stride(0) == X * N and d.stride(2) == 1
        assert masked_m.dtype == torch.int32 and masked_m.is_contiguous() and masked_m.numel() == G
        assert isinstance(expected_m, int) and expected_m > 0
        self._sfa(sfa, X, K, groups=G)
        wf = _dequant_b(w, sfb)
        xa = torch.cat([_dequant_a(x[g], sfa[g]) for g in range(G)])  # [G*X, K]
        dflat = d.view(G * X, N)
        ms = masked_m.tolist()
        for g in reversed(range(G)):
            for r0 in range(g * X, g * X + ms[g], 128):
                r1 = min(r0 + 128, G * X)
                vals = (xa[r0:r1] @ wf[g].T).to(d.dtype)
                row = torch.arange(r0, r1)
                vals[((row < g * X) | (row >= g * X + ms[g])).to(d.device)] = float("nan")
                dflat[r0:r1] = vals


@pytest.fixture
def fake_dg(monkeypatch):
    dg = FakeDeepGemm()
    monkeypatch.setitem(sys.modules, "deep_gemm", dg)
    _deep_gemm.reset_import_cache()
    yield dg
    _deep_gemm.reset_import_cache()


# ---------------------------------------------------------------------------


def layer(experts: str, reduction: str, backend: str = "local", simulate_ep: int = 1, min_tokens: int = 256):
    ctx = KernelContext(
        shape=SHAPE,
        quant=QuantSpec("fp8_block"),
        device=DEV,
        simulate_ep=simulate_ep,
        options={"deepgemm_min_tokens": min_tokens, "triton_config": TRITON_CFG},
    )
    w = build_expert_weights(ctx, 0)
    ex = get_experts(experts)(w, reduction, ctx)
    return ctx, MoEKernel(get_backend(backend)(ctx), ex)


def check(ctx, kernel, T, routing="uniform", ids=None):
    x, w, ids_ = make_inputs(SHAPE, T, routing, 1.5, 0, 0, 1, DEV)
    ids = ids_ if ids is None else ids
    y = kernel(x, w, ids)
    kept = range(ctx.num_local_experts) if ctx.simulate_ep > 1 else None
    ref = reference_moe(x, w, ids, reference_expert_fn(SHAPE, ctx.quant, 0, DEV), kept)
    err = rel_err(y, ref)
    assert err <= TOL, (T, routing, err)
    return y


@pytest.mark.parametrize("psum", [True, False])
@pytest.mark.parametrize("reduction", ["experts", "finalize"])
def test_contiguous_matches_reference(fake_dg, reduction, psum):
    ctx, k = layer("deepgemm", reduction)
    k.experts.use_psum_layout = psum
    for T in (1, 5, 40):
        check(ctx, k, T)
    # three experts get every pair, the others none (empty experts between and after)
    check(ctx, k, 40, ids=torch.tensor([[1, 4]] * 20 + [[4, 6]] * 20))
    assert fake_dg.calls.count("contiguous") == 8 and fake_dg.transposes == 0


def test_contiguous_simulate_ep_and_no_local_pair(fake_dg):
    ctx, k = layer("deepgemm", "finalize", simulate_ep=2)
    check(ctx, k, 17)
    y = check(ctx, k, 3, ids=torch.tensor([[5, 6]] * 3))  # every pair on the other rank
    assert (y == 0).all()


def test_contiguous_quantizes_a_bf16_input(fake_dg):
    """Behind a dispatch that cannot carry fp8 (e.g. naive) the rows arrive bf16."""
    ctx, k = layer("deepgemm", "experts")
    x, w, ids = make_inputs(SHAPE, 9, "uniform", 1.5, 0, 0, 1, DEV)
    prepared = PreparedTokens(x=x, x_scale=None, topk_ids_MP=localize_ids(ids, 0, 8), topk_weights_MP=w)
    shapes = k.experts.workspace_shapes(9, SHAPE.n, SHAPE.hidden, SHAPE.topk, 8)
    ws13, ws2, out = (torch.empty(s, dtype=torch.bfloat16, device=DEV) for s in shapes)
    k.experts.apply(out, prepared, ws13, ws2)
    ref = reference_moe(x, w, ids, reference_expert_fn(SHAPE, ctx.quant, 0, DEV))
    assert rel_err(out, ref) <= TOL


def test_permute_layouts(fake_dg):
    """m_indices, psum ends, block counts and slots agree with a plain count."""
    E, P, A = 8, 2, 128
    ids = torch.tensor([[1, 4]] * 130 + [[4, 6]] * 3 + [[-1, 6]] * 2)
    M = ids.shape[0]
    x = torch.randn(M, 256).to(FP8_DTYPE)
    xs = torch.rand(M, 2) + 0.5
    mp = max_padded_rows(M * P, E, A)
    a = torch.empty(mp, 256, dtype=FP8_DTYPE)
    a_s = torch.empty(2, mp).t()
    scratch = torch.empty(contiguous_scratch_numel(M * P, E, A), dtype=torch.int32)
    lay = permute_contiguous(x, xs, ids, E, A, a, a_s, scratch)
    counts = torch.bincount(ids[ids >= 0], minlength=E)
    padded = (counts + A - 1) // A * A
    starts = torch.cumsum(padded, 0) - padded
    assert lay.ends_E.tolist() == (starts + counts).tolist()
    m_idx = lay.m_indices_Mp
    for e in range(E):
        assert (m_idx[starts[e] : starts[e] + counts[e]] == e).all()
    assert int((m_idx >= 0).sum()) == int(counts.sum())
    # expert 1: 130 pairs, expert 4: 133, expert 6: 5; blocks past them hold none
    assert lay.counts_B.tolist() == [128, 2, 128, 5, 5] + [0] * (mp // A - 5)
    flat = ids.reshape(-1)
    for pair in range(M * P):
        if flat[pair] >= 0:
            s = int(lay.inv_R[pair])
            assert int(m_idx[s]) == int(flat[pair])
            assert torch.equal(a[s].view(torch.uint8), x[pair // P].view(torch.uint8))
            assert torch.equal(a_s[s], xs[pair // P])


@pytest.mark.parametrize("T", [1, 7, 128])
def test_masked_matches_reference(fake_dg, T):
    """X = T rows per expert: 1 and 7 go through the padded copy, 128 is used in place."""
    ctx, k = layer("deepgemm_masked", "finalize", backend="local_batched")
    check(ctx, k, T)
    assert fake_dg.calls == ["masked", "masked"]
    assert fake_dg.transposes == (2 if T % 128 == 0 else 1)  # activation scales (+ the dispatched ones in place)


def test_masked_expert_without_tokens(fake_dg):
    ctx, k = layer("deepgemm_masked", "finalize", backend="local_batched")
    check(ctx, k, 6, ids=torch.tensor([[2, 3]] * 6))


def test_triton_or_deepgemm_picks_by_rows(fake_dg):
    ctx, k = layer("triton_or_deepgemm", "experts", min_tokens=8)
    check(ctx, k, 5)
    assert fake_dg.calls == []  # below the threshold: Triton
    check(ctx, k, 8)
    assert fake_dg.calls == ["contiguous", "contiguous"]
    ex = k.experts
    dims = (SHAPE.n, SHAPE.hidden, SHAPE.topk, 8)
    assert ex.workspace_shapes(5, *dims) == ex.triton.workspace_shapes(5, *dims)
    assert ex.workspace_shapes(8, *dims) == ex.deepgemm.workspace_shapes(8, *dims)
    assert ex.transient_bytes(8, *dims) == ex.deepgemm.transient_bytes(8, *dims)


def test_workspace_shapes_hold_what_apply_carves(fake_dg):
    ctx, k = layer("deepgemm", "finalize")
    ex = k.experts
    for M in (1, 16, 1000):
        ws13, ws2, out = ex.workspace_shapes(M, SHAPE.n, SHAPE.hidden, SHAPE.topk, 8)
        mp = max_padded_rows(M * SHAPE.topk, 8, 128)
        D = max(SHAPE.hidden, SHAPE.intermediate)
        assert ws13[0] * ws13[1] * 2 == mp * (D + 4 * D // 128)
        assert ws2 == (mp, max(SHAPE.n, SHAPE.hidden)) and out == (M, SHAPE.topk, SHAPE.hidden)


def test_workspace_bytes_at_deepseek_v3s_ep8_share_as_the_findings_state():
    """docs/findings/memory.md compares these with vLLM's DeepGemmExperts.workspace_shapes:
    per padded row 7,392 B of workspace13 (fp8 rows + fp32 scales) and 14,336 B of
    workspace2; 209,888 declared bytes a token at 4096 tokens with the reduction in the experts."""
    from moebench.kernels.experts._contiguous import contiguous_workspace_shapes

    M, P, K, I, E = 4096, 8, 7168, 2048, 32  # DeepSeek-V3, 256 experts over EP-8
    mp = max_padded_rows(M * P, E, 128)  # 128: DeepGEMM's SM90 mk alignment
    assert mp == -(-(M * P + E * 127) // 128) * 128 == 36864  # vLLM's bound with every expert hit
    for reduction, out_bytes in (("experts", 2 * M * K), ("finalize", 2 * M * P * K)):
        ws13, ws2, out = contiguous_workspace_shapes(mp, M, 2 * I, K, P, reduction)
        assert 2 * ws13[1] == 7392 and 2 * ws2[1] == 14336 and ws13[0] == ws2[0] == mp
        assert 2 * out[0] * out[1] * (out[2] if len(out) == 3 else 1) == out_bytes
        if reduction == "experts":
            assert (2 * mp * (ws13[1] + ws2[1]) + out_bytes) / M == 209888
