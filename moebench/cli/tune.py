"""`moebench tune`: the Triton tile search (with `--max-regression`'s check before `--install`),
`--check-vllm`, `--results`, `--install-from`."""

from __future__ import annotations

import argparse
import sys

from moebench.cli import options

EXIT_STATUS = """exit status: 0 every token count tuned (and, with --install, installed); --install-from: installed;
--results: the table written; --check-vllm: vLLM reads FILE as tuned. 1 a token count no config ran
correctly at (none at any: nothing written); --max-regression X: a tuned size slower than the current
config by more than X, or --decisions' choices regress (nothing installed); --install-from: DIR/tune.json's
figures regress by more than X (nothing installed); --check-vllm: vLLM would not use FILE as tuned (a
grid size decided by an entry more than 2x away, an entry with a field missing or foreign to vLLM's
kernel, a file name vLLM never opens). 2 bad input before any work (an unknown option or value, a
combination the tuner cannot search, a --budget outside (0, 1], a bad --max-regression, a FILE, DIR or
RUN that is missing or does not read, --install or --install-from of tiles timed on the CPU or under
Triton's interpreter: host time, nothing installed; --install-from of a DIR whose tune.json and provenance
do not say where its tiles were timed) or an environment error (an unwritable --out);
3 moebench or the machine failed (a defect, memory: the traceback, then one line), no verdict on the
tiles; 130 interrupted (the trials finished so far are kept: the same command resumes, timing only the step cut
short); 143 terminated (SIGTERM: `timeout`, `kill`), the same kept and said."""


def register(sub) -> None:
    """`tune` under the top level's subparsers."""
    tu = options.command(
        sub,
        "tune",
        "Triton tile search for one layer, a vLLM file's routing, or the best combination per size of a run",
        options.EPILOG + "\n\n" + EXIT_STATUS,
    )
    options.overrides(
        tu,
        "one combination with experts=triton backend=local; the token grid is "
        "workload.tokens_per_rank (default: vLLM's 18 batch sizes, 1 ... 4096)",
    )
    tu.add_argument(
        "--space",
        default="vllm",
        help="search space before pruning: vllm (vLLM's 1,920 configs), small / small_fp8 (the interpreter's), "
        "decode or prefill (default: %(default)s)",
    )
    tu.add_argument(
        "--search",
        default="halving",
        help="halving (successive halving over tiles inside --budget) or exhaustive (default: %(default)s)",
    )
    tu.add_argument(
        "--budget",
        type=float,
        default=0.15,
        metavar="FRACTION",
        help="halving: the fraction of the pruned space timed per token count, in (0, 1], baselines "
        "included; a fraction, not bytes (default: %(default)s, i.e. 15 %%)",
    )
    tu.add_argument("--reps", type=int, default=10, help="timed samples per config (default: %(default)s)")
    tu.add_argument(
        "--final-reps", type=int, default=0, help="samples of each finalist, interleaved (default: 3 x --reps)"
    )
    tu.add_argument(
        "--compile-workers",
        type=int,
        default=None,
        help="CPU processes compiling configs per GPU (default: the cores less one; 0: none)",
    )
    tu.add_argument(
        "--gpus", type=int, default=None, help="GPUs to spread token counts over (default: every visible one)"
    )
    tu.add_argument(
        "--fresh", action="store_true", help="ignore the trials stored in --out (default: resume from them)"
    )
    options.out(
        tu,
        "output directory (default: runs/tune-<hash of the arguments>); with --results, where the "
        "table goes (default: RUN/report; runs/reports/<path> for a run under results/)",
    )
    tu.add_argument(
        "--decisions",
        action="store_true",
        help="after the tiles: every other choice of the layer per token count (row layout, contiguous "
        "GEMM kernel and Gluon variant, triton_or_deepgemm's switch-over), whole layers timed "
        "interleaved; written beside the tiles file as <stem>.moebench.json, which vLLM never opens",
    )
    tu.add_argument(
        "--install",
        action="store_true",
        help="merge the config file into moebench/kernels/configs/ (or, while it "
        "does not cover vLLM's grid, moebench/kernels/configs/partial/)",
    )
    tu.add_argument(
        "--max-regression",
        metavar="X",
        help="before --install: time the tuned table against the "
        "current one (an installed file, else the heuristic) at every tuned size, interleaved, "
        "--final-reps each; exit 1 without installing when it is slower by more than the fraction X "
        "(0.02: 2 %%) at any size",
    )
    # for moebench's own tests only, so out of --help (tests/cli/test_help_and_errors.py's HIDDEN): lets
    # --install / --install-from install tiles timed on the CPU or under Triton's interpreter, or a DIR
    # that does not say where its tiles were timed (host time, which no tuned table may rest on)
    tu.add_argument("--allow-cpu-tiles", action="store_true", help=argparse.SUPPRESS)
    tu.add_argument(
        "--install-from",
        metavar="DIR",
        help="instead: install the config files of a finished tune's "
        "output directory (DIR/configs/*.json with their sidecars), as --install would, once DIR/tune.json "
        "or a sidecar says a GPU timed them (exit 2 for the host's time, or none said); with "
        "--max-regression X (else the tune's own, if it ran one) exit 1 without installing when DIR/tune.json's "
        "figures regress by more than X, tiles or decisions",
    )
    tu.add_argument(
        "--results",
        metavar="RUN",
        help="instead: the fastest combination per model x tokens of a run, "
        "its margin over the runner-up with a 95%% interval (table, JSON, heatmap)",
    )
    tu.add_argument(
        "--check-vllm",
        metavar="FILE",
        help="instead: which batch sizes vLLM would route to which entry "
        "of FILE (exit 1 if it decides a grid size from an entry > 2x away)",
    )


def tune_command(args) -> int:
    from pathlib import Path

    max_regression = _max_regression(args)  # bad input exits 2 before any work
    if args.check_vllm:
        from moebench.tune.vllm_check import check_command

        return check_command(args.check_vllm)
    if args.results:
        from moebench.report.best_per_size import results_command

        return results_command(args.results, args.out)
    if args.install_from:
        from moebench.tune import decision_files, files, install_check

        found = files.tuned_files(Path(args.install_from))
        host = "" if args.allow_cpu_tiles else install_check.host_refusal(Path(args.install_from))
        if host:  # timed on the host, or nothing says where
            raise ValueError(f"--install-from {args.install_from}: {host}")
        refused = install_check.refusal(Path(args.install_from), max_regression)
        if refused is not None:
            print(f"moebench tune: {refused.line(Path(args.install_from))}", file=sys.stderr)
            return 1
        for f in found:
            decision_files.install(f, files.install(f, print), print)
        return 0
    from dataclasses import asdict

    from moebench.config.paths import default_runs_dir
    from moebench.run.plan import run_name
    from moebench.tune import files, host_words, install_check
    from moebench.tune.search import TuneArgs, tune

    targs = TuneArgs(
        overrides=list(args.overrides),
        space=args.space,
        search=args.search,
        budget=args.budget,
        reps=args.reps,
        final_reps=args.final_reps,
        workers=args.compile_workers,
        gpus=args.gpus,
        resume=not args.fresh,
    )
    key = list(args.overrides) + [
        f"--space={args.space}",
        f"--search={args.search}",
        f"--budget={args.budget}",
        f"--reps={args.reps}",
    ]
    out = Path(args.out) if args.out else default_runs_dir() / run_name("tune", key)
    if args.install and not args.allow_cpu_tiles:
        _refuse_host_install(targs)  # before any work: a tune whose tiles could never be installed
    try:
        info, pruned, results, stats, wall = tune(targs, out)
    except KeyboardInterrupt as e:  # its words (search.run_tokens): the step in flight, which is lost
        lost = f" {e}" if str(e) else ""
        word, code = options.stopped(e)
        print(
            f"moebench tune: {word}{lost}; the trials finished so far are kept in {out / 'trials.jsonl'}: "
            "the same command resumes from them, timing only what is missing",
            file=sys.stderr,
        )
        return code
    extra = {"wall_s": wall, "compile": asdict(stats), "environment": files.environment()}
    path = files.write(info, results, out, extra=extra)  # first: a check that crashes loses no table
    check = None
    if max_regression is not None and path is not None:
        from moebench.tune.regression import check_tune

        try:
            check = check_tune(targs, results, max_regression, lambda s: print(s, file=sys.stderr))
        except KeyboardInterrupt as e:
            word, code = options.stopped(e)
            print(
                f"moebench tune: {word} during the --max-regression check; the table is in {path}, nothing "
                "installed: the same command re-runs the check",
                file=sys.stderr,
            )
            return code
        extra = {**extra, "regression_check": check.to_json()}
        path = files.write(info, results, out, extra=extra)
    dec, dec_check, dec_path = _decisions(args, targs, info, results, out, path, extra, max_regression)
    print(files.summary(results, len(pruned.kept)))
    print(f"\nspace {args.space}: {pruned.summary()}; search {args.search}; {wall:.0f} s; {stats.summary()}")
    host = install_check.recorded_host_timing({"layer": info, "environment": extra["environment"]})
    if host:
        print(host_words.host_note(host))
    if path is None:
        print(
            f"no config ran correctly at any token count: nothing to write (the trials' errors: {out / 'tune.json'})",
            file=sys.stderr,
        )
        return 1
    print(
        f"configs: {path} (provenance beside it, every trial in {out / 'trials.jsonl'}); use them with "
        f"MOEBENCH_TRITON_CONFIG_DIR={path.parent}{'' if host else ' or --install'}"
    )
    note = files.routing_note(path)
    if note:
        print(note)
    if dec is not None:
        from moebench.tune.decision_files import summary as decisions_summary

        print(f"\ndecisions (whole layers, interleaved):\n{decisions_summary(dec)}")
        print(f"decisions: {dec_path} (deepgemm_min_tokens and entries the layer reads)" if dec_path else "")
    regressed = False  # both checks reported before exit 1
    if dec_check is not None and not dec_check.passed:
        for line in dec_check.regressions():
            print(f"moebench tune: decisions regression: {line}", file=sys.stderr)
        print(f"moebench tune: the decisions regress{'; nothing installed' if args.install else ''}", file=sys.stderr)
        regressed = True
    if check is not None:
        print(f"\n{check.table()}\n{check.verdict()}")
        if not check.passed:
            for line in check.lines():
                print(f"moebench tune: regression: {line}", file=sys.stderr)
            print(
                f"moebench tune: {check.verdict()}{'; not installed' if args.install else ''} ({path.name} stays in "
                f"{path.parent}; the check's samples in {out / 'tune.json'})",
                file=sys.stderr,
            )
            regressed = True
    if regressed:
        return 1
    if args.install:
        from moebench.tune import decision_files

        decision_files.install(path, files.install(path, print), print)
    return 0 if all(r.best is not None for r in results) else 1


def _refuse_host_install(targs) -> None:
    """ValueError (exit 2, nothing written) for --install where the tiles would be timed on the host."""
    from moebench.kernels.triton.common import interpreting
    from moebench.tune.host_words import host_timing, not_installed
    from moebench.tune.search import resolve

    c, _ = resolve(targs.overrides)
    where = host_timing(c.combo["device"], interpreting())
    if where:
        raise ValueError(f"--install: {not_installed(where)}; drop --install to try the tool")


def _max_regression(args):
    """--max-regression as a fraction (None when not given); ValueError for a bad value or a
    mode with no tuned table to check (--install-from checks the figures its tune.json holds)."""
    if args.max_regression is None:
        return None
    from moebench.tune.regression import parse_max_regression

    modes = [
        f
        for f, v in (
            ("--results", args.results),
            ("--check-vllm", args.check_vllm),
        )
        if v
    ]
    if modes:
        raise ValueError(
            f"--max-regression times a tune's table against the current one and {modes[0]} times "
            "nothing: re-run the tune's own command with --install --max-regression X (it resumes)"
        )
    return parse_max_regression(args.max_regression)


def _decisions(args, targs, info, results, out, path, extra, max_regression):
    """--decisions after the tiles: ([DecisionResult], DecisionCheck or None, the sidecar's path);
    (None, None, None) without --decisions or when no tile ran. tune.json gains their figures."""
    if not args.decisions or path is None:
        return None, None, None
    from moebench.tune import decide, decision_files, files

    try:
        found, dec_check = decide.for_tune(targs, results, max_regression, lambda s: print(s, file=sys.stderr), out)
    except KeyboardInterrupt as e:
        raise type(e)(
            f"{options.stopped(e)[0]} during --decisions; the tiles are in {path}, the decisions timed so far in "
            f"{out / 'decisions.jsonl'}, nothing installed: the same command resumes"
        ) from None
    more = {"decisions": decision_files.to_json(found)}
    if dec_check is not None:
        more["decisions_check"] = dec_check.to_json()
    files.write_detail(info, results, out, extra={**extra, **more})  # the config files stay as written
    return found, dec_check, decision_files.write(info, found, out, path.name)
