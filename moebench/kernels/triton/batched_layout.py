"""Dispatched rows -> per-expert buffers [E, X, K] in two launches (issue #34): the torch
form (`prepare_finalize._common.to_batched`, the reference and the path for many pairs)
takes about thirty small kernels and as many host calls.

  slots   one program walks the pairs in order, CHUNK at a time: a pair's slot inside its
          expert is the count of earlier pairs of that expert (a cumsum of one-hot rows),
          so each expert keeps its pairs in token order, as the torch form's stable sort;
          writes each pair's row (-1 where not kept), each kept row's (token, k), and the
          counts clamped to X
  fill    one program per BLOCK_R rows x BLOCK_K columns: counted rows get their token's
          row (and scales), other rows -1 in the slot maps and scale 1.0; x rows past an
          expert's count stay unwritten, as in the torch form

Legend: M token rows, P top-k, R = M * P pairs, K hidden (elements of the row type), G
scale groups, E local experts, X rows per expert.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import cdiv, next_power_of_2
from .launch import launch

# one program ranks the pairs serially in chunks: past this many the torch form's parallel
# sort is the better trade on the GPU
MAX_PAIRS = 1024


@triton.jit
def _slots_kernel(
    ids_ptr,
    pair_row_ptr,
    slot_token_ptr,
    slot_k_ptr,
    counts_ptr,
    num_pairs,
    num_experts,
    X,
    TOPK: tl.constexpr,
    CHUNK: tl.constexpr,
    NUM_BINS: tl.constexpr,
):
    bins = tl.arange(0, NUM_BINS)
    base = tl.zeros((NUM_BINS,), dtype=tl.int32)
    start = 0
    while start < num_pairs:  # (the interpreter takes no range() over runtime values)
        offs = start + tl.arange(0, CHUNK)
        inr = offs < num_pairs
        ids = tl.load(ids_ptr + offs, mask=inr, other=-1)
        local = inr & (ids >= 0) & (ids < num_experts)
        onehot = ((ids[:, None] == bins[None, :]) & local[:, None]).to(tl.int32)
        before = tl.cumsum(onehot, axis=0) - onehot + base[None, :]  # earlier pairs of the same expert
        rank = tl.sum(onehot * before, axis=1)
        kept = local & (rank < X)
        dst = tl.where(local, ids, 0).to(tl.int64) * X + rank
        tl.store(pair_row_ptr + offs, tl.where(kept, dst, -1), mask=inr)
        tl.store(slot_token_ptr + dst, (offs // TOPK).to(tl.int64), mask=kept)
        tl.store(slot_k_ptr + dst, (offs % TOPK).to(tl.int64), mask=kept)
        base += tl.sum(onehot, axis=0)
        start += CHUNK
    tl.store(counts_ptr + bins, tl.minimum(base, X), mask=bins < num_experts)


@triton.jit
def _fill_kernel(
    x_ptr,
    xo_ptr,
    s_ptr,
    so_ptr,
    slot_token_ptr,
    slot_k_ptr,
    counts_ptr,
    num_rows,
    X,
    K,
    G,
    stride_x,
    stride_xo,
    stride_s,
    stride_so,
    HAS_SCALE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    inr = r < num_rows
    n = tl.load(counts_ptr + r // X, mask=inr, other=0)
    valid = inr & (r % X < n)
    tok = tl.load(slot_token_ptr + r, mask=valid, other=0)
    r64 = r.to(tl.int64)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    m = valid[:, None] & (cols < K)[None, :]
    v = tl.load(x_ptr + tok[:, None] * stride_x + cols[None, :], mask=m)
    tl.store(xo_ptr + r64[:, None] * stride_xo + cols[None, :], v, mask=m)
    if tl.program_id(1) == 0:
        tl.store(slot_token_ptr + r, tl.full((BLOCK_R,), -1, tl.int64), mask=inr & ~valid)
        tl.store(slot_k_ptr + r, tl.full((BLOCK_R,), -1, tl.int64), mask=inr & ~valid)
        if HAS_SCALE:
            g = tl.arange(0, BLOCK_G)
            gm = (g < G)[None, :]
            sv = tl.load(s_ptr + tok[:, None] * stride_s + g[None, :], mask=valid[:, None] & gm, other=1.0)
            tl.store(so_ptr + r64[:, None] * stride_so + g[None, :], sv, mask=inr[:, None] & gm)


def to_batched_triton(x_MK: torch.Tensor, scale, local_ids_MP: torch.Tensor, num_local: int, max_rows: int):
    """-> (x [E, X, K], scale [E, X, G] / the [1] scale / None, counts int32 [E],
    slot_token int64 [E, X], slot_k int64 [E, X], pair_row int64 [M, P]): the torch form's
    values (module doc); flat buffers carry one scratch row past E * X, as there."""
    M, P = local_ids_MP.shape
    K = x_MK.shape[1]
    E, X = num_local, max_rows
    dev = x_MK.device
    ids = local_ids_MP.reshape(-1).contiguous()
    R = ids.numel()
    x_flat = torch.empty(E * X + 1, K, dtype=x_MK.dtype, device=dev)
    slot_token = torch.empty(E * X + 1, dtype=torch.long, device=dev)
    slot_k = torch.empty(E * X + 1, dtype=torch.long, device=dev)
    pair_row = torch.empty(R, dtype=torch.long, device=dev)
    counts = torch.empty(E, dtype=torch.int32, device=dev)
    bins = next_power_of_2(max(E, 2))
    launch(
        _slots_kernel,
        (1,),
        ids,
        pair_row,
        slot_token,
        slot_k,
        counts,
        R,
        E,
        X,
        TOPK=P,
        CHUNK=max(16, min(256, 8192 // bins)),
        NUM_BINS=bins,
        num_warps=4,
    )
    s_flat = None
    if scale is not None and scale.numel() != 1:  # per-row scales
        s_flat = torch.empty(E * X + 1, scale.shape[1], dtype=scale.dtype, device=dev)
    per_row = s_flat is not None
    if E * X:
        bits = torch.uint8 if x_MK.element_size() == 1 else torch.int16  # rows move as bits
        assert x_MK.element_size() in (1, 2) and x_MK.stride(1) == 1, (x_MK.dtype, x_MK.stride())
        xb, ob = x_MK.view(bits), x_flat.view(bits)
        sp, sop = (scale, s_flat) if scale is not None and s_flat is not None else (xb, ob)  # (unread without)
        G = sop.shape[1] if per_row else 1
        block_k = min(1024, next_power_of_2(K))
        launch(
            _fill_kernel,
            (cdiv(E * X, 16), cdiv(K, block_k)),
            xb,
            ob,
            sp,
            sop,
            slot_token,
            slot_k,
            counts,
            E * X,
            X,
            K,
            G,
            xb.stride(0),
            ob.stride(0),
            sp.stride(0),
            sop.stride(0),
            HAS_SCALE=per_row,
            BLOCK_R=16,
            BLOCK_K=block_k,
            BLOCK_G=next_power_of_2(max(G, 2)),
            num_warps=4,
        )
    scale_b = s_flat[: E * X].view(E, X, -1) if s_flat is not None else scale
    return (
        x_flat[: E * X].view(E, X, K),
        scale_b,
        counts,
        slot_token[: E * X].view(E, X),
        slot_k[: E * X].view(E, X),
        pair_row.view(M, P),
    )
