"""The warp-specialized Gluon GEMM of gluon_contiguous.py at a 128 x 192 output tile (issue #35):
the tile DeepGEMM's SM90 heuristic picks for DeepSeek-V3's and qwen3's prefill GEMMs (with a
2-CTA cluster multicasting B, which this kernel does not do; docs/findings/triton-vs-deepgemm.md,
"What DeepGEMM runs instead"). At DeepSeek-V3's EP-8 gate/up GEMM and 4096 tokens it makes 8 full
waves of tiles on 132 SMs where the 128 x 128 tile makes 11.6, and moves 17 % fewer bytes per MAC.

Gluon's tensors and shared-memory buffers take power-of-two shapes only, so the 192 columns are
two WGMMAs per K step, 128 and 64 columns wide, over two B buffers loaded by two TMA descriptors
(rows b_row .. b_row+127 and b_row+128 .. b_row+191 of w viewed as [E * N, K]); each math warp
group keeps two partials and two accumulators (64 + 64 + 32 + 32 fp32 registers a thread, where
DeepGEMM's single 192-wide WGMMA takes 96 + 96). The weight scales: tiles start at multiples of
192, so the 64-column part always lies in the second of the two 128-column scale blocks the tile
touches, and the 128-column part lies in the first or straddles both (a scale per column, as
DeepGEMM's 192-wide tile takes). A tile's columns past N (N 4096 is 21 1/3 tiles) read the next
expert's rows or TMA's zero fill and are not stored (TMA clips the store). The output goes through
shared memory and two TMA stores, as EPILOGUE_TMA does. Lowered for sm_90 by compile_check, checked
on GPUs by tests/gpu, timed by benchmarks/triton_fp8_contiguous.py --gluon (GLUON_VARIANTS) and by
`moebench tune --decisions`, which on an H200 chose it from 1024 tokens for mixtral_8x7b and
GLM-4.5-Air (docs/findings/tuning.md). At mixtral's shapes it still does 0.80-0.86 x DeepGEMM's
FLOP/s: the 2-CTA multicast of B and one 192-wide WGMMA in place of 128 + 64 are what it lacks.
Nsight Compute on an H100 (docs/findings/triton-vs-deepgemm.md, "Where the 128 x 192 kernel loses
to DeepGEMM") adds two causes that are not structural: its math warps stall on the activation
scales' global loads (SCALE_TMA, opt-in, TMA-loads them with each stage, as DeepGEMM does), and its
row-group tile order streams an expert's weight once per group of row tiles (GROUP_SIZE_N's column
bands read it once). Timed on an H100 (session 18): SCALE_TMA made mixtral's layer 8-9 % faster from
1024 tokens and `tune --decisions` chose it there; the bands did not pay (GLUON_EXTRAS keeps both
in the tuner's space). A read once into registers for both WGMMAs was tried and ran 1.10-1.22 x
slower (commit 4c3af08).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .contiguous_gemm import GROUP
from .gluon_common import tile_coords

WIDE_N = 192  # the tile's columns: a 128- and a 64-column WGMMA


# SCALE_TMA's shared layout for a [1, BM] fp32 block of activation scales (unswizzled)
SCALE_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


@gluon.jit
def _wide_producer(
    a_desc,
    b0_desc,
    b1_desc,
    as_desc,
    ring,
    m_idx_ptr,
    N,
    num_pid_m,
    num_pid_n,
    num_programs,
    GROUP_SIZE_M: gl.constexpr,
    K: gl.constexpr,
    STAGES: gl.constexpr,
    SCALE_TMA: gl.constexpr,
):
    """The TMA partition: each K step of this program's tiles, wait until both math warp groups
    released the stage (`empty`), then load A's 128-row tile and B's 128 + 64 rows into it (and,
    SCALE_TMA, the A tile's 128 block scales of that K step)."""
    a_bufs, b0_bufs, b1_bufs, as_bufs, ready, empty = ring
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN0: gl.constexpr = b0_desc.block_type.shape[0]
    BN: gl.constexpr = BN0 + b1_desc.block_type.shape[0]
    KT: gl.constexpr = K // BK
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b0_desc.block_type.nbytes + b1_desc.block_type.nbytes
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, num_programs):
        off_m, off_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_SIZE_M, BM, BN)
        b_row = gl.load(m_idx_ptr + off_m) * N + off_n
        for k in range(KT):
            s = it % STAGES
            # a fresh barrier's previous phase counts as done: the first pass through the ring waits for nothing
            mbarrier.wait(empty.index(s), phase=((it // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            if SCALE_TMA:
                mbarrier.expect(bar, nbytes + as_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(as_desc, [k, off_m], bar, as_bufs.index(s))
            else:
                mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, k * BK], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b0_desc, [b_row, k * BK], bar, b0_bufs.index(s))
            tma.async_copy_global_to_shared(b1_desc, [b_row + BN0, k * BK], bar, b1_bufs.index(s))
            it += 1


@gluon.jit
def _wide_math(
    ring,
    epi,
    as_ptr,
    bs_ptr,
    m_idx_ptr,
    N,
    num_pid_m,
    num_pid_n,
    num_programs,
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
    BN0: gl.constexpr,
    BN1: gl.constexpr,
    BK: gl.constexpr,
    SCALE_TMA: gl.constexpr,
):
    """One math warp group: rows [HALF * BM/2, (HALF + 1) * BM/2) of every tile, as
    gluon_contiguous._ws_math with SCALE_AHEAD=1 and EPILOGUE_TMA, over the two column parts.
    SCALE_TMA: the activation scales come with the stage (read from shared memory once it is
    ready) instead of a global load one K step ahead, as DeepGEMM's kernel takes them."""
    a_bufs, b0_bufs, b1_bufs, as_bufs, ready, empty = ring
    c0_desc, c1_desc, c0_bufs, c1_bufs = epi
    ROWS: gl.constexpr = BM // 2
    KT: gl.constexpr = K // BK
    BN: gl.constexpr = BN0 + BN1
    mma0: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN0, 32])
    mma1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN1, 32])
    rows0: gl.constexpr = gl.SliceLayout(1, mma0)
    rows1: gl.constexpr = gl.SliceLayout(1, mma1)
    cols0: gl.constexpr = gl.SliceLayout(0, mma0)
    scale_l: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])  # SCALE_TMA's [1, ROWS] read
    last_block = gl.cdiv(N, GROUP_N) - 1
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, num_programs):
        off_m, off_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_SIZE_M, BM, BN)
        acc0 = gl.zeros([ROWS, BN0], gl.float32, mma0)
        part0 = gl.zeros([ROWS, BN0], gl.float32, mma0)
        acc1 = gl.zeros([ROWS, BN1], gl.float32, mma1)
        part1 = gl.zeros([ROWS, BN1], gl.float32, mma1)
        expert = gl.load(m_idx_ptr + off_m)
        offs_m = off_m + HALF * ROWS + gl.arange(0, ROWS, layout=rows0)
        as_ptrs = as_ptr + offs_m.to(gl.int64) * stride_asm
        first = off_n // GROUP_N
        w_ptrs = bs_ptr + expert.to(gl.int64) * stride_bse + first * stride_bsn
        # the tile's second scale block (clamped: the columns past N that use it are not stored)
        w2_ptrs = bs_ptr + expert.to(gl.int64) * stride_bse + gl.minimum(first + 1, last_block) * stride_bsn
        # the 128-column part's columns in the second block (none when the tile starts on a block)
        in_second = (off_n + gl.arange(0, BN0, layout=cols0)) // GROUP_N > first
        if not SCALE_TMA:
            a_s = gl.load(as_ptrs)  # K tile 0's scales; each step loads the next step's (their latency behind a step)
        b_s = gl.load(w_ptrs)
        b_s2 = gl.load(w2_ptrs)
        for k in range(KT):
            s = it % STAGES
            mbarrier.wait(ready.index(s), phase=(it // STAGES) & 1)
            a_tile = a_bufs.index(s).slice(HALF * ROWS, ROWS)
            part0 = warpgroup_mma(a_tile, b0_bufs.index(s).permute((1, 0)), part0, use_acc=False, is_async=True)
            part1 = warpgroup_mma(a_tile, b1_bufs.index(s).permute((1, 0)), part1, use_acc=False, is_async=True)
            g = min(k + 1, KT - 1)  # (the last step reloads its own)
            if SCALE_TMA:  # this step's, from the stage (read before the stage is released)
                a_row = as_bufs.index(s).slice(HALF * ROWS, ROWS, dim=1).load(scale_l)  # [1, ROWS]
                a_s = gl.convert_layout(gl.sum(a_row, axis=0), rows0)
            else:
                a_next = gl.load(as_ptrs + g * stride_asg)
            b_next = gl.load(w_ptrs + g * stride_bsk)
            b2_next = gl.load(w2_ptrs + g * stride_bsk)
            part0, part1 = warpgroup_mma_wait(num_outstanding=0, deps=(part0, part1))
            mbarrier.arrive(empty.index(s), count=1)
            # (a_s * b_s first, as the 128-column kernel scales: the same products, bit for bit)
            acc0 += part0 * (a_s[:, None] * gl.where(in_second, b_s2, b_s)[None, :])
            acc1 += part1 * gl.convert_layout(a_s * b_s2, rows1)[:, None]
            if not SCALE_TMA:
                a_s = a_next
            b_s = b_next
            b_s2 = b2_next
            it += 1
        c0_buf = c0_bufs.index(HALF)
        c1_buf = c1_bufs.index(HALF)
        tma.store_wait(pendings=0)  # this warp group's previous tile has left its shared-memory tiles
        c0_buf.store(acc0.to(c0_desc.dtype))
        c1_buf.store(acc1.to(c1_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c0_desc, [off_m + HALF * ROWS, off_n], c0_buf)
        tma.async_copy_shared_to_global(c1_desc, [off_m + HALF * ROWS, off_n + BN0], c1_buf)
    tma.store_wait(pendings=0)


@gluon.jit
def gluon_fp8_wide_kernel(
    a_desc,
    b0_desc,
    b1_desc,
    c0_desc,
    c1_desc,
    as_desc,
    as_ptr,
    bs_ptr,
    m_idx_ptr,
    rows_ptr,
    N,
    num_programs,
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
    SCALE_TMA: gl.constexpr = False,
    PRODUCER_1W: gl.constexpr = False,
):
    """gluon_contiguous._gluon_fp8_ws_kernel's structure (a TMA producer and two math warp groups
    meeting only at the stages' `ready` / `empty` mbarriers) over 128 x (BN0 + BN1) tiles: A in
    [BM, 128] blocks, B in [BN0, 128] and [BN1, 128] ones, c in [BM/2, BN0] and [BM/2, BN1] ones.

    PRODUCER_1W (opt-in, the tuner times it): the TMA producer is one warp (40 registers) and math
    warp group 0 the default partition, where by default the producer is the 4-warp default
    partition and both math groups are workers. Triton pads the one-warp partition to a warp
    group (12 warps either way, three of them idle at a barrier); what it could gain is the issue
    slots and registers of four producer warps spinning on their barriers (Nsight Compute: 12 active
    warps an SM against DeepGEMM's 9, 1.6 x its instructions; docs/findings/triton-vs-deepgemm.md).
    gl.warp_specialize takes its partitions as literals: argument tuples held in variables lose
    their constexprs, and one role function threading both argument lists changed the default
    kernel's code, so the two orders are written out; the default order lowers to the same PTX
    as before PRODUCER_1W existed."""
    BM: gl.constexpr = gl.constexpr(a_desc.block_type.shape[0])
    BK: gl.constexpr = gl.constexpr(a_desc.block_type.shape[1])
    BN0: gl.constexpr = gl.constexpr(b0_desc.block_type.shape[0])
    BN1: gl.constexpr = gl.constexpr(b1_desc.block_type.shape[0])
    gl.static_assert(BK == GROUP_N, "one scale group per K tile")
    gl.static_assert(
        BN0 == GROUP_N and BN1 * 2 == GROUP_N,
        "tiles at multiples of 1.5 scale blocks: the second part inside one block",
    )
    gl.static_assert(BM == 128, "two math warp groups of 64 rows")
    gl.static_assert(num_warps == 4, "the producer partition is one warp group")
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b0_bufs = gl.allocate_shared_memory(b0_desc.dtype, [STAGES, BN0, BK], b0_desc.layout)
    b1_bufs = gl.allocate_shared_memory(b1_desc.dtype, [STAGES, BN1, BK], b1_desc.layout)
    if SCALE_TMA:  # as_desc: the activation scales as [K / 128, Mp] in [1, BM] blocks
        as_bufs = gl.allocate_shared_memory(as_desc.dtype, [STAGES, 1, BM], as_desc.layout)
    else:
        as_bufs = a_bufs  # (unused)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    num_pid_m = min(gl.cdiv(gl.load(rows_ptr), BM), a_desc.shape[0] // BM)  # (never past Mp)
    num_pid_n = gl.cdiv(N, BN0 + BN1)
    ring = (a_bufs, b0_bufs, b1_bufs, as_bufs, ready, empty)
    epi = (
        c0_desc,
        c1_desc,
        gl.allocate_shared_memory(c0_desc.dtype, [2, BM // 2, BN0], c0_desc.layout),
        gl.allocate_shared_memory(c1_desc.dtype, [2, BM // 2, BN1], c1_desc.layout),
    )
    if PRODUCER_1W:
        gl.warp_specialize(
            [
                (
                    _wide_math,
                    (
                        ring,
                        epi,
                        as_ptr,
                        bs_ptr,
                        m_idx_ptr,
                        N,
                        num_pid_m,
                        num_pid_n,
                        num_programs,
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
                        BN0,
                        BN1,
                        BK,
                        gl.constexpr(SCALE_TMA),
                    ),
                ),
                (
                    _wide_math,
                    (
                        ring,
                        epi,
                        as_ptr,
                        bs_ptr,
                        m_idx_ptr,
                        N,
                        num_pid_m,
                        num_pid_n,
                        num_programs,
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
                        BN0,
                        BN1,
                        BK,
                        gl.constexpr(SCALE_TMA),
                    ),
                ),
                (
                    _wide_producer,
                    (
                        a_desc,
                        b0_desc,
                        b1_desc,
                        as_desc if SCALE_TMA else a_desc,
                        ring,
                        m_idx_ptr,
                        N,
                        num_pid_m,
                        num_pid_n,
                        num_programs,
                        gl.constexpr(GROUP_SIZE_M),
                        gl.constexpr(K),
                        gl.constexpr(STAGES),
                        gl.constexpr(SCALE_TMA),
                    ),
                ),
            ],
            [4, 1],
            [232, 40],
        )
    else:
        gl.warp_specialize(
            [
                (
                    _wide_producer,
                    (
                        a_desc,
                        b0_desc,
                        b1_desc,
                        as_desc if SCALE_TMA else a_desc,
                        ring,
                        m_idx_ptr,
                        N,
                        num_pid_m,
                        num_pid_n,
                        num_programs,
                        gl.constexpr(GROUP_SIZE_M),
                        gl.constexpr(K),
                        gl.constexpr(STAGES),
                        gl.constexpr(SCALE_TMA),
                    ),
                ),
                (
                    _wide_math,
                    (
                        ring,
                        epi,
                        as_ptr,
                        bs_ptr,
                        m_idx_ptr,
                        N,
                        num_pid_m,
                        num_pid_n,
                        num_programs,
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
                        BN0,
                        BN1,
                        BK,
                        gl.constexpr(SCALE_TMA),
                    ),
                ),
                (
                    _wide_math,
                    (
                        ring,
                        epi,
                        as_ptr,
                        bs_ptr,
                        m_idx_ptr,
                        N,
                        num_pid_m,
                        num_pid_n,
                        num_programs,
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
                        BN0,
                        BN1,
                        BK,
                        gl.constexpr(SCALE_TMA),
                    ),
                ),
            ],
            [4, 4],
            [232, 232],
        )
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


def wide_signature_types(bm: int = 128) -> dict:
    """gluon_fp8_wide_kernel's argument types as a launch specializes them (compile_check)."""

    def desc(rows: int, cols: int, dtype, name: str) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)
        return f"tensordesc<{name}[{rows}, {cols}],{layout!r}>"

    def scale_desc(cols: int) -> str:
        return f"tensordesc<fp32[1, {cols}],{SCALE_LAYOUT!r}>"

    half = GROUP // 2
    t = dict(
        a_desc=desc(bm, GROUP, gl.float8e4nv, "fp8e4nv"),
        b0_desc=desc(GROUP, GROUP, gl.float8e4nv, "fp8e4nv"),
        b1_desc=desc(half, GROUP, gl.float8e4nv, "fp8e4nv"),
        c0_desc=desc(bm // 2, GROUP, gl.bfloat16, "bf16"),
        c1_desc=desc(bm // 2, half, gl.bfloat16, "bf16"),
        as_desc=scale_desc(bm),
        as_ptr="*fp32",
        bs_ptr="*fp32",
        m_idx_ptr="*i32",
        rows_ptr="*i32",
        N="i32",
        num_programs="i32",
    )
    for s in ("asm", "asg", "bse", "bsn", "bsk"):
        t[f"stride_{s}"] = "i32"
    return t


__all__ = ["WIDE_N", "gluon_fp8_wide_kernel", "SCALE_LAYOUT", "wide_signature_types"]
