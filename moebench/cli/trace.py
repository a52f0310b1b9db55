"""`moebench trace`: a run's or a file's traces (phases, timeline, overlap), or `--import` of
Nsight Systems captures into exports and rows."""

from __future__ import annotations

from moebench.cli import options

EXIT_STATUS = options.exit_status(
    "0 the traces read (a run folder's unreadable ones skipped, each said on stderr); with --import, every "
    "capture exported",
    "1 with --import, a capture that failed to export (its line says why)",
    "2 bad input (no target, a path that is no trace file or run folder, a trace file that does not read or is "
    "over --max-trace-mb, a run folder none of whose traces reads, a link where a PNG would be written, --import "
    "with no capture, without Nsight Systems' host tools or into a run folder a sweep is writing, an unknown "
    "option) or an environment error (an unwritable --out)",
    f"{options.FAILED}, not the capture",
    "130 interrupted",
)


def register(sub) -> None:
    """`trace` under the top level's subparsers."""
    tr = options.command(sub, "trace", "phase timeline and overlap from a run's traces or a trace file", EXIT_STATUS)
    tr.add_argument(
        "target",
        nargs="?",
        help="a trace file (.json, .json.gz from trace=torch; .sqlite from nsys "
        "export) or a run directory, whose traces/ folder is read (results/ folders omit it)",
    )
    tr.add_argument("--plot", action="store_true", help="write a timeline PNG next to each trace")
    options.out(
        tr,
        "with --plot: write the PNGs under this directory, mirroring the layout below the run's "
        "traces/ (default: next to each trace)",
    )
    tr.add_argument(
        "--max-trace-mb",
        type=float,
        default=256.0,
        help="refuse traces larger than this, inflated (default %(default)g; 0: no limit)",
    )
    tr.add_argument(
        "--import",
        dest="import_from",
        metavar="DIR_OR_CAPTURE",
        help="instead: export the nsys captures (.qdstrm, .qdstrm.xz, .nsys-rep) under a run or folder "
        "to SQLite with Nsight Systems' host tools (scripts/install_nsys.sh) and update the run's rows",
    )


def trace_args(args) -> int:
    if args.import_from is not None:
        from moebench.run.nsys_import import import_command

        return import_command(args.import_from)
    from moebench.report.trace_report import trace_command
    from moebench.results.store import check_readable
    from moebench.traces.files import is_trace_file

    if args.target is not None:  # a run or trace file that may not be looked at: its one line (no --out helps)
        check_readable(args.target, "a trace file" if is_trace_file(args.target) else "a run")
    return trace_command(args.target, args.plot, args.out, args.max_trace_mb)
