"""Nsight Systems: the launch wrapper, the captures' manifest, and the parser of its SQLite export.

Launch: with trace=nsys, launch.py starts each rank process under
`nsys_rank_prefix(run_dir)`: `nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none
--capture-range=nvtx --nvtx-capture=moebench/timed --capture-range-end=repeat ...
--export=sqlite -o <run>/traces/nsys/ranks_%p`. `moebench/timed` is a range of the
default NVTX domain matched by its message (nsys's `range` form; `range@domain` names
another domain), which nsys matches only with NSYS_NVTX_PROFILER_REGISTER_ONLY=0 in the
profiled process, as moebench's messages are not registered strings. The worker opens it
(traces/nvtx.py `capture_range`, `moebench/combo/<key>` inside it) around the timed work of
each row, so every row is one capture: nsys writes `ranks_<pid>.<n>.*` for the n-th
capture of rank process <pid> (%p is the profiled process's id), as `.nsys-rep` + `.sqlite`
when it has its importer, as `.qdstrm` alone when it is a target-only install (the
Debian target on the GPU machine). The worker records each capture it opens in
`traces/nsys/captures_<pid>.jsonl` (`record_capture`); after the ranks exit,
traces/nsys_import.py `resolve_nsys_rows` sets each row's `trace_path` to the report
that exists, or its `trace_error` to why there is none. `nsys_command(argv, output,
combo_key)` wraps any other command so that the first `moebench/combo/<key>` range alone is
captured. When nsys is not on the PATH, `nsys_available()` is False and the caller prints
`NSYS_MISSING` and falls back to trace=torch.

Parse: `parse_nsys_sqlite(path)` reads the tables of `nsys export --type sqlite`
(names as in the Nsight Systems "SQLite Export Schema Reference"; timestamps ns):
- `NVTX_EVENTS` (start, end, eventType, text | textId -> StringIds, globalTid,
  domainId): push/pop ranges have eventType 59, start/end ranges 60 (70/71 for
  their payload variants); eventType 75 rows create a domain (text = its name).
  moebench's ranges are the `moebench/<name>` ones (the prefix dropped), or those of
  a domain `moebench` (reports of earlier versions);
- `CUPTI_ACTIVITY_KIND_KERNEL` (start, end, deviceId, streamId, correlationId,
  globalPid, demangledName / shortName -> StringIds), and `..._MEMCPY` /
  `..._MEMSET` where present;
- `CUPTI_ACTIVITY_KIND_RUNTIME` (start, end, correlationId, globalTid): the launch
  calls (runtime and driver API);
- `StringIds` (id, value).
globalTid / globalPid carry the process id in bits 24..47, a globalTid the thread id in bits
0..23: a thread is "pid/tid", as in torch traces. It yields the same
`Trace` as the torch parser, so both share one metrics code path.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Optional, Sequence

from moebench.traces.model import CAPTURE_RANGE, COMBO_PREFIX, DOMAIN, Kernel, Range, Trace, attribute
from moebench.util.safe_write import append_text, safe_dir

NSYS_MISSING = "nsys not found on PATH: writing the torch trace instead; install Nsight Systems to get nsys reports"
# moebench's NVTX ranges: default domain, messages `moebench/<name>` (traces/nvtx.py)
NVTX_PREFIX = f"{DOMAIN}/"
# what keeps a capture small: CUDA + NVTX only, no CPU sampling (2 GB -> 1.9 MB on a small program)
CAPTURE_FLAGS = ("--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none")
DEFAULT_MAX_TRACE_MB = 256.0  # `moebench trace` refuses larger traces (inflated size)
NVTX_RANGE_TYPES = (59, 60, 70, 71)  # PushPop, StartEnd (+ payload variants)
NVTX_DOMAIN_CREATE = 75
# CUPTI_ACTIVITY_MEMCPY_KIND -> the names torch gives the same copies
_COPY_KIND = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}


def nsys_available() -> bool:
    """Whether an `nsys` executable is on the PATH."""
    return shutil.which("nsys") is not None


def nsys_output(trace_dir, combo_key: str, rank: Optional[int] = None) -> Path:
    """Report path without extension: `{trace_dir}/{combo_key}/nsys[_rank{rank}]` (nsys adds .nsys-rep, .sqlite)."""
    return Path(trace_dir) / combo_key / ("nsys" if rank is None else f"nsys_rank{rank}")


def _nsys_args(output, nvtx_range: Optional[str], end: str) -> list:
    """`nsys profile` options; with `nvtx_range`, capture only while the default-domain NVTX range
    `moebench/<nvtx_range>` is open (`end`: what nsys does when it closes)."""
    args = [
        "nsys",
        "profile",
        *CAPTURE_FLAGS,
        "--cuda-graph-trace=node",
        "--export=sqlite",
        "--force-overwrite=true",
        # match NVTX messages that were not registered strings too (all of moebench's)
        "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0",
    ]
    if nvtx_range is not None:
        # `range` alone names the default domain; a literal '@' would need a backslash
        capture = (NVTX_PREFIX + nvtx_range).replace("@", "\\@")
        args += ["--capture-range=nvtx", f"--nvtx-capture={capture}", f"--capture-range-end={end}"]
    return args + ["-o", str(output)]


def nsys_prefix(output, combo_key: Optional[str] = None) -> list:
    """The `nsys profile ...` arguments that go before the profiled command.

    With `combo_key`, capture only the NVTX range `moebench/combo/<key>` (its first
    occurrence); without, the whole run. Kernels inside CUDA graphs are traced node by
    node; a full install also exports the report to `<output>.sqlite`.
    """
    return _nsys_args(output, None if combo_key is None else f"{COMBO_PREFIX}{combo_key}", "stop")


def nsys_rank_dir(run_dir) -> Path:
    """Where the ranks' nsys captures go: `<run>/traces/nsys`."""
    return Path(run_dir) / "traces" / "nsys"


def nsys_rank_prefix(run_dir) -> list:
    """The `nsys profile ...` arguments launch.py starts each rank process with.

    One rank process runs many rows (combinations x token counts), and the worker
    opens the NVTX range `moebench/timed` (CAPTURE_RANGE) around the timed work of each:
    so every occurrence of that range is a capture of its own (--capture-range-end=repeat)
    and nsys writes one report per row and rank, with nothing outside the timed work
    (start-up, building the layer, the correctness check, the memory probe) in it.
    `-o ranks_%p`: nsys puts the rank's process id for %p; see `nsys_capture_stem`.
    """
    return _nsys_args(nsys_rank_dir(run_dir) / "ranks_%p", CAPTURE_RANGE, "repeat")


def nsys_capture_stem(run_dir, pid: int, n: int) -> Path:
    """The files of the `n`-th capture (1, 2, ...) of rank process `pid`, without suffix: with
    --capture-range-end=repeat nsys writes `ranks_<pid>.<n>.qdstrm`, and, with its importer,
    `.nsys-rep` and (--export=sqlite) `.sqlite` beside it."""
    return nsys_rank_dir(run_dir) / f"ranks_{pid}.{n}"


def capture_manifest(run_dir, pid: int) -> Path:
    """`traces/nsys/captures_<pid>.jsonl`: one line per capture range rank process `pid` opened."""
    return nsys_rank_dir(run_dir) / f"captures_{pid}.jsonl"


def record_capture(
    run_dir, pid: int, n: Optional[int], combo_key: str, tokens: int, rank: int, api: Optional[str]
) -> dict:
    """Append one capture to the rank process's manifest and return the entry: `stem` (relative
    to the run; None when no range was pushed, n None) and `api` (what pushed the range, None
    for none) are what traces/nsys_import.py needs to say which report a row has, or why none."""
    stem = os.path.relpath(nsys_capture_stem(run_dir, pid, n), run_dir) if n is not None else None
    entry = {
        "pid": pid,
        "n": n,
        "stem": stem,
        "combo_key": combo_key,
        "tokens_per_rank": int(tokens),
        "rank": int(rank),
        "api": api,
    }
    path = capture_manifest(run_dir, pid)
    safe_dir(run_dir, *path.parent.relative_to(Path(run_dir)).parts)  # never through a link (safe_write)
    append_text(path, json.dumps(entry, sort_keys=True) + "\n")
    return entry


def nsys_command(argv: Sequence[str], output, combo_key: Optional[str] = None) -> list:
    """`argv` (the command that runs the rank(s)) wrapped under nsys; see `nsys_prefix`.

    Raises ValueError(NSYS_MISSING) when nsys is absent: callers check
    `nsys_available()` first and fall back to trace=torch.
    """
    if not nsys_available():
        raise ValueError(NSYS_MISSING)
    return nsys_prefix(output, combo_key) + [str(a) for a in argv]


# -- parsing ------------------------------------------------------------------
def _pid(global_id) -> Optional[int]:
    """Process id from an nsys globalTid / globalPid (bits 24..47)."""
    return None if global_id is None else (int(global_id) >> 24) & 0xFFFFFF


def _thread(global_tid) -> str:
    """The "pid/tid" of an nsys globalTid (the thread id in bits 0..23), as torch traces name a thread."""
    return str(global_tid) if global_tid is None else f"{_pid(global_tid)}/{int(global_tid) & 0xFFFFFF}"


def check_size(path, max_mb: Optional[float]) -> None:
    """ValueError when file `path` is larger than `max_mb` MB (None: no limit)."""
    size = Path(path).stat().st_size
    if max_mb is not None and size > max_mb * 1e6:
        raise ValueError(
            f"{path}: {size / 1e6:.0f} MB is over the {max_mb:g} MB limit on a trace (--max-trace-mb raises it)"
        )


def _connect(path, max_mb: Optional[float] = DEFAULT_MAX_TRACE_MB) -> sqlite3.Connection:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    check_size(path, max_mb)
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


def nsys_processes(path, max_mb: Optional[float] = DEFAULT_MAX_TRACE_MB) -> list:
    """Process ids with GPU activity or NVTX ranges in the export (one per rank)."""
    con = _connect(path, max_mb)
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
    rows = con.execute(
        f"SELECT start, end, eventType, {text} AS text, {text_id} AS textId, "
        f"globalTid, {dom} AS domainId FROM NVTX_EVENTS"
    ).fetchall()
    name_of = lambda r: r["text"] if r["text"] is not None else strings.get(r["textId"])
    prefix = f"{domain}/"
    # reports of earlier versions: ranges of an NVTX domain `moebench`, names unprefixed
    legacy = {
        (_pid(r["globalTid"]), r["domainId"])
        for r in rows
        if r["eventType"] == NVTX_DOMAIN_CREATE and name_of(r) == domain
    }
    ranges = [
        r
        for r in rows
        if r["eventType"] in NVTX_RANGE_TYPES
        and r["end"] is not None
        and r["end"] >= r["start"]
        and (pid is None or _pid(r["globalTid"]) == pid)
    ]
    ours = legacy or any((name_of(r) or "").startswith(prefix) for r in ranges)
    if not ours:
        notes.append(f"no {prefix}… NVTX range (nor a domain {domain!r}) in the report: using every range")
    out = []
    for r in ranges:
        name = name_of(r)
        if not name:
            continue
        if name.startswith(prefix):
            name = name[len(prefix) :]
        elif ours and (_pid(r["globalTid"]), r["domainId"]) not in legacy:
            continue
        out.append(Range(name, r["start"] / 1e3, r["end"] / 1e3, _thread(r["globalTid"])))
    return out


def _gpu_rows(con, strings: dict, pid: Optional[int]):
    """(name, kind, start_ns, end_ns, device, stream, correlation, pid) of kernels, copies and memsets."""
    if _has(con, "CUPTI_ACTIVITY_KIND_KERNEL"):
        cols = _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
        names = [c for c in ("demangledName", "shortName", "mangledName") if c in cols]
        sel = ", ".join(names) if names else "NULL"
        gp = "globalPid" if "globalPid" in cols else "NULL"
        txt = "name" if "name" in cols else "NULL"
        for r in con.execute(
            f"SELECT start, end, deviceId, streamId, correlationId, {gp}, {txt}, {sel} FROM CUPTI_ACTIVITY_KIND_KERNEL"
        ):
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


def parse_nsys_sqlite(
    path, pid: Optional[int] = None, domain: str = DOMAIN, max_mb: Optional[float] = DEFAULT_MAX_TRACE_MB
) -> Trace:
    """Parse an nsys SQLite export into an attributed `Trace` (µs).

    pid: keep one process (rank) only; by default everything in the report. NVTX
    ranges: the `<domain>/<name>` ones, named `<name>` (or those of an NVTX domain
    `domain`; every range when the report has neither). max_mb: refuse larger files.
    """
    con = _connect(path, max_mb)
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
                launches[(_pid(gtid), corr)] = by_corr[corr] = (_thread(gtid), start / 1e3)
        missing = 0
        for name, kind, s, e, dev, stream, corr, kpid in _gpu_rows(con, strings, pid):
            if pid is not None and kpid is not None and kpid != pid:
                continue
            launch = launches.get((kpid, corr))
            if launch is None and kpid is None:  # no globalPid column: match on correlation alone
                launch = by_corr.get(corr)
            missing += launch is None
            trace.kernels.append(
                Kernel(
                    name=name,
                    start_us=s / 1e3,
                    end_us=e / 1e3,
                    device=int(dev),
                    stream=int(stream),
                    correlation=corr,
                    kind=kind,
                    launch_thread=launch[0] if launch else None,
                    launch_us=launch[1] if launch else None,
                )
            )
        if missing:
            trace.notes.append(f"{missing} GPU activities without a launch record: no phase for them")
    except sqlite3.DatabaseError as e:
        raise ValueError(f"{path}: unexpected nsys SQLite schema ({e})") from e
    finally:
        con.close()
    trace.kernels.sort(key=lambda k: k.start_us)
    return attribute(trace)
