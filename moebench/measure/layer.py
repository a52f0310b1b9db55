"""Build one combination's layer on one rank: its KernelContext, this rank's expert
weights, the backend, the experts and the shared experts, as every rank builds them
(the worker and the tuner use this)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from moebench.config.spec import Combo
from moebench.kernels import registry
from moebench.kernels.interfaces import ExpertWeights, KernelContext, LayerShape, QuantSpec
from moebench.kernels.modular import MoEKernel
from moebench.measure.workload import (
    build_expert_weights,
    build_shared,
    full_shape,
    kept_expert_weights,
    reference_expert_fn,
)


@dataclass
class Layer:
    ctx: KernelContext
    weights: ExpertWeights
    kernel: MoEKernel


def layer_shape(combo: Combo) -> LayerShape:
    """One rank's layer: under TP-N (backend.simulate_tp=N, or backend=tp over N ranks) each
    expert's intermediate is the rank's 1/N shard (every routed expert kept: vLLM's fused MoE
    under TP without EP)."""
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
        # real TP ranks slice the whole layer's weights; simulate_tp's one rank draws its shard's own
        tp_size=combo.tp_size if world_size > 1 else 1,
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
    shared = build_shared(
        ctx.shape, combo.seed, device, combo.shared_sm_carveout, tp_rank=ctx.rank, tp_size=ctx.tp_size
    )
    return Layer(ctx, weights, MoEKernel(pf, experts, shared, combo.overlap))


@dataclass
class Reference:
    """What a rank's output is checked against (kernels/reference.py reference_moe): the layer's
    shape, its experts' fp32 weights, the experts whose pairs count and the shared experts' fp32
    weights. A TP rank's output is the all-reduced sum of every rank's shard: the whole layer's."""

    shape: LayerShape
    expert_fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    kept: Optional[range]
    shared: Optional[tuple[torch.Tensor, torch.Tensor]]


def reference_of(layer: Layer, seed: int, device: torch.device) -> Reference:
    """The reference of `layer` built on this rank."""
    ctx, kernel = layer.ctx, layer.kernel
    kept = (
        range(ctx.first_local_expert, ctx.first_local_expert + ctx.num_local_experts) if ctx.simulate_ep > 1 else None
    )
    shape = full_shape(ctx)
    shared = kernel.shared if ctx.tp_size == 1 else build_shared(shape, seed, device)
    shared_w = (shared.w13_NK.float(), shared.w2_KS.float()) if shared is not None else None
    return Reference(shape, reference_expert_fn(shape, ctx.quant, seed, device), kept, shared_w)
