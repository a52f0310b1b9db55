"""The single-partition pipelined fp8 Gluon kernel of gluon_contiguous.py's config WS=False:
issue #35's measured counter-example, kept apart from the warp-specialized kernel.

One partition of 8 warps issues each K step's WGMMA asynchronously into a fresh partial and waits
only for the previous step's before promoting it. ptxas serializes its WGMMAs anyway (warning
C7515: the loop's two partial tiles swap registers between the WGMMAs of one chain), so the
overlap it was written for does not happen: measured 0.60-0.74 x DeepGEMM on gate/up, as slow as
the Triton kernel or up to 10 % slower (docs/findings/triton-vs-deepgemm.md). compile_check's CPU test uses it as the
kernel whose WGMMA serialization it must flag. Launched by gluon_contiguous.GluonGemm (config WS=False).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .gluon_common import load_stage, tile_coords


@gluon.jit
def gluon_fp8_pipelined_kernel(
    a_desc,  # [Mp, K] fp8, block [BM, 128]
    b_desc,  # [E * N, K] fp8, block [BN, 128]
    c_ptr,  # [Mp, N] bf16
    as_ptr,  # a_scale: (row, g) at row * stride_asm + g * stride_asg
    bs_ptr,  # w_scale [E, N / 128, G]
    m_idx_ptr,  # [Mp] int32
    rows_ptr,  # [1] int32: the rows in use (every expert's ALIGN-padded segment: the layout's num_post)
    N,
    num_programs,
    stride_cm,
    stride_asm,
    stride_asg,
    stride_bse,
    stride_bsn,
    stride_bsk,
    K: gl.constexpr,
    GROUP_N: gl.constexpr,
    GROUP_SIZE_M: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    KT: gl.constexpr = K // BK
    gl.static_assert(BK == GROUP_N, "one scale group per K tile")
    gl.static_assert(BN <= GROUP_N, "one weight scale per K tile and output tile")
    gl.static_assert(STAGES >= 2, "the ring refills the stage the previous WGMMA read")
    # each warp 16 rows of the tile, all BN columns: WGMMA m64 x nBN x k32 per warp group
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN, 256 // a_desc.dtype.primitive_bitwidth]
    )
    # the tile stored in 16-byte pieces along the row (the WGMMA layout would store 2 bytes at a time)
    out_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BN, BN // 8], [num_warps, 1], [1, 0])

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()  # the initialized barriers visible to the TMA unit (the async proxy)

    # only the row tiles in use: with ALIGN-row segments each starts on a valid row (no padding branch)
    num_pid_m = min(gl.cdiv(gl.load(rows_ptr), BM), a_desc.shape[0] // BM)  # (never past Mp)
    num_pid_n = gl.cdiv(N, BN)
    base = 0  # this program's K steps before the current tile
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, num_programs):
        off_m, off_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_SIZE_M, BM, BN)
        expert = gl.load(m_idx_ptr + off_m)
        b_row = expert * N + off_n
        offs_m = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, mma))
        as_ptrs = as_ptr + offs_m.to(gl.int64) * stride_asm
        bs_ptrs = bs_ptr + expert.to(gl.int64) * stride_bse + (off_n // GROUP_N) * stride_bsn
        for i in gl.static_range(STAGES - 1):
            if i < KT:
                load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, off_m, b_row, base + i, i, STAGES)

        acc = gl.zeros([BM, BN], gl.float32, mma)
        # K tile 0: its WGMMA in flight, its scales read, the ring's last stage filled
        s = base % STAGES
        mbarrier.wait(ready.index(s), phase=(base // STAGES) & 1)
        part = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, use_acc=False, is_async=True)
        scale = gl.load(as_ptrs) * gl.load(bs_ptrs)
        if STAGES - 1 < KT:
            load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, off_m, b_row, base + STAGES - 1, STAGES - 1, STAGES)
        spare = gl.zeros([BM, BN], gl.float32, mma)  # the registers the next partial is written to
        for k in range(1, KT):
            it = base + k
            s = it % STAGES
            mbarrier.wait(ready.index(s), phase=(it // STAGES) & 1)
            nxt = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), spare, use_acc=False, is_async=True)
            nxt_scale = gl.load(as_ptrs + k * stride_asg) * gl.load(bs_ptrs + k * stride_bsk)
            # the previous K tile's WGMMA is done (this one may still run): promote its partial
            done = warpgroup_mma_wait(num_outstanding=1, deps=(part,))
            # both warp groups past that WGMMA before its stage is refilled
            gl.thread_barrier()
            if k + STAGES - 1 < KT:
                load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, off_m, b_row, it + STAGES - 1, k + STAGES - 1, STAGES)
            acc += done * scale[:, None]
            spare = done
            part = nxt
            scale = nxt_scale
        done = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
        acc += done * scale[:, None]
        gl.thread_barrier()  # every WGMMA of this tile done before the next tile's loads refill the ring
        base += KT

        out = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), out_l)
        om = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, out_l))
        on = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, out_l))
        gl.store(c_ptr + om.to(gl.int64)[:, None] * stride_cm + on[None, :], out, mask=(on < N)[None, :])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))


__all__ = ["gluon_fp8_pipelined_kernel"]
