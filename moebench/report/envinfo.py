"""A run's environment (env.json, moebench/run/env.py) as report text, and whether two runs'
environments are comparable (asv's rule: results of different machines or library
versions are said to be not comparable rather than silently compared).

The text functions (env_summary, env_differences, comparable_summary) return Markdown: every
value read from env.json or the rows is escaped (moebench/report/mdsafe.py md_text), since a run
folder's text is untrusted; env_value / field_value / env_commit return the values as stored."""

from __future__ import annotations

import re
from typing import Optional

import pandas as pd

from moebench.report.mdsafe import md_text
from moebench.util.words import counted

ENV_FIELDS = [  # (label, keys tried in order; a key also matches the tail of a dotted key)
    ("GPU", ["gpu", "gpu_name", "gpu.name", "device_name", "gpus"]),
    ("driver", ["driver", "driver_version", "nvidia_driver"]),
    ("CUDA", ["cuda", "cuda_version", "torch_cuda"]),
    ("NCCL", ["nccl", "nccl_version"]),
    ("torch", ["torch", "torch_version"]),
    ("triton", ["triton", "triton_version"]),
    ("deep_ep", ["deep_ep"]),
    ("deep_gemm", ["deep_gemm"]),
    ("pplx", ["pplx_kernels", "pplx"]),
]
LIBRARIES = ("deep_ep", "deep_gemm", "pplx")
CPU_THREADS = "CPU threads"  # the torch threads of each CPU rank (cpu_threads_setting)
# what must agree for two runs' numbers to be compared (the GPU by name: a run that saw two
# GPUs and used one compares with a run that saw one)
COMPARED = ("GPU", "driver", "CUDA", "NCCL", "torch", "triton", "deep_ep", "deep_gemm", "pplx", CPU_THREADS)


INVOCATIONS = "invocations"  # report/load.py read_env: run_id -> each invocation's fingerprint


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if not prefix and k == INVOCATIONS:  # a fingerprint of its own each (fingerprints())
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def env_value(env: dict, keys: list[str]):
    """First value of ``keys`` in a (possibly nested) env dict; None if absent."""
    flat = _flatten(env)
    for k in keys:
        for fk, v in flat.items():
            if fk == k or fk.endswith("." + k):
                return v
    return None


def _gpu_text(value, env: dict) -> str | None:
    if isinstance(value, (list, tuple)):
        names = [str(v.get("name", v)) if isinstance(v, dict) else str(v) for v in value]
        uniq = sorted(set(names))
        return f"{len(names)} × {uniq[0]}" if len(uniq) == 1 else ", ".join(names)
    count = env_value(env, ["gpu_count", "num_gpus", "device_count"])
    if value and str(count).isdigit() and int(count) > 1:
        return f"{int(count)} × {value}"
    return None if value is None else str(value)


def cpu_text(env: dict) -> str:
    """A CPU machine as the environment line says it (its fingerprint's `gpu` is `cpu`), as
    `moebench env` does: 'no GPU (CPU, 2 cores, 1 torch thread a rank)'."""
    cores, threads = env_value(env, ["cpu_count"]), cpu_threads_setting(env) if env else None
    said = ["CPU"]
    if str(cores).isdigit():
        said.append(counted(int(cores), "core"))
    if threads is not None:
        said.append(f"{counted(int(threads), 'torch thread')} a rank" if threads.isdigit() else f"threads {threads}")
    return f"no GPU ({', '.join(said)})"


def _smi_driver(env: dict) -> str | None:
    """Driver version from the fingerprint's nvidia-smi query lines ('name, driver, ...')."""
    lines = env_value(env, ["nvidia_smi"])
    if isinstance(lines, (list, tuple)) and lines and str(lines[0]).count(",") >= 1:
        return str(lines[0]).split(",")[1].strip()
    return None


def field_value(env: dict, label: str):
    """One ENV_FIELDS entry of a fingerprint (the driver from nvidia-smi where needed)."""
    keys = dict(ENV_FIELDS)[label]
    value = env_value(env, keys)
    if label == "driver" and value is None:
        value = _smi_driver(env)
    return value


def cpu_threads_setting(env: dict) -> Optional[str]:
    """The torch threads each CPU rank of a machine without a GPU ran (every rank of its runs did):
    env.json's `cpu_threads` (the effective MOEBENCH_CPU_THREADS, 1 unless set), else, in a
    fingerprint from before it, MOEBENCH_CPU_THREADS as set, else that default of then, the
    cores shared among a combination's ranks. None for a GPU machine's fingerprint: its GPU
    ranks read no such setting (a runner.device=cpu run there is not told apart)."""
    if not isinstance(env, dict) or env.get("gpu") != "cpu":
        return None
    if env.get("cpu_threads") is not None:
        return str(env["cpu_threads"])
    return str((env.get("env") or {}).get("MOEBENCH_CPU_THREADS") or "cores ÷ ranks (unset, before the default of 1)")


def env_commit(env: dict) -> tuple[Optional[str], Optional[bool]]:
    """(commit, dirty) a run's env.json names; dirty None where it is not known.

    A fingerprint with `git_tree` (moebench/run/treestate.py) states both: `git_sha` is the commit
    (None here where "unknown") and `git_dirty` whether the files differed from it, from the
    .git where the run was, a verified tree stamp, or unknown. Older ones: where they record
    MOEBENCH_GIT_SHA (a tree copied to a GPU machine) that is the commit, with the state
    unknown, and git_sha / git_dirty, read from the copy's stale .git, describe nothing that ran.
    """
    if not isinstance(env, dict):
        return None, None
    if "git_tree" in env:
        sha = env.get("git_sha")
        return (str(sha) if sha and sha != "unknown" else None), env.get("git_dirty")
    named = (env.get("env") or {}).get("MOEBENCH_GIT_SHA")
    if named and named != "unknown":
        return str(named), None
    return env_value(env, ["git_sha", "sha", "commit"]), env_value(env, ["dirty", "git_dirty"])


def tree_label(env: dict) -> str:
    """ "clean", "dirty" or "unknown": whether the files a run measured were its commit's.
    Unknown without a fingerprint, where neither a .git nor a tree stamp said (every GPU run
    before scripts/copy_tree.sh), and where the stored sha names no commit."""
    sha, dirty = env_commit(env)
    if dirty is None or (not dirty and not is_commit(sha)):
        return "unknown"
    return "dirty" if dirty else "clean"


def env_summary(env: dict, df: pd.DataFrame | None = None) -> str:
    """One line: GPU, driver, CUDA, NCCL, torch, triton, kernel libraries, git sha, host.

    Falls back to the rows' ``gpu`` / ``git_sha`` columns where env.json lacks them.
    """
    parts = []
    for label, _keys in ENV_FIELDS:
        value = field_value(env, label)
        if label == "GPU":
            value = _gpu_text(value, env)
            if value is None and df is not None and df["gpu"].notna().any():
                value = ", ".join(sorted({str(g) for g in df["gpu"].dropna()}))
        if label in LIBRARIES:
            if env:  # without env.json, "not installed" would be a guess
                parts.append(f"{label} {md_text(value) if value else 'not installed'}")
        elif label == "GPU" and value == "cpu":
            parts.append(md_text(cpu_text(env)))
        elif value is not None:
            parts.append(f"{label} {md_text(value)}")
    sha, dirty = env_commit(env)
    if sha is None and df is not None and df["git_sha"].notna().any():
        sha = df["git_sha"].dropna().iloc[-1]
    if sha:
        parts.append(f"git {md_text(str(sha)[:12])}" + (" (dirty)" if dirty else ""))
    host = env_value(env, ["hostname", "host"])
    if host:
        parts.append(f"host {md_text(host)}")
    if not env:
        parts.append("(no env.json: environment unknown)")
    return " · ".join(parts)


def _gpu_names(env: dict):
    value = field_value(env, "GPU")
    if isinstance(value, (list, tuple)):
        return ", ".join(sorted({str(v.get("name", v)) if isinstance(v, dict) else str(v) for v in value}))
    return value


def fingerprints(env: dict) -> list[dict]:
    """A run's fingerprints: env.json's, then every invocation's (envs/*.json), each once."""
    out = [{k: v for k, v in env.items() if k != INVOCATIONS}] if env else []
    for inv in (env.get(INVOCATIONS) or {}).values():
        if isinstance(inv, dict) and inv not in out:
            out.append(inv)
    return out


def _value(env: dict, label: str):
    if label == "GPU":
        return _gpu_names(env)
    return cpu_threads_setting(env) if label == CPU_THREADS else field_value(env, label)


def _values(envs: list[dict], label: str) -> list[str]:
    """The distinct values (as text, sorted) a field takes over fingerprints; absent ones aside."""
    return sorted({str(v) for e in envs if (v := _value(e, label)) is not None})


def env_differences(base_env: dict, cand_env: dict) -> list[str]:
    """'torch: 2.10.0 → 2.11.0' for each COMPARED field that differs between two runs, over
    every invocation's fingerprint of each (a run resumed under another driver holds two:
    'driver: 580.1 → 580.1 / 575.5')."""
    diffs = []
    base, cand = fingerprints(base_env), fingerprints(cand_env)
    for label in COMPARED:
        a, b = _values(base, label), _values(cand, label)
        if label == CPU_THREADS and not (a and b):  # a GPU machine's run on a side: the GPUs differ already
            continue
        if a != b or len(a) > 1:
            diffs.append(
                f"{label}: {' / '.join(md_text(v) for v in a) or 'none'} → "
                f"{' / '.join(md_text(v) for v in b) or 'none'}"
            )
    return diffs


def environment_check(base_env: dict, cand_env: dict) -> tuple[bool, list[str]]:
    """(comparable, what differs). Without env.json on a side nothing can be said: not
    comparable, and the differences say so."""
    if not base_env or not cand_env:
        side = "baseline" if not base_env else "candidate"
        return False, [f"the {side} has no env.json"]
    diffs = env_differences(base_env, cand_env)
    return not diffs, diffs


def comparable_summary(env: dict) -> str:
    """'NVIDIA H200, driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130, triton 3.6.0'."""
    parts = []
    for label in ("GPU", "driver", "CUDA", "torch", "triton"):
        v = _gpu_names(env) if label == "GPU" else field_value(env, label)
        if label == "GPU" and v == "cpu":
            parts.append("no GPU (CPU)")
        elif v is not None:
            parts.append(md_text(v) if label == "GPU" else f"{label} {md_text(v)}")
    return ", ".join(parts)


def is_commit(sha) -> bool:
    """Whether a stored git_sha names a commit (7–40 hex digits), not 'unknown', 'HEAD' or a label."""
    return bool(re.fullmatch(r"[0-9a-f]{7,40}", str(sha or "")))
