"""DeepGEMM above a row count, our Triton experts below it (vLLM's
TritonOrDeepGemmExperts): small batches are latency-bound, where DeepGEMM's
128-row padding per expert costs more than it gains.

The choice depends on the rows after dispatch M only (host-known, no sync):
DeepGEMM when M >= the knob experts.deepgemm_min_tokens (default 256) and
the GEMM shapes are multiples of DeepGEMM's alignment, Triton otherwise.
workspace_shapes and transient_bytes answer for the implementation that runs
at that M (as vLLM's does now), so the declared memory is the one in use.
vLLM also sends I <= 512 to Triton; here the threshold is the only knob. At its default, the
switch-over `moebench tune --decisions` measured for this layer and GPU replaces it (the tiles'
sidecar, kernels/triton/decisions.py), itself looked up once, here.
"""

from __future__ import annotations

from ..cards.experts import DEFAULT_MIN_TOKENS, TritonOrDeepGemmCard
from ..interfaces import Experts
from ..registry import register_experts
from .deepgemm import DeepGemmExperts
from .triton import TritonExperts


@register_experts("triton_or_deepgemm")
class TritonOrDeepGemmExperts(TritonOrDeepGemmCard, Experts):
    def __init__(self, weights, reduction, ctx):
        super().__init__(weights, reduction, ctx)
        self.deepgemm = DeepGemmExperts(weights, reduction, ctx)
        self.triton = TritonExperts(weights, reduction, ctx)
        knob = int((ctx.options or {}).get("deepgemm_min_tokens", DEFAULT_MIN_TOKENS))
        # at the knob's default a tuned switch-over decides (kernels/triton/decisions.py, read once
        # when the Triton experts were built); any other value forces its own
        tuned = self.triton.decisions.deepgemm_min_tokens if self.triton.decisions is not None else None
        self.min_tokens = tuned if knob == DEFAULT_MIN_TOKENS and tuned is not None else knob
        self.last_gemm = ""
        # the rows' tuned_files: the Triton experts' (the sidecar's switch-over decides at every M)
        self.tuned_files = self.triton.tuned_files

    def uses_deepgemm(self, M: int) -> bool:
        """Whether M rows after dispatch go to DeepGEMM."""
        E, N, K = self.w.w13_ENK.shape
        align = self.deepgemm._align()
        return M >= self.min_tokens and N % align == 0 and K % align == 0 and (N // 2) % align == 0

    def _impl(self, M: int) -> Experts:
        return self.deepgemm if self.uses_deepgemm(M) else self.triton

    def workspace_shapes(self, M, N, K, topk, num_local_experts):
        return self._impl(M).workspace_shapes(M, N, K, topk, num_local_experts)

    def transient_bytes(self, M, N, K, topk, num_local_experts):
        return self._impl(M).transient_bytes(M, N, K, topk, num_local_experts)

    def apply(self, output, prepared, workspace13, workspace2):
        impl = self._impl(prepared.topk_ids_MP.shape[0])
        impl.apply(output, prepared, workspace13, workspace2)
        # the rows' contiguous_gemm_used: the Triton experts' contiguous GEMM kernels where they ran
        # (experts.contiguous_gemm at its default, auto: this entry has no such knob), else ""
        self.last_gemm = getattr(impl, "last_gemm", "")
