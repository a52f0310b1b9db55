"""Run as a script (its own process: the kernels must be JITFunctions, not the interpreter's):
every Triton launch of benchmarks/host_python.py's pieces (the experts' forwards, the wrappers),
launched twice with Triton's JIT stubbed, must hand CompiledKernel.run, on the handle path, the
values JITFunction.run would bind: every parameter in declaration order (bind()). Prints
`checked N handle launches of K kernels` and exits 0, or raises."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from moebench.kernels.triton import launch as fl  # noqa: E402 (after the environment)

calls: list = []  # (fn, args, kwargs) of every launch
real_launch = fl.launch


def recording_launch(fn, grid, *args, **kwargs):
    calls.append((fn, args, kwargs))
    real_launch(fn, grid, *args, **kwargs)


fl.launch = recording_launch  # before the kernel modules import it by name

import host_python as hp  # noqa: E402 (after the recording launch is patched in, which host_python imports by name)

handle_vals: list = []  # (index into calls, the values CompiledKernel.run received)


def run(self, *a):
    handle_vals.append((len(calls) - 1, a[9:]))  # grid x3, stream, function, metadata, meta, hooks x2


def same(x, y) -> bool:
    """x (what the handle got) is the JIT's y: the object itself, a tensor as its data_ptr() int
    (launch.site_key_args: the launcher takes a pointer parameter's int as it is), or an equal
    value of the same type."""
    if hasattr(y, "data_ptr"):
        return x is y or (type(x) is int and x == y.data_ptr())
    return x is y or (type(x) is type(y) and x == y)


def extra() -> list:
    """Launches host_python's pieces leave out: reduction=finalize (the zeroing of non-local rows),
    fp8_tensor (the amax and tensor passes), the batched layout, the local prepare's fused fp8
    quantize-and-localize (CUDA only in a layer)."""
    import torch

    from moebench.kernels.interfaces import ExpertWeights, QuantSpec
    from moebench.kernels.quant import quant_weights
    from moebench.kernels.triton import moe
    from moebench.kernels.triton.quant import group_quant_and_localize

    g = torch.Generator().manual_seed(1)
    M, P, E, K, N, X = 24, 4, 8, 256, 256, 16
    ids = torch.randint(-1, E, (M, P), generator=g)
    tw = torch.rand(M, P, generator=g)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}
    out = []
    for name in ("bf16", "fp8_tensor", "fp8_block"):
        q = QuantSpec(name)
        w13, s13 = quant_weights(torch.randn(E, N, K, generator=g), q)
        w2, s2 = quant_weights(torch.randn(E, K, N // 2, generator=g), q)
        ew = ExpertWeights(w13_ENK=w13, w2_EKI=w2, w13_scale=s13, w2_scale=s2, quant=q)
        tail = moe.standard_ws2_tail_rows(M, P, E, cfg["BLOCK_SIZE_M"], N // 2)  # the experts' ws2: the scratch's rows
        ws13, ws2 = (
            torch.empty(M * P * N, dtype=torch.bfloat16),
            torch.empty((M * P + tail) * N // 2, dtype=torch.bfloat16),
        )
        y = torch.empty(M, P, K, dtype=torch.bfloat16)
        out.append(
            lambda ew=ew, ws13=ws13, ws2=ws2, y=y: moe.fused_moe_standard(
                x, None, ids, tw, ew, y, ws13, ws2, cfg, "finalize"
            )
        )
        xb = torch.randn(E, X, K, generator=g).to(torch.bfloat16)
        counts = torch.randint(0, X + 1, (E,), generator=g, dtype=torch.int32)
        wb13, wb2 = torch.empty(E * X * N, dtype=torch.bfloat16), torch.empty(E * X * N // 2, dtype=torch.bfloat16)
        yb = torch.empty(E, X, K, dtype=torch.bfloat16)
        out.append(
            lambda ew=ew, wb13=wb13, wb2=wb2, yb=yb, xb=xb, counts=counts: moe.fused_moe_batched(
                xb, None, counts, ew, yb, wb13, wb2, cfg
            )
        )
    out += [_contiguous_layer(q) for q in ("bf16", "fp8_block")]
    out += [lambda ids=ids: group_quant_and_localize(x, 128, ids, 2, 4) for ids in (ids, ids.int())]
    return out + _gluon_gemms()


def _gluon_gemms() -> list:
    """The Gluon GEMM's launches (issue #46): the warp-specialized kernel with its TMA-store epilogue
    (c_desc a descriptor) and without (c_desc None), the pipelined one and the 128 x 192 tile, each
    a GluonGemm set up once (its weight's descriptors kept) on CPU tensors, the SM count stubbed."""
    import torch

    from moebench.kernels.triton import gluon_contiguous as gc
    from moebench.kernels.triton.gluon_wide import WIDE_N

    gc.num_sms = lambda device: 4  # (a CUDA query: no device here)
    g = torch.Generator().manual_seed(3)
    E, N, K, Mp = 2, 256, 256, 256
    w = torch.randn(E, N, K, generator=g).to(torch.float8_e4m3fn)
    w_s = torch.rand(E, N // 128, K // 128, generator=g)
    a = torch.randn(Mp, K, generator=g).to(torch.float8_e4m3fn)
    a_s = torch.rand(K // 128, Mp, generator=g).t()  # MN-major
    c = torch.empty(Mp, N, dtype=torch.bfloat16)
    m_idx = (torch.arange(Mp) // 128).to(torch.int32)
    rows = torch.tensor([Mp], dtype=torch.int32)
    configs = (None, dict(EPILOGUE_TMA=False), dict(WS=False, EPILOGUE_TMA=False), dict(BLOCK_SIZE_N=WIDE_N))
    gemms = [gc.GluonGemm(w, w_s, cfg) for cfg in configs]
    return [lambda gemm=gemm: gemm(a, a_s, c, m_idx, rows) for gemm in gemms]


def _contiguous_layer(quant: str):
    """One MoEKernel forward on the contiguous (TMA) row layout: the permute, the grouped GEMM
    through tensor descriptors, the un-permute."""
    import torch

    from moebench.kernels import registry
    from moebench.kernels.interfaces import KernelContext, LayerShape, QuantSpec
    from moebench.kernels.modular import MoEKernel
    from moebench.measure.workload import build_expert_weights, make_inputs

    shape = LayerShape(hidden=256, intermediate=128, num_experts=8, topk=2)
    ctx = KernelContext(
        shape=shape,
        quant=QuantSpec(quant),
        device=torch.device("cpu"),
        simulate_ep=2,
        options={"row_layout": "contiguous"},
    )
    experts = registry.get_experts("triton")(build_expert_weights(ctx, 0), "experts", ctx)
    layer = MoEKernel(registry.get_backend("local")(ctx), experts, None, "none")
    x, w, ids = make_inputs(shape, 40, "uniform", 1.0, 0, 0, 1, "cpu")
    return lambda: layer(x, w, ids)


def main() -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    hp.stub_triton()
    hp.StubCompiled.run = run
    for fn in [*hp.pieces().values(), *extra()]:
        if fn is not None:
            fn()
            fn()  # the second time through the handle
    assert handle_vals, "no launch took the handle"
    for i, vals in handle_vals:
        fn, args, kwargs = calls[i]
        want, _ = fl.bind(fl._plan(fn), args, kwargs)
        assert want is not None and len(vals) == len(want), (fn, len(vals), want)
        bad = [(n, v, w) for n, v, w in zip(fl._plan(fn).names, vals, want, strict=True) if not same(v, w)]
        assert not bad, (fn, bad)
    # the Gluon kernels' call sites take the per-site key (issue #46: c_desc positional, not a runtime keyword)
    gluon = {id(fn): fn for fn, _, _ in calls if fn.is_gluon()}
    assert len(gluon) == 3 and all(site.ok for fn in gluon.values() for site in fl._plan(fn).sites.values()), gluon
    print(f"checked {len(handle_vals)} handle launches of {len({id(calls[i][0]) for i, _ in handle_vals})} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
