"""What vLLM does with a tile-config file: which batch sizes it routes to which entry.

vLLM (`try_get_optimal_moe_config`, fused_moe.py) picks, for M tokens,

    config = configs[min(configs.keys(), key=lambda x: abs(x - M))]

over the file's keys in file order (`get_moe_configs` pops "triton_version" and maps
the others through int()): the nearest entry, with no distance limit, ties to the key
that comes first in the file; and it passes every field of that entry to its Triton
kernel as a keyword. So a file with one 16384-token entry decides decode too, and a
field the kernel does not take breaks the launch.

`moebench tune --check-vllm FILE` prints that routing for vLLM's grid and beyond, and
exits 1 when the file would decide a grid size from an entry more than 2x away, has
fields vLLM's kernel does not take, or lacks one of the six every vLLM entry holds; 0
when none of these.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from moebench.kernels.triton.config import CONFIG_KEYS, IGNORED_FILE_KEYS, VLLM_BATCH_SIZES, config_file_name
from moebench.util.words import agree, counted

# the fields of an entry that vLLM's fused_moe_kernel launch accepts (its constexprs and
# Triton's launch options; SPLIT_K and the ROCm knobs in vLLM's own files)
VLLM_ENTRY_FIELDS = {
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "SPLIT_K",
    "num_warps",
    "num_stages",
    "waves_per_eu",
    "matrix_instr_nonkdim",
    "kpack",
}
# the fields every entry must hold: the kernel's tile constexprs (no default: a launch without
# one raises) and the launch options it was tuned with (without them Triton's defaults run,
# not the tuned config); vLLM's own files hold all six, as moebench's (CONFIG_KEYS)
VLLM_REQUIRED_FIELDS = CONFIG_KEYS
MAX_DISTANCE = 2.0  # an entry further than this (ratio) from a grid size decides it blind
_NAME = re.compile(
    r"^E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<dev>[^,]+)(?:,dtype=(?P<dtype>[^,]+?))?"
    r"(?:,block_shape=\[(?P<bs>[\d, ]+)\])?\.json$"
)


def vllm_pick(keys_in_file_order: list[int], M: int) -> int:
    """The entry vLLM takes for M tokens (its expression, verbatim)."""
    return min(keys_in_file_order, key=lambda x: abs(x - M))


def routes(keys_in_file_order: list[int]) -> list[tuple[int, int, Optional[int]]]:
    """[(entry, first M, last M or None = every larger M)] in entry order, M >= 1."""
    keys = sorted(set(keys_in_file_order))
    firsts = [1]
    for a, b in itertools.pairwise(keys):
        mid = (a + b) // 2
        # below the midpoint a, above it b; at an integer midpoint the key first in the file
        first_b = mid + 1 if (a + b) % 2 or vllm_pick(keys_in_file_order, mid) == a else mid
        firsts.append(first_b)
    out = []
    for i, k in enumerate(keys):
        last = firsts[i + 1] - 1 if i + 1 < len(keys) else None
        if last is None or last >= firsts[i]:
            out.append((k, firsts[i], last))
    return out


def describe_routes(keys: list[int]) -> str:
    """'16384: 1 and up' / '64: 1-160, 256: 161 and up' (what `tune` prints for few-size files)."""
    parts = []
    for k, lo, hi in routes(keys):
        parts.append(f"{k}: {lo} and up" if hi is None else f"{k}: {lo}-{hi}")
    return ", ".join(parts)


def covers_grid(keys) -> bool:
    return set(VLLM_BATCH_SIZES) <= {int(k) for k in keys}


@dataclass
class Report:
    path: Path
    name_ok: Optional[bool]  # the name follows vLLM's get_config_file_name (None: unparseable)
    keys: list  # entries in file order
    ignored: list = field(default_factory=list)
    foreign: dict = field(default_factory=dict)  # entry -> fields vLLM's kernel does not take
    far: list = field(default_factory=list)  # (grid size, entry, ratio) beyond MAX_DISTANCE
    missing: dict = field(default_factory=dict)  # entry -> VLLM_REQUIRED_FIELDS it lacks

    @property
    def ok(self) -> bool:
        return not self.foreign and not self.missing and not self.far and self.name_ok is not False


def check_file(path) -> Report:
    """Read `path` as vLLM's get_moe_configs would, and route vLLM's grid through it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--check-vllm {path}: no such file")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--check-vllm {path}: not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--check-vllm {path}: expected an object of batch size -> config")
    ignored = [k for k in raw if k in IGNORED_FILE_KEYS]
    keys, foreign, missing = [], {}, {}
    for k, v in raw.items():
        if k in IGNORED_FILE_KEYS:
            continue
        try:
            keys.append(int(k))
        except ValueError:
            raise ValueError(f"--check-vllm {path}: key {k!r} is no batch size: vLLM's int() would raise") from None
        extra = sorted(set(v) - VLLM_ENTRY_FIELDS) if isinstance(v, dict) else ["(not an object)"]
        if extra:
            foreign[int(k)] = extra
        lacks = [f for f in VLLM_REQUIRED_FIELDS if f not in v] if isinstance(v, dict) else []
        if lacks:
            missing[int(k)] = lacks
    if not keys:
        raise ValueError(f"--check-vllm {path}: no entries")
    m = _NAME.match(path.name)
    name_ok = None
    if m:
        bs = [int(x) for x in m["bs"].replace(" ", "").split(",")] if m["bs"] else None
        # vLLM writes block_shape without the space SGLang keeps
        name_ok = config_file_name(int(m["E"]), int(m["N"]), m["dtype"], bs, m["dev"]) == path.name
    far = []
    for M in VLLM_BATCH_SIZES:
        k = vllm_pick(keys, M)
        ratio = max(k, M) / max(1, min(k, M))
        if ratio > MAX_DISTANCE:
            far.append((M, k, ratio))
    return Report(path=path, name_ok=name_ok, keys=keys, ignored=ignored, foreign=foreign, far=far, missing=missing)


def format_report(r: Report) -> str:
    lines = [f"{r.path.name}"]
    if r.name_ok is None:
        lines.append(
            "  name: not vLLM's E=..,N=..,device_name=..[,dtype=..][,block_shape=[..]].json: vLLM never opens it"
        )
    elif not r.name_ok:
        lines.append(
            "  name: parsed, but vLLM spells it differently (device name or block_shape spacing): vLLM never opens it"
        )
    ignored = f"; ignored as vLLM does: {', '.join(r.ignored)}" if r.ignored else ""
    lines.append(f"  {counted(len(r.keys), 'entry', 'entries')}{ignored}")
    lines.append("  | entry | batch sizes vLLM routes to it | of vLLM's grid |")
    lines.append("  |---:|---|---|")
    for k, lo, hi in routes(r.keys):
        grid = [M for M in VLLM_BATCH_SIZES if lo <= M and (hi is None or M <= hi)]
        span = f"{lo} and up" if hi is None else (f"{lo}" if lo == hi else f"{lo}-{hi}")
        lines.append(f"  | {k} | {span} | {', '.join(map(str, grid)) or '-'} |")
    for k, extra in r.foreign.items():
        lines.append(
            f"  PROBLEM: entry {k} has fields vLLM passes to its kernel but it takes none such: {', '.join(extra)}"
        )
    lacking: dict[tuple, list] = {}  # the fields missing -> the entries missing them
    for k, lacks in r.missing.items():
        lacking.setdefault(tuple(lacks), []).append(k)
    for lacks, entries in lacking.items():
        n = len(entries)
        lines.append(
            f"  PROBLEM: {agree(n, 'entry', 'entries')} {', '.join(map(str, entries))} {agree(n, 'lacks', 'lack')} "
            f"{', '.join(lacks)} (every vLLM "
            "entry holds the six: its kernel launch fails without a tile field, and runs Triton's "
            "default num_warps / num_stages, not the tuned ones, without those)"
        )
    if r.far:
        sizes = ", ".join(f"{M} -> {k} ({ratio:.0f}x)" for M, k, ratio in r.far)
        lines.append(f"  PROBLEM: grid sizes decided by an entry more than {MAX_DISTANCE:g}x away: {sizes}")
    if r.ok:
        lines.append("  ok: vLLM would use an entry within 2x of every grid size")
    elif r.missing or r.foreign:
        lines.append("  not ok: placed in VLLM_TUNED_CONFIG_FOLDER this file breaks vLLM's launch or runs it untuned")
    else:
        lines.append(
            "  not ok: placed in VLLM_TUNED_CONFIG_FOLDER this file changes vLLM at sizes it was not measured at"
        )
    return "\n".join(lines)


def check_command(path) -> int:
    """0 when vLLM reads the tiles file as tuned (its decisions sidecar, if any, parsing too), 1 when not;
    a decisions sidecar itself: 0 when the layer can read it (vLLM never opens it)."""
    from moebench.kernels.triton import decisions

    p = Path(path)
    if decisions.is_decisions_file(p):
        decisions.parse(json.loads(p.read_text()), str(p))  # ValueError (exit 2) names what is wrong
        print(f"{p.name}\n  moebench's decisions sidecar (kernels/triton/decisions.py): vLLM never opens it; it parses")
        return 0
    r = check_file(p)
    print(format_report(r))
    side = p.with_name(decisions.decisions_name(p.name))
    if side.is_file():  # beside the tiles: the layer reads it, vLLM does not (its name is none of vLLM's)
        d = decisions.parse(json.loads(side.read_text()), str(side))
        print(
            f"  beside it: {side.name}, moebench's decisions ({counted(len(d.entries), 'entry', 'entries')}, "
            f"deepgemm_min_tokens {d.deepgemm_min_tokens}): vLLM never opens it"
        )
    return 0 if r.ok else 1
