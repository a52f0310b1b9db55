"""The Python a forward's Triton path runs on the host, measured on the CPU with every
Triton launch stubbed (issue #34): what the launcher and the wrappers around the kernels
cost before Triton's C launcher would be called. Not host enqueue on a GPU (that is
benchmarks/host_enqueue.py): no CUDA driver, no torch CUDA dispatch; torch's CPU ops on
small tensors (views, empty, zero_) stand in for theirs.

How: Triton's kernels are JITFunctions (TRITON_INTERPRET unset); `JITFunction.run` is
replaced by a stand-in that returns a stand-in CompiledKernel whose `run` does nothing, and
launch.py's device / stream look-ups by constants. The first call of each piece compiles
nothing: it takes the stand-in's JIT, later calls take launch.py's compiled-handle path.

  piece                       what one call does
  launch_gemm                 launch(fused_moe_kernel, ...) with an invoke_fused_moe_gemm's arguments
  launch_align                launch(_align_count_kernel, ...) (few arguments, many constexprs)
  invoke_fused_moe_gemm       the GEMM wrapper: strides, grid, config -> launch
  per_token_group_quant_fp8   the fp8 activation quantization's wrapper -> launch
  moe_align_block_size        the alignment's wrapper -> launch
  silu_and_mul_rows           the shared experts' SiLU-and-mul in one launch (CUDA bf16; torch's two ops before)
  moe_kernel_bf16             one MoEKernel forward: local, triton experts, bf16 (4 launches)
  fused_moe_standard_{bf16,fp8_block}   the whole standard experts path: 4 / 5 launches,
                              scratch, carving, zero_, copy_ (tiny tensors: their bytes cost little)

Each figure: µs per call, the median of --repeats timings of --number calls (p20, p80 beside).

    python benchmarks/host_python.py [--number 2000] [--repeats 15] [--json OUT.json]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from moebench.util.arg_errors import OneLineErrors, script_prog


class StubCompiled:
    """What launch.py reads from a CompiledKernel; `run` launches nothing."""

    function, packed_metadata = None, None
    launches = 0

    def run(self, *args) -> None:
        StubCompiled.launches += 1

    def launch_metadata(self, grid, stream, *args):
        return None


def stub_triton() -> None:
    """Every JITFunction's launch returns the stand-in kernel; launch.py's device is 0, its
    stream 0, no launch hooks."""
    from triton.runtime.jit import JITFunction

    from moebench.kernels.triton import launch as fl

    compiled = StubCompiled()

    def run(self, *args, grid, warmup, **kwargs):
        StubCompiled.launches += 1
        return compiled

    # it stands in for Triton's own launch path: launch.py takes the compiled handle only behind
    # that (a patched JITFunction.run is a tool watching every launch: the JIT's path)
    run.__qualname__ = "JITFunction.run"
    JITFunction.run = run
    hooks = type("Hooks", (), {"launch_enter_hook": None, "launch_exit_hook": None, "jit_cache_hook": None})()
    fl.set_enabled(True)
    fl._RUNTIME = (lambda: 0, lambda device: 0, hooks)


def time_us(fn: Callable[[], None], number: int, repeats: int) -> dict:
    """µs per call of fn: median, p20, p80 over `repeats` timings of `number` calls."""
    for _ in range(min(number, 200)):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number * 1e6)
    q = statistics.quantiles(samples, n=5) if len(samples) > 1 else samples * 4
    return {"us": statistics.median(samples), "p20": q[0], "p80": q[3], "samples": samples}


def pieces() -> dict[str, Optional[Callable[[], None]]]:
    """name -> a zero-argument call of one piece, its inputs built here (tiny CPU tensors); None
    where this tree lacks the piece."""
    import torch

    from moebench.kernels.interfaces import ExpertWeights, QuantSpec
    from moebench.kernels.triton import align, gemm, moe, quant
    from moebench.kernels.triton.launch import launch

    g = torch.Generator().manual_seed(0)
    M, P, E, K, N = 32, 8, 16, 256, 256  # tiny: the Python is what is timed, not the bytes
    R = M * P
    ids = torch.randint(0, E, (M, P), generator=g)
    weights = torch.rand(M, P, generator=g)
    cfg = {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }
    scratch = torch.empty(moe.standard_scratch_numel(M, P, E, 16), dtype=torch.int32)
    sorted_ids, expert_ids, num_post = align.moe_align_block_size(ids, E, 16, scratch)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    w13 = torch.randn(E, N, K, generator=g).to(torch.bfloat16)
    h = torch.empty(R, N, dtype=torch.bfloat16)
    gemm_args = (
        x,
        w13,
        w13,  # b_desc: the weights again (no B_TMA)
        h,
        x,
        w13,
        sorted_ids,
        sorted_ids,
        expert_ids,
        num_post,
        N,
        sorted_ids.numel(),
        R,
        *x.stride(),
        *w13.stride(),
        *h.stride(),
        0,
        0,
        0,
        0,
        0,
    )
    gemm_kwargs = dict(
        K=K,
        A_ROW_DIV=P,
        C_ROW_DIV=1,
        MUL_ROUTED_WEIGHT=False,
        ATOMIC_ADD=False,
        QUANT=0,
        GROUP_N=128,
        GROUP_K=128,
        BLOCK_SIZE_M=16,
        BLOCK_SIZE_N=64,
        BLOCK_SIZE_K=128,
        GROUP_SIZE_M=1,
        num_warps=4,
        num_stages=3,
        INTERPRET=False,
    )
    flat = ids.reshape(-1)
    meta = scratch[-100:]
    out = {
        "launch_gemm": lambda: launch(gemm.fused_moe_kernel, (64,), *gemm_args, **gemm_kwargs),
        "launch_align": lambda: launch(
            align._align_count_kernel,
            (1,),
            flat,
            meta,
            expert_ids,
            sorted_ids,
            R,
            E,
            10,
            BLOCK_M=16,
            NUM_BINS=32,
            CHUNK=1024,
            BLOCK_B=64,
            SCATTER=True,
            PAD_C=16,
            num_warps=4,
        ),
        "invoke_fused_moe_gemm": lambda: gemm.invoke_fused_moe_gemm(
            x, None, w13, None, h, sorted_ids, expert_ids, num_post, R, cfg, a_row_div=P
        ),
        "per_token_group_quant_fp8": lambda: quant.per_token_group_quant_fp8(x, 128),
        "moe_align_block_size": lambda: align.moe_align_block_size(ids, E, 16, scratch),
    }
    out["silu_and_mul_rows"] = _shared_activation(torch.randn(M, 2 * N, generator=g).to(torch.bfloat16))
    out["moe_kernel_bf16"] = _layer_forward(M)
    for name in ("bf16", "fp8_block"):
        q = QuantSpec(name)
        if q.is_fp8:
            from moebench.kernels.quant import quant_weights

            w13_q, w13_s = quant_weights(w13.float(), q)
            w2_q, w2_s = quant_weights(torch.randn(E, K, N // 2, generator=g), q)
        else:
            w13_q, w13_s, w2_q, w2_s = w13, None, torch.randn(E, K, N // 2, generator=g).to(torch.bfloat16), None
        ew = ExpertWeights(w13_ENK=w13_q, w2_EKI=w2_q, w13_scale=w13_s, w2_scale=w2_s, quant=q)
        ws13 = torch.empty(R * N, dtype=torch.bfloat16)
        # ws2 with the tail the experts give it (the sort scratch: moe.standard_ws2_tail_rows)
        ws2 = torch.empty(
            (R + moe.standard_ws2_tail_rows(M, P, E, cfg["BLOCK_SIZE_M"], N // 2)) * N // 2, dtype=torch.bfloat16
        )
        y = torch.empty(M, K, dtype=torch.bfloat16)
        out[f"fused_moe_standard_{name}"] = lambda ew=ew, ws13=ws13, ws2=ws2, y=y: moe.fused_moe_standard(
            x, None, ids, weights, ew, y, ws13, ws2, cfg, "experts"
        )
    return out


def _shared_activation(h):
    """The shared experts' SiLU-and-mul as one Triton launch (absent before 18f4e18: torch's then)."""
    try:
        from moebench.kernels.triton.activation import silu_and_mul_rows
    except ImportError:
        return None
    return lambda: silu_and_mul_rows(h)


def _layer_forward(M: int):
    """One MoEKernel forward: local backend (every expert local: the ids need no localizing, whose
    CPU form is torch's), triton experts, bf16, reduction=experts, tiny shape."""
    import torch

    from moebench.kernels import registry
    from moebench.kernels.interfaces import KernelContext, LayerShape, QuantSpec
    from moebench.kernels.modular import MoEKernel
    from moebench.measure.workload import build_expert_weights, make_inputs

    shape = LayerShape(
        hidden=256, intermediate=128, num_experts=16, topk=4, num_shared_experts=0, shared_intermediate=0
    )
    ctx = KernelContext(shape=shape, quant=QuantSpec("bf16"), device=torch.device("cpu"), simulate_ep=1, options={})
    pf = registry.get_backend("local")(ctx)
    layer = MoEKernel(pf, registry.get_experts("triton")(build_expert_weights(ctx, 0), "experts", ctx), None, "none")
    x, w, ids = make_inputs(shape, M, "uniform", 1.0, 0, 0, 1, "cpu")
    return lambda: layer(x, w, ids)


def run(number: int, repeats: int, only: list[str] | None = None) -> list[dict]:
    """One row per piece: name, µs per call (median, p20, p80), stand-in launches per call, and of
    those after the first call how many took launch.py's compiled handle (a call whose arguments it
    cannot key goes through the JIT every time: a different path, timed as this one).
    Run it in a process of its own: it replaces Triton's launch for good there."""
    from moebench.kernels.triton import launch as fl

    # the kernels must be JITFunctions (the GPU's path), not the interpreter's: read at their import
    os.environ.pop("TRITON_INTERPRET", None)
    stub_triton()
    rows = []
    for name, fn in pieces().items():
        if fn is None or (only and name not in only):
            continue
        before = StubCompiled.launches
        fn()
        launches = StubCompiled.launches - before
        handle = fl.stats["handle"]
        fn()  # (the first call went through the JIT)
        rows.append(
            {
                "piece": name,
                "launches": launches,
                "handle_launches": fl.stats["handle"] - handle,
                **time_us(fn, number, repeats),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    """The rows as Markdown: µs per call of each piece's host Python (CPU, launches stubbed)."""
    lines = ["| piece | launches | µs / call (median) | p20 – p80 |", "|---|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['piece']} | {r['launches']} | {r['us']:.2f} | {r['p20']:.2f} – {r['p80']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=2000, help="calls per timing")
    ap.add_argument("--repeats", type=int, default=15, help="timings per piece")
    ap.add_argument("--only", default="", help="comma-separated pieces (default: all)")
    ap.add_argument("--json", help="write the rows here (with the environment)")
    args = ap.parse_args(argv)
    if args.number < 1 or args.repeats < 1:
        print("host_python: --number and --repeats must be >= 1", file=sys.stderr)
        return 2
    rows = run(args.number, args.repeats, [p for p in args.only.split(",") if p] or None)
    print(table(rows))
    if args.json:
        import platform

        import torch
        import triton

        env = {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "machine": platform.machine(),
            "processor": platform.processor(),
        }
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
