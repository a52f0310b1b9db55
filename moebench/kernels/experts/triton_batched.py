"""Batched-layout experts on our own Triton kernels: read the [E, X, K] buffers
and expert_num_tokens_E exactly as DeepEP low-latency / pplx produce them (no
re-layout, no sort); each expert's first n_e rows are computed, rows past n_e
are left unwritten (the finalize reads only counted rows).

Legend: E local experts, X rows per expert, K hidden, N = 2I.
"""

from __future__ import annotations

from ..cards.experts import TritonBatchedCard
from ..interfaces import Experts
from ..registry import register_experts
from ..triton.config import files_label
from ..triton.moe import alloc_bytes, fused_moe_batched, input_quant_bytes
from .triton import TritonConfigMixin


@register_experts("triton_batched")
class TritonBatchedExperts(TritonBatchedCard, TritonConfigMixin, Experts):
    def __init__(self, weights, reduction, ctx):
        if reduction != "finalize":
            raise ValueError("triton_batched supports reduction=finalize only (the batched combine reduces)")
        super().__init__(weights, reduction, ctx)
        self.tuned_files = files_label([self._tiles_file()])  # the rows' tuned_files (no sidecar read here)

    def workspace_shapes(self, M, N, K, topk, num_local_experts):
        # M is X, the rows of each expert's buffer; fp8 modes keep the fp8
        # activation and its scales in ws2's bytes
        E = num_local_experts
        return (E, M, N), (E, M, N // 2), (E, M, K)

    def transient_bytes(self, M, N, K, topk, num_local_experts):
        """A [4] fp32 amax/scale scratch for fp8_tensor. A bf16 input (fp8_tensor behind
        pplx / deepep_ll) is quantized into the output's bytes, so an fp8 copy of it is
        allocated only if it does not fit there (under 8 elements: never at real shapes)."""
        q, rows = self.w.quant, num_local_experts * M
        if not q.is_fp8 or rows == 0:
            return 0
        n = 0 if q.is_block else alloc_bytes(4 * 4)
        if input_quant_bytes(rows, K, q) > 2 * rows * K:
            n += alloc_bytes(rows * K) + (alloc_bytes(4 * rows * (K // q.block_k)) if q.is_block else 0)
        return n

    def apply(self, output, prepared, workspace13, workspace2):
        x = prepared.x
        fused_moe_batched(
            x,
            prepared.x_scale,
            prepared.expert_num_tokens_E,
            self.w,
            output,
            workspace13,
            workspace2,
            self._config(x.shape[1], self.ctx.shape.topk),
        )
