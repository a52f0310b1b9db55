"""The routings and what a model allows of them (docs/routing.md): the names, a
combination's routing spec and `check`, without torch or numpy, so that planning a sweep
(config/compose.py, config/validity.py) imports neither; the draws are generate.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

SYNTHETIC = ("uniform", "balanced", "zipf")
ROUTINGS = SYNTHETIC + ("imbalanced_experts", "imbalanced_ranks", "replay")


@dataclass(frozen=True)
class RoutingSpec:
    """What a combination says about its routing (config/spec.py's workload fields)."""

    name: str = "uniform"
    skew: float = 1.2
    imbalance: float = 1.0
    seed: int = 0
    ep_size: int = 1  # N: ranks the experts are split over (world_size, or simulate_ep)
    file: str = ""
    layer: Optional[int] = None


def check(spec: RoutingSpec, num_experts: int, topk: int) -> Optional[str]:
    """Why `spec` cannot route this model (a sentence for exit 2), or None."""
    E, P, N, R = num_experts, topk, spec.ep_size, spec.imbalance
    if spec.name in ("imbalanced_experts", "imbalanced_ranks") and not R >= 1.0:
        return f"workload.imbalance={R:g} must be >= 1 (the hot expert's or rank's load over the mean)"
    if spec.name == "imbalanced_experts" and R > E / P:
        return (
            f"workload.imbalance={R:g} exceeds E/P = {E}/{P} = {E / P:g}: the hot expert cannot get more "
            "pairs than there are tokens"
        )
    if spec.name == "imbalanced_ranks":
        if N < 2:
            return None  # a skip reason, not bad input (validity.py): a sweep may cross it with EP-1
        cap = N * min(P, E // N) / P
        if R > cap:
            return (
                f"workload.imbalance={R:g} exceeds N·min(P, E/N)/P = {cap:g} for EP-{N}: one rank's experts "
                "cannot receive more pairs than that"
            )
    return None
