"""The first lines of a comparison: the verdict a reviewer reads before any table.

For each changed row its size with the 95 % interval; the changes that are significant
but under the threshold; the geometric mean over the rows ok on both sides; memory
changes; whether the environments are comparable; rows on one side only; and the
exit status with why (docs/design.md, "Exit status").

Text from the runs (names, values, reasons, environments) enters these lines escaped
(moebench/report/mdsafe.py md_text; pair_names and envinfo's text escape their own).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moebench.report.clock_verdict import NOT_RECORDED
from moebench.report.compare import Comparison
from moebench.report.compare_tables import fmt_us_pair, memory_change_lines, pair_names
from moebench.report.envinfo import comparable_summary, environment_check
from moebench.report.fmt import fmt_change
from moebench.report.overlap import disjoint_text, field_differences
from moebench.report.table import md_text
from moebench.report.time_basis import CPU
from moebench.results.row import CHANGED_VERDICTS, NO_VERDICT, Verdict
from moebench.util.words import agree, counted

LIMIT = 8  # changed rows named one a line; the rest counted
# what the headline counts and the bullets name one a line: the verdicts a measurement gives (slower,
# faster) and a status changed by the candidate's own doing (broken, fixed); a skipped row has no
# measurement on a side and is counted apart, one line per reason (skipped_lines)
CALLED = tuple(v for v in CHANGED_VERDICTS if v != Verdict.SKIPPED)


def why_nothing_matched(cmp: Comparison) -> str:
    """Why no pair is ok on both sides: the identity columns whose values the two sides
    do not share (or that no pair is ok on both)."""
    if len(cmp.matched):
        n = len(cmp.matched)
        return (
            f"none of the {counted(n, 'matched row')} is ok on both sides "
            f"({', '.join(f'{k} {v}' for k, v in cmp.counts().items() if v)})"
        )
    b, c = cmp.only_baseline, cmp.only_candidate
    if cmp.axis is not None:
        return (
            f"no row matched: no row with {md_text(f'{cmp.axis.field}={cmp.axis.a}')} has a partner with "
            f"{md_text(f'{cmp.axis.field}={cmp.axis.b}')} that agrees in every other identity field"
        )
    if not len(b) or not len(c):
        return f"no row matched: the {'baseline' if not len(b) else 'candidate'} has no rows"
    disjoint, differ = field_differences(b, c)
    if disjoint:
        where = "; the runs share no value of " + disjoint_text(disjoint[:3])
    elif differ:
        where = "; the runs differ in " + ", ".join(differ[:4])
    else:
        where = (
            "; their identity columns agree, so the keys differ in a field the rows do not show "
            "(moebench/config/spec.py)"
        )
    return f"no row matched: the combination keys of the two runs never meet{where}"


def row_names(m: pd.DataFrame) -> pd.Series:
    """Pair names labelled by what varies among the pairs ok on a side (rows ok on
    neither side would lengthen every name)."""
    shown = m[m["verdict"] != Verdict.NEITHER_OK]
    return pair_names(shown).reindex(m.index).fillna("") if len(shown) else pair_names(m)


def _change_line(verdict: Verdict, name: str, r: dict, bounds: tuple[float, float]) -> str:
    if verdict == Verdict.BROKEN:
        why = f": {md_text(r['cand_reason'])}" if r.get("cand_reason") else ""
        return f"**{verdict}** {name}: ok → {md_text(r['cand_status'])}{why}"
    if verdict == Verdict.FIXED:
        return f"**fixed** {name}: {md_text(r['base_status'])} → ok"
    return (
        f"**{verdict}** {name}: {fmt_change(r['ratio'], r['ci_lo'], r['ci_hi'], bounds)} "
        f"({fmt_us_pair(r['base_latency_us_median'], r['cand_latency_us_median'])})"
    )


_APART = {Verdict.CLOCK: "clocks differ", Verdict.HOST: "host time", Verdict.CPU: "CPU time"}


def _judged_of(cmp: Comparison) -> str:
    """'5 rows ok on both sides (threshold ×1.05)', or where some of those carry no verdict
    '5 of 6 rows ok on both sides (1 without a verdict: clocks differ; threshold ×1.05)': the
    count the verdict rests on and the rows it leaves out, so the headline agrees with the table."""
    n_ok, n_both = len(cmp.judged), len(cmp.comparable)
    threshold = f"threshold ×{cmp.threshold:g}"
    if n_ok == n_both:
        return f"{counted(n_ok, 'row')} ok on both sides ({threshold})"
    vc = cmp.comparable["verdict"].value_counts()
    why = [(n, _APART[v]) for v in NO_VERDICT if (n := int(vc.get(v, 0)))]
    because = why[0][1] if len(why) == 1 else ", ".join(f"{n} {w}" for n, w in why)
    return (
        f"{n_ok} of {counted(n_both, 'row')} ok on both sides ({n_both - n_ok} without a verdict: {because}; "
        f"{threshold})"
    )


def verdict_lines(cmp: Comparison, code: int, why: list[str], quality: Sequence[str] = ()) -> list[str]:
    """Markdown: a bold headline, then one bullet per fact (module doc)."""
    m = cmp.matched
    names = row_names(m)
    counts = cmp.counts()
    ok = cmp.judged
    # the verdicts a measurement or a failure gives; a skipped row is counted apart (skipped_lines)
    changed = {v: counts[v] for v in CALLED if counts[v]}
    what = ", ".join(f"{n} {v}" for v, n in changed.items()) or f"no change beyond ×{cmp.threshold:g}"
    subject = f"{cmp.candidate_name} vs {cmp.baseline_name}"
    tail = f" — exit {code}" + (f": {'; '.join(why)}" if why else "")
    num_skipped = counts[Verdict.SKIPPED]
    skipped = f"; {num_skipped} skipped in {cmp.candidate_name} (no verdict)" if num_skipped else ""
    if not len(cmp.comparable):
        # nothing was measured on both sides: a bold "no change" would read as a pass
        status = ", ".join(f"{n} {v}" for v in CHANGED_VERDICTS if (n := counts[v]))
        changes = f": {status}" if status else ""
        reason = why_nothing_matched(cmp)
        said = "" if reason in why else f" — {reason}"
        head = f"**No comparable rows ({subject}){changes}**{said}{tail}"
    elif not len(ok) and counts[Verdict.CPU] and not counts[Verdict.HOST]:
        head = (
            f"**No verdict ({subject}): CPU figures are pipeline checks, not performance figures** — "
            f"{counted(counts[Verdict.CPU], 'row')} ok on both sides, compared in the table below "
            f"(`--cpu-verdict` asks for a verdict){tail}"
        )
    elif not len(ok) and not changed:
        head = f"**No verdict ({subject})** in {_judged_of(cmp)}{skipped}{tail}"
    else:
        head = f"**Verdict ({subject}): {what}** in {_judged_of(cmp)}{skipped}{tail}"
    lines = [head]
    for tag, what_kind in (
        (Verdict.HOST, "a side's latency is host time"),
        (Verdict.CPU, "CPU time on both sides"),
        (Verdict.CLOCK, "the sides' GPU clocks differ"),
    ):
        apart = m[m["verdict"] == tag]
        if len(apart) and (tag != Verdict.CPU or len(ok)):
            shown = ", ".join(names.loc[i] for i in apart.index[:LIMIT])
            more = f" (+{len(apart) - LIMIT} more)" if len(apart) > LIMIT else ""
            lines.append(
                f"- no verdict ({what_kind}): {counted(len(apart), 'row')} — {shown}{more}; "
                f"{md_text(apart['no_verdict_why'].iloc[0])}"
            )
    changed_rows = m[m["verdict"].isin(CALLED)]
    order = {v: i for i, v in enumerate(CALLED)}
    changed_rows = changed_rows.assign(
        _o=changed_rows["verdict"].map(order), _d=-np.abs(np.log(changed_rows["ratio"].astype(float).fillna(1.0)))
    )
    changed_rows = changed_rows.sort_values(["_o", "_d"], kind="stable")
    for i, r in changed_rows.head(LIMIT).iterrows():
        lines.append("- " + _change_line(r["verdict"], names.loc[i], r.to_dict(), cmp.bounds))
    if len(changed_rows) > LIMIT:
        lines.append(f"- … and {counted(len(changed_rows) - LIMIT, 'more changed row')} (table below)")
    sig = m[(m["verdict"] == Verdict.SIMILAR) & m["significant"].astype(bool)]
    r = sig["ratio"].astype(float)
    past = (r >= cmp.threshold) | (r <= 1 / cmp.threshold)
    for rows, what in (
        (sig[~past], f"significant but under ×{cmp.threshold:g}"),
        (
            sig[past],
            f"significant and past ×{cmp.threshold:g}, but the p20–p80 intervals overlap (noisy rows: no verdict)",
        ),
    ):
        if len(rows):
            rows = rows.assign(_d=-np.abs(np.log(rows["ratio"].astype(float)))).sort_values("_d", kind="stable")
            items = [
                f"{names.loc[i]} {fmt_change(x['ratio'], x['ci_lo'], x['ci_hi'], cmp.bounds)}"
                for i, x in rows.head(LIMIT).iterrows()
            ]
            more = f" (+{len(rows) - LIMIT} more)" if len(rows) > LIMIT else ""
            lines.append(f"- {what}: " + "; ".join(items) + more)
    quiet = int(((m["verdict"] == Verdict.SIMILAR) & ~m["significant"].astype(bool)).sum())
    if quiet:
        lines.append(f"- no significant change: {counted(quiet, 'row')}")
    g, lo, hi = cmp.geomean()
    if np.isfinite(g):
        lines.append(f"- geometric mean over {counted(len(ok), 'row')}: {fmt_change(g, lo, hi, cmp.bounds)}")
    mem = memory_change_lines(cmp, names)
    if mem:
        lines += [f"- memory: {x}" for x in mem]
    elif m[["base_workspace_bytes_peak", "cand_workspace_bytes_peak", "base_device_bytes_peak"]].notna().any().any():
        lines.append(f"- memory: workspace and device peak within ×{cmp.threshold:g} in every row")
    else:
        lines.append("- memory: not measured")
    lines.append("- " + environment_line(cmp))
    if clocks := clock_line(cmp):
        lines.append("- " + clocks)
    if len(cmp.only_baseline) or len(cmp.only_candidate):
        sides = [(len(cmp.only_baseline), cmp.baseline_name), (len(cmp.only_candidate), cmp.candidate_name)]
        only = [f"{counted(n, 'row')} only in {name}" for n, name in sides if n]
        lines.append(f"- unmatched: {', '.join(only)} (listed below)")
    lines += skipped_lines(cmp)
    never = m[m["verdict"] == Verdict.CANNOT_RUN]
    if len(never):
        lines.append(
            f"- no verdict, cannot run: {counted(len(never), 'row')} ok in {cmp.baseline_name} whose combination in "
            f"{cmp.candidate_name} breaks a rule of the plan (e.g. {md_text(never['cand_reason'].iloc[0])}); "
            "in the table below"
        )
    num_na = counts[Verdict.NEITHER_OK]
    if num_na:
        lines.append(f"- {counted(num_na, 'matched row')} ok on neither side")
    if quality:
        lines.append(f"- data quality: {counted(len(quality), 'note')} in the report's Data quality section")
    return lines


REASONS = 3  # skip reasons given a line each; the rest counted in one


def skipped_lines(cmp: Comparison) -> list[str]:
    """One bullet per distinct reason the candidate skipped rows ok in the baseline, with their count
    (most rows first; the reason said once, where it was said per row it crowded out the measured
    changes): no measurement on that side, so no verdict (the table marks them `·`)."""
    s = cmp.matched[cmp.matched["verdict"] == Verdict.SKIPPED]
    if not len(s):
        return []
    reasons = s["cand_reason"].fillna("").astype(str).value_counts(sort=True)
    lines = []
    for reason, n in reasons.head(REASONS).items():
        why = md_text(reason) if reason else "no reason recorded"
        lines.append(
            f"- no verdict, skipped: {counted(int(n), 'row')} ok in {cmp.baseline_name} "
            f"{agree(int(n), 'was', 'were')} skipped in {cmp.candidate_name} — {why}"
        )
    if len(reasons) > REASONS:
        rest = reasons.iloc[REASONS:]
        lines.append(
            f"- no verdict, skipped: {counted(int(rest.sum()), 'more row')} for "
            f"{counted(len(rest), 'other reason')} (the table below)"
        )
    return lines


def clock_line(cmp: Comparison) -> str:
    """Whether the two sides ran at the same SM clock (report/clock_verdict.py): how many pairs
    matched, differed (with the verdict kept by normalising or not) or lack a clock; "" without
    pairs ok on both sides."""
    m = cmp.comparable
    if "device" in m.columns:  # CPU rows have no clock to speak of
        m = m[m["device"].astype(str) != CPU]
    if not len(m) or "clock_check" not in m.columns:
        return ""
    check = m["clock_check"].fillna("").astype(str)
    clock = m["verdict"] == Verdict.CLOCK
    differ = int(clock.sum())
    # normalised (clock_ratio set: clocks apart, compute-bound) and not `clock differs`: the verdict
    # survived normalising (clock_verdict)
    ratio = pd.to_numeric(m["clock_ratio"], errors="coerce").astype(float)
    survives = np.isfinite(ratio) & ~clock
    survived = int(survives.sum())
    matched = int(check.str.startswith("clocks matched").sum())
    missing = int((check == NOT_RECORDED).sum())
    # one wording whether a side lacks its clock in every pair or in some
    unrecorded = (
        f"{NOT_RECORDED} in {counted(missing, 'row')} (no SM clock on a side: verdicts as before clocks were read)"
    )
    if missing and not (matched or differ or survived):  # nothing measured to say beside it
        return f"clocks: {unrecorded}"
    parts = [f"matched in {counted(matched, 'row')}"] if matched else []
    if differ or survived:
        ratios = ratio[survives]
        names = row_names(cmp.matched)
        scaled = [f"{names.loc[i]} {fmt_change(r, bounds=cmp.bounds)}" for i, r in ratios.head(LIMIT).items()]
        more = f" (+{len(ratios) - LIMIT} more)" if len(ratios) > LIMIT else ""
        at = f": {', '.join(scaled)}{more} at the baseline's clock" if scaled else ""
        kept = f"{survived} {agree(survived, 'kept its verdict', 'kept their verdicts')} normalised as compute-bound"
        parts.append(f"differ in {counted(differ + survived, 'row')}" + (f" ({kept}{at})" if survived else ""))
    if missing:
        parts.append(unrecorded)
    return "clocks (median SM clock of each side): " + ", ".join(parts)


def environment_line(cmp: Comparison) -> str:
    if cmp.one_run:
        return "environments: one run, one environment"
    ok, diffs = environment_check(cmp.base_env, cmp.cand_env)
    if ok:
        return f"environments: comparable ({comparable_summary(cmp.cand_env)})"
    return "environments: **not comparable** — " + "; ".join(diffs)


def verdict_record(cmp: Comparison, code: int, why: list[str]) -> dict:
    """The verdict as data (json output)."""
    g, lo, hi = cmp.geomean()
    ok, diffs = environment_check(cmp.base_env, cmp.cand_env) if not cmp.one_run else (True, [])
    names = row_names(cmp.matched)
    changed = cmp.matched[cmp.matched["verdict"].isin(CHANGED_VERDICTS)]
    return {
        "exit_status": code,
        "why": why,
        "baseline": cmp.baseline_name,
        "candidate": cmp.candidate_name,
        "axis": str(cmp.axis) if cmp.axis else None,
        "threshold": cmp.threshold,
        "alpha": cmp.alpha,
        "counts": cmp.counts(),
        "rows_ok_on_both_sides": int(len(cmp.comparable)),
        "rows_judged": int(len(cmp.judged)),
        "no_verdict": [
            {"name": names.loc[i], "basis": r["verdict"], "why": r["no_verdict_why"]}
            for i, r in cmp.matched.iterrows()
            if r["verdict"] in NO_VERDICT
        ],
        "geomean_ratio": g,
        "geomean_ci": [lo, hi],
        "changed": [
            {"name": names.loc[i], "verdict": r["verdict"], "ratio": r["ratio"], "ci": [r["ci_lo"], r["ci_hi"]]}
            for i, r in changed.iterrows()
        ],
        "significant_under_threshold": [
            names.loc[i]
            for i, r in cmp.matched.iterrows()
            if r["verdict"] == Verdict.SIMILAR and bool(r["significant"])
        ],
        "environments_comparable": ok,
        "environment_differences": diffs,
        "only_baseline": int(len(cmp.only_baseline)),
        "only_candidate": int(len(cmp.only_candidate)),
    }


def frame_names(df: pd.DataFrame) -> pd.Series:
    """Names of a run's rows as the verdict writes them (for flag lists)."""
    return pair_names(df) if len(df) else pd.Series([], dtype=object)


# what a non-zero exit status may be asked to mean (--fail-on); docs/design.md, "Exit status"
FAIL_ON = (Verdict.SLOWER, Verdict.BROKEN, "memory", "missing", "empty", "env")


DEFAULT_FAIL_ON = (Verdict.SLOWER, Verdict.BROKEN, "empty")


def exit_status(cmp: Comparison, fail_on=DEFAULT_FAIL_ON) -> tuple[int, list[str]]:
    """(0 or 1, why) by docs/design.md's "Exit status" table: 1 when a row is slower beyond
    the threshold, a row broke (was ok; now failed, incorrect, timeout or oom) or no row
    matched, each as ``fail_on`` asks; also `memory` (a workspace larger by the threshold),
    `missing` (a baseline row the candidate lacks), `env` (environments not comparable)."""
    from moebench.report.verdict import environment_check, why_nothing_matched

    unknown = sorted(set(fail_on) - set(FAIL_ON))
    if unknown:
        raise ValueError(f"--fail-on {unknown[0]!r}: use a comma list of {', '.join(FAIL_ON)} (or none)")
    counts, why = cmp.counts(), []
    if "empty" in fail_on and not len(cmp.comparable):
        why.append(why_nothing_matched(cmp))
    if Verdict.SLOWER in fail_on and counts[Verdict.SLOWER]:
        why.append(f"{counted(counts[Verdict.SLOWER], 'row')} slower beyond ×{cmp.threshold:g}")
    if Verdict.BROKEN in fail_on and counts[Verdict.BROKEN]:
        why.append(
            f"{counted(counts[Verdict.BROKEN], 'row')} broken (ok in the baseline, now failed/incorrect/timeout/oom)"
        )
    if "memory" in fail_on and (cmp.matched["mem_verdict"] == "larger").any():
        why.append(f"{counted(int((cmp.matched['mem_verdict'] == 'larger').sum()), 'row')} with a larger workspace")
    if "missing" in fail_on and len(cmp.only_baseline):
        why.append(f"{counted(len(cmp.only_baseline), 'baseline row')} missing from the candidate")
    if "env" in fail_on and not cmp.one_run:
        ok, diffs = environment_check(cmp.base_env, cmp.cand_env)
        if not ok:
            why.append("environments not comparable: " + "; ".join(diffs))
    return (1 if why else 0), why


def parse_fail_on(text: str) -> tuple[str, ...]:
    """'slower,broken' -> ('slower', 'broken'); 'none' -> ()."""
    items = tuple(s.strip() for s in str(text).split(",") if s.strip())
    if items in (("none",), ()):
        return ()
    unknown = [s for s in items if s not in FAIL_ON]
    if unknown:
        raise ValueError(f"--fail-on {unknown[0]!r}: use a comma list of {', '.join(FAIL_ON)}, or none")
    return items
