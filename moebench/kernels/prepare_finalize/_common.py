"""Helpers shared by the torch-level PrepareFinalize implementations.

Legend: M dispatched token rows, P top-k, K hidden, E local experts, X rows per expert.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import torch

from ..interfaces import (
    BatchedHandle,
    Contiguous,
    NoOp,
    PreparedTokens,
    PrepareFinalize,
    QuantSpec,
    WeightAndReduce,
    resolve_weight_and_reduce,
)
from ..quant import quant_activations


def prepare_on_rank(
    pf: PrepareFinalize,
    hidden_TK: torch.Tensor,
    topk_weights_TP: torch.Tensor,
    topk_ids_TP: torch.Tensor,
    quant: QuantSpec | None,
) -> Callable[[], PreparedTokens]:
    """prepare_async of a backend that dispatches nothing (local, tp): the rank's own tokens,
    quantized, their ids made local (phase "prepare")."""
    ctx = pf.ctx
    with pf.phases("prepare"):
        # on CUDA with fp8_block and ids to localize: one kernel for both (issue #34)
        x, scale, ids = quant_and_localize(
            hidden_TK, topk_ids_TP, quant, ctx.first_local_expert, ctx.num_local_experts, ctx.shape.num_experts
        )
    prepared = PreparedTokens(x=x, x_scale=scale, topk_ids_MP=ids, topk_weights_MP=topk_weights_TP)
    return lambda: prepared


def finalize_on_rank(
    pf: PrepareFinalize,
    out_TK: torch.Tensor,
    expert_out: torch.Tensor,
    prepared: PreparedTokens,
    weight_and_reduce: WeightAndReduce,
    copy_phase: str | None,
) -> Callable[[], None]:
    """finalize_async of a backend that combines nothing (local, tp): the experts' output weighted
    and reduced into out_TK (phase "weight_reduce"), or copied where the experts did that (none
    where they wrote out_TK: MoEKernel, noop_finalize_copies), timed as `copy_phase` (None: untimed)."""
    wr = resolve_weight_and_reduce(weight_and_reduce, Contiguous())
    if isinstance(wr, NoOp):
        with pf.phases(copy_phase) if copy_phase else nullcontext():
            if expert_out is not out_TK:
                out_TK.copy_(expert_out)
    else:
        assert prepared.topk_weights_MP is not None  # (prepare_on_rank's: the router's weights)
        with pf.phases("weight_reduce"):
            wr.apply(out_TK, expert_out, prepared.topk_weights_MP, prepared.topk_ids_MP, prepared)
    return lambda: None


def _local_as_they_are(topk_ids_MP: torch.Tensor, first: int, num_local: int, num_experts: int | None) -> bool:
    """Every expert local and the ids int64: the valid global ids are the local ones."""
    return num_experts is not None and first == 0 and num_local == num_experts and topk_ids_MP.dtype == torch.int64


def localize_ids(topk_ids_MP: torch.Tensor, first: int, num_local: int, num_experts: int | None = None) -> torch.Tensor:
    """Global expert ids -> local ids in [0, num_local), -1 for pairs of other ranks, int64.

    With `num_experts` (the global count) and every expert local, the valid global ids
    are the local ones: int64 ids come back as they are (no kernel). On CUDA one Triton
    kernel (kernels/triton/routing.py, equal to the torch form below) instead of six."""
    if _local_as_they_are(topk_ids_MP, first, num_local, num_experts):
        return topk_ids_MP
    if topk_ids_MP.is_cuda:
        from ..triton.routing import localize_ids_triton

        return localize_ids_triton(topk_ids_MP, first, num_local)
    return localize_ids_torch(topk_ids_MP, first, num_local)


def fuses_quant_and_localize(
    quant: QuantSpec | None, topk_ids_MP: torch.Tensor, first: int, num_local: int, num_experts: int | None = None
) -> bool:
    """Whether quant_and_localize's one kernel applies (on a device that runs Triton): both halves
    would launch a Triton kernel (1 x 128 fp8 groups; ids that localize_ids must convert)."""
    return quant is not None and quant.is_block and not _local_as_they_are(topk_ids_MP, first, num_local, num_experts)


def quant_and_localize(
    hidden_TK: torch.Tensor,
    topk_ids_MP: torch.Tensor,
    quant: QuantSpec | None,
    first: int,
    num_local: int,
    num_experts: int | None = None,
    fuse: bool | None = None,
):
    """(x, scale or None, int64 local ids like topk_ids_MP): quant_activations(hidden_TK, quant) and
    localize_ids(topk_ids_MP, ...). Where fuses_quant_and_localize, one Triton launch and one
    allocation do both (triton/quant.py: group_quant_and_localize, bit-equal to the two kernels;
    issue #34: a launch and two allocations fewer). `fuse`: take it where it applies (None: with
    both tensors on CUDA; the interpreter's tests pass True on a CPU)."""
    if fuses_quant_and_localize(quant, topk_ids_MP, first, num_local, num_experts) and (
        hidden_TK.is_cuda and topk_ids_MP.is_cuda if fuse is None else fuse
    ):
        from ..triton.quant import group_quant_and_localize

        assert quant is not None  # (fuses_quant_and_localize)
        x = hidden_TK if hidden_TK.stride(-1) == 1 else hidden_TK.contiguous()  # (any row stride)
        return group_quant_and_localize(x, quant.block_k, topk_ids_MP, first, num_local)
    x, scale = quant_activations(hidden_TK, quant)
    return x, scale, localize_ids(topk_ids_MP, first, num_local, num_experts)


def localize_ids_torch(topk_ids_MP: torch.Tensor, first: int, num_local: int) -> torch.Tensor:
    """localize_ids in torch ops (the CPU path and the Triton kernel's reference)."""
    local = topk_ids_MP.long() - first
    keep = (local >= 0) & (local < num_local)
    return torch.where(keep, local, -1)


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
    No host sync (a forward can be captured in a CUDA graph): every index tensor
    is sized for all M*P pairs, and the pairs of other ranks' experts, or past an
    expert's X rows (none for the local and naive layouts, whose X is every row an expert
    could get; the counts are clamped to X), land in one scratch row past the buffer.
    """
    M, P = local_ids_MP.shape
    if (
        x_MK.is_cuda
        and M * P <= _batched_max_pairs()
        and x_MK.element_size() in (1, 2)
        and x_MK.stride(1) == 1
        and (scale is None or scale.numel() == 1 or (scale.dim() == 2 and scale.stride(1) == 1))
    ):
        return to_batched_fused(x_MK, scale, local_ids_MP, num_local, max_rows)  # two launches, not ~30
    K = x_MK.shape[1]
    E, X = num_local, max_rows
    dev = x_MK.device
    flat = local_ids_MP.reshape(-1)  # pair index = token * P + k, token order
    key = torch.where(flat >= 0, flat, E)  # (a scalar other: no full_like launch; same values, int64)
    order = torch.argsort(key, stable=True)  # by expert, token order within; other ranks' pairs last
    e = key[order]
    # (not bincount: on CUDA it reads the largest key back to size its output)
    counts = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(order.numel(), device=dev) - starts[e]
    kept = (e < E) & (slot < X)
    dst = torch.where(kept, e * X + slot, E * X)  # E * X: the scratch row
    tok = order // P
    # flat buffers with the scratch row last; the [E, X, ...] views leave it out
    x_flat = torch.empty(E * X + 1, K, dtype=x_MK.dtype, device=dev)
    bits = torch.uint8 if x_MK.element_size() == 1 else x_MK.dtype  # fp8 rows move as bytes
    x_flat.view(bits).index_copy_(0, dst, x_MK.view(bits).index_select(0, tok))
    scale_b = None
    if scale is not None:
        if scale.numel() == 1:
            scale_b = scale
        else:
            s_flat = torch.ones(E * X + 1, scale.shape[1], dtype=scale.dtype, device=dev)
            s_flat.index_copy_(0, dst, scale.index_select(0, tok))
            scale_b = s_flat[: E * X].view(E, X, -1)
    slot_token = torch.full((E * X + 1,), -1, dtype=torch.long, device=dev)
    slot_k = torch.full((E * X + 1,), -1, dtype=torch.long, device=dev)
    slot_token.index_copy_(0, dst, tok)
    slot_k.index_copy_(0, dst, order % P)
    # each pair's row in the flat [E * X] buffer, -1 for pairs not kept (Batched reads it)
    pair_row = torch.full((M * P,), -1, dtype=torch.long, device=dev)
    pair_row[order] = torch.where(kept, dst, -1)
    handle = BatchedHandle(
        slot_token_EX=slot_token[: E * X].view(E, X),
        slot_k_EX=slot_k[: E * X].view(E, X),
        num_tokens=M,
        pair_row_MP=pair_row.view(M, P),
    )
    return PreparedTokens(
        x=x_flat[: E * X].view(E, X, K),
        x_scale=scale_b,
        expert_num_tokens_E=counts[:E].clamp(max=X).to(torch.int32),
        handle=handle,
    )


def _batched_max_pairs() -> int:
    from ..triton.batched_layout import MAX_PAIRS

    return MAX_PAIRS


def to_batched_fused(x_MK, scale, local_ids_MP, num_local: int, max_rows: int) -> PreparedTokens:
    """to_batched in two Triton launches (kernels/triton/batched_layout.py: the same values,
    checked against the torch form above under the interpreter); few pairs on CUDA take it."""
    from ..triton.batched_layout import to_batched_triton

    M = local_ids_MP.shape[0]
    x, scale_b, counts, slot_token, slot_k, pair_row = to_batched_triton(x_MK, scale, local_ids_MP, num_local, max_rows)
    handle = BatchedHandle(slot_token_EX=slot_token, slot_k_EX=slot_k, num_tokens=M, pair_row_MP=pair_row)
    return PreparedTokens(x=x, x_scale=scale_b, expert_num_tokens_E=counts, handle=handle)
