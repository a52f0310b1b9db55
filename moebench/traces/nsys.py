"""Nsight Systems: the launch wrapper and the parser of its SQLite export.

Launch: with trace=nsys, launch.py starts each rank process under
`nsys_rank_prefix(run_dir)`: `nsys profile --trace=cuda,nvtx --capture-range=nvtx
--nvtx-capture=timed@moebench --capture-range-end=repeat ... --export=sqlite
-o <run>/traces/nsys/ranks_%p`. The worker opens the NVTX range `timed` (domain
moebench, `combo/<key>` inside it) around the timed work of each row, so every row
is one capture and one report, `nsys_rank_report(run_dir, pid, n)`: the row's
`trace_path`. `nsys_command(argv, output, combo_key)` wraps any other command so
that the first `combo/<key>` range alone is captured. When nsys is not on the PATH,
`nsys_available()` is False and the caller prints `NSYS_MISSING` and falls back to
trace=torch.

Parse: `parse_nsys_sqlite(path)` reads the tables of `nsys export --type sqlite`
(names as in the Nsight Systems "SQLite Export Schema Reference"; timestamps ns):
- `NVTX_EVENTS` (start, end, eventType, text | textId -> StringIds, globalTid,
  domainId): push/pop ranges have eventType 59, start/end ranges 60 (70/71 for
  their payload variants); eventType 75 rows create a domain (text = its name);
- `CUPTI_ACTIVITY_KIND_KERNEL` (start, end, deviceId, streamId, correlationId,
  globalPid, demangledName / shortName -> StringIds), and `..._MEMCPY` /
  `..._MEMSET` where present;
- `CUPTI_ACTIVITY_KIND_RUNTIME` (start, end, correlationId, globalTid): the launch
  calls (runtime and driver API);
- `StringIds` (id, value).
globalTid / globalPid carry the process id in bits 24..47. It yields the same
`Trace` as the torch parser, so both share one metrics code path.

Not validated against a real nsys report: no machine here has a working nsys
(the GPU image lacks it on the PATH); the tests use a synthetic SQLite file
built to the documented schema (tests/fixtures/traces/make_fixtures.py).
"""
from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from moebench.traces.model import CAPTURE_RANGE, COMBO_PREFIX, DOMAIN, Kernel, Range, Trace, attribute

NSYS_MISSING = (
    "nsys not found on PATH: writing the torch trace instead; "
    "install Nsight Systems to get nsys reports"
)
NVTX_RANGE_TYPES = (59, 60, 70, 71)  # PushPop, StartEnd (+ payload variants)
NVTX_DOMAIN_CREATE = 75
# CUPTI_ACTIVITY_MEMCPY_KIND -> the names torch gives the same copies
_COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP"}


def nsys_available() -> bool:
    """Whether an `nsys` executable is on the PATH."""
    return shutil.which("nsys") is not None


def nsys_output(trace_dir, combo_key: str, rank: Optional[int] = None) -> Path:
    """Report path without extension: `{trace_dir}/{combo_key}/nsys[_rank{rank}]` (nsys adds .nsys-rep, .sqlite)."""
    return Path(trace_dir) / combo_key / ("nsys" if rank is None else f"nsys_rank{rank}")


def _nsys_args(output, nvtx_range: Optional[str], end: str) -> list:
    """`nsys profile` options; with `nvtx_range`, capture only while that NVTX range of domain
    moebench is open (`end`: what nsys does when it closes)."""
    args = [
        "nsys", "profile",
        "--trace=cuda,nvtx",
        "--sample=none", "--cpuctxsw=none",
        "--cuda-graph-trace=node",
        "--export=sqlite",
        "--force-overwrite=true",
        # match NVTX messages that were not registered strings too
        "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0",
    ]
    if nvtx_range is not None:
        args += ["--capture-range=nvtx", f"--nvtx-capture={nvtx_range}@{DOMAIN}", f"--capture-range-end={end}"]
    return args + ["-o", str(output)]


def nsys_prefix(output, combo_key: Optional[str] = None) -> list:
    """The `nsys profile ...` arguments that go before the profiled command.

    With `combo_key`, capture only the NVTX range `combo/<key>` of domain moebench
    (its first occurrence); without, the whole run. Kernels inside CUDA graphs are
    traced node by node; the report is also exported to `<output>.sqlite`.
    """
    return _nsys_args(output, None if combo_key is None else f"{COMBO_PREFIX}{combo_key}", "stop")


def nsys_rank_dir(run_dir) -> Path:
    """Where the ranks' nsys reports go: `<run>/traces/nsys`."""
    return Path(run_dir) / "traces" / "nsys"


def nsys_rank_prefix(run_dir) -> list:
    """The `nsys profile ...` arguments launch.py starts each rank process with.

    One rank process runs many rows (combinations x token counts), and the worker
    opens the NVTX range `timed` (CAPTURE_RANGE) around the timed work of each: so
    every occurrence of that range is a capture of its own (--capture-range-end=repeat)
    and nsys writes one report per row and rank, with nothing outside the timed work
    (start-up, building the layer, the correctness check, the memory probe) in it.
    `-o ranks_%p`: nsys puts the rank's process id for %p; see `nsys_rank_report`.
    """
    return _nsys_args(nsys_rank_dir(run_dir) / "ranks_%p", CAPTURE_RANGE, "repeat")


def nsys_rank_report(run_dir, pid: int, n: int) -> Path:
    """The report of the `n`-th capture (1, 2, ...) of rank process `pid`: with
    --capture-range-end=repeat nsys numbers its reports `<output>.<n>.nsys-rep`
    (and the SQLite exports `<output>.<n>.sqlite`)."""
    return nsys_rank_dir(run_dir) / f"ranks_{pid}.{n}.nsys-rep"


def nsys_command(argv: Sequence[str], output, combo_key: Optional[str] = None) -> list:
    """`argv` (the command that runs the rank(s)) wrapped under nsys; see `nsys_prefix`.

    Raises ValueError(NSYS_MISSING) when nsys is absent: callers check
    `nsys_available()` first and fall back to trace=torch.
    """
    if not nsys_available():
        raise ValueError(NSYS_MISSING)
    return nsys_prefix(output, combo_key) + [str(a) for a in argv]


def export_sqlite(report, timeout_s: float = 600) -> Path:
    """`nsys export --type sqlite` of a `.nsys-rep` report; returns the .sqlite path."""
    report = Path(report)
    if not nsys_available():
        raise ValueError(f"{report}: {NSYS_MISSING.split(':')[0]}: cannot export it to SQLite")
    out = report.with_suffix(".sqlite")
    subprocess.run(
        ["nsys", "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out), str(report)],
        check=True, timeout=timeout_s, capture_output=True,
    )
    return out


# -- parsing ------------------------------------------------------------------
def _pid(global_id) -> Optional[int]:
    """Process id from an nsys globalTid / globalPid (bits 24..47)."""
    return None if global_id is None else (int(global_id) >> 24) & 0xFFFFFF


def _connect(path) -> sqlite3.Connection:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as e:
        raise ValueError(f"{path}: not a readable SQLite file ({e})") from e
    if not tables & {"NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL"}:
        raise ValueError(f"{path}: no NVTX_EVENTS or CUPTI_ACTIVITY_KIND_KERNEL table: not an nsys SQLite export")
    con.row_factory = sqlite3.Row
    return con


def _columns(con, table: str) -> set:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def _has(con, table: str) -> bool:
    return con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone() is not None


def nsys_processes(path) -> list:
    """Process ids with GPU activity or NVTX ranges in the export (one per rank)."""
    con = _connect(path)
    try:
        pids = set()
        if _has(con, "CUPTI_ACTIVITY_KIND_KERNEL") and "globalPid" in _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL"):
            pids |= {_pid(r[0]) for r in con.execute("SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL")}
        if _has(con, "NVTX_EVENTS") and "globalTid" in _columns(con, "NVTX_EVENTS"):
            pids |= {_pid(r[0]) for r in con.execute("SELECT DISTINCT globalTid FROM NVTX_EVENTS")}
        return sorted(p for p in pids if p is not None)
    finally:
        con.close()


def _nvtx_ranges(con, strings: dict, pid: Optional[int], domain: str, notes: list) -> list:
    cols = _columns(con, "NVTX_EVENTS")
    text = "text" if "text" in cols else "NULL"
    text_id = "textId" if "textId" in cols else "NULL"
    dom = "domainId" if "domainId" in cols else "0"
    rows = con.execute(f"SELECT start, end, eventType, {text} AS text, {text_id} AS textId, "
                       f"globalTid, {dom} AS domainId FROM NVTX_EVENTS").fetchall()
    name_of = lambda r: r["text"] if r["text"] is not None else strings.get(r["textId"])  # noqa: E731
    wanted = {(_pid(r["globalTid"]), r["domainId"]) for r in rows
              if r["eventType"] == NVTX_DOMAIN_CREATE and name_of(r) == domain}
    if not wanted:
        notes.append(f"no NVTX domain {domain!r} in the report: using ranges of every domain")
    out = []
    for r in rows:
        if r["eventType"] not in NVTX_RANGE_TYPES or r["end"] is None or r["end"] < r["start"]:
            continue
        p = _pid(r["globalTid"])
        if pid is not None and p != pid:
            continue
        if wanted and (p, r["domainId"]) not in wanted:
            continue
        name = name_of(r)
        if name:
            out.append(Range(name, r["start"] / 1e3, r["end"] / 1e3, str(r["globalTid"])))
    return out


def _gpu_rows(con, strings: dict, pid: Optional[int]):
    """(name, kind, start_ns, end_ns, device, stream, correlation, pid) of kernels, copies and memsets."""
    if _has(con, "CUPTI_ACTIVITY_KIND_KERNEL"):
        cols = _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
        names = [c for c in ("demangledName", "shortName", "mangledName") if c in cols]
        sel = ", ".join(names) if names else "NULL"
        gp = "globalPid" if "globalPid" in cols else "NULL"
        txt = "name" if "name" in cols else "NULL"
        for r in con.execute(f"SELECT start, end, deviceId, streamId, correlationId, {gp}, {txt}, {sel} "
                             "FROM CUPTI_ACTIVITY_KIND_KERNEL"):
            ids = r[7:]
            name = next((strings[i] for i in ids if i in strings), None) or r[6] or "kernel"
            yield name, "kernel", r[0], r[1], r[2], r[3], r[4], _pid(r[5])
    for table, kind in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if not _has(con, table):
            continue
        cols = _columns(con, table)
        gp = "globalPid" if "globalPid" in cols else "NULL"
        ck = "copyKind" if "copyKind" in cols else "NULL"
        for r in con.execute(f"SELECT start, end, deviceId, streamId, correlationId, {gp}, {ck} FROM {table}"):
            name = f"Memcpy {_COPY_KIND.get(r[6], 'unknown')}" if kind == "memcpy" else "Memset"
            yield name, kind, r[0], r[1], r[2], r[3], r[4], _pid(r[5])


def parse_nsys_sqlite(path, pid: Optional[int] = None, domain: str = DOMAIN) -> Trace:
    """Parse an nsys SQLite export into an attributed `Trace` (µs).

    pid: keep one process (rank) only; by default everything in the report. NVTX
    ranges come from `domain` (every domain when the report has no such domain).
    """
    con = _connect(path)
    trace = Trace(source=str(path) if pid is None else f"{path}#pid{pid}", fmt="nsys")
    try:
        strings = dict(con.execute("SELECT id, value FROM StringIds").fetchall()) if _has(con, "StringIds") else {}
        if _has(con, "NVTX_EVENTS"):
            trace.ranges = _nvtx_ranges(con, strings, pid, domain, trace.notes)
        launches: dict = {}
        by_corr: dict = {}  # for exports without globalPid on kernels
        if _has(con, "CUPTI_ACTIVITY_KIND_RUNTIME"):
            for corr, gtid, start in con.execute(
                "SELECT correlationId, globalTid, start FROM CUPTI_ACTIVITY_KIND_RUNTIME"
            ):
                launches[(_pid(gtid), corr)] = by_corr[corr] = (str(gtid), start / 1e3)
        missing = 0
        for name, kind, s, e, dev, stream, corr, kpid in _gpu_rows(con, strings, pid):
            if pid is not None and kpid is not None and kpid != pid:
                continue
            launch = launches.get((kpid, corr))
            if launch is None and kpid is None:  # no globalPid column: match on correlation alone
                launch = by_corr.get(corr)
            missing += launch is None
            trace.kernels.append(Kernel(
                name=name, start_us=s / 1e3, end_us=e / 1e3, device=int(dev), stream=int(stream),
                correlation=corr, kind=kind,
                launch_thread=launch[0] if launch else None, launch_us=launch[1] if launch else None,
            ))
        if missing:
            trace.notes.append(f"{missing} GPU activities without a launch record: no phase for them")
    except sqlite3.DatabaseError as e:
        raise ValueError(f"{path}: unexpected nsys SQLite schema ({e})") from e
    finally:
        con.close()
    trace.kernels.sort(key=lambda k: k.start_us)
    return attribute(trace)
