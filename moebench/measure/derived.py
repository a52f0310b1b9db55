"""Derived figures per rank (docs/design.md, "Derived figures"), written out as formulas:
the experts' FLOP rate, the HBM bytes they must move, the link rate of the communication."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moebench.kernels.interfaces import ActivationFormat
from moebench.kernels.modular import MoEKernel

NAN = float("nan")


def expert_flops(pairs: int, hidden: int, intermediate: int) -> int:
    """2 * pairs * 3 * K * I: one multiply-add per weight element for each
    token-expert pair, in 3 matmuls (gate, up, down)."""
    return 2 * pairs * 3 * hidden * intermediate


def expert_bytes(
    hit_experts: int, bytes_per_expert: int, rows_in: int, rows_out: int, hidden: int, act_bytes: int
) -> int:
    """Fewest bytes the experts must move: the weights and scales of every
    local expert the routing hit, read once + activations in (rows_in * K at
    the input precision) + outputs (rows_out * K bf16)."""
    return hit_experts * bytes_per_expert + rows_in * hidden * act_bytes + rows_out * hidden * 2


def rate(amount: float, us: float, unit: float) -> float:
    """amount / (us * 1e-6) / unit; NaN without a positive time."""
    if not us or us != us or us <= 0:
        return NAN
    return amount / (us * 1e-6) / unit


@dataclass(frozen=True)
class Routing:
    """Pairs, rows and experts this rank's experts process, and the bytes it communicates."""

    pairs: int
    hit: int
    rows_in: int
    rows_out: int
    comm_bytes: int


def routing_counts(kernel: MoEKernel, x, w, ids) -> Routing:
    """Count what one prepare hands to this rank's experts (outside timing)."""
    prepared = kernel.pf.prepare(x, w, ids, kernel.experts.input_quant)
    if kernel.experts.activation_format == ActivationFormat.BATCHED:
        assert prepared.expert_num_tokens_E is not None, "a batched prepare counts each expert's rows"
        counts = prepared.expert_num_tokens_E.long()
        pairs = int(counts.sum())
        hit = int((counts > 0).sum())
        rows_in, rows_out = pairs, pairs
    else:
        local = prepared.topk_ids_MP
        assert local is not None, "a standard prepare hands over the local top-k ids"
        pairs = int((local >= 0).sum())
        hit = int(torch.unique(local[local >= 0]).numel())
        rows_in = int(((local >= 0).any(dim=1)).sum())
        rows_out = rows_in if kernel.experts.reduction == "experts" else pairs
    return Routing(pairs, hit, rows_in, rows_out, kernel.pf.comm_bytes(x.shape[0], prepared))


def derived_figures(
    routing: Routing,
    phases_us: dict,
    hidden: int,
    intermediate: int,
    bytes_per_expert: int,
    act_bytes: int,
    overlap: str,
) -> dict:
    """tflops and hbm_gbps over the experts phase, nvlink_gbps over dispatch + combine
    (only without overlap: the windows hold the shared experts otherwise)."""
    exp_us = phases_us.get("experts", NAN)
    flops = expert_flops(routing.pairs, hidden, intermediate)
    nbytes = expert_bytes(routing.hit, bytes_per_expert, routing.rows_in, routing.rows_out, hidden, act_bytes)
    comm_us = phases_us.get("dispatch", 0.0) + phases_us.get("combine", 0.0)
    linked = routing.comm_bytes and overlap == "none"
    return {
        "tflops": rate(flops, exp_us, 1e12),
        "hbm_gbps": rate(nbytes, exp_us, 1e9),
        "expert_flops": float(flops),
        "expert_bytes": float(nbytes),
        "nvlink_gbps": rate(routing.comm_bytes, comm_us, 1e9) if linked else NAN,
    }
