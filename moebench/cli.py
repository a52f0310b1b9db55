"""moebench sweep|run|list|report|compare|ab|trace|tune|env

Bad input (unknown option, malformed results, a world size the machine lacks)
exits with code 2 and a message that says what to do, before any work starts; so does an
environment error (a full disk, a read-only folder, `--out` naming a file: one line naming
the path and the cause, moebench/writable.py). A sweep that meets one mid-run keeps its
rows and exits 1 saying so (moebench/sweep.py).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys

EPILOG = """overrides are Hydra-style: group=option (backend=local), key=value
(workload.tokens_per_rank=[16,64]) and, in a sweep, comma lists (reduction=experts,finalize).
Groups: backend experts reduction overlap model quant workload runner trace."""


EXIT_STATUS = """exit status: 0 clean; 1 a row slower beyond the threshold, a broken row (was ok, now
failed/incorrect/timeout/oom) or no row ok on both sides (--fail-on tunes which); 2 bad input (a
missing run, an unknown schema version, an axis value no row has, an unknown option) or an environment
error (a full disk, a read-only --out); 130 interrupted; 143 terminated (SIGTERM; sweep and run).
A single run's report exits 0."""


def _compare_options(p) -> None:
    p.add_argument("--threshold", type=float, default=1.05,
                   help="factor a latency (or workspace) ratio must pass to count (default %(default)s)")
    p.add_argument("--fail-on", default="slower,broken,empty",
                   help="what exits 1, a comma list of slower, broken, memory (workspace larger), missing "
                   "(a baseline row the candidate lacks), empty (no row ok on both sides), env (environments "
                   "not comparable), or none (default: %(default)s)")
    p.add_argument("--cpu-verdict", action="store_true",
                   help="give CPU rows faster / slower verdicts too (CPU figures are pipeline checks: by "
                   "default two CPU runs compare without a verdict and exit 0)")
    p.add_argument("--format", default="md", choices=("md", "csv", "json"),
                   help="what stdout gets: the verdict and table (md), the table (csv), everything (json); "
                   "the report folder gets report.md and, for csv / json, the tables' files (default: md)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moebench", description="Benchmark modular MoE layer kernels.", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("sweep", help="run every valid combination of the given axes", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("overrides", nargs="*")
    s.add_argument("--sweep", default="default", help="named sweep in sweeps/ (or a path); default: %(default)s")
    s.add_argument("--out", help="run directory (default: runs/<sweep>[-<hash of overrides>])")
    s.add_argument("--redo", default="none", choices=("none", "failed", "all"),
                   help="re-run stored rows: none (resume), failed (failed|timeout|oom|incorrect), all")
    s.add_argument("--dry-run", action="store_true", help="plan only: print what would run")
    s.add_argument("--oversubscribe", action="store_true",
                   help="CPU ranks only: allow more ranks than cores (timings contend)")
    s.add_argument("--wait", action="store_true",
                   help="if another sweep is writing --out, wait for it (default: refuse with exit 2)")
    from .slurm import add_arguments

    add_arguments(s)

    r = sub.add_parser("run", help="run one combination and print its rows", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("overrides", nargs="*")
    r.add_argument("--out", help="run directory (default: runs/run-<hash>)")

    ls = sub.add_parser("list", help="list the combinations a sweep would run, with validity")
    ls.add_argument("overrides", nargs="*")
    ls.add_argument("--sweep", default="default")
    ls.add_argument("--json", action="store_true", help="one record per combination, each field of its spec a key")
    ls.add_argument("--knobs", action="store_true", help="instead: every knob the registered entries declare")
    ls.add_argument("--verbose", "-v", action="store_true",
                    help="every skipped combination with its reason (default: the count per reason)")
    ls.add_argument("--oversubscribe", action="store_true",
                    help="CPU ranks only: plan more ranks than cores, as `sweep --oversubscribe` runs them")

    rp = sub.add_parser("report", help="markdown report + plots of a run, or a baseline comparison",
                        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("run", nargs="?")
    rp.add_argument("--baseline")
    rp.add_argument("--candidate")
    rp.add_argument("--out", help="report directory (default: <run>/report)")
    _compare_options(rp)
    rp.add_argument("--capacity", action="store_true",
                    help="how many tokens per rank fit a memory budget, per reduction placement")
    rp.add_argument("--budget", help="with --capacity: bytes (16GiB) or 'free' (the GPU's memory); default: "
                    "the budget of the run's rows measured under runner.memory_budget")

    cp = sub.add_parser("compare", help="compare two runs, or one run along an axis; the verdict first",
                        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    cp.add_argument("runs", nargs="+", metavar="RUN", help="BASE CAND, or one RUN with --axis")
    cp.add_argument("--axis", metavar="FIELD=A:B", help="pair the rows of one run that differ only in FIELD "
                    "(an axis such as reduction=finalize:experts, or a knob such as row_layout=gathered:contiguous); "
                    "A is the baseline")
    cp.add_argument("--out", help="report directory (default: CAND/report/vs-BASE, or RUN/report/axis-FIELD-A-B)")
    _compare_options(cp)

    ab = sub.add_parser("ab", help="measure two git revisions alternately, one combination at a time, then compare",
                        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    ab.add_argument("base_rev", metavar="BASE_REV")
    ab.add_argument("cand_rev", metavar="CAND_REV")
    ab.add_argument("overrides", nargs="*")
    ab.add_argument("--sweep", default="default", help="named sweep in the revisions' sweeps/ (default: %(default)s)")
    ab.add_argument("--out", help="directory for the worktrees, both runs and the comparison "
                    "(default: runs/ab-<base>-<cand>-<hash of the overrides>)")
    ab.add_argument("--keep-worktrees", action="store_true", help="leave the two checkouts in place")
    ab.add_argument("--repo", help="the git repository the revisions are in (default: the working directory's)")
    _compare_options(ab)

    tr = sub.add_parser("trace", help="phase timeline and overlap from a run's traces or a trace file")
    tr.add_argument("target", nargs="?", help="a trace file (.json, .json.gz from trace=torch; .sqlite from nsys "
                    "export) or a run directory, whose traces/ folder is read (results/ folders omit it)")
    tr.add_argument("--plot", action="store_true", help="write a timeline PNG next to each trace")
    tr.add_argument("--out", help="with --plot: write the PNGs under this directory, mirroring the layout below "
                    "the run's traces/ (default: next to each trace)")
    tr.add_argument("--max-trace-mb", type=float, default=256.0,
                    help="refuse traces larger than this, inflated (default %(default)g; 0: no limit)")
    tr.add_argument("--import", dest="import_from", metavar="DIR_OR_CAPTURE",
                    help="instead: export the nsys captures (.qdstrm, .qdstrm.xz, .nsys-rep) under a run or folder "
                    "to SQLite with Nsight Systems' host tools (scripts/install_nsys.sh) and update the run's rows")

    tu = sub.add_parser("tune", help="Triton tile search for one layer, a vLLM file's routing, or the best combination "
                        "per size of a run", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    tu.add_argument("overrides", nargs="*", help="one combination with experts=triton backend=local; the token grid is "
                    "workload.tokens_per_rank (default: vLLM's 18 batch sizes, 1 ... 4096)")
    tu.add_argument("--space", default="vllm", help="search space before pruning: vllm (vLLM's 1,920 configs), small, "
                    "decode or prefill (default: %(default)s)")
    tu.add_argument("--search", default="halving", help="halving (successive halving over tiles inside --budget) or "
                    "exhaustive (default: %(default)s)")
    tu.add_argument("--budget", type=float, default=0.15, help="halving: fraction of the pruned space timed per token "
                    "count, baselines included (default: %(default)s)")
    tu.add_argument("--reps", type=int, default=10, help="timed samples per config (default: %(default)s)")
    tu.add_argument("--final-reps", type=int, default=0, help="samples of each finalist, interleaved (default: 3 x --reps)")
    tu.add_argument("--compile-workers", type=int, default=None,
                    help="CPU processes compiling configs per GPU (default: the cores less one; 0: none)")
    tu.add_argument("--gpus", type=int, default=None, help="GPUs to spread token counts over (default: every visible one)")
    tu.add_argument("--fresh", action="store_true", help="ignore the trials stored in --out (default: resume from them)")
    tu.add_argument("--out", help="output directory (default: runs/tune-<hash of the arguments>); with --results, "
                    "where the table goes (default: RUN/report; runs/reports/<path> for a run under results/)")
    tu.add_argument("--install", action="store_true", help="merge the config file into kernels/configs/ (or, while it "
                    "does not cover vLLM's grid, kernels/configs/partial/)")
    tu.add_argument("--install-from", metavar="DIR", help="instead: install the config files of a finished tune's "
                    "output directory (DIR/configs/*.json with their sidecars), as --install would")
    tu.add_argument("--results", metavar="RUN", help="instead: the fastest combination per model x tokens of a run, "
                    "its margin over the runner-up with a 95%% interval (table, JSON, heatmap)")
    tu.add_argument("--check-vllm", metavar="FILE", help="instead: which batch sizes vLLM would route to which entry of "
                    "FILE (exit 1 if it decides a grid size from an entry > 2x away)")

    ev = sub.add_parser("env", help="this machine, its libraries and which entries are usable here")
    ev.add_argument("--json", action="store_true")
    return p


def _list(args) -> int:
    from . import plugins
    from .plan import plan

    if args.knobs:
        print("\n".join(plugins.knob_lines()))
        return 0
    combos, _ = plan(args.overrides, args.sweep, oversubscribe=args.oversubscribe)
    for line in plugins.problems():
        print(f"moebench list: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps([plugins.combo_record(c) for c in combos], indent=2))
        return 0
    valid = [c for c in combos if not c.reason]
    for c in valid:
        extra = ""
        if c.token_reasons:
            extra = "  (skipped tokens: " + "; ".join(f"{t}: {r}" for t, r in c.token_reasons.items()) + ")"
        print(f"valid   {c.label}{plugins.origin_tag(c)}{extra}")
    skipped = [c for c in combos if c.reason]
    if skipped and args.verbose:
        for c in skipped:
            print(f"skipped {c.label}{plugins.origin_tag(c)}  ({c.reason})")
    elif skipped:
        print(f"\nskipped, by reason ({len(skipped)} combinations; --verbose lists each):")
        from .sweep import reason_groups

        for n, line in reason_groups([c.reason for c in skipped]):
            print(f"  {n:4d}  {line}")
    print(f"\n{len(valid)} valid, {len(combos) - len(valid)} skipped of {len(combos)} combinations")
    lines = plugins.summary()
    if lines:
        print("\nplugins:\n" + "\n".join(f"  {line}" for line in lines))
    return 0


def _run_one(args) -> int:
    from .plan import plan
    from .store import RunStore
    from .sweep import execute

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
    return 0 if set(df["status"]) <= {"ok", "skipped"} else 1


def _tune(args) -> int:
    from pathlib import Path

    if args.check_vllm:
        from .tune.vllm_check import check_command

        return check_command(args.check_vllm)
    if args.results:
        from .tune.best import results_command

        return results_command(args.results, args.out)
    if args.install_from:
        from .tune import files

        found = files.tuned_files(Path(args.install_from))
        for f in found:
            files.install(f, print)
        return 0
    from dataclasses import asdict

    from .plan import default_runs_dir, run_name
    from .tune import files
    from .tune.search import TuneArgs, tune

    targs = TuneArgs(overrides=list(args.overrides), space=args.space, search=args.search, budget=args.budget,
                     reps=args.reps, final_reps=args.final_reps, workers=args.compile_workers, gpus=args.gpus,
                     resume=not args.fresh)
    key = list(args.overrides) + [f"--space={args.space}", f"--search={args.search}", f"--budget={args.budget}",
                                  f"--reps={args.reps}"]
    out = Path(args.out) if args.out else default_runs_dir() / run_name("tune", key)
    try:
        info, pruned, results, stats, wall = tune(targs, out)
    except KeyboardInterrupt:
        print(f"moebench tune: interrupted; the trials so far are in {out / 'trials.jsonl'}: the same command resumes",
              file=sys.stderr)
        return 130
    path = files.write(info, results, out, extra={"wall_s": wall, "compile": asdict(stats), "environment": files.environment()})
    print(files.summary(results, len(pruned.kept)))
    print(f"\nspace {args.space}: {pruned.summary()}; search {args.search}; {wall:.0f} s; {stats.summary()}")
    if path is None:
        print(f"no config ran correctly at any token count: nothing to write (the trials' errors: {out / 'tune.json'})",
              file=sys.stderr)
        return 1
    print(f"configs: {path} (provenance beside it, every trial in {out / 'trials.jsonl'}); use them with "
          f"MOEBENCH_TRITON_CONFIG_DIR={path.parent} or --install")
    note = files.routing_note(path)
    if note:
        print(note)
    if args.install:
        files.install(path, print)
    return 0 if all(r.best is not None for r in results) else 1


def _parse(argv):
    """argparse stops filling `overrides` at the first option, so `sweep a=1 --sweep x b=2`
    would refuse b=2: overrides may come before, between and after options."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and hasattr(args, "overrides"):
        stray = [a for a in rest if a.startswith("-") or "=" not in a]
        if not stray:
            args.overrides = list(args.overrides or []) + rest
            return args
    if rest:
        # the subcommand's own usage (its options), not the top level's list of subcommands
        subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        (subs.choices.get(getattr(args, "cmd", None)) or parser).error(f"unrecognized arguments: {' '.join(rest)}")
    return args


class _Terminated(BaseException):
    """SIGTERM outside a sweep's running combinations (moebench/sweep.py handles it there)."""


def _on_sigterm(signum, frame):
    raise _Terminated


def main(argv=None) -> int:
    args = _parse(argv)
    if args.cmd not in ("sweep", "run"):
        return _main(args)
    # SLURM's pre-emption, `timeout`, `docker stop`: a message and exit 143, the lock released
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(args)
    finally:
        signal.signal(signal.SIGTERM, old)


def _main(args) -> int:
    try:
        if args.cmd == "sweep":
            from .sweep import execute

            from .slurm import options_from_args

            _, counts = execute(args.overrides, args.sweep, args.out, args.redo, args.dry_run,
                                oversubscribe=args.oversubscribe, wait=args.wait, slurm=options_from_args(args))
            return counts.exit_code()
        if args.cmd == "run":
            return _run_one(args)
        if args.cmd == "list":
            return _list(args)
        if args.cmd == "report":
            from .report.command import report_command

            if args.capacity:
                from .report.capacity import capacity_command

                if not args.run:
                    raise ValueError("--capacity reports one run: moebench report RUN --capacity")
                return capacity_command(args.run, args.budget, args.out)
            if not args.run and not (args.baseline and args.candidate):
                raise ValueError("give a run directory, or --baseline A --candidate B")
            return report_command(args.run, args.baseline, args.candidate, args.out, args.threshold, args.format,
                                  args.fail_on, args.cpu_verdict)
        if args.cmd == "compare":
            from .report.command import compare_command

            return compare_command(args.runs, args.axis, args.out, args.threshold, args.format, args.fail_on,
                                   cpu_verdict=args.cpu_verdict)
        if args.cmd == "ab":
            from .ab import ab_command

            return ab_command(args)
        if args.cmd == "trace":
            from .traces.cli import trace_command

            return trace_command(args.target, args.plot, args.out, args.max_trace_mb, args.import_from)
        if args.cmd == "tune":
            return _tune(args)
        if args.cmd == "env":
            from .env import env_command

            return env_command(args.json)
    except ValueError as e:
        print(f"moebench {args.cmd}: error: {_one_line(e, getattr(args, 'overrides', None) or [])}", file=sys.stderr)
        return 2
    except OSError as e:
        line = _environment_line(e, args)
        if line is None:
            raise
        print(f"moebench {args.cmd}: environment error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.cmd not in ("report", "compare", "list", "ab"):
            raise
        print(f"moebench {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print(f"moebench {args.cmd}: terminated (SIGTERM); finished combinations are stored. Re-run the same "
              "command to resume.", file=sys.stderr)
        return 143
    return 2


def _environment_line(e: OSError, args) -> str | None:
    """The one line of an environment error (moebench/writable.py decides which OSErrors are
    one), with what to do; None for any other OSError (a defect: its traceback stays)."""
    from .writable import describe

    out = getattr(args, "out", None)
    line = describe(e, out)
    if line is None:
        return None
    if args.cmd in ("report", "compare", "trace") and not out:
        return f"{line} (--out DIR writes elsewhere)"
    return f"{line}; nothing was measured" if args.cmd in ("sweep", "run") else line


def _one_line(e: ValueError, overrides: list[str]) -> str:
    """A config library's multi-line message (OmegaConf: the message, then full_key and
    object_type lines) as one line naming the override that caused it."""
    text = str(e)
    lines = text.splitlines()
    if len(lines) <= 1:
        return text
    key = getattr(e, "full_key", None) or next((ln.split(":", 1)[1].strip() for ln in lines
                                                 if ln.strip().startswith("full_key:")), None)
    given = next((o for o in overrides if key and o.split("=", 1)[0].lstrip("+~").endswith(str(key))), None)
    first = lines[0].strip()
    if "ListConfig" in first and given:
        name = given.split("=", 1)[0]
        first = "expects a list, e.g. " + ("workload.tokens_per_rank=[16,256]" if name.endswith("tokens_per_rank")
                                          else f"{name}=[a,b]")
    return f"{given}: {first}" if given else " ".join(ln.strip() for ln in lines)


if __name__ == "__main__":
    sys.exit(main())
