"""fp8 block-scaled grouped GEMM on the contiguous layout, written in Gluon (issue #35's
explicit route; SM90 only). The triton experts run it for fp8_block's contiguous GEMMs on an SM90
GPU (experts.contiguous_gemm=auto, kernels/cards/experts.py): with its TMA-store epilogue (the
default) its GEMMs took 11-33 % less time than the Triton kernel's on an H200, about 0.72-1.09 x
DeepGEMM's speed (docs/findings/triton-vs-deepgemm.md, "The Gluon kernel, measured").

The same product as contiguous_gemm.py's fp8 path (see its module doc for the layout and the
scales), with the structural change that kernel cannot express in Triton: the FP32 promotion of
one K tile's partial product (scaled by its 1 x 128 activation and 128 x 128 weight scales) no
longer serializes with the tensor cores. Triton's `tl.dot` waits for each WGMMA at once, since its
result is not an accumulator, and both warp groups meet at a CTA barrier every K step.

Two kernels, both a persistent grid (at most one program per SM) over the 128 x 128 output tiles
in GROUP_SIZE_M-swizzled order (GROUP_SIZE_N: in bands of column tiles, gluon_common.tile_coords),
only the row tiles below the layout's rows in use (its num_post,
read on the device: with ALIGN-row segments each starts on a valid row, so there is no padding
branch, and an EP share's ~7/8 of padding rows cost nothing), each fed by a STAGES-deep ring of
TMA-loaded shared-memory stages with mbarriers whose phases carry across a program's tiles:

- `_gluon_fp8_ws_kernel` (config WS, the default): DeepGEMM's structure. A producer partition (4
  warps, one thread issuing) waits for a stage to be `empty`, then TMA-loads A's 128-row tile and
  B's tile into it (`ready`); two math warp groups (4 warps each, registers raised to 232) own 64
  rows each: wait `ready`, WGMMA into a fresh partial, wait for it, arrive on `empty`, promote.
  While one warp group promotes, the other's WGMMA runs: nothing joins them but the stages.
  Each math warp group writes its finished tile into shared memory and TMA-stores it, waiting for
  the store only before its next tile's (EPILOGUE_TMA, the default; False stores from registers).
  ptxas: 168 registers at launch (4 x 40 + 8 x 232 after `setmaxnreg`), no spill, no WGMMA
  serialization warning.
- `gluon_fp8_pipelined_kernel` (WS=False, gluon_pipelined.py): one partition of 8 warps that issues
  each K step's WGMMA asynchronously; ptxas serializes its WGMMAs (C7515), so it is the measured
  counter-example (docs/findings/triton-vs-deepgemm.md).
- `gluon_fp8_wide_kernel` (BLOCK_SIZE_N=192, gluon_wide.py, opt-in): the warp-specialized kernel at
  the 128 x 192 tile DeepGEMM's heuristic picks for most of these GEMMs, as a 128- and a 64-column
  WGMMA per K step (Gluon's shapes are powers of two). Lowered (168 registers, no spill, no
  serialization warning); checked on an H100 by the GPU tests; a tuned sidecar selects it
  (`moebench tune --decisions`): on an H200 the tuner chose it from 1024 tokens for mixtral_8x7b
  and GLM-4.5-Air, 1.07-1.15 x the layer at the 128 x 128 tile (docs/findings/tuning.md).

SCALE_AHEAD=2 (WS only, opt-in) loads the block scales two K steps ahead and across tiles
(_ws_math): measured -6.5 % to +6 % against SCALE_AHEAD=1 cell by cell, no trend. The TMA-store
epilogue measured 5-34 % less GEMM time than the register one, 11-33 % less than the Triton kernel's
(docs/findings/triton-vs-deepgemm.md, "The Gluon kernel, measured").

The launch (issue #46: a forward's host enqueue): `GluonGemm` is set up once per weight (the triton
experts hold one for each weight whose GEMM runs here) with its kernel, constexprs and the weight's
TMA descriptors; a call builds a's and c's descriptors (their shared-memory layouts computed once)
and launches through launch.py as the Triton kernels do: a key's first launch through the JIT, later
ones through the compiled handle and the launcher's C entry, each descriptor's CUtensorMap filled
again only where its pointer, shape or strides changed. `gluon_contiguous_gemm` sets one up per
call (the benchmarks' and the tests' entry).

Gluon has no interpreter: the CPU checks lower the kernels for sm_90 (compile_check) and compare
the handle's C-entry arguments with the JIT launch's (tests/kernels/test_triton_launch.py); only a
GPU runs them (benchmarks/triton_fp8_contiguous.py --gluon, tests/gpu/test_triton_*.py).
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .common import num_sms
from .contiguous_gemm import ALIGN, GROUP
from .decisions import gluon_shape_error
from .gluon_common import load_stage, tile_coords
from .gluon_pipelined import gluon_fp8_pipelined_kernel
from .gluon_wide import SCALE_LAYOUT, WIDE_N, gluon_fp8_wide_kernel
from .launch import launch

# 128 x 128 output tiles (BLOCK_K the 128-wide scale group). WS: a TMA producer and two math warp groups
# (12 warps), else the pipelined kernel on num_warps; SCALE_AHEAD and EPILOGUE_TMA: WS only (module doc).
# The tile order: GROUP_SIZE_N > 0 walks bands of that many column tiles over every row tile
# (DeepGEMM's order), else groups of GROUP_SIZE_M row tiles over every column tile (gluon_common.tile_coords).
# SCALE_TMA (the 128 x 192 tile only): the activation scales TMA-loaded with each stage (gluon_wide.py)
GLUON_CONFIG = dict(
    BLOCK_SIZE_M=128,
    BLOCK_SIZE_N=128,
    GROUP_SIZE_M=8,
    GROUP_SIZE_N=0,
    STAGES=4,
    WS=True,
    num_warps=8,
    SCALE_AHEAD=1,
    EPILOGUE_TMA=True,
    SCALE_TMA=False,
    PRODUCER_1W=False,
)
# every variant measured (benchmarks/triton_fp8_contiguous.py --gluon --variant I) and lowered on the CPU
# (compile_check): (WS, STAGES, SCALE_AHEAD, EPILOGUE_TMA, BLOCK_SIZE_N); 4-6 the TMA epilogue at 4, 5 and 6
# stages (6: 6 x 32 KiB of stages + 32 KiB of output tiles, inside SM90's 227 KiB); 7 the 128 x 192 tile of
# gluon_wide.py (4 x 40 KiB of stages + 48 KiB of output tiles), timed by `tune --decisions` (module doc)
GLUON_VARIANTS = (
    (True, 4, 1, False, 128),
    (True, 6, 1, False, 128),
    (False, 4, 1, False, 128),
    (True, 4, 2, False, 128),
    (True, 4, 1, True, 128),
    (True, 5, 1, True, 128),
    (True, 6, 1, True, 128),
    (True, 4, 1, True, WIDE_N),
)
# the tile order and scale loads `tune --decisions` also times, each over the variant it names (GluonGemm
# config keys; session 17's Nsight Compute reading, docs/findings/triton-vs-deepgemm.md): column bands of
# 16 over the default 128 x 128 variant and the 128 x 192 one, the 128 x 192 tile's SCALE_TMA, and both;
# and (session 19) SCALE_TMA with the 128 x 192 tile's TMA producer one warp (PRODUCER_1W)
_DEFAULT, _WIDE = (True, 4, 1, True, 128), (True, 4, 1, True, WIDE_N)  # GLUON_CONFIG's variant at each tile
GLUON_EXTRAS: tuple[tuple[tuple, dict], ...] = (
    (_DEFAULT, dict(GROUP_SIZE_N=16)),
    (_WIDE, dict(GROUP_SIZE_N=16)),
    (_WIDE, dict(SCALE_TMA=True)),
    (_WIDE, dict(GROUP_SIZE_N=16, SCALE_TMA=True)),
    (_WIDE, dict(SCALE_TMA=True, PRODUCER_1W=True)),
)


@gluon.jit
def _ws_producer(
    a_desc,
    b_desc,
    a_bufs,
    b_bufs,
    ready,
    empty,
    m_idx_ptr,
    N,
    num_pid_m,
    num_pid_n,
    num_programs,
    GROUP_SIZE_M: gl.constexpr,
    K: gl.constexpr,
    STAGES: gl.constexpr,
):
    """The TMA partition: for every K step of this program's tiles, wait until both math warp
    groups released the stage (`empty`), then load A's 128-row tile and B's tile into it."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    KT: gl.constexpr = K // BK
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, num_programs):
        off_m, off_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_SIZE_M, BM, BN)
        b_row = gl.load(m_idx_ptr + off_m) * N + off_n
        for k in range(KT):
            s = it % STAGES
            # a fresh barrier's previous phase counts as done: the first pass through the ring waits for nothing
            mbarrier.wait(empty.index(s), phase=((it // STAGES) & 1) ^ 1)
            load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, off_m, b_row, it, k, STAGES)
            it += 1


@gluon.jit
def _ws_scale_ptrs(
    tile,
    as_ptr,
    bs_ptr,
    m_idx_ptr,
    num_pid_m,
    num_pid_n,
    stride_asm,
    stride_bse,
    stride_bsn,
    HALF: gl.constexpr,
    GROUP_N: gl.constexpr,
    GROUP_SIZE_M: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    layout: gl.constexpr,
):
    """K tile 0's activation-scale pointers of this warp group's rows of `tile`, and its weight
    scale's pointer (the tile's expert and column block)."""
    off_m, off_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_SIZE_M, BM, BN)
    offs_m = off_m + HALF * (BM // 2) + gl.arange(0, BM // 2, layout=layout)
    expert = gl.maximum(gl.load(m_idx_ptr + off_m), 0)  # (a padding row's -1: only where the scales go unused)
    return (
        as_ptr + offs_m.to(gl.int64) * stride_asm,
        bs_ptr + expert.to(gl.int64) * stride_bse + (off_n // GROUP_N) * stride_bsn,
    )


@gluon.jit
def _ws_math(
    ring,
    epi,
    c_ptr,
    as_ptr,
    bs_ptr,
    m_idx_ptr,
    N,
    num_pid_m,
    num_pid_n,
    num_programs,
    stride_cm,
    stride_asm,
    stride_asg,
    stride_bse,
    stride_bsn,
    stride_bsk,
    HALF: gl.constexpr,
    GROUP_N: gl.constexpr,
    GROUP_SIZE_M: gl.constexpr,
    K: gl.constexpr,
    STAGES: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    SCALE_AHEAD: gl.constexpr,
    EPILOGUE_TMA: gl.constexpr,
):
    """One math warp group: rows [HALF * BM/2, (HALF + 1) * BM/2) of every tile. Each K step waits
    for its stage, runs its WGMMA into a fresh partial and waits for it at once, releases the stage,
    then scales and adds the partial into the accumulator: while it promotes, the other warp group's
    WGMMA keeps the tensor cores busy (DeepGEMM's overlap; no CTA barrier joins the two).

    The block scales come from global memory, SCALE_AHEAD K steps ahead of their use: 1 loads the
    next step's within the tile (a tile's first step waits for its own); 2 keeps two steps in
    flight in registers and runs across tiles (the last steps of a tile load the next tile's first
    scales), so no step waits for a cold load while the stages keep the WGMMAs fed.

    The tile's output: EPILOGUE_TMA=False stores it from the WGMMA layout's registers (4-byte
    stores); True writes it into this warp group's shared-memory tile and TMA-stores that, waiting
    for the store only before the next tile's output reuses the tile (DeepGEMM's epilogue)."""
    a_bufs, b_bufs, ready, empty = ring  # the stages and their `ready` / `empty` mbarriers
    c_desc, c_bufs = epi  # EPILOGUE_TMA: c's descriptor (64 x BN blocks) and the two warp groups' tiles
    ROWS: gl.constexpr = BM // 2
    KT: gl.constexpr = K // BK
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    num_tiles = num_pid_m * num_pid_n
    it = 0
    if SCALE_AHEAD == 2:
        gl.static_assert(KT >= 2, "two K steps ahead: at least two K tiles")
        # this program's first tile (a program with none, or no rows in use at all: tile 0's rows of row tile
        # 0, which exist in Mp, loaded and unused)
        first = gl.minimum(gl.program_id(0), gl.maximum(num_tiles - 1, 0))
        as_ptrs, bs_ptrs = _ws_scale_ptrs(
            first,
            as_ptr,
            bs_ptr,
            m_idx_ptr,
            gl.maximum(num_pid_m, 1),
            num_pid_n,
            stride_asm,
            stride_bse,
            stride_bsn,
            HALF,
            GROUP_N,
            GROUP_SIZE_M,
            BM,
            BN,
            rows_l,
        )
        a0 = gl.load(as_ptrs)
        b0 = gl.load(bs_ptrs)
        a1 = gl.load(as_ptrs + stride_asg)
        b1 = gl.load(bs_ptrs + stride_bsk)
    for tile in range(gl.program_id(0), num_tiles, num_programs):
        off_m, off_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_SIZE_M, BM, BN)
        offs_m = off_m + HALF * ROWS + gl.arange(0, ROWS, layout=rows_l)
        acc = gl.zeros([ROWS, BN], gl.float32, mma)
        part = gl.zeros([ROWS, BN], gl.float32, mma)
        if SCALE_AHEAD == 2:
            as_ptrs, bs_ptrs = _ws_scale_ptrs(
                tile,
                as_ptr,
                bs_ptr,
                m_idx_ptr,
                num_pid_m,
                num_pid_n,
                stride_asm,
                stride_bse,
                stride_bsn,
                HALF,
                GROUP_N,
                GROUP_SIZE_M,
                BM,
                BN,
                rows_l,
            )
            # the next tile's first scales are loaded in this tile's last two steps (the last tile reloads its own)
            nxt = tile + (tile + num_programs < num_tiles).to(gl.int32) * num_programs
            nas_ptrs, nbs_ptrs = _ws_scale_ptrs(
                nxt,
                as_ptr,
                bs_ptr,
                m_idx_ptr,
                num_pid_m,
                num_pid_n,
                stride_asm,
                stride_bse,
                stride_bsn,
                HALF,
                GROUP_N,
                GROUP_SIZE_M,
                BM,
                BN,
                rows_l,
            )
            for k in range(KT):
                s = it % STAGES
                mbarrier.wait(ready.index(s), phase=(it // STAGES) & 1)
                part = warpgroup_mma(
                    a_bufs.index(s).slice(HALF * ROWS, ROWS),
                    b_bufs.index(s).permute((1, 0)),
                    part,
                    use_acc=False,
                    is_async=True,
                )
                g = k + 2
                here = g < KT
                gg = g - (g >= KT).to(gl.int32) * KT
                a2 = gl.load(gl.where(here, as_ptrs, nas_ptrs) + gg * stride_asg)
                b2 = gl.load(gl.where(here, bs_ptrs, nbs_ptrs) + gg * stride_bsk)
                part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                mbarrier.arrive(empty.index(s), count=1)
                acc += part * (a0 * b0)[:, None]
                a0, b0, a1, b1 = a1, b1, a2, b2
                it += 1
        else:
            expert = gl.load(m_idx_ptr + off_m)
            as_ptrs = as_ptr + offs_m.to(gl.int64) * stride_asm
            bs_ptrs = bs_ptr + expert.to(gl.int64) * stride_bse + (off_n // GROUP_N) * stride_bsn
            a_s = gl.load(as_ptrs)  # K tile 0's scales; each step loads the next step's (their latency behind a step)
            b_s = gl.load(bs_ptrs)
            for k in range(KT):
                s = it % STAGES
                mbarrier.wait(ready.index(s), phase=(it // STAGES) & 1)
                part = warpgroup_mma(
                    a_bufs.index(s).slice(HALF * ROWS, ROWS),
                    b_bufs.index(s).permute((1, 0)),
                    part,
                    use_acc=False,
                    is_async=True,
                )
                g = min(k + 1, KT - 1)  # (the last step reloads its own)
                a_next = gl.load(as_ptrs + g * stride_asg)
                b_next = gl.load(bs_ptrs + g * stride_bsk)
                part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                mbarrier.arrive(empty.index(s), count=1)
                acc += part * (a_s * b_s)[:, None]
                a_s = a_next
                b_s = b_next
                it += 1
        if EPILOGUE_TMA:
            c_buf = c_bufs.index(HALF)
            tma.store_wait(pendings=0)  # this warp group's previous tile has left its shared-memory tile
            c_buf.store(acc.to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [off_m + HALF * ROWS, off_n], c_buf)
        else:
            offs_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
            c_ptrs = c_ptr + offs_m.to(gl.int64)[:, None] * stride_cm + offs_n[None, :]
            gl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_n < N)[None, :])
    if EPILOGUE_TMA:
        tma.store_wait(pendings=0)


@gluon.jit
def _gluon_fp8_ws_kernel(
    a_desc,
    b_desc,
    c_ptr,
    as_ptr,
    bs_ptr,
    m_idx_ptr,
    rows_ptr,
    N,
    num_programs,  # as gluon_fp8_pipelined_kernel's
    stride_cm,
    stride_asm,
    stride_asg,
    stride_bse,
    stride_bsn,
    stride_bsk,
    c_desc,  # c in 64 x BN blocks (EPILOGUE_TMA), or None; before the constexprs: launch.py keys it positionally
    K: gl.constexpr,
    GROUP_N: gl.constexpr,
    GROUP_SIZE_M: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
    SCALE_AHEAD: gl.constexpr,
    EPILOGUE_TMA: gl.constexpr,
):
    """DeepGEMM's structure: a TMA producer (the default partition, 4 warps, of which one thread
    issues) and two math warp groups (the workers, 4 warps each, registers raised to 232), each
    owning half of the tile's rows, meeting the producer only at the stages' mbarriers: `ready`
    (the producer's expect + the TMA bytes) and `empty` (one arrival from each math warp group)."""
    BM: gl.constexpr = gl.constexpr(a_desc.block_type.shape[0])
    BK: gl.constexpr = gl.constexpr(a_desc.block_type.shape[1])
    BN: gl.constexpr = gl.constexpr(b_desc.block_type.shape[0])
    gl.static_assert(BK == GROUP_N, "one scale group per K tile")
    gl.static_assert(BN <= GROUP_N, "one weight scale per K tile and output tile")
    gl.static_assert(BM == 128, "two math warp groups of 64 rows")
    gl.static_assert(num_warps == 4, "the producer partition is one warp group")
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    num_pid_m = min(gl.cdiv(gl.load(rows_ptr), BM), a_desc.shape[0] // BM)  # (never past Mp)
    num_pid_n = gl.cdiv(N, BN)
    ws_ready = (a_bufs, b_bufs, ready, empty)
    if EPILOGUE_TMA:  # one 64-row output tile for each math warp group
        epi = (c_desc, gl.allocate_shared_memory(c_desc.dtype, [2, BM // 2, BN], c_desc.layout))
    else:
        epi = (a_desc, a_bufs)  # (unused: the math groups store from registers)
    gl.warp_specialize(
        [
            (
                _ws_producer,
                (
                    a_desc,
                    b_desc,
                    a_bufs,
                    b_bufs,
                    ready,
                    empty,
                    m_idx_ptr,
                    N,
                    num_pid_m,
                    num_pid_n,
                    num_programs,
                    gl.constexpr(GROUP_SIZE_M),
                    gl.constexpr(K),
                    gl.constexpr(STAGES),
                ),
            ),
            (
                _ws_math,
                (
                    ws_ready,
                    epi,
                    c_ptr,
                    as_ptr,
                    bs_ptr,
                    m_idx_ptr,
                    N,
                    num_pid_m,
                    num_pid_n,
                    num_programs,
                    stride_cm,
                    stride_asm,
                    stride_asg,
                    stride_bse,
                    stride_bsn,
                    stride_bsk,
                    gl.constexpr(0),
                    gl.constexpr(GROUP_N),
                    gl.constexpr(GROUP_SIZE_M),
                    gl.constexpr(K),
                    gl.constexpr(STAGES),
                    BM,
                    BN,
                    BK,
                    gl.constexpr(SCALE_AHEAD),
                    gl.constexpr(EPILOGUE_TMA),
                ),
            ),
            (
                _ws_math,
                (
                    ws_ready,
                    epi,
                    c_ptr,
                    as_ptr,
                    bs_ptr,
                    m_idx_ptr,
                    N,
                    num_pid_m,
                    num_pid_n,
                    num_programs,
                    stride_cm,
                    stride_asm,
                    stride_asg,
                    stride_bse,
                    stride_bsn,
                    stride_bsk,
                    gl.constexpr(1),
                    gl.constexpr(GROUP_N),
                    gl.constexpr(GROUP_SIZE_M),
                    gl.constexpr(K),
                    gl.constexpr(STAGES),
                    BM,
                    BN,
                    BK,
                    gl.constexpr(SCALE_AHEAD),
                    gl.constexpr(EPILOGUE_TMA),
                ),
            ),
        ],
        [4, 4],
        [232, 232],
    )
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


@functools.lru_cache(maxsize=None)
def _layout(block: tuple, dtype) -> gl.NVMMASharedLayout:
    """The shared-memory layout of a TMA block, once per (block, dtype): get_default_for costs ~9 µs
    a call on the host (issue #46), and one layout object keys launch.py's fast path cheaply."""
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def _descriptor(t: torch.Tensor, block: tuple, dtype=gl.float8e4nv) -> TensorDescriptor:
    """t's TMA descriptor in `block` blocks (TensorDescriptor.from_tensor with the kept layout)."""
    return TensorDescriptor(t, t.shape, t.stride(), list(block), _layout(block, dtype))


class GluonGemm:
    """One weight's Gluon GEMM, set up once (issue #46): c [Mp, N] bf16 = contiguous_gemm's fp8 product
    of a [Mp, K] with w [E, N, K] (fp8, contiguous) and w_scale [E, N/128, K/128], by a Gluon kernel
    (config WS: the warp-specialized one, BLOCK_SIZE_N=192 its 128 x 192 tile (gluon_wide.py), else
    the pipelined one) on a persistent grid of at most one program per SM of w's device
    (num_programs caps it) over the row tiles in use. Holds the kernel, its constexprs and the
    weight's TMA descriptors; each call builds a's and c's and launches through launch.py's
    compiled handle (after a key's first launch, which goes through the JIT)."""

    def __init__(
        self, w: torch.Tensor, w_scale: torch.Tensor, config: dict | None = None, num_programs: int | None = None
    ):
        cfg = dict(GLUON_CONFIG, **(config or {}))
        E, N, K = w.shape
        bm, bn, ws = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], bool(cfg["WS"])
        wide = bn == WIDE_N  # the 128 x 192 tile (gluon_wide.py): WS, its scales one step ahead, a TMA store
        assert w.dtype == torch.float8_e4m3fn and w.is_contiguous() and K % GROUP == 0, (w.dtype, w.shape)
        assert bm == ALIGN and (N % bn == 0 and bn <= GROUP or wide), (N, bm, bn)
        shape_error = gluon_shape_error(cfg)
        assert shape_error is None, (shape_error, cfg)
        assert w_scale.shape == (E, N // GROUP, K // GROUP) and w_scale.device == w.device, w_scale.shape
        assert ws or cfg["num_warps"] in (4, 8), cfg  # (the pipelined kernel's WGMMA layout: 16 rows a warp)
        assert cfg["SCALE_AHEAD"] in (1, 2) and (ws or (cfg["SCALE_AHEAD"] == 1 and not cfg["EPILOGUE_TMA"])), cfg
        assert cfg["SCALE_AHEAD"] == 1 or K >= 2 * GROUP, (K, cfg)
        self.w, self.w_scale, self.N, self.K, self.device = w, w_scale, N, K, w.device
        self.bm, self.wide, self.ws = bm, wide, ws
        self.epi_tma = ws and bool(cfg["EPILOGUE_TMA"])  # (the wide tile's always: asserted above)
        self.num_pid_n = -(-N // bn)
        index = w.device.index
        sms = num_sms(torch.cuda.current_device() if index is None and w.is_cuda else index)
        self.max_programs = min(sms, num_programs or sms)
        self.w_scale_strides = tuple(w_scale.stride())
        w_rows = w.view(E * N, K)
        assert cfg["GROUP_SIZE_M"] > 0 and cfg["GROUP_SIZE_N"] >= 0, cfg
        # the kernels' one order constexpr: > 0 row groups, < 0 column bands (gluon_common.tile_coords)
        order = -cfg["GROUP_SIZE_N"] if cfg["GROUP_SIZE_N"] else cfg["GROUP_SIZE_M"]
        self.constexprs = dict(K=K, GROUP_N=GROUP, GROUP_SIZE_M=order, STAGES=cfg["STAGES"])
        self.b_descs: tuple
        self.c_blocks: tuple[tuple[int, int], ...]
        if wide:
            half = GROUP // 2
            self.kernel = gluon_fp8_wide_kernel
            self.b_descs = (_descriptor(w_rows, (GROUP, GROUP)), _descriptor(w_rows, (half, GROUP)))
            self.c_blocks = ((bm // 2, GROUP), (bm // 2, half))  # the 128- and the 64-column parts
            self.constexprs["num_warps"] = 4
            for flag in ("SCALE_TMA", "PRODUCER_1W"):  # (absent otherwise: the default's launch key stays as it was)
                if cfg[flag]:
                    self.constexprs[flag] = True
        else:
            # (the pipelined kernel: the counter-example)
            self.kernel = _gluon_fp8_ws_kernel if ws else gluon_fp8_pipelined_kernel
            self.b_descs = (_descriptor(w_rows, (bn, GROUP)),)
            self.c_blocks = ((bm // 2, bn),) if self.epi_tma else ()
            self.constexprs["num_warps"] = 4 if ws else cfg["num_warps"]
            if ws:
                self.constexprs.update(SCALE_AHEAD=cfg["SCALE_AHEAD"], EPILOGUE_TMA=self.epi_tma)

    def __call__(
        self,
        a: torch.Tensor,
        a_scale: torch.Tensor,
        c: torch.Tensor,
        m_indices: torch.Tensor,
        rows_in_use: torch.Tensor,
    ) -> None:
        """c [Mp, N] bf16 = the product of a [Mp, K] fp8 with its 1 x 128 scales a_scale [Mp, K/128]
        (MN-major) and the weight, row r by expert m_indices[r] (int32, >= Mp of them); rows_in_use:
        int32 [1] on the device, the layout's num_post (only its row tiles are walked)."""
        Mp, K = a.shape
        assert a.dtype == torch.float8_e4m3fn and K == self.K and a.stride(1) == 1, (a.dtype, a.shape, self.K)
        assert Mp % ALIGN == 0 and a_scale.shape == (Mp, K // GROUP), (Mp, a_scale.shape)
        assert c.shape == (Mp, self.N) and c.dtype == torch.bfloat16 and c.stride(1) == 1, (c.shape, c.dtype)
        assert m_indices.dtype == torch.int32 and m_indices.is_contiguous() and m_indices.numel() >= Mp
        assert rows_in_use.numel() == 1 and rows_in_use.dtype == torch.int32, rows_in_use
        dev = self.device
        assert (
            a.device == dev
            and a_scale.device == dev
            and c.device == dev
            and m_indices.device == dev
            and rows_in_use.device == dev
        ), "one device"
        assert not self.epi_tma or (c.data_ptr() % 16 == 0 and c.stride(0) * c.element_size() % 16 == 0), (
            "EPILOGUE_TMA: c's rows 16-byte aligned (a TMA store)"
        )
        if Mp == 0:
            return
        grid = (max(1, min((Mp // self.bm) * self.num_pid_n, self.max_programs)),)
        a_desc = _descriptor(a, (self.bm, GROUP))
        c_descs = [_descriptor(c, block, gl.bfloat16) for block in self.c_blocks]
        if self.wide:
            as_desc = None
            if self.constexprs.get("SCALE_TMA"):  # a_scale's [K/128, Mp] storage in [1, BM] blocks
                st = a_scale.t()
                assert st.is_contiguous() and st.data_ptr() % 16 == 0, "SCALE_TMA: MN-major, 16-byte aligned scales"
                as_desc = TensorDescriptor(st, st.shape, st.stride(), [1, self.bm], SCALE_LAYOUT)
            launch(
                self.kernel,
                grid,
                a_desc,
                *self.b_descs,
                *c_descs,
                as_desc,
                a_scale,
                self.w_scale,
                m_indices,
                rows_in_use,
                self.N,
                grid[0],
                *a_scale.stride(),
                *self.w_scale_strides,
                **self.constexprs,
            )
            return
        # the warp-specialized kernel's c_desc (None: it stores from registers); the pipelined kernel has none
        epi = (c_descs[0] if c_descs else None,) if self.ws else ()
        launch(
            self.kernel,
            grid,
            a_desc,
            self.b_descs[0],
            c,
            a_scale,
            self.w_scale,
            m_indices,
            rows_in_use,
            self.N,
            grid[0],
            c.stride(0),
            *a_scale.stride(),
            *self.w_scale_strides,
            *epi,
            **self.constexprs,
        )


def gluon_contiguous_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    c: torch.Tensor,
    m_indices: torch.Tensor,
    rows_in_use: torch.Tensor,
    config: dict | None = None,
    num_programs: int | None = None,
) -> None:
    """c [Mp, N] bf16 = contiguous_gemm's fp8 product (same arguments, fp8 only; rows_in_use, int32
    [1] on the device, the layout's num_post, is required), by GluonGemm set up for this call (a
    layer holds one per weight: kernels/experts/triton.py)."""
    GluonGemm(w, w_scale, config, num_programs)(a, a_scale, c, m_indices, rows_in_use)


def signature_types(bm: int = 128, bn: int = 128) -> dict:
    """The kernel's argument types as a launch specializes them (compile_check lowers it without a GPU)."""

    def desc(rows: int) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([rows, GROUP], gl.float8e4nv)
        return f"tensordesc<fp8e4nv[{rows}, {GROUP}],{layout!r}>"

    t = dict(
        a_desc=desc(bm),
        b_desc=desc(bn),
        c_ptr="*bf16",
        as_ptr="*fp32",
        bs_ptr="*fp32",
        m_idx_ptr="*i32",
        rows_ptr="*i32",
        N="i32",
        num_programs="i32",
    )
    for s in ("cm", "asm", "asg", "bse", "bsn", "bsk"):
        t[f"stride_{s}"] = "i32"
    return t


def ws_constexprs(epilogue_tma: bool, bm: int = 128, bn: int = 128) -> tuple[dict, dict]:
    """The warp-specialized kernel's extra (types, constexprs) for its epilogue: c's descriptor
    (64 x bn bf16 blocks) with EPILOGUE_TMA, else c_desc=None."""
    if not epilogue_tma:
        return {}, dict(EPILOGUE_TMA=False, c_desc=None)
    layout = gl.NVMMASharedLayout.get_default_for([bm // 2, bn], gl.bfloat16)
    return dict(c_desc=f"tensordesc<bf16[{bm // 2}, {bn}],{layout!r}>"), dict(EPILOGUE_TMA=True)


__all__ = [
    "GLUON_CONFIG",
    "GLUON_EXTRAS",
    "GLUON_VARIANTS",
    "GluonGemm",
    "gluon_contiguous_gemm",
    "signature_types",
    "ws_constexprs",
]
