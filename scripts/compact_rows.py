"""Compact the rows of committed run directories: every per-combination file of a run's
rows/ (skipped.parquet aside) merged into one rows/rows.parquet, under the run's lock
(moebench/results/compact.py says why and how; a run a sweep is writing is refused, exit 2,
or waited for with --wait; a torn row file stops it, exit 2, until a sweep sets it aside).

    python scripts/compact_rows.py results/<folder> [...]   # run directories, or folders holding them
"""

from __future__ import annotations

import sys
from pathlib import Path

from moebench.results.compact import compact_run
from moebench.results.store import find_runs
from moebench.util.arg_errors import OneLineErrors, script_prog


def main(argv=None) -> int:
    p = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", type=Path)
    p.add_argument("--wait", action="store_true", help="wait for a sweep writing a run instead of refusing it")
    args = p.parse_args(argv)
    for path in args.paths:
        for run in find_runs(path):
            try:
                b, a = compact_run(run, wait=args.wait, log=print)
            except ValueError as e:  # LockHeld (a sweep holds the run), a torn or foreign row file
                print(f"compact_rows: {e}", file=sys.stderr)
                return 2
            print(f"{run}: {b / 1024:.0f} KB -> {a / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
