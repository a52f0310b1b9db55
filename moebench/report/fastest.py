"""The report's *Fastest per size* (docs/design.md, "What a report answers"): per workload and
token count, the fastest combination among the GPU-time rows and its margin over the runner-up
(`ranked`, which the summary's wins read too); where a workload ran one combination at a size, its
latency (nothing to rank); where its rows are host time, how many, why and what would give GPU
time. No workload goes unsaid: where a run holds several (models, world sizes, routings), each
line names its own by what varies among the run's rows (workloads.py), a host-time one included.

Latency here is GPU time only (time_basis.figure_basis): host time is never ranked, and a CPU run
names no fastest.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd

from moebench.report.columns import WORKLOAD_COLUMNS, combination, fmt_series, fmt_value, records
from moebench.report.flags import latency_paced, paced_mark
from moebench.report.fmt import fmt_us
from moebench.report.mdsafe import md_text
from moebench.report.time_basis import CPU, GPU, GPU_TIME_ADVICE, HOST, figure_basis, host_cause
from moebench.report.workloads import union_labels, workload_names
from moebench.results.row import Status
from moebench.util.words import agree, counted

TOP = 5  # ranked lines the section shows (the separable margins first, largest first); the rest counted
MAX_WORKLOADS = 5  # workloads given a line each for what is not ranked; the rest counted


@dataclass(frozen=True)
class Win:
    """The fastest GPU-time row of one workload at one size against its runner-up."""

    workload: str  # its name ('' where the run has one workload)
    tokens: int
    apart: bool  # the two rows' p20–p80 intervals are apart (a winner; else "no clear fastest")
    margin: float  # runner-up median / fastest median
    text: str  # the line, its workload named


@dataclass(frozen=True)
class Timed:
    """A run's ok rows with a latency and what each latency is (time_basis.figure_basis: GPU, HOST or
    CPU), read once for the whole opening."""

    rows: pd.DataFrame
    basis: pd.Series

    @classmethod
    def of(cls, df: pd.DataFrame) -> Timed:
        rows = df[(df["status"] == Status.OK) & df["latency_us_median"].notna()]
        return cls(rows, pd.Series([figure_basis(r)[0] for r in records(rows)], index=rows.index, dtype=object))

    def where(self, basis: str) -> pd.DataFrame:
        return self.rows[self.basis == basis]


def ranked(timed: Timed) -> list[Win]:
    """The fastest GPU-time row of each workload and size with two or more (host and CPU time are
    never ranked), the separable margins first, largest first. A line reads
    `<workload> · <combination> · <n> tok: fastest, 1.38× ahead of <runner-up> (942.0 vs 1295 µs)`,
    the workload named by what varies among the run's ok rows (none where it has one)."""
    ok = timed.where(GPU)
    if ok["combo_key"].nunique() < 2:
        return []
    names = workload_names(timed.rows)
    labels = union_labels(ok).map(md_text)  # the combination, less the workload its line names
    keys = [fmt_series(ok[c]) for c in (*WORKLOAD_COLUMNS, "tokens_per_rank") if c in ok.columns]
    out = []
    for _, g in ok.groupby(keys, sort=False):
        if len(g) < 2:
            continue
        g = g.sort_values("latency_us_median")
        best, second = g.iloc[0], g.iloc[1]
        margin = second["latency_us_median"] / best["latency_us_median"]
        # a winner only where the two p20–p80 intervals are apart (compare's first condition)
        apart = bool(best["latency_us_p80"] < second["latency_us_p20"])
        name, other = names.loc[g.index[0]], labels.loc[g.index[1]]
        who = " · ".join(
            x for x in (md_text(name), labels.loc[g.index[0]], f"{fmt_value(best['tokens_per_rank'])} tok") if x
        )
        times = f"{fmt_us(best['latency_us_median'])} vs {fmt_us(second['latency_us_median'])} µs"
        text = (
            f"{who}: fastest, {margin:.2f}× ahead of {other} ({times})"
            if apart
            else f"{who}: no clear fastest, {margin:.2f}× by median over {other} ({times}) with their p20–p80 "
            "overlapping"
        )
        # a row with host-paced latency samples competes, but never silently
        paced = [f"{w} {latency_paced(r)}" for w, r in (("the fastest", best), (other, second)) if latency_paced(r)]
        if paced:
            text += f"; host-paced latency samples: {', '.join(paced)}"
        out.append(Win(name, int(best["tokens_per_rank"]), apart, float(margin), text))
    return sorted(out, key=lambda w: (not w.apart, -w.margin))


def fastest_section(timed: Timed, wins: list[Win]) -> list[str]:
    """The section's lines: the fastest per workload and size (`wins`: `ranked`, the first TOP),
    then for each workload what is not ranked: its sizes of one GPU-time combination (their
    latency) and its host-time rows (how many, why, what would give GPU time); or one line why
    nothing is: CPU rows, every ok row host time, no ok row."""
    basis = timed.basis
    lines = ["## Fastest per size"]
    if not len(timed.rows):
        return [*lines, "- nothing ranked: no ok row has a latency (*Status and skip reasons* below says why)"]
    host, num_cpu = timed.where(HOST), int((basis == CPU).sum())
    if not (basis == GPU).any():  # nothing ranked: CPU rows, host-time rows
        if num_cpu:
            lines.append(
                f"- no fastest named: {counted(num_cpu, 'ok row')} {agree(num_cpu, 'is', 'are')} CPU time (pipeline "
                "checks, not performance figures)"
            )
        n = len(host)
        every = (
            f"not ranked: {counted(n, 'ok row')} {agree(n, 'is', 'are')}"
            if num_cpu
            else "nothing ranked: " + ("the one ok row is" if n == 1 else f"all {n} ok rows are")
        )
        return lines + ([f"- {every} host time {host_text(host, set())}"] if n else [])
    lines += [f"- {w.text}" for w in wins[:TOP]]
    if len(wins) > TOP:
        lines.append(
            f"- and {len(wins) - TOP} more ranked at other sizes or workloads: the bold cells of *Latency of every "
            "combination* below"
        )
    return lines + unranked_lines(timed, {(w.workload, w.tokens) for w in wins})


def unranked_lines(timed: Timed, won: set[tuple[str, int]]) -> list[str]:
    """What of the run is not ranked, a line per workload (the first MAX_WORKLOADS; the rest
    counted): the sizes where it ran one GPU-time combination (`won`: the workload sizes ranked),
    then its host-time rows. Where nothing is ranked and every workload ran the same one
    combination, that combination is named once above a line per workload."""
    names = workload_names(timed.rows)
    gpu = timed.where(GPU)
    size = gpu.groupby([names.loc[gpu.index], gpu["tokens_per_rank"]])["combo_key"].transform("size")
    ranked_here = pd.Series([(names.loc[i], int(t)) in won for i, t in gpu["tokens_per_rank"].items()], index=gpu.index)
    alone = gpu[(size == 1) & ~ranked_here]
    host = timed.where(HOST)
    combos = {md_text(combination(r)) for _, r in alone.iterrows()}  # Series: combination reads .index
    # one combination everywhere, nothing ranked, no host time: named once (a tuned tile file's run)
    once = not won and not len(host) and len(combos) == 1 and names.nunique() > 1
    lines = (
        [f"one combination per size, nothing to rank: {combos.pop()}; GPU time (median) per workload:"] if once else []
    )
    said: set[str] = set()  # the advice given: once per section
    shown = [n for n in sorted(set(names)) if (names.loc[alone.index] == n).any() or (names.loc[host.index] == n).any()]
    for name in shown[:MAX_WORKLOADS]:
        one, slow = alone[names.loc[alone.index] == name], host[names.loc[host.index] == name]
        num_gpu = int((names.loc[gpu.index] == name).sum())  # its GPU-time rows
        if len(one):
            lines.append(alone_line(name, one, len(one) == num_gpu, once))
        if len(slow):
            where = f"{md_text(name)}: " if name else ""
            n = len(slow)
            what = (
                f"not ranked: {counted(n, 'ok row')} {agree(n, 'is', 'are')}"
                if num_gpu
                else f"nothing ranked: {'its one ok row is' if n == 1 else f'all {n} ok rows are'}"
            )
            lines.append(f"{where}{what} host time {host_text(slow, said)}")
    if len(shown) > MAX_WORKLOADS:
        lines.append(
            f"and {counted(len(shown) - MAX_WORKLOADS, 'more workload')} in *Latency of every combination* below"
        )
    return [f"- {x}" for x in lines]


def alone_line(name: str, one: pd.DataFrame, every: bool, once: bool = False) -> str:
    """The latency per size of a workload's sizes of one GPU-time combination (`one`: those rows;
    `every`: all its GPU-time rows; `once`: the combination named above, the line its sizes only),
    the combination named once where it is one; a run of one workload names its model."""
    rows = [r for _, r in one.sort_values("tokens_per_rank").iterrows()]
    named = [md_text(combination(r)) for r in rows]
    sizes = ", ".join(
        f"{fmt_us(r['latency_us_median'])} µs at {fmt_value(r['tokens_per_rank'])} tok"
        + (f" {paced_mark(r)}" if paced_mark(r) else "")
        + (f" ({n})" if len(set(named)) > 1 else "")
        for r, n in zip(rows, named, strict=True)
    )
    if once:
        return f"{md_text(name)}: {sizes}"
    head = "one combination per size" if every else f"one combination at {counted(len(rows), 'size')}"
    on = "" if name else f" on {md_text(fmt_value(rows[0]['model']))}"
    what = f"{named[0]}{on} takes " if len(set(named)) == 1 else f"{on.strip()}: " if on else ""
    where = f"{md_text(name)}: " if name else ""
    return f"{where}{head}, nothing to rank: {what}{sizes} (GPU time, median)"


def host_text(host: pd.DataFrame, said: set[str]) -> str:
    """'(why); what would give GPU time' of host-time rows (time_basis.figure_basis's why, time_basis.
    GPU_TIME_ADVICE), each cause with its count where they differ; an advice in `said` (given
    above) left out, and those given added to it."""
    causes = Counter(
        (figure_basis(r)[1].removeprefix("host time: "), GPU_TIME_ADVICE[host_cause(r)]) for r in records(host)
    ).most_common()

    def advice(text: str) -> str:
        if text in said:
            return ""
        said.add(text)
        return text

    if len(causes) == 1:
        (why, tip), _ = causes[0]
        tip = advice(tip)
        return f"({md_text(why)})" + (f"; {tip}" if tip else "")
    parts = []
    for (why, tip), n in causes:
        tip = advice(tip)
        parts.append(f"{n} ({md_text(why)})" + (f": {tip}" if tip else ""))
    return "— " + "; ".join(parts)
