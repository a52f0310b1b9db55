"""Batched-layout experts on DeepGEMM's `m_grouped_fp8_gemm_nt_masked`
(fp8_block, SM90): [E, X, K] buffers with expert_num_tokens_E valid rows each,
as DeepEP low-latency / pplx / local_batched produce them (vLLM's
BatchedDeepGemmExperts). The finalize weights and sums (reduction=finalize).

  gate/up   m_grouped_fp8_gemm_nt_masked -> [E, Xp, N] bf16 (masked_m = counts)
  act       SiLU-and-mul + 1x128 fp8 quantization of counted rows (our Triton kernel)
  down      m_grouped_fp8_gemm_nt_masked -> [E, X, K] bf16

The masked kernel stores whole BLOCK_M (64 / 128) row tiles of an [E*X, N] view,
so with X not a multiple of 128 an expert's last tile would overwrite the next
expert's rows: then (and for a bf16 input) the counted rows are first copied
into [E, Xp, K] (Xp = X rounded up to 128) and the down output copied back.
`expected_m` (DeepGEMM's tile heuristic) is X * topk / num_experts, uniform routing.

Legend: E local experts, X rows per expert, Xp padded, K hidden, N = 2I.
"""

from __future__ import annotations

import torch

from ..cards.experts import DeepGemmMaskedCard
from ..interfaces import FP8_DTYPE, Experts
from ..registry import register_experts
from ..triton.activation import MODE_GROUP, silu_and_mul
from ..triton.common import as_bytes
from ..triton.deepgemm_layout import GROUP, pad_batched, padded_rows, unpad_batched
from ..triton.moe import alloc_bytes
from . import _deep_gemm
from ._contiguous import DeepGemmWeights, fp8_scaled_bytes

ROW_ALIGN = 128  # the largest BLOCK_M the masked kernel picks on SM90


def _carve_batched(u8: torch.Tensor, E: int, X: int, cols: int, width: int, mn_major: bool):
    """fp8 [E, X, cols] at byte 0 and fp32 scales [E, X, cols/128] at byte E*X*width:
    row-major, or MN-major per expert (strides (X*G, 1, X))."""
    g = cols // GROUP
    a = u8[: E * X * cols].view(FP8_DTYPE).view(E, X, cols)
    off = E * X * width
    flat = u8[off : off + 4 * E * X * g].view(torch.float32)
    s = flat.view(E, g, X).transpose(1, 2) if mn_major else flat.view(E, X, g)
    return a, s


@register_experts("deepgemm_masked")
class DeepGemmMaskedExperts(DeepGemmMaskedCard, Experts):
    def __init__(self, weights, reduction, ctx):
        if reduction != "finalize":
            raise ValueError("deepgemm_masked supports reduction=finalize only (the batched combine reduces)")
        super().__init__(weights, reduction, ctx)
        self.dg_w = DeepGemmWeights(weights)

    def expected_m(self, X: int) -> int:
        """Rows per expert DeepGEMM should plan its tiles for: X * topk / num_experts."""
        s = self.ctx.shape
        return max(1, min(X, -(-X * s.topk // s.num_experts)))

    def workspace_shapes(self, M, N, K, topk, num_local_experts):
        # M is X. ws13: gate/up [E, Xp, N] (padded: then the down output [E, Xp, K]);
        # ws2: the fp8 activation + fp32 scales (padded: first the padded fp8 input)
        E, I = num_local_experts, N // 2
        xp = padded_rows(M, ROW_ALIGN)
        padded = xp != M
        D = max(I, K) if padded else I
        return (E, xp, max(N, K) if padded else N), (E, xp, fp8_scaled_bytes(D) // 2), (E, M, K)

    def transient_bytes(self, M, N, K, topk, num_local_experts):
        """DeepGEMM's MN-major copy of row-major activation scales, one GEMM at a time:
        the activation's [E, Xp, I/128] and, when the dispatched fp8 rows are used in
        place (X a multiple of 128), theirs [E, X, K/128]. Not counted: the fp8 copy of
        a bf16 input with X a multiple of 128 (only behind a dispatch that cannot carry fp8)."""
        E, I = num_local_experts, N // 2
        if E * M == 0:
            return 0
        xp = padded_rows(M, ROW_ALIGN)
        n = alloc_bytes(4 * E * xp * (I // GROUP))
        if xp == M:
            n = max(n, alloc_bytes(4 * E * xp * (K // GROUP)))
        return n

    def apply(self, output, prepared, workspace13, workspace2):
        dg = _deep_gemm.require()
        w = self.dg_w
        x, counts = prepared.x, prepared.expert_num_tokens_E
        E, X, K = x.shape
        N = w.w13.shape[1]
        I = N // 2
        if E == 0 or X == 0:
            return
        if counts.dtype != torch.int32 or not counts.is_contiguous():
            counts = counts.to(torch.int32).contiguous()
        xp = padded_rows(X, ROW_ALIGN)
        padded = xp != X
        u2 = as_bytes(workspace2)
        # ws2's row width: the activation's, or (padded) that of the padded input too
        D = max(I, K) if u2.numel() >= E * xp * fp8_scaled_bytes(max(I, K)) else I
        if padded or x.dtype != FP8_DTYPE:
            if D >= K:
                a1, a1_s = _carve_batched(u2, E, xp, K, D, mn_major=True)
            else:  # X a multiple of 128 with a bf16 input: ws2 holds only the activation
                a1 = torch.empty(E, xp, K, dtype=FP8_DTYPE, device=x.device)
                a1_s = torch.empty(E, K // GROUP, xp, dtype=torch.float32, device=x.device).transpose(1, 2)
            pad_batched(x, prepared.x_scale, counts, a1, a1_s)
        else:
            a1, a1_s = x, prepared.x_scale  # row-major scales: DeepGEMM makes them MN-major
        exp_m = self.expected_m(X)
        flat13 = workspace13.reshape(-1)
        h = flat13[: E * xp * N].view(E, xp, N)
        dg.m_grouped_fp8_gemm_nt_masked((a1, a1_s), (w.w13, w.s13), h, counts, exp_m, disable_ue8m0_cast=True)
        act, act_s = _carve_batched(u2, E, xp, I, D, mn_major=False)  # a1 is consumed
        silu_and_mul(h, act, MODE_GROUP, scale=act_s, expert_num_tokens=counts, group=GROUP)
        y = flat13[: E * xp * K].view(E, xp, K) if padded else output  # h is consumed
        dg.m_grouped_fp8_gemm_nt_masked((act, act_s), (w.w2, w.s2), y, counts, exp_m, disable_ue8m0_cast=True)
        if padded:
            unpad_batched(y, counts, output)
