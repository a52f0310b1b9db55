"""The fused-MoE pipelines the `triton` / `triton_batched` experts run, as plain
functions (the tuner and benchmarks call them directly).

standard:  align pairs by expert -> [quantize x if it came bf16] -> gate/up GEMM
           into ws13 [pairs, N] -> SiLU-and-mul (+ fp8 quant) into ws2 -> down GEMM:
             reduction="experts":  rows x top-k weight, atomically added into an
                                   fp32 [M, K] accumulator living in ws13 (free by
                                   then), cast into output [M, K] bf16;
             reduction="finalize": rows stored unweighted into output [M*P, K],
                                   rows of non-local pairs zeroed.
batched:   the same on [E, X, K] buffers with per-expert counts, no sort.

Workspace bytes are reused in place (all on one stream, so each use ends
before the next starts): in fp8 modes ws2 holds the fp8 activation and its
scales (the bf16 activation is never stored), and a bf16 input the experts
must quantize lands in ws2 too, before the activation needs it (batched: in
the output, which the down GEMM writes only after the gate/up GEMM read it).

Legend: M token rows, P top-k, R = M*P pairs, K hidden, N = 2I, E local experts,
X rows per expert (batched), G = I / 128 activation-scale groups.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..interfaces import FP8_DTYPE, ExpertWeights
from .activation import MODE_AMAX, MODE_BF16, MODE_GROUP, MODE_TENSOR, silu_and_mul, zero_nonlocal_rows
from .align import align_scratch_numel, moe_align_block_size
from .common import align16, as_bytes, carve
from .gemm import (
    QUANT_BLOCK,
    QUANT_NONE,
    QUANT_TENSOR,
    invoke_batched_moe_gemm,
    invoke_fused_moe_gemm,
    quant_mode,
    weight_descriptor,
)
from .quant import per_tensor_quant_fp8, per_token_group_quant_fp8

ALLOC_ROUND = 512  # CUDA caching allocator block granularity (bytes)


def alloc_bytes(nbytes: int) -> int:
    """Bytes the caching allocator takes for a request of nbytes."""
    return -(-nbytes // ALLOC_ROUND) * ALLOC_ROUND if nbytes > 0 else 0


MAX_VIEWS = 64  # carved views kept per workspace tensor (a few per row count)


def ws_view(ws: torch.Tensor, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """carve(as_bytes(ws), offset, shape, dtype), kept on the tensor `ws` itself: the experts'
    workspaces are the same tensors every forward of a size (MoEKernel._workspaces), so their
    carve-up (three to four view ops, ~0.7 µs each) is made once, not per forward (issue #34).
    The views live and die with `ws` (an attribute of it), which nothing resizes."""
    memo = getattr(ws, "_moebench_views", None)
    if memo is None:
        memo = ws._moebench_views = {}  # type: ignore[attr-defined]  # a memo kept on the tensor (doc)
    key = (offset, shape, dtype)
    view = memo.get(key)
    if view is None:
        if len(memo) >= MAX_VIEWS:
            memo.clear()
        view = memo[key] = carve(as_bytes(ws), offset, shape, dtype)
    return view


def _flat(t: torch.Tensor) -> torch.Tensor:
    """t for a kernel that indexes it flat: itself where contiguous (a reshape costs ~0.7 µs)."""
    return t if t.is_contiguous() else t.reshape(-1)


def _nbytes(ws: torch.Tensor) -> int:
    return ws.numel() * ws.element_size()


def input_quant_bytes(rows: int, K: int, quant) -> int:
    """Bytes of an fp8 copy of `rows` x K activations plus their scales (16-aligned)."""
    n = align16(rows * K)
    if quant.is_block:
        n += rows * (K // quant.block_k) * 4
    return n


def _quantize_input(
    x, quant, space: Optional[torch.Tensor], fscratch, expert_num_tokens=None, limit: Optional[int] = None
):
    """bf16 activations -> fp8 (+ scales) when the dispatch did not carry fp8.
    Written into the first bytes of the contiguous tensor `space` (at most `limit` of them;
    None: all) when they are enough, else into new tensors."""
    shape = x.shape
    K = shape[-1]
    rows = x.numel() // K if K else 0
    need = input_quant_bytes(rows, K, quant)
    if space is not None and (_nbytes(space) if limit is None else limit) >= need:
        xq = ws_view(space, 0, shape, FP8_DTYPE)
        xs = (
            ws_view(space, align16(rows * K), (*shape[:-1], K // quant.block_k), torch.float32)
            if quant.is_block
            else None
        )
    else:
        xq = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
        xs = None
    if quant.is_block:
        return per_token_group_quant_fp8(x, quant.block_k, out=xq, out_scale=xs, expert_num_tokens=expert_num_tokens)
    return per_tensor_quant_fp8(x, out=xq, scale=fscratch[3:4], amax=fscratch[2:3], expert_num_tokens=expert_num_tokens)


def _activation(h, ws2, quant, fscratch, **rows):
    """SiLU-and-mul of h [..., 2I] into ws2 -> (act [..., I], act_scale or None)."""
    shape = (*h.shape[:-1], h.shape[-1] // 2)
    mode = quant_mode(quant)
    if mode == QUANT_NONE:
        act = ws_view(ws2, 0, shape, ws2.dtype)
        silu_and_mul(h, act, MODE_BF16, **rows)
        return act, None
    act = ws_view(ws2, 0, shape, FP8_DTYPE)
    if mode == QUANT_BLOCK:
        g = quant.block_k
        scale = ws_view(ws2, align16(math.prod(shape)), (*shape[:-1], shape[-1] // g), torch.float32)
        silu_and_mul(h, act, MODE_GROUP, scale=scale, group=g, **rows)
        return act, scale
    amax, scale = fscratch[0:1], fscratch[1:2]
    amax.zero_()
    silu_and_mul(h, act, MODE_AMAX, amax=amax, **rows)
    silu_and_mul(h, act, MODE_TENSOR, scale=scale, amax=amax, **rows)
    return act, scale


def _group_shape(quant) -> tuple[int, int]:
    return (quant.block_n, quant.block_k)


def standard_scratch_numel(M: int, topk: int, num_experts: int, block_m: int) -> int:
    """int32 elements of the one scratch `fused_moe_standard` needs (sort indices, block
    experts, meta, and 4 fp32 amax / scale slots)."""
    return align_scratch_numel(M * topk, num_experts, block_m) + 4


def standard_ws2_tail_rows(M: int, topk: int, num_experts: int, block_m: int, I: int) -> int:
    """Rows of I bf16 elements a standard-layout ws2 holds past its [M * P, I] activation rows
    for the scratch (standard_scratch_numel int32s, 16-byte aligned): the experts carve it from
    their workspace instead of allocating it every forward (issue #34: a torch.empty a call)."""
    return -(-(4 * standard_scratch_numel(M, topk, num_experts, block_m) + 16) // (2 * I)) if I else 0


def _ws2_scratch(ws2: torch.Tensor, R: int, I: int, numel: int) -> Optional[torch.Tensor]:
    """The int32 scratch at the 16-byte aligned tail of ws2, where ws2 holds it past its
    [R, I] bf16 activation bytes (standard_ws2_tail_rows), else None."""
    if not ws2.is_contiguous() or ws2.dtype != torch.bfloat16:
        return None
    offset = (_nbytes(ws2) - 4 * numel) // 16 * 16
    if offset < 2 * R * I:
        return None
    return ws_view(ws2, offset, (numel,), torch.int32)


def fused_moe_standard(
    x: torch.Tensor,
    x_scale: Optional[torch.Tensor],
    topk_ids_MP: torch.Tensor,
    topk_weights_MP: torch.Tensor,
    w: ExpertWeights,
    output: torch.Tensor,
    ws13: torch.Tensor,
    ws2: torch.Tensor,
    config: dict,
    reduction: str,
) -> None:
    """Standard-layout MoE experts into `output`: [M, K] (reduction="experts",
    weighted and summed over top-k) or [M, P, K] (reduction="finalize",
    unweighted, zero rows for non-local pairs). x [M, K] bf16 or fp8 with
    x_scale [M, K/128] / [1]; ws13 >= R*N and ws2 >= R*I bf16 elements."""
    quant = w.quant
    M, P = topk_ids_MP.shape
    E, N, K = w.w13_ENK.shape
    R = M * P
    if R == 0:
        return
    bm = config["BLOCK_SIZE_M"]
    numel = standard_scratch_numel(M, P, E, bm)
    # the experts' ws2 holds it past the activation (standard_ws2_tail_rows); a caller's smaller ws2 does not
    scratch = _ws2_scratch(ws2, R, N // 2, numel)
    limit = None if scratch is None else 2 * R * (N // 2)  # the fp8 input stays clear of a tail scratch
    if scratch is None:
        scratch = torch.empty(numel, dtype=torch.int32, device=x.device)
    sorted_ids, expert_ids, num_post = moe_align_block_size(topk_ids_MP, E, bm, scratch)
    fscratch = scratch[-4:].view(torch.float32)
    mode = quant_mode(quant)
    if mode != QUANT_NONE and x.dtype != FP8_DTYPE:
        x, x_scale = _quantize_input(x, quant, ws2, fscratch, limit=limit)
    assert (x.dtype == FP8_DTYPE) == (mode != QUANT_NONE), (x.dtype, quant)
    gs = _group_shape(quant)
    d13, d2 = _weight_descriptors(w, config) if config.get("B_TMA") else (None, None)
    h = ws_view(ws13, 0, (R, N), ws13.dtype)
    invoke_fused_moe_gemm(
        x,
        x_scale,
        w.w13_ENK,
        w.w13_scale,
        h,
        sorted_ids,
        expert_ids,
        num_post,
        R,
        config,
        quant=mode,
        a_row_div=P,
        group_shape=gs,
        b_desc=d13,
    )
    act, act_scale = _activation(h, ws2, quant, fscratch, sorted_ids=sorted_ids, num_post=num_post, num_pairs=R)
    if reduction == "experts":
        assert output.shape == (M, K), output.shape
        if _nbytes(ws13) >= 4 * M * K:  # gate/up rows are consumed: reuse their bytes
            acc = ws_view(ws13, 0, (M, K), torch.float32)
        else:
            acc = torch.empty(M, K, dtype=torch.float32, device=x.device)
        acc.zero_()
        invoke_fused_moe_gemm(
            act,
            act_scale,
            w.w2_EKI,
            w.w2_scale,
            acc,
            sorted_ids,
            expert_ids,
            num_post,
            R,
            config,
            quant=mode,
            a_row_div=1,
            c_row_div=P,
            topk_weights=_flat(topk_weights_MP),
            atomic_add=True,
            group_shape=gs,
            b_desc=d2,
        )
        output.copy_(acc)
    else:
        assert output.shape == (M, P, K), output.shape
        out = output.view(R, K)
        invoke_fused_moe_gemm(
            act,
            act_scale,
            w.w2_EKI,
            w.w2_scale,
            out,
            sorted_ids,
            expert_ids,
            num_post,
            R,
            config,
            quant=mode,
            a_row_div=1,
            group_shape=gs,
            b_desc=d2,
        )
        zero_nonlocal_rows(out, topk_ids_MP, E)


def _weight_descriptors(w: ExpertWeights, config: dict) -> tuple:
    """The TMA descriptors of w's two weights in config's tiles (B_TMA), built once per tile shape and
    kept on w: a forward looks them up, never rebuilds them (issues #34, #46)."""
    key = (config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"], w.w13_ENK.data_ptr(), w.w2_EKI.data_ptr())
    cache = w.__dict__.setdefault("_tma_descriptors", {})
    if key not in cache:
        cache[key] = tuple(weight_descriptor(t, *key[:2]) for t in (w.w13_ENK, w.w2_EKI))
    return cache[key]


def fused_moe_batched(
    x: torch.Tensor,
    x_scale: Optional[torch.Tensor],
    expert_num_tokens_E: torch.Tensor,
    w: ExpertWeights,
    output: torch.Tensor,
    ws13: torch.Tensor,
    ws2: torch.Tensor,
    config: dict,
) -> None:
    """Batched-layout MoE experts: output[e, :n_e] = down(SiLU-and-mul(gate/up(x[e, :n_e]))),
    unweighted; rows past n_e = expert_num_tokens_E[e] are left unwritten.
    x [E, X, K] bf16 or fp8 with x_scale [E, X, K/128] / [1]; ws13 [E, X, N], ws2 [E, X, I];
    output [E, X, K] bf16, contiguous (a bf16 x of an fp8 mode is quantized into its bytes)."""
    quant = w.quant
    E, X, K = x.shape
    N = w.w13_ENK.shape[1]
    if E == 0 or X == 0:
        return
    mode = quant_mode(quant)
    fscratch = torch.empty(4, dtype=torch.float32, device=x.device) if mode == QUANT_TENSOR else None
    if mode != QUANT_NONE and x.dtype != FP8_DTYPE:
        # ws2 is too small for [E, X, K] whenever K > 2I; the bf16 output [E, X, K] is
        # not written before the down GEMM, and its 2K bytes a row hold the fp8 row + scales
        x, x_scale = _quantize_input(x, quant, output, fscratch, expert_num_tokens=expert_num_tokens_E)
    assert (x.dtype == FP8_DTYPE) == (mode != QUANT_NONE), (x.dtype, quant)
    gs = _group_shape(quant)
    h = ws_view(ws13, 0, (E, X, N), ws13.dtype)
    invoke_batched_moe_gemm(
        x, x_scale, w.w13_ENK, w.w13_scale, h, expert_num_tokens_E, config, quant=mode, group_shape=gs
    )
    act, act_scale = _activation(h, ws2, quant, fscratch, expert_num_tokens=expert_num_tokens_E)
    invoke_batched_moe_gemm(
        act, act_scale, w.w2_EKI, w.w2_scale, output, expert_num_tokens_E, config, quant=mode, group_shape=gs
    )
