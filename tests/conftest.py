"""Shared test setup.

- Without CUDA, Triton kernels run through the interpreter (TRITON_INTERPRET=1),
  set before anything imports them; triton.language and moebench's kernel modules are imported
  under it here, before a test that sets TRITON_INTERPRET=0 can import them first.
- `--require deep_ep,deep_gemm` (or MOEBENCH_REQUIRE): the run promises those libraries, so a
  test marked `needs(...)` with only promised libraries fails instead of skipping, whatever the
  reason (no GPU, too few GPUs, wrong architecture, a missing library); a test that also needs
  a library not promised may skip (the one-GPU suite's `--require deep_gemm` lets the 2-GPU
  deep_ep + deep_gemm tests skip). A skip naming a required library fails too, and each
  required library must have had a test run. The rule and its hooks: tests/support/_require.py.
- A progress line per test file as its last test finishes (tests/support/_progress.py).
- Two pytest-xdist workers, a file on each, for the CPU tiers; one process for GPU tests, the
  slow tier, `--require` and a single file (tests/support/_parallel.py).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# one torch thread, here and in every rank a test starts (moebench/run/worker.py): on a 2-core
# machine beside other work, two threads of one process wait on each other at every small op;
# the fp8 correctness tests took 24-43 s with 2 threads and 4.2-4.4 s with 1 (load 6-7),
# a 1-rank sweep of 6 combinations 41-93 s against 28 s (docs/findings/harness.md, "Tests")
os.environ.setdefault("MOEBENCH_CPU_THREADS", "1")
torch.set_num_threads(int(os.environ["MOEBENCH_CPU_THREADS"]))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
# the helpers in support/ are imported by bare name (tests/__init__.py), here as in the ranks; only
# that folder goes on the path: this one's room folders (kernels/, config/, ...) would shadow
# installed packages of those names (Hugging Face's `kernels`, which transformers imports)
_support_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support")
if _support_dir not in sys.path:
    sys.path.insert(0, _support_dir)
# the fault-injection experts (tests/support/fault_experts.py): registered here and in every rank
os.environ["MOEBENCH_PLUGIN_MODULES"] = "fault_experts"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_support_dir, os.environ.get("PYTHONPATH", "")) if p)

# @triton.jit reads TRITON_INTERPRET when a module defining kernels is imported, Triton's own
# triton.language too (tl.zeros, tl.cdiv, ... are @jit functions): import them all now, so that a
# harness-only test that sets TRITON_INTERPRET=0 (test_sweep_cpu.py, test_store.py) and happens to
# import them first cannot leave them unrunnable for the tests after it in this process. The
# registry imports cards only; a sweep run in the test's process imports triton for its version
# (run/env.py's fingerprint), which left tl.zeros a JITFunction and the interpreted kernels of a
# later test failing ("Cannot call @triton.jit'd outside of the scope of a kernel")
if os.environ.get("TRITON_INTERPRET") == "1":
    import importlib
    import pkgutil

    import triton.language  # noqa: F401 (imported for its @jit functions' mode, under the interpreter)

    import moebench.kernels.triton as _triton_kernels

    for _m in pkgutil.iter_modules(_triton_kernels.__path__, "moebench.kernels.triton."):
        importlib.import_module(_m.name)
from moebench.kernels import registry as _registry  # noqa: E402 (after TRITON_INTERPRET and the plugin environment are set)

_registry.discover()

# a line per test file as it finishes (tests/support/_progress.py): -q's dots are no progress for minutes;
# what pyproject's `--numprocesses=auto` means: 2 pytest-xdist workers, or none (tests/support/_parallel.py)
pytest_plugins = ["_progress", "_parallel"]

# the --require gate's hooks (tests/support/_require.py), found here by name
from _require import (  # noqa: E402, F401 (pytest takes the hooks from here by name; after sys.path takes tests/support)
    pytest_addoption,
    pytest_configure,
    pytest_make_collect_report,
    pytest_runtest_makereport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

# the tiers: gpu and slow tests run only where -m names them (tests/support/_tiers.py)
from _tiers import pytest_collection_modifyitems  # noqa: E402, F401 (pytest takes the hook from here by name; after sys.path takes tests/support)


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEBENCH_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"
