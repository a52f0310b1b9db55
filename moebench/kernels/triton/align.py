"""Token alignment by expert (vLLM's moe_align_block_size) in two Triton launches, one
up to ONE_LAUNCH_MAX_PAIRS pairs (the counting program scatters them too).

Pairs are (token, k) slots of topk_ids flattened: pair = token * P + k. Each
local expert's pairs get a contiguous segment of `sorted_ids`, padded up to a
multiple of BLOCK_M with the sentinel `num_pairs`; `expert_ids` holds the expert
of each BLOCK_M block; pairs whose id is -1 (not on this rank) are dropped.

No host sync: buffers are sized from the upper bound `max_padded_rows`, and the
GEMMs stop at the device-side `num_tokens_post_padded`. Inside one expert the
pair order comes from atomics and is not deterministic (each pair still lands
in exactly one row).

Legend: R = num_pairs (M * P), E local experts, B = blocks of BLOCK_M rows.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from .common import cdiv, next_power_of_2
from .launch import launch


@triton.jit
def _scatter_pairs(ids_ptr, meta_ptr, sorted_ids_ptr, offs, num_pairs, num_experts):
    """Each local pair of `offs` into its expert's next slot (the cursor in meta advances by
    atomics: the order inside an expert is not deterministic)."""
    in_range = offs < num_pairs
    ids = tl.load(ids_ptr + offs, mask=in_range, other=-1)
    keep = in_range & (ids >= 0) & (ids < num_experts)
    expert = tl.where(keep, ids, 0).to(tl.int32)
    slot = tl.atomic_add(meta_ptr + expert, 1, mask=keep, sem="relaxed")
    tl.store(sorted_ids_ptr + slot, offs, mask=keep)


@triton.jit
def _align_count_kernel(
    ids_ptr,  # [R] local expert ids, -1 = not local
    meta_ptr,  # int32 [3E + 1]: cursor[E], pad_lo[E], pad_hi[E], num_tokens_post_padded
    expert_ids_ptr,  # int32 [B]
    sorted_ids_ptr,  # int32 [max padded rows], written here only with SCATTER
    num_pairs,
    num_experts,
    num_blocks,
    BLOCK_M: tl.constexpr,
    NUM_BINS: tl.constexpr,  # power of two > E: bin E collects the dropped pairs
    CHUNK: tl.constexpr,
    BLOCK_B: tl.constexpr,
    SCATTER: tl.constexpr,  # few pairs: this one program scatters them too (one launch, not two)
    PAD_C: tl.constexpr,  # padding rows written PAD_C per expert at a time (SCATTER)
):
    bins = tl.arange(0, NUM_BINS)
    counts = tl.zeros((NUM_BINS,), dtype=tl.int32)
    # while, not range(): Triton's interpreter cannot index a range by a runtime scalar
    start = 0
    while start < num_pairs:
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1)
        key = tl.where((ids >= 0) & (ids < num_experts), ids, num_experts).to(tl.int32)
        counts += tl.histogram(key, NUM_BINS)
        start += CHUNK
    is_expert = bins < num_experts
    counts = tl.where(is_expert, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    tl.store(meta_ptr + bins, starts, mask=is_expert)  # scatter cursor
    tl.store(meta_ptr + num_experts + bins, starts + counts, mask=is_expert)  # padding from
    tl.store(meta_ptr + 2 * num_experts + bins, ends, mask=is_expert)  # padding to
    tl.store(meta_ptr + 3 * num_experts, tl.sum(padded, axis=0))
    # a block's expert = how many experts' segments end at or before the block's first row
    ends_e = tl.where(is_expert, ends, 0x7FFFFFFF)
    b0 = 0
    while b0 < num_blocks:
        blk = b0 + tl.arange(0, BLOCK_B)
        before = (ends_e[None, :] <= blk[:, None] * BLOCK_M).to(tl.int32)
        e = tl.sum(before, axis=1)
        e = tl.where(e < num_experts, e, -1)
        tl.store(expert_ids_ptr + blk, e, mask=blk < num_blocks)
        b0 += BLOCK_B
    if SCATTER:
        tl.debug_barrier()  # the cursors stored above are what the atomics below advance
        start = 0
        while start < num_pairs:
            _scatter_pairs(ids_ptr, meta_ptr, sorted_ids_ptr, start + tl.arange(0, CHUNK), num_pairs, num_experts)
            start += CHUNK
        # every expert's padding rows [starts + counts, ends) get the sentinel num_pairs
        pad_lo = starts + counts
        for c0 in tl.static_range(0, BLOCK_M, PAD_C):
            rows = pad_lo[:, None] + c0 + tl.arange(0, PAD_C)[None, :]
            pad = is_expert[:, None] & (rows < ends[:, None])
            tl.store(sorted_ids_ptr + rows, tl.zeros((NUM_BINS, PAD_C), dtype=tl.int32) + num_pairs, mask=pad)


@triton.jit
def _align_scatter_kernel(
    ids_ptr,
    meta_ptr,
    sorted_ids_ptr,  # int32 [max padded rows]
    num_pairs,
    num_experts,
    num_pair_programs,
    BLOCK_M: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < num_pair_programs:
        _scatter_pairs(ids_ptr, meta_ptr, sorted_ids_ptr, pid * BLOCK + tl.arange(0, BLOCK), num_pairs, num_experts)
    else:
        # one program per expert writes the sentinel into its padding rows
        pad_expert = pid - num_pair_programs
        lo = tl.load(meta_ptr + num_experts + pad_expert)
        hi = tl.load(meta_ptr + 2 * num_experts + pad_expert)
        rows = lo + tl.arange(0, BLOCK_M)
        tl.store(sorted_ids_ptr + rows, tl.full((BLOCK_M,), 0, tl.int32) + num_pairs, mask=rows < hi)


# up to this many pairs one program counts and scatters (a launch less; the pairs' scatter is
# serial in chunks of 1024 there, so larger counts keep the parallel scatter kernel)
ONE_LAUNCH_MAX_PAIRS = 4096


@functools.lru_cache(maxsize=4096)  # pure ints, asked several times a forward
def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound of num_tokens_post_padded: each non-empty expert pads < BLOCK_M rows."""
    bound = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return cdiv(bound, block_m) * block_m


@functools.lru_cache(maxsize=4096)
def align_scratch_numel(num_pairs: int, num_experts: int, block_m: int) -> int:
    """int32 elements `moe_align_block_size` needs: sorted ids, block experts, meta."""
    rows = max_padded_rows(num_pairs, num_experts, block_m)
    return rows + rows // block_m + 3 * num_experts + 1


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    scratch: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (sorted_ids int32 [rows], expert_ids int32 [rows / BLOCK_M], num_tokens_post_padded int32 [1]).

    topk_ids: local expert ids [M, P] (any int dtype), -1 for pairs not on this
    rank. `scratch`: int32 buffer of at least `align_scratch_numel` elements to
    carve the outputs from (allocated when None). Rows past
    num_tokens_post_padded, and their blocks, are left unwritten.
    """
    # a contiguous [M, P] goes as it is (the kernels index it flat; a reshape costs ~0.7 µs)
    ids = topk_ids if topk_ids.is_contiguous() else topk_ids.reshape(-1)
    num_pairs = ids.numel()
    rows, num_blocks, need, count_kw, one_launch, num_pair_programs = _plan(
        num_pairs, num_experts, block_m, ONE_LAUNCH_MAX_PAIRS
    )
    if scratch is None:
        scratch = torch.empty(need, dtype=torch.int32, device=ids.device)
    assert scratch.dtype == torch.int32 and scratch.numel() >= need, (scratch.dtype, scratch.numel(), need)
    sorted_ids = scratch[:rows]
    expert_ids = scratch[rows : rows + num_blocks]
    meta = scratch[rows + num_blocks : need]
    launch(_align_count_kernel, (1,), ids, meta, expert_ids, sorted_ids, num_pairs, num_experts, num_blocks, **count_kw)
    if not one_launch:
        launch(
            _align_scatter_kernel,
            (num_pair_programs + num_experts,),
            ids,
            meta,
            sorted_ids,
            num_pairs,
            num_experts,
            num_pair_programs,
            BLOCK_M=block_m,
            BLOCK=SCATTER_BLOCK,
            num_warps=4,
        )
    return sorted_ids, expert_ids, meta[3 * num_experts :]


SCATTER_BLOCK = 256  # pairs per program of the scatter kernel


@functools.lru_cache(maxsize=4096)
def _plan(num_pairs: int, num_experts: int, block_m: int, one_launch_max: int) -> tuple:
    """What moe_align_block_size derives from its sizes alone, once per sizes (issue #34):
    (padded rows, blocks, scratch elements, the count kernel's constexprs and options,
    one launch?, scatter programs)."""
    rows = max_padded_rows(num_pairs, num_experts, block_m)
    num_bins = next_power_of_2(num_experts + 1)
    one_launch = num_pairs <= one_launch_max
    count_kw = dict(
        BLOCK_M=block_m,
        NUM_BINS=num_bins,
        CHUNK=1024,
        BLOCK_B=max(1, min(64, 8192 // num_bins)),
        SCATTER=one_launch,
        PAD_C=max(1, min(block_m, 4096 // num_bins)),
        num_warps=4,
    )
    return (
        rows,
        rows // block_m,
        align_scratch_numel(num_pairs, num_experts, block_m),
        count_kw,
        one_launch,
        cdiv(num_pairs, SCATTER_BLOCK),
    )
