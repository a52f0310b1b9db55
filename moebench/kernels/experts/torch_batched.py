"""Batched-layout experts in torch: one bmm over [E, X, K] buffers.

Rows past an expert's count are computed too (the buffers are dense) and
ignored by the finalize, as in vLLM's NaiveBatchedExperts.

Legend: E local experts, X rows per expert, K hidden, N = 2I.
"""

from __future__ import annotations

import torch

from ..cards.experts import TorchBatchedCard
from ..interfaces import Experts
from ..registry import register_experts
from .torch import bf16_input, bf16_weights


@register_experts("torch_batched")
class TorchBatchedExperts(TorchBatchedCard, Experts):
    def __init__(self, weights, reduction, ctx):
        super().__init__(weights, reduction, ctx)
        self.w13_EKN, self.w2_EIK = bf16_weights(weights)

    def workspace_shapes(self, M, N, K, topk, num_local_experts):
        E = num_local_experts
        return (E, M, N), (E, M, N // 2), (E, M, K)

    def apply(self, output, prepared, workspace13, workspace2):
        x = bf16_input(prepared)
        # padding rows are uninitialized: clear them so no NaN reaches the output buffer
        X = x.shape[1]
        valid_EX = torch.arange(X, device=x.device)[None, :] < prepared.expert_num_tokens_E[:, None]
        x = torch.where(valid_EX.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device))
        torch.bmm(x, self.w13_EKN, out=workspace13)
        i = workspace13.shape[-1] // 2
        torch.mul(torch.nn.functional.silu(workspace13[..., :i]), workspace13[..., i:], out=workspace2)
        torch.bmm(workspace2, self.w2_EIK, out=output)
