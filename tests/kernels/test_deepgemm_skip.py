"""The `deepgemm*` experts without deep_gemm (CPU CI): registered, their modules
import, supports() says why they are disabled and how to install DeepGEMM, the
planner skips their rows with that reason and `moebench env` lists it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from moebench.kernels import registry
from moebench.kernels.experts import _deep_gemm
from moebench.run import env as envmod
from moebench.run import plan

NAMES = ("deepgemm", "deepgemm_masked", "triton_or_deepgemm")
COMBO = {
    "backend": "local",
    "experts": "deepgemm",
    "reduction": "finalize",
    "overlap": "none",
    "model": "deepseek_v2_lite",
    "hidden": 2048,
    "intermediate": 1408,
    "num_experts": 64,
    "topk": 6,
    "quant": "fp8_block",
    "world_size": 1,
    "simulate_ep": 1,
    "device": "cuda",
}


@pytest.fixture
def no_deep_gemm(monkeypatch):
    """Hide deep_gemm whether or not this machine has it (None in sys.modules
    makes `import deep_gemm` raise ImportError)."""
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    _deep_gemm.reset_import_cache()
    yield
    _deep_gemm.reset_import_cache()


def test_modules_import_without_deep_gemm():
    """A fresh interpreter where `import deep_gemm` fails still registers all three, and their
    implementations import (discovery reads their cards; get_experts imports them)."""
    code = (
        "import sys; sys.modules['deep_gemm'] = None\n"
        "from moebench.kernels import registry\n"
        "registry.discover()\n"
        f"for n in {NAMES!r}:\n"
        "    print(n, registry.get_experts(n).__module__, '|', "
        "registry.EXPERTS[n].supports({'quant': 'fp8_block', 'device': 'cuda'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3
    for name, line in zip(NAMES, lines, strict=True):
        assert line.startswith(f"{name} moebench.kernels.experts.{name} |"), line
        assert "deep_gemm not installed" in line and "scripts/install_deep_gemm.sh" in line


@pytest.mark.parametrize("name", NAMES)
def test_reason_says_how_to_install(no_deep_gemm, name):
    cls = registry.get_experts(name)
    reason = cls.supports(dict(COMBO, experts=name))
    assert reason is not None
    assert "deep_gemm not installed" in reason
    assert "scripts/install_deep_gemm.sh" in reason and "deepinfer-gemm 2.8.2" in reason


def test_require_raises_with_the_hint(no_deep_gemm):
    with pytest.raises(ImportError, match="install_deep_gemm.sh"):
        _deep_gemm.require()


def test_layouts_and_graph_flags():
    std, masked, either = (registry.get_experts(n) for n in NAMES)
    assert std.activation_format.value == "standard" and either.activation_format.value == "standard"
    assert masked.activation_format.value == "batched"
    assert std.graph_capturable and masked.graph_capturable and either.graph_capturable


def test_structural_reasons_when_library_present(monkeypatch):
    """With the library 'present', the combination's own limits give the reasons."""
    monkeypatch.setattr(_deep_gemm, "load", lambda: (object(), None))
    std = registry.get_experts("deepgemm")
    masked = registry.get_experts("deepgemm_masked")
    assert "fp8_block" in std.supports(dict(COMBO, quant="bf16"))
    assert "CUDA" in std.supports(dict(COMBO, device="cpu"))
    assert "CUDA" in masked.supports(dict(COMBO, experts="deepgemm_masked", device="cpu"))
    # the contract's rules (validity.validate), not the entries': fp8_block's 128 multiples, batched -> finalize
    rs = reasons(
        [
            "backend=local,local_batched",
            "experts=deepgemm,deepgemm_masked",
            "reduction=experts",
            "quant=fp8_block",
            "model=gpt_oss_120b",
            "overlap=none",
        ]
    )
    assert "multiples of 128" in rs[("local", "deepgemm", "experts", "fp8_block")]
    assert "only reduction=finalize" in rs[("local_batched", "deepgemm_masked", "experts", "fp8_block")]
    import torch

    if not torch.cuda.is_available():
        assert "CUDA" in std.supports(dict(COMBO))


def reasons(overrides):
    combos, _ = plan.plan(overrides, None)
    return {(c.combo["backend"], c.combo["experts"], c.combo["reduction"], c.combo["quant"]): c.reason for c in combos}


def test_planning_skips_them_with_the_right_reason(no_deep_gemm):
    rs = reasons(
        [
            "backend=local,local_batched",
            "experts=deepgemm,deepgemm_masked,triton_or_deepgemm",
            "reduction=experts,finalize",
            "quant=bf16,fp8_block",
            "model=deepseek_v2_lite",
        ]
    )
    assert len(rs) == 2 * 3 * 2 * 2
    for (backend, experts, reduction, quant), why in rs.items():
        assert why, (backend, experts, reduction, quant)
        batched_backend = backend == "local_batched"
        batched_experts = experts == "deepgemm_masked"
        if batched_backend != batched_experts:
            assert "layouts differ" in why
        elif batched_backend and reduction == "experts":
            assert "only reduction=finalize" in why
        elif quant != "fp8_block":  # all three run DeepGEMM: a rule of the combination before the library
            assert "need quant=fp8_block" in why
        else:  # the valid pairings: missing library, with how to install it
            assert "deep_gemm not installed" in why and "install_deep_gemm.sh" in why, why


def test_moebench_env_lists_them_with_the_reason(no_deep_gemm):
    entries = {e["name"]: e for e in envmod.usable_entries("cpu", 2) if e["kind"] == "experts"}
    for name in NAMES:
        assert name in entries, sorted(entries)
        assert "deep_gemm not installed" in entries[name]["reason"], entries[name]
        assert "no implementation" not in entries[name]["reason"]
    assert entries["deepgemm_masked"]["layout"] == "batched"
