"""Standard-layout experts on DeepGEMM's `m_grouped_fp8_gemm_nt_contiguous`
(fp8_block, SM90), as vLLM's DeepGemmExperts after the weight-and-reduce change.

  permute   pairs sorted by expert into segments padded to DeepGEMM's M alignment
            (kernels/triton/deepgemm_layout.py; a bf16 input is quantized on the way)
  gate/up   m_grouped_fp8_gemm_nt_contiguous -> [Mp, N] bf16
  act       SiLU-and-mul + 1x128 fp8 quantization (our Triton kernel), scales
            written MN-major so DeepGEMM reads them without a transpose
  down      m_grouped_fp8_gemm_nt_contiguous -> [Mp, K] bf16
  unpermute reduction="experts": weighted sum over top-k into [M, K] (the
            finalize gets NoOp); "finalize": one row per (token, k), zero rows
            for pairs of other ranks

Mp is the host-side upper bound of the padded rows (no host sync; the GEMMs skip
what lies past the last expert: psum layout, or -1 rows with `use_psum_layout`
False). Workspaces (bf16 elements, vLLM's semantics): ws13 holds fp8 rows and
their fp32 scales (the permuted input, later the activation), ws2 the bf16 GEMM
outputs (gate/up, later down); the only allocation inside apply() is one int32
scratch (sort + layout metadata).

Legend: M rows, P top-k, R = M*P pairs, K hidden, N = 2I, E local experts,
Mp padded rows, D = max(K, I).
"""
from __future__ import annotations

import torch

from ..interfaces import FP8_DTYPE, ActivationFormat, Experts
from ..registry import register_experts
from ..triton.activation import MODE_GROUP, silu_and_mul
from ..triton.align import max_padded_rows
from ..triton.deepgemm_layout import GROUP, contiguous_scratch_numel, permute_contiguous, unpermute_contiguous
from ..triton.moe import alloc_bytes
from . import _deep_gemm


def fp8_rows_with_scales(u8: torch.Tensor, rows: int, cols: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Carve fp8 [rows, cols] at byte 0 and its fp32 1x128 scales [rows, cols/128],
    MN-major (strides (1, rows)), at byte rows * width of a flat uint8 buffer."""
    g = cols // GROUP
    a = u8[: rows * cols].view(FP8_DTYPE).view(rows, cols)
    off = rows * width
    s = u8[off : off + 4 * rows * g].view(torch.float32).view(g, rows).t()
    return a, s


def fp8_scaled_bytes(width: int) -> int:
    """Bytes per row of fp8 [*, width] plus its fp32 1x128 scales (width % 128 == 0)."""
    return width + 4 * width // GROUP


def as_bytes(ws: torch.Tensor) -> torch.Tensor:
    assert ws.is_contiguous(), "workspaces must be contiguous"
    return ws.reshape(-1).view(torch.uint8)


class DeepGemmWeights:
    """The layer's fp8 weights and 128x128 scales as DeepGEMM takes them:
    [E, N, K] K-major and [E, N/128, K/128] contiguous fp32."""

    def __init__(self, w):
        if not w.quant.is_block:
            raise ValueError(f"DeepGEMM experts need quant=fp8_block, got {w.quant.name}")
        self.w13 = w.w13_ENK.contiguous()
        self.w2 = w.w2_EKI.contiguous()
        self.s13 = w.w13_scale.to(torch.float32).contiguous()
        self.s2 = w.w2_scale.to(torch.float32).contiguous()
        assert self.w13.dtype == FP8_DTYPE and self.w2.dtype == FP8_DTYPE


@register_experts("deepgemm")
class DeepGemmExperts(Experts):
    activation_format = ActivationFormat.STANDARD
    graph_capturable = True  # no host sync: Mp is an upper bound, the layouts live on the device
    # SM90 grouped layout: per-expert row ends (vLLM's choice; no work past the last
    # expert) or, False, the expert of every row with -1 for padding
    use_psum_layout = True

    @classmethod
    def supports(cls, combo):
        return _deep_gemm.deepgemm_unsupported(combo)

    def __init__(self, weights, reduction, ctx):
        super().__init__(weights, reduction, ctx)
        self.dg_w = DeepGemmWeights(weights)

    @staticmethod
    def _align() -> int:
        mod, _ = _deep_gemm.load()
        return _deep_gemm.mk_alignment() if mod is not None else 128  # 128: SM90's (for planning only)

    def padded_rows(self, M: int, topk: int, num_local_experts: int) -> int:
        """Mp: rows of the permuted buffers for M token rows."""
        return max_padded_rows(M * topk, num_local_experts, self._align())

    def workspace_shapes(self, M, N, K, topk, num_local_experts):
        mp = self.padded_rows(M, topk, num_local_experts)
        return contiguous_workspace_shapes(mp, M, N, K, topk, self.reduction)

    def transient_bytes(self, M, N, K, topk, num_local_experts):
        """One int32 scratch: the sort by expert, the grouped layouts, the pairs' slots."""
        if M * topk == 0:
            return 0
        return alloc_bytes(4 * contiguous_scratch_numel(M * topk, num_local_experts, self._align()))

    def apply(self, output, prepared, workspace13, workspace2):
        dg = _deep_gemm.require()
        psum = self.use_psum_layout

        def gemm(a, a_s, w, w_s, out, layout):
            grouped = layout.ends_E if psum else layout.m_indices_Mp
            dg.m_grouped_fp8_gemm_nt_contiguous((a, a_s), (w, w_s), out, grouped, disable_ue8m0_cast=True,
                                                use_psum_layout=psum)

        contiguous_apply(gemm, self.dg_w, _deep_gemm.mk_alignment(), self.reduction, output, prepared,
                         workspace13, workspace2)


def contiguous_workspace_shapes(mp: int, M: int, N: int, K: int, topk: int, reduction: str):
    """Workspaces of `contiguous_apply` (bf16 elements, vLLM's semantics)."""
    D = max(K, N // 2)
    # ws13: fp8 [Mp, D] + fp32 scales [D/128, Mp] (input rows, then the activation);
    # ws2: gate/up [Mp, N], then down [Mp, K], bf16
    out = (M, K) if reduction == "experts" else (M, topk, K)
    return (mp, fp8_scaled_bytes(D) // 2), (mp, max(N, K)), out


def contiguous_apply(gemm, w: DeepGemmWeights, align: int, reduction: str, output, prepared, workspace13, workspace2):
    """permute -> gemm(gate/up) -> SiLU-and-mul + fp8 quant -> gemm(down) -> unpermute
    (module doc); gemm(a, a_scale, w, w_scale, out, layout) is the grouped fp8 GEMM."""
    ids = prepared.topk_ids_MP
    M, P = ids.shape
    E, N, K = w.w13.shape
    I = N // 2
    if M * P == 0:
        return
    mp = max_padded_rows(M * P, E, align)
    D = max(K, I)
    u13 = as_bytes(workspace13)
    assert u13.numel() >= mp * fp8_scaled_bytes(D), (u13.numel(), mp, D)
    scratch = torch.empty(contiguous_scratch_numel(M * P, E, align), dtype=torch.int32, device=ids.device)
    a1, a1_s = fp8_rows_with_scales(u13, mp, K, D)
    layout = permute_contiguous(prepared.x, prepared.x_scale, ids, E, align, a1, a1_s, scratch)
    flat2 = workspace2.reshape(-1)
    h = flat2[: mp * N].view(mp, N)
    gemm(a1, a1_s, w.w13, w.s13, h, layout)
    act, act_s = fp8_rows_with_scales(u13, mp, I, D)  # a1 is consumed: reuse its bytes
    blocks = mp // align
    silu_and_mul(h.view(blocks, align, N), act.view(blocks, align, I), MODE_GROUP, scale=act_s,
                 expert_num_tokens=layout.counts_B, group=GROUP)
    y = flat2[: mp * K].view(mp, K)  # h is consumed
    gemm(act, act_s, w.w2, w.s2, y, layout)
    unpermute_contiguous(y, ids.contiguous(), prepared.topk_weights_MP.contiguous(), layout.inv_R, output, E,
                         reduce=reduction == "experts")
