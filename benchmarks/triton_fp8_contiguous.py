"""Our TMA grouped GEMM (kernels/triton/contiguous_gemm.py) against DeepGEMM's
`m_grouped_fp8_gemm_nt_contiguous` (or, `--quant bf16`, `m_grouped_bf16_gemm_nt_contiguous`)
on the same permuted rows, per tile config.

One GPU. Both GEMMs of a layer (gate/up: [Mp, K] x [E, 2I, K]; down: [Mp, I] x
[E, K, I]) on issue #5's shapes, uniform routing (seed 0): deepseek_v3 as one
rank's share at EP 8 (32 of 256 experts), qwen3_30b_a3b and mixtral_8x7b whole.
Times are triton.testing.do_bench medians; TFLOP/s count the valid rows only
(pairs x 2 x N x K), so the padding of the layout counts against both kernels.

    python benchmarks/triton_fp8_contiguous.py [--quant fp8_block|bf16] [--tokens 4096 16384] [--configs N]
                                               [--variants | --gluon [--group-m G | --group-n G]
                                                             [--scale-tma [--producer-1w]]]
                                               [--variant I]
                                               [--check TOL] [--json out.json]

--gluon times the Gluon kernels (kernels/triton/gluon_contiguous.py, GLUON_VARIANTS: the
warp-specialized one at 4 and 6 stages, the pipelined one at 4, the warp-specialized one at 4 stages
with its block scales loaded two K steps ahead, with its output TMA-stored at 4, 5 and 6 stages, and that at
a 128 x 192 tile, gluon_wide.py)
beside our default Triton tile, in GROUP_SIZE_M-swizzled tile order (--group-m, 8) or in bands of
--group-n column tiles (DeepGEMM's order: kernels/triton/gluon_common.tile_coords), the 128 x 192
tile with its activation scales TMA-loaded with each stage under --scale-tma (and its TMA producer one
warp under --producer-1w); --check TOL only
runs each kernel once into a NaN-filled output, checks it against the fp32 torch product (no
DeepGEMM) and exits 1 when one did not run or differs by more than TOL (relative error of the valid
rows as a whole, or of the worst one).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import torch
import triton

from moebench.kernels.interfaces import FP8_DTYPE
from moebench.kernels.triton.align import max_padded_rows
from moebench.kernels.triton.contiguous_gemm import ALIGN, contiguous_gemm
from moebench.kernels.triton.deepgemm_layout import contiguous_scratch_numel, permute_contiguous
from moebench.kernels.triton.gluon_contiguous import GLUON_VARIANTS
from moebench.kernels.triton.gluon_wide import WIDE_N
from moebench.util.arg_errors import OneLineErrors, script_prog

# name: (experts in the model, experts on this rank, top-k, hidden K, intermediate I)
SHAPES = {
    "deepseek_v3": (256, 32, 8, 7168, 2048),
    "qwen3_30b_a3b": (128, 128, 8, 2048, 768),
    "mixtral_8x7b": (8, 8, 2, 4096, 14336),
    "tiny": (8, 4, 2, 256, 128),  # the CPU smoke test (tests/project/test_benchmarks.py), through Triton's interpreter
}
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M, num_warps, num_stages); fp8's BLOCK_K is the 128 scale group
CONFIGS = {
    "fp8_block": [
        (128, 128, 128, 8, 8, 4),
        (128, 128, 128, 8, 4, 4),
        (128, 256, 128, 8, 8, 3),
        (128, 256, 128, 8, 8, 4),
        (64, 128, 128, 8, 4, 5),
        (64, 256, 128, 8, 8, 4),
    ],
    "bf16": [
        (128, 128, 64, 8, 8, 4),
        (128, 256, 64, 8, 8, 3),
        (128, 128, 64, 8, 4, 4),
        (128, 128, 128, 8, 8, 3),
        (64, 128, 64, 8, 4, 5),
        (128, 256, 64, 8, 8, 4),
    ],
}
# issue #35's variants (--variants; --variant I runs only the I-th, so a shell loop can give each a
# timeout of its own): a tile as above plus the kernel's options (BOUNDED: only the row tiles in
# use walked); persistent grid only. Tried before and removed (docs/findings/triton-vs-deepgemm.md):
# the promotion one K tile late; Triton's automatic warp specialization (WS) of the K loop, of the
# tile loop at 4 and 8 warps, with and without the padding-tile branch, fp8 and bf16: each hung.
VARIANTS = {
    "fp8_block": [((128, 128, 128, 8, 8, 4), {}), ((128, 128, 128, 8, 8, 4), dict(BOUNDED=True))],
    "bf16": [((128, 256, 64, 8, 8, 3), {}), ((128, 256, 64, 8, 8, 3), dict(BOUNDED=True))],
}


def routing(M: int, E_all: int, E: int, P: int, dev) -> torch.Tensor:
    """Uniform top-P of E_all experts per token, then local ids (-1 for other ranks')."""
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.rand(M, E_all, generator=g).argsort(dim=1)[:, :P].to(torch.int32)
    return torch.where(ids < E, ids, torch.full_like(ids, -1)).to(dev)


def layer_rows(M, shape, dev):
    """Permuted fp8 rows + scales and the layout for M tokens."""
    E_all, E, P, K, _ = shape
    ids = routing(M, E_all, E, P, dev)
    mp = max_padded_rows(M * P, E, ALIGN)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    a = torch.empty(mp, K, device=dev, dtype=FP8_DTYPE)
    a_s = torch.empty(K // 128, mp, device=dev).t()
    scratch = torch.empty(contiguous_scratch_numel(M * P, E, ALIGN), dtype=torch.int32, device=dev)
    lay = permute_contiguous(x, None, ids, E, ALIGN, a, a_s, scratch)
    pairs = int((ids >= 0).sum())
    return a, a_s, lay, pairs, mp


def weights(E, N, K, dev, quant):
    if quant == "bf16":
        return (torch.randn(E, N, K, device=dev) * 0.05).to(torch.bfloat16), None
    w = (torch.randn(E, N, K, device=dev) * 0.05).to(FP8_DTYPE)
    s = torch.rand(E, N // 128, K // 128, device=dev) * 0.01 + 0.005
    return w, s


def act_rows(mp, I, dev, quant):
    if quant == "bf16":
        return torch.randn(mp, I, device=dev).to(torch.bfloat16), None
    a = (torch.randn(mp, I, device=dev)).to(FP8_DTYPE)
    s = (torch.rand(I // 128, mp, device=dev) * 0.01 + 0.005).t()
    return a, s


def deepgemm_gemm(deep_gemm, quant: str, a, a_s, w, s, c, lay):
    """DeepGEMM's grouped GEMM of the layout's rows into c, as the deepgemm experts call it (the psum
    layout: with m_indices DeepGEMM stores zeros for every padding row of the host-side bound Mp,
    which for deepseek_v3's EP-8 share, all pairs counted and 1/8 of them local, is ~88 %)."""
    if quant == "bf16":
        return functools.partial(deep_gemm.m_grouped_bf16_gemm_nt_contiguous, a, w, c, lay.ends_E, use_psum_layout=True)
    return functools.partial(
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous,
        (a, a_s),
        (w, s),
        c,
        lay.ends_E,
        disable_ue8m0_cast=True,
        use_psum_layout=True,
    )


def bench_us(fn, dev) -> float:
    """Median µs: triton.testing.do_bench on a GPU; a few plain calls on the CPU (smoke test only)."""
    if dev.type == "cuda":
        return triton.testing.do_bench(fn, warmup=25, rep=200) * 1e3
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def torch_reference(a, a_s, w, s, m_indices) -> torch.Tensor:
    """fp32 [Mp, N] per-expert products of the dequantized operands (rows of padding stay 0)."""
    c = torch.zeros(a.shape[0], w.shape[1], device=a.device)
    af = a.float() * a_s.repeat_interleave(128, 1) if a_s is not None else a.float()
    for e in m_indices[m_indices >= 0].unique().tolist():
        rows = (m_indices == e).nonzero().squeeze(1)
        we = w[e].float()
        if s is not None:
            we = we * s[e].repeat_interleave(128, 0).repeat_interleave(128, 1)
        c[rows] = af[rows] @ we.T
    return c


def rel(x, y, valid) -> tuple[float, float]:
    """Relative errors of the valid rows: as a whole, and of the worst row (one wrong tile hides
    in the whole product's norm)."""
    x, y = x[valid].float(), y[valid].float()
    whole = float((x - y).norm() / y.norm().clamp_min(1e-30))
    worst = float(((x - y).norm(dim=1) / y.norm(dim=1).clamp_min(1e-30)).max()) if len(y) else 0.0
    return whole, worst


def main(argv=None) -> list[dict]:
    ap = OneLineErrors(
        prog=script_prog(__file__), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--models", nargs="+", choices=list(SHAPES), default=[m for m in SHAPES if m != "tiny"])
    ap.add_argument(
        "--quant",
        choices=sorted(CONFIGS),
        default="fp8_block",
        help="fp8_block (vs m_grouped_fp8_gemm_nt_contiguous) or bf16 (vs m_grouped_bf16_gemm_nt_contiguous)",
    )
    ap.add_argument("--configs", type=int, default=6, help="use the first N tile configs")
    ap.add_argument(
        "--variants", action="store_true", help="issue #35's kernel variants (VARIANTS) instead of the tiles"
    )
    ap.add_argument("--variant", type=int, default=None, help="with --variants: only the I-th")
    ap.add_argument("--gluon", action="store_true", help="the Gluon kernel (fp8, GPU only) beside our default tile")
    ap.add_argument(
        "--group-m", type=int, default=8, help="--gluon: the kernels' GROUP_SIZE_M (row tiles a swizzle group)"
    )
    ap.add_argument(
        "--check",
        type=float,
        default=None,
        metavar="TOL",
        help="no timing: each kernel once, exit 1 when its relative error exceeds TOL",
    )
    ap.add_argument(
        "--group-n",
        type=int,
        default=0,
        help="--gluon: walk bands of G column tiles over every row tile instead (GROUP_SIZE_N; 0: --group-m's order)",
    )
    ap.add_argument(
        "--scale-tma",
        action="store_true",
        help="--gluon: the 128 x 192 tile TMA-loads the activation scales with each stage (SCALE_TMA)",
    )
    ap.add_argument(
        "--producer-1w",
        action="store_true",
        help="--scale-tma: and the 128 x 192 tile's TMA producer is one warp (PRODUCER_1W)",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda", help="cuda; cpu runs the Triton interpreter (a smoke test, no timing)")
    args = ap.parse_args(argv)
    if args.gluon and (args.quant != "fp8_block" or args.variants or not args.device.startswith("cuda")):
        ap.error("--gluon is fp8_block on a CUDA GPU only (Gluon has no interpreter), without --variants")
    if args.group_n < 0 or args.group_m < 1 or ((args.group_n or args.scale_tma) and not args.gluon):
        ap.error("--group-m takes G >= 1; --group-n takes G >= 1 (0: off); --group-n and --scale-tma need --gluon")
    if args.producer_1w and not args.scale_tma:
        ap.error("--producer-1w needs --scale-tma (GLUON_EXTRAS times the one-warp producer over SCALE_TMA)")
    if args.variant is not None:
        n = len(GLUON_VARIANTS) if args.gluon else len(VARIANTS[args.quant])
        if not ((args.variants or args.gluon) and 0 <= args.variant < n):
            ap.error(f"--variant needs --variants (or --gluon) and an index in [0, {n}) for --quant {args.quant}")
    dev = torch.device(args.device)
    try:
        import deep_gemm
    except Exception as e:  # noqa: BLE001 (deep_gemm is optional: failing to import in any way, Triton is timed alone)
        deep_gemm = None
        print(f"deep_gemm not importable ({e}): Triton only")
    if dev.type != "cuda" or args.check is not None:  # --check: against the fp32 torch product, no JIT compile
        deep_gemm = None
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    out = []
    print(f"{'model':14} {'tokens':>6} {'gemm':7} {'kernel':34} {'µs':>9} {'TFLOP/s':>8} {'vs DG':>6} rel_err")
    for name in args.models:
        shape = SHAPES[name]
        E_all, E, P, K, I = shape
        w13, s13 = weights(E, 2 * I, K, dev, args.quant)
        w2, s2 = weights(E, K, I, dev, args.quant)
        for M in args.tokens:
            a1, a1_s, lay, pairs, mp = layer_rows(M, shape, dev)
            if args.quant == "bf16":  # the layout's rows, bf16 (the values do not change the timing)
                a1, a1_s = act_rows(mp, K, dev, "bf16")
            a2, a2_s = act_rows(mp, I, dev, args.quant)
            valid = lay.m_indices_Mp >= 0
            for gemm, (a, a_s, w, s) in (("gate_up", (a1, a1_s, w13, s13)), ("down", (a2, a2_s, w2, s2))):
                N = w.shape[1]
                flop = 2.0 * pairs * N * w.shape[2]
                c_ref = None
                dg_us = None
                if deep_gemm is not None:
                    c_ref = torch.empty(mp, N, device=dev, dtype=torch.bfloat16)
                    dg = deepgemm_gemm(deep_gemm, args.quant, a, a_s, w, s, c_ref, lay)
                    dg()
                    dg_us = bench_us(dg, dev)
                    row = dict(model=name, tokens=M, gemm=gemm, kernel="deep_gemm", us=dg_us, tflops=flop / dg_us / 1e6)
                    out.append(row)
                    print(f"{name:14} {M:6} {gemm:7} {'deep_gemm':34} {dg_us:9.1f} {row['tflops']:8.0f}")
                else:  # no DeepGEMM: check against torch instead
                    c_ref = torch_reference(a, a_s, w, s, lay.m_indices_Mp[:mp])
                tiles = (
                    VARIANTS[args.quant] if args.variants else [(t, {}) for t in CONFIGS[args.quant][: args.configs]]
                )
                if args.variants and args.variant is not None:
                    tiles = tiles[args.variant : args.variant + 1]
                if args.gluon:  # --variant I: the I-th Gluon variant alone (a hang costs one process)
                    picked = GLUON_VARIANTS if args.variant is None else GLUON_VARIANTS[args.variant : args.variant + 1]
                    tiles = VARIANTS[args.quant][:1] + [
                        (
                            (128, bn, 128, args.group_m, 4 if ws else 8, st),
                            dict(gluon=True, WS=ws, SCALE_AHEAD=ahead, EPILOGUE_TMA=epi),
                        )
                        for ws, st, ahead, epi, bn in picked
                    ]
                for (bm, bn, bk, gm, nw, ns), extra in tiles:
                    cfg = dict(
                        BLOCK_SIZE_M=bm,
                        BLOCK_SIZE_N=bn,
                        BLOCK_SIZE_K=bk,
                        GROUP_SIZE_M=gm,
                        num_warps=nw,
                        num_stages=ns,
                        **extra,
                    )
                    for progs in (sms,) if args.variants or args.gluon else (sms, None):
                        label = f"{bm}x{bn}x{bk} g{gm} w{nw} s{ns} " + ("persist" if progs else "grid")
                        label += "".join(f" {k}={v}" for k, v in extra.items())
                        # NaN first: a kernel that leaves tiles unwritten must not read a freed buffer's product
                        c = torch.full((mp, N), float("nan"), device=dev, dtype=torch.bfloat16)
                        fn = functools.partial(
                            contiguous_gemm,
                            a,
                            a_s,
                            w,
                            s,
                            c,
                            lay.m_indices_Mp,
                            cfg,
                            num_programs=progs if progs else 1 << 30,
                            rows_in_use=lay.num_post,
                        )
                        if extra.get("gluon"):
                            from moebench.kernels.triton.gluon_contiguous import gluon_contiguous_gemm

                            order = f"band{args.group_n}" if args.group_n else f"g{gm}"
                            label = f"gluon {bm}x{bn}x{bk} {order} {'WS' if extra['WS'] else f'w{nw}'} stages {ns}"
                            label += f" ahead {extra['SCALE_AHEAD']}" if extra["SCALE_AHEAD"] != 1 else ""
                            label += " tma-epi" if extra["EPILOGUE_TMA"] else ""
                            scale_tma = args.scale_tma and bn == WIDE_N  # (the 128 x 192 tile's option)
                            label += " scales-tma" if scale_tma else ""
                            producer_1w = args.producer_1w and scale_tma
                            label += " producer-1w" if producer_1w else ""
                            gcfg = dict(
                                BLOCK_SIZE_M=bm,
                                BLOCK_SIZE_N=bn,
                                GROUP_SIZE_M=gm,
                                GROUP_SIZE_N=args.group_n,
                                SCALE_TMA=scale_tma,
                                PRODUCER_1W=producer_1w,
                                STAGES=ns,
                                num_warps=nw,
                                WS=extra["WS"],
                                SCALE_AHEAD=extra["SCALE_AHEAD"],
                                EPILOGUE_TMA=extra["EPILOGUE_TMA"],
                            )
                            fn = functools.partial(
                                gluon_contiguous_gemm, a, a_s, w, s, c, lay.m_indices_Mp, lay.num_post, gcfg
                            )
                        try:
                            fn()
                            if dev.type == "cuda":
                                torch.cuda.synchronize()
                        except Exception as e:  # noqa: BLE001  (a config that does not compile)
                            print(f"{name:14} {M:6} {gemm:7} {label:34} failed: {type(e).__name__}: {str(e)[:120]}")
                            if args.check is not None:  # under --check a kernel that did not run fails
                                out.append(
                                    dict(
                                        model=name,
                                        tokens=M,
                                        gemm=gemm,
                                        quant=args.quant,
                                        kernel=label,
                                        failed=True,
                                        error=f"{type(e).__name__}: {str(e)[:200]}",
                                    )
                                )
                            continue
                        err, row_err = rel(c, c_ref, valid) if c_ref is not None else (float("nan"), float("nan"))
                        us = bench_us(fn, dev) if args.check is None else float("nan")
                        row = dict(
                            model=name,
                            tokens=M,
                            gemm=gemm,
                            quant=args.quant,
                            kernel=label,
                            us=us,
                            tflops=flop / us / 1e6,
                            rel_err=err,
                            row_rel_err=row_err,
                            vs_deepgemm=(dg_us / us) if dg_us else None,
                        )
                        if args.check is not None and not (err <= args.check and row_err <= args.check):  # (NaN fails)
                            row["failed"] = True
                            print(f"FAILED: {label} differs by {err:.2e} (worst row {row_err:.2e}) > {args.check:g}")
                        out.append(row)
                        vs = f"{dg_us / us:6.2f}" if dg_us else "     -"
                        print(
                            f"{name:14} {M:6} {gemm:7} {label:34} {us:9.1f} {row['tflops']:8.0f} {vs} {err:.1e}",
                            flush=True,
                        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    sys.exit(1 if any(r.get("failed") for r in main()) else 0)
