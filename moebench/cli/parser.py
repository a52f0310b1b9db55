"""The command line's grammar: one subparser per command, shared options, and the parsing that
lets overrides come before, between and after options."""
from __future__ import annotations

import argparse

from moebench import __version__
from moebench.config.paths import ADHOC

EPILOG = """overrides are Hydra-style: group=option (backend=local), key=value
(workload.tokens_per_rank=[16,64]) and, in a sweep, comma lists (reduction=experts,finalize).
Groups: backend experts reduction overlap model quant workload runner trace."""


SWEEP_EXIT = """exit status: 0 every row ok or skipped with a reason; 1 failed / incorrect / timeout / oom
rows, or an environment error (a full disk) stopped the sweep mid-way (finished rows are stored:
re-run to resume); 2 bad input before any work (an unknown option or value, an impossible
combination, a world size this machine lacks, an unwritable --out); 130 interrupted; 143 terminated."""


EXIT_STATUS = """exit status: 0 clean; 1 a row slower beyond the threshold, a broken row (was ok, now
failed/incorrect/timeout/oom) or no row ok on both sides (--fail-on tunes which); 2 bad input (a
missing run, an unknown schema version, an axis value no row has, an unknown option) or an environment
error (a full disk, a read-only --out); 130 interrupted; 143 terminated (SIGTERM; sweep and run).
A single run's report exits 0."""


def compare_options(p) -> None:
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


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and its subcommands' parsers by name."""
    p = argparse.ArgumentParser(prog="moebench", description="Benchmark modular MoE layer kernels.", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"moebench {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("sweep", help="run every valid combination of the given axes",
                       epilog=EPILOG + "\n\n" + SWEEP_EXIT, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("overrides", nargs="*", help="group=option, key=value or comma lists (below); none: the "
                   "embedded default sweep")
    s.add_argument("--sweep", default="default", help="named sweep in sweeps/ (or a path); default: %(default)s")
    s.add_argument("--out", help="run directory (default: runs/<sweep>[-<hash of overrides>])")
    s.add_argument("--redo", default="none", choices=("none", "failed", "all"),
                   help="re-run stored rows: none (resume), failed (failed|timeout|oom|incorrect), all")
    s.add_argument("--dry-run", action="store_true", help="plan only: print what would run")
    s.add_argument("--oversubscribe", action="store_true",
                   help="CPU ranks only: allow more ranks than cores (timings contend)")
    s.add_argument("--wait", action="store_true",
                   help="if another sweep is writing --out, wait for it (default: refuse with exit 2)")
    from moebench.run.slurm import add_arguments

    add_arguments(s)

    r = sub.add_parser("run", help="run one combination and print its rows",
                       epilog=EPILOG + "\n\n" + SWEEP_EXIT, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("overrides", nargs="*", help="group=option or key=value, naming one combination (below)")
    r.add_argument("--out", help=f"run directory (default: runs/{ADHOC}-<hash of the overrides>)")

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
    compare_options(rp)
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
    compare_options(cp)

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
    compare_options(ab)

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
    tu.add_argument("--max-regression", metavar="X", help="before --install: time the tuned table against the "
                    "current one (an installed file, else the heuristic) at every tuned size, interleaved, "
                    "--final-reps each; exit 1 without installing when it is slower by more than the fraction X "
                    "(0.02: 2 %%) at any size")
    tu.add_argument("--install-from", metavar="DIR", help="instead: install the config files of a finished tune's "
                    "output directory (DIR/configs/*.json with their sidecars), as --install would")
    tu.add_argument("--results", metavar="RUN", help="instead: the fastest combination per model x tokens of a run, "
                    "its margin over the runner-up with a 95%% interval (table, JSON, heatmap)")
    tu.add_argument("--check-vllm", metavar="FILE", help="instead: which batch sizes vLLM would route to which entry of "
                    "FILE (exit 1 if it decides a grid size from an entry > 2x away)")

    ev = sub.add_parser("env", help="this machine, its libraries and which entries are usable here")
    ev.add_argument("--json", action="store_true")
    return p, dict(sub.choices)


def parse_args(argv):
    """argparse stops filling `overrides` at the first option, so `sweep a=1 --sweep x b=2`
    would refuse b=2: overrides may come before, between and after options."""
    parser, commands = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and hasattr(args, "overrides"):
        stray = [a for a in rest if a.startswith("-") or "=" not in a]
        if not stray:
            args.overrides = list(args.overrides or []) + rest
            return args
    if rest:
        # the subcommand's own usage (its options), not the top level's list of subcommands
        (commands.get(getattr(args, "cmd", None)) or parser).error(f"unrecognized arguments: {' '.join(rest)}")
    return args
