"""Row layouts around the grouped GEMMs of the contiguous experts pipeline: DeepGEMM's fp8
GEMMs (the `deepgemm*` experts) and our TMA GEMM (the `triton` experts, bf16 and fp8_block).

contiguous (m_grouped_fp8_gemm_nt_contiguous): the pairs of each local expert
  get a segment of rows padded to the alignment A (128 on SM90): segments come
  from `moe_align_block_size` with BLOCK_M = A (no host sync: the row count is
  the upper bound `max_padded_rows`). `permute_contiguous` then, in one launch,
    * gathers each pair's token row (fp8 + its 1x128 scales, or bf16 quantized on
      the fly) into its slot; scales go MN-major (element (row, g) at g * Mp + row),
      the TMA-aligned layout DeepGEMM reads without a transpose of its own; bf16
      rows are copied as they are (the `triton` experts' bf16 contiguous layout);
    * writes both grouped layouts DeepGEMM 2.8.2 accepts: `m_indices_Mp` (expert
      of each row, -1 for padding rows) and `ends_E` (use_psum_layout: expert e's
      rows are [align(ends[e-1], A), ends[e]));
    * the slot of each local pair (`inv_R`) and the valid rows of each A-row block
      (`counts_B`: blocks are [B, A, *] "experts" for the batched SiLU-and-mul).
  `unpermute_contiguous` gathers the rows back per token: weighted and summed
  over top-k into [M, K] (reduction in the experts) or one row per pair [M*P, K]
  with zero rows for pairs not on this rank.
batched (m_grouped_fp8_gemm_nt_masked): the masked kernel stores whole BLOCK_M
  row tiles of a [E*X, N] view, across expert boundaries, so X must be a multiple
  of 128; `pad_batched` copies each expert's counted rows into [E, Xp, K] (scales
  MN-major per expert, quantizing a bf16 input), `unpad_batched` copies them back.

Legend: M token rows, P top-k, R = M*P pairs, K row width, E local experts,
A alignment, Mp padded rows, B = Mp / A blocks, G = K / 128 scale groups,
X rows per expert (batched), Xp = X rounded up to 128.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..interfaces import FP8_DTYPE, FP8_MAX
from .align import align_scratch_numel, max_padded_rows, moe_align_block_size
from .common import cast_out, cdiv, next_power_of_2, to_fp8
from .launch import interpreted, launch
from .quant import EPS

GROUP = 128  # activation scale group (1 x 128)


def contiguous_scratch_numel(num_pairs: int, num_experts: int, align: int) -> int:
    """int32 elements `permute_contiguous` needs: the alignment's sort + block experts
    + meta, inv_R, m_indices_Mp, counts_B, ends_E."""
    mp = max_padded_rows(num_pairs, num_experts, align)
    return align_scratch_numel(num_pairs, num_experts, align) + num_pairs + mp + mp // align + num_experts


@dataclass
class ContiguousLayout:
    """Where each pair went (all int32, on the device)."""

    num_rows: int  # Mp: rows of the permuted buffers (upper bound, host-known)
    m_indices_Mp: torch.Tensor  # expert of each row, -1 for padding
    ends_E: torch.Tensor  # psum layout: end row of each expert's pairs
    counts_B: torch.Tensor  # valid (leading) rows of each A-row block
    inv_R: torch.Tensor  # slot of each local pair (unwritten for pairs of other ranks)
    num_post: torch.Tensor  # [1]: rows in use, every expert's segment (the tiles past it are padding)


@triton.jit
def _permute_kernel(
    x_ptr,
    xs_ptr,  # x [M, K] fp8 (+ scales [M, G]) or bf16
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_ptr,  # from moe_align_block_size
    a_ptr,
    as_ptr,  # a [Mp, K] fp8 (bf16 with COPY); scales MN-major: (row, g) at g * Mp + row
    m_idx_ptr,
    inv_ptr,
    counts_ptr,
    ends_ptr,
    num_pairs,
    num_experts,
    Mp,
    K,
    stride_xm,
    stride_xsm,
    stride_xsg,
    TOPK: tl.constexpr,
    A: tl.constexpr,
    GROUP: tl.constexpr,
    NUM_BINS: tl.constexpr,
    QUANT_IN: tl.constexpr,
    COPY: tl.constexpr,
    FP8_MAX: tl.constexpr,
    EPS: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    b = tl.program_id(0)  # block of A rows
    g = tl.program_id(1)  # scale group along K
    num_post = tl.load(num_post_ptr)
    s = b * A + tl.arange(0, A)
    pair = tl.load(sorted_ids_ptr + s, mask=s < num_post, other=num_pairs)
    valid = pair < num_pairs  # padding slots hold the sentinel num_pairs
    tok = (pair // TOPK).to(tl.int64)
    s64 = s.to(tl.int64)
    if b * A < num_post:
        cols = g * GROUP + tl.arange(0, GROUP)
        x = tl.load(x_ptr + tok[:, None] * stride_xm + cols[None, :], mask=valid[:, None], other=0.0)
        if COPY:  # bf16 rows, no scales
            tl.store(a_ptr + s64[:, None] * K + cols[None, :], x, mask=valid[:, None])
        else:
            if QUANT_IN:
                xf = x.to(tl.float32)
                scale = tl.maximum(tl.max(tl.abs(xf), axis=1), EPS) / FP8_MAX
                q = to_fp8(tl.clamp(xf / scale[:, None], -FP8_MAX, FP8_MAX), a_ptr.dtype.element_ty, EXACT_ROUND)
            else:
                q = x
                scale = tl.load(xs_ptr + tok * stride_xsm + g * stride_xsg, mask=valid, other=0.0)
            tl.store(a_ptr + s64[:, None] * K + cols[None, :], q, mask=valid[:, None])
            tl.store(as_ptr + g.to(tl.int64) * Mp + s64, scale, mask=valid)
    if g == 0:  # the row metadata, once per block
        in_post = b * A < num_post
        e = tl.load(expert_ids_ptr + b, mask=in_post, other=-1)
        tl.store(m_idx_ptr + s, tl.where(valid, e, -1))
        tl.store(inv_ptr + pair, s, mask=valid)
        cnt = tl.sum(valid.to(tl.int32), axis=0)
        tl.store(counts_ptr + b, cnt)
        # psum ends: the last block of an expert ends its rows; experts without
        # pairs end where the next expert with pairs starts (or at num_post)
        nb = num_post // A
        bins = tl.arange(0, NUM_BINS)
        known = bins < num_experts
        fill = tl.zeros((NUM_BINS,), dtype=tl.int32)
        if b < nb:
            prev = tl.load(expert_ids_ptr + b - 1, mask=b > 0, other=-1)
            nxt = tl.load(expert_ids_ptr + b + 1, mask=b + 1 < nb, other=num_experts)
            if nxt != e:
                tl.store(ends_ptr + e, b * A + cnt)
            tl.store(ends_ptr + bins, fill + b * A, mask=known & (bins > prev) & (bins < e))
            if b == nb - 1:
                tl.store(ends_ptr + bins, fill + num_post, mask=known & (bins > e))
        if nb == 0:
            if b == 0:
                tl.store(ends_ptr + bins, fill, mask=known)


# the interpreter's rounding work-around, decided when the module's kernels were decorated
# (alike: TRITON_INTERPRET then): once, not per launch
_EXACT_ROUND = interpreted(_permute_kernel)


def permute_contiguous(
    x_MK: torch.Tensor,
    x_scale_MG,
    topk_ids_MP: torch.Tensor,
    num_experts: int,
    align: int,
    a_MpK: torch.Tensor,
    a_scale: torch.Tensor | None,
    scratch: torch.Tensor,
) -> ContiguousLayout:
    """Sort pairs by expert into DeepGEMM's contiguous layout (see the module doc).

    x_MK fp8 with x_scale_MG fp32 [M, K/128], or bf16 (quantized here, x_scale None);
    topk_ids_MP local ids, -1 for pairs of other ranks; a_MpK fp8 [Mp, K] and
    a_scale fp32 [Mp, K/128] with strides (1, Mp) receive the rows; scratch: int32,
    at least `contiguous_scratch_numel` elements. bf16 rows instead: x_MK and a_MpK
    bf16, x_scale_MG and a_scale None (copied, not quantized)."""
    M, P = topk_ids_MP.shape
    K = x_MK.shape[1]
    R = M * P
    mp = max_padded_rows(R, num_experts, align)
    need = align_scratch_numel(R, num_experts, align)
    assert scratch.dtype == torch.int32 and scratch.numel() >= contiguous_scratch_numel(R, num_experts, align)
    copy = a_scale is None
    assert a_MpK.shape == (mp, K) and a_MpK.is_contiguous(), (a_MpK.shape, mp)
    if a_scale is None:  # copy
        assert a_MpK.dtype == x_MK.dtype != FP8_DTYPE and x_scale_MG is None, (a_MpK.dtype, x_MK.dtype)
    else:
        assert a_MpK.dtype == FP8_DTYPE, a_MpK.dtype
        assert a_scale.shape == (mp, K // GROUP) and a_scale.stride() == (1, mp), (a_scale.shape, a_scale.stride())
    assert x_MK.stride(1) == 1 and K % GROUP == 0
    sorted_ids, expert_ids, num_post = moe_align_block_size(topk_ids_MP, num_experts, align, scratch[:need])
    rest = scratch[need:]
    inv, rest = rest[:R], rest[R:]
    m_idx, rest = rest[:mp], rest[mp:]
    counts, rest = rest[: mp // align], rest[mp // align :]
    ends = rest[:num_experts]
    quant_in = x_MK.dtype != FP8_DTYPE and not copy
    xs = x_MK if quant_in or copy else x_scale_MG
    assert quant_in or copy or (x_scale_MG is not None and x_scale_MG.shape == (M, K // GROUP)), (
        "fp8 input needs 1x128 scales"
    )
    if mp:
        launch(
            _permute_kernel,
            (mp // align, K // GROUP),
            x_MK,
            xs,
            sorted_ids,
            expert_ids,
            num_post,
            a_MpK,
            a_MpK if copy else a_scale,
            m_idx,
            inv,
            counts,
            ends,
            R,
            num_experts,
            mp,
            K,
            x_MK.stride(0),
            xs.stride(0),
            xs.stride(1),
            TOPK=P,
            A=align,
            GROUP=GROUP,
            NUM_BINS=next_power_of_2(num_experts + 1),
            QUANT_IN=quant_in,
            COPY=copy,
            FP8_MAX=FP8_MAX,
            EPS=EPS,
            EXACT_ROUND=_EXACT_ROUND,
            num_warps=4,
        )
    return ContiguousLayout(num_rows=mp, m_indices_Mp=m_idx, ends_E=ends, counts_B=counts, inv_R=inv, num_post=num_post)


@triton.jit
def _unpermute_kernel(
    y_ptr,
    ids_ptr,
    w_ptr,
    inv_ptr,
    out_ptr,
    num_experts,
    K,
    stride_ym,
    stride_om,
    TOPK: tl.constexpr,
    REDUCE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # a token (REDUCE) or a pair
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    cmask = cols < K
    if REDUCE:
        acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k in tl.static_range(TOPK):
            pair = row * TOPK + k
            e = tl.load(ids_ptr + pair)
            mine = (e >= 0) & (e < num_experts)
            slot = tl.load(inv_ptr + pair, mask=mine, other=0).to(tl.int64)
            wk = tl.load(w_ptr + pair, mask=mine, other=0.0).to(tl.float32)
            y = tl.load(y_ptr + slot * stride_ym + cols, mask=cmask & mine, other=0.0).to(tl.float32)
            acc += wk * y
        tl.store(out_ptr + row * stride_om + cols, cast_out(acc, out_ptr.dtype.element_ty, EXACT_ROUND), mask=cmask)
    else:
        e = tl.load(ids_ptr + row)
        mine = (e >= 0) & (e < num_experts)
        slot = tl.load(inv_ptr + row, mask=mine, other=0).to(tl.int64)
        y = tl.load(y_ptr + slot * stride_ym + cols, mask=cmask & mine, other=0.0)
        tl.store(out_ptr + row * stride_om + cols, y.to(out_ptr.dtype.element_ty), mask=cmask)


def unpermute_contiguous(
    y_MpK: torch.Tensor,
    topk_ids_MP: torch.Tensor,
    topk_weights_MP: torch.Tensor,
    inv_R: torch.Tensor,
    out: torch.Tensor,
    num_experts: int,
    reduce: bool,
    block_k: int = 1024,
) -> None:
    """reduce: out [M, K] = sum_k w[t, k] * y[slot(t, k)] over local pairs (fp32
    accumulation); else out [M, P, K] (or [M*P, K]) = y[slot(pair)], zero rows for
    pairs of other ranks."""
    M, P = topk_ids_MP.shape
    K = y_MpK.shape[1]
    assert topk_ids_MP.is_contiguous() and topk_weights_MP.is_contiguous() and y_MpK.stride(1) == 1
    rows = M if reduce else M * P
    out2 = out.view(rows, K)
    assert out2.stride(1) == 1
    if rows == 0:
        return
    block_k = min(block_k, next_power_of_2(K))
    launch(
        _unpermute_kernel,
        (rows, cdiv(K, block_k)),
        y_MpK,
        topk_ids_MP,
        topk_weights_MP,
        inv_R,
        out2,
        num_experts,
        K,
        y_MpK.stride(0),
        out2.stride(0),
        TOPK=P,
        REDUCE=reduce,
        BLOCK_K=block_k,
        EXACT_ROUND=_EXACT_ROUND,
        num_warps=4,
    )


# ---------------------------------------------------------------------------
# batched layout


def padded_rows(X: int, multiple: int = 128) -> int:
    """X rounded up to `multiple` (the masked kernel's safe per-expert row count)."""
    return -(-X // multiple) * multiple


@triton.jit
def _pad_batched_kernel(
    x_ptr,
    xs_ptr,
    counts_ptr,
    a_ptr,
    as_ptr,
    Xp,
    K,
    G,
    stride_xe,
    stride_xr,
    stride_xse,
    stride_xsr,
    stride_xsg,
    BLOCK_R: tl.constexpr,
    GROUP: tl.constexpr,
    QUANT_IN: tl.constexpr,
    FP8_MAX: tl.constexpr,
    EPS: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    e = tl.program_id(0).to(tl.int64)
    r0 = tl.program_id(1) * BLOCK_R
    g = tl.program_id(2)
    n_e = tl.load(counts_ptr + e)
    if r0 < n_e:
        r = r0 + tl.arange(0, BLOCK_R)
        valid = r < n_e
        cols = g * GROUP + tl.arange(0, GROUP)
        x = tl.load(x_ptr + e * stride_xe + r[:, None] * stride_xr + cols[None, :], mask=valid[:, None], other=0.0)
        if QUANT_IN:
            xf = x.to(tl.float32)
            scale = tl.maximum(tl.max(tl.abs(xf), axis=1), EPS) / FP8_MAX
            q = to_fp8(tl.clamp(xf / scale[:, None], -FP8_MAX, FP8_MAX), a_ptr.dtype.element_ty, EXACT_ROUND)
        else:
            q = x
            scale = tl.load(xs_ptr + e * stride_xse + r * stride_xsr + g * stride_xsg, mask=valid, other=0.0)
        tl.store(a_ptr + (e * Xp + r)[:, None] * K + cols[None, :], q, mask=valid[:, None])
        tl.store(as_ptr + e * Xp * G + g * Xp + r, scale, mask=valid)


def pad_batched(
    x_EXK: torch.Tensor,
    x_scale,
    expert_num_tokens_E: torch.Tensor,
    a_EXpK: torch.Tensor,
    a_scale: torch.Tensor,
    block_r: int = 16,
) -> None:
    """Copy each expert's counted rows of x [E, X, K] (fp8 with scales [E, X, K/128],
    or bf16: quantized here) into a [E, Xp, K] fp8 and a_scale [E, Xp, K/128] fp32
    with strides (Xp * G, 1, Xp) (MN-major per expert, as DeepGEMM reads it)."""
    E, X, K = x_EXK.shape
    Xp = a_EXpK.shape[1]
    G = K // GROUP
    assert a_EXpK.shape == (E, Xp, K) and a_EXpK.is_contiguous() and Xp >= X and Xp % 4 == 0
    assert a_scale.shape == (E, Xp, G) and a_scale.stride() == (Xp * G, 1, Xp), a_scale.stride()
    assert x_EXK.stride(2) == 1
    quant_in = x_EXK.dtype != FP8_DTYPE
    xs = x_EXK if quant_in else x_scale
    assert quant_in or (x_scale is not None and x_scale.shape == (E, X, G)), "fp8 input needs [E, X, K/128] scales"
    if E == 0 or X == 0:
        return
    launch(
        _pad_batched_kernel,
        (E, cdiv(X, block_r), G),
        x_EXK,
        xs,
        expert_num_tokens_E,
        a_EXpK,
        a_scale,
        Xp,
        K,
        G,
        x_EXK.stride(0),
        x_EXK.stride(1),
        xs.stride(0),
        xs.stride(1),
        xs.stride(2),
        BLOCK_R=block_r,
        GROUP=GROUP,
        QUANT_IN=quant_in,
        FP8_MAX=FP8_MAX,
        EPS=EPS,
        EXACT_ROUND=_EXACT_ROUND,
        num_warps=4,
    )


@triton.jit
def _unpad_batched_kernel(
    y_ptr,
    counts_ptr,
    out_ptr,
    X,
    Xp,
    K,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    e = tl.program_id(0).to(tl.int64)
    r0 = tl.program_id(1) * BLOCK_R
    n_e = tl.load(counts_ptr + e)
    if r0 < n_e:
        r = r0 + tl.arange(0, BLOCK_R)
        cols = tl.program_id(2) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = (r < n_e)[:, None] & (cols < K)[None, :]
        y = tl.load(y_ptr + (e * Xp + r)[:, None] * K + cols[None, :], mask=mask)
        tl.store(out_ptr + (e * X + r)[:, None] * K + cols[None, :], y, mask=mask)


def unpad_batched(
    y_EXpK: torch.Tensor,
    expert_num_tokens_E: torch.Tensor,
    out_EXK: torch.Tensor,
    block_r: int = 16,
    block_k: int = 512,
) -> None:
    """out[e, :n_e] = y[e, :n_e]; rows past n_e are left unwritten (the finalize
    reads only counted rows)."""
    E, Xp, K = y_EXpK.shape
    X = out_EXK.shape[1]
    assert y_EXpK.is_contiguous() and out_EXK.is_contiguous() and out_EXK.shape == (E, X, K)
    if E == 0 or X == 0:
        return
    block_k = min(block_k, next_power_of_2(K))
    launch(
        _unpad_batched_kernel,
        (E, cdiv(X, block_r), cdiv(K, block_k)),
        y_EXpK,
        expert_num_tokens_E,
        out_EXK,
        X,
        Xp,
        K,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        num_warps=4,
    )
