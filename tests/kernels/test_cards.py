"""moebench's entries and their cards (kernels/entry.py, kernels/cards/): every implementation
module is named by a card, each implementation subclasses its card and keeps its answers, and
an implementation that does not is refused when it registers."""

from __future__ import annotations

import pkgutil

import pytest

from moebench.kernels import registry
from moebench.kernels.entry import BackendCard, ExpertsCard
from moebench.kernels.interfaces import Experts, PrepareFinalize

PACKAGES = {"backend": "prepare_finalize", "experts": "experts"}


def _modules(package: str) -> set[str]:
    pkg = __import__(f"moebench.kernels.{package}", fromlist=["_"])
    return {f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")}


@pytest.mark.parametrize("kind", sorted(PACKAGES))
def test_every_implementation_module_has_a_card(kind):
    cards = {name: c for (k, name), c in registry.CARDS.items() if k == kind}
    assert {c.implementation for c in cards.values()} == _modules(PACKAGES[kind])
    base, impl_base = (BackendCard, PrepareFinalize) if kind == "backend" else (ExpertsCard, Experts)
    get = registry.get_backend if kind == "backend" else registry.get_experts
    for name, card in cards.items():
        assert issubclass(card, base) and not issubclass(card, impl_base), name
        cls = get(name)
        assert issubclass(cls, card) and issubclass(cls, impl_base), name
        assert cls.__module__ == f"moebench.kernels.{card.implementation}"
        assert registry.entry(kind, name) is cls  # once imported, it answers in the card's place
        for attr in ("activation_format", "graph_capturable", "graph_differs", "knobs"):
            assert getattr(cls, attr) == getattr(card, attr), (name, attr)


def test_an_implementation_must_subclass_its_card(monkeypatch):
    for table in ("BACKENDS", "EXPERTS"):
        monkeypatch.setattr(registry, table, dict(getattr(registry, table)))
    from moebench.kernels.experts.torch import TorchExperts

    stray = type("Stray", (Experts,), {"__module__": TorchExperts.__module__})
    with pytest.raises(ValueError, match="must subclass its card TorchCard"):
        registry.register_experts("torch")(stray)
    nameless = type("Nameless", (Experts,), {"__module__": TorchExperts.__module__})
    with pytest.raises(ValueError, match="has no card"):
        registry.register_experts("no_card_here")(nameless)
    assert registry.EXPERTS["torch"] is TorchExperts
