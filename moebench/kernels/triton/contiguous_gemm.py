"""Grouped GEMM (fp8 block-scaled, or bf16) over the contiguous (expert-sorted) row layout.

The rows of every local expert sit in one segment padded to ALIGN rows (the layout
`deepgemm_layout.permute_contiguous` builds for DeepGEMM), so every BLOCK_M row tile
belongs to one expert and A is a plain [Mp, K] matrix: both operands are loaded
with TMA (tensor descriptors), which the gathered-row kernel of gemm.py cannot do.

    c[r] = sum_g (a[r, g] . w[e(r), :, g]) * a_scale[r, g] * w_scale[e(r), n / 128, g]

a [Mp, K] fp8, a_scale [Mp, G] fp32 MN-major (strides (1, Mp): one K group's scales
of a row tile are contiguous), w [E, N, K] fp8, w_scale [E, N/128, G] fp32,
m_indices [Mp] int32 (expert of each row, -1 for padding), c [Mp, N] bf16. Row
tiles whose first row is padding are skipped (their rows are never read). bf16: a and w
bf16, no scales, c[r] = a[r] . w[e(r)] (timed against DeepGEMM's bf16 GEMM by
benchmarks/triton_fp8_contiguous.py).

Tiles are walked by a persistent grid (at most one program per SM) in
GROUP_SIZE_M-swizzled order, so consecutive tiles share B columns in L2. One opt-in option
(issue #35): BOUNDED walks only the row tiles below the layout's rows in use (`rows_in_use`,
the alignment's num_post: with 128-row tiles every one of them starts on a valid row, so no
padding branch; an EP share's padding tiles, most of the upper bound, are not walked):
measured on an H200, 9.5-15 % faster on DeepSeek-V3's EP-8 down GEMM at 4096-16384 tokens,
within 2 % elsewhere, not the default. Triton's automatic warp specialization of this tile
loop (`tl.range(..., warp_specialize=True)`) hung on every launch on an H200, fp8 and bf16
alike, and was removed (the record: docs/findings/triton-vs-deepgemm.md); the warp-specialized
route is the Gluon kernel of gluon_contiguous.py.

Legend: Mp padded rows, N output columns, K reduction dim (multiple of 128),
E experts, G = K / 128 scale groups.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import cast_out, cdiv, num_sms
from .launch import interpreted, launch

ALIGN = 128  # rows per expert segment are a multiple of this (DeepGEMM's SM90 alignment)
GROUP = 128  # 1 x 128 activation / 128 x 128 weight scale blocks

# fp8: best of 12 tiles on an H200 (docs/findings/triton-vs-deepgemm.md); BLOCK_K is the scale group
DEFAULT_CONFIG = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=8, num_warps=8, num_stages=4)
# bf16: best of 6 tiles on an H200 at 16384 tokens, both GEMMs of three models (0.85-0.98x
# DeepGEMM's bf16 GEMM; docs/findings/triton-vs-deepgemm.md); BLOCK_SIZE_N 128 where N % 256 != 0
BF16_CONFIG = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3)


@triton.jit
def _tile_body(
    a_desc,
    b_desc,
    c_ptr,
    as_ptr,
    bs_ptr,
    expert,
    pid_m,
    pid_n,
    N,
    stride_cm,
    stride_asm,
    stride_asg,
    stride_bse,
    stride_bsn,
    stride_bsk,
    K: tl.constexpr,
    SCALED: tl.constexpr,
    GROUP_N: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    off_m = pid_m * BLOCK_SIZE_M
    off_n = pid_n * BLOCK_SIZE_N
    offs_m = off_m + tl.arange(0, BLOCK_SIZE_M)
    b_row = expert * N + off_n
    e64 = expert.to(tl.int64)
    if BLOCK_SIZE_N <= GROUP_N:  # one weight scale per K group
        bs_ptrs = bs_ptr + e64 * stride_bse + (off_n // GROUP_N) * stride_bsn
    else:
        bs_ptrs = bs_ptr + e64 * stride_bse + ((off_n + tl.arange(0, BLOCK_SIZE_N)) // GROUP_N) * stride_bsn
    as_ptrs = as_ptr + offs_m.to(tl.int64) * stride_asm
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, K // BLOCK_SIZE_K):
        a = a_desc.load([off_m, k * BLOCK_SIZE_K])
        b = b_desc.load([b_row, k * BLOCK_SIZE_K])
        if INTERPRET:  # the interpreter's dot takes no fp8
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if SCALED:
            g = (k * BLOCK_SIZE_K) // GROUP_N
            a_s = tl.load(as_ptrs + g * stride_asg)
            b_s = tl.load(bs_ptrs + g * stride_bsk)
            if BLOCK_SIZE_N <= GROUP_N:
                acc += tl.dot(a, b.T) * (a_s * b_s)[:, None]
            else:
                acc += tl.dot(a, b.T) * a_s[:, None] * b_s[None, :]
        else:
            acc = tl.dot(a, b.T, acc=acc)
    offs_n = off_n + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, cast_out(acc, c_ptr.dtype.element_ty, INTERPRET), mask=(offs_n < N)[None, :])


@triton.jit
def _tile(
    a_desc,
    b_desc,
    c_ptr,
    as_ptr,
    bs_ptr,
    m_idx_ptr,
    tile,
    num_pid_m,
    num_pid_n,
    N,
    stride_cm,
    stride_asm,
    stride_asg,
    stride_bse,
    stride_bsn,
    stride_bsk,
    K: tl.constexpr,
    SCALED: tl.constexpr,
    GROUP_N: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    CHECK: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] output tile of the GROUP_SIZE_M-swizzled order; with CHECK
    skipped where its first row is padding (without, every tile walked has a valid first row)."""
    num_in_group = GROUP_SIZE_M * num_pid_n
    group_id = tile // num_in_group
    first_m = group_id * GROUP_SIZE_M
    group_m = min(num_pid_m - first_m, GROUP_SIZE_M)
    pid_m = first_m + (tile % num_in_group) % group_m
    pid_n = (tile % num_in_group) // group_m
    expert = tl.load(m_idx_ptr + pid_m * BLOCK_SIZE_M)
    if CHECK:
        if expert >= 0:
            _tile_body(
                a_desc,
                b_desc,
                c_ptr,
                as_ptr,
                bs_ptr,
                expert,
                pid_m,
                pid_n,
                N,
                stride_cm,
                stride_asm,
                stride_asg,
                stride_bse,
                stride_bsn,
                stride_bsk,
                K,
                SCALED,
                GROUP_N,
                BLOCK_SIZE_M,
                BLOCK_SIZE_N,
                BLOCK_SIZE_K,
                INTERPRET,
            )
    else:
        _tile_body(
            a_desc,
            b_desc,
            c_ptr,
            as_ptr,
            bs_ptr,
            expert,
            pid_m,
            pid_n,
            N,
            stride_cm,
            stride_asm,
            stride_asg,
            stride_bse,
            stride_bsn,
            stride_bsk,
            K,
            SCALED,
            GROUP_N,
            BLOCK_SIZE_M,
            BLOCK_SIZE_N,
            BLOCK_SIZE_K,
            INTERPRET,
        )


@triton.jit
def _contiguous_kernel(
    a_desc,  # [Mp, K] fp8, block [BLOCK_M, BLOCK_K]
    b_desc,  # [E * N, K] fp8, block [BLOCK_N, BLOCK_K]
    c_ptr,  # [Mp, N]
    as_ptr,  # a_scale: (row, g) at row * stride_asm + g * stride_asg
    bs_ptr,  # w_scale [E, N/128, G]
    m_idx_ptr,  # [Mp] int32
    rows_ptr,  # [1] int32: rows in use (every expert's segment), read with BOUNDED
    Mp,
    N,
    num_programs,
    tiles_per_program,
    stride_cm,
    stride_asm,
    stride_asg,
    stride_bse,
    stride_bsn,
    stride_bsk,
    K: tl.constexpr,
    SCALED: tl.constexpr,  # fp8 block scales (else bf16, no scales)
    GROUP_N: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    INTERPRET: tl.constexpr,
    BOUNDED: tl.constexpr = False,  # walk only the row tiles in use (BLOCK_SIZE_M == ALIGN)
):
    if BOUNDED:  # segments are ALIGN-padded: every tile below the rows in use starts with a valid row
        num_pid_m = tl.cdiv(tl.load(rows_ptr), BLOCK_SIZE_M)
    else:
        num_pid_m = tl.cdiv(Mp, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_tiles = num_pid_m * num_pid_n
    i = 0
    while i < tiles_per_program:  # (the interpreter takes no range() over runtime values)
        tile = tl.program_id(0) + i * num_programs
        i += 1
        if tile < num_tiles:  # the last pass of some programs has no tile (and group_m would be 0)
            _tile(
                a_desc,
                b_desc,
                c_ptr,
                as_ptr,
                bs_ptr,
                m_idx_ptr,
                tile,
                num_pid_m,
                num_pid_n,
                N,
                stride_cm,
                stride_asm,
                stride_asg,
                stride_bse,
                stride_bsn,
                stride_bsk,
                K,
                SCALED,
                GROUP_N,
                BLOCK_SIZE_M,
                BLOCK_SIZE_N,
                BLOCK_SIZE_K,
                GROUP_SIZE_M,
                not BOUNDED,
                INTERPRET,
            )


# decided when the kernel was decorated (TRITON_INTERPRET then): once, not per launch
_INTERPRET = interpreted(_contiguous_kernel)


def _descriptor(t: torch.Tensor, block: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block_shape=block)


def contiguous_gemm(
    a: torch.Tensor,
    a_scale: Optional[torch.Tensor],
    w: torch.Tensor,
    w_scale: Optional[torch.Tensor],
    c: torch.Tensor,
    m_indices: torch.Tensor,
    config: dict | None = None,
    num_programs: int | None = None,
    rows_in_use: Optional[torch.Tensor] = None,
) -> None:
    """c [Mp, N] = per-row-expert grouped GEMM of a [Mp, K] with w [E, N, K] (see module doc):
    fp8 with a_scale / w_scale, or bf16 with both None.

    num_programs caps the persistent grid (default: the SM count; the interpreter
    runs one program per tile). rows_in_use: int32 [1] on the device, the rows of every
    expert's segment (the layout's num_post); config BOUNDED=True walks only their tiles
    (BLOCK_SIZE_M must be ALIGN; issue #35)."""
    scaled = a_scale is not None
    assert scaled == (w_scale is not None), "fp8 needs both scales, bf16 neither"
    Mp, K = a.shape
    E, N, Kw = w.shape
    cfg = dict(DEFAULT_CONFIG if scaled else BF16_CONFIG)
    if N % cfg["BLOCK_SIZE_N"]:
        cfg["BLOCK_SIZE_N"] = GROUP
    cfg.update(config or {})
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    assert K == Kw and K % bk == 0 and (not scaled or (K % GROUP == 0 and bk == GROUP)), (a.shape, w.shape, bk)
    assert Mp % ALIGN == 0 and ALIGN % bm == 0 and N % bn == 0, (Mp, N, bm, bn)
    assert bn <= GROUP or bn % GROUP == 0, bn
    assert a.stride(1) == 1 and w.is_contiguous() and c.stride(1) == 1 and m_indices.numel() >= Mp
    if a_scale is not None and w_scale is not None:  # scaled
        assert a_scale.shape == (Mp, K // GROUP) and w_scale.shape == (E, N // GROUP, K // GROUP), (
            a_scale.shape,
            w_scale.shape,
        )
    assert "WS" not in cfg, "WS (Triton's warp specialization) hung on every launch and was removed (issue #35)"
    bounded = bool(cfg.get("BOUNDED", False))
    assert not bounded or (rows_in_use is not None and bm == ALIGN), "BOUNDED: rows_in_use and 128-row tiles"
    if Mp == 0:
        return
    tiles = (Mp // bm) * (N // bn)
    if num_programs is None:
        num_programs = tiles if _INTERPRET or not a.is_cuda else num_sms(a.device.index or 0)
    grid = (max(1, min(tiles, num_programs)),)
    a_desc = _descriptor(a, [bm, bk])
    b_desc = _descriptor(w.view(E * N, K), [bn, bk])
    a_s = a_scale if scaled else m_indices  # (unread without scales)
    w_s = w_scale if scaled else m_indices
    a_strides = tuple(a_scale.stride()) if a_scale is not None else (0, 0)
    w_strides = tuple(w_scale.stride()) if w_scale is not None else (0, 0, 0)
    launch(
        _contiguous_kernel,
        grid,
        a_desc,
        b_desc,
        c,
        a_s,
        w_s,
        m_indices,
        rows_in_use if bounded else m_indices,
        Mp,
        N,
        grid[0],
        cdiv(tiles, grid[0]),
        c.stride(0),
        *a_strides,
        *w_strides,
        K=K,
        SCALED=scaled,
        GROUP_N=GROUP,
        BLOCK_SIZE_M=bm,
        BLOCK_SIZE_N=bn,
        BLOCK_SIZE_K=bk,
        GROUP_SIZE_M=cfg["GROUP_SIZE_M"],
        INTERPRET=_INTERPRET,
        BOUNDED=bounded,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
