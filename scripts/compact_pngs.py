"""Rewrite the committed PNGs under the given folders as 256-colour palette images
(moebench/util/pngfile.py, what moebench writes since), each only where that is smaller.

Why: results/ travels whole to the GPU machine and has a size limit
(tests/project/test_results_index.py); matplotlib's RGBA PNGs of the committed reports took three
times the bytes for the same picture.

    python scripts/compact_pngs.py results [...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from moebench.util.arg_errors import OneLineErrors, script_prog
from moebench.util.pngfile import compact_png


def main(argv=None) -> int:
    ap = OneLineErrors(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path)
    args = ap.parse_args(argv)
    total_before = total_after = 0
    for root in args.paths:
        if not root.exists():
            print(f"compact_pngs: {root} does not exist", file=sys.stderr)
            return 2
        for p in sorted([root] if root.is_file() else root.rglob("*.png")):
            before, after = compact_png(p)
            total_before, total_after = total_before + before, total_after + after
    print(f"compact_pngs: {total_before / 1e6:.1f} MB -> {total_after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
