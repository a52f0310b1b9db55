"""Which experts each token picks: the synthetic routings, the replayed recordings, and the
hottest rank of an EP-N run emulated on one GPU (docs/routing.md).

Legend: T tokens of one rank, P top-k, E experts (global), N ranks the experts are split over
(world_size, or simulate_ep on one GPU), E_r = E / N experts per rank.

- uniform: each token picks P distinct experts uniformly; balanced: pairs dealt round-robin
  (every expert the same count ±1); zipf: expert popularity ~ 1 / rank^skew. These three draw
  exactly the ids they drew before the other routings existed (the same generator stream), so
  stored rows stay comparable.
- imbalanced_experts (imbalance R): one expert (chosen by the seed) is picked by R·T·P/E of
  the T tokens, R times the mean load; each token's other picks are uniform over the other
  experts. Needs R ≤ E/P (the hot expert cannot get more than every token).
- imbalanced_ranks (imbalance R): the E_r experts of one rank (chosen by the seed) receive
  R·T·P/N of the T·P pairs, R times a rank's mean; the picks inside that rank and outside it
  are uniform. Needs N ≥ 2 and R ≤ N·min(P, E_r)/P.
- replay: consecutive rows of a recording (routing/file.py; rank r reads the window after
  rank r-1's), its weights when it has them.

The choices of the hot expert and the hot rank depend on the seed only, so every rank of a
real EP-N run (and every token count) shares them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from moebench.routing.rules import ROUTINGS, SYNTHETIC, RoutingSpec, check  # noqa: F401 (re-exported: names of this module)


def gen(seed: int, *salt: int, device="cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    s = seed
    for x in salt:
        s = (s * 1_000_003 + x + 1) % (2**62)
    g.manual_seed(s)
    return g


def hot_expert(E: int, seed: int) -> int:
    """The expert imbalanced_experts loads R times the mean (the seed's choice)."""
    return int(torch.randint(E, (1,), generator=gen(seed, 7)).item())


def hot_rank(N: int, seed: int) -> int:
    """The rank whose experts imbalanced_ranks loads R times the mean (the seed's choice)."""
    return int(torch.randint(N, (1,), generator=gen(seed, 8)).item())


def route(
    spec: RoutingSpec, num_experts: int, topk: int, T: int, rank: int, salt: int, recording=None
) -> tuple[torch.Tensor, Optional[torch.Tensor], str]:
    """(ids [T, P] int64, weights [T, P] float32 or None (then drawn as the synthetic ones),
    the replay window's description or "") of rank `rank`'s T tokens, on the CPU. Not for the
    SYNTHETIC routings (workload.make_inputs keeps their stream)."""
    E, P = num_experts, topk
    g = gen(spec.seed, 6, rank, salt, T)
    if spec.name == "imbalanced_experts":
        return _imbalanced_experts(E, P, T, spec.imbalance, hot_expert(E, spec.seed), g), None, ""
    if spec.name == "imbalanced_ranks":
        N = spec.ep_size
        return _imbalanced_ranks(E, P, T, N, spec.imbalance, hot_rank(N, spec.seed), g), None, ""
    if spec.name == "replay":
        from moebench.routing.file import window

        rows, where = window(recording, T, rank, spec.seed)
        ids = torch.from_numpy(recording.ids[rows])
        w = torch.from_numpy(recording.weights[rows]) if recording.weights is not None else None
        return ids, w, where
    raise ValueError(f"route() does not draw routing={spec.name!r}")


def _pick_without(g, T: int, P: int, pool: torch.Tensor) -> torch.Tensor:
    """[T, P] distinct picks per token, uniform over `pool` (ids)."""
    if P == 0:
        return torch.empty(T, 0, dtype=torch.int64)
    return pool[torch.multinomial(torch.ones(T, pool.numel()), P, replacement=False, generator=g)]


def _imbalanced_experts(E: int, P: int, T: int, R: float, hot: int, g) -> torch.Tensor:
    n_hot = min(T, round(R * T * P / E))
    order = torch.randperm(T, generator=g)
    has_hot = torch.zeros(T, dtype=torch.bool)
    has_hot[order[:n_hot]] = True
    others = torch.cat([torch.arange(hot), torch.arange(hot + 1, E)])
    ids = _pick_without(g, T, P, others)  # P picks among the others...
    ids[has_hot, 0] = hot  # ...of which the tokens that take the hot expert drop one
    return ids


def _imbalanced_ranks(E: int, P: int, T: int, N: int, R: float, hot: int, g) -> torch.Tensor:
    Er = E // N
    total = T * P
    n_hot = min(T * min(P, Er), round(R * total / N))
    # the hot rank's pairs spread over the tokens as evenly as they go: token t takes base or base+1
    base, extra = divmod(n_hot, T)
    per_token = torch.full((T,), base, dtype=torch.int64)
    per_token[torch.randperm(T, generator=g)[:extra]] += 1
    inside = torch.arange(hot * Er, (hot + 1) * Er)
    outside = torch.cat([torch.arange(0, hot * Er), torch.arange((hot + 1) * Er, E)])
    ids = torch.empty(T, P, dtype=torch.int64)
    for k in sorted(set(per_token.tolist())):
        rows = (per_token == k).nonzero().flatten()
        n = rows.numel()
        a = _pick_without(g, n, k, inside)
        b = _pick_without(g, n, P - k, outside)
        ids[rows] = torch.cat([a, b], dim=1)
    return ids


# -- the hottest rank of EP-N on one GPU ------------------------------------------------------
def rank_pairs(ids: torch.Tensor, num_experts: int, N: int) -> torch.Tensor:
    """[N] pairs each rank of an EP-N split of `num_experts` receives from `ids` (any shape)."""
    return torch.bincount(ids.flatten() // (num_experts // N), minlength=N)


def pick_rank(rank_load: torch.Tensor, choice: str) -> int:
    """The rank `backend.simulate_rank` names: an index, or "hottest" (the most pairs; the
    lowest index among equals)."""
    if choice == "hottest":
        return int(torch.argmax(rank_load).item())
    k = int(choice)
    if not 0 <= k < rank_load.numel():
        raise ValueError(f"backend.simulate_rank={choice} is not a rank of EP-{rank_load.numel()}")
    return k


def receive(ids: torch.Tensor, num_experts: int, N: int, k: int) -> torch.Tensor:
    """Rows (tokens) of `ids` [M, P] with a pair on rank k of EP-N: what that rank receives."""
    Er = num_experts // N
    on_k = ((ids >= k * Er) & (ids < (k + 1) * Er)).any(dim=1)
    return on_k.nonzero().flatten()


def rotate(ids: torch.Tensor, num_experts: int, N: int, k: int) -> torch.Tensor:
    """Ids renamed so rank k's experts are 0 .. E/N-1 (the experts a local layer with
    simulate_ep=N builds): a relabelling, so every expert keeps its load and every token its
    picks. Expert weights are drawn per id from the seed, so this changes no timing."""
    return (ids - k * (num_experts // N)) % num_experts


@dataclass(frozen=True)
class Imbalance:
    """max / mean pairs per expert and per rank of one routing (1.0 = perfectly even)."""

    experts: float
    ranks: float


def imbalance(expert_pairs: torch.Tensor, N: int) -> Imbalance:
    """From the pairs per global expert (`torch.bincount(ids, minlength=E)`), over EP-N."""
    c = expert_pairs.double()
    mean = c.mean().item()
    by_rank = c.view(N, -1).sum(dim=1) if N > 1 else c.sum().view(1)
    return Imbalance(
        experts=c.max().item() / mean if mean else float("nan"),
        ranks=by_rank.max().item() / by_rank.mean().item() if by_rank.sum() else float("nan"),
    )


def expert_pairs(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    return torch.bincount(ids.flatten().to("cpu", torch.int64).clamp(min=0), minlength=num_experts)


def fill_rows(max_pairs: int, fill: float) -> int:
    """Rows per expert of a batched buffer that the busiest local expert fills to `fill`."""
    return max(1, int(np.ceil(max_pairs / fill)))
