"""Global expert ids -> local ids in one launch (issue #34: the torch form took six
kernels and as many host calls: long, subtract, two compares, and, full_like, where).

local = id - first where 0 <= id - first < num_local, else -1; int64 out, like
`prepare_finalize._common.localize_ids`' torch form (the reference, and the CPU path).

Legend: R = M * P pairs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import cdiv
from .launch import launch


@triton.jit
def local_expert_ids(ids, first, num_local):
    """Global ids (any int type) -> int64 local ids, -1 outside [first, first + num_local)
    (this kernel's and the fused quantize-and-localize's, kernels/triton/quant.py)."""
    local = ids.to(tl.int64) - first
    keep = (local >= 0) & (local < num_local)
    return tl.where(keep, local, -1)


@triton.jit
def _localize_kernel(ids_ptr, out_ptr, num_pairs, first, num_local, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_pairs
    ids = tl.load(ids_ptr + offs, mask=mask, other=-1)
    tl.store(out_ptr + offs, local_expert_ids(ids, first, num_local), mask=mask)


def localize_ids_triton(topk_ids_MP: torch.Tensor, first: int, num_local: int) -> torch.Tensor:
    """-> int64 like topk_ids_MP: local expert ids, -1 for pairs of other ranks."""
    ids = topk_ids_MP.contiguous()
    out = torch.empty(ids.shape, dtype=torch.int64, device=ids.device)
    R = ids.numel()
    if R:
        block = 1024
        launch(_localize_kernel, (cdiv(R, block),), ids, out, R, first, num_local, BLOCK=block, num_warps=4)
    return out
