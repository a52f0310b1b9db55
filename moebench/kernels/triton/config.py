"""Tile configs of the fused-MoE Triton GEMMs, looked up the way vLLM does.

Files carry vLLM's names (vLLM's `get_config_file_name`):

    E={E},N={N},device_name={name}[,dtype=fp8_w8a8][,block_shape=[128,128]].json

N is the intermediate size per partition (w2's last dim, I), `name` the device
name as vLLM forms it (`vllm_device_name`). A file maps a token count (as a
string) to {BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps,
num_stages}. vLLM and SGLang files read here too: vLLM's "triton_version" key is
ignored, SGLang's `block_shape=[128, 128]` spelling (with a space) and its
`triton_<version>/` subfolders are found.

Look-up order: folders in MOEBENCH_TRITON_CONFIG_DIR, kernels/configs/ (files that
cover vLLM's batch-size grid), kernels/configs/partial/ (measured at a few token
counts only: a name vLLM never loads, see kernels/configs/README.md). The entry
nearest to M serves it within 2x (`nearest`); else the heuristic applies.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Optional, Sequence

import torch
import triton

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
PARTIAL_DIR = CONFIG_DIR / "partial"
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
# Extra config folders, searched first (e.g. a tuner's output); os.pathsep-separated.
CONFIG_DIR_ENV = "MOEBENCH_TRITON_CONFIG_DIR"
# vLLM's tuning grid (benchmarks/kernels/benchmark_moe.py's default batch sizes)
VLLM_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
# keys of a vLLM file that are no token count (vLLM's get_moe_configs pops this one)
IGNORED_FILE_KEYS = ("triton_version",)


def vllm_device_name(name: str) -> str:
    """The device_name field as vLLM's get_config_file_name forms it:

        device_name = current_platform.get_device_name().replace(" ", "_")
        # Set device_name to H200 if a device from the H200 family is detected
        if "H200" in device_name.split("_"):
            device_name = "NVIDIA_H200"

    (get_device_name is NVML's name, which torch.cuda.get_device_name returns too.)
    So 'NVIDIA H200 NVL' -> 'NVIDIA_H200', 'NVIDIA GH200 480GB' -> 'NVIDIA_GH200_480GB'."""
    name = name.replace(" ", "_")
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def device_name() -> str:
    """vLLM's device_name field for the current CUDA device ('cpu' without CUDA)."""
    if not torch.cuda.is_available():
        return "cpu"
    return vllm_device_name(torch.cuda.get_device_name())


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
    """vLLM's file name: E experts, N = intermediate size per partition (I); `device`
    is a device name (raw or already formed: the rule is idempotent)."""
    dev = vllm_device_name(device if device is not None else device_name())
    dtype_sel = f",dtype={dtype}" if dtype else ""
    block_sel = f",block_shape={list(block_shape)}".replace(" ", "") if block_shape and all(block_shape) else ""
    return f"E={E},N={N},device_name={dev}{dtype_sel}{block_sel}.json"


def name_variants(file_name: str) -> list[str]:
    """vLLM's spelling, then SGLang's (`block_shape=[128, 128]`: its name keeps the space)."""
    if "block_shape=[" not in file_name:
        return [file_name]
    head, _, tail = file_name.partition("block_shape=[")
    inner, _, rest = tail.partition("]")
    return [file_name, f"{head}block_shape=[{inner.replace(' ', '').replace(',', ', ')}]{rest}"]


def extra_config_dirs() -> list[Path]:
    """MOEBENCH_TRITON_CONFIG_DIR's folders, in its order."""
    return [Path(p) for p in os.environ.get(CONFIG_DIR_ENV, "").split(os.pathsep) if p]


def config_dirs() -> list[Path]:
    return extra_config_dirs() + [CONFIG_DIR, PARTIAL_DIR]


def read_config_file(path: Path) -> dict[int, dict]:
    """{token count: config} of one vLLM/SGLang/moebench file; keys other than the six
    config keys are dropped (our kernel takes no others), "triton_version" ignored."""
    with open(path) as f:
        raw = json.load(f)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object of token count -> config")
    out = {}
    for m, cfg in raw.items():
        if m in IGNORED_FILE_KEYS:
            continue
        try:
            tokens = int(m)
        except ValueError:
            raise ValueError(
                f'{path}: key {m!r} is no token count (expected e.g. "64"); remove it or fix the file'
            ) from None
        if not isinstance(cfg, dict) or not all(k in cfg for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K")):
            raise ValueError(f"{path}: entry {m!r} lacks BLOCK_SIZE_M/N/K")
        out[tokens] = {k: int(v) for k, v in cfg.items() if k in CONFIG_KEYS}
    return out


def find_config_file(file_name: str, dirs: Sequence[Path]) -> Optional[Path]:
    """The first existing file of that name (either spelling) in `dirs`, each folder also
    searched in SGLang's per-Triton-version subfolder (triton_3_6_0/)."""
    version_dir = f"triton_{triton.__version__.split('+')[0].replace('.', '_')}"
    for d in dirs:
        for folder in (d, d / version_dir):
            for name in name_variants(file_name):
                if (folder / name).is_file():
                    return folder / name
    return None


@functools.lru_cache(maxsize=None)
def _load_configs(file_name: str, dirs: tuple[Path, ...]) -> tuple[Optional[Path], Optional[dict[int, dict]]]:
    path = find_config_file(file_name, dirs)
    return path, (read_config_file(path) if path is not None else None)


def load_configs(E, N, dtype=None, block_shape=None, device=None) -> Optional[dict[int, dict]]:
    """{token count: config} from the first matching file, or None."""
    return _load_configs(config_file_name(E, N, dtype, block_shape, device), tuple(config_dirs()))[1]


def tiles_file(E, N, dtype=None, block_shape=None, device=None) -> Optional[Path]:
    """The file `load_configs` reads for these arguments (the same look-up, cached), or None."""
    return _load_configs(config_file_name(E, N, dtype, block_shape, device), tuple(config_dirs()))[0]


def file_label(path: Path) -> str:
    """A config file as a row names it (the `tuned_files` column): `kernels/configs/<rel>` inside
    the package's folder (partial/ and SGLang's triton_<version>/ kept), `$MOEBENCH_TRITON_CONFIG_DIR/<rel>`
    inside one of that variable's folders (which one: env.json's fingerprint has the variable), else
    the path as found."""
    for base, label in ((CONFIG_DIR, "kernels/configs"), *((d, f"${CONFIG_DIR_ENV}") for d in extra_config_dirs())):
        if path.is_relative_to(base):
            return f"{label}/{path.relative_to(base).as_posix()}"
    return str(path)


def files_label(paths: Sequence[Optional[Path]]) -> str:
    """The files a layer read, each as `file_label` names it, joined by "; " ("" : none)."""
    return "; ".join(file_label(p) for p in paths if p is not None)


def nearest(configs: dict[int, dict], M: int, within: float = 2.0) -> Optional[dict]:
    """The config whose token count is closest to M (ties: the smaller count), or None
    when that count is more than `within` times away from M, except above the file's
    largest count, which serves every larger M. (vLLM has no such limit: it routes every
    M to the nearest entry, which is why files that hold a few sizes live in partial/.)"""
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
