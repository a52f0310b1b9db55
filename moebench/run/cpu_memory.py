"""Whether a CPU combination's expert weights fit this machine's memory, asked before any work: every
rank of a CPU run is a process of this machine, and DeepSeek-V3's 256 experts in bf16 (21 GiB, built
from per-expert copies of as much again) fill a 24 GiB machine before the first sample. As with a world
size the machine lacks (run/plan.py check_machine, machine_reason): refused, exit 2, where the command
line names the model; a skipped row with the reason, the machine's, where a sweep file or the default does."""

from __future__ import annotations

import dataclasses
from typing import Optional

from moebench.config.device import available_memory_bytes
from moebench.config.limits import REFERENCE_KEEP_BYTES
from moebench.config.spec import Combination, Combo
from moebench.config.sweeps import parse_overrides

GIB = 2**30
BF16_BYTES = 2
FP8_TEMP_BYTES = 16  # the float32 temporaries of quantizing w13, per element (measured: reviewer, session 26)
HEAD = "not enough memory"  # the reason's head: skip reasons are grouped by it (plan.reason_groups)


def need_bytes(combo: Combo) -> tuple[int, int]:
    """(expert weights at their build's peak, float32 reference) in bytes, every rank of `combo`
    together. A rank stacks its local experts from per-expert bf16 copies (measure/workload.py
    build_expert_weights), so its peak is the bf16 copies beside the stacked (quantized) weights;
    the reference keeps every expert's float32 weights up to REFERENCE_KEEP_BYTES, else one."""
    from moebench.kernels import registry

    card = registry.BACKENDS.get(combo.backend)
    ranks = 1 if card is None or card.single_rank else max(1, combo.world_size)
    split = registry.ep_split(combo)
    K = combo.hidden
    per_expert = 3 * K * combo.intermediate_per_rank  # elements of w13 [2I, K] and w2 [K, I]
    stored = 1 if combo.quant.startswith("fp8") else BF16_BYTES
    routed = combo.num_experts // split.ep * per_expert * (BF16_BYTES + stored)
    if stored == 1:  # fp8: the stacked w13 is quantized whole in float32 (kernels/quant.py: the float copy,
        # its padded blocks, the quotient and its clamp live together), ~16 bytes an element at the peak
        routed += combo.num_experts // split.ep * 2 * K * combo.intermediate_per_rank * FP8_TEMP_BYTES
    shared = combo.num_shared_experts * 3 * K * combo.shared_intermediate_per_rank * BF16_BYTES
    whole = combo.num_experts * 3 * K * combo.intermediate * 4
    reference = (whole if whole <= REFERENCE_KEEP_BYTES else 3 * K * combo.intermediate * 4) if combo.check else 0
    return ranks * (routed + shared), ranks * reference


def reason(combo: Combo, available: Optional[int]) -> Optional[str]:
    """Why this CPU combination does not fit `available` bytes, with the estimate, the machine's
    memory and what to do; None where it fits, runs on a GPU, or the memory is unknown."""
    if combo.device != "cpu" or available is None:
        return None
    weights, reference = need_bytes(combo)
    if weights + reference <= available:
        return None
    ref = f" and {reference / GIB:.1f} GiB for the float32 reference" if reference else ""
    return (
        f"{HEAD}: model={combo.model} quant={combo.quant} on the CPU needs about {weights / GIB:.1f} GiB to build "
        f"its expert weights{ref}; this machine has {available / GIB:.1f} GiB available: keep one EP rank's "
        f"share (backend=local backend.simulate_ep={_share(combo, available)}), use a smaller model (model=tiny), "
        "or run it on a GPU"
    )


def _share(combo: Combo, available: int) -> str:
    """The smallest EP share (a power of two dividing the experts) whose one rank fits, else 'N'."""
    local = combo.replace(backend="local", world_size=1, simulate_tp=1)
    for n in (2, 4, 8, 16, 32, 64, 128):
        if combo.num_experts % n == 0 and sum(need_bytes(local.replace(simulate_ep=n))) <= available:
            return str(n)
    return "N"


def check(combos: list[Combination], cli_overrides: list[str]) -> list[Combination]:
    """`combos` with each CPU combination too big for this machine's memory skipped with the reason;
    ValueError (exit 2, before any work) for the first where the command line names the model."""
    live = [c for c in combos if not c.reason and c.combo.device == "cpu"]
    if not live:
        return combos
    available = available_memory_bytes()
    too_big = {c.key: why for c in live if (why := reason(c.combo, available))}
    if not too_big:
        return combos
    if any(ov.key_or_group == "model" for ov in parse_overrides(cli_overrides)):
        raise ValueError(next(iter(too_big.values())))
    return [dataclasses.replace(c, reason=too_big[c.key], rule=False) if c.key in too_big else c for c in combos]
