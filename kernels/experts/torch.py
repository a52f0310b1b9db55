"""Standard-layout experts on torch._grouped_mm (the baseline everything is
compared against).

fp8 weights are dequantized to bf16 once at build and the input is dequantized
after dispatch: the numerics are fp8's, the speed is bf16's.

Legend: M rows, P top-k, K hidden, N = 2I, E local experts, R = valid pairs.
"""
from __future__ import annotations

import torch

from ..interfaces import ActivationFormat, Experts
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
class TorchExperts(Experts):
    activation_format = ActivationFormat.STANDARD

    def __init__(self, weights, reduction, ctx):
        super().__init__(weights, reduction, ctx)
        self.w13_EKN, self.w2_EIK = bf16_weights(weights)

    @classmethod
    def supports(cls, combo):
        return None

    def workspace_shapes(self, M, N, K, topk, num_local_experts):
        # ws13: the pairs' input rows gathered in expert order [M*P, K];
        # ws2: SiLU-and-mul output [M*P, N/2]
        out = (M, K) if self.reduction == "experts" else (M, topk, K)
        return (M * topk, K), (M * topk, N // 2), out

    def transient_bytes(self, M, N, K, topk, num_local_experts):
        # grouped_mm outputs: gate/up [M*P, N] and down [M*P, K], bf16; sort indices;
        # reduction=experts: the fp32 accumulator [M, K] and weighted rows [M*P, K] fp32
        n = 2 * M * topk * (N + K) + 8 * 4 * M * topk
        if self.reduction == "experts":
            n += 4 * M * K + 4 * M * topk * K * 2  # y.float() and its weighted product
        return n

    def apply(self, output, prepared, workspace13, workspace2):
        x_MK = bf16_input(prepared)
        ids_MP = prepared.topk_ids_MP
        M, P = ids_MP.shape
        E = self.w13_EKN.shape[0]
        flat = ids_MP.reshape(-1)
        key = torch.where(flat >= 0, flat, torch.full_like(flat, E))  # non-local pairs last
        order = torch.argsort(key, stable=True)
        counts = torch.bincount(key, minlength=E + 1)[:E]
        offs = torch.cumsum(counts, 0).to(torch.int32)
        R = int(offs[-1]) if E else 0
        pair = order[:R]
        tok = pair // P
        xs = workspace13[:R]
        torch.index_select(x_MK, 0, tok, out=xs)
        h = torch._grouped_mm(xs, self.w13_EKN, offs=offs)  # [R, N]
        act = workspace2[:R]
        i = h.shape[1] // 2
        torch.mul(torch.nn.functional.silu(h[:, :i]), h[:, i:], out=act)
        y = torch._grouped_mm(act, self.w2_EIK, offs=offs)  # [R, K]
        if self.reduction == "experts":
            w = prepared.topk_weights_MP.reshape(-1)[pair].to(torch.float32)
            acc = torch.zeros(M, y.shape[1], dtype=torch.float32, device=y.device)
            acc.index_add_(0, tok, y.float() * w.unsqueeze(1))
            output.copy_(acc)
        else:
            out_R = output.view(M * P, -1)
            out_R.zero_()  # non-local pairs contribute zero rows
            out_R.index_copy_(0, pair, y)
