"""deepep_ht without deep_ep (CPU CI): the backend is registered, its module
imports, and supports() says why it is disabled and how to install DeepEP."""
from __future__ import annotations

import subprocess
import sys

import pytest

from moebench.kernels import registry
from moebench.kernels.prepare_finalize import _deepep

COMBO = {
    "backend": "deepep_ht", "experts": "torch", "reduction": "finalize", "overlap": "none",
    "model": "deepseek_v3", "hidden": 7168, "intermediate": 2048, "num_experts": 256, "topk": 8,
    "num_shared_experts": 1, "shared_intermediate": 2048, "quant": "bf16", "world_size": 2,
    "num_sms": 24, "device": "cuda",
}


@pytest.fixture
def no_deep_ep(monkeypatch):
    """Hide deep_ep whether or not this machine has it (None in sys.modules
    makes `import deep_ep` raise ImportError)."""
    monkeypatch.setitem(sys.modules, "deep_ep", None)
    _deepep.reset_import_cache()
    yield
    _deepep.reset_import_cache()


def test_module_imports_without_deep_ep():
    """A fresh interpreter where `import deep_ep` fails still imports the backend."""
    code = (
        "import sys; sys.modules['deep_ep'] = None; sys.modules['deep_ep_cpp'] = None\n"
        "from moebench.kernels.prepare_finalize import deepep_ht\n"
        "from moebench.kernels.registry import BACKENDS\n"
        "assert BACKENDS['deepep_ht'] is deepep_ht.DeepEPHTPrepareFinalize\n"
        "print(deepep_ht.DeepEPHTPrepareFinalize.supports({'device': 'cuda', 'world_size': 2}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "deep_ep is not installed" in out.stdout


def test_registered_and_reason_says_how_to_install(no_deep_ep):
    cls = registry.get_backend("deepep_ht")
    reason = cls.supports(dict(COMBO))
    assert reason is not None
    assert "deep_ep is not installed" in reason
    assert "github.com/deepseek-ai/DeepEP" in reason and "v1.2.1" in reason and "NVSHMEM" in reason


def test_require_raises_with_hint(no_deep_ep):
    with pytest.raises(ImportError, match="DeepEP v1.2.1"):
        _deepep.require()


def test_structural_reasons_when_library_present(monkeypatch):
    """With the library 'present', the combo's own limits give the reasons."""
    monkeypatch.setattr(_deepep, "unavailable_reason", lambda: None)
    cls = registry.get_backend("deepep_ht")
    assert cls.supports(dict(COMBO)) is None
    assert "CUDA" in cls.supports(dict(COMBO, device="cpu"))
    assert "world_size >= 2" in cls.supports(dict(COMBO, world_size=1))
    assert "intranode" in cls.supports(dict(COMBO, world_size=16))
    assert "top-k" in cls.supports(dict(COMBO, topk=40))
    assert "multiple of 128" in cls.supports(dict(COMBO, quant="fp8_block", hidden=7168 + 64))
    assert "bytes" in cls.supports(dict(COMBO, hidden=8192))  # 16 KiB bf16 rows exceed the TMA stage
    assert cls.supports(dict(COMBO, hidden=8192, quant="fp8_block")) is None  # fp8 rows are half
    assert "even" in cls.supports(dict(COMBO, num_sms=23))
