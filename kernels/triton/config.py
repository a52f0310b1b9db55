"""Tile configs of the fused-MoE Triton GEMMs, looked up the way vLLM does.

Files live in kernels/configs/ and carry vLLM's names, so a config tuned here
drops into vLLM and back:

    E={E},N={N},device_name={name}[,dtype=fp8_w8a8][,block_shape=[128,128]].json

N is the intermediate size per partition (w2's last dim, I), `name` is
torch.cuda.get_device_name() with spaces turned into "_" (e.g. NVIDIA_H200).
A file maps a token count (as a string) to {BLOCK_SIZE_M, BLOCK_SIZE_N,
BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages}; the entry whose token count
is nearest to M wins. Without a file a heuristic config is used.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Optional, Sequence

import torch

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
# Extra config folders, searched first (e.g. a tuner's output); os.pathsep-separated.
CONFIG_DIR_ENV = "MOEBENCH_TRITON_CONFIG_DIR"


def device_name() -> str:
    """vLLM's device_name field: the CUDA device name with spaces -> '_' ('cpu' without CUDA)."""
    if not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name().replace(" ", "_")


def config_dtype(quant_name: Optional[str]) -> Optional[str]:
    """vLLM's dtype field for a moebench quant name (None for bf16)."""
    return "fp8_w8a8" if quant_name and quant_name.startswith("fp8") else None


def config_block_shape(quant_name: Optional[str], block_n: int = 128, block_k: int = 128) -> Optional[list[int]]:
    return [block_n, block_k] if quant_name == "fp8_block" else None


def config_file_name(
    E: int,
    N: int,
    dtype: Optional[str] = None,
    block_shape: Optional[Sequence[int]] = None,
    device: Optional[str] = None,
) -> str:
    """vLLM's file name: E experts, N = intermediate size per partition (I)."""
    dev = (device if device is not None else device_name()).replace(" ", "_")
    dtype_sel = f",dtype={dtype}" if dtype else ""
    block_sel = f",block_shape={list(block_shape)}".replace(" ", "") if block_shape and all(block_shape) else ""
    return f"E={E},N={N},device_name={dev}{dtype_sel}{block_sel}.json"


def _config_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get(CONFIG_DIR_ENV, "").split(os.pathsep) if p]
    return extra + [CONFIG_DIR]


@functools.lru_cache(maxsize=None)
def _load_configs(file_name: str, dirs: tuple[Path, ...]) -> Optional[dict[int, dict]]:
    for d in dirs:
        path = d / file_name
        if path.is_file():
            with open(path) as f:
                raw = json.load(f)
            return {int(m): {k: int(v) for k, v in cfg.items() if k in CONFIG_KEYS} for m, cfg in raw.items()}
    return None


def load_configs(E, N, dtype=None, block_shape=None, device=None) -> Optional[dict[int, dict]]:
    """{token count: config} from the first matching file, or None."""
    return _load_configs(config_file_name(E, N, dtype, block_shape, device), tuple(_config_dirs()))


def nearest(configs: dict[int, dict], M: int, within: float = 2.0) -> Optional[dict]:
    """The config whose token count is closest to M (ties: the smaller count), or None
    when that count is more than `within` times away from M, except above the file's
    largest count, which serves every larger M (vLLM's rule; vLLM's own files, keyed
    1, 2, 4, ..., 4096, always have an entry within 2x). So a file tuned at a few sizes
    (16384 only, say) does not decide decode-sized tiles; the heuristic does."""
    m = min(configs, key=lambda k: (abs(k - M), k))
    if M <= max(configs) and max(m, M) > within * max(1, min(m, M)):
        return None
    return dict(configs[m])


def default_config(
    M: int,
    E: int,
    N: int,
    dtype: Optional[str] = None,
    block_shape: Optional[Sequence[int]] = None,
    topk: int = 8,
) -> dict:
    """Heuristic tiles from the pairs each expert gets on average (M * topk / E).

    Few rows per expert: the GEMMs are weight-bandwidth bound, so BLOCK_M is
    the smallest tl.dot allows and the weight tile is wide along N/K. Many rows:
    compute bound, 64/128 x 128 x 64/128 tiles with a GROUP_SIZE_M swizzle for L2 reuse.
    """
    fp8 = dtype == "fp8_w8a8"
    rows_per_expert = M * topk / max(E, 1)
    bk = 128 if fp8 else 64
    if rows_per_expert <= 16:
        cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=4)
    elif rows_per_expert <= 48:
        cfg = dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=128, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8, num_warps=4, num_stages=4)
    elif rows_per_expert <= 192:
        cfg = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8, num_warps=4, num_stages=3)
    else:
        cfg = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=bk, GROUP_SIZE_M=16, num_warps=8, num_stages=3)
    if block_shape:  # a K tile must stay inside one 128-wide scale group
        cfg["BLOCK_SIZE_K"] = min(cfg["BLOCK_SIZE_K"], block_shape[1])
    return cfg


def get_config(
    E: int,
    N: int,
    M: int,
    dtype: Optional[str] = None,
    block_shape: Optional[Sequence[int]] = None,
    topk: int = 8,
    device: Optional[str] = None,
) -> dict:
    """Tile config for M tokens: the nearest entry of the matching file (within 2x, see
    `nearest`), else the heuristic.

    E local experts, N = intermediate size per partition (I), dtype "fp8_w8a8" or
    None, block_shape [128, 128] for block fp8.
    """
    configs = load_configs(E, N, dtype, block_shape, device)
    cfg = nearest(configs, M) if configs else None
    if cfg is None:
        cfg = default_config(M, E, N, dtype, block_shape, topk)
    if block_shape:
        cfg["BLOCK_SIZE_K"] = min(cfg["BLOCK_SIZE_K"], block_shape[1])
    return cfg
