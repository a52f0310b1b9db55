"""Two versions of one experts kernel, registered side by side so that one sweep measures
both: `mykernel_v1` (a loop over experts) and `mykernel_v2` (vectorized). Each wraps a
plain torch function of the dispatched rows and this rank's weights.

Legend: M dispatched rows, P top-k, K hidden, N = 2I gate/up width, I intermediate,
E local experts, X rows of the fullest expert, R local (token, k) pairs.
"""

from __future__ import annotations

import torch

from moebench.kernels.interfaces import ActivationFormat, Experts
from moebench.kernels.reference import silu_and_mul
from moebench.kernels.registry import register_experts

try:
    from moebench.kernels.interfaces import Rule  # a reason no machine lifts (docs/plugins.md)
except ImportError:  # moebench 0.2.0: no marker, a plain reason (counted as the machine's)
    Rule = str


def loop_moe(x_MK, ids_MP, weights_MP, w13_ENK, w2_EKI, reduce: bool) -> torch.Tensor:
    """The local experts one at a time. ids_MP holds local expert ids, -1 for pairs of other
    ranks. Returns [M, K] fp32 (reduce: the weighted sum over this rank's pairs) or
    [M, P, K] in x's dtype (one row per pair, zero rows for other ranks' pairs)."""
    M, P = ids_MP.shape
    K = x_MK.shape[1]
    out = (
        torch.zeros(M, K, dtype=torch.float32, device=x_MK.device)
        if reduce
        else torch.zeros(M, P, K, dtype=x_MK.dtype, device=x_MK.device)
    )
    for e in range(w13_ENK.shape[0]):
        tok, k = torch.nonzero(ids_MP == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        y_RK = silu_and_mul(x_MK[tok] @ w13_ENK[e].T) @ w2_EKI[e].T  # gate/up, SiLU-and-mul, down
        if reduce:
            out.index_add_(0, tok, y_RK.float() * weights_MP[tok, k].float().unsqueeze(1))
        else:
            out[tok, k] = y_RK
    return out


def batched_moe(x_MK, ids_MP, weights_MP, w13_ENK, w2_EKI, reduce: bool) -> torch.Tensor:
    """loop_moe without the Python loop: each expert's pairs padded into [E, X, K], two
    batched matmuls over all experts at once, the rows gathered back. Same result layout."""
    M, P = ids_MP.shape
    E, K = w13_ENK.shape[0], x_MK.shape[1]
    flat = ids_MP.reshape(-1)
    pair_R = torch.nonzero(flat >= 0).squeeze(1)  # token * P + k of this rank's pairs
    e_R = flat[pair_R]
    order = torch.argsort(e_R, stable=True)
    pair_R, e_R = pair_R[order], e_R[order]
    counts_E = torch.bincount(e_R, minlength=E)
    slot_R = torch.arange(pair_R.numel(), device=x_MK.device) - (torch.cumsum(counts_E, 0) - counts_E)[e_R]
    X = int(counts_E.max()) if pair_R.numel() else 0
    x_EXK = x_MK.new_zeros(E, X, K)
    x_EXK[e_R, slot_R] = x_MK[pair_R // P]
    h_EXN = torch.bmm(x_EXK, w13_ENK.transpose(1, 2))
    y_RK = torch.bmm(silu_and_mul(h_EXN), w2_EKI.transpose(1, 2))[e_R, slot_R]
    if reduce:
        out = torch.zeros(M, K, dtype=torch.float32, device=x_MK.device)
        return out.index_add_(0, pair_R // P, y_RK.float() * weights_MP.reshape(-1)[pair_R].float().unsqueeze(1))
    out = torch.zeros(M * P, K, dtype=x_MK.dtype, device=x_MK.device)
    return out.index_copy_(0, pair_R, y_RK).view(M, P, K)


class FunctionExperts(Experts):
    """Experts around a plain function (loop_moe's signature), bf16 weights and activations.
    The function allocates what it needs, so no workspaces are declared."""

    activation_format = ActivationFormat.STANDARD
    graph_capturable = False  # the pair counts reach the host
    fn = staticmethod(loop_moe)

    @classmethod
    def supports(cls, combo):
        if combo["quant"] != "bf16":  # no machine lifts it: a rule of the plan
            return Rule(f"experts={combo['experts']} computes in bf16 only (quant={combo['quant']})")
        return None

    def workspace_shapes(self, M, N, K, topk, num_local_experts):
        out = (M, K) if self.reduction == "experts" else (M, topk, K)
        return (0,), (0,), out

    def transient_bytes(self, M, N, K, topk, num_local_experts):
        # the function's result (fp32 [M, K] or bf16 [M, P, K]) and, per pair, its input row,
        # gate/up and down outputs in bf16; v2 adds padding, not counted here
        result = 4 * M * K if self.reduction == "experts" else 2 * M * topk * K
        return result + 2 * M * topk * (K + N + N // 2 + K)

    def apply(self, output, prepared, workspace13, workspace2):
        assert prepared.x.dtype == torch.bfloat16, "supports() admits bf16 only"
        y = self.fn(
            prepared.x,
            prepared.topk_ids_MP,
            prepared.topk_weights_MP,
            self.w.w13_ENK,
            self.w.w2_EKI,
            reduce=self.reduction == "experts",
        )
        output.copy_(y)


@register_experts("mykernel_v1")
class MyKernelV1(FunctionExperts):
    fn = staticmethod(loop_moe)


@register_experts("mykernel_v2")
class MyKernelV2(FunctionExperts):
    fn = staticmethod(batched_moe)
