"""How a combination splits its routed experts over ranks (docs/models.md, "Tensor parallelism"):
the one rule that the planning (config/validity.py, Combo.tp_size), the routing (measure/
workload.py), the worker, the cards and KernelContext read.

TP replaces EP (as in vLLM): a tensor_parallel backend (backend=tp) keeps every expert on every
rank, each at intermediate / world_size (EP 1, TP world_size); an EP backend splits the experts
over its world_size ranks; a single-rank backend keeps one rank's share of EP-simulate_ep, or
one rank's shard of TP-simulate_tp (never both: compose refuses it). This module imports nothing
(KernelContext reads it, and planning imports no torch); registry.ep_split reads a combination's
backend card into it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    ep: int  # ranks the routed experts are split over (EP-N; 1: every expert on every rank)
    tp: int  # ranks each expert's intermediate is split over (TP-N; 1: whole experts)


def split(
    world_size: int,
    simulate_ep: int = 1,
    simulate_tp: int = 1,
    *,
    tensor_parallel: bool = False,
    single_rank: bool = False,
) -> Split:
    """The split of a backend's ranks: `tensor_parallel` and `single_rank` are its card's flags
    (kernels/entry.py; both False: an EP backend, or a backend not known here, whose world_size
    of 1 reads simulate_ep)."""
    if tensor_parallel:
        return Split(ep=1, tp=max(1, world_size))
    ep = world_size if world_size > 1 and not single_rank else simulate_ep
    return Split(ep=max(1, ep), tp=max(1, simulate_tp))
