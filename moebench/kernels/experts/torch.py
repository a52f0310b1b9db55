"""Standard-layout experts on torch._grouped_mm (the baseline everything is
compared against).

fp8 weights are dequantized to bf16 once at build and the input is dequantized
after dispatch: the numerics are fp8's, the speed is bf16's.

Legend: M rows, P top-k, K hidden, N = 2I, E local experts, R = valid pairs.
"""

from __future__ import annotations

import torch

from ..cards.experts import TorchCard
from ..interfaces import Experts
from ..quant import dequant_activations, dequant_weight
from ..registry import register_experts


def bf16_weights(w) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 [E, K, N], w2 [E, I, K]) bf16, transposed for x @ w."""
    w13 = dequant_weight(w.w13_ENK, w.w13_scale, w.quant).to(torch.bfloat16)
    w2 = dequant_weight(w.w2_EKI, w.w2_scale, w.quant).to(torch.bfloat16)
    return w13.transpose(1, 2), w2.transpose(1, 2)


def bf16_input(prepared) -> torch.Tensor:
    x = prepared.x
    if x.dtype == torch.bfloat16:
        return x
    return dequant_activations(x, prepared.x_scale, None).to(torch.bfloat16)


@register_experts("torch")
class TorchExperts(TorchCard, Experts):
    """torch._grouped_mm over the pairs sorted by expert. No host sync (so a forward can be
    captured in a CUDA graph): the group offsets stay on the GPU, and every tensor is sized
    for all M*P pairs, the pairs of other ranks' experts sorted last and left out of the
    groups (as DeepGEMM's contiguous layout pads to an upper bound). Row 0 of the gathered
    input is a zero row inside the first group, so that row 0 of the output is exactly zero:
    the pairs of other ranks read it."""

    def __init__(self, weights, reduction, ctx):
        super().__init__(weights, reduction, ctx)
        self.w13_EKN, self.w2_EIK = bf16_weights(weights)

    def workspace_shapes(self, M, N, K, topk, num_local_experts):
        # ws13: a zero row, then the pairs' input rows gathered in expert order [1 + M*P, K];
        # ws2: SiLU-and-mul output [1 + M*P, N/2]
        out = (M, K) if self.reduction == "experts" else (M, topk, K)
        return (1 + M * topk, K), (1 + M * topk, N // 2), out

    def transient_bytes(self, M, N, K, topk, num_local_experts):
        # grouped_mm outputs: gate/up [1+M*P, N] and down [1+M*P, K], bf16; SiLU(gate) [1+M*P, N/2];
        # sort keys, order, positions (int64 [M*P] each); reduction=experts: the gathered
        # down rows [M*P, K] bf16 the weighted bmm reads, and its bf16 weights
        Q = 1 + M * topk
        n = 2 * Q * (N + K + N // 2) + 3 * 8 * M * topk
        if self.reduction == "experts":
            n += 2 * M * topk * K + 2 * M * topk
        return n

    def apply(self, output, prepared, workspace13, workspace2):
        x_MK = bf16_input(prepared)
        ids_MP = prepared.topk_ids_MP
        M, P = ids_MP.shape
        E = self.w13_EKN.shape[0]
        flat = ids_MP.reshape(-1)
        Q = flat.numel()
        local = flat >= 0
        key = torch.where(local, flat, torch.full_like(flat, E))  # other ranks' pairs last
        order = torch.argsort(key, stable=True)
        # (not bincount: on CUDA it reads the largest key back to size its output)
        counts = torch.zeros(E + 1, dtype=torch.long, device=key.device).scatter_add_(0, key, torch.ones_like(key))[:E]
        offs = (torch.cumsum(counts, 0) + 1).to(torch.int32)  # +1: the zero row opens group 0
        xs = workspace13[: 1 + Q]
        xs[0].zero_()
        torch.index_select(x_MK, 0, order // P, out=xs[1:])
        h = torch._grouped_mm(xs, self.w13_EKN, offs=offs)  # [1+Q, N]; rows past the groups unwritten
        act = workspace2[: 1 + Q]
        i = h.shape[1] // 2
        torch.mul(torch.nn.functional.silu(h[:, :i]), h[:, i:], out=act)
        y = torch._grouped_mm(act, self.w2_EIK, offs=offs)  # [1+Q, K]; y[0] == 0
        # where each (token, k) pair's output row is: 1 + its place in the sorted order, or
        # the zero row for other ranks' pairs
        pos = torch.empty_like(order)
        pos[order] = torch.arange(1, Q + 1, device=order.device)
        pos = torch.where(local, pos, torch.zeros_like(pos))
        if self.reduction == "experts":
            # weighted sum over k in one bmm ([M, 1, P] @ [M, P, K], fp32 accumulation); the
            # weights are rounded to bf16, as the finalize's Contiguous reduce does
            w_M1P = torch.where(local, prepared.topk_weights_MP.reshape(-1).float(), 0.0).to(y.dtype).view(M, 1, P)
            torch.bmm(w_M1P, y.index_select(0, pos).view(M, P, -1), out=output.view(M, 1, -1))
        else:
            torch.index_select(y, 0, pos, out=output.view(M * P, -1))
