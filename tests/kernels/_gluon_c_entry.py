"""Run as a script (its own process: the kernels must be JITFunctions, not the interpreter's):
the Gluon GEMM's kernels (gluon_contiguous.GluonGemm's seven: the TMA or the register epilogue, the
pipelined kernel, the 128 x 192 tile, the column-band order, the activation scales by TMA, and with
the one-warp producer),
lowered for sm_90 as compile_check lowers them, each behind a stand-in CudaLauncher built from its
real signature and TMA metadata with Triton's own driver.wrap_handle_tensordesc. A call's first
launch goes through the (stubbed) JIT, which launches as JITFunction.run does (CompiledKernel.run:
Triton's wrapper expands the descriptors); the next two through launch.py's handle and the C
entry. Each must hand the C entry what the JIT's launch handed it (tensors as their pointers), the
second filling no descriptor again. make_tensordesc_arg's CUDA call (cuTensorMapEncodeTiled) is
replaced by a stand-in of what it encodes. Prints `checked N kernels` and exits 0, or raises."""

from __future__ import annotations

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)  # before the kernels' modules are imported

import torch
import triton.backends.nvidia.driver as drv
from triton.runtime.jit import JITFunction

from moebench.kernels.triton import compile_check as cc
from moebench.kernels.triton import gluon_contiguous as gc
from moebench.kernels.triton import launch as fl

# GluonGemm's config -> compile_check's name of the variant it launches
VARIANTS = {
    "gluon_contiguous fp8_block 128x128x128 WS stages 4 TMA epilogue": None,
    "gluon_contiguous fp8_block 128x128x128 WS stages 4": dict(EPILOGUE_TMA=False),
    "gluon_contiguous fp8_block 128x128x128 stages 4": dict(WS=False, EPILOGUE_TMA=False),
    "gluon_wide fp8_block 128x192x128 WS stages 4 TMA epilogue": dict(BLOCK_SIZE_N=192),
    "gluon_contiguous fp8_block 128x128x128 WS stages 4 TMA epilogue column bands": dict(GROUP_SIZE_N=16),
    "gluon_wide fp8_block 128x192x128 WS stages 4 TMA epilogue scales by TMA": dict(BLOCK_SIZE_N=192, SCALE_TMA=True),
    "gluon_wide fp8_block 128x192x128 WS stages 4 TMA epilogue scales by TMA, one-warp producer": dict(
        BLOCK_SIZE_N=192, SCALE_TMA=True, PRODUCER_1W=True
    ),
}
BASE = (5, 99, False, False, None, None, (4, 1, 1000), None, None, None)  # stream .. exit hook (after the grid)


def fake_fill(arg, meta):
    """make_tensordesc_arg without CUDA: what the CUtensorMap would encode, then shape and strides."""
    if meta is None:
        return [arg.base, *arg.shape, *arg.strides, arg.padding == "nan", *arg.shape, *arg.strides]
    return [
        ("CUtensorMap", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), repr(sorted(meta.items()))),
        *arg.shape,
        *arg.strides,
    ]


class CudaLauncher:
    """Triton 3.6's CudaLauncher as launch_entry.direct reads it, its C entry recording its arguments."""

    def __init__(self, kernel):
        self.c_calls: list = []
        self.launch = drv.wrap_handle_tensordesc(
            lambda *a: self.c_calls.append(a), kernel.src.signature, kernel.metadata.tensordesc_meta
        )
        self.global_scratch_size = self.profile_scratch_size = 0
        self.num_ctas, self.launch_cooperative_grid, self.launch_pdl = 1, False, False


class Compiled:
    function, packed_metadata = 99, (4, 1, 1000)

    def __init__(self, launcher):
        self.run = launcher


def pointers(args: tuple) -> tuple:
    return tuple(x.data_ptr() if isinstance(x, torch.Tensor) else x for x in args)


def main() -> int:
    drv.make_tensordesc_arg = fake_fill  # (inner reads it from the module at each call, as launch.py does)
    gc.num_sms = lambda device: 132
    hooks = type("Hooks", (), {"launch_enter_hook": None, "launch_exit_hook": None, "jit_cache_hook": None})()
    fl.set_enabled(True)
    fl._RUNTIME = (lambda: 0, lambda device: 5, hooks)
    g = torch.Generator().manual_seed(3)
    E, N, K, Mp = 2, 512, 2048, 512
    w = torch.randn(E, N, K, generator=g).to(torch.float8_e4m3fn)
    w_s = torch.rand(E, N // 128, K // 128, generator=g)
    a = torch.randn(Mp, K, generator=g).to(torch.float8_e4m3fn)
    a_s = torch.rand(K // 128, Mp, generator=g).t()  # MN-major
    c = torch.empty(Mp, N, dtype=torch.bfloat16)
    m_idx = (torch.arange(Mp) // 128 % E).to(torch.int32)
    rows = torch.tensor([Mp], dtype=torch.int32)
    compiled = {
        name: cc._compile(fn, types, consts, 90, warps, stages)
        for name, fn, types, consts, warps, stages in cc.variants(True)
        if name in VARIANTS
    }
    assert len(compiled) == len(VARIANTS), sorted(compiled)
    for name, config in VARIANTS.items():
        launcher = CudaLauncher(compiled[name])

        def jit_run(self, *args, grid, warmup, launcher=launcher, **kwargs):
            vals, _ = fl.bind(fl._plan(self), args, kwargs)  # what JITFunction.run binds
            launcher.launch(grid[0], 1, 1, *BASE, *vals)  # CompiledKernel.run without scratch: Triton's wrapper
            return Compiled(launcher)

        jit_run.__qualname__ = "JITFunction.run"  # (launch.py takes the handle only behind Triton's own run)
        JITFunction.run = jit_run
        gemm = gc.GluonGemm(w, w_s, config)
        fills = []
        for _ in range(3):
            before = fl.stats["fills"]
            gemm(a, a_s, c, m_idx, rows)
            fills.append(fl.stats["fills"] - before)
        jit, first, second = map(pointers, launcher.c_calls)
        differ = [(i, x, y) for i, (x, y) in enumerate(zip(jit, first, strict=True)) if x != y]
        assert first == jit and second == jit, (name, differ)
        n_desc = sum(t.startswith("tensordesc") for t in compiled[name].src.signature.values())
        assert fills == [0, n_desc, 0], (name, fills)  # the JIT's launch fills its own; the handle's once
    print(f"checked {len(VARIANTS)} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
