"""DeepEP's own low-latency benchmark and moebench's profiler mode, in one call
on one machine: LL dispatch / combine kernel durations at 128 tokens per rank,
hidden 7168, top-8, 256 experts (DeepSeek-V3's shape), on --world-size ranks (2).

A benchmark, not a test: it prints and writes both sets of figures side by side.

- DeepEP: tests/test_low_latency.py of the DeepEP source (v1.2.1), which sizes
  its buffer for num_tokens and times fp8 dispatch + bf16 combine with kineto:
  one send-and-receive kernel each ("Dispatch ... avg_t", "Combine ... avg_t"),
  then the hook variant ("send/recv time: a + b").
- moebench: `sweep backend=deepep_ll experts=triton_batched model=deepseek_v3
  backend.max_tokens_per_rank=128 runner.timing=profiler` at 128 tokens, with
  quant=fp8_block (fp8 dispatch, as DeepEP's timing) and bf16; overlap=none uses
  the single kernels, overlap=dispatch / combine the hook pair (durations summed
  per forward). Kernel durations per rank come from the rows' `kernel_us`.

    PYTHONPATH=.:third_party/deepep_build python benchmarks/deepep_ll_profiler.py \
        [--deepep-src third_party/DeepEP] [--out runs/deepep_ll_profiler] [--world-size 2]

Writes <out>/deepep_test_low_latency.log, the moebench run directory
<out>/moebench (rows, env.json), and <out>/comparison.md.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _deepep_compare import fmt_us, main, moebench_kernel_rows, ratios, run_deepep_script

TOKENS, HIDDEN, TOPK, EXPERTS = 128, 7168, 8, 256
_PLAIN = re.compile(
    r"\[rank (\d+)\] Dispatch bandwidth: .*?avg_t=([\d.]+) us \| Combine bandwidth: .*?avg_t=([\d.]+) us"
)
_HOOK = re.compile(
    r"\[rank (\d+)\] Dispatch send/recv time: ([\d.]+) \+ ([\d.]+) us \| "
    r"Combine send/recv time: ([\d.]+) \+ ([\d.]+) us"
)


def parse_low_latency(stdout: str) -> dict:
    """{rank: {"dispatch": µs, "combine": µs, "dispatch_hook": send + recv µs, "combine_hook": ...}}
    from test_low_latency.py's output."""
    res: dict = {}
    for m in _PLAIN.finditer(stdout):
        res.setdefault(int(m[1]), {}).update(dispatch=float(m[2]), combine=float(m[3]))
    for m in _HOOK.finditer(stdout):
        res.setdefault(int(m[1]), {}).update(
            dispatch_hook=float(m[2]) + float(m[3]), combine_hook=float(m[4]) + float(m[5])
        )
    return res


def run_deepep_test(src: Path, log: Path, timeout_s: int, world: int) -> dict:
    out = run_deepep_script(
        src,
        "test_low_latency.py",
        [
            "--num-processes",
            world,
            "--num-tokens",
            TOKENS,
            "--hidden",
            HIDDEN,
            "--num-topk",
            TOPK,
            "--num-experts",
            EXPERTS,
        ],
        log,
        timeout_s,
    )
    res = parse_low_latency(out)
    if not res:
        raise SystemExit(f"no timing lines in DeepEP's output; see {log}")
    return res


def run_moebench(out_dir: Path, reps: int, world: int) -> list[dict]:
    """Rows of the profiler-mode sweep, with LL kernel durations per rank."""
    return moebench_kernel_rows(
        [
            "backend=deepep_ll",
            "experts=triton_batched",
            "reduction=finalize",
            "overlap=none,dispatch,combine",
            "quant=fp8_block,bf16",
            "model=deepseek_v3",
            f"workload.tokens_per_rank=[{TOKENS}]",
            f"backend.max_tokens_per_rank={TOKENS}",
            "runner.timing=profiler",
            "runner.device=cuda",
            f"runner.world_size={world}",
            f"runner.reps={reps}",
        ],
        out_dir,
        {"dispatch": "internode_ll::dispatch", "combine": "internode_ll::combine"},
    )


def compare(deepep: dict, rows: list[dict], world: int = 2) -> str:
    """A markdown table: DeepEP's figure per rank beside moebench's, and their ratio."""

    def ours(quant, overlap, kernel):
        for r in rows:
            if r["quant"] == quant and r["overlap"] == overlap and r["kernels"]:
                return [k[kernel] for k in r["kernels"]]
        return []

    ranks = sorted(deepep)
    lines = [
        f"DeepEP low-latency kernels, {world} ranks, {TOKENS} tokens per rank, hidden {HIDDEN}, top-{TOPK}, "
        f"{EXPERTS} experts (µs, rank 0 / rank 1 / ...)",
        "",
        "| kernel | DeepEP test_low_latency.py | moebench profiler (row) | moebench / DeepEP |",
        "|---|---:|---:|---:|",
    ]
    cases = [
        ("dispatch fp8 (send + receive, one kernel)", "dispatch", "fp8_block", "none", "dispatch"),
        ("combine bf16 (one kernel)", "combine", "fp8_block", "none", "combine"),
        ("dispatch fp8, hook: send + receive", "dispatch_hook", "fp8_block", "dispatch", "dispatch"),
        ("combine bf16, hook: send + receive", "combine_hook", "fp8_block", "combine", "combine"),
    ]
    for label, dkey, quant, overlap, kernel in cases:
        theirs = [deepep[r].get(dkey) for r in ranks if deepep[r].get(dkey) is not None]
        mine = ours(quant, overlap, kernel)
        lines.append(
            f"| {label} | {fmt_us(theirs)} | {fmt_us(mine)} (quant={quant}, overlap={overlap}) | "
            f"{ratios(mine, theirs)} |"
        )
    lines += [
        "",
        "moebench rows (kernel µs per rank; phase µs are the max over ranks and include host time):",
        "",
        "| quant | overlap | status | dispatch kernels | combine kernels | dispatch_us | combine_us |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["quant"], r["overlap"])):
        lines.append(
            f"| {r['quant']} | {r['overlap']} | {r['status']} | "
            f"{fmt_us([k['dispatch'] for k in r['kernels']])} | {fmt_us([k['combine'] for k in r['kernels']])} | "
            f"{r['dispatch_us'] or float('nan'):.1f} | {r['combine_us'] or float('nan'):.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(__doc__, "deepep_ll_profiler", "deepep_test_low_latency.log", run_deepep_test, run_moebench, compare)
