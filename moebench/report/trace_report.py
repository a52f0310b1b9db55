"""`moebench trace RUN_OR_FILE [--plot] [--out DIR] [--max-trace-mb N]`: phases, streams and
overlap of traces; `moebench trace --import DIR_OR_CAPTURE`: nsys captures to SQLite exports.

The overlap table gives, per trace, the shared experts alone and in the layer, the
communication alone and in the layer (and its stretch), their window and intersection,
the exposed time, `trace_overlap_fraction` (stretch-aware when the trace holds ablation
samples, else the plain intersection figure, with a note saying so) and the plain
`intersection_fraction`; definitions in moebench/traces/metrics.py.

A target is a trace file (`.json`, `.json.gz` from torch; `.sqlite` from `nsys
export`), a run directory, in which case every trace under `<run>/traces/` is read
(or, with another `trace.dir`, under the folders its rows' trace paths name), or any
other folder of traces (`<run>/traces/<combo>/`), read whole. A run directory
without its traces (a trace=none run; a results/ folder, which omits them) is an
error that says which. A trace larger than `--max-trace-mb` (default 256 MB, inflated;
checked while inflating) or nested deeper than Python's recursion limit is refused with
one line. Bad input raises ValueError (the CLI turns it into exit code 2).

`--import` (traces/nsys_import.py `import_command`): the `.qdstrm[.xz]` captures that a
target-only nsys wrote (the GPU machine's), brought back to a machine with the host tools
(scripts/install_nsys.sh), become `.nsys-rep` + `.sqlite`, and the rows of their run name
the exports (or say why not).

Combinations are named by their rows' `label` (the run's rows, `combo_labels`), the key beside
it; a trace of no row keeps its key. A trace with nothing to overlap (a CPU run, one rank) gets
one line saying so instead of a table of dashes, and no empty figure is written (one line says
why). `--plot` writes through moebench/util/safe_write.py: beside the traces, no folder between the
target and the PNG may be a link (a symlinked `traces/` is refused, one line, exit 2: give
`--out DIR`); under `--out`, the same below it. The folders and the PNG names are checked before
any trace is read, and a folder is made only when a PNG is drawn into it: a trace that fails to
read leaves no empty folder behind.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Optional

from moebench.report.mdsafe import md_code, md_text
from moebench.report.trace_markdown import fmt_figure, to_markdown
from moebench.results.store import RunStore, enclosing_run, is_run_dir, not_a_run_file
from moebench.traces.files import TRACE_SUFFIXES, is_trace_file, load_traces
from moebench.traces.matched import matched_overlap
from moebench.traces.metrics import TraceSummary, summarize
from moebench.traces.model import Trace
from moebench.traces.nsys import DEFAULT_MAX_TRACE_MB
from moebench.util.safe_write import check_dir_below, refuse_links, safe_dir_below
from moebench.util.words import counted


def _row_trace_paths(run: Path) -> list:
    """The trace files a run's rows name (`trace_path`, `profiler_trace_path`: relative to
    the run), read through the store; torn row files are passed over, one that may not be read
    is Unreadable (exit 2, naming it)."""
    df = RunStore(run).column_values(["trace_path", "profiler_trace_path"])
    return sorted({v for c in df.columns for v in df[c] if isinstance(v, str) and v})


def combo_labels(target) -> dict:
    """{combo_key: label} from the rows of the run `target` is or lies in ({} for none); torn
    row files and rows without a label are passed over, a row file that may not be read is
    Unreadable (exit 2, naming it): its rows are not left unlabelled unsaid."""
    run = enclosing_run(target)  # a trace file, a combination's folder, traces/, the run
    df = RunStore(run).column_values(["combo_key", "label"]) if run is not None else None
    out: dict = {}
    if df is None or not {"combo_key", "label"} <= set(df.columns):
        return out
    for key, label in zip(df["combo_key"], df["label"], strict=True):
        if key and label:
            out.setdefault(str(key), str(label))
    return out


def _key_of(path: Path, summary: Optional[TraceSummary], labels: dict) -> Optional[str]:
    """The combination key of a trace: the one its ranges name, else its folder's name (the
    sweep writes `traces/<combo_key>/`) where a row has that key."""
    keys = list(summary.combos) if summary is not None else []
    known = [k for k in keys if k in labels]
    if known:
        return known[0]
    return path.parent.name if path.parent.name in labels else (keys[0] if keys else None)


def _rows_read_traces(run: Path) -> bool:
    """Whether a run's rows hold figures read from traces (`trace_overlap_method`) though they
    name no trace file: traces not kept (committed rows name only files that are there)."""
    df = RunStore(run).column_values(["trace_overlap_method"])
    return "trace_overlap_method" in df.columns and any(bool(v) for v in df["trace_overlap_method"] if v is not None)


def _trace_roots(p: Path) -> list:
    """Folders to read traces from for directory `p`: `<p>/traces/`; for a run directory
    without one, the top folders its rows' trace paths name (another `trace.dir`) that
    exist, else a ValueError saying why the traces are absent; any other folder: itself."""
    if (p / "traces").is_dir():
        return [p / "traces"]
    if not is_run_dir(p):
        return [p]
    named = _row_trace_paths(p)
    # a trace.dir outside the run (a path starting with ..) is not searched: its parent holds other runs
    roots = sorted(
        {
            p / Path(n).parts[0]
            for n in named
            if len(Path(n).parts) > 1 and not Path(n).is_absolute() and Path(n).parts[0] != ".."
        }
    )
    here = [r for r in roots if r.is_dir()]
    if here:
        return here
    if named:
        raise ValueError(
            f"{p} has no traces/ folder: its rows name {counted(len(named), 'trace file')} (e.g. {named[0]}) that are "
            "not here; results/ folders omit them: copy the run's traces/ from where it ran, or re-run with "
            "trace=torch"
        )
    if _rows_read_traces(p):
        raise ValueError(
            f"{p} has no traces/ folder and its rows name no trace file, though they hold figures read from "
            "traces: the traces were not kept (results/ folders omit them; see the run's caveats.md): re-run "
            "with trace=torch"
        )
    raise ValueError(
        f"{p} has no traces/ folder and its rows name no trace file: they were measured with trace=none "
        "(or nvtx, which leaves ranges for an external profiler only); re-run with trace=torch or trace=nsys"
    )


def _plot_dir(path: Path, out: Optional[str], root: Optional[Path]) -> Path:
    """The folder a timeline PNG of `path` goes to: beside it, or under `out` mirroring the layout below `root`."""
    if out is None:
        return path.parent
    rel = path.parent.relative_to(root) if root is not None and path.is_relative_to(root) else Path()
    return Path(out) / rel


def _plot_path(trace: Trace, path: Path, out: Optional[str], root: Optional[Path], base: Optional[str] = None) -> Path:
    """Where a timeline PNG of `path` goes (`_plot_dir`), named `base` or after the trace."""
    if base is None:
        name = Path(trace.source.split("#")[0]).name
        suffix = trace.source.split("#")[1] if "#" in trace.source else ""
        base = f"{name}{'.' + suffix if suffix else ''}.timeline.png"
    return _plot_dir(path, out, root) / base


def _plot_base(target: Path, out: Optional[str]) -> Path:
    """The folder below which no folder on the way to a PNG may be a link: `out`, else the target's."""
    return Path(out) if out is not None else (target if target.is_dir() else target.parent)


def _made(base: Path, png: Path) -> Path:
    """`png`, its folder made below `base` (safe_write.safe_dir_below) now that it is drawn."""
    safe_dir_below(base, png.parent)
    return png


def _check_plots(base: Path, files: list, out: Optional[str], roots) -> None:
    """Before any trace is read: every folder the PNGs go to checked, nothing made (no link between
    the target, or `out`, and it; a file in the way; a read-only folder), and the PNG names known in
    advance checked for links (safe_write: LinkRefused, exit 2). A folder is made only when a PNG is
    drawn into it (`_made`): a trace that fails to read leaves none behind. `base`: _plot_base's."""
    for f in files:
        f = Path(f)
        root = next((r for r in roots or () if f.is_relative_to(r)), None)
        d = check_dir_below(base, _plot_dir(f, out, root))
        m = _RANK_FILE.fullmatch(f.name)
        refuse_links(
            d,
            [f"{f.name}.timeline.png", f"{f.name}.ranks.timeline.png"] + ([f"T{m[2]}.ranks.timeline.png"] if m else []),
        )


def _title(label: Optional[str], path: Path, trace: Trace, several: bool) -> Optional[str]:
    """'naive/torch/... — rank 1, 16 tokens' for a trace of a labelled combination (plain text)."""
    if label is None:
        return None
    m = _RANK_FILE.fullmatch(path.name)
    what = f"rank {m[1]}, {m[2]} tokens" if m else path.name
    return f"{label} — {what}" + (f" ({trace.source.split('#')[-1]})" if several else "")


def trace_command(
    target: Optional[str],
    plot: bool = False,
    out: Optional[str] = None,
    max_trace_mb: Optional[float] = DEFAULT_MAX_TRACE_MB,
) -> int:
    """Print per-phase durations, the stream timeline and shared/comm overlap of `target`.

    plot: also write `<trace>.timeline.png` next to each trace (or under `out`,
    mirroring the layout below the run's traces/ folder) and print its path; several
    ranks of one combination and token count also get one figure with the ranks stacked.
    max_trace_mb: refuse traces larger than this once inflated (<= 0 or None: no limit).
    Returns 0; raises ValueError for a missing path or an
    unreadable trace file (in a run directory, unreadable traces are reported on stderr and
    skipped unless none is readable).
    """
    if target is None:
        raise ValueError("give a trace file or a run directory (or --import DIR)")
    if max_trace_mb is not None and max_trace_mb <= 0:
        max_trace_mb = None
    files = find_traces(target)
    tp = Path(target)
    roots = None if tp.is_file() else _trace_roots(tp)
    base = _plot_base(tp, out)
    if plot:
        _check_plots(base, files, out, roots)
    labels = combo_labels(tp)
    errors = []
    # the ranks of one combination and token count are read together (their ranks' table
    # needs every rank's trace), then dropped: a run's traces never sit in memory at once
    groups: dict = {}  # (folder, tokens) or (file,) -> [file]
    for f in files:
        m = _RANK_FILE.fullmatch(Path(f).name)
        groups.setdefault((str(Path(f).parent), m[2]) if m else (str(f),), []).append(f)
    for key, group in groups.items():
        ranks: dict = {}  # rank -> (TraceSummary, Trace)
        for f in group:
            try:
                traces = load_traces(f, max_trace_mb)
            except ValueError as e:
                if roots is None:
                    raise
                errors.append(str(e))
                print(f"skipped: {e}", file=sys.stderr)
                continue
            root = next((r for r in roots or () if Path(f).is_relative_to(r)), None)
            for trace in traces:
                summary: TraceSummary = summarize(trace)
                key_f = _key_of(Path(f), summary, labels)
                label = labels.get(key_f or "")
                title = _title(label, Path(f), trace, len(traces) > 1)
                print(to_markdown(summary, labels, title, None if summary.combos else key_f))
                m = _RANK_FILE.fullmatch(Path(f).name)
                if m:
                    ranks[int(m[1])] = (summary, trace)
                if plot:
                    from moebench.report.timeline import plot_timeline, why_empty

                    why = why_empty([trace])
                    png = (
                        None if why else plot_timeline(trace, _made(base, _plot_path(trace, f, out, root)), name=title)
                    )
                    print(f"timeline: {png}\n" if png else f"timeline: not drawn — {why}\n")
            if plot and len(traces) > 1:  # an nsys report of several ranks (processes)
                _plot_ranks(
                    traces,
                    base,
                    _plot_path(traces[0], f, out, root, f"{Path(f).name}.ranks.timeline.png"),
                    [t.source.split("#")[-1] for t in traces],
                    f"{label} — {Path(f).name}" if label else None,
                )
        if len(ranks) > 1:
            order = sorted(ranks)
            matched = matched_overlap([ranks[r][1] for r in order]) if order == list(range(len(order))) else None
            f0 = Path(group[0])
            key0 = _key_of(f0, ranks[order[0]][0], labels)
            print(ranks_table(key[0], key[1], {r: s for r, (s, _) in ranks.items()}, matched, labels.get(key0 or "")))
            if plot:
                root = next((r for r in roots or () if f0.is_relative_to(r)), None)
                label0 = labels.get(key0 or "")
                _plot_ranks(
                    [ranks[r][1] for r in order],
                    base,
                    _plot_path(ranks[order[0]][1], f0, out, root, f"T{key[1]}.ranks.timeline.png"),
                    [f"rank {r}" for r in order],
                    f"{label0} — {key[1]} tokens" if label0 else None,
                )
    if errors and len(errors) == len(files):
        raise ValueError(f"{target}: no readable trace ({len(errors)} unreadable; first: {errors[0]})")
    return 0


def _plot_ranks(traces: list, base: Path, path: Path, names: list, title: Optional[str] = None) -> None:
    """The ranks stacked in one figure at `path` below `base` (`title`: the combination and token count
    it shows), or one line saying why there is none (a CPU run's ranks have no GPU lanes to stack)."""
    from moebench.report.timeline import plot_ranks, why_empty

    why = why_empty(traces, cpu_lanes=False)
    print(
        f"ranks timeline: {plot_ranks(traces, _made(base, path), names, title=title)}\n"
        if why is None
        else f"ranks timeline: not drawn — {why}\n"
    )


_RANK_FILE = re.compile(r"rank(\d+)_T(\d+)\.json(?:\.gz)?")


def ranks_table(folder: str, tokens: str, ranks: dict, matched=None, label: Optional[str] = None) -> str:
    """One combination's ranks side by side with the figure its row holds: with `matched`
    (metrics.matched_overlap: communication trimmed of the wait for the last rank), the
    figure of the rank that waited least; else the critical rank's (traces/matched.py critical_rank:
    the longest layer span; the ranks' mean when the spans tie). Headed by the combination's
    `label` where a row names it (the folder on the next line), else by the folder; ranks without
    GPU activity (a CPU run) get one line instead of a table of dashes."""
    from moebench.traces.matched import critical_rank

    head = (
        [f"### ranks of {md_text(label)} at {tokens} tokens", "", f"traces: {md_code(folder)}"]
        if label
        else [f"### ranks of {md_text(folder)} at {tokens} tokens"]
    )
    order = sorted(ranks)
    if matched is None and all(ranks[r].layer_us is None for r in order):
        return "\n".join(
            head
            + [
                "",
                f"ranks: nothing to compare — no GPU activity in the {len(order)} ranks' "
                "traces (a CPU run): no layer span, wait or overlap per rank",
                "",
            ]
        )
    crit = critical_rank([ranks[r].layer_us for r in order])
    if matched is not None:
        crit = matched.critical_rank
    lines = head + [
        "",
        "| rank | layer span µs | waited for peers µs | trace_overlap_fraction | without the wait | "
        "intersection_fraction |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(order):
        s = ranks[r]
        mark = " (critical)" if crit == i else ""
        wait = matched.wait_us_per_rank[i] if matched else None
        fig = matched.fraction_per_rank[i] if matched else None
        lines.append(
            f"| {r}{mark} | {fmt_figure(s.layer_us)} | {fmt_figure(wait)} | "
            f"{fmt_figure(s.trace_overlap_fraction, 3)} | "
            f"{fmt_figure(fig, 3)} | {fmt_figure(s.intersection_fraction, 3)} |"
        )
    if matched is not None:
        row = (
            f"rank {order[matched.critical_rank]}'s without the wait for peers, {fmt_figure(matched.fraction, 3)} "
            "(it waited least: the others waited for it)"
        )
    else:
        row = (
            f"rank {order[crit]}'s (its layer ends last)"
            if crit is not None
            else "the ranks' mean (no rank's layer span stands out)"
        )
    lines += ["", "row figure: " + row, ""]
    return "\n".join(lines)


def _file_order(f: Path) -> tuple:
    """A folder's traces in order of token count, then rank, as numbers (16 before 128), then the rest by name."""
    m = _RANK_FILE.fullmatch(f.name)
    return (str(f.parent), 0, int(m[2]), int(m[1]), f.name) if m else (str(f.parent), 1, 0, 0, f.name)


def find_traces(target) -> list:
    """Trace files of `target`: itself if a file, else those under the folders `_trace_roots`
    gives (`<target>/traces/` for a run directory), recursively."""
    p = Path(target)
    if not p.exists():
        raise ValueError(f"{p}: no such file or directory (give a trace file or a run directory)")
    if p.is_file():
        if not is_trace_file(p):
            raise not_a_run_file(p, f"a trace file ({', '.join(TRACE_SUFFIXES)})")
        return [p]
    roots = _trace_roots(p)
    found = sorted((f for root in roots for f in root.rglob("*") if f.is_file() and is_trace_file(f)), key=_file_order)
    if not found:
        raw = sorted(r for root in roots for pat in ("*.nsys-rep", "*.qdstrm", "*.qdstrm.xz") for r in root.rglob(pat))
        hint = (
            (
                f"; {counted(len(raw), 'nsys capture')} (.nsys-rep, .qdstrm) found: export them with "
                f"`moebench trace --import {p}`"
            )
            if raw
            else ""
        )
        raise ValueError(f"{p}: no trace files (*.json, *.json.gz, *.sqlite) under {', '.join(map(str, roots))}{hint}")
    return found
