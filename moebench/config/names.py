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
# vLLM names moebench has no experts implementation of (yet)
NOT_IMPLEMENTED = ("int8_w8a8", "int8_w8a16", "int4_w4a16", "w4a16", "mxfp4", "nvfp4")


def did_you_mean(word: str, valid: Iterable[str], prefix: str = "") -> str:
    """'; did you mean triton?' for the nearest valid names (each after `prefix`), or ''."""
    near = difflib.get_close_matches(word, list(valid), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(prefix + n for n in near)}?" if near else ""


def quant_option(option: str) -> str:
    """The conf/quant/ option a quant name stands for (an alias resolved); ValueError for vLLM's
    names moebench does not implement."""
    if option in NOT_IMPLEMENTED:
        raise ValueError(
            f"quant={option} is vLLM's name for a quantization no moebench experts implementation runs; "
            f"valid: bf16, fp8_block, fp8_tensor, fp8_w8a8 (with quant.block_shape=[128,128]: fp8_block)"
        )
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
