"""TP replaces EP (kernels/split.py): one rule for the split a combination really uses, read by
the routing, the planning's rules, the cards and KernelContext; a plain mapping is split as its
Combo is."""

from __future__ import annotations

import pytest
import torch

from moebench.config.compose import compose_config, to_combo
from moebench.config.validity import validate
from moebench.kernels import registry
from moebench.kernels.cards import experts as experts_cards
from moebench.kernels.split import Split
from moebench.measure.layer import kernel_context
from moebench.measure.workload import routing_spec

BASE = ["reduction=experts", "overlap=none", "quant=bf16", "runner.device=cpu", "model=tiny"]
ROUTING = {"routing": "zipf", "skew": 1.2, "seed": 3, "simulate_ep": 1}


def test_a_mapping_with_a_tp_backend_routes_no_ep_split(monkeypatch):
    # the routing once read a TP split only from a Combo's tp_size: a mapping's backend=tp was EP-2
    assert routing_spec({**ROUTING, "backend": "tp", "world_size": 2}).ep_size == 1
    assert routing_spec({**ROUTING, "backend": "naive", "world_size": 2}).ep_size == 2
    assert routing_spec({**ROUTING, "world_size": 2}).ep_size == 2  # no backend named: an EP split
    # the contiguous layout's rule reads the mapping's shard too (it once read simulate_tp only)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    layout = {"device": "cpu", "quant": "bf16", "row_layout": "contiguous", "hidden": 256, "intermediate": 128}
    assert "intermediate=64" in (experts_cards.triton_unsupported({**layout, "backend": "tp", "world_size": 2}) or "")
    assert experts_cards.triton_unsupported({**layout, "backend": "naive", "world_size": 2}) is None


@pytest.mark.parametrize(
    "overrides, split",
    [
        (["backend=local"], Split(ep=1, tp=1)),
        (["backend=local", "backend.simulate_ep=2"], Split(ep=2, tp=1)),
        (["backend=local", "backend.simulate_tp=2"], Split(ep=1, tp=2)),
        (["backend=tp", "runner.world_size=2"], Split(ep=1, tp=2)),
        (["backend=naive", "runner.world_size=2"], Split(ep=2, tp=1)),
        (["backend=deepep_ht", "runner.world_size=2"], Split(ep=2, tp=1)),
        (["backend=local", "runner.world_size=2"], Split(ep=1, tp=1)),  # a single-rank backend drops the size
    ],
)
def test_every_reader_of_the_split_agrees(overrides, split, monkeypatch):
    c = to_combo(compose_config([*BASE, "experts=torch", *overrides]))
    mapping = {k: c[k] for k in c.keys()}
    assert registry.ep_split(c) == registry.ep_split(mapping) == split
    assert routing_spec(c).ep_size == routing_spec(mapping).ep_size == split.ep
    assert c.tp_size == split.tp and c.intermediate_per_rank == c.intermediate // split.tp
    for rank in range(c.world_size):
        ctx = kernel_context(c, rank, c.world_size, None, torch.device("cpu"))
        assert ctx.ep_size == split.ep and ctx.num_local_experts == c.num_experts // split.ep
        assert ctx.shape.intermediate == c.intermediate // split.tp
    # the planning's rules: imbalanced_ranks needs an EP split
    imbalanced = to_combo(compose_config([*BASE, "experts=torch", *overrides, "workload.routing=imbalanced_ranks"]))
    assert ("needs an EP split" in (validate(imbalanced) or "")) == (split.ep < 2)
    # the contiguous layout's rule sees the rank's shard, from a Combo or a mapping
    seen = []
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(experts_cards, "contiguous_unsupported", lambda q, h, inter: seen.append(inter))
    contiguous = to_combo(compose_config([*BASE, "experts=triton", "experts.row_layout=contiguous", *overrides]))
    for combo in (contiguous, {k: contiguous[k] for k in contiguous.keys()}):
        experts_cards.triton_unsupported(combo)
    assert seen == [c.intermediate // split.tp] * 2
