"""SiLU-and-mul between the expert GEMMs, fused with the fp8 quantization the
down GEMM needs, plus the zeroing of rows no local expert wrote.

act = SiLU(h[:, :I]) * h[:, I:] (gate = first I columns, up = last I, as
reference.py), computed in fp32 from the bf16 gate/up rows, then:
  MODE_BF16     stored bf16;
  MODE_AMAX     not stored: its absolute max is atomically maxed into amax[0]
                (pass 1 of per-tensor quant: recomputing SiLU costs the same
                bytes as storing and re-reading a bf16 copy, and needs no buffer);
  MODE_TENSOR   quantized with scale = amax / 448 (pass 2), scale stored once;
  MODE_GROUP    quantized per 1 x GROUP group, fp32 scales [rows, I / GROUP].
Only rows that hold a pair are read: sorted slots (standard) or the first
expert_num_tokens_E rows of each expert (batched); other rows may be garbage
and would poison a per-tensor amax. `silu_and_mul_rows`: the bf16 form over every
row of a dense [R, 2S] (the shared experts).

Legend: rows = pairs (standard) or E * X (batched), N = 2I gate/up width.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..interfaces import FP8_MAX
from .common import cast_out, cdiv, next_power_of_2, to_fp8
from .launch import interpreted, launch
from .quant import EPS

MODE_BF16, MODE_AMAX, MODE_TENSOR, MODE_GROUP = 0, 1, 2, 3


@triton.jit
def _silu_mul_kernel(
    h_ptr,  # [rows, 2I] bf16
    out_ptr,  # [rows, I] bf16 or fp8
    scale_ptr,  # MODE_GROUP: [rows, I / BLOCK_C]; MODE_TENSOR: [1]
    amax_ptr,  # [1] fp32
    sorted_ids_ptr,
    num_post_ptr,
    num_valid,
    counts_ptr,
    X,
    I,
    stride_hm,
    stride_om,
    stride_sm,
    stride_sg,
    BATCHED: tl.constexpr,
    MODE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    FP8_MAX: tl.constexpr,
    EPS: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    if MODE == 2:
        scale = tl.maximum(tl.load(amax_ptr), EPS) / FP8_MAX
        if (pid_r == 0) & (pid_c == 0):  # before any early exit: the GEMM reads it
            tl.store(scale_ptr, scale)
    if BATCHED:
        num_rblk = tl.cdiv(X, BLOCK_R)
        e = pid_r // num_rblk
        r0 = (pid_r % num_rblk) * BLOCK_R
        n_e = tl.load(counts_ptr + e)
        if r0 >= n_e:
            return
        r = r0 + tl.arange(0, BLOCK_R)
        valid = r < n_e
        rows = e.to(tl.int64) * X + r
    else:
        num_post = tl.load(num_post_ptr)
        if pid_r * BLOCK_R >= num_post:
            return
        slot = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        rows = tl.load(sorted_ids_ptr + slot, mask=slot < num_post, other=num_valid).to(tl.int64)
        valid = rows < num_valid
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = valid[:, None] & (cols[None, :] < I)
    h_ptrs = h_ptr + rows[:, None] * stride_hm + cols[None, :]
    g = tl.load(h_ptrs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h_ptrs + I, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    o_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    if MODE == 0:
        tl.store(o_ptrs, cast_out(y, out_ptr.dtype.element_ty, EXACT_ROUND), mask=mask)
    elif MODE == 1:
        tl.atomic_max(amax_ptr, tl.max(tl.abs(y)), sem="relaxed")
    elif MODE == 2:
        q = tl.clamp(y / scale, -FP8_MAX, FP8_MAX)
        tl.store(o_ptrs, to_fp8(q, out_ptr.dtype.element_ty, EXACT_ROUND), mask=mask)
    else:
        s = tl.maximum(tl.max(tl.abs(y), axis=1), EPS) / FP8_MAX
        q = tl.clamp(y / s[:, None], -FP8_MAX, FP8_MAX)
        tl.store(o_ptrs, to_fp8(q, out_ptr.dtype.element_ty, EXACT_ROUND), mask=mask)
        tl.store(scale_ptr + rows * stride_sm + pid_c * stride_sg, s, mask=valid)


# the interpreter's rounding work-around (common.py): decided when the kernel was decorated
_EXACT_ROUND = interpreted(_silu_mul_kernel)


def silu_and_mul(
    h: torch.Tensor,
    out: torch.Tensor,
    mode: int = MODE_BF16,
    scale: Optional[torch.Tensor] = None,
    amax: Optional[torch.Tensor] = None,
    *,
    sorted_ids: Optional[torch.Tensor] = None,
    num_post: Optional[torch.Tensor] = None,
    num_pairs: int = 0,
    expert_num_tokens: Optional[torch.Tensor] = None,
    group: int = 128,
    block_r: int = 16,
) -> None:
    """out[row] = SiLU(h[row, :I]) * h[row, I:] (quantized as `mode` says).

    Rows: standard layout via (sorted_ids, num_post, num_pairs) from align.py,
    h [pairs, 2I]; batched via expert_num_tokens [E], h [E, X, 2I]. MODE_AMAX
    needs amax zeroed first and writes nothing else.
    """
    batched = expert_num_tokens is not None
    N = h.shape[-1]
    I = N // 2
    # 2-D tensors go as they are (a view op costs ~0.7 µs a call: issue #34)
    h2 = h if h.dim() == 2 else h.reshape(-1, N)
    # a view: the kernel writes through it (reshape could copy)
    o2 = out if out.dim() == 2 else out.view(-1, out.shape[-1])
    (h_sm, h_sc), (o_sm, o_sc) = h2.stride(), o2.stride()
    assert h_sc == 1 and o_sc == 1 and out.shape[-1] == I
    block_c = group if mode == MODE_GROUP else min(256, next_power_of_2(I))
    if mode == MODE_GROUP:
        assert I % group == 0, f"I={I} is not a multiple of the group {group}"
        assert scale is not None, "MODE_GROUP writes scales"
        # fails loudly where a copy would be written
        s_m, s_g = (scale if scale.dim() == 2 else scale.view(-1, scale.shape[-1])).stride()
    else:
        s_m, s_g = 0, 0
    if batched:
        E, X = h.shape[0], h.shape[1]
        num_rblk = E * cdiv(X, block_r)
        ids, post, counts = h2, h2, expert_num_tokens
    else:
        assert sorted_ids is not None and num_post is not None, "the standard layout: sorted_ids and num_post"
        X = 0
        num_rblk = cdiv(sorted_ids.numel(), block_r)
        ids, post, counts = sorted_ids, num_post, sorted_ids
    if mode == MODE_TENSOR:  # the store of the scale sits in program (0, 0)
        num_rblk = max(num_rblk, 1)
    if num_rblk == 0:
        return
    dummy = h2
    launch(
        _silu_mul_kernel,
        (num_rblk, cdiv(I, block_c)),
        h2,
        o2,
        scale if scale is not None else dummy,
        amax if amax is not None else dummy,
        ids,
        post,
        num_pairs,
        counts,
        X,
        I,
        h_sm,
        o_sm,
        s_m,
        s_g,
        BATCHED=batched,
        MODE=mode,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        FP8_MAX=FP8_MAX,
        EPS=EPS,
        EXACT_ROUND=_EXACT_ROUND,
        num_warps=4,
    )


@triton.jit
def _silu_mul_rows_kernel(
    h_ptr,  # [R, 2S] bf16
    out_ptr,  # [R, S] bf16
    R,
    S,
    stride_hm,
    stride_om,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    """Every row of a dense h (the shared experts' gate/up): MODE_BF16's math, one pass."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r < R)[:, None] & (c[None, :] < S)
    rows = r.to(tl.int64)
    h_ptrs = h_ptr + rows[:, None] * stride_hm + c[None, :]
    g = tl.load(h_ptrs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h_ptrs + S, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    y = cast_out(y, out_ptr.dtype.element_ty, EXACT_ROUND)
    tl.store(out_ptr + rows[:, None] * stride_om + c[None, :], y, mask=mask)


def silu_and_mul_rows(h_RN: torch.Tensor, block_r: int = 16) -> torch.Tensor:
    """SiLU(h[:, :S]) * h[:, S:] of every row of a 2-D bf16 h [R, 2S] (unit column stride) ->
    a new bf16 [R, S], in one kernel (torch's silu and mul are two; reference.silu_and_mul is
    the same math, rounded once here instead of twice)."""
    R, N = h_RN.shape
    S = N // 2
    h_sm, h_sc = h_RN.stride()
    assert N == 2 * S and h_sc == 1 and h_RN.dtype == torch.bfloat16, (h_RN.shape, h_RN.stride(), h_RN.dtype)
    out = torch.empty((R, S), dtype=h_RN.dtype, device=h_RN.device)
    if R and S:
        block_c = min(256, next_power_of_2(S))
        launch(
            _silu_mul_rows_kernel,
            (cdiv(R, block_r), cdiv(S, block_c)),
            h_RN,
            out,
            R,
            S,
            h_sm,
            S,
            BLOCK_R=block_r,
            BLOCK_C=block_c,
            EXACT_ROUND=_EXACT_ROUND,
            num_warps=4,
        )
    return out


@triton.jit
def _zero_rows_kernel(
    out_ptr, ids_ptr, num_rows, num_experts, K, stride_om, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ids = tl.load(ids_ptr + r, mask=r < num_rows, other=0)
    drop = (r < num_rows) & ((ids < 0) | (ids >= num_experts))
    zeros = tl.zeros((BLOCK_R, BLOCK_C), dtype=out_ptr.dtype.element_ty)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * stride_om + c[None, :], zeros, mask=drop[:, None] & (c[None, :] < K))


def zero_nonlocal_rows(out_RK: torch.Tensor, topk_ids: torch.Tensor, num_experts: int) -> None:
    """Zero out_RK[pair] for every pair whose expert id is not local (-1)."""
    ids = topk_ids.reshape(-1)
    R, K = out_RK.shape
    assert ids.numel() == R and out_RK.stride(1) == 1
    if R == 0:
        return
    block_r, block_c = 16, 256
    launch(
        _zero_rows_kernel,
        (cdiv(R, block_r), cdiv(K, block_c)),
        out_RK,
        ids,
        R,
        num_experts,
        K,
        out_RK.stride(0),
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=4,
    )
