"""results/README.md, generated from the committed results folders.

Layout it reads (one folder per question; superseded generations under results/archive/):

    results/<question>/about.md       first line: the question; the rest: a description.
                                      Optional YAML front matter (between `---` lines):
                                        commit: <sha>   the code every run below measured, where
                                                        the stored git_sha is wrong or missing
                                        machine: <text> where no env.json says it (tune folders)
                                        also: [<command>, ...]   commands beside the sweeps
                                        runs: {<run path>: {note, commit, machine, also}}
    results/<question>/caveats.md     caveats of every run below (a run directory may hold
                                      its own caveats.md); `moebench report` may pick them up.
                                      A run's own caveats.md stating "Which code ran: commit
                                      `<sha>`, clean" (or dirty) is the commit and tree shown
                                      for it, over its fingerprints (provenance.py)
    <run>/env.json, <run>/sweep-*.json, <run>/rows/*.parquet   as `moebench sweep` writes them
    <run>/tune.json                   as `moebench tune` writes it

Each listed command is the recorded one (`sweep-*.json`: the sweep name and `cli_overrides`;
`tune.json`: the layer's overrides) rendered for today's code: keys renamed since
(`moebench.config.compose.RENAMED`) take their new names, and the `runner.device=cuda` that GPU runs
pinned is left out (`runner.device=auto`, the default, picks CUDA on a GPU machine), so that
every command also plans on a CPU machine (tests/project/test_results_index.py runs `moebench list`
on each).

    python -m moebench.report.results_index            # rewrite results/README.md
    python -m moebench.report.results_index --check    # exit 1 when it is out of date

What a run folder holds (env.json, sweep-*.json, tune.json, the rows) is untrusted text: it
enters the index escaped (moebench/report/mdsafe.py: md_text, md_code), each command is one line (a
control character in an override is written in bash's $'...' quoting) and the commands' block is
fenced longer than any backtick run inside (code_block). about.md and caveats.md are the
repository's own text, kept as written. README.md is replaced through moebench/util/safe_write.py:
never through a link.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from moebench.config.compose import rename as config_rename
from moebench.config.paths import ADHOC, REPO_ROOT
from moebench.config.sweeps import load_sweep
from moebench.report import provenance
from moebench.report.mdsafe import code_block, md_code, md_text, one_line, shell_join
from moebench.report.table import md_escape
from moebench.results.row import BAD_STATUSES, Status
from moebench.results.store import ROWS_DIR, RunStore, is_run_dir
from moebench.util.arg_errors import OneLineErrors
from moebench.util.safe_write import replace_text

RESULTS = REPO_ROOT / "results"
ARCHIVE = "archive"
DROPPED = {"runner.device=cuda"}  # see the module docstring
TUNE_ADDED = {"overlap=none", "reduction=experts", "experts.row_layout=gathered"}  # the tuner sets these itself
STATUS_ORDER = (Status.OK, *BAD_STATUSES, Status.SKIPPED)


@dataclass
class About:
    question: str
    body: str
    meta: dict = field(default_factory=dict)


@dataclass
class Run:
    """One run directory (or tune output) below a question folder."""

    path: Path  # relative to the results root
    machine: str
    commit: str
    rows: str  # status counts, or the tune trials
    commands: list[str]
    note: str = ""
    report: Optional[Path] = None  # relative to the results root
    tree: str = "unknown"  # clean | dirty | unknown: whether the files were the commit's (provenance.py)


def read_about(folder: Path) -> About:
    p = folder / "about.md"
    if not p.is_file():
        raise ValueError(f"{p} is missing: its first line states the folder's question")
    text, meta = p.read_text(), dict[str, str]()
    if text.startswith("---\n"):
        head, _, text = text[4:].partition("\n---\n")
        meta = yaml.safe_load(head) or {}
    lines = text.strip().splitlines()
    question = lines[0].lstrip("# ").strip() if lines else ""
    if not question:
        raise ValueError(f"{p}: the first line must state the question")
    return About(question, "\n".join(lines[1:]).strip(), meta)


def rename(override: str) -> str:
    """An override with a renamed key given its current name (config.rename: a renamed
    `+extra.*` key is a declared knob today, so its `+` goes too)."""
    return config_rename(override)


def _args(overrides, drop=frozenset()) -> list[str]:
    out = [rename(o) for o in overrides if o not in DROPPED]
    return [o for o in out if o not in drop]


def sweep_command(sweep: dict, cli_overrides: list[str]) -> tuple[str, str]:
    """(the command, a note when today's sweep file differs from the recorded one)."""
    name = sweep.get("name", "default")
    args = _args(cli_overrides)
    note = ""
    if name == ADHOC:  # run without a sweep file: the default sweep's axes must all be given
        given = {o.partition("=")[0].lstrip("+~") for o in args}
        missing = sorted(set(load_sweep("default")["overrides"]) - given)
        if missing:
            raise ValueError(
                f"a run without a sweep file leaves {missing} to the default sweep: "
                "give them in the folder's about.md `also:` instead"
            )
        name = "default"
    else:  # today's sweep file against the recorded one, on the keys the command does not give
        now, then = load_sweep(name)["overrides"], sweep.get("overrides", {})
        given = {o.partition("=")[0] for o in args}
        moved = [
            md_text(f"{k}: {then.get(k, '–')} → {now.get(k, '–')}")
            for k in sorted(set(now) | set(then))
            if k not in given and now.get(k) != then.get(k)
        ]
        if moved:
            note = f"sweeps/{md_text(name)}.yaml has changed since this run ({'; '.join(moved)})"
    cmd = ["moebench", "sweep"] + ([] if name == "default" else ["--sweep", name]) + args
    return shell_join(cmd), note


def tune_command(layer: dict) -> str:
    # the halving tuner records what was typed (cli_overrides) beside what it resolved
    cmd = [
        "moebench",
        "tune",
        *_args(layer.get("cli_overrides") or layer["overrides"], TUNE_ADDED),
        "--space",
        layer["space"],
    ]
    if "search" in layer:
        cmd += ["--search", layer["search"]] + (
            ["--budget", str(layer["budget"])] if layer["search"] == "halving" else []
        )
    return shell_join(cmd + ["--reps", str(layer["reps"])])


def _fmt_counts(c: Counter) -> str:
    keys = sorted(c, key=lambda s: (STATUS_ORDER.index(s) if s in STATUS_ORDER else 99, str(s)))
    return ", ".join(f"{md_text(k)} {c[k]}" for k in keys) or "no rows"


def _short(sha) -> str:
    s = str(sha or "unknown")
    return s[:7] if len(s) == 40 and all(ch in "0123456789abcdef" for ch in s) else s


def _machine(env: dict, used: int) -> str:
    """'1 × NVIDIA H200 (of 2)': the GPUs the run used (its rows' world size), of the host's
    (nvidia-smi's lines, which CUDA_VISIBLE_DEVICES does not hide; else the visible count)."""
    smi = env.get("nvidia_smi")
    gpu, have = env.get("gpu") or "?", (len(smi) if isinstance(smi, list) and smi else env.get("gpu_count")) or used
    text = f"{used} × {md_text(gpu)}"  # env.json's text: escaped
    try:
        return text + (f" (of {int(have)})" if have and int(have) > used else "")
    except (TypeError, ValueError):  # a gpu_count that is no number
        return text


def _commit(stored: list[str], named) -> str:
    """The commits a run's fingerprints name; about.md's (`named`) first where it says otherwise."""
    if not stored:
        return str(named or "unknown")
    shown = ", ".join(_short(s) for s in stored)
    return f"{named} (stored: {shown})" if named and str(named) != shown else shown


def _is_run(d: Path) -> bool:
    return is_run_dir(d) or (d / "tune.json").is_file()  # a tune's folder too


def read_run(root: Path, d: Path, folder_meta: dict, rel_to_folder: str) -> Run:
    meta = dict((folder_meta.get("runs") or {}).get(rel_to_folder) or {})
    rel = d.relative_to(root)
    report = rel / "report" / "report.md" if (d / "report" / "report.md").is_file() else None
    also = list(meta.get("also") or [])
    env = RunStore(d).env()
    # a run resumed or extended at later code holds one env per invocation (envs/): name each commit
    envs = ([env] if env else []) + list(RunStore(d).envs().values())  # a garbage file: warned and passed over
    tune = json.loads((d / "tune.json").read_text()) if (d / "tune.json").is_file() else None
    if tune is not None and not envs:  # tunes before env.json: tune.json's device, versions and commit
        envs = [tune.get("environment") or {}]
    # per invocation, a stale .git's reading replaced by what the run's stamp or caveats establish
    ran = provenance.invocations(envs, d)
    stored = [c for c, _ in ran]
    stored = list(dict.fromkeys(stored[:1] + [c for c in stored[1:] if c != "unknown"]))
    if tune is not None and not env and stored == ["unknown"]:
        stored = []  # nothing recorded: about.md's commit stands alone
    commit = _commit(stored, meta.get("commit") or folder_meta.get("commit"))
    tree = provenance.tree([t for _, t in ran])
    if tune is not None:
        trials = sum(len(r["trials"]) if "trials" in r else r.get("timed", 0) for r in tune.get("results", []))
        sizes = ", ".join(str(r["tokens"]) for r in tune.get("results", []))
        if env:
            machine = meta.get("machine") or _machine(env, int(tune["layer"].get("gpus") or 1))
        else:
            machine = (
                meta.get("machine") or folder_meta.get("machine") or md_text(envs[0].get("device") or "?")
            ) + " (no environment recorded)"
        return Run(
            rel,
            machine,
            commit,
            f"{trials} trials ({sizes} tokens)",
            [tune_command(tune["layer"])] + also,
            meta.get("note", ""),
            report,
            tree,
        )
    counts, used = Counter[str](), 1
    if (d / ROWS_DIR).is_dir():
        df = RunStore(d).load()
        if len(df):
            counts = Counter(df["status"])
            ran = df[df["status"] != Status.SKIPPED]
            used = int((ran if len(ran) else df)["world_size"].max())
    machine = meta.get("machine") or _machine(env, used)
    commands, notes = [], [meta["note"]] if meta.get("note") else []
    for rec in RunStore(d).sweep_records():
        cmd, note = sweep_command(rec.get("sweep", {}), rec.get("cli_overrides", []))
        if cmd not in commands:
            commands.append(cmd)
        if note and note not in notes:
            notes.append(note)
    return Run(rel, machine, commit, _fmt_counts(counts), commands + also, "; ".join(notes), report, tree)


def question_runs(root: Path, folder: Path, meta: dict) -> tuple[list[Run], list[tuple[str, Path]]]:
    """The runs below a question folder and the comparison reports, (link text, path): a
    report/ outside a run (`moebench compare A B --out DIR/report`), or a folder inside a
    run's report/ (`moebench compare RUN --axis ...`)."""
    runs, comparisons = [], []
    dirs = [folder] + sorted(p for p in folder.rglob("*") if p.is_dir())
    for d in dirs:
        if any(part in (ROWS_DIR, "report", "traces") for part in d.relative_to(folder).parts):
            continue
        if _is_run(d):
            runs.append(read_run(root, d, meta, "." if d == folder else str(d.relative_to(folder))))
            for c in sorted((d / "report").glob("*/report.md")):
                rel = c.relative_to(root)
                comparisons.append((f"{rel.parent.parent.parent.as_posix()}: {c.parent.name}", rel))
        elif (d / "report" / "report.md").is_file():
            rel = (d / "report" / "report.md").relative_to(root)
            comparisons.append((rel.parent.parent.as_posix(), rel))
    return runs, comparisons


def _cell(text: str) -> str:
    """Text inside one table cell: its pipes escaped (not twice), one line (table.md_escape)."""
    return md_escape(text)


def _label(run: Run, folder: Path) -> str:
    """A run's name within its question folder (the folder's own name when it is the run)."""
    return folder.name if run.path == folder else run.path.relative_to(folder).as_posix()


def _caveats(root: Path, folder: Path) -> list[str]:
    out = []
    for p in [folder / "caveats.md"] + sorted(folder.glob("*/**/caveats.md")):
        if p.is_file():
            where, text = p.parent.relative_to(folder), p.read_text().strip()
            gap = "\n\n" if text.startswith("- ") else " "  # a list starts on a line of its own
            out.append(text if str(where) == "." else f"`{where}`:{gap}{text}")
    return out


def section(root: Path, folder: Path, level: str = "##") -> tuple[str, dict]:
    about = read_about(folder)
    runs, comparisons = question_runs(root, folder, about.meta)
    name = folder.relative_to(root)
    parts = [f"{level} {name}", f"**{about.question}**"]
    if about.body:
        parts.append(about.body)
    cav = _caveats(root, folder)
    if cav:
        parts.append(f"**Caveats** (`{name}/caveats.md`, travelling with the folder):\n\n" + "\n\n".join(cav))
    table = ["| run | machine | commit | tree | rows | report |", "|---|---|---|---|---|---|"]
    for r in runs:
        label = _label(r, name)
        note = f" — {_cell(r.note)}" if r.note else ""
        link = f"[report]({r.report.as_posix()})" if r.report else "–"
        commits = ", ".join(_cell(md_code(c)) for c in r.commit.split(", "))
        table.append(
            f"| {_cell(md_code(label))}{note} | {_cell(r.machine)} | {commits} | {r.tree} | {_cell(r.rows)} | {link} |"
        )
    parts.append("\n".join(table))
    if comparisons:
        parts.append("Comparison reports: " + ", ".join(f"[{text}]({c.as_posix()})" for text, c in comparisons))
    block = []  # one line each: a line break in a command would end nothing, but reads as two commands
    for r in runs:
        if r.commands:
            block.append(f"# {one_line(_label(r, name))}")
            block += [one_line(c) for c in r.commands]
    if about.meta.get("also"):
        block += ["# also"] + [one_line(c) for c in about.meta["also"]]
    parts.append(code_block("\n".join(block), "bash"))
    summary = {
        "name": name,
        "question": about.question,
        "machines": sorted({r.machine for r in runs}),
        "commits": list(dict.fromkeys(c.split(" ")[0] for r in runs for c in r.commit.split(", "))),
        "runs": len(runs),
    }
    return "\n\n".join(parts), summary


HEADER = """# Curated GPU results

Generated by `python -m moebench.report.results_index` from each folder's `about.md`,
`caveats.md`, `env.json`, `sweep-*.json`, `tune.json` and rows: edit those, not this file
(`tests/project/test_results_index.py` fails when it is out of date). What the results show, with
the floors, the predictions and why measurements differ: [docs/findings/](../docs/findings/README.md).

One folder per question. A run directory is as `moebench sweep` writes it (`rows/`, where
the measured rows are merged into `rows/rows.parquet` by `scripts/compact_rows.py`, and
`skipped.parquet`; `env.json`; `sweep-*.json`) plus `report/` from `moebench report <run> --out
<run>/report` (without `--out`, reports of a run in this tree go to `runs/reports/`, so that
reading a committed run changes no tracked file).
*commit* is the code a run measured (`env.json`'s `git_sha`, or for fingerprints older than the
tree stamp its `MOEBENCH_GIT_SHA`, and those of its later invocations in `envs/` where a run was
extended at newer code; a tune's `tune.json` where it has no `env.json`; the folder's `about.md`
where the stored one is wrong, which is then shown beside it). *tree* says whether the files that
ran were that commit's: `clean`, `dirty` (uncommitted changes: `env.json`'s `git_diff_paths` and
`git_diff_sha256` say which), or `unknown` (no `.git` and no tree stamp where it ran: every GPU
run before `scripts/copy_tree.sh`). Where a fingerprint read a stale `.git` (a device's copy that
carried an older `.git` beside the stamp of the commit it ran), both columns show what the run's
own record establishes instead: the run's `caveats.md` stating ``Which code ran: commit `<sha>`,
clean`` (or dirty), else the stamp that a later invocation read beside that `.git` (its commit, the
tree `unknown`); `moebench/report/provenance.py` says how. Most folders measured older code than
today's; a folder's caveats say where later code changes its figures. *machine*: the GPUs a run
used (its rows' world size) of the host's (nvidia-smi's count, which `CUDA_VISIBLE_DEVICES` does
not hide): "(of 2)" is a host with a GPU the run did not use, which may have run other work
meanwhile (the caveats say where it did). Folders under `archive/` hold superseded generations,
kept as the findings' history.

Commands are the recorded ones, rendered for today's code: renamed keys take their new names
(`experts.fp8_layout` → `experts.row_layout`), and the `runner.device=cuda` the GPU runs pinned
is left out (the default `runner.device=auto` picks CUDA on a GPU machine; on a CPU machine
each command still plans, and `moebench list` on it exits 0, as the test checks). Add
`--out DIR` to write the run elsewhere than `runs/`. A note says when a sweep file has changed
since its run: the command then runs today's sweep file."""


def render(root: Path = RESULTS) -> str:
    folders = sorted(p for p in root.iterdir() if p.is_dir() and p.name != ARCHIVE)
    archived = sorted(p for p in (root / ARCHIVE).iterdir() if p.is_dir()) if (root / ARCHIVE).is_dir() else []
    current = [section(root, f) for f in folders]
    old = [section(root, f, "###") for f in archived]
    index = ["| folder | question | machine | commit(s) | runs |", "|---|---|---|---|---|"]
    for _, s in current + old:
        anchor = str(s["name"]).replace("/", "").replace(".", "").lower()
        index.append(
            f"| [{s['name']}](#{anchor}) | {_cell(s['question'])} | {_cell('; '.join(s['machines']))} | "
            f"{', '.join(_cell(md_code(c)) for c in s['commits'])} | {s['runs']} |"
        )
    parts = [HEADER, "\n".join(index)] + [t for t, _ in current]
    if old:
        parts += [
            "## archive",
            "Superseded generations: their rows and reports (plots removed to save "
            "space: `moebench report <folder>` redraws them), cited by the findings' history.",
        ]
        parts += [t for t, _ in old]
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> int:
    p = OneLineErrors(prog="python -m moebench.report.results_index", description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=RESULTS, help="the results folder (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="exit 1 when README.md differs from what would be written")
    args = p.parse_args(argv)
    out = args.root / "README.md"
    try:
        text = render(args.root)
        if args.check:
            if not out.is_file() or out.read_text() != text:
                print(f"{out} is out of date: run python -m moebench.report.results_index", file=sys.stderr)
                return 1
            return 0
        replace_text(out, text)  # never through a link (moebench/util/safe_write.py)
    except ValueError as e:  # a bad folder, or a link where README.md goes: one line
        print(f"results_index: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
