"""Data-quality flags: what a reader must know before trusting a row's number.

Per ok row (``row_flags``), each a short tag:

- ``spread``: p80/p20 above moebench.config.limits.NOISY_SPREAD (1.10): one figure of a noisy row;
- ``host-bound``: the latency is the host's time, not the GPU's: the host set the pace of the
  samples (timing_mode ``host``: moebench/measure/samples.py paced_mode), or, in rows timed before
  each sample had its hold (no ``host_paced_samples``), events timing with the host's enqueue
  of one forward (``host_enqueue_us``) at least HOST_BOUND (0.8) of the median;
- ``host-sync``: the enqueue outlasts moebench.config.limits.HOST_SYNCS_US: the layer waits on the
  GPU inside a forward, so its events include host round trips;
- ``gpu-idle``: profiler timing and the phases' kernel busy time under GPU_IDLE (0.5) of the
  latency: the GPU is idle most of the sample (host-bound);
- ``phases≠latency``: graph timing and the phase sum (report/load.py ``phase_sum``: the routed
  phases and the shared experts where they ran outside a communication span) off the latency
  by more than PHASE_GAP
  (the phases are eager forwards' events, the latency graph replays), or events timing and
  the phase sum off by more than PHASE_FACTOR either way (the phases' own forwards ran under
  other conditions than the timed ones, e.g. a CPU run beside other work);
- ``eager-decode``: events timing of one rank at or below the graph size (decode sizes) with
  no ``host_enqueue_us`` (rows older than it): possibly host-bound, unknown;
- ``host-paced``: any of the row's latency samples the host paced (the GPU started it before the
  host had enqueued it, behind a hold doubled twice), whatever the count (``host_paced_samples``).
  Up to moebench.config.limits.HOST_PACED_MAX of the latency's samples the row is still GPU
  time and competes, marked (``paced_mark``) and named with its counts (``paced_text``);
- ``host-paced-aside``: host-paced samples of the ablation's, the phase forwards' or the trace's
  only (``PACED``): the latency is GPU time; those figures may hold host launch gaps. A
  comparison's pair carries one of the two (``pair_paced_tag``: host-paced wins).

What a row's latency measures (GPU time, host time or CPU time), read from these flags, is
moebench/report/time_basis.py's.

Per run (``run_notes``): a git sha that names no commit, a dirty tree, several commits in
one run, and the ``caveats.md`` stored with the run (its folder and those above it). The
notes are Markdown: what they quote of env.json and the rows is escaped (moebench/report/mdsafe.py);
caveats.md is the repository's own text and is kept verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moebench.config.limits import HOST_PACED_MAX, HOST_SYNCS_US, NOISY_SPREAD
from moebench.report.columns import PLACE_COLUMNS, phase_sum, records
from moebench.report.envinfo import env_value, is_commit, tree_label
from moebench.report.mdsafe import md_code, md_text
from moebench.results import row as schema
from moebench.results.row import Status
from moebench.util.words import agree, counted

HOST_BOUND = 0.8
GPU_IDLE = 0.5
PHASE_GAP = 0.25
PHASE_FACTOR = 2.0  # events: overlapped phases (shared experts beside dispatch) may sum above the latency
DECODE_TOKENS = 256  # runner.graph_max_tokens' default
FLAG_TEXT = {
    "spread": f"wide spread (p80/p20 > {NOISY_SPREAD:.2f}): more runner.reps or a quieter machine",
    "host-bound": "host-bound: the latency is host time (the host paced the samples; or, in rows from before "
    f"each sample's hold, an enqueue ≥ {HOST_BOUND:.0%} of the events' median): no GPU-time figure",
    "host-sync": f"the layer syncs the host (enqueue > {HOST_SYNCS_US / 1e3:.0f} ms): its events include host waits",
    "gpu-idle": f"GPU busy under {GPU_IDLE:.0%} of the latency (profiler phases): the host bounds the sample",
    "phases≠latency": f"phases off the latency (by > {PHASE_GAP:.0%} under graph timing, > {PHASE_FACTOR:g}× "
    "under events): the phases come from forwards of their own; read the latency",
    "eager-decode": f"events timing at ≤ {DECODE_TOKENS} tokens on one rank, no host_enqueue_us (an older row): "
    "possibly host-bound",
    "host-paced": "with host-paced samples (the GPU started them before the host had enqueued them, behind a hold "
    f"doubled twice): their times may hold host launch gaps; up to {HOST_PACED_MAX:.0%} of a latency's "
    "samples it still counts as GPU time",
    "host-paced-aside": "with host-paced samples outside the latency's only (phases, ablation or trace; "
    "the latency's samples had none, so the latency is GPU time): the phase split, ablation or trace of "
    "these rows may hold host launch gaps",
    "throttled": "with throttled samples (an SM clock below 0.9 × the row's median, or under an NVML thermal, "
    "power or sync-boost reason): their times carry the GPU's clock; runner.drop_throttled retakes them",
    "timing-differs": "the two sides ran different timing modes: the ratio mixes methods",
    "ran-differs": "the two sides ran different row layouts, GEMM kernels or tuned files (row_layout_used, "
    "contiguous_gemm_used, tuned_files): what the layer ran changed, not only how fast",
}

# what a row says its Triton experts ran (results/row.py's group "layout"), compared by pair_ran_text
RAN_COLUMNS = schema.names("layout")


def float_of(row, col) -> float:
    """A row's column as a float: NaN where it is missing, None or not a number."""
    v = row.get(col) if hasattr(row, "get") else None
    try:
        return float(v) if v is not None else float("nan")
    except (TypeError, ValueError):
        return float("nan")


# each family of a row's samples the host may pace: (its count of host-paced samples, what gives how
# many samples it has: a list's length or a count, what the family is called); results/row.py
PACED = (
    ("host_paced_samples", "samples_us", "latency"),
    ("host_paced_no_shared", "samples_us", "ablation without shared experts"),
    ("host_paced_shared", "samples_us", "ablation shared experts alone"),
    ("host_paced_phases", "num_phase_samples", "phases"),
    ("host_paced_trace", "num_trace_samples", "trace"),
)


def _length(row, col) -> float:
    """The length of a samples list (NaN where the column holds no list)."""
    v = row.get(col) if hasattr(row, "get") else None
    return float(len(v)) if isinstance(v, (list, tuple, np.ndarray)) else float("nan")


def _count(row, col) -> float:
    """How many samples a family has: the length of a samples list, or a count column."""
    n = _length(row, col)
    return n if np.isfinite(n) else float_of(row, col)


def paced_counts(row) -> list[tuple[int, float, str]]:
    """(host-paced, of how many (NaN where unknown), which samples) for each family of the row's
    samples with any host-paced one (PACED)."""
    out = []
    for col, of, what in PACED:
        n = float_of(row, col)
        if np.isfinite(n) and n > 0:
            out.append((int(n), _count(row, of), what))
    return out


def _of(n: int, total: float, noun: str = "") -> str:
    """'5 of 30' (the total unknown: '5'), with `noun` agreeing with the last number: '1 of 1 sample',
    '1 sample'."""
    last = int(total) if np.isfinite(total) else n
    text = f"{n} of {last}" if np.isfinite(total) else str(n)
    return f"{text} {agree(last, noun, noun + 's')}" if noun else text


def paced_tag(row) -> str:
    """`host-paced` where the row's latency samples were host-paced, `host-paced-aside` where only
    its other families were (phases, ablation, trace), '' for none."""
    counts = paced_counts(row)
    if not counts:
        return ""
    return "host-paced" if any(what == "latency" for _, _, what in counts) else "host-paced-aside"


def paced_text(row) -> str:
    """'latency: 5 of 30 samples host-paced, phases: 2 of 10 samples host-paced' ('' for none)."""
    return ", ".join(f"{what}: {_of(n, total, 'sample')} host-paced" for n, total, what in paced_counts(row))


def clock_band(row) -> str:
    """'1515–1900–1965' (min–median–max SM MHz of the row's samples), '' without a clock."""
    lo, med, hi = (float_of(row, f"sm_clock_mhz_{q}") for q in ("min", "median", "max"))
    return f"{lo:.0f}–{med:.0f}–{hi:.0f}" if np.isfinite(med) else ""


def throttled_text(row) -> str:
    """'3 of 30 samples throttled (SM 1515–1900–1965 MHz; sw_power_cap)' ('' for none): of the
    latency's samples, counted as paced_text counts them."""
    n = float_of(row, "throttled_samples")
    if not (np.isfinite(n) and n > 0):
        return ""
    why = [f"SM {b} MHz" for b in [clock_band(row)] if b]
    if reasons := str(row.get("clock_reasons") or ""):
        why.append(md_text(reasons))
    return f"{_of(int(n), _length(row, 'samples_us'), 'sample')} throttled" + (f" ({'; '.join(why)})" if why else "")


def latency_paced(row) -> str:
    """'5 of 30': how many of the row's latency samples the host paced ('' for none)."""
    n = float_of(row, "host_paced_samples")
    return _of(int(n), _count(row, "samples_us")) if np.isfinite(n) and n > 0 else ""


def mark_of(paced: float, total: float) -> str:
    """A latency cell's mark for `paced` host-paced samples of `total`: '‡ 5/30' ('' for none)."""
    try:
        paced, total = float(paced), float(total)
    except (TypeError, ValueError):
        return ""
    if not (np.isfinite(paced) and paced > 0):
        return ""
    return f"‡ {int(paced)}/{int(total)}" if np.isfinite(total) else f"‡ {int(paced)}"


def paced_mark(row) -> str:
    """The latency cell's mark of a row some of whose latency samples the host paced:
    '‡ 5/30' ('' for none)."""
    return mark_of(float_of(row, "host_paced_samples"), _count(row, "samples_us"))


PACED_MARK_TEXT = (
    "‡ n/m: n of the m latency samples host-paced (the GPU started them before the host had "
    "enqueued them; Data quality names the rows): the cell may hold host launch gaps"
)


def flags_of(row) -> list[str]:
    """The flags (tags of FLAG_TEXT) of one row (a mapping of its columns)."""
    if row.get("status") != Status.OK:
        return []
    out = []
    med, p20, p80 = float_of(row, "latency_us_median"), float_of(row, "latency_us_p20"), float_of(row, "latency_us_p80")
    mode = str(row.get("timing_mode") or "")
    if np.isfinite(p20) and p20 > 0 and p80 / p20 > NOISY_SPREAD:
        out.append("spread")
    host = float_of(row, "host_enqueue_us")
    held = np.isfinite(float_of(row, "host_paced_samples"))  # timed with a hold before each sample
    if np.isfinite(host) and host > HOST_SYNCS_US:
        out.append("host-sync")
    elif mode == "host" or (
        not held and mode == "events" and np.isfinite(host) and np.isfinite(med) and host >= HOST_BOUND * med
    ):
        out.append("host-bound")
    total = phase_sum(row)
    if mode == "profiler" and np.isfinite(total) and np.isfinite(med) and total < GPU_IDLE * med:
        out.append("gpu-idle")
    if np.isfinite(total) and np.isfinite(med) and med > 0 and total > 0:
        ratio = total / med
        if (mode == "graph" and abs(ratio - 1) > PHASE_GAP) or (
            mode in ("events", "cpu") and not 1 / PHASE_FACTOR <= ratio <= PHASE_FACTOR
        ):
            out.append("phases≠latency")
    single = float_of(row, "world_size") == 1 or str(row.get("world_size")) == "1"
    tokens = float_of(row, "tokens_per_rank")
    if (
        mode == "events"
        and not np.isfinite(host)
        and str(row.get("device")) == "cuda"
        and single
        and np.isfinite(tokens)
        and tokens <= DECODE_TOKENS
    ):
        out.append("eager-decode")
    if tag := paced_tag(row):
        out.append(tag)
    if float_of(row, "throttled_samples") > 0:
        out.append("throttled")
    return out


def row_flags(df: pd.DataFrame) -> pd.Series:
    """A list of flags per row (index of ``df``)."""
    if not len(df):
        return pd.Series([], dtype=object)
    return pd.Series([flags_of(r) for r in records(df)], index=df.index, dtype=object)


def paced_details(df: pd.DataFrame) -> pd.Series:
    """Per row (index of ``df``): {its paced_tag: its counts (paced_text), "throttled": ...} where it
    has any, for flag_summary to name the rows with their counts."""
    return pd.Series([_details(r) for r in records(df)], index=df.index, dtype=object)


def _details(row) -> dict:
    """{tag: the row's counts} of its host-paced and throttled samples (those it has)."""
    out = {paced_tag(row): paced_text(row), "throttled": throttled_text(row)}
    return {k: v for k, v in out.items() if k and v}


def side_rows(matched: pd.DataFrame, side: str) -> list[dict]:
    """One side ("base" | "cand") of every pair of a comparison as a row (its ``<side>_`` columns,
    with the pair's place and token count), in `matched`'s order: the side's columns renamed at
    once (a 10,000-pair comparison spent 10 s renaming them row by row)."""
    cols = [c for c in matched.columns if c.startswith(side + "_")]
    sub = matched[cols].rename(columns={c: c[len(side) + 1 :] for c in cols})
    place = {k: matched[k] if k in matched.columns else None for k in (*PLACE_COLUMNS, "tokens_per_rank")}
    return records(sub.drop(columns=[k for k in place if k in sub.columns]).assign(**place))


@dataclass(frozen=True)
class PairRows:
    """Both sides of every pair of a comparison as rows (side_rows), in `matched`'s order, with each
    pair's host-paced tag and ran-differs text: built once for the pairs' flags and their counts
    (pair_rows)."""

    index: pd.Index  # matched's
    base: list[dict]
    cand: list[dict]
    paced: list[str]  # pair_paced_tag of each pair
    ran: list[str]  # pair_ran_text of each pair


def pair_rows(matched: pd.DataFrame) -> PairRows:
    """Each side's rows of a comparison's pairs, built once (side_rows renames a side's columns
    of every pair: a report built them for each of its flags, tables and counts)."""
    base, cand = side_rows(matched, "base"), side_rows(matched, "cand")
    sides = list(zip(base, cand, strict=True))
    return PairRows(matched.index, base, cand, [pair_paced_tag(*p) for p in sides], [pair_ran_text(*p) for p in sides])


def pair_paced_details(pairs: PairRows, names: tuple[str, str] = ("baseline", "candidate")) -> pd.Series:
    """paced_details of a comparison's pairs: each side's counts, the sides by ``names`` (Markdown,
    as Comparison holds them): 'baseline: none; candidate: latency: 5 of 30 samples host-paced'."""
    out = []
    for *sides, paced, ran in zip(pairs.base, pairs.cand, pairs.paced, pairs.ran, strict=True):
        d = {}
        for tag, text in ((paced, paced_text), ("throttled", throttled_text)):
            texts = [text(row) for row in sides]
            if tag and any(texts):
                d[tag] = "; ".join(f"{n}: {t or 'none'}" for n, t in zip(names, texts, strict=True))
        if ran:
            d["ran-differs"] = ran
        out.append(d)
    return pd.Series(out, index=pairs.index, dtype=object)


def _ran(row, col) -> str | None:
    """A RAN_COLUMNS value; None where not recorded (a run from before the column, experts that
    read no Triton config)."""
    v = row.get(col) if hasattr(row, "get") else None
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)


def pair_ran_text(base, cand) -> str:
    """'contiguous_gemm_used `gluon/gluon` → `gluon_wide/gluon_wide`' for each RAN_COLUMNS value
    the pair's sides differ in ('' where they ran the same; a value one side did not record is
    not compared)."""
    out = []
    for col in RAN_COLUMNS:
        a, b = _ran(base, col), _ran(cand, col)
        if a is not None and b is not None and a != b:
            out.append(f"{col} {md_code(a) if a else 'none'} → {md_code(b) if b else 'none'}")
    return "; ".join(out)


def pair_paced_tag(base, cand) -> str:
    """A pair's one host-paced tag: `host-paced` where either side's latency samples were paced,
    else `host-paced-aside` where either side's others were, '' for none (a pair on both lines
    would say its latency is GPU time beside saying the host may have paced it)."""
    tags = {paced_tag(base), paced_tag(cand)}
    return "host-paced" if "host-paced" in tags else "host-paced-aside" if "host-paced-aside" in tags else ""


def pair_flags(pairs: PairRows) -> pd.Series:
    """Flags of a comparison's pairs: either side's, `timing-differs` and `ran-differs`."""
    out = []
    for base, cand, paced, ran in zip(pairs.base, pairs.cand, pairs.paced, pairs.ran, strict=True):
        tags = []
        for side_row in (base, cand):
            # the phases' mismatch concerns the phase table, not the latency compared here
            tags += [t for t in flags_of(side_row) if t not in tags and t != "phases≠latency"]
        tags = [t for t in FLAG_TEXT if t in tags and (t == paced or t not in ("host-paced", "host-paced-aside"))]
        if base.get("status") == cand.get("status") == Status.OK and str(base.get("timing_mode")) != str(
            cand.get("timing_mode")
        ):
            tags.append("timing-differs")
        if base.get("status") == cand.get("status") == Status.OK and ran:
            tags.append("ran-differs")
        out.append(tags)
    return pd.Series(out, index=pairs.index, dtype=object)


def caveat_files(run_dir: Path | None, levels: int = 3) -> list[Path]:
    """caveats.md of the run directory and of the folders above it (up to ``levels``, never
    above a folder named `results`), outermost first."""
    if run_dir is None:
        return []
    found, d = [], Path(run_dir).resolve()
    for _ in range(levels + 1):
        if (d / "caveats.md").is_file():
            found.append(d / "caveats.md")
        if d.name == "results" or d.parent == d:
            break
        d = d.parent
    return list(reversed(found))


def _tp_ranks_note(measured: pd.DataFrame, who: str) -> list[str]:
    """The rows of a tensor-parallel backend (backend=tp): their all-reduce ran and is timed."""
    from moebench.config.spec import tensor_parallel

    if "backend" not in measured.columns or measured.empty:
        return []
    tp_backends = [b for b in measured["backend"].unique() if tensor_parallel(str(b))]  # one lookup a backend
    tp = measured[measured["backend"].isin(tp_backends)]
    if tp.empty:
        return []
    ws = pd.to_numeric(tp.get("world_size", pd.Series(dtype=float)), errors="coerce").dropna()
    sizes = ", ".join(f"TP-{int(n)}" for n in sorted(ws.unique())) or "TP"
    return [
        f"{who}{counted(len(tp), 'row')} {agree(len(tp), 'runs', 'run')} {sizes} over real ranks "
        "(backend=tp): the all-reduce of the ranks' partial "
        "outputs is timed, in the combine phase and the latency"
    ]


def run_notes(df: pd.DataFrame, env: dict, name: str = "") -> list[str]:
    """Sentences about a run's provenance: git sha unknown or not a commit, several, a tree
    dirty or not known to be clean (envinfo.tree_label)."""
    who = f"{name}: " if name else ""
    shas = sorted({str(s) for s in df.get("git_sha", pd.Series(dtype=object)).dropna()})
    env_sha = env_value(env, ["git_sha"]) if env else None
    notes = []
    named = shas or ([str(env_sha)] if env_sha else [])
    if not named:
        notes.append(f"{who}no git sha stored: which code ran is unknown")
    bad = [s for s in named if not is_commit(s)]
    if bad:
        notes.append(
            f"{who}git sha {', '.join(md_code(s) for s in bad)} names no commit: which code ran is "
            "not recorded (see the caveats)"
        )
    if len(shas) > 1:
        notes.append(f"{who}rows of {len(shas)} commits in one run ({', '.join(md_text(s[:10]) for s in shas)})")
    measured = df[df["status"] == Status.OK] if "status" in df.columns else df
    tp = pd.to_numeric(measured.get("simulate_tp", pd.Series(dtype=float)), errors="coerce")
    if (tp > 1).any():
        sizes = ", ".join(f"TP-{int(n)}" for n in sorted(tp[tp > 1].unique()))
        num_sharded = int((tp > 1).sum())
        notes.append(
            f"{who}{counted(num_sharded, 'row')} {agree(num_sharded, 'times', 'time')} one rank's shard of "
            f"{sizes} (backend.simulate_tp): the "
            "all-reduce of the ranks' partial outputs (tokens × hidden × 2 bytes a rank) is not timed on one GPU"
        )
    notes += _tp_ranks_note(measured, who)
    tree = tree_label(env) if env else None
    if tree == "dirty":
        paths = [str(p) for p in env.get("git_diff_paths") or []]  # text of a run folder: md_code
        shown = ", ".join(md_code(p) for p in paths[:5]) + (" …" if len(paths) > 5 else "")
        digest = str(env.get("git_diff_sha256") or "")[:12]
        notes.append(
            f"{who}the tree was dirty (uncommitted changes) when it ran"
            + (f": {shown}" if paths else "")
            + (f" (diff sha256 `{digest}`)" if digest.isalnum() else "")
        )
    elif tree == "unknown":
        notes.append(
            f"{who}whether the files that ran were the commit's is not recorded (no .git or tree stamp "
            "where it ran: scripts/copy_tree.sh): uncommitted changes cannot be ruled out"
        )
    return notes


DETAILED_LIMIT = 8  # rows named with their figures (``details``) on one flag's line


def flag_summary(tags: pd.Series, names: pd.Series, limit: int = 4, details: pd.Series | None = None) -> list[str]:
    """One line per flag: its meaning, how many rows and which (at most ``limit`` named); a row
    whose ``details`` (a {tag: Markdown} per row, in the order of ``tags``) has the tag is named with
    that text, up to DETAILED_LIMIT of them (the host-paced rows with their counts)."""
    lines = []
    extra = list(details) if details is not None else [{}] * len(tags)
    for tag in FLAG_TEXT:
        hit = [f"{n} ({d[tag]})" if tag in d else n for t, n, d in zip(tags, names, extra, strict=True) if tag in t]
        if hit:
            detailed = any(tag in d for d in extra)
            most = max(limit, DETAILED_LIMIT) if detailed else limit
            shown = ("; " if detailed else ", ").join(hit[:most]) + (
                f" (+{len(hit) - most} more)" if len(hit) > most else ""
            )
            lines.append(f"{counted(len(hit), 'row')} {FLAG_TEXT[tag]} — {shown}")
    return lines


def caveats_text(paths: list[Path], root: Path | None = None) -> list[str]:
    """Each caveats file as a markdown block headed by its path."""
    out = []
    for p in paths:
        shown = p
        if root is not None:
            try:
                shown = p.relative_to(root)
            except ValueError:
                pass
        body = p.read_text().strip()
        if body:
            out.append(f"Caveats stored with the run ({md_code(shown.as_posix())}):\n\n{body}")
    return out
