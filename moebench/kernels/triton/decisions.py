"""The layer's tuned decisions beside its tile file (issue #51): what `moebench tune --decisions`
measured per token count, besides the gathered kernel's tiles.

The tiles file keeps exactly vLLM's keys (vLLM maps every key through int(): a moebench key
inside it would break vLLM's load), so the decisions live in a sidecar of the same stem:

    E={E},N={N},device_name={name}[,dtype=..][,block_shape=[..]].moebench.json

a name vLLM never opens. Its content:

    {"moebench_decisions": 1,
     "layer": {"E": 8, "N": 14336, "hidden": 4096, "topk": 2, "quant": "fp8_block", ...},
     "deepgemm_min_tokens": 2048,      # triton_or_deepgemm: DeepGEMM from this many rows (null: untuned)
     "entries": {"16": {"row_layout": "gathered", "b_tma": true},
                 "4096": {"row_layout": "contiguous", "contiguous_gemm": "gluon",
                          "gluon_config": {"WS": true, "STAGES": 5, "SCALE_AHEAD": 1,
                                           "EPILOGUE_TMA": true, "BLOCK_SIZE_N": 128}},
                 "16384": {"row_layout": "contiguous", "contiguous_gemm": "gluon",
                           "gluon_config": {"WS": true, "STAGES": 4, "SCALE_AHEAD": 1,
                                            "EPILOGUE_TMA": true, "BLOCK_SIZE_N": 192,
                                            "GROUP_SIZE_N": 16, "SCALE_TMA": true}}}}

gluon_config: a GLUON_VARIANTS entry's five fields, and where the tuner chose them, the tile order
(GROUP_SIZE_N: bands of that many column tiles; 0 or absent, groups of row tiles), SCALE_TMA
(the 128 x 192 tile's activation scales TMA-loaded with each stage; false or absent, global loads)
and PRODUCER_1W (the 128 x 192 tile's TMA producer one warp; false or absent, a warp group):
gluon_contiguous.GLUON_EXTRAS. b_tma (a gathered entry's): the gathered kernel loads the weights'
tiles through a TMA descriptor (gemm.py's B_TMA; false or absent, pointer loads).

Found in the folders the tiles are (config.config_dirs: MOEBENCH_TRITON_CONFIG_DIR first, then
kernels/configs/, kernels/configs/partial/); an entry serves M rows by the tiles' nearest-key rule
(config.nearest: within 2x, the largest entry every larger M). A sidecar measured on another
hidden size (the tile file's name has no K) is ignored. Read once when the experts are built:
a forward reads a per-M cache, never the file. Absent an entry, today's constants decide
(kernels/cards/experts.py: CONTIGUOUS_MIN_PAIRS_PER_EXPERT, contiguous_gemm=auto, DEFAULT_MIN_TOKENS).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

from .config import config_dirs, config_file_name, find_config_file, nearest

SUFFIX = ".moebench.json"
SCHEMA_KEY = "moebench_decisions"
SCHEMA_VERSION = 1
ROW_LAYOUTS = ("gathered", "contiguous")
GEMM_KERNELS = ("triton", "gluon")  # a Gluon variant's tile (gluon_wide: BLOCK_SIZE_N 192) is in gluon_config
GLUON_FIELDS = ("WS", "STAGES", "SCALE_AHEAD", "EPILOGUE_TMA", "BLOCK_SIZE_N")  # gluon_contiguous.GLUON_VARIANTS
# a variant's options the tuner may add (gluon_contiguous.GLUON_EXTRAS), their defaults where absent
GLUON_EXTRA_FIELDS = {"GROUP_SIZE_N": 0, "SCALE_TMA": False, "PRODUCER_1W": False}
# b_tma: the gathered kernel's weight tiles TMA-loaded (gemm.py's B_TMA; a gathered entry's only)
ENTRY_FIELDS = ("row_layout", "contiguous_gemm", "gluon_config", "b_tma")
GLUON_WIDE_N = 192  # gluon_wide.WIDE_N (the 128 x 192 tile; not imported here: Gluon loads on Hopper only)


def decisions_name(tiles_name: str) -> str:
    """The sidecar's name for a tiles file's name (vLLM's spelling)."""
    stem = tiles_name[: -len(".json")] if tiles_name.endswith(".json") else tiles_name
    return stem + SUFFIX


def is_decisions_file(path) -> bool:
    return Path(path).name.endswith(SUFFIX)


def gluon_config_of(variant: Sequence, extra: Optional[dict] = None) -> dict:
    """A GLUON_VARIANTS tuple (WS, STAGES, SCALE_AHEAD, EPILOGUE_TMA, BLOCK_SIZE_N) as GluonGemm's config,
    with a GLUON_EXTRAS entry's options (GROUP_SIZE_N, SCALE_TMA, PRODUCER_1W) where given."""
    ws, stages, ahead, epi_tma, bn = variant
    cfg = dict(
        WS=bool(ws), STAGES=int(stages), SCALE_AHEAD=int(ahead), EPILOGUE_TMA=bool(epi_tma), BLOCK_SIZE_N=int(bn)
    )
    return {**cfg, **(extra or {})}


def _gluon_config_error(g) -> Optional[str]:
    """What is wrong with a sidecar's gluon_config (None: nothing)."""
    if not isinstance(g, dict) or not set(GLUON_FIELDS) <= set(g) <= set(GLUON_FIELDS) | set(GLUON_EXTRA_FIELDS):
        return f"needs {', '.join(GLUON_FIELDS)} (and optionally {', '.join(GLUON_EXTRA_FIELDS)})"
    n = g.get("GROUP_SIZE_N", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return f"GROUP_SIZE_N {n!r}: column tiles a band (an int >= 1), or 0 for row groups"
    for flag in ("SCALE_TMA", "PRODUCER_1W"):
        if not isinstance(g.get(flag, False), bool):
            return f"{flag} {g[flag]!r}: true or false"
    return gluon_shape_error(g)


def gluon_shape_error(cfg: dict) -> Optional[str]:
    """Why a Gluon config (a sidecar's gluon_config, GluonGemm's config) names no kernel that exists,
    None where it names one: SCALE_TMA and PRODUCER_1W are the 128 x 192 tile's, and that tile
    (gluon_wide.py) has one shape, warp-specialized with its scales one step ahead and a TMA epilogue."""
    wide = cfg["BLOCK_SIZE_N"] == GLUON_WIDE_N
    for flag in ("SCALE_TMA", "PRODUCER_1W"):
        if cfg.get(flag) and not wide:
            return f"{flag}: the 128 x {GLUON_WIDE_N} tile only (BLOCK_SIZE_N {cfg['BLOCK_SIZE_N']!r})"
    if wide and not (cfg["WS"] and cfg["SCALE_AHEAD"] == 1 and cfg["EPILOGUE_TMA"]):
        return (
            f"the 128 x {GLUON_WIDE_N} tile is warp-specialized, scales 1 ahead, a TMA epilogue "
            "(WS, SCALE_AHEAD 1, EPILOGUE_TMA)"
        )
    return None


@dataclass(frozen=True)
class Decisions:
    """One layer's tuned decisions: {rows: entry} and the triton_or_deepgemm switch-over."""

    entries: dict = field(default_factory=dict)
    deepgemm_min_tokens: Optional[int] = None
    hidden: Optional[int] = None
    path: Optional[Path] = field(default=None, compare=False)  # the sidecar read (the rows' tuned_files)

    def at(self, M: int) -> dict:
        """The entry serving M rows (the tiles' nearest-key rule), {} where none does."""
        return (nearest(self.entries, M) or {}) if self.entries else {}


def parse(raw, where: str = "decisions") -> Decisions:
    """A sidecar's JSON as Decisions; ValueError naming the field for a malformed one."""
    if not isinstance(raw, dict) or raw.get(SCHEMA_KEY) != SCHEMA_VERSION:
        raise ValueError(f"{where}: not a moebench decisions file ({SCHEMA_KEY}: {SCHEMA_VERSION} missing)")
    entries = {}
    for k, e in (raw.get("entries") or {}).items():
        try:
            m = int(k)
        except ValueError:
            raise ValueError(f"{where}: entry key {k!r} is no token count") from None
        if not isinstance(e, dict) or set(e) - set(ENTRY_FIELDS):
            raise ValueError(f"{where}: entry {k}: fields {sorted(set(e) - set(ENTRY_FIELDS))}; allowed {ENTRY_FIELDS}")
        if e.get("row_layout", "gathered") not in ROW_LAYOUTS:
            raise ValueError(f"{where}: entry {k}: row_layout {e['row_layout']!r}; valid: {', '.join(ROW_LAYOUTS)}")
        if e.get("contiguous_gemm", "triton") not in GEMM_KERNELS:
            raise ValueError(f"{where}: entry {k}: contiguous_gemm {e['contiguous_gemm']!r}; valid: {GEMM_KERNELS}")
        if "b_tma" in e and (not isinstance(e["b_tma"], bool) or e.get("row_layout") != "gathered"):
            raise ValueError(f"{where}: entry {k}: b_tma {e['b_tma']!r}: true or false, on a gathered entry only")
        g = e.get("gluon_config")
        gerr = None if g is None else _gluon_config_error(g)
        if gerr:
            raise ValueError(f"{where}: entry {k}: gluon_config {gerr}")
        entries[m] = dict(e)
    dg = raw.get("deepgemm_min_tokens")
    if dg is not None and (not isinstance(dg, int) or dg < 1):
        raise ValueError(f"{where}: deepgemm_min_tokens {dg!r}: a token count >= 1, or null")
    hidden = (raw.get("layer") or {}).get("hidden")
    return Decisions(entries=entries, deepgemm_min_tokens=dg, hidden=hidden)


@functools.lru_cache(maxsize=None)
def _load(tiles_name: str, dirs: tuple[Path, ...]) -> Optional[Decisions]:
    path = find_config_file(decisions_name(tiles_name), dirs)
    return replace(parse(json.loads(path.read_text()), str(path)), path=path) if path is not None else None


def load_decisions(
    E: int,
    N: int,
    dtype: Optional[str],
    block_shape: Optional[Sequence[int]],
    hidden: int,
    device: Optional[str] = None,
) -> Optional[Decisions]:
    """The sidecar of the tiles file for (E, N = I, dtype, block_shape) on this device, None where
    there is none or it was measured at another hidden size."""
    d = _load(config_file_name(E, N, dtype, block_shape, device), tuple(config_dirs()))
    if d is None or (d.hidden is not None and int(d.hidden) != int(hidden)):
        return None
    return d


def clear_cache() -> None:
    _load.cache_clear()
