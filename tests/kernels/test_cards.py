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


# the built-ins' `supports` on plain mappings: (kind, entry, the combination's changes, words of the
# reason, whether it is a Rule), on a machine without DeepEP, pplx, DeepGEMM, a GPU or the interpreter
STANDARD = {"backend": "local", "hidden": 2048, "intermediate": 1408, "quant": "fp8_block", "world_size": 1}
EP = {"hidden": 7168, "num_experts": 256, "topk": 8, "quant": "bf16", "world_size": 2, "device": "cuda"}
SUPPORTS = [
    # rules: a quant, layout, size or setting the entry never runs, whatever the machine
    ("experts", "deepgemm", {"quant": "bf16"}, "need quant=fp8_block", True),
    ("experts", "deepgemm_masked", {"quant": "fp8_tensor"}, "need quant=fp8_block", True),
    ("experts", "triton_or_deepgemm", {"quant": "bf16"}, "need quant=fp8_block", True),
    ("experts", "triton", {"quant": "fp8_tensor", "row_layout": "gathered"}, "row_layout=gathered picks", True),
    ("experts", "triton", {"row_layout": "contiguous", "hidden": 2880}, "multiples of 128 (hidden=2880)", True),
    ("experts", "triton", {"quant": "bf16", "contiguous_gemm": "gluon"}, "fp8_block GEMM, not quant=bf16", True),
    (
        "experts",
        "triton",
        {"row_layout": "gathered", "contiguous_gemm": "gluon_wide"},
        "contiguous layout's rows",
        True,
    ),
    ("backend", "tp", {"overlap": "combine"}, "only overlap=none", True),
    ("backend", "deepep_ht", {"world_size": 6}, "world_size in (2, 4, 8)", True),
    ("backend", "deepep_ht", {"num_experts": 4096}, "at most 1024 experts per rank", True),
    ("backend", "deepep_ht", {"topk": 40}, "top-k <= 32", True),
    ("backend", "deepep_ht", {"hidden": 8192}, "16368 bytes", True),
    ("backend", "deepep_ht", {"num_sms": 23}, "positive even SM count", True),
    ("backend", "deepep_ht", {"combine_nvl_chunk": 256}, "receive buffer holds 256", True),
    ("backend", "deepep_ll", {"world_size": 12}, "multiple of 8", True),
    ("backend", "deepep_ll", {"hidden": 256}, "hidden in (2048", True),
    ("backend", "deepep_ll", {"topk": 12}, "top-k <= 11", True),
    ("backend", "deepep_ll", {"max_tokens_per_rank": 3}, "multiple of 4", True),
    ("backend", "pplx", {"pplx_mode": "nvlink"}, "backend.pplx_mode='nvlink'", True),
    ("backend", "pplx", {"hidden": 2044}, "16-byte units", True),
    ("backend", "pplx", {"hidden": 32768}, "48 KiB", True),
    # the machine's: a library, a GPU (or the interpreter), the device
    ("experts", "deepgemm", {}, "deep_gemm not installed", False),
    ("experts", "triton", {}, "Triton experts need a CUDA GPU", False),
    ("experts", "triton", {"contiguous_gemm": "gluon"}, "Triton experts need a CUDA GPU", False),
    ("experts", "triton_or_deepgemm", {}, "deep_gemm not installed", False),
    ("backend", "deepep_ht", {}, "deep_ep is not installed", False),
    ("backend", "deepep_ll", {}, "deep_ep is not installed", False),
    ("backend", "pplx", {}, "pplx_kernels is not installed", False),
]


@pytest.mark.parametrize(
    "kind, name, changes, says, rule",
    SUPPORTS,
    ids=[f"{c[1]}-{'-'.join(map(str, c[2].values())) or 'ok'}" for c in SUPPORTS],
)
def test_the_builtins_mark_what_no_machine_lifts_as_a_rule(kind, name, changes, says, rule, monkeypatch):
    """Each built-in's `supports` returns a `Rule` for a limit no machine lifts (docs/design.md,
    "Validity"), checked before its library and GPU, so that every machine refuses it alike; what
    this machine lacks stays a plain str."""
    from moebench.kernels.entry import Rule
    from moebench.kernels.experts import _deep_gemm
    from moebench.kernels.prepare_finalize import _deepep, _pplx

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(_deep_gemm, "load", lambda: (None, "deep_gemm not installed: how to install it"))
    monkeypatch.setattr(_deepep, "unavailable_reason", lambda: "deep_ep is not installed: how to install it")
    monkeypatch.setattr(_pplx, "unavailable_reason", lambda: "pplx_kernels is not installed: how to install it")
    base = dict(EP, backend=name) if kind == "backend" else dict(STANDARD, experts=name, device="cpu")
    why = registry.entry(kind, name).supports({**base, **changes})
    assert why is not None and says in why and isinstance(why, Rule) == rule, why


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_rule_of_the_triton_experts_decides_before_the_machine_is_asked(device, monkeypatch):
    """Where a rule decides, what the machine lacks is not asked: no torch import, no CUDA started in
    the planning process for a compute capability, no Gluon version check."""
    from moebench.kernels.cards import experts

    def asked(*args):
        raise AssertionError("the machine was asked")

    monkeypatch.setattr(experts, "_triton_machine", asked)
    combo = dict(STANDARD, experts="triton", device=device, quant="fp8_tensor", row_layout="gathered")
    assert "row_layout=gathered picks" in registry.entry("experts", "triton").supports(combo)


def test_the_triton_experts_ask_the_compute_capability_only_where_a_reason_needs_it(monkeypatch):
    """bf16 rows on the gathered layout need neither the fp8 dot's capability nor TMA: the GPU's
    compute capability is not asked (asking starts CUDA in the planning process)."""
    import torch

    def capability(*args):
        raise AssertionError("the compute capability was asked")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    combo = dict(STANDARD, experts="triton", device="cuda", quant="bf16")
    assert registry.entry("experts", "triton").supports(combo) is None


def _no_machine(monkeypatch):
    """Make asking the machine fail the test: DeepGEMM's import, CUDA's compute capability, the
    Gluon version check (a GPU that would answer is faked visible)."""
    import torch

    from moebench.kernels.cards import experts
    from moebench.kernels.experts import _deep_gemm

    def asked(*args):
        raise AssertionError("the machine was asked")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", asked)
    monkeypatch.setattr(_deep_gemm, "load", asked)
    monkeypatch.setattr(experts, "gluon_runtime_unsupported", asked)


@pytest.mark.parametrize(
    "changes, says",
    [
        # DeepGEMM's rule, where the Triton side would ask the compute capability
        ({"quant": "fp8_tensor"}, "DeepGEMM experts need quant=fp8_block"),
        ({"quant": "bf16", "row_layout": "contiguous"}, "DeepGEMM experts need quant=fp8_block"),  # (TMA's SM90)
        # the Triton side's rules, where DeepGEMM would be imported
        ({"row_layout": "gathered", "contiguous_gemm": "gluon"}, "contiguous layout's rows"),
        ({"row_layout": "contiguous", "hidden": 2880}, "multiples of 128 (hidden=2880)"),
    ],
)
def test_a_rule_of_triton_or_deepgemm_decides_before_either_side_asks_the_machine(changes, says, monkeypatch):
    """triton_or_deepgemm runs both sides: a rule of either decides before what the machine lacks
    for either is asked (no DeepGEMM import, no CUDA started for a compute capability, no Gluon
    version check), and the reason is the rule's."""
    from moebench.kernels.entry import Rule

    _no_machine(monkeypatch)
    combo = {**STANDARD, "experts": "triton_or_deepgemm", "device": "cuda", **changes}
    why = registry.entry("experts", "triton_or_deepgemm").supports(combo)
    assert isinstance(why, Rule) and says in why, why


def test_triton_or_deepgemm_asks_the_triton_side_s_machine_only_where_deepgemm_s_does_not_decide(monkeypatch):
    """What the machine lacks for DeepGEMM (its library) is the reason; the Triton side's machine
    is then not asked."""
    from moebench.kernels.cards import experts
    from moebench.kernels.entry import Rule
    from moebench.kernels.experts import _deep_gemm

    def asked(*args):
        raise AssertionError("the Triton side's machine was asked")

    monkeypatch.setattr(_deep_gemm, "load", lambda: (None, "deep_gemm not installed"))
    monkeypatch.setattr(experts, "_triton_machine", asked)
    combo = {**STANDARD, "experts": "triton_or_deepgemm", "device": "cuda"}
    why = registry.entry("experts", "triton_or_deepgemm").supports(combo)
    assert why == "deep_gemm not installed" and not isinstance(why, Rule)
