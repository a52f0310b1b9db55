"""CLI bodies of `moebench report` and `moebench compare` (docs/design.md, "Exit status").

Both write the report (report.md + PNGs, with csv files or report.json as --format asks)
and print it in that format. Exit status: 0 clean; 1 a row slower beyond the threshold,
a broken row, or no paired row ok on both sides (what counts is --fail-on); bad input (runs no row
of which pairs, report/overlap.py, among it) raises
ValueError and a report folder that cannot be written OSError, before anything is written (the
CLI exits 2 for both; the folder is checked before the runs are read and made only once there is
a report to write, so a refused command leaves none behind); a single run's report exits 0.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from moebench.cli import options

if TYPE_CHECKING:
    from moebench.report.capacity import Budget

# moebench.report (pandas, 1-2 s) is imported inside the functions: the parser imports this module
# for its arguments on every command, `list` and `env` included (tests/project/test_list_path.py)


REPORT_EXIT = options.exit_status(
    "0 the report written: a single run's (--capacity's too), or a comparison (--baseline A --candidate B) "
    f"with no regression or {options.NO_VERDICT_0}",
    f"1 a comparison with {options.REGRESSION}",
    "2 bad input (a missing run, both sides the same run, runs no row of which pairs, an unknown schema version, "
    "--capacity with no budget "
    "to take or on a run with no combination's GPU memory peaks at two token counts, a run a live process on "
    f"this host is writing that has no row stored yet, an unknown option) or {options.ENVIRONMENT}",
    f"3 the report {options.NO_VERDICT}",
    "130 interrupted",
)
COMPARE_EXIT = options.exit_status(
    f"0 no regression, or {options.NO_VERDICT_0}",
    f"1 {options.REGRESSION}",
    "2 bad input (a missing run, both sides the same run, an unknown schema version, an --axis field no "
    "combination has or a value no row has, runs or an axis no row of which pairs: the line says what to do, "
    "a run a live process on this host is writing that has no row "
    f"stored yet, an unknown option) or {options.ENVIRONMENT}",
    f"3 the comparison {options.NO_VERDICT}",
    "130 interrupted",
)


def register(sub) -> None:
    """`report` and `compare` under the top level's subparsers."""
    rp = options.command(sub, "report", "markdown report + plots of a run, or a baseline comparison", REPORT_EXIT)
    rp.add_argument(
        "run",
        nargs="?",
        metavar="RUN",
        help="the run folder (or one of its row files) to report on; with --baseline, the candidate",
    )
    rp.add_argument(
        "--baseline",
        metavar="BASE",
        help="a run to compare the candidate (RUN or --candidate) with: the report is then a comparison "
        "and exits with its verdict",
    )
    rp.add_argument("--candidate", metavar="CAND", help="with --baseline: the run compared, instead of RUN")
    options.out(
        rp,
        "report directory (default: <run>/report; for a run committed under results/, "
        "runs/reports/<its path under results/>/report, so that reading it changes no tracked file)",
    )
    options.compare_options(rp)
    rp.add_argument(
        "--capacity", action="store_true", help="how many tokens per rank fit a memory budget, per reduction placement"
    )
    rp.add_argument(
        "--budget",
        metavar="BYTES",
        type=_budget,
        help="with --capacity: the memory budget in bytes, a number with its unit (16GiB, 80GB; a bare "
        "number is bytes, 1 MiB at least), or 'free' (the GPU's memory); not a fraction (tune's --budget is "
        "one); default: the budget of the run's rows measured under runner.memory_budget",
    )

    cp = options.command(sub, "compare", "compare two runs, or one run along an axis; the verdict first", COMPARE_EXIT)
    cp.add_argument("runs", nargs="+", metavar="RUN", help="BASE CAND, or one RUN with --axis")
    cp.add_argument(
        "--axis",
        metavar="FIELD=A:B",
        help="pair the rows of one run that differ only in FIELD "
        "(an axis such as reduction=finalize:experts, or a knob such as row_layout=gathered:contiguous); "
        "A is the baseline; with BASE CAND, BASE's rows with A against CAND's with B",
    )
    options.out(
        cp,
        "report directory (default: CAND/report/vs-BASE (vs-BASE-axis-FIELD-A-B with --axis), or "
        "RUN/report/axis-FIELD-A-B; for a run committed "
        "under results/, runs/reports/<its path under results/>/report/vs-BASE or .../axis-FIELD-A-B, so "
        "that comparing it changes no tracked file)",
    )
    options.compare_options(cp)


def _budget(text: str) -> Budget | None:
    """--budget's value as report/capacity.py reads it (parse_budget), when the command line is parsed:
    a bad one is argparse's one line, exit 2, before any run is read; '' is no budget given."""
    if not text:
        return None
    from moebench.report.capacity import parse_budget  # pandas: only where a budget is given

    try:
        return parse_budget(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _check_format(fmt: str) -> str:
    from moebench.report.document import FORMATS

    fmt = "md" if fmt == "markdown" else fmt
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    return fmt


def _fail_on(fail_on) -> tuple[str, ...]:
    from moebench.report.verdict import DEFAULT_FAIL_ON, parse_fail_on

    if fail_on is None:
        return DEFAULT_FAIL_ON
    return parse_fail_on(fail_on) if isinstance(fail_on, str) else tuple(fail_on)


def _refuse_same_run(cmd: str, base: str, cand: str) -> None:
    """Both sides one run (the same folder, however spelled: a trailing slash, a link, its rows/
    folder, a row file twice): every pair is identical and the verdict clean, so that a typo in a CI
    gate would pass; ValueError (exit 2) saying what to pass, before anything is read or written. Two
    copies of a run (a folder copied, a run committed under results/) are two folders: compared,
    as a copy resumed since differs (docs/design.md, "Exit status")."""
    from moebench.results.store import ROWS_DIR

    def folder(given: str) -> Path:
        path = Path(given)
        return path.parent if path.name == ROWS_DIR and path.is_dir() else path  # RUN/rows stands for RUN

    if os.path.samefile(folder(base), folder(cand)):
        spelled = base if base == cand else f"{base} and {cand}"
        instead = (
            "`moebench compare BASE CAND` with two runs, or `moebench compare RUN --axis FIELD=A:B` within one"
            if cmd == "compare"
            else "`moebench report --baseline BASE --candidate CAND` with two runs, or `moebench report RUN` for one"
        )
        raise ValueError(f"both sides are the same run ({spelled}), whose comparison says nothing: give {instead}")


def _finish(doc, path: Path, fmt: str) -> int:
    from moebench.report.document import stdout_text

    text = stdout_text(doc, fmt)
    print(text, end="" if text.endswith("\n") else "\n")
    print(f"report written to {path}", file=sys.stderr)
    if doc.code:
        why = doc.data.get("verdict", {}).get("why", [])
        print(f"moebench: exit {doc.code}: {'; '.join(why)}", file=sys.stderr)
    return doc.code


def report_command(
    run: str | None,
    baseline: str | None,
    candidate: str | None,
    out: str | None,
    threshold: float = 1.05,
    fmt: str = "md",
    fail_on=None,
    cpu_verdict: bool = False,
) -> int:
    """`moebench report RUN` (exit 0) or `report --baseline A --candidate B` (the
    comparison's exit status)."""
    from moebench.report.document import build_report
    from moebench.results.store import check_run_path

    fmt = _check_format(fmt)
    if run is not None and candidate is not None and Path(run) != Path(candidate):
        raise ValueError("give the run either as RUN or as --candidate, not both")
    candidate = candidate if candidate is not None else run
    if candidate is None:
        raise ValueError(
            "nothing to report: `moebench report RUN` for one run, or "
            "`moebench report --baseline A --candidate B` to compare two"
        )
    for given in (candidate, baseline):  # each run there, before its report folder is checked
        if given is not None:
            check_run_path(given)
    if baseline is not None:
        _refuse_same_run("report", baseline, candidate)
    # the report folder checked before the runs are read, made once there is a report (exit 2 either way)
    rep = build_report(candidate, out, baseline, threshold, fmt, _fail_on(fail_on), cpu_verdict)
    return _finish(rep.doc, rep.path, fmt)


def compare_command(
    runs: list[str],
    axis: str | None = None,
    out: str | None = None,
    threshold: float = 1.05,
    fmt: str = "md",
    fail_on=None,
    names: tuple[str, str] | None = None,
    cpu_verdict: bool = False,
) -> int:
    """`moebench compare BASE CAND`, `moebench compare RUN --axis FIELD=A:B` (within one run) or
    `moebench compare BASE CAND --axis FIELD=A:B` (BASE's rows with A against CAND's with B); ``names``
    replaces the runs' folder names in the report; ``cpu_verdict`` gives CPU pairs verdicts."""
    from moebench.report.compare import compare_runs
    from moebench.report.document import (
        comparison_doc,
        output_names,
        report_dir,
        run_names,
        write,
    )
    from moebench.report.load import load_run
    from moebench.report.mdsafe import md_text
    from moebench.results.store import check_run_path, run_dir_of

    fmt = _check_format(fmt)
    fail = _fail_on(fail_on)
    from moebench.report.overlap import require_pairs

    ax = None
    if axis is not None:
        from moebench.report.axis import compare_axis, parse_axis

        ax = parse_axis(axis)
    if ax is not None and len(runs) == 1:
        check_run_path(runs[0])  # the run there, before its report folder is checked
        place = report_dir(runs[0], out, f"axis-{ax.field}-{ax.a}-{ax.b}")
        place.check(output_names(fmt))  # nothing made until the run is read and its pairs found
        df, env = load_run(runs[0])
        cmp = compare_axis(df, ax, threshold, cpu_verdict=cpu_verdict)
        require_pairs(cmp, df, df, runs[0], runs[0])
        cmp.base_env = cmp.cand_env = env
        where = place.make()
        cmp.baseline_name, cmp.candidate_name = md_text(cmp.baseline_name), md_text(cmp.candidate_name)
        doc = comparison_doc(cmp, where, [Path(runs[0])], fail, (df,), (env,))
        return _finish(doc, write(doc, where, fmt), fmt)
    if len(runs) != 2:
        raise ValueError(
            "`moebench compare BASE CAND` takes two runs (or one with --axis FIELD=A:B: "
            "`moebench compare RUN --axis FIELD=A:B` within one, `moebench compare BASE CAND --axis FIELD=A:B` "
            "across two)"
        )
    base, cand = runs
    check_run_path(base)  # both runs there, before the report folder is checked
    check_run_path(cand)
    _refuse_same_run("compare", base, cand)
    sub = f"vs-{run_dir_of(base).name}" + (f"-axis-{ax.field}-{ax.a}-{ax.b}" if ax else "")
    place = report_dir(cand, out, sub)
    place.check(output_names(fmt))  # nothing made until both runs are read and compared
    base_df, base_env = load_run(base)
    cand_df, cand_env = load_run(cand)
    if ax is not None:  # BASE's rows with A against CAND's with B
        cmp = compare_axis(base_df, ax, threshold, cpu_verdict=cpu_verdict, cand_df=cand_df)
    else:
        cmp = compare_runs(base_df, cand_df, threshold=threshold, cpu_verdict=cpu_verdict)
    require_pairs(cmp, base_df, cand_df, base, cand)  # inputs that never meet: exit 2, nothing written
    where = place.make()
    cmp.base_env, cmp.cand_env = base_env, cand_env
    cmp.baseline_name, cmp.candidate_name = tuple(map(md_text, names)) if names else run_names(Path(base), Path(cand))
    if ax is not None:  # the names say which value each run's rows hold: the field paired, in the title
        cmp.baseline_name += " " + md_text(f"({ax.field}={ax.a})")
        cmp.candidate_name += " " + md_text(f"({ax.field}={ax.b})")
    doc = comparison_doc(cmp, where, [Path(base), Path(cand)], fail, (base_df, cand_df), (base_env, cand_env))
    return _finish(doc, write(doc, where, fmt), fmt)


def _without_plugins(command):
    """A command that reads stored rows (which name their entries) and imports no plugin: a broken
    or hanging one cannot stop it (docs/design.md, "Plugins")."""

    @functools.wraps(command)
    def run(args) -> int:
        from moebench.kernels.registry import without_plugins

        with without_plugins():
            return command(args)

    return run


@_without_plugins
def report_args(args) -> int:
    """`moebench report` from its parsed arguments (`--capacity`: report/capacity.py)."""
    if args.capacity:
        from moebench.report.capacity import capacity_command

        if not args.run:
            raise ValueError("--capacity reports one run: moebench report RUN --capacity")
        return capacity_command(args.run, args.budget, args.out)
    if not args.run and not (args.baseline and args.candidate):
        raise ValueError("give a run directory, or --baseline A --candidate B")
    return report_command(
        args.run, args.baseline, args.candidate, args.out, args.threshold, args.format, args.fail_on, args.cpu_verdict
    )


@_without_plugins
def compare_args(args) -> int:
    """`moebench compare` from its parsed arguments."""
    return compare_command(
        args.runs, args.axis, args.out, args.threshold, args.format, args.fail_on, cpu_verdict=args.cpu_verdict
    )
