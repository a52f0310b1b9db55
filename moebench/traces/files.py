"""Trace files: which files of a folder or run are traces (torch's Chrome JSON, gzipped or not;
Nsight Systems' SQLite exports) and loading them into the trace model."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from moebench.traces.metrics import summarize
from moebench.traces.nsys import DEFAULT_MAX_TRACE_MB, nsys_processes, parse_nsys_sqlite
from moebench.traces.torch_trace import parse_torch_trace

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite")
READ_ADVICE = "make it readable or pass a trace file you can read"  # a trace file the user may not read


def is_trace_file(path) -> bool:
    name = Path(path).name
    return name.endswith(TRACE_SUFFIXES) and not name.endswith((".timeline.json",))


def load_traces(path, max_mb: Optional[float] = DEFAULT_MAX_TRACE_MB) -> list:
    """Parsed `Trace`s of one file: one for a torch trace, one per process (rank) for nsys.
    ValueError for a file over `max_mb` MB (inflated; None: no limit) or unreadable."""
    path = Path(path)
    try:
        open(path, "rb").close()  # mode 000: said so, not as JSON or SQLite its reader cannot parse
    except PermissionError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror}): {READ_ADVICE}") from None
    if path.name.endswith(".sqlite"):
        pids = nsys_processes(path, max_mb)
        if len(pids) <= 1:
            return [parse_nsys_sqlite(path, max_mb=max_mb)]
        return [parse_nsys_sqlite(path, pid=p, max_mb=max_mb) for p in pids]
    return [parse_torch_trace(path, max_mb)]


def summarize_file(path, max_mb: Optional[float] = DEFAULT_MAX_TRACE_MB) -> list:
    """[TraceSummary] of one trace file (see `load_traces`)."""
    return [summarize(t) for t in load_traces(path, max_mb)]
