"""What `moebench tune --decisions` writes beside the tiles file, and how `--install` merges it.

    <out>/configs/<vLLM stem>.moebench.json   the decisions sidecar (kernels/triton/decisions.py:
                                              the format the layer reads), plus a "provenance"
                                              section the layer ignores: per entry what was
                                              chosen, what it beat and by how much
    <out>/tune.json "decisions"               every option's figures per token count
    <out>/decisions.jsonl                     the same, appended as timed (decision_trials.py: a resume)
    the printed table (summary)               per token count how it was timed, what was chosen,
                                              against the layer today and the runner-up

The tiles file itself is left exactly as vLLM reads it (files.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Optional

from moebench.kernels.triton import decisions as kdec
from moebench.tune.decide import DecisionResult, switch_over
from moebench.tune.decision_options import CURRENT
from moebench.tune.decision_trials import timed_to_json
from moebench.tune.trials import json_num
from moebench.util.safe_write import replace_text, safe_dir
from moebench.util.words import latency


def _provenance(r: DecisionResult) -> dict:
    best = r.get(r.best) if r.best else None
    cur = r.get(CURRENT)
    return {
        "tokens": r.tokens,
        "timing": r.timing,
        "chosen": r.best,
        "chosen_us": json_num(best.us) if best else None,
        "fastest_overall": r.best_overall,
        "beat": {t.option: json_num(t.us / best.us) for t in r.timed if best and t.ok and t.option != r.best},
        "current_ran": cur.ran if cur is not None else "",
        "not_run": [list(s) for s in r.not_run],  # (options, why)
        "retimed": r.retimed,  # why the count's options were timed twice ('' once)
    }


def sidecar(info: dict, results: list[DecisionResult]) -> dict:
    """The decisions file's content (kernels/triton/decisions.py's format)."""
    entries = {str(r.rows): r.entry for r in sorted(results, key=lambda r: r.rows) if r.entry}
    return {
        kdec.SCHEMA_KEY: kdec.SCHEMA_VERSION,
        "layer": {k: info.get(k) for k in ("E", "N", "hidden", "topk", "quant", "model", "simulate_ep", "simulate_tp")},
        "deepgemm_min_tokens": switch_over(results),
        "entries": entries,
        "provenance": {str(r.rows): _provenance(r) for r in results},
    }


def to_json(results: list[DecisionResult]) -> list[dict]:
    """tune.json's "decisions": every option's figures at every count. Why a count was timed twice
    is stored once, as its record's `retimed`, not again in each of its options' (every one carries
    the same string: decide._run; decisions.jsonl keeps it per option, its lines read alone). A
    tune.json written with both reads the same (install_check reads the options' figures only)."""
    return [
        {
            **{k: json_num(v) for k, v in dataclasses.asdict(r).items() if k != "timed"},
            "retimed": r.retimed,  # (a property: why the count was timed twice)
            "timed": [timed_to_json(t) for t in r.timed],
        }
        for r in results
    ]


def write(info: dict, results: list[DecisionResult], out_dir: Path, tiles_name: str) -> Optional[Path]:
    """The sidecar beside the tiles file of that name in out_dir/configs (None: no entry and no switch-over)."""
    side = sidecar(info, results)
    kdec.parse(side, "the decisions written")  # what the layer will read must parse
    if not side["entries"] and side["deepgemm_min_tokens"] is None:
        return None
    cfg_dir = safe_dir(Path(out_dir), "configs")
    return replace_text(cfg_dir / kdec.decisions_name(tiles_name), json.dumps(side, indent=2) + "\n")


def install(tiles_src: Path, tiles_dest: Path, log: Callable[[str], None]) -> Optional[Path]:
    """Merge the sidecar beside tiles_src (if any) into the one beside tiles_dest (its entries win;
    a new switch-over replaces the old). Where the tiles moved up from kernels/configs/partial/ (the
    merged file covers vLLM's grid: files.install removed the partial one), the partial sidecar is
    merged in first and removed, as the tiles' and the provenance's are. Returns where it went."""
    from moebench.kernels.triton import config as tconfig

    src = Path(tiles_src).with_name(kdec.decisions_name(Path(tiles_src).name))
    dest = Path(tiles_dest).with_name(kdec.decisions_name(Path(tiles_dest).name))
    part = tconfig.PARTIAL_DIR / dest.name
    superseded = part if part != dest and part.is_file() else None
    if not src.is_file() and superseded is None:
        return None
    new: dict = {}
    for side in (superseded, dest, src):  # later wins
        if side is None or not side.is_file():
            continue
        got = json.loads(side.read_text())
        got["entries"] = {**new.get("entries", {}), **got.get("entries", {})}
        got["provenance"] = {**new.get("provenance", {}), **got.get("provenance", {})}
        if got.get("deepgemm_min_tokens") is None:
            got["deepgemm_min_tokens"] = new.get("deepgemm_min_tokens")
        new = got
    new["entries"] = {k: new["entries"][k] for k in sorted(new["entries"], key=int)}
    kdec.parse(new, str(dest))
    replace_text(dest, json.dumps(new, indent=2) + "\n")
    if superseded is not None:
        superseded.unlink()
    kdec.clear_cache()
    log(f"installed {dest}")
    return dest


def summary(results: list[DecisionResult]) -> str:
    """Markdown: per token count what was chosen, what it beat and by how much (times in the unit that
    reads best, words.latency)."""
    lines = [
        "| tokens | timing | chosen | time | vs current (today's constants) | runner-up | skipped |",
        "|---:|---|---|---:|---:|---|---|",
    ]
    for r in results:
        best = r.get(r.best_overall) if r.best_overall else None
        if best is None:
            errs = "; ".join(f"{t.option}: {t.error}" for t in r.timed if t.error)[:200]
            lines.append(f"| {r.tokens} | {r.timing or '–'} | none ran ({errs}) | – | – | – | |")
            continue
        cur = r.get(CURRENT)
        vs = "–"
        if cur is not None and cur.ok:
            vs = f"{r.ratio(best.option, CURRENT):.2f}x (current ran {cur.ran or '?'}: {latency(cur.us)})"
        others = sorted((t for t in r.timed if t.ok and t.option not in (CURRENT, best.option)), key=lambda t: t.us)
        up = f"{others[0].option} {latency(others[0].us)} ({others[0].us / best.us:.2f}x)" if others else "–"
        skip = "; ".join(f"{n}: {w[:60]}{'…' if len(w) > 60 else ''}" for n, w in r.not_run)  # (tune.json: whole)
        lines.append(f"| {r.tokens} | {r.timing or '–'} | {best.option} | {latency(best.us)} | {vs} | {up} | {skip} |")
    twice = [f"{r.tokens} tokens ({r.retimed})" for r in results if r.retimed]
    if twice:  # (the figures above are the second timing's)
        lines.append(f"\nTimed twice, the host having paced a sample the first time: {'; '.join(twice)}.")
    return "\n".join(lines)
