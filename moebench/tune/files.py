"""What a tune writes, and where `--install` puts it.

    <out>/configs/<vLLM name>.json             the winner per measured token count, six
                                               fields an entry (vLLM passes every field of an
                                               entry to its kernel: nothing else goes in)
    <out>/configs/sglang/triton_X_Y_Z/<SGLang name>  the same entries where SGLang looks (its
                                               per-Triton-version folder, `block_shape=[128, 128]`)
    <out>/configs/<vLLM stem>.provenance.json  the sidecar: what each entry measured, against
                                               what, on which kernel and machine
    <out>/tune.json                            the run: layer, space, budget, per token count
                                               the search's steps, baselines, finalists; with
                                               --max-regression the check (regression.py)
    <out>/trials.jsonl                         every trial of the search (trials.py)
    <out>/decisions.jsonl                      with --decisions, every option's timing (decision_trials.py)
    <out>/env.json, <out>/envs/<id>.json       the machine's fingerprint (moebench/run/env.py), as a
                                               sweep's run folder has it: the first invocation's,
                                               and each invocation's (a resumed tune may run
                                               other code)

`--install` merges the entries into kernels/configs/ when the file then covers vLLM's
batch-size grid, else into kernels/configs/partial/, a folder vLLM never reads (it
would route every batch size to the nearest entry, however far: vllm_check.py); with
`--max-regression` only once the check passed (the sidecar then carries its figures);
`--install-from` decides the same on the figures tune.json holds (install_check.py).
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

from moebench.kernels.triton import config as tconfig
from moebench.kernels.triton import decisions as kdecisions
from moebench.tune.trials import json_num
from moebench.tune.vllm_check import covers_grid, describe_routes
from moebench.util.safe_write import replace_text, safe_dir, safe_dir_below
from moebench.util.words import counted, latency

KERNEL_NOTE = (
    "tiles of moebench's gathered fused-MoE Triton kernel (kernels/triton/gemm.py), not of vLLM's "
    "fused_moe_kernel: same file format and tile semantics, different kernel code (see kernels/configs/README.md)"
)


def environment() -> dict:
    """The device, library versions and commit a tune ran on (MOEBENCH_GIT_SHA names a copied tree's),
    and whether Triton's interpreter ran the kernels (host time: install_check.host_time refuses it)."""
    import torch
    import triton

    from moebench.kernels.triton.common import interpreting
    from moebench.run.env import git_info

    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {
        "device": dev,
        "device_name": tconfig.device_name(),
        "triton_interpret": interpreting(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        **git_info(),
    }


def write_env(out_dir: Path) -> Path:
    """The fingerprint of this invocation into a tune's folder (RunStore.write_env's layout:
    envs/<id>.json, and env.json where the folder has none); returns envs/<id>.json."""
    from moebench.results.store import RunStore
    from moebench.run import env as envmod

    info = envmod.fingerprint()
    return RunStore(out_dir).write_env({**info, "env_id": envmod.env_id(info)}, uuid.uuid4().hex[:10])


def _trial(t) -> Optional[dict]:
    if t is None:
        return None
    # a trial's fingerprint (`env`) is this tune's: tune.json's "environment" holds it once
    d = {k: json_num(v) for k, v in asdict(t).items() if k not in ("samples", "layer", "env")}
    return d


def stem(name: str) -> str:
    return name[: -len(".json")] if name.endswith(".json") else name


PROVENANCE_SUFFIX = ".provenance.json"
# the files beside a tiles file that are not tiles: its provenance and the decisions (decision_files.py)
SIDECARS = (PROVENANCE_SUFFIX, kdecisions.SUFFIX)


def sidecar_name(name: str) -> str:
    return stem(name) + PROVENANCE_SUFFIX


def _entries(results) -> dict[str, dict]:
    return {
        str(r.key): {k: int(r.best[k]) for k in tconfig.CONFIG_KEYS}
        for r in sorted(results, key=lambda r: r.key)
        if r.best is not None
    }


def _provenance(info: dict, results, env: dict, check: Optional[dict] = None) -> dict:
    """`check`: tune.json's "regression_check" (--max-regression), whose figures each entry then carries."""
    check = check or {}
    checked = {s["tokens"]: s for s in check.get("sizes", [])}
    per = {}
    for r in results:
        if r.best is None:
            continue
        h, cur = r.baselines.get("heuristic"), r.baselines.get("current")
        per[str(r.key)] = {
            "us": json_num(r.best_us),
            "heuristic_us": json_num(h.us) if h else None,
            "current_us": json_num(cur.us) if cur else None,
            "speedup_vs_heuristic": json_num(r.speedup("heuristic")),
            "rel_err_recheck": json_num(r.recheck_rel_err),
            "timed": r.num_timed,
            "space_size": info["space_size"],
        }
        s = checked.get(r.tokens)
        if s is not None:  # the install-time check against the config the layer ran before it
            per[str(r.key)]["max_regression_check"] = {
                "max_regression": check["max_regression"],
                "tuned_us": s["tuned_us"],
                "current_us": s["current_us"],
                "ratio": s["ratio"],
                "ci": [s["ci_lo"], s["ci_hi"]],
                "current": s["current"],
                "regressed": s["regressed"],
            }
    return {"tuner": "moebench tune", "kernel": KERNEL_NOTE, "layer": info, "environment": env, "entries": per}


def write_detail(info: dict, results, out_dir: Path, extra: Optional[dict] = None) -> Path:
    """tune.json alone (its path; the config files untouched): the layer, `extra`'s top-level
    fields and per token count the search's figures. Rewritten whole each call."""
    out_dir = safe_dir(out_dir)  # the files below it never through a link (moebench/util/safe_write.py)
    detail = {
        "layer": info,
        **(extra or {}),
        "results": [
            {
                "tokens": r.tokens,
                "rows": r.key,
                "best": r.best,
                "best_us": json_num(r.best_us),
                "speedup_vs_heuristic": json_num(r.speedup("heuristic")),
                "speedup_vs_current": json_num(r.speedup("current")),
                "timed": r.num_timed,
                "timed_in_space": r.space_timed,
                "baselines_outside_space": r.outside,
                "budget": r.budget,
                "rungs": r.rungs,
                "recheck_rel_err": json_num(r.recheck_rel_err),
                "wall_s": json_num(r.wall_s),
                "errors": r.errors,
                "baselines": {k: _trial(v) for k, v in r.baselines.items()},
                "finalists": [_trial(t) for t in r.final],
            }
            for r in results
        ],
    }
    return replace_text(out_dir / "tune.json", json.dumps(detail, indent=2, default=str) + "\n")


def write(info: dict, results, out_dir: Path, extra: Optional[dict] = None) -> Optional[Path]:
    """tune.json, and the config file with its sidecar when a config won anywhere
    (the file's path, else None). `extra`: more top-level fields for tune.json."""
    # first: when no config ran, the trials' errors are what the user needs to read
    out_dir = write_detail(info, results, out_dir, extra).parent  # the folder safe_dir checked
    entries = _entries(results)
    if not entries:
        return None
    name = tconfig.config_file_name(info["E"], info["N"], info["dtype"], info["block_shape"])
    cfg_dir = safe_dir(out_dir, "configs")
    path = replace_text(cfg_dir / name, json.dumps(entries, indent=4) + "\n")
    env = (extra or {}).get("environment", {})
    side = _provenance(info, results, env, (extra or {}).get("regression_check"))
    replace_text(cfg_dir / sidecar_name(name), json.dumps(side, indent=2, default=str) + "\n")
    sglang = sglang_path(cfg_dir, name)
    replace_text(safe_dir_below(cfg_dir, sglang.parent) / sglang.name, json.dumps(entries, indent=4) + "\n")
    return path


def sglang_path(cfg_dir: Path, name: str) -> Path:
    """Where SGLang looks for the same file: its per-Triton-version folder
    (sglang/srt/layers/moe/fused_moe_triton/configs/triton_3_6_0/), and its spelling of the
    name (`block_shape=[128, 128]`, Python's list text, where vLLM writes no space)."""
    import triton

    version = "triton_" + triton.__version__.split("+")[0].replace(".", "_")
    return cfg_dir / "sglang" / version / tconfig.name_variants(name)[-1]


def tuned_files(out_dir: Path) -> list[Path]:
    """The config files a tune wrote into out_dir/configs/ (sidecars left out)."""
    d = Path(out_dir) / "configs"
    files = sorted(p for p in d.glob("*.json") if not p.name.endswith(SIDECARS)) if d.is_dir() else []
    if not files:
        raise ValueError(f"--install-from {out_dir}: no {d}/*.json (give the --out directory of a finished tune)")
    return files


def install(path: Path, log: Callable[[str], None]) -> Path:
    """Merge a tuned file (and its sidecar) into kernels/configs/ if the merged file
    covers vLLM's grid, else into kernels/configs/partial/. Returns where it went."""
    path = Path(path)
    new = json.loads(path.read_text())
    top, part = tconfig.CONFIG_DIR / path.name, tconfig.PARTIAL_DIR / path.name
    merged: dict = {}
    for old in (part, top):  # a grid file's entries win over a partial one's
        if old.is_file():
            merged.update({str(k): v for k, v in tconfig.read_config_file(old).items()})
    merged.update(new)
    merged = {k: merged[k] for k in sorted(merged, key=int)}
    dest = top if covers_grid(merged) else part
    dest.parent.mkdir(parents=True, exist_ok=True)
    replace_text(dest, json.dumps(merged, indent=4) + "\n")
    side_src = path.with_name(sidecar_name(path.name))
    if side_src.is_file():
        side = {}
        old_side = dest.with_name(sidecar_name(dest.name))
        if old_side.is_file():
            side = json.loads(old_side.read_text())
        fresh = json.loads(side_src.read_text())
        fresh["entries"] = {**side.get("entries", {}), **fresh.get("entries", {})}
        replace_text(old_side, json.dumps(fresh, indent=2) + "\n")
    if dest == top and part.is_file():  # superseded
        part.unlink()
        part_side = part.with_name(sidecar_name(part.name))
        if part_side.is_file():
            part_side.unlink()
    if dest == part:
        log(
            f"installed into {dest.parent} (not moebench/kernels/configs/: "
            f"{len(merged)} token counts do not cover vLLM's grid "
            f"{list(tconfig.VLLM_BATCH_SIZES)}; vLLM would route {describe_routes([int(k) for k in merged])})"
        )
    else:
        log(f"installed {dest}")
    tconfig._load_configs.cache_clear()
    return dest


def timed_words(r, space_size: int) -> str:
    """How many distinct configs a token count timed, and what they were: '3 configs timed: 2 of the
    space's 2 + 1 baseline outside it (current = heuristic)' (baselines that are one config count once)."""
    words = f"{counted(r.num_timed, 'config')} timed: {r.space_timed} of the space's {space_size}"
    if r.outside:
        words += f" + {counted(len(r.outside), 'baseline')} outside it ({'; '.join(r.outside)})"
    return words


def summary(results, space_size: int) -> str:
    """Markdown: per token count, the baselines' time, the best config and its speed-up (times in the
    unit that reads best, words.latency), and the configs timed: of the space, and baselines outside it."""
    lines = [
        "| tokens | heuristic | current | best | vs heuristic | best config | timed: of the space + baselines |",
        "|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        h, c = r.baselines.get("heuristic"), r.baselines.get("current")
        hu = latency(h.us) if h is not None and h.ok else "–"
        cu = latency(c.us) if c is not None and c.ok else "–"
        timed = f"{r.space_timed} of {space_size} + {len(r.outside)}"
        if r.best is None:
            lines.append(f"| {r.tokens} | {hu} | {cu} | – | – | none ran | {timed} |")
            continue
        cfg = " ".join(
            f"{k.replace('BLOCK_SIZE_', 'B').replace('GROUP_SIZE_', 'G')}={r.best[k]}" for k in tconfig.CONFIG_KEYS
        )
        x = r.speedup()  # NaN where the heuristic did not run or its figure was host time
        vs = f"{x:.2f}x" if math.isfinite(x) else "–"
        lines.append(f"| {r.tokens} | {hu} | {cu} | {latency(r.best_us)} | {vs} | {cfg} | {timed} |")
    names = sorted({o for r in results for o in r.outside})
    if names:  # which baselines the '+ N' counts
        lines += [
            "",
            f"Baselines outside the space, timed beside it: {'; '.join(names)} (current: what the layer "
            "runs today, installed tiles else the heuristic; '=': the same config, timed once).",
        ]
    return "\n".join(lines + paced_lines(results))


def paced_lines(results) -> list[str]:
    """What the host paced: per token count, the trials left out because samples of theirs started on
    the GPU before the host had enqueued them (bench.TokenBench._record), and which baselines they were."""
    from moebench.tune.trials import HOST_PACED_ERROR

    out = []
    for r in results:
        n = r.errors.get(HOST_PACED_ERROR, 0)
        base = [k for k, t in r.baselines.items() if t is not None and t.error.startswith(HOST_PACED_ERROR)]
        final = sum(t is not None and t.error.startswith(HOST_PACED_ERROR) for t in r.final)
        if n or base or final:
            out.append(
                f"{r.tokens} tokens: {counted(n, 'screened config')}"
                + (f" and {counted(final, 'finalist')}" if final else "")
                + " left out, their samples host-paced after the holds were doubled twice (host time)"
                + (f"; baselines among them: {', '.join(base)} (no speed-up against them)" if base else "")
            )
    if not out:
        return []
    return [
        "",
        "Host-paced trials (never ranked; each trial's count in tune.json / trials.jsonl `host_paced`):",
        *[f"- {x}" for x in out],
    ]


def routing_note(path: Path) -> str:
    """'' for a file that covers vLLM's grid; else which sizes vLLM would route to its entries."""
    keys = [int(k) for k in json.loads(Path(path).read_text())]
    if covers_grid(keys):
        return ""
    return (
        f"{path.name} holds {counted(len(keys), 'token count')} ({', '.join(map(str, sorted(keys)))}); vLLM "
        f"routes every batch size to the nearest entry: {describe_routes(keys)}. Do not put it in "
        "VLLM_TUNED_CONFIG_FOLDER unless those sizes should run these tiles (`moebench tune --check-vllm FILE`)."
    )
