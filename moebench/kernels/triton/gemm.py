"""Grouped expert GEMMs in the style of vLLM's fused_moe_kernel.

C[row] = A[row] @ B[e]^T for every row an expert owns, with an fp32
accumulator, a GROUP_SIZE_M swizzle for L2 reuse, pointers advanced per
BLOCK_K and, for block fp8, one (activation x weight) scale pair per K tile.

Two row layouts:
  standard  rows come from `sorted_ids` (pairs sorted by expert, padded to
            BLOCK_M, see align.py); A row = pair // A_ROW_DIV (P for gate/up,
            where A holds tokens; 1 for down, where A holds pairs); C row =
            pair // C_ROW_DIV. The down GEMM can multiply each row by its
            top-k weight and atomically add it into an fp32 [M, K] output.
  batched   A [E, X, K] with expert_num_tokens_E valid rows per expert; grid
            axis 1 is the expert (no re-layout, no sort).

Quant modes (QUANT): 0 bf16; 1 fp8 per tensor (a_scale [1], b_scale [E],
applied once after the K loop); 2 fp8 block (a_scale [rows, K/GROUP_K] per
1 x GROUP_K group, b_scale [E, ceil(N/GROUP_N), K/GROUP_K]).

Legend: rows = pairs (standard) or X (batched), N output columns, K reduction
dim, E experts, G = K / GROUP_K.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from .common import cast_out, cdiv
from .launch import interpreted, launch

QUANT_NONE, QUANT_TENSOR, QUANT_BLOCK = 0, 1, 2


def quant_mode(quant) -> int:
    """QUANT constexpr for a QuantSpec (or None)."""
    if quant is None or not quant.is_fp8:
        return QUANT_NONE
    return QUANT_BLOCK if quant.is_block else QUANT_TENSOR


@triton.jit
def _swizzle(pid, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """Program id -> (pid_m, pid_n), GROUP_SIZE_M row blocks at a time (L2 reuse of B)."""
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _b_scale_ptrs(base, stride_bsn, offs_bn, pid_n, BLOCK_N: tl.constexpr, QUANT: tl.constexpr, GROUP_N: tl.constexpr):
    """The weight-scale pointers of a tile's columns (plus K group * stride_bsk in
    _mma_loop): one scalar when the tile lies inside one GROUP_N-wide scale group (its
    width divides GROUP_N and it starts at a multiple of it), which _mma_loop then folds
    into the row scales; else one per column."""
    if QUANT == 2 and GROUP_N % BLOCK_N == 0:
        return base + ((pid_n * BLOCK_N) // GROUP_N) * stride_bsn
    else:
        return base + (offs_bn // GROUP_N) * stride_bsn


@triton.jit
def _mma_loop(
    a_ptrs,
    b_ptrs,
    b_desc,
    b_row,
    a_scale_ptrs,
    b_scale_ptrs,
    row_mask,
    offs_k,
    stride_ak,
    stride_bk,
    stride_ask,
    stride_bsk,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    INTERPRET: tl.constexpr,
    B_TMA: tl.constexpr,
):
    """[BLOCK_M, BLOCK_N] fp32 sum over K of A tile @ B tile (block scales applied per K tile).

    B_TMA: B's tiles come through b_desc (a host TMA descriptor over the weights as [E * N, K]
    rows, [BLOCK_N, BLOCK_K] blocks) from row b_row, not through b_ptrs: K % BLOCK_K == 0 (the
    caller's rule). The same values in the same order: the products are the pointer path's.

    A tile whose width divides the weight-scale group's (tiles start at multiples of
    BLOCK_N) has one weight scale per K tile: it is folded into the row
    scales, one multiply per accumulator element instead of two. Wrapped columns past N
    read another group's scale, but they are never stored."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if B_TMA:  # (K % BLOCK_K == 0: invoke_fused_moe_gemm's rule)
            a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
            b = b_desc.load([b_row, k * BLOCK_K]).T
        elif K % BLOCK_K == 0:  # compile-time: no K mask, B loads unmasked
            a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if INTERPRET:  # interpreter only (see common.py)
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if QUANT == 2:
            g = (k * BLOCK_K) // GROUP_K
            a_s = tl.load(a_scale_ptrs + g * stride_ask, mask=row_mask, other=0.0)
            b_s = tl.load(b_scale_ptrs + g * stride_bsk)
            if GROUP_N % BLOCK_N == 0:  # a scalar: the tile's group (_b_scale_ptrs)
                acc += tl.dot(a, b) * (a_s * b_s)[:, None]
            else:
                acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        else:
            acc = tl.dot(a, b, acc=acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def fused_moe_kernel(
    a_ptr,
    b_ptr,  # [E, N, K]
    b_desc,  # B_TMA: a TMA descriptor over b as [E * N, K] in [BLOCK_SIZE_N, BLOCK_SIZE_K] blocks (else b_ptr again)
    c_ptr,
    a_scale_ptr,
    b_scale_ptr,
    topk_weights_ptr,  # [pairs], read when MUL_ROUTED_WEIGHT
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_ptr,
    N,
    EM,  # rows of sorted_ids (upper bound of num_tokens_post_padded)
    num_valid,  # pairs; sorted_ids holds it as the padding sentinel
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_asm,
    stride_ask,
    stride_bse,
    stride_bsn,
    stride_bsk,
    K: tl.constexpr,
    A_ROW_DIV: tl.constexpr,
    C_ROW_DIV: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    ATOMIC_ADD: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    INTERPRET: tl.constexpr,
    B_TMA: tl.constexpr = False,
):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m, pid_n = _swizzle(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)
    if pid_m * BLOCK_SIZE_M >= tl.load(num_post_ptr):
        return
    offs_sorted = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    pair = tl.load(sorted_ids_ptr + offs_sorted).to(tl.int64)
    row_mask = pair < num_valid
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    # columns wrap instead of being masked: loads stay in bounds, stores are masked
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_rows = pair // A_ROW_DIV
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    a_scale_ptrs = a_scale_ptr + a_rows * stride_asm
    b_scale_ptrs = _b_scale_ptrs(
        b_scale_ptr + expert * stride_bse, stride_bsn, offs_bn, pid_n, BLOCK_SIZE_N, QUANT, GROUP_N
    )

    acc = _mma_loop(
        a_ptrs,
        b_ptrs,
        b_desc,
        (expert * N + pid_n * BLOCK_SIZE_N).to(tl.int32),  # B_TMA: the tile's first row of b as [E * N, K]
        a_scale_ptrs,
        b_scale_ptrs,
        row_mask,
        offs_k,
        stride_ak,
        stride_bk,
        stride_ask,
        stride_bsk,
        K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        QUANT,
        GROUP_N,
        GROUP_K,
        INTERPRET,
        B_TMA,
    )
    if QUANT == 1:
        acc = acc * (tl.load(a_scale_ptr) * tl.load(b_scale_ptr + expert * stride_bse))
    if MUL_ROUTED_WEIGHT:
        w = tl.load(topk_weights_ptr + pair, mask=row_mask, other=0.0).to(tl.float32)
        acc = acc * w[:, None]

    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + (pair // C_ROW_DIV)[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    c_mask = row_mask[:, None] & (offs_cn[None, :] < N)
    if ATOMIC_ADD:
        tl.atomic_add(c_ptrs, acc, mask=c_mask, sem="relaxed")
    else:
        tl.store(c_ptrs, cast_out(acc, c_ptr.dtype.element_ty, INTERPRET), mask=c_mask)


@triton.jit
def batched_moe_kernel(
    a_ptr,  # [E, X, K]
    b_ptr,  # [E, N, K]
    c_ptr,  # [E, X, N]
    a_scale_ptr,
    b_scale_ptr,
    expert_num_tokens_ptr,
    N,
    X,
    stride_ae,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_ce,
    stride_cm,
    stride_cn,
    stride_ase,
    stride_asm,
    stride_ask,
    stride_bse,
    stride_bsn,
    stride_bsk,
    K: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    pid = tl.program_id(axis=0)
    expert = tl.program_id(axis=1).to(tl.int64)
    num_rows = tl.load(expert_num_tokens_ptr + expert)
    num_pid_m = tl.cdiv(X, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m, pid_n = _swizzle(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)
    if pid_m * BLOCK_SIZE_M >= num_rows:
        return
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    row_mask = offs_m < num_rows

    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + expert * stride_ae + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    a_scale_ptrs = a_scale_ptr + expert * stride_ase + offs_m * stride_asm
    b_scale_ptrs = _b_scale_ptrs(
        b_scale_ptr + expert * stride_bse, stride_bsn, offs_bn, pid_n, BLOCK_SIZE_N, QUANT, GROUP_N
    )

    acc = _mma_loop(
        a_ptrs,
        b_ptrs,
        b_ptr,  # (no B_TMA here)
        0,
        a_scale_ptrs,
        b_scale_ptrs,
        row_mask,
        offs_k,
        stride_ak,
        stride_bk,
        stride_ask,
        stride_bsk,
        K,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        QUANT,
        GROUP_N,
        GROUP_K,
        INTERPRET,
        False,
    )
    if QUANT == 1:
        acc = acc * (tl.load(a_scale_ptr) * tl.load(b_scale_ptr + expert * stride_bse))

    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + expert * stride_ce + offs_m[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    c_mask = row_mask[:, None] & (offs_cn[None, :] < N)
    tl.store(c_ptrs, cast_out(acc, c_ptr.dtype.element_ty, INTERPRET), mask=c_mask)


def _strides(t: Optional[torch.Tensor], n: int) -> tuple[int, ...]:
    """The last n strides of t, left-padded with 0 (missing dims broadcast)."""
    if t is None:
        return (0,) * n
    s = tuple(t.stride())[-n:]
    return (0,) * (n - len(s)) + s


def _w_scale_strides(w_scale: Optional[torch.Tensor], quant: int) -> tuple[int, int, int]:
    """(stride_bse, stride_bsn, stride_bsk): [E, N/128, K/128] block scales or [E] tensor scales."""
    if quant == QUANT_BLOCK:
        assert w_scale is not None, "block-scaled weights come with their scales"
        e, n, k = w_scale.stride()
        return (e, n, k)
    if quant == QUANT_TENSOR:
        assert w_scale is not None, "tensor-scaled weights come with their scale"
        return (w_scale.stride(0), 0, 0)
    return (0, 0, 0)


_INTERPRET = interpreted(fused_moe_kernel)  # the same for both kernels (decorated alike)


def _launch_kwargs(config: dict) -> dict:
    return dict(
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"],
        BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
        BLOCK_SIZE_K=config["BLOCK_SIZE_K"],
        GROUP_SIZE_M=config.get("GROUP_SIZE_M", 1),
        num_warps=config.get("num_warps", 4),
        num_stages=config.get("num_stages", 3),
        INTERPRET=_INTERPRET,
    )


def invoke_fused_moe_gemm(
    a: torch.Tensor,
    a_scale: Optional[torch.Tensor],
    w: torch.Tensor,
    w_scale: Optional[torch.Tensor],
    c: torch.Tensor,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_post: torch.Tensor,
    num_pairs: int,
    config: dict,
    quant: int = QUANT_NONE,
    a_row_div: int = 1,
    c_row_div: int = 1,
    topk_weights: Optional[torch.Tensor] = None,
    atomic_add: bool = False,
    group_shape: tuple[int, int] = (128, 128),
    b_desc=None,
) -> None:
    """Standard layout: c[pair // c_row_div] (+)= a[pair // a_row_div] @ w[e]^T.

    a [rows, K] (bf16 or fp8), w [E, N, K], c [rows', N]; a_scale [rows, G] /
    [1] / None, w_scale [E, ceil(N/128), G] / [E] / None. topk_weights [pairs]
    multiplies each row; atomic_add accumulates into an fp32 c. config["B_TMA"] (moebench's key,
    never in vLLM's files: a tuned decision, kernels/triton/decisions.py): the weights' tiles
    through a host TMA descriptor (w contiguous, K a multiple of BLOCK_SIZE_K): b_desc, the caller's
    (weight_descriptor, built once), else one built here.
    """
    # each stride() tuple read once (a stride(i) call each costs about as much: issue #34)
    (s_am, s_ak), (s_be, s_bn, s_bk), (s_cm, s_cn) = a.stride(), w.stride(), c.stride()
    assert sorted_ids.stride(0) == 1 and s_ak == 1 and s_bk == 1
    E, N, K = w.shape
    assert a.shape[-1] == K, (a.shape, w.shape)
    assert not atomic_add or c.dtype == torch.float32
    if quant == QUANT_BLOCK:
        assert config["BLOCK_SIZE_K"] <= group_shape[1] and group_shape[1] % config["BLOCK_SIZE_K"] == 0
    EM = sorted_ids.numel()
    grid = (cdiv(EM, config["BLOCK_SIZE_M"]) * cdiv(N, config["BLOCK_SIZE_N"]),)
    b_tma = bool(config.get("B_TMA"))
    if not b_tma:
        b_desc = w
    elif b_desc is None:
        b_desc = weight_descriptor(w, config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"])
    a_s = a_scale if a_scale is not None else a
    b_s = w_scale if w_scale is not None else w
    tw = topk_weights if topk_weights is not None else sorted_ids
    launch(
        fused_moe_kernel,
        grid,
        a,
        w,
        b_desc,
        c,
        a_s,
        b_s,
        tw,
        sorted_ids,
        expert_ids,
        num_post,
        N,
        EM,
        num_pairs,
        s_am,
        s_ak,
        s_be,
        s_bn,
        s_bk,
        s_cm,
        s_cn,
        *(_strides(a_scale, 2) if quant == QUANT_BLOCK else (0, 0)),
        *_w_scale_strides(w_scale, quant),
        K=K,
        A_ROW_DIV=a_row_div,
        C_ROW_DIV=c_row_div,
        MUL_ROUTED_WEIGHT=topk_weights is not None,
        ATOMIC_ADD=atomic_add,
        QUANT=quant,
        GROUP_N=group_shape[0],
        GROUP_K=group_shape[1],
        **_launch_kwargs(config),
        **({"B_TMA": True} if b_tma else {}),  # (absent otherwise: the default's launch key stays as it was)
    )


def b_tma_device_error(device: torch.device) -> Optional[str]:
    """Why the gathered kernel cannot TMA-load the weights on device (None: it can): TMA needs SM90
    or newer; off CUDA, Triton's interpreter (which runs descriptor loads)."""
    if device.type == "cuda":
        return None if torch.cuda.get_device_capability(device)[0] >= 9 else "the weights by TMA: SM90 or newer"
    return None if os.environ.get("TRITON_INTERPRET") == "1" else "the weights by TMA: a GPU or Triton's interpreter"


def b_tma_error(w: torch.Tensor, config: dict) -> Optional[str]:
    """Why the weights w [E, N, K] cannot be TMA-loaded in config's tiles (None: they can): a TMA
    descriptor needs them contiguous with 16-byte rows, and the kernel's TMA path no K mask."""
    E, N, K = w.shape
    if not w.is_contiguous() or (K * w.element_size()) % 16 or w.data_ptr() % 16:
        return "B_TMA: the weights contiguous, 16-byte aligned, with rows a multiple of 16 bytes"
    if K % config["BLOCK_SIZE_K"]:
        return f"B_TMA: K {K} a multiple of BLOCK_SIZE_K {config['BLOCK_SIZE_K']}"
    return None


def weight_descriptor(w: torch.Tensor, block_n: int, block_k: int):
    """The host TMA descriptor of w [E, N, K] as [E * N, K] rows in [block_n, block_k] blocks."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    why = b_tma_error(w, {"BLOCK_SIZE_K": block_k})
    assert why is None, why
    E, N, K = w.shape
    rows = w.view(E * N, K)
    return TensorDescriptor(rows, [E * N, K], [K, 1], [block_n, block_k])


def invoke_batched_moe_gemm(
    a: torch.Tensor,
    a_scale: Optional[torch.Tensor],
    w: torch.Tensor,
    w_scale: Optional[torch.Tensor],
    c: torch.Tensor,
    expert_num_tokens: torch.Tensor,
    config: dict,
    quant: int = QUANT_NONE,
    group_shape: tuple[int, int] = (128, 128),
) -> None:
    """Batched layout: c[e, :n_e] = a[e, :n_e] @ w[e]^T, n_e = expert_num_tokens[e].

    a [E, X, K], w [E, N, K], c [E, X, N]; a_scale [E, X, G] / [1] / None.
    Rows past n_e are not written.
    """
    assert a.stride(-1) == 1 and w.stride(-1) == 1
    E, N, K = w.shape
    X = a.shape[1]
    assert a.shape[0] == E and a.shape[2] == K and c.shape[:2] == (E, X), (a.shape, w.shape, c.shape)
    if quant == QUANT_BLOCK:
        assert config["BLOCK_SIZE_K"] <= group_shape[1] and group_shape[1] % config["BLOCK_SIZE_K"] == 0
    if E == 0 or X == 0:
        return
    grid = (cdiv(X, config["BLOCK_SIZE_M"]) * cdiv(N, config["BLOCK_SIZE_N"]), E)
    a_s = a_scale if a_scale is not None else a
    b_s = w_scale if w_scale is not None else w
    launch(
        batched_moe_kernel,
        grid,
        a,
        w,
        c,
        a_s,
        b_s,
        expert_num_tokens,
        N,
        X,
        *a.stride(),
        *w.stride(),
        *c.stride(),
        *(_strides(a_scale, 3) if quant == QUANT_BLOCK else (0, 0, 0)),
        *_w_scale_strides(w_scale, quant),
        K=K,
        QUANT=quant,
        GROUP_N=group_shape[0],
        GROUP_K=group_shape[1],
        **_launch_kwargs(config),
    )
