"""Helpers shared by the torch-level PrepareFinalize implementations.

Legend: M dispatched token rows, P top-k, K hidden, E local experts, X rows per expert.
"""
from __future__ import annotations

import torch

from ..interfaces import BatchedHandle, Knob, PreparedTokens


def localize_ids(topk_ids_MP: torch.Tensor, first: int, num_local: int) -> torch.Tensor:
    """Global expert ids -> local ids in [0, num_local), -1 for pairs of other ranks."""
    local = topk_ids_MP.long() - first
    keep = (local >= 0) & (local < num_local)
    return torch.where(keep, local, torch.full_like(local, -1))


def to_batched(
    x_MK: torch.Tensor,
    scale: torch.Tensor | None,
    local_ids_MP: torch.Tensor,
    num_local: int,
    max_rows: int,
) -> PreparedTokens:
    """Scatter dispatched rows into per-expert buffers [E, X, K].

    Rows of one expert keep their token order; slots past the expert's count
    are padding (left uninitialized: batched experts read only counted rows).
    """
    M, P = local_ids_MP.shape
    K = x_MK.shape[1]
    dev = x_MK.device
    flat = local_ids_MP.reshape(-1)
    valid = flat >= 0
    pair = torch.nonzero(valid).squeeze(1)  # pair index = token * P + k, token order
    e = flat[pair]
    order = torch.argsort(e, stable=True)
    pair, e = pair[order], e[order]
    counts_E = torch.bincount(e, minlength=num_local)
    starts = torch.cumsum(counts_E, 0) - counts_E
    slot = torch.arange(pair.numel(), device=dev) - starts[e]
    assert pair.numel() == 0 or int(counts_E.max()) <= max_rows, "batched buffer overflow"
    x_EXK = torch.empty(num_local, max_rows, K, dtype=x_MK.dtype, device=dev)
    tok = pair // P
    x_EXK[e, slot] = x_MK[tok]
    scale_b = None
    if scale is not None:
        if scale.numel() == 1:
            scale_b = scale
        else:
            scale_b = torch.ones(num_local, max_rows, scale.shape[1], dtype=scale.dtype, device=dev)
            scale_b[e, slot] = scale[tok]
    slot_token = torch.full((num_local, max_rows), -1, dtype=torch.long, device=dev)
    slot_k = torch.full((num_local, max_rows), -1, dtype=torch.long, device=dev)
    slot_token[e, slot] = tok
    slot_k[e, slot] = pair % P
    handle = BatchedHandle(slot_token_EX=slot_token, slot_k_EX=slot_k, num_tokens=M)
    return PreparedTokens(
        x=x_EXK, x_scale=scale_b, expert_num_tokens_E=counts_E.to(torch.int32), handle=handle
    )


# the batched buffers of deepep_ll and pplx are sized for this many tokens per rank
MAX_TOKENS_KNOB = Knob("max_tokens_per_rank", 512, "tokens per rank the batched buffers hold (DeepEP "
                       "low-latency's num_max_dispatch_tokens_per_rank, pplx's max_num_tokens)", minimum=1,
                       tag="cap{}")


def max_tokens_reason(combo, tokens: int):
    """Why `tokens` per rank do not fit the batched buffers of `combo`, or None."""
    cap = combo.get("max_tokens_per_rank", MAX_TOKENS_KNOB.default)
    if tokens > cap:
        return f"{tokens} tokens per rank exceed the batched buffers' cap backend.max_tokens_per_rank={cap}"
    return None
