"""The reports: a run's (``<run>/report/report.md`` + PNGs) and a comparison's, the verdict
first (report/verdict.py). Each report is a ``Doc``: markdown blocks for report.md, the
tables for csv, a JSON document; ``write`` puts them on disk.

Every file goes through moebench/util/safe_write.py: the report folder (``report_dir``) is checked
before the runs are read and made once there is a report to write (no link below the run folder or
--out; a refused command leaves no folder behind), the names a report writes are checked for links
once, with the folder, before any work (``ReportDir.check``), and each file is opened without
following one. An earlier report's figures this one does not draw, which its report.md no longer
links, are removed from the folder's top level (``drop_stale_figures``: regular files of the
report's own figure names only). Text read from the runs is escaped where it enters the Markdown
(moebench/report/mdsafe.py md_text).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from moebench.report import plots
from moebench.report import run_tables as tables
from moebench.report.clock_report import clock_table
from moebench.report.compare import Comparison, compare_runs
from moebench.report.compare_tables import latency_pairs, memory_pairs, unmatched
from moebench.report.envinfo import env_differences, env_summary, env_value  # noqa: F401  (report's names, kept for callers)
from moebench.report.flags import flag_summary, pair_flags, pair_paced_details, pair_rows, run_notes
from moebench.report.fmt import fmt_change
from moebench.report.load import load_run, writing
from moebench.report.mdsafe import md_text
from moebench.report.overlap import require_pairs
from moebench.report.phase_plot import CPU_NO_FIGURE
from moebench.report.routing_table import routing_table
from moebench.report.summary import caveats, quality_lines, reviewer_summary, rows_table
from moebench.report.table import Table, to_json
from moebench.report.verdict import exit_status, frame_names, verdict_lines, verdict_record
from moebench.results.row import Verdict
from moebench.results.store import run_dir_of
from moebench.results.writable import probe_in
from moebench.util.safe_write import (
    check_dir_below,
    refuse_links,
    remove_files,
    replace_text,
    safe_dir_below,
    write_text,
)
from moebench.util.words import counted

FORMATS = ("md", "csv", "json")
QUALITY_FIRST = 4  # the data-quality notes the opening shows; the rest are folded below


@dataclass
class Doc:
    """A report: markdown blocks, its tables by name (the first is what csv prints), the
    JSON document, and the exit status it implies."""

    blocks: list[str]
    tables: dict[str, Table]
    data: dict
    code: int = 0
    head: list[str] = field(default_factory=list)  # what stdout shows first in markdown
    stdout_md: str = ""  # what stdout shows in markdown, when not the head and the first table
    figures: list[str] = field(default_factory=list)  # the PNGs it wrote into its folder, by name

    def markdown(self) -> str:
        return "\n\n".join(b for b in self.blocks if b) + "\n"


@dataclass
class Report:
    """What build_report made: the report path, the rows, env and the comparison."""

    path: Path
    df: pd.DataFrame
    env: dict
    comparison: Comparison | None
    doc: Doc | None = None


def run_summary(df: pd.DataFrame) -> str:
    """'run r1 (sweep s) · 21 rows · 7 combinations · 2026-01-01 … 2026-01-02'."""
    runs = ", ".join(sorted({md_text(r) for r in df["run_id"].dropna()})) or "?"
    sweeps = ", ".join(sorted({md_text(s) for s in df["sweep"].dropna()})) or "?"
    text = (
        f"run {runs} (sweep {sweeps}) · {counted(len(df), 'row')} · {counted(df['combo_key'].nunique(), 'combination')}"
    )
    stamps = df["timestamp"].dropna().astype(str)
    if len(stamps):
        text += f" · {md_text(stamps.min())} … {md_text(stamps.max())}"
    return text


def committed_results() -> Path:
    """The repository's curated results/ tree (what a commit carries)."""
    from moebench.config.paths import REPO_ROOT

    return REPO_ROOT / "results"


def _committed_path(run_dir) -> Path | None:
    """The run's path below the repository's committed results/, or None for a run elsewhere."""
    try:
        return run_dir_of(run_dir).resolve().relative_to(committed_results().resolve())
    except ValueError:
        return None


def default_report_dir(run_dir, *sub: str) -> Path:
    """Where a report of `run_dir` goes without --out: `<run>/report/<sub>`, except for a run
    inside the repository's committed results/, whose reports are part of the commit: those
    go to `<runs>/reports/<its path under results/>/report/<sub>` (``report_dir``'s note says so,
    and how to update the committed one), so that reading a committed run changes no tracked file."""
    return _default_dest(run_dir, _committed_path(run_dir), sub)


def _default_dest(run_dir, rel: "Path | None", sub: tuple) -> Path:
    """default_report_dir's folder, given the run's path under results/ (`rel`, None: not committed)."""
    if rel is None:
        return run_dir_of(run_dir).joinpath("report", *sub)
    from moebench.config.paths import default_runs_dir  # where sweeps write (MOEBENCH_RUNS, else runs/)

    return default_runs_dir().joinpath("reports", rel, "report", *sub)


@dataclass(frozen=True)
class ReportDir:
    """Where a report goes, before it is made: `base` (the folder the user named: the run folder,
    --out, or the runs folder for a committed run) and `path`, the folder at or below it. ``check`` before
    reading the inputs makes nothing; ``make`` once there is something to write: a refused command
    leaves no empty report folder behind (moebench/util/safe_write.py check_dir)."""

    base: Path
    path: Path
    note: str = ""  # said on stderr once the folder is made (a committed run's: where its report goes)

    def check(self, names=()) -> Path:
        """The folder it will be, checked as ``make`` would check it (a link below `base`, a file in
        the way: exit 2; a read-only folder: the environment's line), and ``names`` (the files the
        command writes there, ``output_names``) for links: the one check of them, before any work
        (a link planted later is still refused by each write, safe_write.write_text)."""
        path = check_dir_below(self.base, self.path)
        refuse_links(path, names)
        return path

    def make(self) -> Path:
        """The folder, made without following a link below `base`, and probed with a file (a full
        disk, /proc: the environment's line, exit 2, before any file of the report); then its note,
        so that input refused before (not a run, no rows) reads as its one line alone."""
        path = probe_in(safe_dir_below(self.base, self.path))  # made once: probe_in makes nothing
        if self.note:
            print(self.note, file=sys.stderr)
        return path


def report_dir(run_dir, out=None, *sub: str) -> ReportDir:
    """The report folder, not made yet: ``out`` as given (itself may be a link: the user named it),
    else ``default_report_dir(run_dir, *sub)`` below the run folder (a link at `report/` or below is
    refused, one line, exit 2), or below the runs folder for a committed run."""
    if out is not None:
        return ReportDir(Path(out), Path(out))
    rel = _committed_path(run_dir)
    dest = _default_dest(run_dir, rel, sub)
    if rel is None:
        return ReportDir(run_dir_of(run_dir), dest)
    from moebench.config.paths import default_runs_dir

    committed = Path("results").joinpath(rel, "report", *sub)
    note = f"moebench: {Path('results') / rel} is committed: writing to {dest} (--out {committed} updates "
    note += "the committed report)"
    return ReportDir(default_runs_dir(), dest, note)


def report_out(run_dir, out=None, *sub: str) -> Path:
    """``report_dir(run_dir, out, *sub)`` made: for a command whose inputs are read already."""
    return report_dir(run_dir, out, *sub).make()


# what a report folder receives: report.md, its plots, and the tables of --format csv / json
REPORT_FILES = (
    "report.md",
    "effects.png",
    "latency.png",
    "phases.png",
    "overlap.png",
    "workspace.png",
    "comparison.png",
    "comparison_latency.png",
    "comparison_workspace.png",
)
REPORT_FIGURES = tuple(n for n in REPORT_FILES if n.endswith(".png"))  # overlap.png: drawn by older reports
TABLE_FILES = {
    "csv": ("rows.csv", "comparison.csv", "memory.csv", "only_baseline.csv", "only_candidate.csv"),
    "json": ("report.json",),
}


def output_names(fmt: str = "md") -> tuple[str, ...]:
    """The files a report in format ``fmt`` may write into its folder."""
    return REPORT_FILES + TABLE_FILES.get(fmt, ())


def drop_stale_figures(out: Path, drawn) -> list[str]:
    """Remove from ``out`` (its top level, nothing below) the figures of ``REPORT_FIGURES`` this
    report did not draw (``drawn``: the names it wrote), an earlier report's that report.md no longer
    links (a CPU run's report draws no phases.png); regular files only, never through a link
    (safe_write.remove_files: a link at one of these names was refused before any work, ReportDir.check).
    Any other file stays. Returns the names removed."""
    return remove_files(out, [n for n in REPORT_FIGURES if n not in set(drawn)])


def _image(path: Path | None, alt: str) -> str:
    return f"![{alt}]({path.name})" if path is not None else ""


def _results_root(path: Path) -> Path | None:
    for d in [path.resolve(), *path.resolve().parents]:
        if d.name == "results":
            return d
    return None


def _quality_section(lines: list[str], caveat_blocks: list[str]) -> list[str]:
    if not lines and not caveat_blocks:
        return []
    return ["## Data quality", "\n".join(f"- {x}" for x in lines), *caveat_blocks]


def details(summary: str, *blocks: str) -> str:
    """A block GitHub renders folded: `summary` as its one line, `blocks` inside ('' when
    they hold nothing but a heading)."""
    inner = [b for b in blocks if b]
    if not [b for b in inner if not b.startswith("## ")]:
        return ""
    body = "\n\n".join(inner)
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def run_doc(
    df: pd.DataFrame, env: dict, run_dir: Path, out: Path, title: bool = True, budget: float | None = None
) -> Doc:
    """A single run's report, the answers first (report/answers.py: what each choice does, the
    fastest per size, memory, overlap, what to read with care, and their figures), then every
    table folded in a <details> block; PNGs written into ``out``."""
    from moebench.report.answers import answers

    here, root = run_dir_of(run_dir), _results_root(run_dir_of(run_dir))
    # a run inside a results/ tree is named by its path there (ep_backends/deepep_ht), else its folder
    name = here.resolve().relative_to(root).as_posix() if root and here.resolve() != root else here.name
    name = md_text(name)  # a folder's name: text like any other read from the run
    quality = quality_lines(df, env, run_dir)
    cav = caveats([run_dir_of(run_dir)], root)
    summary = reviewer_summary(df, quality + cav)
    rows = rows_table(df)
    # the opening reads the first notes; the rest and the stored caveats are counted
    first = quality[:QUALITY_FIRST]
    rest = [counted(len(quality) - len(first), "more note")] if len(quality) > len(first) else []
    rest += [f"{counted(len(cav), 'caveat file')} stored with the run"] if cav else []
    if rest:
        first.append(f"and {' and '.join(rest)} in *Data quality* below")
    opening = answers(df, out, first, budget)
    figures = {f.path.name: f for f in opening.figures}
    host = tables.host_table(df)
    clock = clock_table(df)
    routing = routing_table(df)
    traces = tables.traces_table(df)
    # a run a writer held while it was read: partial, said at the top (a comparison's report says it of its sides)
    partial = [w.markdown() for w in [writing(df)] if w and title]
    blocks = ([f"# moebench report: {name}", *partial] if title else [f"## This run: {name}"]) + [
        summary[0],
        f"Environment: {env_summary(env, df)}  \n{run_summary(df)}",
        opening.markdown(),
        "## Everything else",
        "The tables and notes behind the answers, folded: click a line to open it.",
        details("Data quality", *_quality_section(quality, cav)),
        details("Status and skip reasons", "## Status", tables.status_table(df), tables.reasons_table(df)),
        details("Latency of every combination", "## Latency", tables.latency_table(df)),
        details("Host time per forward", "## Host time per forward", host) if host else "",
        details("SM clock and GPU state", "## SM clock and GPU state", clock) if clock else "",
        details("Routing", "## Routing", routing) if routing else "",
        details(
            "Phase breakdown",
            "## Phase breakdown",
            tables.phase_table(df),
            figures["phases.png"].markdown() if "phases.png" in figures else CPU_NO_FIGURE if opening.cpu else "",
        ),
        details("Shared-expert overlap", "## Shared-expert overlap", tables.overlap_table(df)),
        details("Traces", "## Traces", traces) if traces else "",
        details("Memory", "## Memory", tables.memory_table(df)),
        details("Experts against the roofline", "## Experts against the roofline", tables.roofline_table(df)),
        details("The summary's other lines", "\n".join(summary[1:])),
    ]
    data = {
        "run": name,
        "being_written": partial,
        "environment": env_summary(env, df),
        "summary": summary,
        "answers": opening.lines,
        "effects": [{**e.__dict__, "verdict": e.verdict} for e in opening.effects],
        "data_quality": quality,
        "rows": rows,
    }
    text = "\n\n".join(
        ["\n".join(summary), f"Environment: {env_summary(env, df)}", tables.status_table(df), tables.latency_table(df)]
    )
    head = [summary[0], *opening.lines]
    return Doc(blocks, {"rows": rows}, data, 0, head, text, [f.path.name for f in opening.figures])


def comparison_doc(
    cmp: Comparison,
    out: Path,
    run_dirs: list[Path],
    fail_on,
    frames: tuple[pd.DataFrame, ...] = (),
    envs: tuple[dict, ...] = (),
) -> Doc:
    """A comparison's report: the verdict, environments, data quality, the pairs, memory,
    the rows on one side only; PNGs written into ``out``."""
    code, why = exit_status(cmp, fail_on)
    pairs = pair_rows(cmp.matched)  # each side's rows once, for the flags, the table and the counts
    flags = pair_flags(pairs)
    lat, mem = latency_pairs(cmp, flags), memory_pairs(cmp)
    only_b = unmatched(cmp.only_baseline, "only_baseline")
    only_c = unmatched(cmp.only_candidate, "only_candidate")
    quality = []
    if len(cmp.matched):
        quality += flag_summary(
            flags,
            frame_names(cmp.matched),
            details=pair_paced_details(pairs, (cmp.baseline_name, cmp.candidate_name)),
        )
    names = [""] if cmp.one_run else [cmp.baseline_name, cmp.candidate_name]
    for df, env, name in zip(frames, envs, names, strict=True):  # the pairs' flags hold the rows' own: provenance here
        quality += [x for x in run_notes(df, env, name) if x not in quality]
    cav = caveats([run_dir_of(d) for d in run_dirs], _results_root(run_dir_of(run_dirs[0])))
    verdict = verdict_lines(cmp, code, why, quality + cav)
    partial = [w.markdown(n) for df, n in zip(frames, names, strict=True) if (w := writing(df))]
    if cmp.one_run and cmp.axis:
        title = (
            f"# moebench compare: {md_text(run_dir_of(run_dirs[0]).name)}, "
            f"{md_text(f'{cmp.axis.field} {cmp.axis.a} → {cmp.axis.b}')}"
        )
        envs_text = f"Environment: {env_summary(cmp.cand_env, frames[0] if frames else None)}"
    else:
        title = f"# moebench compare: {cmp.candidate_name} vs {cmp.baseline_name}"
        envs_text = (
            f"Baseline ({cmp.baseline_name}): {env_summary(cmp.base_env, frames[0] if frames else None)}  \n"
            f"Candidate ({cmp.candidate_name}): {env_summary(cmp.cand_env, frames[1] if len(frames) > 1 else None)}"
        )
    counts = cmp.counts()
    g, lo, hi = cmp.geomean()
    called = (
        ", ".join(f"{counts[v]} {v}" for v in (Verdict.SLOWER, Verdict.FASTER) if counts[v]) or "none slower or faster"
    )
    change_words = f"{called} of {counted(len(cmp.judged), 'row')}, geometric mean {fmt_change(g, lo, hi, cmp.bounds)}"
    mem_counts = cmp.matched["mem_verdict"].astype(str).value_counts()
    larger, smaller = (int(mem_counts.get(k, 0)) for k in ("larger", "smaller"))
    mem_words = f"{larger} larger, {smaller} smaller beyond ×{cmp.threshold:g}"
    moved = cmp.matched["mem_verdict"].isin(["larger", "smaller"]).any()
    drawn = [
        plots.plot_comparison(cmp, out / "comparison.png"),
        plots.plot_comparison_latency(cmp, out / "comparison_latency.png"),
        plots.plot_comparison(cmp, out / "comparison_workspace.png", "workspace") if moved else None,
    ]
    blocks = [
        title,
        *partial,
        "\n".join(verdict),
        envs_text,
        *_quality_section(quality, cav),
        "## Latency",
        lat.markdown(),
        _image(drawn[0], f"Latency change per row: {change_words}"),
        _image(drawn[1], f"Latency of {cmp.baseline_name} and {cmp.candidate_name}: {change_words}"),
        "## Memory",
        mem.markdown(),
        _image(drawn[2], f"Workspace change per row: {mem_words}"),
        f"## Only in {cmp.baseline_name}",
        only_b.markdown(),
        f"## Only in {cmp.candidate_name}",
        only_c.markdown(),
    ]
    data = {
        "verdict": verdict_record(cmp, code, why),
        "verdict_lines": verdict,
        "being_written": partial,
        "data_quality": quality,
        "comparison": lat,
        "memory": mem,
        "only_baseline": only_b,
        "only_candidate": only_c,
    }
    return Doc(
        blocks,
        {"comparison": lat, "memory": mem, "only_baseline": only_b, "only_candidate": only_c},
        data,
        code,
        verdict,
        figures=[p.name for p in drawn if p is not None],
    )


def write(doc: Doc, out: Path, fmt: str = "md") -> Path:
    """report.md always; with csv each table as <name>.csv, with json report.json; ``out`` made
    by ``report_out`` (or safe_write.safe_dir), each file written without following a link."""
    path = replace_text(out / "report.md", doc.markdown())
    if fmt == "csv":
        for name, t in doc.tables.items():
            write_text(out / f"{name}.csv", t.csv())
    if fmt == "json":
        write_text(out / "report.json", to_json(doc.data) + "\n")
    return path


def stdout_text(doc: Doc, fmt: str) -> str:
    """What the command prints: the verdict (or summary) then the main table in
    markdown; the main table as csv; the whole document as JSON."""
    if fmt == "csv":
        return next(iter(doc.tables.values())).csv()
    if fmt == "json":
        return to_json(doc.data)
    if doc.stdout_md:
        return doc.stdout_md
    main = next(iter(doc.tables.values()))
    return "\n".join(doc.head) + "\n\n" + main.markdown()


def build_report(
    run_dir,
    out_dir=None,
    baseline=None,
    threshold: float = 1.05,
    fmt: str = "md",
    fail_on=None,
    cpu_verdict: bool = False,
) -> Report:
    """Write report.md and its PNGs for ``run_dir``; with ``baseline`` (a run path) the
    comparison comes first and the run's own sections follow. ``out_dir`` defaults to
    ``<run>/report``, checked first and made once the runs are read and compared; an earlier
    report's figures that this one does not draw are removed from it (drop_stale_figures)."""
    from moebench.report.verdict import DEFAULT_FAIL_ON

    run_dir = Path(run_dir)
    place = report_dir(run_dir, out_dir)
    place.check(output_names(fmt))  # before the runs are read; nothing is made yet
    df, env = load_run(run_dir)
    if baseline is None:
        out = place.make()
        doc = run_doc(df, env, run_dir, out)
        path = write(doc, out, fmt)
        drop_stale_figures(out, doc.figures)  # report.md links none of them now
        return Report(path, df, env, None, doc)
    base_df, base_env = load_run(baseline)
    cmp = compare_runs(base_df, df, threshold=threshold, cpu_verdict=cpu_verdict)
    require_pairs(cmp, base_df, df, str(baseline), str(run_dir))  # runs that never meet: exit 2
    cmp.base_env, cmp.cand_env = base_env, env
    cmp.baseline_name, cmp.candidate_name = run_names(Path(baseline), run_dir)
    out = place.make()  # the inputs read and compared: there is a report to write
    doc = comparison_doc(
        cmp,
        out,
        [Path(baseline), run_dir],
        DEFAULT_FAIL_ON if fail_on is None else fail_on,
        (base_df, df),
        (base_env, env),
    )
    own = run_doc(df, env, run_dir, out, title=False)
    doc.blocks += own.blocks
    doc.figures += own.figures
    path = write(doc, out, fmt)
    drop_stale_figures(out, doc.figures)
    return Report(path, df, env, cmp, doc)


def run_names(base: Path, cand: Path) -> tuple[str, str]:
    """Short names of two runs: their folder names, with the parent's where those agree; as
    Markdown (md_text: a folder's name is text read from the run like any other)."""
    a, b = run_dir_of(base), run_dir_of(cand)
    if a.name != b.name:
        return md_text(a.name), md_text(b.name)
    return md_text(f"{a.parent.name}/{a.name}"), md_text(f"{b.parent.name}/{b.name}")


def write_report(run_dir, out_dir=None, baseline=None, threshold: float = 1.05) -> Path:
    """Write ``<out_dir or run/report>/report.md`` with PNGs beside it; return its path."""
    return build_report(run_dir, out_dir, baseline, threshold).path
