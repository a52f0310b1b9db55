"""`moebench trace`: a run's or a file's traces (phases, timeline, overlap), or `--import` of
Nsight Systems captures into exports and rows."""
from __future__ import annotations


def trace_args(args) -> int:
    if args.import_from is not None:
        from moebench.run.nsys_import import import_command

        return import_command(args.import_from)
    from moebench.report.trace_report import trace_command

    return trace_command(args.target, args.plot, args.out, args.max_trace_mb)
