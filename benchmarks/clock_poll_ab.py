"""Does reading the GPU's state disturb what it reads? (issue #50): the default sweep's triton rows
on one GPU (DeepSeek-V3's EP-8 share, the local backend, 128 and 4096 tokens), timed by the
worker's own call (measure/samples.py `time_layer`) with NVML polled every `--poll-ms` ("poll"),
without polling ("off"), and without the in-stream clock probe either ("bare"), the sides
interleaved round by round in one process so that the clock's drift hits them alike.

    python benchmarks/clock_poll_ab.py [--rounds 3] [--poll-ms 20] [--tokens 128,4096]
        [--sides off,poll,bare] [--combo 'quant=fp8_block reduction=experts' ...] [--json OUT]

Prints per combination, size and side: the host's enqueue of one eager forward (µs, median over
the rounds; measured while the side's poller runs), the latency median and its p80/p20 spread
(µs, pooled over the rounds), the median SM clock and the throttled samples. What to read: the
host enqueue and the spread of "poll" against "off" (the poller's cost to the host), and "off"
against "bare" (the probe's two stamps a sample). Not a test: docs/findings/timing.md states
what it printed.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

from moebench.util.arg_errors import OneLineErrors, script_prog

BASE = ["backend=local", "model=deepseek_v3", "backend.simulate_ep=8", "overlap=none", "runner.device=cuda"]
COMBOS = [
    "experts=triton quant=bf16 reduction=finalize",
    "experts=triton quant=bf16 reduction=experts",
    "experts=triton quant=fp8_block reduction=finalize",
    "experts=triton quant=fp8_block reduction=experts",
]
SIDES = ("off", "poll", "bare")


def layer(overrides: list[str], T: int, base: list[str] = BASE):
    """(combo, kernel, inputs) of one combination at T tokens, built as the worker builds it
    (benchmarks/nvbench_compare.py builds its layers here too, on its own `base`)."""
    import torch

    from moebench.config.compose import check_values, compose_config, to_combo
    from moebench.measure.layer import build_layer
    from moebench.measure.workload import make_routed, routing_spec

    cfg = compose_config([*base, *overrides, f"workload.tokens_per_rank=[{T}]"])
    check_values(cfg)
    combo = to_combo(cfg).replace(phase_reps=0)
    dev = torch.device("cuda", 0)
    built = build_layer(combo, 0, 1, None, dev)
    inputs = make_routed(built.ctx.shape, T, routing_spec(combo), 0, 7, dev).inputs
    return combo, built.kernel, inputs


def one_side(side: str, combo, kernel, inputs, poll_ms: float) -> dict:
    """One side's figures for one combination: host enqueue (µs), the samples (µs), clocks."""
    import torch

    from moebench.config.validity import timing_mode
    from moebench.measure import gpu_state, nvml
    from moebench.measure.capture import make_recorder
    from moebench.measure.samples import host_enqueue, rank_sync, time_layer

    dev = torch.device("cuda", 0)
    T = int(inputs[0].shape[0])
    saved = gpu_state._PROBES.get(dev)
    if side == "bare":
        gpu_state._PROBES[dev] = "probe off (clock_poll_ab's bare side)"
    try:
        combo = combo.replace(nvml_poll_ms=poll_ms if side == "poll" else 0.0)
        mod, h, _ = gpu_state.nvml_for(dev)
        poller = nvml.NvmlPoller(mod, h, poll_ms) if side == "poll" and mod is not None else None
        if poller is not None:
            with poller:  # the host enqueue measured while the poller reads
                host_us = host_enqueue(kernel, inputs, dev)
        else:
            host_us = host_enqueue(kernel, inputs, dev)
        sync = rank_sync(None, dev, combo.l2_flush)
        graph = timing_mode(combo, T) == "graph"
        timed = time_layer(kernel, inputs, combo, sync, dev, make_recorder(dev, nvtx=False), graph, hold_us=host_us)
    finally:
        if side == "bare":
            if saved is None:
                gpu_state._PROBES.pop(dev, None)
            else:
                gpu_state._PROBES[dev] = saved
    clocks = timed.clock.get("sm_clock_mhz_samples") or []
    return {
        "host_us": host_us,
        "samples_us": list(timed.samples_us),
        "clock_mhz": list(clocks),
        "throttled": timed.clock.get("throttled_samples", float("nan")),
        "nvml_polls": timed.clock.get("nvml_polls", float("nan")),
    }


def main(argv=None) -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--poll-ms", type=float, default=20.0)
    ap.add_argument("--tokens", default="128,4096")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--combo", action="append", default=None, help="overrides of one combination (repeatable)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sides = [s for s in args.sides.split(",") if s]
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        tokens = []
    if args.rounds < 1 or not tokens or not sides or set(sides) - set(SIDES) or args.poll_ms <= 0:
        print(f"clock_poll_ab: --rounds >= 1, --tokens counts, --sides of {SIDES}, --poll-ms > 0", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("clock_poll_ab: needs a CUDA GPU (it measures what reading the GPU's state costs)", file=sys.stderr)
        return 2
    built = {}
    for text in args.combo or COMBOS:
        for T in tokens:
            built[f"{text.replace(' ', '/')}/T{T}"] = layer(text.split(), T)
    rows: dict = {name: {s: [] for s in sides} for name in built}
    for r in range(args.rounds):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]  # each side first in turn
        for name, (combo, kernel, inputs) in built.items():
            for side in order:
                rows[name][side].append(one_side(side, combo, kernel, inputs, args.poll_ms))
        print(f"round {r} done ({' then '.join(order)})", flush=True)
    print(f"{torch.cuda.get_device_name()}, NVML every {args.poll_ms:g} ms on the poll side")
    print(f"{'combination':54} {'side':5} {'host µs':>8} {'lat µs':>8} {'p80/p20':>7} {'SM MHz':>7} throttled")
    for name, by_side in rows.items():
        for side, runs in by_side.items():
            host = statistics.median(x["host_us"] for x in runs)
            samples = np.concatenate([x["samples_us"] for x in runs])
            clocks = np.concatenate([x["clock_mhz"] for x in runs]) if any(x["clock_mhz"] for x in runs) else []
            p20, p50, p80 = np.percentile(samples, [20, 50, 80])
            mhz = f"{np.nanmedian(clocks):7.0f}" if len(clocks) else f"{'-':>7}"
            thr = [x["throttled"] for x in runs]
            print(f"{name:54} {side:5} {host:8.1f} {p50:8.1f} {p80 / p20:7.3f} {mhz} {thr}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
