#!/usr/bin/env python3
r"""Run one test many times beside busy loops and count the passes: how a test that races
(gloo's abort against the launcher's kill, issue #31 item 11) behaves on CI's loaded 2-core
machines.

    python scripts/flaky_under_load.py                      # the crashing faults' test, 20 runs, 2 busy loops
    python scripts/flaky_under_load.py --runs 5 --busy 1 \
        tests/run/test_faults.py::test_hanging_faults_time_out_and_the_next_combination_runs_clean

Each run is a fresh `python -m pytest -q -p no:cacheprovider TEST` (its own processes, as
CI's); the busy loops are plain Python spins, one per --busy, ended with the script. Prints a
line per run (pass / FAIL, seconds, a failing run's last lines) and the pass count; exit 0
when every run passed, 1 otherwise. Writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

DEFAULT = "tests/run/test_faults.py::test_crashing_faults_give_their_status_and_the_next_combination_runs_clean"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # this checkout's moebench, installed or not
    sys.path.insert(0, ROOT)

from moebench.util.arg_errors import OneLineErrors, script_prog  # noqa: E402 (after sys.path takes this checkout)


def main(argv=None) -> int:
    p = OneLineErrors(prog=script_prog(__file__), description=__doc__.split("\n\n")[0])
    p.add_argument("test", nargs="?", default=DEFAULT, help="a pytest node id (default: %(default)s)")
    p.add_argument("--runs", type=int, default=20, help="how many times (default %(default)s)")
    p.add_argument("--busy", type=int, default=2, help="busy loops beside it (default %(default)s)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take (default %(default)g)")
    args = p.parse_args(argv)
    spins = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    passed, took = 0, []
    try:
        for i in range(1, args.runs + 1):
            t0 = time.monotonic()
            try:
                run = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", args.test],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    timeout=args.timeout,
                )
                ok, tail = run.returncode == 0, (run.stdout + run.stderr).strip().splitlines()[-12:]
            except subprocess.TimeoutExpired:
                ok, tail = False, [f"timed out after {args.timeout:g} s"]
            took.append(time.monotonic() - t0)
            passed += ok
            print(
                f"run {i:2d}/{args.runs}: {'pass' if ok else 'FAIL'} in {took[-1]:.0f} s ({passed} passed so far)",
                flush=True,
            )
            if not ok:
                print("    " + "\n    ".join(tail), flush=True)
    finally:
        for s in spins:
            s.kill()
            s.wait()
    print(
        f"{args.test}: {passed}/{args.runs} passed beside {args.busy} busy loop(s); "
        f"median {sorted(took)[len(took) // 2]:.0f} s a run"
    )
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
