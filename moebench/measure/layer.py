"""Build one combination's layer on one rank: its KernelContext, this rank's expert
weights, the backend, the experts and the shared experts, as every rank builds them
(the worker and the tuner use this)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from moebench.config.spec import Combo
from moebench.kernels import registry
from moebench.kernels.interfaces import ExpertWeights, KernelContext, LayerShape, QuantSpec
from moebench.kernels.modular import MoEKernel
from moebench.measure.workload import build_expert_weights, build_shared, kept_expert_weights


@dataclass
class Layer:
    ctx: KernelContext
    weights: ExpertWeights
    kernel: MoEKernel


def layer_shape(combo: Combo) -> LayerShape:
    """One rank's layer: with simulate_tp=N each expert's intermediate is the rank's 1/N shard
    (every routed expert kept: vLLM's fused MoE under TP without EP)."""
    return LayerShape(
        hidden=combo.hidden,
        intermediate=combo.intermediate_per_rank,
        num_experts=combo.num_experts,
        topk=combo.topk,
        num_shared_experts=combo.num_shared_experts,
        shared_intermediate=combo.shared_intermediate_per_rank,
    )


def kernel_context(
    combo: Combo, rank: int, world_size: int, group, device: torch.device, options: Optional[dict] = None
) -> KernelContext:
    """The context the entries see; `options` are the knobs (combo.options), plus what a
    caller passes beside them (the tuner: a tile config)."""
    return KernelContext(
        shape=layer_shape(combo),
        quant=QuantSpec(combo.quant),
        device=device,
        rank=rank,
        world_size=world_size,
        group=group,
        simulate_ep=combo.simulate_ep,
        max_tokens_per_rank=int(combo.get("max_tokens_per_rank", 512)),
        options={**combo.options, **(options or {})},
    )


def build_layer(
    combo: Combo,
    rank: int,
    world_size: int,
    group,
    device: torch.device,
    options: Optional[dict] = None,
    keep_weights: bool = False,
) -> Layer:
    """The layer; `keep_weights`: its expert weights are those of the previous build of the same
    model, quant, seed and share where this process kept them (the worker's families)."""
    ctx = kernel_context(combo, rank, world_size, group, device, options)
    weights = (kept_expert_weights if keep_weights else build_expert_weights)(ctx, combo.seed)
    pf = registry.get_backend(combo.backend)(ctx)
    experts = registry.get_experts(combo.experts)(weights, combo.reduction, ctx)
    shared = build_shared(ctx.shape, combo.seed, device, sm_carveout=combo.shared_sm_carveout)
    return Layer(ctx, weights, MoEKernel(pf, experts, shared, combo.overlap))
