"""How long `moebench compare A B` and `moebench report A` take, and how much memory, on two
synthetic runs of N combinations x 10 token counts (issue #52 item 1: 10,000 rows each; findings
in docs/findings/harness.md, "Reports of large runs"). Each command runs once in a fresh process;
its wall time, CPU time (user + system: what a busy machine changes less) and peak RSS are
recorded, with the load average around it, and every PNG it wrote is checked against the
report's size limit (2000 x 1800 px).

    python benchmarks/report_scale.py [--combinations 1000] [--work DIR] [--code TREE] [--json OUT.json]

The runs come from the stable generator (`python -m moebench.results.synthetic`), the same for
the same arguments; `--code TREE` times another checkout's moebench on them (a before figure).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's moebench, installed or not
    sys.path.insert(0, str(REPO))

from moebench.util.arg_errors import OneLineErrors, script_prog  # noqa: E402 (after sys.path takes this checkout)

MAX_PX = (2000, 1800)


def make_run(out: Path, combinations: int, seed: int, scale: float) -> None:
    """A synthetic run through the generator's command line (what tests and users call)."""
    if (out / "rows").is_dir():
        return  # the same arguments write the same rows: reuse them
    cmd = [sys.executable, "-m", "moebench.results.synthetic", "--combinations", str(combinations)]
    cmd += ["--seed", str(seed), "--scale", str(scale), "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def timed(args: list[str], code: Path, out_dir: Path) -> dict:
    """One `moebench ARGS` in a fresh process: exit status, wall s, CPU s, peak RSS MB, load."""
    cmd = [sys.executable, "-c", "import sys; from moebench.cli import main; sys.exit(main())", *args]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(out_dir / "stdout.txt", "wb") as so, open(out_dir / "stderr.txt", "wb") as se:
        # cwd: `python -c` puts the working folder first on sys.path, before PYTHONPATH
        proc = subprocess.Popen(cmd, cwd=code, env={**os.environ, "PYTHONPATH": str(code)}, stdout=so, stderr=se)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "command": "moebench " + " ".join(args),
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 0),  # Linux: KiB
        "load_avg_1min": [round(load, 1), round(os.getloadavg()[0], 1)],  # before, after
    }


def figures(folder: Path) -> dict:
    """Every PNG the command wrote with its size; whether all are within MAX_PX."""
    sizes = {}
    for png in sorted(folder.glob("*.png")):
        with Image.open(png) as im:
            sizes[png.name] = [im.width, im.height]
    within = all(w <= MAX_PX[0] and h <= MAX_PX[1] for w, h in sizes.values())
    md = folder / "report.md"
    return {"pngs": sizes, "within_limits": within, "report_md_bytes": md.stat().st_size if md.exists() else None}


def main(argv=None) -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--combinations", type=int, default=1000, help="per run (x 10 token counts)")
    ap.add_argument("--work", help="folder for the runs and outputs (default: a temp folder)")
    ap.add_argument("--code", default=str(REPO), help="the checkout whose moebench is timed")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="moebench-scale-"))
    a, b = work / "a", work / "b"
    make_run(a, args.combinations, seed=0, scale=1.0)
    make_run(b, args.combinations, seed=1, scale=1.03)  # a candidate 3 % slower
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "rows_per_run": args.combinations * 10,
        "code": str(Path(args.code).resolve()),
        "commands": [],
    }
    for name, cmd in (("compare", ["compare", str(a), str(b)]), ("report", ["report", str(a)])):
        out = work / f"out-{name}"
        out.mkdir(exist_ok=True)
        rec = timed([*cmd, "--out", str(out)], Path(args.code), out)
        rec.update(figures(out))
        result["commands"].append(rec)
        print(
            f"{rec['command'].replace(str(work) + '/', '')}: exit {rec['exit']}, {rec['wall_s']} s wall, "
            f"{rec['cpu_s']} s CPU, {rec['peak_rss_mb']:.0f} MB peak RSS, load {rec['load_avg_1min']}, "
            f"{len(rec['pngs'])} PNGs {'within' if rec['within_limits'] else 'PAST'} {MAX_PX[0]}x{MAX_PX[1]}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
