"""One layer, every way of timing it, on one GPU: what moebench's events and graph modes
read beside independent timers of the same callable, and what bounds the eager layer
(the host's enqueue time against the GPU's busy time). docs/findings/timing.md.

For each combination (moebench overrides, one token count):
  events        moebench's events mode (timing.time_samples, L2 flushed before each sample)
  graph         moebench's graph mode (replays of timing._capture's graph, L2 flushed)
  graph_warm    the same replays without the flush (warm L2)
  replay_events an independent loop: its own torch.cuda.CUDAGraph of the callable, an own
                flush buffer, one event pair around each single replay
  cudagraph_bench triton.testing.do_bench_cudagraph (many replays in one graph, warm L2)
  gpu_busy      the summed kernel time of one eager forward (torch profiler; kernels that
                overlap on two streams counted once), and host_enqueue the host time to
                enqueue one eager forward while the GPU is busy

    python benchmarks/timing_modes.py [--reps 60] [--json OUT.json]
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from moebench.measure import timing
from moebench.measure.layer import build_layer
from moebench.measure.workload import make_inputs
from moebench.run.plan import plan
from moebench.util.arg_errors import OneLineErrors, script_prog

CASES = [  # (name, overrides, tokens)
    (
        "dsv3_ep8_tod_fp8_none",
        [
            "backend=local",
            "backend.simulate_ep=8",
            "model=deepseek_v3",
            "quant=fp8_block",
            "experts=triton_or_deepgemm",
            "reduction=experts",
            "overlap=none",
        ],
        128,
    ),
    (
        "dsv3_ep8_tod_fp8_combine",
        [
            "backend=local",
            "backend.simulate_ep=8",
            "model=deepseek_v3",
            "quant=fp8_block",
            "experts=triton_or_deepgemm",
            "reduction=experts",
            "overlap=combine",
        ],
        128,
    ),
    (
        "mixtral_triton_bf16",
        ["backend=local", "model=mixtral_8x7b", "quant=bf16", "experts=triton", "reduction=experts", "overlap=none"],
        64,
    ),
    (
        "qwen3_triton_fp8",
        [
            "backend=local",
            "model=qwen3_30b_a3b",
            "quant=fp8_block",
            "experts=triton",
            "reduction=experts",
            "overlap=none",
        ],
        64,
    ),
]


def _median(xs) -> float:
    return float(statistics.median(xs))


def replay_events(fn, device, reps: int, flush: bool) -> list[float]:
    """µs per single replay of an own CUDA graph of fn, one event pair each."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    buf = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=device)
    for _ in range(5):
        g.replay()
    out = []
    for _ in range(reps):
        if flush:
            buf.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return out


def gpu_busy_us(fn, device) -> float:
    """Kernel time of one eager forward: the union of its kernels' intervals (µs), median of 5."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    per = []
    for _ in range(5):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize(device)
        spans = sorted(
            (e.time_range.start, e.time_range.end)
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
        )
        total, end = 0.0, -1.0
        for a, b in spans:  # union: two streams' kernels that overlap count once
            if b > end:
                total += b - max(a, end)
                end = b
        per.append(total)
    return _median(per)


def measure(name, overrides, tokens, reps) -> dict:
    device = torch.device("cuda", torch.cuda.current_device())
    (c,), _ = plan(overrides + ["runner.device=cuda", f"workload.tokens_per_rank=[{tokens}]"], None)
    if c.reason:
        return {"case": name, "skipped": c.reason}
    layer = build_layer(c.combo, 0, 1, None, device)
    x, w, ids = make_inputs(layer.ctx.shape, tokens, "uniform", 1.2, 0, 0, 2, device)
    fn = lambda: layer.kernel(x, w, ids)
    flush = timing.L2Flusher(device)
    out = {"case": name, "tokens": tokens, "label": c.label}
    ev = timing.time_samples(fn, device, reps, 5, flush=flush, warmup_ms=200)
    gr = timing.time_samples(fn, device, reps, 5, flush=flush, graph=True, warmup_ms=200)
    warm = timing.time_samples(fn, device, reps, 5, flush=None, graph=True, warmup_ms=200)
    out.update(
        events_us=ev.median,
        events_p80_p20=ev.p80 / ev.p20,
        graph_us=gr.median,
        graph_p80_p20=gr.p80 / gr.p20,
        graph_warm_us=warm.median,
    )
    out["replay_events_us"] = _median(replay_events(fn, device, reps, flush=True))
    out["replay_events_warm_us"] = _median(replay_events(fn, device, reps, flush=False))
    try:
        import triton.testing

        out["cudagraph_bench_us"] = float(triton.testing.do_bench_cudagraph(fn, rep=100)) * 1e3
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        out["cudagraph_bench_error"] = f"{type(e).__name__}: {e}"
    out["gpu_busy_us"] = gpu_busy_us(fn, device)
    out["host_enqueue_us"] = timing.host_enqueue_us(fn, device, tries=5)
    out["graph_vs_replay_events"] = out["graph_us"] / out["replay_events_us"]
    layer.kernel.close()
    return out


def main() -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--cases", default=",".join(n for n, _, _ in CASES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("timing_modes: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = [measure(n, o, t, args.reps) for n, o, t in CASES if n in args.cases.split(",")]
    cols = [
        "events_us",
        "events_p80_p20",
        "graph_us",
        "graph_p80_p20",
        "graph_warm_us",
        "replay_events_us",
        "replay_events_warm_us",
        "cudagraph_bench_us",
        "gpu_busy_us",
        "host_enqueue_us",
        "graph_vs_replay_events",
    ]
    print("case".ljust(28) + "".join(c[:14].rjust(15) for c in cols))
    for r in rows:
        print(
            r["case"].ljust(28)
            + "".join((f"{r[c]:15.3f}" if isinstance(r.get(c), float) else str(r.get(c, "-")).rjust(15)) for c in cols)
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
