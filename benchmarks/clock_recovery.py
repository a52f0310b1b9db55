"""How the GPU's clock follows its load (issue #33: may a sweep warm the GPU up once per
process group instead of before every row?). A bf16 GEMM is the probe: its time tracks the
SM clock. docs/findings/harness.md, "Warm-up".

  ramp     from a GPU idle for 2 s, GEMMs back to back for --ramp-ms: each GEMM's time by
           its start (25 ms buckets), i.e. how fast the clock falls to what the load sustains
  gaps     after --ramp-ms of load, the GPU left idle (host sleeps) or lightly loaded (one
           spin kernel, torch.cuda._sleep) for each gap, then --samples GEMMs: the first
           five's median and all of them against the sustained median, i.e. how long a gap
           the sustained clock survives

    python benchmarks/clock_recovery.py [--n 8192] [--ramp-ms 400] [--gaps 0,25,50,100,200,400,800]
                                        [--json OUT.json]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from moebench.util.arg_errors import OneLineErrors, script_prog


def gemm_times(a, b, count: int) -> list[tuple[float, float]]:
    """(start ms after the first, duration µs) of `count` back-to-back GEMMs, events around each."""
    import torch

    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    for s, e in evs:
        s.record()
        a @ b
        e.record()
    torch.cuda.synchronize()
    first = evs[0][0]
    return [(first.elapsed_time(s), s.elapsed_time(e) * 1e3) for s, e in evs]


def main(argv=None) -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192, help="the GEMM's M = N = K")
    ap.add_argument("--ramp-ms", type=float, default=400.0, help="load before each gap (and the ramp's length)")
    ap.add_argument("--gaps", default="0,25,50,100,200,400,800", help="idle gaps, ms")
    ap.add_argument("--samples", type=int, default=30, help="GEMMs timed after each gap")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    try:
        gaps = [float(g) for g in args.gaps.split(",")]
    except ValueError:
        print(f"clock_recovery: --gaps must be comma-separated numbers, got {args.gaps!r}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("clock_recovery: needs a CUDA GPU", file=sys.stderr)
        return 2
    from moebench.measure import timing

    dev = torch.device("cuda", 0)
    a = torch.randn(args.n, args.n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(args.n, args.n, device=dev, dtype=torch.bfloat16)
    one = statistics.median(d for _, d in gemm_times(a, b, 5))
    per_ramp = max(5, int(args.ramp_ms * 1e3 / one))
    cyc = timing._cycles_per_us(dev)

    time.sleep(2.0)
    ramp = gemm_times(a, b, per_ramp)
    buckets: dict[int, list[float]] = {}
    for at, d in ramp:
        buckets.setdefault(int(at // 25) * 25, []).append(d)
    out = {
        "gpu": torch.cuda.get_device_name(dev),
        "n": args.n,
        "ramp": [
            {"from_ms": k, "median_us": statistics.median(v), "gemms": len(v)} for k, v in sorted(buckets.items())
        ],
    }
    sustained = statistics.median(d for at, d in ramp if at >= args.ramp_ms / 2)
    out["sustained_us"] = sustained
    print(
        f"{out['gpu']}: bf16 GEMM {args.n}^3, {per_ramp} back to back after 2 s idle; sustained "
        f"(second half) {sustained:.1f} µs"
    )
    for r in out["ramp"]:
        print(f"  ramp {r['from_ms']:4d} ms  {r['median_us']:8.1f} µs  ({r['median_us'] / sustained:.3f})")
    out["gaps"] = []
    for how in ("idle", "spin"):
        for gap in gaps:
            gemm_times(a, b, per_ramp)  # sustained load
            if how == "idle":
                time.sleep(gap / 1e3)
            elif gap:
                torch.cuda._sleep(int(gap * 1e3 * cyc))
            after = [d for _, d in gemm_times(a, b, args.samples)]
            row = {
                "gap": how,
                "gap_ms": gap,
                "first5_us": statistics.median(after[:5]),
                "median_us": statistics.median(after),
                "sustained_us": sustained,
            }
            out["gaps"].append(row)
            print(
                f"  after {gap:5.0f} ms {how:4s}: first five {row['first5_us']:8.1f} µs "
                f"({row['first5_us'] / sustained:.3f}), {args.samples} {row['median_us']:8.1f} µs "
                f"({row['median_us'] / sustained:.3f})"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
