"""An independent timer again (issue #50): the same layer forwards timed by NVIDIA's nvbench (its
Python bindings, `cuda-bench`: its blocking kernel, L2 flush, throttle detection and stopping rule)
beside moebench's own figure, in alternating rounds, on one GPU.

moebench's side is the worker's call (measure/samples.py `time_layer`: the default timing, CUDA-graph
replays where the layer captures, held events elsewhere; the hold; the L2 flush), its median of
`runner.reps` samples. nvbench's side is its cold measurement of the eager forward launched on
nvbench's stream: a blocking kernel holds the stream while the forward is enqueued (where the
forward never waits on the host: moebench's `graph_capturable`; elsewhere `sync=True`, nvbench's
own mode for launchers that synchronise, without the blocking kernel), L2 flushed before each
sample, samples whose clock fell below nvbench's throttle threshold dropped and retaken, until its
noise criterion (stdrel) or timeout stops it. Its mean is compared (the JSON's only centre).

    python benchmarks/nvbench_compare.py [--rounds 2] [--tokens 16,256,2048,16384] [--json OUT]
        [--combo 'experts=triton quant=fp8_block' ...] [--nvbench-timeout S]

Prints one line per combination and size: moebench µs, nvbench µs, moebench ÷ nvbench, and
nvbench's throttled-sample count; --json keeps every round. Not a test: a ratio on a shared GPU is a
benchmark; docs/findings/timing.md states what it printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from moebench.util.arg_errors import OneLineErrors, script_prog

BASE = ["backend=local", "model=qwen3_30b_a3b", "reduction=experts", "overlap=none", "runner.device=cuda"]
COMBOS = ["experts=triton quant=fp8_block", "experts=deepgemm quant=fp8_block", "experts=triton quant=bf16"]


def layer(overrides: list[str], T: int):
    """(combo, kernel, inputs, forward) of one combination at T tokens, built as the worker builds it."""
    from clock_poll_ab import layer as build  # benchmarks/ is sys.path[0] when run as a script

    combo, kernel, inputs = build(overrides, T, BASE)
    x, w, ids = inputs
    return combo, kernel, inputs, lambda: kernel(x, w, ids)


def moebench_us(combo, kernel, inputs) -> tuple[float, float, str]:
    """The worker's figure: (time_layer's median over runner.reps samples in µs, the median SM
    clock of those samples in MHz (NaN without the probe), the timing mode: graph or events)."""
    import torch

    from moebench.config.validity import timing_mode
    from moebench.measure.capture import make_recorder
    from moebench.measure.samples import host_enqueue, rank_sync, time_layer

    dev = torch.device("cuda", 0)
    T = int(inputs[0].shape[0])
    sync = rank_sync(None, dev, combo.l2_flush)
    rec = make_recorder(dev, nvtx=False)
    graph = timing_mode(combo, T) == "graph"
    timed = time_layer(kernel, inputs, combo, sync, dev, rec, graph, hold_us=host_enqueue(kernel, inputs, dev))
    clocks = [m for m in timed.clock.get("sm_clock_mhz_samples") or [] if m == m]  # NaN: a sample unread
    mhz = statistics.median(clocks) if clocks else None
    return (
        statistics.median(timed.samples_us),
        float("nan") if mhz is None else float(mhz),
        "graph" if graph else "events",
    )


def register(cases: list[tuple[str, object, bool]]) -> None:
    """One nvbench benchmark per case (registered once; each round runs them all again)."""
    import cuda.bench as bench
    import torch

    for name, fn, syncs in cases:

        def run(state, fn=fn, syncs=syncs) -> None:
            stream = torch.cuda.ExternalStream(state.get_stream().addressof(), device=torch.device("cuda", 0))
            with torch.cuda.stream(stream):
                fn()  # warm on this stream

                def launch(_launch) -> None:
                    fn()

                state.exec(launch, sync=syncs)

        bench.register(run).set_name(name)


def nvbench_round(out: Path, timeout_s: float | None = None) -> dict[str, dict]:
    """nvbench's cold figures of every registered case ({name: {summary tag: value}}); `timeout_s`
    caps each case's time (nvbench's --timeout, 15 s by default) where its noise criterion has not
    stopped it sooner."""
    import cuda.bench as bench

    extra = ["--timeout", f"{timeout_s:g}"] if timeout_s else []
    bench.run_all_benchmarks([sys.argv[0], "--json", str(out), *extra])
    return summaries(json.loads(out.read_text()))


def summaries(doc: dict) -> dict[str, dict]:
    """{benchmark name: {tag's last part: value}} of nvbench's JSON (its cold GPU time summaries)."""
    out: dict[str, dict] = {}
    for b in doc.get("benchmarks", []):
        for state in b.get("states", []):
            got = {}
            for s in state.get("summaries", []):
                tag = s.get("tag", "")
                values = {d.get("name"): d.get("value") for d in s.get("data", [])}
                if tag.startswith("nv/cold/") and "value" in values:
                    got[tag.removeprefix("nv/cold/")] = float(values["value"])
            out[b["name"]] = got
    return out


def child_round(r: int, combos: list[str], tokens: list[int], out: Path, timeout_s: float | None = None) -> int:
    """One round in this process: every layer built, then moebench's side and nvbench's in the
    round's order (moebench first on even rounds); {name: {moebench_us: [..], nvbench: [..]}} to `out`."""
    from moebench.config.validity import graph_capturable

    cases, built = [], {}
    for combo_text in combos:
        for T in tokens:
            name = f"{combo_text.replace(' ', '/')}/T{T}"
            combo, kernel, inputs, fn = layer(combo_text.split(), T)
            built[name] = (combo, kernel, inputs)
            cases.append((name, fn, graph_capturable(combo) is not None))
    register(cases)
    rows: dict[str, dict] = {
        name: {"moebench_us": [], "moebench_sm_mhz": [], "moebench_timing": "", "nvbench": []} for name, _, _ in cases
    }
    order = ["moebench", "nvbench"] if r % 2 == 0 else ["nvbench", "moebench"]
    with tempfile.TemporaryDirectory() as tmp:
        for side in order:
            if side == "moebench":
                for name, (combo, kernel, inputs) in built.items():
                    us, mhz, mode = moebench_us(combo, kernel, inputs)
                    rows[name]["moebench_us"].append(us)
                    rows[name]["moebench_sm_mhz"].append(mhz)
                    rows[name]["moebench_timing"] = mode
            else:
                got = nvbench_round(Path(tmp) / "nvbench.json", timeout_s)
                for name in rows:
                    rows[name]["nvbench"].append(got.get(name, {}))
    print(f"round {r} done ({' then '.join(order)})", flush=True)
    out.write_text(json.dumps(rows))
    return 0


def main(argv=None) -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", default="16,256,2048,16384")
    ap.add_argument("--combo", action="append", default=None, help="overrides of one combination (repeatable)")
    ap.add_argument("--json", default=None, help="every round's figures, written again after each round")
    ap.add_argument("--nvbench-timeout", type=float, default=None, help="nvbench's --timeout per case, s")
    ap.add_argument("--child-round", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        tokens = []
    if args.rounds < 1 or not tokens or min(tokens) < 1:
        print("nvbench_compare: --rounds >= 1 and --tokens a list of counts >= 1", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("nvbench_compare: needs a CUDA GPU (it compares two GPU timers)", file=sys.stderr)
        return 2
    try:
        import cuda.bench  # noqa: F401 (present or not: the one line below says how to get it)
    except ImportError:
        print("nvbench_compare: needs NVIDIA's nvbench bindings: pip install cuda-bench", file=sys.stderr)
        return 2

    if args.child_round is not None:
        return child_round(args.child_round, args.combo or COMBOS, tokens, Path(args.child_json), args.nvbench_timeout)
    # nvbench runs its registered benchmarks once per process (a second run_all_benchmarks is
    # "Benchmarks were already executed"): each round is a child process, sides in alternating order
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            out = Path(tmp) / f"round{r}.json"
            cmd = [sys.executable, __file__, "--tokens", args.tokens, "--child-round", str(r), "--child-json", str(out)]
            for c in args.combo or []:
                cmd += ["--combo", c]
            if args.nvbench_timeout:
                cmd += ["--nvbench-timeout", str(args.nvbench_timeout)]
            done = subprocess.run(cmd, check=False)
            if done.returncode != 0:
                print(f"nvbench_compare: round {r} failed (exit {done.returncode})", file=sys.stderr)
                return 1
            for name, v in json.loads(out.read_text()).items():
                row = rows.setdefault(name, {"moebench_us": [], "moebench_sm_mhz": [], "nvbench": []})
                row["moebench_us"] += v["moebench_us"]
                row["moebench_sm_mhz"] += v["moebench_sm_mhz"]
                row["moebench_timing"] = v["moebench_timing"]
                row["nvbench"] += v["nvbench"]
            summarise(rows)
            if args.json:  # after each round: a call cut short keeps the rounds it finished
                doc = {"device": torch.cuda.get_device_name(), "rounds": r + 1, "rows": rows}
                tmp_json = Path(args.json).with_name(Path(args.json).name + ".tmp")
                tmp_json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
                tmp_json.replace(args.json)  # a kill mid-write leaves the last whole file
    print(
        f"{'combination':44} {'moebench µs':>12} {'nvbench µs':>11} {'ratio':>6}  SM MHz (moebench / nvbench), samples"
    )
    for name, v in rows.items():
        n = [int(g.get("sample_size", 0)) for g in v["nvbench"]]
        ours = "/".join(f"{m:.0f}" for m in v["moebench_sm_mhz"])
        theirs = "/".join(f"{g['sm_clock_rate/mean'] / 1e6:.0f}" for g in v["nvbench"] if "sm_clock_rate/mean" in g)
        print(
            f"{name:44} {v['moebench_median_us']:12.1f} {v['nvbench_mean_us']:11.1f} {v['ratio']:6.3f}"
            f"  {ours} / {theirs}, {n}"
        )
    return 0


def summarise(rows: dict[str, dict]) -> None:
    """Each row's moebench median, nvbench's median of its rounds' means and their ratio, in place."""
    for v in rows.values():
        ours = statistics.median(v["moebench_us"])
        means = [g["time/gpu/mean"] * 1e6 for g in v["nvbench"] if "time/gpu/mean" in g]
        theirs = statistics.median(means) if means else float("nan")
        v.update(moebench_median_us=ours, nvbench_mean_us=theirs, ratio=ours / theirs)


if __name__ == "__main__":
    sys.exit(main())
