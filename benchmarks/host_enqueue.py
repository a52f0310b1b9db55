"""The host's side of one eager forward (issue #34): per case, the kernels one forward
launches, the host's time to enqueue it while the GPU is busy, beside the GPU's time of the
same forward, and with --profile where the host's time goes, function by function.

Cases: issue #34's table (backend=local reduction=experts, uniform routing; --cases issue34, the
default), issue #46's pairs (--cases gluon_pairs: qwen3 and DeepSeek-V3's EP-8 share, fp8_block on
the contiguous rows at 4096 and 16384 tokens, each with experts.contiguous_gemm=auto (the Gluon
GEMM on an SM90 GPU) and =triton, their host times' ratio auto / triton against TARGET_RATIO) and,
with --default, every local combination of the default sweep at its token counts.

  kernels       CUDA kernels (and memcpy / memset) one eager forward launches (torch profiler)
  host_us       timing.host_enqueue_us as a row measures it (five calls behind one 20 ms spin:
                no launch waits for the GPU), the median of --tries such probes after three warm-up
                forwards; with --interleave (the default where both cases of a pair run) every
                case's layer is built first and the probes taken in rounds, one of each case a
                round (host_rounds "interleaved"), so a drift of the host's speed reaches all alike
  gpu_us        the median of --reps CUDA-graph replays, L2 flushed, each held as a row's are
                (timing.time_samples, graph=True); the eager forward's own GPU time where the
                layer cannot be captured (events)
  gpu_busy_us   the union of one eager forward's kernel intervals (torch profiler)
  host/gpu      host_us / gpu_us: above 1, an eager forward leaves the GPU idle

    python benchmarks/host_enqueue.py [--default] [--cases a,b|issue34|gluon_pairs] [--interleave] [--reps 30]
                                      [--json OUT.json]
    python benchmarks/host_enqueue.py --profile qwen3_bf16_triton_32 [--calls 200]  # cProfile of the enqueue
    python benchmarks/host_enqueue.py --breakdown qwen3_bf16_triton_32 [--calls 200] # µs per function, no profiler
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

from moebench.util.arg_errors import OneLineErrors, script_prog

LOCAL = ["backend=local", "reduction=experts", "overlap=none", "workload.routing=uniform"]
QWEN3, DSV3_EP8 = ["model=qwen3_30b_a3b"], ["model=deepseek_v3", "backend.simulate_ep=8"]
CASES = {  # name -> (overrides, tokens): the issue's table, measured at f9a2356
    "qwen3_bf16_triton_32": (LOCAL + QWEN3 + ["quant=bf16", "experts=triton"], 32),
    "qwen3_fp8_triton_1024": (LOCAL + QWEN3 + ["quant=fp8_block", "experts=triton"], 1024),
    "qwen3_fp8_deepgemm_1024": (LOCAL + QWEN3 + ["quant=fp8_block", "experts=deepgemm"], 1024),
    "dsv3_ep8_fp8_triton_2048": (LOCAL + DSV3_EP8 + ["quant=fp8_block", "experts=triton"], 2048),
    "dsv3_ep8_bf16_triton_4096": (LOCAL + DSV3_EP8 + ["quant=bf16", "experts=triton"], 4096),
}
ISSUE_34 = {  # the issue's "before" (host enqueue µs, GPU µs, kernels), for the table's last columns
    "qwen3_bf16_triton_32": (498, 282, 14),
    "qwen3_fp8_triton_1024": (628, 301, 15),
    "qwen3_fp8_deepgemm_1024": (736, 275, 15),
    "dsv3_ep8_fp8_triton_2048": (919, 852, 21),
    "dsv3_ep8_bf16_triton_4096": (1401, 1951, 21),
}
TARGET_US = 300.0  # the issue's bound on the triton paths' host enqueue
CONTIGUOUS = ["quant=fp8_block", "experts=triton", "experts.row_layout=contiguous"]


def _gluon_pairs() -> dict:
    """issue #46's pairs: {auto case: triton case}, each added to CASES."""
    pairs = {}
    for model, ovs in (("qwen3", QWEN3), ("dsv3_ep8", DSV3_EP8)):
        for tokens in (4096, 16384):
            auto, triton = (f"{model}_fp8_contiguous_{gemm}_{tokens}" for gemm in ("auto", "triton"))
            for name, gemm in ((auto, "auto"), (triton, "triton")):
                CASES[name] = (LOCAL + ovs + CONTIGUOUS + [f"experts.contiguous_gemm={gemm}"], tokens)
            pairs[auto] = triton
    return pairs


GLUON_PAIRS = _gluon_pairs()
TARGET_RATIO = 1.3  # issue #46's bound on a pair's host enqueue, auto (the Gluon GEMM) / triton
GROUPS = {"issue34": list(ISSUE_34), "gluon_pairs": [n for pair in GLUON_PAIRS.items() for n in pair]}


def default_cases() -> dict:
    """The default sweep's local combinations this machine can run, one case per token count."""
    from moebench.run.plan import plan

    combos, _ = plan([], None)
    out = {}
    for c in combos:
        if c.reason or c.combo.backend not in ("local", "local_batched"):
            continue
        for t in c.tokens:
            if t not in c.token_reasons:
                out[f"{c.label}@{t}"] = (list(c.overrides), t)
    return out


def count_kernels(fn, device) -> dict:
    """Kernels, memcpys and memsets one call of fn launches (torch profiler's CUDA events)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    copies = sum(1 for n in names if n.lower().startswith(("memcpy", "memset")))
    return {
        "kernels": len(names) - copies,
        "copies": copies,
        "kernel_names": sorted(set(n for n in names if not n.lower().startswith(("memcpy", "memset")))),
    }


def build(overrides: list[str], tokens: int):
    """(combination, layer, the forward's callable) as a rank builds them, or (combination, None, None)."""
    import torch

    from moebench.measure.layer import build_layer
    from moebench.measure.workload import make_routed, routing_spec
    from moebench.run.plan import plan

    (c,), _ = plan([*overrides, "runner.device=cuda", f"workload.tokens_per_rank=[{tokens}]"], None)
    if c.reason or tokens in c.token_reasons:
        return c, None, None
    device = torch.device("cuda", torch.cuda.current_device())
    layer = build_layer(c.combo, 0, 1, None, device)
    x, w, ids = make_routed(layer.ctx.shape, tokens, routing_spec(c.combo), 0, 2, device, c.combo.simulate_rank).inputs
    return c, layer, lambda: layer.kernel(x, w, ids)


def warm(fn, device) -> None:
    """Three forwards, then a sync: compiles and first-call caches out of the probes."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize(device)


def probe_rounds(names: list[str], tries: int, probe) -> dict[str, list[float]]:
    """`tries` rounds of probe(name), each round one of every case in turn, the order reversed
    every other round (no case always right behind the same one): {name: its probes in round order}."""
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(tries):
        for n in names if r % 2 == 0 else names[::-1]:
            out[n].append(probe(n))
    return out


def gpu_figures(name: str, tokens: int, c, layer, fn, probes: list[float], reps: int, rounds: str) -> dict:
    """The row of one built case: its host probes' median beside the GPU time (no torch profiler:
    see kernel_figures), and the contiguous GEMMs its forward ran (experts' last_gemm)."""
    import numpy as np
    import torch

    from moebench.config.validity import auto_events
    from moebench.measure import timing

    device = torch.device("cuda", torch.cuda.current_device())
    out = {
        "case": name,
        "tokens": tokens,
        "label": c.label,
        "host_us": float(np.median(probes)),
        "host_us_probes": probes,
        "host_rounds": rounds,
        "last_gemm": getattr(layer.kernel.experts, "last_gemm", ""),
    }
    graph = auto_events(c.combo) is None
    s = timing.time_samples(
        fn, device, reps, 5, flush=timing.L2Flusher(device), graph=graph, warmup_ms=200, hold_us=out["host_us"]
    )
    out.update(gpu_us=s.median, gpu_p80_p20=s.p80 / s.p20, gpu_timing="graph" if graph else "events")
    out["host_over_gpu"] = out["host_us"] / out["gpu_us"]
    return out


def measure(name: str, overrides: list[str], tokens: int, reps: int, tries: int) -> dict:
    """The host enqueue and GPU time of one case, its probes back to back (host_rounds "consecutive")."""
    import torch

    from moebench.measure import timing

    c, layer, fn = build(overrides, tokens)
    if layer is None:
        return {"case": name, "tokens": tokens, "skipped": c.reason or c.token_reasons[tokens]}
    device = torch.device("cuda", torch.cuda.current_device())
    warm(fn, device)
    # `tries` probes as a row takes one (five calls behind one spin each), the median of their medians:
    # many calls behind one spin would outlast it
    probes = [timing.host_enqueue_us(fn, device) for _ in range(tries)]
    out = gpu_figures(name, tokens, c, layer, fn, probes, reps, "consecutive")
    layer.kernel.close()
    return out


def measure_interleaved(cases: dict, reps: int, tries: int) -> list[dict]:
    """Every case's layer built (and warmed) first, then `tries` rounds of one host probe of each
    (probe_rounds), then each case's GPU time: the rows, in the cases' order."""
    import torch

    from moebench.measure import timing

    device = torch.device("cuda", torch.cuda.current_device())
    built = {name: build(overrides, tokens) for name, (overrides, tokens) in cases.items()}
    live = [n for n, (_, layer, _) in built.items() if layer is not None]
    for n in live:
        warm(built[n][2], device)
    probes = probe_rounds(live, tries, lambda n: timing.host_enqueue_us(built[n][2], device))
    rows = []
    for name, (c, layer, fn) in built.items():
        tokens = cases[name][1]
        if layer is None:
            rows.append({"case": name, "tokens": tokens, "skipped": c.reason or c.token_reasons[tokens]})
            continue
        rows.append(gpu_figures(name, tokens, c, layer, fn, probes[name], reps, "interleaved"))
    for _, layer, _ in built.values():
        if layer is not None:
            layer.kernel.close()
    return rows


def add_pair_ratios(rows: list[dict]) -> list[dict]:
    """Each measured auto case of GLUON_PAIRS with its pair's figures: pair_case, host_ratio (the
    medians' ratio auto / triton) and, where the probes were interleaved, the p20 / p80 of the
    per-round ratios (the two probes of a round taken moments apart)."""
    import numpy as np

    by = {r["case"]: r for r in rows}
    out = []
    for r in rows:
        other = by.get(GLUON_PAIRS.get(r["case"], ""))
        if other is not None and "skipped" not in r and "skipped" not in other:
            r = {**r, "pair_case": other["case"], "host_ratio": r["host_us"] / other["host_us"]}
            if r["host_rounds"] == other["host_rounds"] == "interleaved":
                per = [a / b for a, b in zip(r["host_us_probes"], other["host_us_probes"], strict=True)]
                r.update(host_ratio_p20=float(np.percentile(per, 20)), host_ratio_p80=float(np.percentile(per, 80)))
        out.append(r)
    return out


def pair_table(rows: list[dict]) -> str:
    """issue #46's verdict, one line per measured pair: the host enqueue of auto and of triton, their
    ratio against TARGET_RATIO ('' where no pair was measured)."""
    lines = []
    for r in rows:
        if "host_ratio" not in r:
            continue
        other = next(o for o in rows if o["case"] == r["pair_case"])
        spread = f" ({r['host_ratio_p20']:.2f}–{r['host_ratio_p80']:.2f})" if "host_ratio_p20" in r else ""
        verdict = "ok" if r["host_ratio"] <= TARGET_RATIO else "over"
        lines.append(
            f"| {r['label']} | {r['tokens']} | {r['host_us']:.0f} ({r['last_gemm']}) | "
            f"{other['host_us']:.0f} ({other['last_gemm']}) | {r['host_ratio']:.2f}{spread} | {verdict} |"
        )
    if not lines:
        return ""
    head = [
        f"host enqueue, experts.contiguous_gemm auto against triton (issue #46: ratio ≤ {TARGET_RATIO}; "
        "per-round ratios' p20–p80 where the probes were interleaved)",
        "| combination | tokens | auto: host µs (GEMMs run) | triton: host µs (GEMMs run) | auto / triton | "
        f"≤ {TARGET_RATIO} |",
        "|---|---:|---:|---:|---:|---|",
    ]
    return "\n".join(head + lines)


def kernel_figures(row: dict, overrides: list[str], tokens: int) -> dict:
    """`row` with the kernels one forward launches and their busy time (torch profiler). Run
    after every case's host enqueue: once the profiler has run in a process, launches may
    cost the host more (its CUPTI callbacks stay registered)."""
    import torch
    from timing_modes import gpu_busy_us  # benchmarks/timing_modes.py (on sys.path: main)

    if "skipped" in row:
        return row
    _, layer, fn = build(overrides, tokens)
    device = torch.device("cuda", torch.cuda.current_device())
    row = {**row, **count_kernels(fn, device), "gpu_busy_us": gpu_busy_us(fn, device)}
    layer.kernel.close()
    return row


def profile_enqueue(name: str, overrides: list[str], tokens: int, calls: int, top: int) -> str:
    """cProfile of `calls` eager forwards' enqueue (the GPU kept busy ahead of them), the
    functions with the most own time: where the host's microseconds go."""
    import torch

    from moebench.measure import timing

    c, layer, fn = build(overrides, tokens)
    if layer is None:
        return f"{name}: skipped: {c.reason or c.token_reasons[tokens]}"
    device = torch.device("cuda", torch.cuda.current_device())
    for _ in range(5):
        fn()
    torch.cuda.synchronize(device)
    cyc = timing._cycles_per_us(device)
    prof = cProfile.Profile()
    for _ in range(calls):
        torch.cuda._sleep(int(5_000 * cyc))  # the GPU busy: no launch waits for it
        prof.enable()
        fn()
        prof.disable()
        torch.cuda.synchronize(device)
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    total_us = stats.total_tt / calls * 1e6
    buf.write(
        f"{name} ({c.label}, {tokens} tokens): {total_us:.0f} µs a forward under cProfile "
        f"(its own overhead included), {calls} forwards; by own time:\n"
    )
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    layer.kernel.close()
    return buf.getvalue()


# (module, attribute) timed by --breakdown: each call's own wall time, nested calls inside it
BREAKDOWN = [
    ("moebench.kernels.modular", "MoEKernel.__call__"),
    ("moebench.kernels.prepare_finalize.local", "LocalPrepareFinalize.prepare_async"),
    ("moebench.kernels.experts.triton", "TritonExperts.apply"),
    ("moebench.kernels.modular", "SharedExperts.add_to"),
    ("moebench.kernels.triton.moe", "fused_moe_standard"),
    ("moebench.kernels.triton.align", "moe_align_block_size"),
    ("moebench.kernels.triton.gemm", "invoke_fused_moe_gemm"),
    ("moebench.kernels.triton.activation", "silu_and_mul"),
    ("moebench.kernels.triton.activation", "silu_and_mul_rows"),
    ("moebench.kernels.triton.quant", "per_token_group_quant_fp8"),
    ("moebench.kernels.triton.routing", "localize_ids_triton"),
    ("moebench.kernels.triton.quant", "group_quant_and_localize"),
    ("moebench.kernels.experts._contiguous", "contiguous_apply"),
    ("moebench.kernels.triton.deepgemm_layout", "permute_contiguous"),
    ("moebench.kernels.triton.deepgemm_layout", "unpermute_contiguous"),
    ("moebench.kernels.experts.triton", "TritonExperts._contiguous_gemm"),
    ("moebench.kernels.triton.contiguous_gemm", "contiguous_gemm"),
    ("moebench.kernels.triton.gluon_contiguous", "GluonGemm.__call__"),  # (Triton >= 3.6: skipped where it is not)
    ("torch", "empty"),
    ("torch", "mm"),
    ("torch", "Tensor.zero_"),
    ("torch", "Tensor.copy_"),
    ("torch", "Tensor.add_"),
    ("torch", "Tensor.addmm_"),
]


def breakdown(name: str, overrides: list[str], tokens: int, calls: int) -> str:
    """Where one forward's host enqueue goes, by the median over `calls` forwards (the GPU kept
    busy ahead of them) of each wrapped function's summed own wall time (perf_counter_ns
    around each call: ~0.2 µs a call of its own, nested calls counted in their callers too);
    Triton launches (`launch`, the compiled handle's path) and torch ops by kind."""
    import importlib
    import time

    import numpy as np
    import torch

    from moebench.measure import timing

    c, layer, fn = build(overrides, tokens)
    if layer is None:
        return f"{name}: skipped: {c.reason or c.token_reasons[tokens]}"
    device = torch.device("cuda", torch.cuda.current_device())
    acc: dict[str, list] = {}

    def wrap(label, f):
        def timed(*a, **k):
            t0 = time.perf_counter_ns()
            try:
                return f(*a, **k)
            finally:
                acc.setdefault(label, [0, 0])
                acc[label][0] += time.perf_counter_ns() - t0
                acc[label][1] += 1

        return timed

    undo = []

    def patch(obj, leaf, label):
        orig = getattr(obj, leaf)
        setattr(obj, leaf, wrap(label, orig))
        undo.append((obj, leaf, orig))
        return orig

    ours = [m for n, m in list(sys.modules.items()) if n.startswith("moebench") and m is not None]
    for mod_name, attr in BREAKDOWN:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:  # (the Gluon module on a Triton without Gluon's API: nothing of it runs)
            continue
        owner, _, leaf = attr.rpartition(".")
        if not hasattr(mod, owner or leaf):  # (an older tree's code: e.g. GluonGemm, since issue #46)
            continue
        if owner or mod_name == "torch":  # a method, or torch's own function: one place
            patch(getattr(mod, owner) if owner else mod, leaf, attr)
            continue
        f = getattr(mod, leaf)  # a function of ours: every module that imported it by name
        for m in ours:
            for k, v in list(vars(m).items()):
                if v is f:
                    patch(m, k, attr)
    launch_fn = importlib.import_module("moebench.kernels.triton.launch").launch
    for m in ours:
        if getattr(m, "launch", None) is launch_fn:
            patch(m, "launch", "launch (Triton)")
    try:
        for _ in range(5):
            fn()
        torch.cuda.synchronize(device)
        cyc = timing._cycles_per_us(device)
        per: dict[str, list] = {}
        walls = []
        for _ in range(calls):
            torch.cuda._sleep(int(5_000 * cyc))  # the GPU busy: no launch waits for it
            acc.clear()
            t0 = time.perf_counter_ns()
            fn()
            walls.append((time.perf_counter_ns() - t0) / 1e3)
            for k, (ns, n) in acc.items():
                per.setdefault(k, []).append((ns / 1e3, n))
            torch.cuda.synchronize(device)
    finally:
        for obj, leaf, orig in reversed(undo):
            setattr(obj, leaf, orig)
    layer.kernel.close()
    lines = [
        f"{name} ({c.label}, {tokens} tokens): median of {calls} forwards, the wrappers' own cost included "
        f"(the whole forward {np.median(walls):.0f} µs here)",
        "| function | calls a forward | µs a forward (median) |",
        "|---|---:|---:|",
    ]
    for k, v in sorted(per.items(), key=lambda kv: -np.median([x[0] for x in kv[1]])):
        lines.append(f"| {k} | {v[0][1]} | {np.median([x[0] for x in v]):.1f} |")
    return "\n".join(lines)


def _bound(case: str) -> bool:
    """Whether issue #34's TARGET_US bounds a case: its triton paths (issue #46's pairs: their ratio)."""
    return "triton" in case and case not in GROUPS["gluon_pairs"]


def table(rows: list[dict]) -> str:
    """The rows as Markdown, with the issue's "before" where the case is one of its table's."""
    lines = [
        "| case | tokens | kernels | host enqueue µs | GPU µs | host / GPU | issue #34 before: host, GPU, kernels |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['case']} | {r['tokens']} | skipped: {r['skipped'][:80]} | | | | |")
            continue
        before = ISSUE_34.get(r["case"])
        mark = " ✗" if _bound(r["case"]) and r["host_us"] > TARGET_US else ""
        lines.append(
            f"| {r['case']} | {r['tokens']} | {r['kernels']} (+{r['copies']} copies) | "
            f"{r['host_us']:.0f}{mark} | {r['gpu_us']:.1f} ({r['gpu_timing']}) | {r['host_over_gpu']:.2f} | "
            + (f"{before[0]}, {before[1]}, {before[2]}" if before else "")
            + " |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cases",
        default="issue34",
        help="comma-separated case names or groups (" + ", ".join(GROUPS) + "; default: issue34, issue #34's table)",
    )
    ap.add_argument("--default", action="store_true", help="also every local combination of the default sweep")
    ap.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="build every case first and take the host probes in rounds, one of each case a round "
        "(default: on where both cases of an issue #46 pair run)",
    )
    ap.add_argument("--reps", type=int, default=30, help="graph replays (or held eager samples) for the GPU time")
    ap.add_argument("--tries", type=int, default=9, help="host-enqueue probes (each the median of five calls)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--profile", metavar="CASE", help="instead: cProfile the enqueue of this case")
    ap.add_argument(
        "--breakdown",
        metavar="CASE",
        help="instead: each layer function's and torch op's host µs a forward (medians; no profiler)",
    )
    ap.add_argument("--calls", type=int, default=200, help="forwards profiled (--profile)")
    ap.add_argument("--top", type=int, default=30, help="functions listed (--profile)")
    args = ap.parse_args(argv)
    names = [m for n in args.cases.split(",") if n for m in GROUPS.get(n, [n])]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"host_enqueue: unknown case {unknown[0]!r}; cases: {', '.join(CASES)}", file=sys.stderr)
        return 2
    if args.breakdown and args.breakdown not in CASES:
        print(
            f"host_enqueue: unknown case {args.breakdown!r} for --breakdown; cases: {', '.join(CASES)}", file=sys.stderr
        )
        return 2
    if args.profile and args.profile not in CASES:
        print(f"host_enqueue: unknown case {args.profile!r} for --profile; cases: {', '.join(CASES)}", file=sys.stderr)
        return 2
    cases = {n: CASES[n] for n in names}
    import torch

    if not torch.cuda.is_available():
        print("host_enqueue: needs a CUDA GPU (the enqueue is the host's side of GPU launches)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.breakdown:
        overrides, tokens = CASES[args.breakdown]
        print(breakdown(args.breakdown, overrides, tokens, args.calls))
        return 0
    if args.profile:
        overrides, tokens = CASES[args.profile]
        print(profile_enqueue(args.profile, overrides, tokens, args.calls, args.top))
        return 0
    if args.default:
        cases.update(default_cases())
    interleave = args.interleave
    if interleave is None:  # on where a pair's two cases both run: their ratio compares like with like
        interleave = any(a in cases and t in cases for a, t in GLUON_PAIRS.items())

    def progress(r: dict) -> None:
        what = (
            f"skipped ({r['skipped'][:60]})"
            if "skipped" in r
            else f"host {r['host_us']:.0f} µs, GPU {r['gpu_us']:.1f} µs"
        )
        print(f"  {r['case']}: {what}", file=sys.stderr, flush=True)

    if interleave:
        rows = measure_interleaved(cases, args.reps, args.tries)
        for r in rows:
            progress(r)
    else:
        rows = []
        for name, (overrides, tokens) in cases.items():
            rows.append(measure(name, overrides, tokens, args.reps, args.tries))
            progress(rows[-1])
    rows = [kernel_figures(r, *cases[r["case"]]) for r in rows]  # the profiler last
    rows = add_pair_ratios(rows)
    print(table(rows))
    pairs = pair_table(rows)
    if pairs:
        print("\n" + pairs)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    over = [r["case"] for r in rows if _bound(r["case"]) and r.get("host_us", 0) > TARGET_US]
    if over:
        print(f"\n{len(over)} triton case(s) over {TARGET_US:.0f} µs of host enqueue: {', '.join(over)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
