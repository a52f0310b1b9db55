"""Standard-layout experts on our own Triton fused-MoE kernels (kernels/triton/).

Pairs are aligned by expert on the device (no host sync), the gate/up and down
GEMMs are vLLM-style grouped GEMMs over the sorted pairs, SiLU-and-mul is fused
with the fp8 activation quantization. reduction="experts" weights and sums in
the down-GEMM epilogue: fp32 atomics into an accumulator carved from ws13
(whose gate/up rows are consumed by then), so no [M, P, K] buffer exists.

Legend: M rows, P top-k, K hidden, N = 2I, E local experts.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from ..interfaces import ActivationFormat, Experts
from ..registry import register_experts
from ..triton.config import config_block_shape, config_dtype, get_config
from ..triton.moe import alloc_bytes, fused_moe_standard, input_quant_bytes, standard_scratch_numel


def _quant_name(combo: dict) -> str:
    q = combo.get("quant", "bf16")
    if isinstance(q, dict) or hasattr(q, "get"):
        q = q.get("name", "bf16")
    return str(q)


def triton_unsupported(combo: dict) -> Optional[str]:
    """Reason the Triton experts cannot run `combo`, or None (both layouts)."""
    device = str(combo.get("device", "cuda"))
    quant = _quant_name(combo)
    if not device.startswith("cuda"):
        if os.environ.get("TRITON_INTERPRET") != "1":
            return "Triton experts need a CUDA GPU (or TRITON_INTERPRET=1 for the interpreter)"
    elif quant.startswith("fp8") and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            return f"fp8 tl.dot needs compute capability >= 8.9 (this GPU is {major}.{minor})"
    if quant == "fp8_block":
        hidden, inter = combo.get("hidden"), combo.get("intermediate")
        bad = [f"{n}={v}" for n, v in (("hidden", hidden), ("intermediate", inter)) if v is not None and int(v) % 128]
        if bad:
            return f"fp8_block needs hidden and intermediate to be multiples of 128 ({', '.join(bad)})"
    return None


class TritonConfigMixin:
    """Tile config per row count: ctx.options["triton_config"] (a dict with
    vLLM's keys, e.g. from the tuner) overrides kernels/configs/ and the heuristic."""

    def _config(self, M: int, topk: int) -> dict:
        cache = self.__dict__.setdefault("_config_cache", {})  # no file look-ups in the hot path
        if (M, topk) not in cache:
            override = self.ctx.options.get("triton_config") if self.ctx.options else None
            if override:
                cfg = dict(override)
                if self.w.quant.is_block:  # a K tile must stay inside one scale group
                    cfg["BLOCK_SIZE_K"] = min(cfg["BLOCK_SIZE_K"], self.w.quant.block_k)
            else:
                q = self.w.quant
                E, _, I = self.w.w2_EKI.shape
                cfg = get_config(E, I, M, config_dtype(q.name), config_block_shape(q.name, q.block_n, q.block_k), topk=topk)
            cache[(M, topk)] = cfg
        return cache[(M, topk)]


@register_experts("triton")
class TritonExperts(TritonConfigMixin, Experts):
    activation_format = ActivationFormat.STANDARD
    graph_capturable = True

    @classmethod
    def supports(cls, combo):
        return triton_unsupported(combo)

    def workspace_shapes(self, M, N, K, topk, num_local_experts):
        # ws13: gate/up rows of every pair [M*P, N] (later: the fp32 [M, K] reduce
        # accumulator); ws2: the activation [M*P, N/2] (fp8 modes: its fp8 bytes and scales)
        out = (M, K) if self.reduction == "experts" else (M, topk, K)
        return (M * topk, N), (M * topk, N // 2), out

    def transient_bytes(self, M, N, K, topk, num_local_experts):
        """int32 sort scratch; an fp32 [M, K] accumulator only if ws13 is too small
        (K > P * I); an fp8 input copy only if a bf16 input does not fit in ws2."""
        if M * topk == 0:
            return 0
        bm = self._config(M, topk)["BLOCK_SIZE_M"]
        n = alloc_bytes(4 * standard_scratch_numel(M, topk, num_local_experts, bm))
        if self.reduction == "experts" and 4 * M * K > 2 * M * topk * N:
            n += alloc_bytes(4 * M * K)
        q = self.w.quant
        if q.is_fp8 and input_quant_bytes(M, K, q) > 2 * M * topk * (N // 2):
            n += alloc_bytes(M * K) + (alloc_bytes(4 * M * (K // q.block_k)) if q.is_block else 0)
        return n

    def apply(self, output, prepared, workspace13, workspace2):
        ids = prepared.topk_ids_MP
        fused_moe_standard(
            prepared.x, prepared.x_scale, ids, prepared.topk_weights_MP, self.w,
            output, workspace13, workspace2, self._config(ids.shape[0], ids.shape[1]), self.reduction,
        )
