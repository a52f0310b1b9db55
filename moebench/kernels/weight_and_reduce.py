"""Top-k weight-and-reduce strategies: what the finalize applies to the experts' output
(kernels/interfaces.py re-exports them).

Shape legend as in kernels/interfaces.py (M rows, P top-k, K hidden, E local experts,
X max tokens per expert).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch


class WeightAndReduce(ABC):
    """Turns the experts' output into [M, K] rows weighted by top-k weights."""

    name: ClassVar[str] = "base"

    @abstractmethod
    def apply(
        self,
        out_MK: Optional[torch.Tensor],
        expert_out: torch.Tensor,
        topk_weights_MP: torch.Tensor,
        topk_ids_MP: Optional[torch.Tensor],  # Contiguous's; Batched reads prepared.handle
        # a PreparedTokens: interfaces.py, which re-exports the strategies, defines it (importing
        # it here, even for type checking only, would be an import cycle)
        prepared: Any,
    ) -> torch.Tensor: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoOp(WeightAndReduce):
    """The experts already weighted and summed: expert_out is [M, K]."""

    name = "noop"

    def apply(self, out_MK, expert_out, topk_weights_MP, topk_ids_MP, prepared):
        if out_MK is None:
            return expert_out
        if out_MK.data_ptr() != expert_out.data_ptr():
            out_MK.copy_(expert_out)
        return out_MK


class Contiguous(WeightAndReduce):
    """expert_out is [M, P, K] per-(token, k) rows; pairs not on this rank must
    be zero rows or carry id -1 (their weight is dropped)."""

    name = "contiguous"

    def apply(self, out_MK, expert_out, topk_weights_MP, topk_ids_MP, prepared):
        M, P, K = expert_out.shape
        w = topk_weights_MP.to(torch.float32)
        w = torch.where(topk_ids_MP >= 0, w, torch.zeros_like(w))
        # weighted sum over k, one pass: [M, 1, P] @ [M, P, K]; the weights are
        # rounded to the rows' dtype (bf16), the bmm accumulates in fp32
        w_M1P = w.unsqueeze(1).to(expert_out.dtype)
        if out_MK is None:
            return torch.bmm(w_M1P, expert_out).squeeze(1)
        if out_MK.dtype == expert_out.dtype and out_MK.is_contiguous():
            torch.bmm(w_M1P, expert_out, out=out_MK.view(M, 1, K))  # no [M, K] temporary
        else:
            out_MK.copy_(torch.bmm(w_M1P, expert_out).squeeze(1))
        return out_MK


class Batched(WeightAndReduce):
    """expert_out is [E, X, K]; prepared.handle says which (token, k) each valid row belongs
    to. Rows are weighted and summed per token into [M, K].

    With the handle's `pair_row_MP` (each pair's row of the flat [E * X] buffer, -1 for
    none; kernels/prepare_finalize/_common.to_batched sets it): each token's P rows are
    gathered and summed in one bmm with bf16 weights and fp32 accumulation, as Contiguous
    does, without a host sync. Without it (a plugin's handle): the valid rows are selected
    and scatter-added (a data-dependent size: the host waits for it)."""

    name = "batched"

    def apply(self, out_MK, expert_out, topk_weights_MP, topk_ids_MP, prepared):
        h = prepared.handle
        K = expert_out.shape[-1]
        if getattr(h, "pair_row_MP", None) is not None:
            M, P = h.pair_row_MP.shape
            valid = h.pair_row_MP >= 0
            rows = expert_out.reshape(-1, K).index_select(0, h.pair_row_MP.clamp_min(0).reshape(-1)).view(M, P, K)
            # padding rows are uninitialized (NaN would survive a zero weight): mask, not weight
            rows = torch.where(valid.unsqueeze(-1), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
            w_M1P = torch.where(valid, topk_weights_MP.to(torch.float32), 0.0).to(rows.dtype).unsqueeze(1)
            if out_MK is not None and out_MK.dtype == rows.dtype and out_MK.is_contiguous():
                torch.bmm(w_M1P, rows, out=out_MK.view(M, 1, K))
                return out_MK
            red = torch.bmm(w_M1P, rows).squeeze(1)
            if out_MK is None:
                return red
            out_MK.copy_(red)
            return out_MK
        tok = h.slot_token_EX.reshape(-1)
        kk = h.slot_k_EX.reshape(-1)
        valid = tok >= 0
        tok_v = tok[valid]
        rows = expert_out.reshape(-1, K)[valid].to(torch.float32)
        w = topk_weights_MP[tok_v, kk[valid]].to(torch.float32)
        acc = torch.zeros(h.num_tokens, K, dtype=torch.float32, device=expert_out.device)
        acc.index_add_(0, tok_v, rows * w.unsqueeze(1))
        if out_MK is None:
            return acc.to(expert_out.dtype)
        out_MK.copy_(acc)
        return out_MK


class Delegate(WeightAndReduce):
    """Let the finalize apply its own default (e.g. the combine kernel reduces)."""

    name = "delegate"

    def apply(self, out_MK, expert_out, topk_weights_MP, topk_ids_MP, prepared):
        raise AssertionError("Delegate must be resolved by the PrepareFinalize")


def resolve_weight_and_reduce(wr: WeightAndReduce, default: WeightAndReduce) -> WeightAndReduce:
    """A finalize's choice for Delegate; anything else stands."""
    return default if isinstance(wr, Delegate) else wr


@dataclass
class BatchedHandle:
    """Where each row of a batched [E, X, K] buffer came from (-1: padding)."""

    slot_token_EX: torch.Tensor  # row index into the dispatched token rows
    slot_k_EX: torch.Tensor  # which of the token's top-k pairs
    num_tokens: int  # rows of the dispatched token matrix
    extra: Any = None  # backend-private
    # each (token, k) pair's row of the flat [E * X] buffer, -1 where none: lets Batched
    # reduce without a host sync (optional, for handles built without it)
    pair_row_MP: Optional[torch.Tensor] = None
