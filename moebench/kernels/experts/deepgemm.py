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

The pipeline is shared with the `triton` experts (kernels/experts/_contiguous.py).
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

from ..cards.experts import DeepGemmCard
from ..interfaces import Experts
from ..registry import register_experts
from ..triton.align import max_padded_rows
from ..triton.deepgemm_layout import contiguous_scratch_numel
from ..triton.moe import alloc_bytes
from . import _deep_gemm
from ._contiguous import DeepGemmWeights, contiguous_apply, contiguous_workspace_shapes


@register_experts("deepgemm")
class DeepGemmExperts(DeepGemmCard, Experts):
    # SM90 grouped layout: per-expert row ends (vLLM's choice; no work past the last
    # expert) or, False, the expert of every row with -1 for padding
    use_psum_layout = True

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
            dg.m_grouped_fp8_gemm_nt_contiguous(
                (a, a_s), (w, w_s), out, grouped, disable_ue8m0_cast=True, use_psum_layout=psum
            )

        contiguous_apply(
            gemm, self.dg_w, _deep_gemm.mk_alignment(), self.reduction, output, prepared, workspace13, workspace2
        )
