"""DeepEP's own intranode benchmark and moebench's profiler mode, in one call on one
machine: high-throughput dispatch (fp8 and bf16) and combine kernel durations at 4096
tokens per rank, hidden 7168, top-8, 256 experts (DeepSeek-V3's shape), 24 SMs, on
--world-size ranks (2, 4 or 8). Issue #6 at 2 ranks, issue #7 at 4 and 8.

A benchmark, not a test: it prints and writes both sets of figures side by side.

- DeepEP: tests/test_intranode.py of the DeepEP source (v1.2.1). Rank 0 prints, per
  NVLink chunk size and for DeepEP's recommended config ("NVL chunk default"), the
  average time of fp8 dispatch, bf16 dispatch and bf16 combine, then the best chunk.
- moebench: `sweep backend=deepep_ht experts=torch reduction=experts overlap=none
  model=deepseek_v3 quant=fp8_block,bf16 runner.timing=profiler` at 4096 tokens: the
  recommended config too (backend.*_nvl_chunk=0); per-rank kernel durations from
  the rows' `kernel_us` (DeepEP's `intranode::dispatch` / `intranode::combine`).

    PYTHONPATH=.:third_party/deepep_build python benchmarks/deepep_ht_profiler.py \\
        [--deepep-src third_party/DeepEP] [--out runs/deepep_ht_profiler] [--world-size 2]

Writes <out>/deepep_test_intranode.log, the moebench run directory <out>/moebench
(rows, env.json), <out>/comparison.md and comparison.json.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _deepep_compare import fmt_us, main, moebench_kernel_rows, ratios, run_deepep_script

TOKENS, HIDDEN, TOPK, EXPERTS, SMS = 4096, 7168, 8, 256, 24
_DEFAULT = re.compile(r"\[tuning\] SMs (\d+), NVL chunk default: .*?avg_t: ([\d.]+) us")
_BEST = re.compile(
    r"\[tuning\] Best (dispatch \((FP8|BF16)\)|combine): SMs \d+, NVL chunk (\d+)[,:] .*? t: ([\d.]+) us"
)
# test_intranode.py tunes fp8 dispatch, then bf16 dispatch, then combine
ORDER = ("dispatch_fp8", "dispatch_bf16", "combine")


def parse_intranode(stdout: str) -> dict:
    """{"dispatch_fp8" | "dispatch_bf16" | "combine": {"default": µs, "best": µs, "best_chunk": n}}
    from rank 0's lines of test_intranode.py."""
    res: dict = {}
    # strict=False on purpose: a run cut short (timeout, crash) prints fewer stages' lines;
    # those present still count
    for name, m in zip(ORDER, _DEFAULT.finditer(stdout), strict=False):
        res.setdefault(name, {})["default"] = float(m[2])
    for m in _BEST.finditer(stdout):
        name = "combine" if m[1] == "combine" else f"dispatch_{m[2].lower()}"
        res.setdefault(name, {}).update(best=float(m[4]), best_chunk=int(m[3]))
    return res


def run_deepep_test(src: Path, log: Path, timeout_s: int, world: int) -> dict:
    out = run_deepep_script(
        src,
        "test_intranode.py",
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
    res = parse_intranode(out)
    if set(res) != set(ORDER) or any("default" not in v for v in res.values()):
        raise SystemExit(f"DeepEP's output lacks the recommended-config timings; see {log}")
    return res


def run_moebench(out_dir: Path, reps: int, world: int) -> list[dict]:
    return moebench_kernel_rows(
        [
            "backend=deepep_ht",
            "experts=torch",
            "reduction=experts",
            "overlap=none",
            "quant=fp8_block,bf16",
            "model=deepseek_v3",
            f"workload.tokens_per_rank=[{TOKENS}]",
            f"backend.num_sms={SMS}",
            "runner.timing=profiler",
            "runner.device=cuda",
            f"runner.world_size={world}",
            f"runner.reps={reps}",
        ],
        out_dir,
        {"dispatch": "intranode::dispatch<", "combine": "intranode::combine<"},
    )


def compare(deepep: dict, rows: list[dict], world: int) -> str:
    """Markdown: DeepEP's recommended-config time (rank 0) beside moebench's per-rank kernels."""

    def ours(quant, kernel):
        for r in rows:
            if r["quant"] == quant and r["kernels"]:
                return [k[kernel] for k in r["kernels"]]
        return []

    lines = [
        f"DeepEP intranode kernels, {world} ranks, {TOKENS} tokens per rank, hidden {HIDDEN}, top-{TOPK}, "
        f"{EXPERTS} experts, {SMS} SMs, recommended config (µs; DeepEP: rank 0, moebench: every rank)",
        "",
        "| kernel | DeepEP test_intranode.py (best chunk) | moebench profiler | moebench / DeepEP |",
        "|---|---:|---:|---:|",
    ]
    for label, key, quant, kernel in (
        ("dispatch fp8", "dispatch_fp8", "fp8_block", "dispatch"),
        ("dispatch bf16", "dispatch_bf16", "bf16", "dispatch"),
        ("combine bf16", "combine", "bf16", "combine"),
    ):
        d = deepep.get(key, {})
        mine = ours(quant, kernel)
        best = f" ({d['best']:.1f} at chunk {d['best_chunk']})" if "best" in d else ""
        theirs = [d["default"]] * len(mine) if "default" in d else []
        lines.append(
            f"| {label} | {d.get('default', float('nan')):.1f}{best} | {fmt_us(mine)} (quant={quant}) | "
            f"{ratios(mine, theirs)} |"
        )
    lines += [
        "",
        "| quant | status | dispatch kernels | combine kernels | dispatch_us | combine_us |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: r["quant"]):
        lines.append(
            f"| {r['quant']} | {r['status']} | {fmt_us([k['dispatch'] for k in r['kernels']])} | "
            f"{fmt_us([k['combine'] for k in r['kernels']])} | {r['dispatch_us'] or float('nan'):.1f} | "
            f"{r['combine_us'] or float('nan'):.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(__doc__, "deepep_ht_profiler", "deepep_test_intranode.log", run_deepep_test, run_moebench, compare)
