"""Shared parts of the DeepEP comparisons (benchmarks/deepep_ll_profiler.py,
benchmarks/deepep_ht_profiler.py): run one of DeepEP's own tests from its source tree,
run moebench in profiler mode, read the rows' per-rank kernel durations, format µs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from moebench.util.arg_errors import OneLineErrors, script_prog  # noqa: E402 (after sys.path takes this checkout)

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_deepep_script(src: Path, name: str, args: list, log: Path, timeout_s: int) -> str:
    """stdout of DeepEP's tests/<name> run with `args` (full output in `log`); exits with
    the log's tail when it fails."""
    script = src / "tests" / name
    if not script.exists():
        raise SystemExit(f"no {script}: pass --deepep-src, the DeepEP v1.2.1 source tree")
    env = dict(os.environ, **SAFE_ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    cmd = [sys.executable, script.name, *map(str, args)]
    out = subprocess.run(cmd, cwd=script.parent, env=env, capture_output=True, text=True, timeout=timeout_s)
    log.write_text(f"$ {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    if out.returncode:
        raise SystemExit(f"DeepEP's {name} failed (exit {out.returncode}); see {log}:\n{out.stderr[-2000:]}")
    return out.stdout


def moebench_kernel_rows(overrides: list, out_dir: Path, kernels: dict) -> list:
    """Run moebench (profiler mode in `overrides`) and return per row: quant, overlap,
    status, reason, dispatch_us / combine_us (phases) and `kernels`, per rank
    {name: summed µs of the kernels whose name holds kernels[name]}."""
    from moebench.results.store import RunStore
    from moebench.run.sweep import execute

    os.environ.update(SAFE_ENV)
    run_dir, _ = execute(overrides, None, str(out_dir), redo="all")
    df = RunStore(run_dir).load()
    rows = []
    for _, r in df.iterrows():
        row = {
            "quant": r["quant"],
            "overlap": r["overlap"],
            "status": r["status"],
            "reason": r.get("reason", ""),
            "dispatch_us": r.get("dispatch_us"),
            "combine_us": r.get("combine_us"),
        }
        texts = r.get("kernel_us") if r["status"] == "ok" else None
        row["kernels"] = [kernel_sums(json.loads(t), kernels) for t in (texts if texts is not None else [])]
        rows.append(row)
    return rows


def kernel_sums(kernel_us: dict, kernels: dict) -> dict:
    """{name: sum of the durations of kernels whose name contains kernels[name]}."""
    return {name: sum(v for k, v in kernel_us.items() if part in k) for name, part in kernels.items()}


def fmt_us(xs) -> str:
    return " / ".join(f"{x:.1f}" for x in xs) if xs else "n/a"


def ratios(mine: list, theirs: list) -> str:
    if not mine or len(mine) != len(theirs):
        return "n/a"
    return " / ".join(f"{m / t:.2f}" for m, t in zip(mine, theirs, strict=True))


def main(doc: str, name: str, log_name: str, run_deepep_test, run_moebench, compare) -> None:
    """The command line both comparisons share: DeepEP's test, then moebench, then the table
    (<out>/<log_name>, <out>/moebench, <out>/comparison.md and comparison.json)."""
    ap = OneLineErrors(prog=script_prog(sys.argv[0]), description=doc.split("\n\n")[0])
    ap.add_argument("--deepep-src", default=str(REPO / "third_party" / "DeepEP"), help="DeepEP v1.2.1 source tree")
    ap.add_argument("--out", default=str(REPO / "runs" / name))
    ap.add_argument("--reps", type=int, default=20, help="moebench runner.reps (profiler samples: min(reps, 20))")
    ap.add_argument("--timeout", type=int, default=600, help="seconds for DeepEP's test")
    ap.add_argument("--world-size", type=int, default=2, help="ranks (one per GPU), DeepEP's --num-processes")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deepep = run_deepep_test(Path(args.deepep_src), out / log_name, args.timeout, args.world_size)
    rows = run_moebench(out / "moebench", args.reps, args.world_size)
    table = compare(deepep, rows, args.world_size)
    (out / "comparison.md").write_text(table)
    (out / "comparison.json").write_text(json.dumps({"deepep": deepep, "moebench": rows}, indent=1, default=str))
    print(table)
