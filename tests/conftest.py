"""Shared test setup.

- Without CUDA, Triton kernels run through the interpreter (TRITON_INTERPRET=1),
  set before anything imports them.
- `--require deep_ep,deep_gemm` (or MOEBENCH_REQUIRE) makes a GPU run fail when a
  library it must exercise is missing, instead of skipping its tests quietly.
"""
from __future__ import annotations

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
# the fault-injection experts (tests/fault_experts.py): registered here and in every rank
_tests_dir = os.path.dirname(os.path.abspath(__file__))
os.environ["MOEBENCH_PLUGIN_MODULES"] = "fault_experts"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_tests_dir, os.environ.get("PYTHONPATH", "")) if p)

# @triton.jit reads TRITON_INTERPRET when a kernel module is imported: import them all now,
# so that a harness-only test that sets TRITON_INTERPRET=0 (test_sweep_cpu.py) and happens
# to import them first cannot leave them unrunnable for the tests after it in this process
from moebench.kernels import registry as _registry  # noqa: E402

_registry.discover()


def pytest_addoption(parser):
    parser.addoption(
        "--require", default=os.environ.get("MOEBENCH_REQUIRE", ""),
        help="comma-separated libraries that must be present (e.g. deep_ep,deep_gemm); "
        "their tests fail instead of skipping when they are missing",
    )


def _required(config) -> list[str]:
    return [x.strip() for x in (config.getoption("--require") or "").split(",") if x.strip()]


def pytest_configure(config):
    missing = []
    for lib in _required(config):
        try:
            importlib.import_module(lib)
        except Exception as e:  # noqa: BLE001
            missing.append(f"{lib} ({type(e).__name__}: {e})")
    if missing:
        raise pytest.UsageError("required libraries are missing: " + "; ".join(missing))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    req = _required(item.config)
    if req and rep.skipped and call.excinfo is not None:
        reason = str(call.excinfo.value)
        hit = [lib for lib in req if lib in reason]
        if hit:  # a required library's test must not pass by skipping
            rep.outcome = "failed"
            rep.longrepr = f"skipped although --require {','.join(hit)}: {reason}"


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEBENCH_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"
