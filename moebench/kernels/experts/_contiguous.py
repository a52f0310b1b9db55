"""The contiguous (expert-sorted, segment-padded) experts pipeline, shared by the
`deepgemm` experts (DeepGEMM's grouped GEMMs) and the `triton` experts at prefill
sizes (kernels/triton/contiguous_gemm.py):

  permute   pairs sorted by expert into segments padded to the GEMM's M alignment
            (kernels/triton/deepgemm_layout.py): fp8_block rows with their 1x128
            scales (a bf16 input is quantized on the way), or bf16 rows copied
  gate/up   gemm(...) -> [Mp, N] bf16
  act       SiLU-and-mul (+ 1x128 fp8 quantization, scales MN-major, for fp8_block)
  down      gemm(...) -> [Mp, K] bf16
  unpermute reduction="experts": weighted sum over top-k into [M, K] (the
            finalize gets NoOp); "finalize": one row per (token, k), zero rows
            for pairs of other ranks

Workspaces (bf16 elements, vLLM's semantics): ws13 holds the GEMM inputs (the
permuted rows, later the activation: fp8 + fp32 scales, or bf16), ws2 the bf16
GEMM outputs (gate/up, later down); the only allocation inside apply() is one
int32 scratch (sort + layout metadata).

Legend: M rows, P top-k, K hidden, N = 2I, E local experts, Mp padded rows,
D = max(K, I).
"""

from __future__ import annotations

import torch

from ..interfaces import FP8_DTYPE
from ..triton.activation import MODE_BF16, MODE_GROUP, silu_and_mul
from ..triton.align import max_padded_rows
from ..triton.common import as_bytes
from ..triton.deepgemm_layout import GROUP, contiguous_scratch_numel, permute_contiguous, unpermute_contiguous


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


class ContiguousWeights:
    """The layer's weights as the grouped GEMMs take them: [E, N, K] K-major, and for
    fp8_block [E, N/128, K/128] contiguous fp32 scales (s13 / s2 None for bf16)."""

    def __init__(self, w):
        if not (w.quant.is_block or w.quant.name == "bf16"):
            raise ValueError(f"the contiguous layout runs bf16 or fp8_block, got quant={w.quant.name}")
        self.w13 = w.w13_ENK.contiguous()
        self.w2 = w.w2_EKI.contiguous()
        self.scaled = w.quant.is_block
        self.s13 = w.w13_scale.to(torch.float32).contiguous() if self.scaled else None
        self.s2 = w.w2_scale.to(torch.float32).contiguous() if self.scaled else None
        want = FP8_DTYPE if self.scaled else torch.bfloat16
        assert self.w13.dtype == want and self.w2.dtype == want, (self.w13.dtype, self.w2.dtype)


class DeepGemmWeights(ContiguousWeights):
    """fp8_block only, as DeepGEMM's fp8 GEMMs take them."""

    def __init__(self, w):
        if not w.quant.is_block:
            raise ValueError(f"DeepGEMM experts need quant=fp8_block, got {w.quant.name}")
        super().__init__(w)


def contiguous_workspace_shapes(mp: int, M: int, N: int, K: int, topk: int, reduction: str, scaled: bool = True):
    """Workspaces of `contiguous_apply` (bf16 elements, vLLM's semantics)."""
    D = max(K, N // 2)
    # ws13: fp8 [Mp, D] + fp32 scales [D/128, Mp], or bf16 [Mp, D] (input rows, then the
    # activation); ws2: gate/up [Mp, N], then down [Mp, K], bf16
    out = (M, K) if reduction == "experts" else (M, topk, K)
    return (mp, fp8_scaled_bytes(D) // 2 if scaled else D), (mp, max(N, K)), out


def contiguous_apply(gemm, w: ContiguousWeights, align: int, reduction: str, output, prepared, workspace13, workspace2):
    """permute -> gemm(gate/up) -> SiLU-and-mul (+ fp8 quant) -> gemm(down) -> unpermute
    (module doc); gemm(a, a_scale, w, w_scale, out, layout) is the grouped GEMM (scales
    None for bf16)."""
    ids = prepared.topk_ids_MP
    M, P = ids.shape
    E, N, K = w.w13.shape
    I = N // 2
    if M * P == 0:
        return
    mp = max_padded_rows(M * P, E, align)
    D = max(K, I)
    scratch = torch.empty(contiguous_scratch_numel(M * P, E, align), dtype=torch.int32, device=ids.device)
    flat2 = workspace2.reshape(-1)
    h = flat2[: mp * N].view(mp, N)
    blocks = mp // align
    if w.scaled:
        u13 = as_bytes(workspace13)
        assert u13.numel() >= mp * fp8_scaled_bytes(D), (u13.numel(), mp, D)
        a1, a1_s = fp8_rows_with_scales(u13, mp, K, D)
        layout = permute_contiguous(prepared.x, prepared.x_scale, ids, E, align, a1, a1_s, scratch)
        gemm(a1, a1_s, w.w13, w.s13, h, layout)
        act, act_s = fp8_rows_with_scales(u13, mp, I, D)  # a1 is consumed: reuse its bytes
        silu_and_mul(
            h.view(blocks, align, N),
            act.view(blocks, align, I),
            MODE_GROUP,
            scale=act_s,
            expert_num_tokens=layout.counts_B,
            group=GROUP,
        )
    else:
        assert workspace13.is_contiguous(), "workspaces must be contiguous"
        flat13 = workspace13.reshape(-1)
        assert workspace13.dtype == torch.bfloat16 and flat13.numel() >= mp * D, (workspace13.dtype, flat13.numel())
        a1 = flat13[: mp * K].view(mp, K)
        layout = permute_contiguous(prepared.x, None, ids, E, align, a1, None, scratch)
        gemm(a1, None, w.w13, None, h, layout)
        act, act_s = flat13[: mp * I].view(mp, I), None  # a1 is consumed
        silu_and_mul(h.view(blocks, align, N), act.view(blocks, align, I), MODE_BF16, expert_num_tokens=layout.counts_B)
    y = flat2[: mp * K].view(mp, K)  # h is consumed
    gemm(act, act_s, w.w2, w.s2, y, layout)
    unpermute_contiguous(
        y,
        ids.contiguous(),
        prepared.topk_weights_MP.contiguous(),
        layout.inv_R,
        output,
        E,
        reduce=reduction == "experts",
    )
