"""The tile search space and its pruning before anything compiles.

"vllm" is vLLM's space (benchmarks/kernels/benchmark_moe.py `get_configs_compute_bound`,
CUDA: 5 x 4 x 3 x 4 x 2 x 4 = 1,920 configs). A config must run both GEMMs of the
layer (gate/up: N = 2I, K = hidden; down: N = hidden, K = I); the rules below drop
configs that cannot help, each named in `Pruned.dropped`:

  fp8_block_divisible  BLOCK_SIZE_K and BLOCK_SIZE_N multiples of the block shape (vLLM's
                       own rule), and BLOCK_SIZE_K <= block_k: the experts clamp a wider
                       K tile to the scale group, so it would re-run a config already tried
  shared_memory        num_stages x (BM + BN) x BK x operand bytes > the SM's limit: the
                       pipelined operand buffers alone (this formula gave exactly the
                       "Required:" bytes of every OutOfResources in results/tune)
  registers            fp32 accumulator BM x BN / (32 x num_warps) > 128 registers a
                       thread: at 256 (128x256 tiles, 4 warps) the layer ran 5-6x slower
                       than with 8 warps (spills); 255 is the hardware cap
  wider_than_layer     BLOCK_SIZE_N or BLOCK_SIZE_K wider than both GEMMs' N (K)

The space does not depend on the token count (so one compile serves every size).

Legend: BM/BN/BK the tile, G GROUP_SIZE_M, w num_warps, s num_stages.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from moebench.kernels.triton.config import CONFIG_KEYS

# the axes in vLLM's order (and its file's key order)
SPACES = {
    "vllm": dict(
        BLOCK_SIZE_M=[16, 32, 64, 128, 256],
        BLOCK_SIZE_N=[32, 64, 128, 256],
        BLOCK_SIZE_K=[64, 128, 256],
        GROUP_SIZE_M=[1, 16, 32, 64],
        num_warps=[4, 8],
        num_stages=[2, 3, 4, 5],
    ),
    # the Triton interpreter and smoke runs
    "small": dict(
        BLOCK_SIZE_M=[16, 32], BLOCK_SIZE_N=[64], BLOCK_SIZE_K=[64], GROUP_SIZE_M=[1], num_warps=[4], num_stages=[2]
    ),
    # the same for fp8_block (its N and K tiles multiples of the 128 block)
    "small_fp8": dict(
        BLOCK_SIZE_M=[16, 32], BLOCK_SIZE_N=[128], BLOCK_SIZE_K=[128], GROUP_SIZE_M=[1], num_warps=[4], num_stages=[2]
    ),
    # the spaces of the tunes committed before "vllm" (results/tune): kept to reproduce them
    "decode": dict(
        BLOCK_SIZE_M=[16, 32, 64],
        BLOCK_SIZE_N=[32, 64, 128, 256],
        BLOCK_SIZE_K=[64, 128, 256],
        GROUP_SIZE_M=[1],
        num_warps=[4, 8],
        num_stages=[3, 4, 5],
    ),
    "prefill": dict(
        BLOCK_SIZE_M=[128],
        BLOCK_SIZE_N=[128, 256],
        BLOCK_SIZE_K=[64, 128],
        GROUP_SIZE_M=[1, 16],
        num_warps=[4, 8],
        num_stages=[3, 4],
    ),
}
assert all(tuple(axes) == CONFIG_KEYS for axes in SPACES.values())

SM90_SHARED_BYTES = 232448  # H100/H200 opt-in shared memory per block (227 KiB)
MAX_ACC_REGS = 128
TILE_KEYS = CONFIG_KEYS[:3]  # BM, BN, BK
KNOB_KEYS = CONFIG_KEYS[3:]  # G, w, s


@dataclass(frozen=True)
class LayerDims:
    """The two GEMMs of one layer as the tiles see them."""

    num_experts: int  # local experts E
    intermediate: int  # I (N of the file name)
    hidden: int  # K
    topk: int
    operand_bytes: int  # 2 bf16, 1 fp8
    block_shape: Optional[tuple[int, int]] = None  # fp8_block (block_n, block_k)


@dataclass
class Pruned:
    kept: list[dict]
    dropped: Counter = field(default_factory=Counter)  # rule -> configs it removed (first rule that hits)
    total: int = 0

    def summary(self) -> str:
        rules = ", ".join(f"{k} {v}" for k, v in self.dropped.most_common())
        return f"{len(self.kept)} of {self.total} configs kept" + (f" (dropped: {rules})" if rules else "")


def config_key(cfg: dict) -> tuple:
    """A config as a hashable tuple in CONFIG_KEYS order."""
    return tuple(int(cfg[k]) for k in CONFIG_KEYS)


def shared_bytes(cfg: dict, operand_bytes: int) -> int:
    """Shared memory of the pipelined A and B tiles (bytes)."""
    return cfg["num_stages"] * (cfg["BLOCK_SIZE_M"] + cfg["BLOCK_SIZE_N"]) * cfg["BLOCK_SIZE_K"] * operand_bytes


def acc_registers(cfg: dict) -> float:
    """fp32 accumulator registers per thread."""
    return cfg["BLOCK_SIZE_M"] * cfg["BLOCK_SIZE_N"] / (32 * cfg["num_warps"])


def drop_reason(cfg: dict, dims: LayerDims, shared_limit: int = SM90_SHARED_BYTES) -> Optional[str]:
    """The first rule (module doc) that removes cfg, or None."""
    bn, bk = cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    if dims.block_shape:
        block_n, block_k = dims.block_shape
        if bk % block_k or bn % block_n or bk > block_k:
            return "fp8_block_divisible"
    if shared_bytes(cfg, dims.operand_bytes) > shared_limit:
        return "shared_memory"
    if acc_registers(cfg) > MAX_ACC_REGS:
        return "registers"
    n_max = max(2 * dims.intermediate, dims.hidden)
    k_max = max(dims.hidden, dims.intermediate)
    if bn > n_max or bk > k_max:
        return "wider_than_layer"
    return None


def prune(space: str, dims: LayerDims, shared_limit: int = SM90_SHARED_BYTES) -> Pruned:
    """The space's configs that pass every rule, in the space's axis order."""
    if space not in SPACES:
        raise ValueError(f"--space {space!r}; valid: {', '.join(SPACES)}")
    axes = SPACES[space]
    out = Pruned(kept=[])
    for values in itertools.product(*axes.values()):
        cfg = dict(zip(axes, values, strict=True))
        out.total += 1
        why = drop_reason(cfg, dims, shared_limit)
        if why:
            out.dropped[why] += 1
        else:
            out.kept.append(cfg)
    return out


def shared_limit_of(device) -> int:
    """The device's per-block shared memory (bytes); the sm_90 figure off the GPU."""
    if getattr(device, "type", "cpu") != "cuda":
        return SM90_SHARED_BYTES
    from triton.runtime import driver

    idx = device.index if device.index is not None else 0
    return int(driver.active.utils.get_device_properties(idx)["max_shared_mem"])
