"""How long `moebench list` of the default sweep takes, each run a fresh process (what a user
waits for): the median, min and max of N wall times (issue #33; docs/findings/harness.md,
"Planning"). Its path imports neither torch nor the kernels' implementations
(tests/project/test_list_path.py), so the figure is the interpreter, hydra/omegaconf and
planning the combinations.

    python benchmarks/list_time.py [--runs 5] [--json OUT.json] [-- OVERRIDES...]
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's moebench, installed or not
    sys.path.insert(0, str(REPO))

from moebench.util.arg_errors import OneLineErrors, script_prog  # noqa: E402 (after sys.path takes this checkout)

COMMAND = [sys.executable, "-c", "import sys; from moebench.cli import main; sys.exit(main())", "list"]


def wall_times(runs: int, overrides: list[str], cpu: list | None = None) -> list[float]:
    """Seconds of `moebench list OVERRIDES` per run, each in a fresh interpreter; `cpu` gets
    each run's CPU seconds (user + system: what a busy machine changes less)."""
    out = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(COMMAND + overrides, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return out


def summary(times: list[float], cpu: list | None = None) -> dict:
    out = {
        "runs": len(times),
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "times_s": times,
    }
    if cpu:
        out.update(cpu_median_s=statistics.median(cpu), cpu_s=cpu)
    return out


def main(argv=None) -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("overrides", nargs="*", help="after --: overrides for `moebench list`")
    args = ap.parse_args(argv)
    cpu: list = []
    s = summary(wall_times(args.runs, args.overrides, cpu), cpu)
    print(
        f"moebench list {' '.join(args.overrides)}".rstrip() + f": median {s['median_s']:.2f} s "
        f"(min {s['min_s']:.2f}, max {s['max_s']:.2f}) over {s['runs']} fresh processes; "
        f"CPU (user + system) median {s['cpu_median_s']:.2f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
