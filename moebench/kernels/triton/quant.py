"""Dynamic fp8 activation quantization in Triton (the torch reference math is
kernels/quant.py; the scales here follow its layouts exactly).

  per_token_group_quant_fp8  1 x GROUP groups -> fp8 [R, K], fp32 scales [R, K / GROUP]
  per_tensor_quant_fp8       one dynamic scale  -> fp8 [R, K], fp32 scale [1]
                             (two passes: an atomic amax, then the quantize)
  group_quant_and_localize   per_token_group_quant_fp8 and routing.localize_ids_triton of the
                             rows' top-k ids [R, P] in one launch, one allocation (the local
                             backend's prepare on CUDA: issue #34)

Both read x as rows [R, K] (any leading shape is flattened). With
`expert_num_tokens` the rows are a batched [E, X, K] buffer and only each
expert's first expert_num_tokens[e] rows are read: padding rows may be
garbage (and would poison a per-tensor amax).

Legend: R rows, K columns, G = K / GROUP, E experts, X rows per expert, P top-k.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..interfaces import FP8_DTYPE, FP8_MAX
from .common import align16, carve, cdiv, next_power_of_2, to_fp8
from .launch import interpreted, launch
from .routing import local_expert_ids

EPS = 1e-10  # same clamp as kernels/quant.py


@triton.jit
def _row_mask(r, R, counts_ptr, X, ROW_COUNTS: tl.constexpr):
    valid = r < R
    if ROW_COUNTS:
        n_e = tl.load(counts_ptr + r // X, mask=valid, other=0)
        valid = valid & ((r % X) < n_e)
    return valid


@triton.jit
def _quant_group(
    x_ptr,
    q_ptr,
    s_ptr,
    r,
    valid,
    g,
    stride_xr,
    stride_qr,
    stride_sr,
    stride_sg,
    GROUP: tl.constexpr,
    FP8_MAX: tl.constexpr,
    EPS: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    """Group g of rows r (int64, `valid` masks them): fp8 into q, the fp32 scale into s
    (both kernels below: one quantization math)."""
    c = g * GROUP + tl.arange(0, GROUP)
    x = tl.load(x_ptr + r[:, None] * stride_xr + c[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x), axis=1), EPS) / FP8_MAX
    q = tl.clamp(x / s[:, None], -FP8_MAX, FP8_MAX)
    tl.store(
        q_ptr + r[:, None] * stride_qr + c[None, :], to_fp8(q, q_ptr.dtype.element_ty, EXACT_ROUND), mask=valid[:, None]
    )
    tl.store(s_ptr + r * stride_sr + g * stride_sg, s, mask=valid)


@triton.jit
def _group_quant_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    counts_ptr,
    R,
    X,
    stride_xr,
    stride_qr,
    stride_sr,
    stride_sg,
    ROW_COUNTS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    GROUP: tl.constexpr,
    FP8_MAX: tl.constexpr,
    EPS: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    g = tl.program_id(1)
    valid = _row_mask(r, R, counts_ptr, X, ROW_COUNTS)
    r = r.to(tl.int64)
    _quant_group(
        x_ptr, q_ptr, s_ptr, r, valid, g, stride_xr, stride_qr, stride_sr, stride_sg, GROUP, FP8_MAX, EPS, EXACT_ROUND
    )


@triton.jit
def _quant_localize_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    ids_ptr,
    local_ptr,
    R,
    stride_xr,
    stride_qr,
    stride_sr,
    P,
    first,
    num_local,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    GROUP: tl.constexpr,
    FP8_MAX: tl.constexpr,
    EPS: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    g = tl.program_id(1)
    valid = r < R  # (_row_mask without counts)
    r = r.to(tl.int64)
    _quant_group(x_ptr, q_ptr, s_ptr, r, valid, g, stride_xr, stride_qr, stride_sr, 1, GROUP, FP8_MAX, EPS, EXACT_ROUND)
    if g == 0:  # one program of each row block localizes its rows' pairs (ids and out [R, P] contiguous)
        p = tl.arange(0, BLOCK_P)
        offs = r[:, None] * P + p[None, :]
        mask = valid[:, None] & (p[None, :] < P)
        ids = tl.load(ids_ptr + offs, mask=mask, other=-1)
        tl.store(local_ptr + offs, local_expert_ids(ids, first, num_local), mask=mask)


@triton.jit
def _amax_kernel(
    x_ptr,
    amax_ptr,
    counts_ptr,
    R,
    K,
    X,
    stride_xr,
    ROW_COUNTS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    valid = _row_mask(r, R, counts_ptr, X, ROW_COUNTS)
    mask = valid[:, None] & (c[None, :] < K)
    x = tl.load(x_ptr + r.to(tl.int64)[:, None] * stride_xr + c[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.atomic_max(amax_ptr, tl.max(tl.abs(x)), sem="relaxed")


@triton.jit
def _tensor_quant_kernel(
    x_ptr,
    q_ptr,
    amax_ptr,
    scale_ptr,
    counts_ptr,
    R,
    K,
    X,
    stride_xr,
    stride_qr,
    ROW_COUNTS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    FP8_MAX: tl.constexpr,
    EPS: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    scale = tl.maximum(tl.load(amax_ptr), EPS) / FP8_MAX
    if (pid_r == 0) & (pid_c == 0):
        tl.store(scale_ptr, scale)
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    valid = _row_mask(r, R, counts_ptr, X, ROW_COUNTS)
    mask = valid[:, None] & (c[None, :] < K)
    r = r.to(tl.int64)
    x = tl.load(x_ptr + r[:, None] * stride_xr + c[None, :], mask=mask, other=0.0).to(tl.float32)
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + r[:, None] * stride_qr + c[None, :], to_fp8(q, q_ptr.dtype.element_ty, EXACT_ROUND), mask=mask)


# the interpreter's rounding work-around (common.py): decided when the kernels were decorated
_EXACT_ROUND = interpreted(_group_quant_kernel)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    assert x2.stride(-1) == 1, "quantization needs unit stride along K"
    return x2


def _counts_args(expert_num_tokens: Optional[torch.Tensor], x: torch.Tensor, x2: torch.Tensor):
    if expert_num_tokens is None:
        return x2, 1, False  # dummy pointer, unused
    assert x.dim() == 3 and x.shape[0] == expert_num_tokens.numel(), (x.shape, expert_num_tokens.shape)
    return expert_num_tokens, x.shape[1], True


def per_token_group_quant_fp8(
    x: torch.Tensor,
    group: int = 128,
    out: Optional[torch.Tensor] = None,
    out_scale: Optional[torch.Tensor] = None,
    expert_num_tokens: Optional[torch.Tensor] = None,
    block_r: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """1 x `group` quantization -> (fp8 like x, fp32 scales [..., K / group])."""
    shape = x.shape
    K = shape[-1]
    assert K % group == 0, f"K={K} is not a multiple of the group size {group}"
    G = K // group
    # 2-D tensors (quant_activations' [T, K], the experts' carved buffers) go as they are: the
    # rows' views (a reshape each, ~0.7 µs) only where there are other leading dims (issue #34)
    flat = len(shape) != 2
    x2 = _rows(x) if flat else x
    x_sr, x_sk = x2.stride()
    assert x_sk == 1, "quantization needs unit stride along K"
    R = x2.shape[0]
    if out is None:
        out = torch.empty(shape, dtype=FP8_DTYPE, device=x.device)
    if out_scale is None:
        out_scale = torch.empty(*shape[:-1], G, dtype=torch.float32, device=x.device)
    q2 = _rows(out) if flat or out.dim() != 2 else out
    s2 = out_scale.reshape(-1, G) if flat or out_scale.dim() != 2 else out_scale
    q_sr, q_sk = q2.stride()
    assert q_sk == 1, "quantization needs unit stride along K"
    s_sr, s_sg = s2.stride()
    counts, X, row_counts = _counts_args(expert_num_tokens, x, x2)
    if R:
        launch(
            _group_quant_kernel,
            (cdiv(R, block_r), G),
            x2,
            q2,
            s2,
            counts,
            R,
            X,
            x_sr,
            q_sr,
            s_sr,
            s_sg,
            ROW_COUNTS=row_counts,
            BLOCK_R=block_r,
            GROUP=group,
            FP8_MAX=FP8_MAX,
            EPS=EPS,
            EXACT_ROUND=_EXACT_ROUND,
            num_warps=4,
        )
    return out, out_scale


def per_tensor_quant_fp8(
    x: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    scale: Optional[torch.Tensor] = None,
    amax: Optional[torch.Tensor] = None,
    expert_num_tokens: Optional[torch.Tensor] = None,
    block_r: int = 16,
    block_c: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One dynamic scale: -> (fp8 like x, fp32 scale [1]). `amax` is a [1] fp32 scratch."""
    x2 = _rows(x)
    R, K = x2.shape
    if out is None:
        out = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    if scale is None:
        scale = torch.empty(1, dtype=torch.float32, device=x.device)
    if amax is None:
        amax = torch.zeros(1, dtype=torch.float32, device=x.device)
    else:
        amax.zero_()
    q2 = _rows(out)
    counts, X, row_counts = _counts_args(expert_num_tokens, x, x2)
    block_c = min(block_c, next_power_of_2(max(K, 1)))
    grid = (max(1, cdiv(R, block_r)), cdiv(K, block_c))
    launch(
        _amax_kernel,
        grid,
        x2,
        amax,
        counts,
        R,
        K,
        X,
        x2.stride(0),
        ROW_COUNTS=row_counts,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=4,
    )
    launch(
        _tensor_quant_kernel,
        grid,
        x2,
        q2,
        amax,
        scale,
        counts,
        R,
        K,
        X,
        x2.stride(0),
        q2.stride(0),
        ROW_COUNTS=row_counts,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        FP8_MAX=FP8_MAX,
        EPS=EPS,
        EXACT_ROUND=_EXACT_ROUND,
        num_warps=4,
    )
    return out, scale


def group_quant_and_localize(
    x: torch.Tensor,
    group: int,
    topk_ids_RP: torch.Tensor,
    first: int,
    num_local: int,
    block_r: int = 16,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """per_token_group_quant_fp8(x, group) and routing.localize_ids_triton(topk_ids_RP, first,
    num_local) in one launch and one allocation (issue #34: each costs the host ~15-30 µs), the
    same values: -> (fp8 [R, K], fp32 scales [R, G], int64 local ids [R, P], -1 for pairs of
    other ranks' experts), each contiguous, carved at 16-byte aligned offsets of one uint8
    buffer (they share its storage). x [R, K] with unit stride along K; ids of any int type."""
    R, K = x.shape
    assert K and K % group == 0, f"K={K} is not a multiple of the group size {group}"
    assert topk_ids_RP.dim() == 2 and topk_ids_RP.shape[0] == R, (x.shape, topk_ids_RP.shape)
    x_sr, x_sk = x.stride()
    assert x_sk == 1, "quantization needs unit stride along K"
    ids = topk_ids_RP.contiguous()
    P = ids.shape[1]
    G = K // group
    s_at = align16(R * K)
    ids_at = align16(s_at + R * G * 4)
    buf = torch.empty(ids_at + R * P * 8, dtype=torch.uint8, device=x.device)
    # three views of one allocation where two kernels allocated their outputs apart (the fused
    # prepare's host enqueue, measured: docs/findings/host-time.md)
    q = carve(buf, 0, (R, K), FP8_DTYPE)
    scale = carve(buf, s_at, (R, G), torch.float32)
    local = carve(buf, ids_at, (R, P), torch.int64)
    if R:
        launch(
            _quant_localize_kernel,
            (cdiv(R, block_r), G),
            x,
            q,
            scale,
            ids,
            local,
            R,
            x_sr,
            K,
            G,
            P,
            first,
            num_local,
            BLOCK_R=block_r,
            BLOCK_P=next_power_of_2(P),
            GROUP=group,
            FP8_MAX=FP8_MAX,
            EPS=EPS,
            EXACT_ROUND=_EXACT_ROUND,
            num_warps=4,
        )
    return q, scale, local
