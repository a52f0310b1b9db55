"""float32 reference MoE layer every combination is checked against.

Legend: T tokens, P top-k, K hidden, I intermediate, S shared-expert width.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch

# the largest normwise relative error ‖y − ref‖ / ‖ref‖ a combination may show against
# reference_moe, per quant format (above it the row is `incorrect`)
TOLERANCE = {"bf16": 2e-2, "fp8_block": 6e-2, "fp8_tensor": 1e-1}


def silu_and_mul(gate_up_TN: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for gate/up stacked along the last dim ([.., 2I] -> [.., I])."""
    i = gate_up_TN.shape[-1] // 2
    return torch.nn.functional.silu(gate_up_TN[..., :i]) * gate_up_TN[..., i:]


def mlp_fp32(x_TK: torch.Tensor, w13_NK: torch.Tensor, w2_KI: torch.Tensor) -> torch.Tensor:
    """One expert in fp32: down(SiLU(gate x) * up x)."""
    return silu_and_mul(x_TK.float() @ w13_NK.float().T) @ w2_KI.float().T


def reference_moe(
    x_TK: torch.Tensor,
    topk_weights_TP: torch.Tensor,
    topk_ids_TP: torch.Tensor,
    expert_weights: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    kept_experts: Optional[Iterable[int]] = None,
    shared: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> torch.Tensor:
    """fp32 MoE output [T, K].

    expert_weights(e) -> (w13 [2I, K], w2 [K, I]) of global expert e (already
    dequantized where the layer stores fp8). kept_experts: the experts whose
    pairs count (simulate_ep keeps one rank's share); None keeps all.
    shared: (w13 [2S, K], w2 [K, S]) of the fused shared experts, added to every token.
    """
    T, K = x_TK.shape
    out = torch.zeros(T, K, dtype=torch.float32, device=x_TK.device)
    ids = topk_ids_TP.long()
    experts = torch.unique(ids).tolist()
    if kept_experts is not None:
        kept = set(kept_experts)
        experts = [e for e in experts if e in kept]
    for e in experts:
        tok, kk = torch.nonzero(ids == e, as_tuple=True)
        w13, w2 = expert_weights(e)
        y = mlp_fp32(x_TK[tok], w13, w2)
        out.index_add_(0, tok, y * topk_weights_TP[tok, kk].float().unsqueeze(1))
    if shared is not None:
        out += mlp_fp32(x_TK, *shared)
    return out


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Normwise relative error ||y - ref|| / ||ref|| (NaN anywhere -> inf)."""
    y = y.float()
    if not torch.isfinite(y).all():
        return float("inf")
    den = ref.float().norm().item()
    num = (y - ref.float()).norm().item()
    return num / den if den > 0 else num
