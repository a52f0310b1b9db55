"""`moebench sweep` and `moebench run`."""
from __future__ import annotations


def sweep_command(args) -> int:
    from moebench.run.slurm import options_from_args
    from moebench.run.sweep import execute

    _, counts = execute(args.overrides, args.sweep, args.out, args.redo, args.dry_run,
                        oversubscribe=args.oversubscribe, wait=args.wait, slurm=options_from_args(args))
    return counts.exit_code()


def run_command(args) -> int:
    """One combination, its rows printed."""
    from moebench.results.row import Status
    from moebench.results.store import RunStore
    from moebench.run.plan import plan
    from moebench.run.sweep import execute

    combos, _ = plan(args.overrides, None)
    if len(combos) != 1:
        raise ValueError(f"`moebench run` takes one combination; these overrides give {len(combos)}: use `moebench sweep`")
    run_dir, counts = execute(args.overrides, None, args.out or None, redo="all")
    if counts.env_error or counts.terminated or counts.interrupted:  # said on stderr; its row may not be stored
        return counts.exit_code()
    df = RunStore(run_dir).load()
    df = df[df["combo_key"] == combos[0].key]
    cols = ["tokens_per_rank", "status", "latency_us_median", "latency_us_p20", "latency_us_p80", "rel_err", "reason"]
    print(df[cols].to_string(index=False))
    return 0 if set(df["status"]) <= {Status.OK, Status.SKIPPED} else 1
