"""Does the hold before each sample move a short kernel's time? (tests/gpu/test_pipeline_gpu.py's
timing-agreement test: moebench read a ~220 µs Triton GEMM 3-5 % above do_bench in about half
of its runs from session 5 to 7, against its 5 % tolerance.)

moebench times each sample after an L2 flush and a hold sized to the host's enqueue; do_bench
flushes and launches back to back. This times the test's GEMM both ways in pairs (the order
alternating, each do_bench window as long as the moebench set beside it) with each kind of hold
and prints each mode's median ratio of the pairs. Measured on one H200 (session 8, 36 pairs a
mode): behind a one-thread spin 1.032, a 520 µs spin 1.047, no hold 1.000, flushes 1.000, so
moebench's hold became flushes (moebench/measure/timing.py: sample_start).

  held      time_samples as the test calls it: the hold as more flushes (moebench since session 8)
  unheld    hold_us=inf: no hold (this GEMM's enqueue, ~30 µs, is far shorter than its GPU time)
  long      hold_us=400: ~520 µs of flushes before every sample
  spin      the hold a one-thread spin (torch.cuda._sleep) of the same length: moebench before
  longspin  a ~520 µs spin

    python benchmarks/hold_bias.py [--modes held,unheld,spin] [--pairs 12] [--rounds 2] [--n 4096] [--json OUT.json]
"""

from __future__ import annotations

import json
import statistics
import sys

from moebench.util.arg_errors import OneLineErrors, script_prog

MODES = {"held": None, "unheld": float("inf"), "long": 400.0, "spin": None, "longspin": 400.0}


def gemm(n: int):
    """The test's Triton GEMM (128 x 128 x 64 tiles, 8 warps, 3 stages) on n x n bf16 (the test
    imports it from here): (the launch, a, b, c)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
            y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))

    dev = torch.device("cuda", 0)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    return lambda: matmul[(n // 128, n // 128)](a, b, c, n, n, n, 128, 128, 64, num_warps=8, num_stages=3), a, b, c


def spin_flush(flush):
    """The flush followed by the hold as a one-thread spin (the spin modes): sample_start asks
    the flusher how many flushes fill the hold; this one answers none and spins that long after
    each flush instead."""
    import torch

    from moebench.measure import timing

    class SpinAfterFlush(timing.L2Flusher):
        def __init__(self):
            self.buf, self._us, self.cycles = flush.buf, None, 0

        def count_for(self, cycles: int) -> int:
            self.cycles = cycles
            return 0

        def __call__(self) -> None:
            self.buf.zero_()
            if self.cycles:
                torch.cuda._sleep(self.cycles)

    return SpinAfterFlush()


def pairs_for(fn, mode: str, count: int, flush, dev) -> list[tuple[float, float]]:
    """(moebench median µs, do_bench median µs) pairs, the order alternating."""
    from triton.testing import do_bench

    from moebench.measure import timing

    if mode.endswith("spin"):
        flush = spin_flush(flush)
    out = []
    window_ms = 5.0
    for i in range(count):
        if i % 2:
            ref = do_bench(fn, warmup=10, rep=window_ms, return_mode="median") * 1e3
        ours = timing.time_samples(fn, dev, reps=60, warmup=10, flush=flush, warmup_ms=50, hold_us=MODES[mode])
        window_ms = max(5.0, 60 * ours.median * 1e-3)
        if not i % 2:
            ref = do_bench(fn, warmup=10, rep=window_ms, return_mode="median") * 1e3
        out.append((ours.median, ref))
    return out


def main(argv=None) -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="held,unheld,spin", help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("--pairs", type=int, default=12, help="moebench / do_bench pairs per mode and round")
    ap.add_argument("--rounds", type=int, default=2, help="the modes in turn, this many times")
    ap.add_argument("--n", type=int, default=4096, help="the GEMM's M = N = K (a multiple of 128)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes or args.pairs < 2 or args.rounds < 1 or args.n < 128 or args.n % 128:
        print(
            f"hold_bias: bad arguments (modes {bad or modes}, pairs >= 2, rounds >= 1, n a multiple of 128)",
            file=sys.stderr,
        )
        return 2
    import torch
    from triton.testing import do_bench

    if not torch.cuda.is_available():
        print("hold_bias: needs a CUDA GPU (it compares two GPU timers)", file=sys.stderr)
        return 2
    from moebench.measure import timing

    dev = torch.device("cuda", 0)
    fn = gemm(args.n)[0]
    flush = timing.L2Flusher(dev)
    do_bench(fn, warmup=10, rep=2000)  # 2 s of load first, as the test (past the clock's first drop)
    result: dict = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes:
            got = pairs_for(fn, m, args.pairs, flush, dev)
            result[m].extend(got)
            ratios = [o / d for o, d in got]
            print(
                f"round {r} {m:7} ratio median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max "
                f"{max(ratios):.3f}); moebench {statistics.median(o for o, _ in got):.1f} µs, do_bench "
                f"{statistics.median(d for _, d in got):.1f} µs",
                flush=True,
            )
    for m in modes:
        ratios = [o / d for o, d in result[m]]
        print(f"{m:7} pooled ratio median {statistics.median(ratios):.3f} over {len(ratios)} pairs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({m: [{"moebench_us": o, "do_bench_us": d} for o, d in v] for m, v in result.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
