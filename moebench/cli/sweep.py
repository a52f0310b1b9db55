"""`moebench sweep` and `moebench run`: their arguments and bodies."""

from __future__ import annotations

from moebench.cli import options
from moebench.config.paths import ADHOC


def register(sub) -> None:
    """`sweep` and `run` under the top level's subparsers."""
    from moebench.run import slurm

    s = options.command(
        sub, "sweep", "run every valid combination of the given axes", options.EPILOG + "\n\n" + options.SWEEP_EXIT
    )
    options.overrides(s, "group=option, key=value or comma lists (below); none: the embedded default sweep")
    s.add_argument(
        "--sweep",
        default="default",
        help="a sweep in sweeps/ by name (default) or file name (default.yaml), or a path to a sweep file; "
        "default: %(default)s",
    )
    options.out(
        s, "run directory: a new or empty folder, or a run to resume (default: runs/<sweep>[-<hash of overrides>])"
    )
    s.add_argument(
        "--redo",
        default="none",
        choices=("none", "failed", "all"),
        help="re-run stored rows: none (resume), failed (failed|timeout|oom|incorrect), all",
    )
    s.add_argument("--dry-run", action="store_true", help="plan only: print what would run")
    s.add_argument(
        "--oversubscribe", action="store_true", help="CPU ranks only: allow more ranks than cores (timings contend)"
    )
    s.add_argument(
        "--wait",
        action="store_true",
        help="if another sweep is writing --out, wait for it (default: refuse with exit 2)",
    )
    slurm.add_arguments(s)

    r = options.command(sub, "run", "run one combination and print its rows", options.EPILOG + "\n\n" + RUN_EXIT)
    options.overrides(r, "group=option or key=value, naming one combination (below)")
    options.out(r, f"run directory: a new or empty folder, or a run (default: runs/{ADHOC}-<hash of the overrides>)")


# `run`'s statuses: sweep's (options.SWEEP_EXIT), said of one combination's rows
RUN_EXIT = options.exit_status(
    "0 each of the combination's rows (one per token count) ok or skipped with a reason",
    "1 a failed / incorrect / timeout / oom row, or an environment error (a full disk) that stopped it "
    "(the rows written are stored)",
    "2 bad input before any work (an unknown option or value, overrides that give more than one combination, "
    "an impossible combination, a world size this machine lacks, CPU weights beyond its memory, an unwritable "
    "--out, an existing --out that is neither empty nor a run)",
    options.FAILED + ", not the measured kernels",
    "130 interrupted",
    "143 terminated",
)

# `run`'s table: (column, heading, how a value prints); latencies in µs
_RUN_COLUMNS = (
    ("tokens_per_rank", "tokens", "{:d}"),
    ("status", "status", "{}"),
    ("latency_us_median", "median µs", "{:.1f}"),
    ("latency_us_p20", "p20 µs", "{:.1f}"),
    ("latency_us_p80", "p80 µs", "{:.1f}"),
    ("rel_err", "rel err", "{:.1e}"),
)


def rows_table(df) -> str:
    """`moebench run`'s rows as a small table: one line per token count, latencies in µs to 0.1,
    the error against the reference in two digits, '-' where a row has none (a skipped row), and
    the reasons after, where a row has one."""
    import math

    def cell(value, fmt: str) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return fmt.format(int(value) if fmt == "{:d}" else getattr(value, "value", value))

    heads = [head for _, head, _ in _RUN_COLUMNS]
    lines = [
        [cell(r[col], fmt) for col, _, fmt in _RUN_COLUMNS] for _, r in df.sort_values("tokens_per_rank").iterrows()
    ]
    widths = [max(len(x) for x in column) for column in zip(heads, *lines, strict=True)]
    text = [
        "  ".join(x.ljust(w) if i == 1 else x.rjust(w) for i, (x, w) in enumerate(zip(row, widths, strict=True)))
        for row in (heads, *lines)
    ]
    reasons = [
        f"  T={int(r['tokens_per_rank'])}: {r['reason']}"
        for _, r in df.iterrows()
        if isinstance(r.get("reason"), str) and r["reason"]
    ]
    return "\n".join(text + (["reasons:", *reasons] if reasons else []))


def sweep_command(args) -> int:
    from moebench.run.slurm import options_from_args
    from moebench.run.sweep import execute

    _, counts = execute(
        args.overrides,
        args.sweep,
        args.out,
        args.redo,
        args.dry_run,
        oversubscribe=args.oversubscribe,
        wait=args.wait,
        slurm=options_from_args(args),
    )
    return counts.exit_code()


def run_command(args) -> int:
    """One combination, its rows printed."""
    from moebench.results.row import Status
    from moebench.results.store import RunStore
    from moebench.run.plan import plan
    from moebench.run.sweep import execute

    combos, _ = plan(args.overrides, None)
    if len(combos) != 1:
        raise ValueError(
            f"`moebench run` takes one combination; these overrides give {len(combos)}: use `moebench sweep`"
        )
    run_dir, counts = execute(args.overrides, None, args.out or None, redo="all")
    if counts.env_error or counts.terminated or counts.interrupted:  # said on stderr; its row may not be stored
        return counts.exit_code()
    df = RunStore(run_dir).load()
    df = df[df["combo_key"] == combos[0].key]
    print(rows_table(df))
    return 0 if set(df["status"]) <= {Status.OK, Status.SKIPPED} else 1
