"""`moebench tune --install-from DIR`: the guard a fresh `--install --max-regression X` applies,
decided again on the figures DIR/tune.json holds (nothing is timed: the machine installing need
not be the one that tuned).

The threshold is `--max-regression X` where given, else the one the tune itself ran with (its
stored check's), so a tune whose check refused is not installed by --install-from either;
without either nothing is checked, as a fresh `--install` without `--max-regression`. The figures:

  tiles       "regression_check" (the tuned entry timed again against the current config,
              regression.py) where the tune ran it; else "results": the winner's median against
              the current baseline's, as the search timed them
  decisions   "decisions_check" (decide.DecisionCheck: the chosen option timed again against the
              layer as it ran) where the tune ran it; else "decisions": each count's chosen option
              against "current", the two timed interleaved

A size regresses as regression.regressed and DecisionCheck.regressions decide for a fresh install.

Before any figure, where the tiles were timed (`host_time`): a tune on the CPU, or under Triton's
interpreter, timed the host (seconds a layer call), and a tuned table never rests on host time, so
such a folder is refused whatever its figures (`--allow-cpu-tiles`, for moebench's own tests, lets
it through). Its record: tune.json's and each provenance sidecar's "layer" (`device`, `timing`) and
"environment" (`device`, `triton_interpret`), and the folder's env.json (`TRITON_INTERPRET`, for a
tune.json written before it named the interpreter). A folder where neither tune.json nor any
sidecar says where its tiles were timed (tuned files alone, a sidecar of entries only) is refused
too (`host_refusal`): nothing rules out host time, and a tuned table must not rest on it; a
`moebench tune --out DIR` writes both records. `--allow-cpu-tiles` waives this as it waives the rest.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

from moebench.tune.decide import DecisionCheck
from moebench.tune.decision_options import CURRENT
from moebench.tune.decision_trials import timed_from_json
from moebench.tune.files import PROVENANCE_SUFFIX
from moebench.tune.host_words import host_timing, not_installed
from moebench.tune.regression import SizeCheck, regressed, size_line

NAN = float("nan")


@dataclass(frozen=True)
class Refusal:
    """Why --install-from installs nothing: the regressions, each with where its figures came from."""

    max_regression: float
    given: bool  # --max-regression X (else the tune's own threshold)
    lines: tuple[str, ...]

    def line(self, out_dir: Path) -> str:
        x = f"--max-regression {self.max_regression:g}" + ("" if self.given else " (the tune's own)")
        return f"--install-from {out_dir}: {x}: not installed: " + "; ".join(self.lines)


def _f(v) -> float:
    return NAN if v is None else float(v)


def _size(d: dict) -> SizeCheck:
    known = {f.name for f in fields(SizeCheck)}
    s = SizeCheck(**{k: v for k, v in d.items() if k in known})
    for k in ("tuned_us", "current_us", "ci_lo", "ci_hi"):
        setattr(s, k, _f(getattr(s, k)))
    return s


def tile_sizes(detail: dict) -> tuple[list[SizeCheck], str]:
    """([SizeCheck], where they came from) of tune.json's figures for the tiles."""
    check = detail.get("regression_check")
    if check:
        return [_size(d) for d in check.get("sizes", [])], "tune.json regression_check"
    out = []
    for r in detail.get("results", []):
        cur = (r.get("baselines") or {}).get(CURRENT)
        if r.get("best") is None or not cur:
            continue
        out.append(
            SizeCheck(
                tokens=r["tokens"],
                tuned=r["best"],
                current=cur["config"],
                tuned_us=_f(r.get("best_us")),
                current_us=_f(cur.get("us")),
                current_error=cur.get("error", ""),
            )
        )
    return out, "tune.json results (the search's figures)"


def decision_check(detail: dict, max_regression: float) -> tuple[DecisionCheck, str]:
    """(DecisionCheck at `max_regression`, where its figures came from) of tune.json's decisions."""
    out = DecisionCheck(max_regression)
    stored = detail.get("decisions_check")
    if stored:
        for s in stored.get("sizes", []):
            out.sizes.append((s["tokens"], timed_from_json(s["chosen"]), timed_from_json(s["current"])))
        return out, "tune.json decisions_check"
    for d in detail.get("decisions", []):
        timed = {t["option"]: t for t in d.get("timed", [])}
        if d.get("best") and d["best"] in timed and CURRENT in timed:
            out.sizes.append((d["tokens"], timed_from_json(timed[d["best"]]), timed_from_json(timed[CURRENT])))
    return out, "tune.json decisions (chosen and current timed together)"


def own_threshold(detail: dict) -> Optional[float]:
    """The --max-regression the tune ran with (None: it ran no check)."""
    xs = [detail[k]["max_regression"] for k in ("regression_check", "decisions_check") if detail.get(k)]
    return min(xs) if xs else None


def recorded_host_timing(record: dict, env: Optional[dict] = None) -> str:
    """host_timing of what a tune recorded: `record` a tune.json or provenance sidecar ("layer",
    "environment"), `env` the folder's env.json; '' where it records a GPU's timing, or nothing."""
    layer, environment = record.get("layer") or {}, record.get("environment") or {}
    on_cpu = layer.get("device") == "cpu" or layer.get("timing") == "host clock" or environment.get("device") == "cpu"
    interpreted = (
        environment.get("triton_interpret") is True or (env or {}).get("env", {}).get("TRITON_INTERPRET") == "1"
    )
    if not on_cpu and not interpreted:
        return ""
    return host_timing("cpu" if on_cpu else "cuda", interpreted, str(environment.get("device") or ""))


def says_where(record: dict) -> bool:
    """Whether a tune.json or provenance sidecar records where its tiles were timed: the layer's
    device or timing, or the environment's device (a sidecar of entries alone does not)."""
    layer, environment = record.get("layer") or {}, record.get("environment") or {}
    return bool(layer.get("device") or layer.get("timing") or environment.get("device"))


def _records(out_dir: Path) -> list[Path]:
    """DIR's records of where its tiles were timed: tune.json and the provenance sidecars there are."""
    found = [out_dir / "tune.json"] + sorted((out_dir / "configs").glob("*" + PROVENANCE_SUFFIX))
    return [p for p in found if p.is_file()]


def host_time(out_dir: Path) -> str:
    """Where DIR's tiles were timed when that was the host (words for the refusal, with the file that
    says so); '' for a GPU's timing, or a folder that records nothing (host_refusal refuses that)."""
    out_dir = Path(out_dir)
    env_path = out_dir / "env.json"
    env = json.loads(env_path.read_text()) if env_path.is_file() else None
    for path in _records(out_dir):
        where = recorded_host_timing(json.loads(path.read_text()), env)
        if where:
            return f"{where} ({path.relative_to(out_dir)} says so)"
    return ""


def host_refusal(out_dir: Path) -> str:
    """Why DIR's tiles may not be installed for where they were timed (exit 2: the host, or nowhere
    said), in one line; '' where tune.json or a sidecar records a GPU's timing."""
    out_dir = Path(out_dir)
    host = host_time(out_dir)
    if host:
        return not_installed(host)
    if any(says_where(json.loads(p.read_text())) for p in _records(out_dir)):
        return ""
    return (
        "nothing in it says where these tiles were timed (no tune.json or configs/*.provenance.json that "
        "names the device), so they may be host time and are not installed: give the --out directory of a "
        "`moebench tune` run on a GPU, which writes both"
    )


def refusal(out_dir: Path, max_regression: Optional[float]) -> Optional[Refusal]:
    """None when DIR's files may be installed; ValueError (exit 2) for a threshold with no figures."""
    path = Path(out_dir) / "tune.json"
    if not path.is_file():
        if max_regression is None:
            return None  # provenance sidecars alone: no figures, as a fresh --install without the flag
        raise ValueError(f"--install-from {out_dir}: no {path}: --max-regression has no figures to decide on")
    detail = json.loads(path.read_text())
    x = max_regression if max_regression is not None else own_threshold(detail)
    if x is None or not math.isfinite(x):
        return None
    sizes, where = tile_sizes(detail)
    lines = [f"tiles at {size_line(s, x)} ({where})" for s in sizes if regressed(s, x)]
    dec, dwhere = decision_check(detail, x)
    lines += [f"decisions at {line} ({dwhere})" for line in dec.regressions()]
    return Refusal(x, max_regression is not None, tuple(lines)) if lines else None
