"""What the Gluon GEMM kernels share (gluon_contiguous.py's warp-specialized kernel and
gluon_pipelined.py's counter-example): a stage's TMA loads and a tile's coordinates."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, off_m, b_row, it, k, STAGES: gl.constexpr):
    """TMA-load K tile k of A's row tile and B's column tile into stage it % STAGES (`it`
    counts this program's K steps over all its tiles, so the stages' mbarrier phases carry on)."""
    BK: gl.constexpr = a_desc.block_type.shape[1]
    s = it % STAGES
    bar = ready.index(s)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [off_m, k * BK], bar, a_bufs.index(s))
    tma.async_copy_global_to_shared(b_desc, [b_row, k * BK], bar, b_bufs.index(s))


@gluon.jit
def tile_coords(tile, num_pid_m, num_pid_n, GROUP_SIZE_M: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """(off_m, off_n) of a program's tile-th tile. GROUP_SIZE_M > 0: groups of that many row tiles,
    each walked over every column tile, its row tiles fastest (Triton's matmul tutorial order).
    GROUP_SIZE_M < 0: bands of -GROUP_SIZE_M column tiles, each walked over every row tile, its
    column tiles fastest (DeepGEMM's order for its grouped GEMMs). A grouped GEMM's row tiles
    change expert along M, so a row group that straddles two experts streams both experts' whole
    weight; a column band reads each weight tile once and re-reads the activations once a band."""
    gl.static_assert(GROUP_SIZE_M != 0, "GROUP_SIZE_M: > 0 row groups, < 0 column bands")
    if GROUP_SIZE_M > 0:
        num_in_group = GROUP_SIZE_M * num_pid_n
        first_m = (tile // num_in_group) * GROUP_SIZE_M
        group_m = min(num_pid_m - first_m, GROUP_SIZE_M)
        return (first_m + (tile % num_in_group) % group_m) * BM, ((tile % num_in_group) // group_m) * BN
    else:
        num_in_band = -GROUP_SIZE_M * num_pid_m
        first_n = (tile // num_in_band) * -GROUP_SIZE_M
        band_n = min(num_pid_n - first_n, -GROUP_SIZE_M)
        return ((tile % num_in_band) // band_n) * BM, (first_n + (tile % num_in_band) % band_n) * BN


__all__ = ["load_stage", "tile_coords"]
