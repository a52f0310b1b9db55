"""The names engineers already type (issue #49): vLLM's quantization names resolved to moebench's
own value (the row stores moebench's), and the nearest valid names for a misspelled one."""

from __future__ import annotations

import difflib
from typing import Iterable

# vLLM's fused-MoE names (its `dtype=` in tuned-config file names): fp8_w8a8 is fp8 weights and
# activations, per tensor unless a weight block shape is given (`weight_block_size`, DeepSeek's
# [128, 128]); moebench's fp8_tensor and fp8_block are those two
QUANT_ALIASES = {"fp8_w8a8": "fp8_tensor"}
FP8_BLOCK = [128, 128]
# vLLM's names moebench has no experts implementation of (yet): accepted, and every row of one is
# skipped with this reason (config/validity.py), so a sweep crossing quants still runs the rest
NOT_IMPLEMENTED = {
    "int8_w8a8": "int8 weights and activations",
    "int8_w8a16": "int8 weights with bf16 activations",
    "int4_w4a16": "4-bit weights with bf16 activations (GPTQ / AWQ through Marlin in vLLM)",
    "w4a16": "4-bit weights with bf16 activations (GPTQ / AWQ through Marlin in vLLM)",
    "mxfp4": "MXFP4 weights (gpt-oss; on Hopper vLLM runs them through triton_kernels' matmul_ogs, bf16 activations)",
    "nvfp4": "NVFP4 weights and activations (Blackwell)",
}


def not_implemented(quant: str) -> str | None:
    """The skip reason of a row in one of vLLM's quantizations moebench cannot run, or None."""
    what = NOT_IMPLEMENTED.get(quant)
    if what is None:
        return None
    return (
        f"quant={quant} is {what}: no moebench experts implementation runs it yet; "
        "implemented: bf16, fp8_block, fp8_tensor (fp8_w8a8)"
    )


def did_you_mean(word: str, valid: Iterable[str], prefix: str = "") -> str:
    """'; did you mean triton?' for the nearest valid names (each after `prefix`), or ''."""
    near = difflib.get_close_matches(word, list(valid), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(prefix + n for n in near)}?" if near else ""


def quant_option(option: str) -> str:
    """The conf/quant/ option a quant name stands for (an alias resolved; vLLM's names moebench
    does not implement stay themselves: their rows are skipped with the reason)."""
    return QUANT_ALIASES.get(option, option)


def resolve_quant(option: str, group: dict) -> dict:
    """The quant group as the row stores it: quant=fp8_w8a8 is fp8_tensor, or fp8_block with
    quant.block_shape=[128,128]; a block shape anywhere else is refused."""
    shape = list(group.get("block_shape") or [])
    if not shape:
        return group
    if option == "fp8_w8a8" or group["name"] == "fp8_block":
        if shape != FP8_BLOCK:
            raise ValueError(f"quant.block_shape={shape}: moebench's fp8 blocks are {FP8_BLOCK} (fp8_block)")
        return {**group, "name": "fp8_block", "block_shape": []}
    raise ValueError(
        f"quant.block_shape={shape} applies to quant=fp8_w8a8 (vLLM's name; [128,128] is fp8_block), not quant={option}"
    )
