"""tests/conftest.py's interpreter setup: on a machine without CUDA the Triton kernels run through
TRITON_INTERPRET=1, which @triton.jit reads when a module defining kernels is imported, Triton's own
triton.language included. A harness test that sets TRITON_INTERPRET=0 and imports triton first (a
sweep in the test's process: run/env.py's fingerprint reads triton's version) must not leave the
kernels of a later test in that process unrunnable, whichever tests a pytest-xdist worker got."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

# a fresh process as a worker starts one: the conftest, then a harness test's import of triton
# under TRITON_INTERPRET=0, then an interpreted kernel (tl.zeros, a @jit of triton.language's)
_AFTER_A_HARNESS_TEST = f"""
import os, sys
sys.path.insert(0, {str(ROOT / "tests")!r})
import conftest
assert os.environ["TRITON_INTERPRET"] == "1"
os.environ["TRITON_INTERPRET"] = "0"  # a harness test's monkeypatch.setenv
import triton  # what run/env.py's fingerprint does in the test's process
os.environ["TRITON_INTERPRET"] = "1"  # restored after it
import torch
from moebench.kernels.triton.align import moe_align_block_size
ids = torch.tensor([[0, 1], [1, 2], [2, 0]], dtype=torch.int32)
sorted_ids, expert_ids, num = moe_align_block_size(ids, 3, 16)
print(int(num.item()))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is set up where no GPU is visible")
def test_a_harness_test_that_imports_triton_without_the_interpreter_leaves_the_kernels_runnable():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run(
        [sys.executable, "-c", _AFTER_A_HARNESS_TEST], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[-1] == "48"  # 3 experts' 2 pairs each, padded to 16 rows
