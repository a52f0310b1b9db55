"""nsys captures to SQLite exports, and which report each trace=nsys row has (or why none).

- `host_tools()`: QdstrmImporter and an `nsys` that can export, from MOEBENCH_QDSTRM_IMPORTER,
  the PATH, or the install of scripts/install_nsys.sh (`.deps/nsys-host/`).
- `import_capture(path)`: `<stem>.qdstrm[.xz]` -> `<stem>.nsys-rep` (QdstrmImporter) ->
  `<stem>.sqlite` (`nsys export --type sqlite`); a `.nsys-rep` alone is exported.
- `resolve_nsys_rows(run_dir)`: for every nsys-traced row, from the captures the workers
  recorded (`traces/nsys/captures_<pid>.jsonl`, traces/nsys.py `record_capture`) and the
  files present: `trace_path` = the rank-0 capture's `.sqlite` (else its `.nsys-rep`) that
  exists, or "" with `trace_error` saying why; `nsys_capture` = the raw capture's file
  (`.qdstrm[.xz]`) when that is all there is. Row files are rewritten atomically.
- `import_command(target)`: `moebench trace --import DIR_OR_FILE`, both of the above.
- `nsys_info()`: which nsys is on the PATH, its version, and whether it can trace here.
"""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from moebench.config.paths import REPO_ROOT
from moebench.results.row import Status
from moebench.traces.nsys import nsys_rank_dir
from moebench.util.safe_write import refuse_links

RAW_SUFFIXES = (".qdstrm", ".qdstrm.xz")
INSTALL_HINT = (
    "scripts/install_nsys.sh --download installs them into .deps/nsys-host/ (a Debian machine "
    "with the package registry), or set MOEBENCH_QDSTRM_IMPORTER"
)
TOOL_TIMEOUT_S = 900


@dataclass(frozen=True)
class HostTools:
    """The importer and exporter of one Nsight Systems host install, and the environment they run in."""

    importer: str
    nsys: str
    env: dict


def _host_root() -> Path:
    return Path(os.environ.get("NSYS_HOST_DIR", REPO_ROOT / ".deps" / "nsys-host"))


def host_tools() -> HostTools:
    """Find QdstrmImporter and the `nsys` of the same install; ValueError (with the fix) when absent."""
    importer = os.environ.get("MOEBENCH_QDSTRM_IMPORTER") or shutil.which("QdstrmImporter")
    if not importer:
        found = sorted(_host_root().glob("usr/lib/*/host-linux-x64/QdstrmImporter")) + sorted(
            _host_root().glob("usr/lib/*/*/host-linux-x64/QdstrmImporter")
        )
        importer = str(found[0]) if found else None
    if not importer or not os.access(importer, os.X_OK):
        raise ValueError(f"no QdstrmImporter (Nsight Systems' host package): {INSTALL_HINT}")
    host = Path(importer).resolve().parent
    pkg = host.parent  # .../nsight-systems/{host,target}-linux-x64
    bundled = pkg / "target-linux-x64" / "nsys"
    nsys = str(bundled) if bundled.is_file() else shutil.which("nsys")
    if not nsys:
        raise ValueError(f"no nsys beside {importer} nor on PATH to export SQLite with: {INSTALL_HINT}")
    libs = [str(host)]
    # Debian's layout: libarrow/libparquet/libssh unpacked beside, in usr/lib/<multiarch>
    libs += [
        str(d)
        for d in sorted(pkg.parent.glob("*-linux-gnu")) + sorted(pkg.parent.parent.glob("*-linux-gnu"))
        if d.is_dir()
    ]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    return HostTools(importer, nsys, env)


def _stem(path: Path) -> Path:
    """`x/ranks_1.2` of `x/ranks_1.2.qdstrm[.xz]`, `.nsys-rep`, `.sqlite`."""
    name = path.name
    for suf in (".qdstrm.xz", ".qdstrm", ".nsys-rep", ".sqlite"):
        if name.endswith(suf):
            return path.with_name(name[: -len(suf)])
    return path


def _run(cmd: list, tools: HostTools, what: str) -> None:
    p = subprocess.run(cmd, env=tools.env, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise ValueError(f"{what} failed (exit {p.returncode}): {' / '.join(tail) or 'no output'}")


def import_capture(path, tools: Optional[HostTools] = None) -> Path:
    """The SQLite export of one capture (`.qdstrm`, `.qdstrm.xz` or `.nsys-rep`), made if missing.

    An `.xz` is inflated next to itself for the importer and the inflated copy removed after.
    Raises ValueError with what failed.
    """
    path = Path(path)
    stem = _stem(path)
    sqlite = stem.with_name(stem.name + ".sqlite")
    if sqlite.is_file() and sqlite.stat().st_size > 0:
        return sqlite
    tools = tools or host_tools()
    rep = stem.with_name(stem.name + ".nsys-rep")
    # the importer and nsys write these by name: none may be a link out of the run folder
    refuse_links(stem.parent, [stem.name + s for s in (".qdstrm", ".nsys-rep", ".sqlite")])
    inflated = None
    try:
        if not rep.is_file():
            raw = stem.with_name(stem.name + ".qdstrm")
            if not raw.is_file():
                xz = stem.with_name(stem.name + ".qdstrm.xz")
                if not xz.is_file():
                    raise ValueError(f"{stem}: no .qdstrm, .qdstrm.xz or .nsys-rep to import")
                inflated = raw
                try:
                    with lzma.open(xz) as src, open(raw, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                except (lzma.LZMAError, EOFError, OSError) as e:
                    raise ValueError(f"{xz}: not a readable xz file ({e})") from e
            _run([tools.importer, "-f", "-i", str(raw), "-o", str(rep)], tools, f"QdstrmImporter on {raw.name}")
            if not rep.is_file():
                raise ValueError(f"QdstrmImporter wrote no {rep.name}")
        _run(
            [tools.nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(sqlite), str(rep)],
            tools,
            f"nsys export of {rep.name}",
        )
        if not sqlite.is_file():
            raise ValueError(f"nsys export wrote no {sqlite.name}")
    finally:
        if inflated is not None and inflated.exists():
            inflated.unlink()
    return sqlite


# -- rows ---------------------------------------------------------------------------------
def read_captures(run_dir) -> dict:
    """(combo_key, tokens_per_rank, rank) -> the last capture entry the workers recorded for it."""
    out: dict = {}
    files = sorted(nsys_rank_dir(run_dir).glob("captures_*.jsonl"), key=lambda p: p.stat().st_mtime)
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                e = json.loads(line)
                out[(e["combo_key"], int(e["tokens_per_rank"]), int(e["rank"]))] = e
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a killed rank
    return out


def capture_state(run_dir, entry: dict) -> tuple:
    """(trace_path, trace_error, nsys_capture) of one recorded capture, paths relative to the run."""
    run = Path(run_dir)
    if entry.get("stem") is None:
        return (
            "",
            (
                "no NVTX capture range was opened for this row: the rank had no NVTX API (no CUDA and no "
                "nvtx package), so nsys captured nothing"
            ),
            "",
        )
    stem = run / entry["stem"]
    rel = lambda p: os.path.relpath(p, run)
    for suf in (".sqlite", ".nsys-rep"):
        p = stem.with_name(stem.name + suf)
        if p.is_file() and p.stat().st_size > 0:
            return (
                rel(p),
                (
                    ""
                    if suf == ".sqlite"
                    else "report not exported to SQLite yet: run `moebench trace --import` on the run"
                ),
                "",
            )
    for suf in RAW_SUFFIXES:
        p = stem.with_name(stem.name + suf)
        if p.is_file():
            return (
                "",
                (
                    f"captured as {rel(p)} only: the nsys that ran has no importer (a target-only install); "
                    "run `moebench trace --import <run>` where scripts/install_nsys.sh installed the host "
                    "tools"
                ),
                rel(p),
            )
    if entry.get("api") == "nvtx package":
        why = (
            "the capture range went through the nvtx package (no CUDA here), whose ranges Nsight Systems "
            "2024.2 does not record: no capture opened"
        )
    else:
        why = (
            f"nsys wrote no file for capture {entry.get('n')} of rank process {entry.get('pid')} "
            f"({entry.get('stem')}.*): the rank was killed before nsys wrote it, or nsys failed"
        )
    return "", why, ""


def _legacy_entry(trace_path: str) -> Optional[dict]:
    """A capture entry from a row of an earlier version, which named the report nsys would write
    (`traces/nsys/ranks_<pid>.<n>.nsys-rep`) without looking."""
    m = re.fullmatch(r"(traces/nsys/ranks_(\d+)\.(\d+))\.(?:nsys-rep|sqlite)", trace_path or "")
    return {"stem": m[1], "pid": int(m[2]), "n": int(m[3]), "api": None} if m else None


def resolve_nsys_rows(run_dir) -> dict:
    """Set `trace_path` / `trace_error` / `nsys_capture` of every nsys-traced row of a run from
    the captures and the files present (module docstring). A row is nsys-traced when a worker
    recorded a capture for it (or, from earlier versions, its `trace_path` names a report under
    traces/nsys/); the others (trace=torch, the torch-trace fallback without nsys, rows that
    did not measure) are left alone. Returns counts: {"report": n, "raw": n, "none": n}."""
    import pyarrow as pa

    from moebench.results.store import RunStore

    run = Path(run_dir)
    captures = read_captures(run)
    counts = {"report": 0, "raw": 0, "none": 0}

    def update(table):
        cols = table.column_names
        if "combo_key" not in cols or "tokens_per_rank" not in cols:
            return None
        rows = table.select([c for c in ("combo_key", "tokens_per_rank", "status") if c in cols]).to_pylist()
        old = {
            c: table.column(c).to_pylist() if c in cols else [""] * len(rows)
            for c in ("trace_path", "trace_error", "nsys_capture")
        }
        new = {c: list(v) for c, v in old.items()}
        for i, r in enumerate(rows):
            if r.get("status", Status.OK) != Status.OK:
                continue
            entry = captures.get((r["combo_key"], int(r["tokens_per_rank"]), 0)) or _legacy_entry(old["trace_path"][i])
            if entry is None:
                continue
            path, why, raw = capture_state(run, entry)
            new["trace_path"][i], new["trace_error"][i], new["nsys_capture"][i] = path, why, raw
            counts["report" if path else "raw" if raw else "none"] += 1
        if new == old:
            return None
        for c, values in new.items():
            arr = pa.array([v if v is not None else "" for v in values], pa.string())
            table = table.set_column(cols.index(c), c, arr) if c in cols else table.append_column(c, arr)
            cols = table.column_names
        return table

    RunStore(run).update_rows(update)  # the caller holds the run's lock (a sweep, or import_command)
    return counts


def find_captures(target) -> list:
    """Raw captures and unexported reports under `target` (or `target` itself), one per stem:
    `.qdstrm` before `.qdstrm.xz`, a `.nsys-rep` only without either."""
    p = Path(target)
    if not p.exists():
        raise ValueError(f"{p}: no such file or directory")
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    by_stem: dict = {}
    for f in files:
        for rank, suf in enumerate((".qdstrm", ".qdstrm.xz", ".nsys-rep")):
            if f.name.endswith(suf):
                st = _stem(f)
                if st not in by_stem or rank < by_stem[st][0]:
                    by_stem[st] = (rank, f)
    if p.is_file() and not by_stem:
        raise ValueError(f"{p}: not a capture (expected .qdstrm, .qdstrm.xz or .nsys-rep)")
    return [f for _, f in sorted(by_stem.values(), key=lambda v: str(v[1]))]


def import_command(target) -> int:
    """`moebench trace --import DIR_OR_FILE`: export every capture found (one line each), then
    update the rows of the run(s) they belong to. Returns 0 when every capture was exported,
    1 when some failed (each says why); ValueError (exit 2) without captures (none under the target and
    no nsys-traced row in its run) or tools; a row file
    of those runs that may not be read is Unreadable (exit 2, naming it) before anything is done."""
    from moebench.results.store import RunStore, enclosing_run  # pandas, pyarrow: only where a run is looked for
    from moebench.results.store_read import refuse_broken_link

    refuse_broken_link(target)  # a link that loops or dangles: said so, not "no such file or directory"
    captures = find_captures(target)
    found = [enclosing_run(p.resolve()) for p in (Path(target), *captures)]
    runs = {r for r in found if r is not None}
    if not captures and not runs:
        raise ValueError(f"{target}: no .qdstrm, .qdstrm.xz or .nsys-rep under it, and not a run directory")
    for run in sorted(runs):
        RunStore(run).refuse_unreadable()  # before any export: rows not read never name theirs
    failed = 0
    tools = host_tools() if captures else None
    for c in captures:
        try:
            out = import_capture(c, tools)
            print(f"{c}: {out} ({out.stat().st_size / 1e6:.1f} MB)")
        except (ValueError, subprocess.TimeoutExpired) as e:
            failed += 1
            print(f"{c}: not imported: {e}")
    for run in sorted(runs):
        from moebench.results.lock import RunLock

        lock = RunLock.acquire(run)  # rows are rewritten: not beside a sweep writing the same folder
        try:
            counts = resolve_nsys_rows(run)
        finally:
            lock.release()
        if not captures and not any(counts.values()):  # nothing written: no row was nsys-traced
            raise ValueError(
                f"{run}: no Nsight Systems capture under it and none of its rows was traced with nsys: "
                "nothing to import (sweep with trace.name=nsys to record one; `moebench trace RUN` reads torch traces)"
            )
        print(
            f"{run}: rows with a report {counts['report']}, with a raw capture only {counts['raw']}, "
            f"without {counts['none']}"
        )
    return 1 if failed else 0


# -- which nsys ------------------------------------------------------------------------------
def _driver_cuda() -> Optional[str]:
    """The CUDA version the driver supports ("13.0"), from nvidia-smi's banner, or None."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"CUDA Version:\s*([\d.]+)", out)
    return m[1] if m else None


def nsys_info(driver_cuda: Optional[str] = "detect") -> dict:
    """{"path", "version", "kind", "note"} of the nsys on the PATH (path None when there is none).

    kind: "ncu-bundled" (the copy inside Nsight Compute: writes a .qdstrm it cannot import,
    and collects no CUDA events), "target" (no importer beside it: captures .qdstrm for
    `moebench trace --import`), "full". note: whether it can trace this driver.
    """
    path = shutil.which("nsys")
    if path is None:
        return {
            "path": None,
            "version": None,
            "kind": None,
            "note": "not on PATH: trace=nsys falls back to trace=torch (scripts/install_nsys.sh)",
        }
    real = os.path.realpath(path)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        out = f"({type(e).__name__})"
    m = re.search(r"(\d{4}\.\d+\.\d+(?:\.\d+)?)", out)
    version = m[1] if m else out.strip()[:60] or None
    here = Path(real).parent
    notes = []
    if "nsight-compute" in real.lower() or "nsight_compute" in real.lower():
        kind = "ncu-bundled"
        notes.append(
            "the nsys inside Nsight Compute collects no CUDA events and cannot import its .qdstrm: "
            "use the Nsight Systems target (scripts/install_nsys.sh --target-env)"
        )
    elif (here.parent / "host-linux-x64" / "QdstrmImporter").exists() or shutil.which("QdstrmImporter"):
        kind = "full"
    else:
        kind = "target"
        notes.append("target only: writes .qdstrm captures; bring them back and run `moebench trace --import`")
    if driver_cuda == "detect":
        driver_cuda = _driver_cuda()
    year = int(version[:4]) if version and version[:4].isdigit() else None
    if driver_cuda and year is not None and kind != "ncu-bundled":
        major = int(driver_cuda.split(".")[0])
        if year <= 2023 and major >= 13:
            notes.append(
                f"a {year} build under a CUDA {driver_cuda} driver: seen to miss most kernels "
                "(cuBLAS launches): not usable; use 2024.2.3"
            )
        elif year <= 2024 and major >= 13:
            notes.append(
                f"a {version} build under a CUDA {driver_cuda} driver: works, with nsys's note that it "
                "collects with its CUDA 12.5 libraries (every kernel seen on the H200 image)"
            )
    return {"path": path, "version": version, "kind": kind, "note": "; ".join(notes)}
