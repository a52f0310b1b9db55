"""The Gluon GEMMs' opt-in options against their defaults and DeepGEMM, timed interleaved.

One GPU (SM90, DeepGEMM importable). Both GEMMs of a layer on the permuted rows of uniform
routing (triton_fp8_contiguous.py's shapes, rows and weights): DeepGEMM's
`m_grouped_fp8_gemm_nt_contiguous`, the 128 x 128 Gluon kernel and the 128 x 192 one
(gluon_wide.py), each also in the column-band tile order (GROUP_SIZE_N) and, for the 128 x 192
tile, with its activation scales TMA-loaded with each stage (SCALE_TMA), and that with its TMA
producer one warp (PRODUCER_1W). Each kernel is timed in
--rounds rounds that take every kernel in turn (triton.testing.do_bench, median of the rounds),
so a clock that drifts under the power cap lands on every kernel alike; the SM clock is read
after each (torch.cuda.clock_rate). Every option's output must equal its default's bit for bit
(the same WGMMA partials, promoted in the same order) and lie within 1e-2 of DeepGEMM's; a
kernel that does not prints FAILED and the script exits 1.

    python benchmarks/gluon_options.py [--models mixtral_8x7b ...] [--tokens 2048 4096 16384]
                                       [--rounds 5] [--json out.json] [--kernels "gluon 128x192 scale-tma" ...]

Session 17's Nsight Compute reading of the 128 x 192 kernel (docs/findings/triton-vs-deepgemm.md,
"Where the 128 x 192 kernel loses to DeepGEMM") is what the options answer.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys

import torch

# (benchmarks/ is sys.path[0])
from triton_fp8_contiguous import SHAPES, act_rows, deepgemm_gemm, layer_rows, rel, weights

from moebench.kernels.triton.decisions import gluon_config_of
from moebench.kernels.triton.gluon_contiguous import GLUON_EXTRAS
from moebench.util.arg_errors import OneLineErrors, script_prog


def _kernels() -> dict:
    """name: (the default it must match bit for bit, GluonGemm's config): each tile's default and
    the options `tune --decisions` times over it (GLUON_EXTRAS, each over GLUON_CONFIG's variant of
    its tile), plus the 128 x 192 tile in bands of 8 (the band width's other side)."""
    wide = next(v for v, _ in GLUON_EXTRAS if v[4] != 128)
    out: dict = {}
    for v, extra in (*GLUON_EXTRAS, (wide, dict(GROUP_SIZE_N=8))):
        base = f"gluon 128x{v[4]}"
        out.setdefault(base, (None, gluon_config_of(v)))
        assert out[base][1] == gluon_config_of(v), (base, v)  # one variant a tile (the name says no more)
        name = base + (f" bands{extra['GROUP_SIZE_N']}" if extra.get("GROUP_SIZE_N") else "")
        name += (" scale-tma" if extra.get("SCALE_TMA") else "") + (" producer-1w" if extra.get("PRODUCER_1W") else "")
        assert name not in out, name  # every option its own name
        out[name] = (base, gluon_config_of(v, extra))
    return out


KERNELS = _kernels()


def chosen(names=None) -> dict:
    """KERNELS, or only `names` and the defaults their outputs must equal (--kernels: e.g. one option
    under Nsight Compute), in KERNELS' order."""
    if not names:
        return dict(KERNELS)
    keep = set(names) | {KERNELS[n][0] for n in names if KERNELS[n][0]}
    return {n: v for n, v in KERNELS.items() if n in keep}


def _sm_mhz() -> float:
    """The SM clock now (NVML through torch); NaN where NVML is missing."""
    try:
        return float(torch.cuda.clock_rate())
    except Exception:  # noqa: BLE001 (no NVML: the figure is optional)
        return float("nan")


def main(argv=None) -> int:
    ap = OneLineErrors(
        prog=script_prog(__file__), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", choices=[m for m in SHAPES if m != "tiny"], default=["mixtral_8x7b"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 16384])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--kernels",
        nargs="+",
        choices=list(KERNELS),
        default=None,
        metavar="NAME",
        help="only these Gluon kernels (quoted names, as printed), each with its default, beside DeepGEMM; "
        "default: every one",
    )
    args = ap.parse_args(argv)
    kernels = chosen(args.kernels)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("gluon_options.py: needs an SM90 GPU (the Gluon kernels have no interpreter)", file=sys.stderr)
        return 2
    try:
        import deep_gemm
    except Exception as e:  # noqa: BLE001 (any failure to import: say which and stop)
        print(f"gluon_options.py: needs DeepGEMM, the reference ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    import triton

    from moebench.kernels.triton.gluon_contiguous import GluonGemm

    dev = torch.device("cuda")
    rows, failed = [], 0
    for model in args.models:
        _, E, _, K, inter = SHAPES[model]
        w13, s13 = weights(E, 2 * inter, K, dev, "fp8_block")
        w2, s2 = weights(E, K, inter, dev, "fp8_block")
        for M in args.tokens:
            a1, a1_s, lay, pairs, mp = layer_rows(M, SHAPES[model], dev)
            a2, a2_s = act_rows(mp, inter, dev, "fp8_block")
            valid = lay.m_indices_Mp[:mp] >= 0
            for gemm, (a, a_s, w, s) in (("gate_up", (a1, a1_s, w13, s13)), ("down", (a2, a2_s, w2, s2))):
                N = w.shape[1]
                out = {name: torch.full((mp, N), float("nan"), device=dev, dtype=torch.bfloat16) for name in kernels}
                out["deep_gemm"] = torch.zeros(mp, N, device=dev, dtype=torch.bfloat16)
                fns = {"deep_gemm": deepgemm_gemm(deep_gemm, "fp8_block", a, a_s, w, s, out["deep_gemm"], lay)}
                for name, (_, cfg) in kernels.items():
                    g = GluonGemm(w, s, cfg)
                    fns[name] = functools.partial(g, a, a_s, out[name], lay.m_indices_Mp, lay.num_post)
                for f in fns.values():
                    f()
                torch.cuda.synchronize()
                us = {n: [] for n in fns}
                mhz = {n: [] for n in fns}
                for _ in range(args.rounds):
                    for n, f in fns.items():
                        us[n].append(triton.testing.do_bench(f, warmup=10, rep=60) * 1e3)
                        mhz[n].append(_sm_mhz())
                dg = statistics.median(us["deep_gemm"])
                flop = 2.0 * pairs * N * w.shape[2]
                for n in fns:
                    default = kernels[n][0] if n in kernels else None
                    same = bool(torch.equal(out[n][valid], out[default][valid])) if default else None
                    err, _ = rel(out[n], out["deep_gemm"], valid)
                    row = dict(
                        model=model,
                        tokens=M,
                        gemm=gemm,
                        kernel=n,
                        us=statistics.median(us[n]),
                        us_rounds=us[n],
                        sm_mhz=statistics.median(mhz[n]),
                        rel_err_vs_deepgemm=err,
                        equals_default=same,
                    )
                    row.update(tflops=flop / row["us"] / 1e6, vs_deepgemm=row["us"] / dg)
                    bad = same is False or not err <= 1e-2
                    failed += bad
                    rows.append(row)
                    print(
                        f"{model:14} {M:6} {gemm:7} {n:32} {row['us']:9.1f} µs {row['tflops']:6.0f} TFLOP/s "
                        f"{row['vs_deepgemm']:5.3f} x DG  {row['sm_mhz']:5.0f} MHz  err {err:.1e}"
                        + ("" if same is None else f"  equals {default}: {same}")
                        + ("  FAILED" if bad else ""),
                        flush=True,
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
