"""The fault-injection suite's one-GPU variant: a real CUDA out-of-memory and a kernel that
never returns each give their row (`oom`, `timeout`), the next combination runs clean, no
rank is left, and the GPU's memory is back to its baseline after each faulty combination."""
from __future__ import annotations

import pytest
import torch

from moebench.store import RunStore
from moebench.sweep import execute

pytestmark = pytest.mark.gpu
QUICK = ["runner.reps=3", "runner.warmup=1", "runner.phase_reps=1", "runner.warmup_ms=0"]


def _used_bytes() -> int:
    free, total = torch.cuda.mem_get_info(0)
    return total - free


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fault, status, words", [
    ("oom", "oom", "OutOfMemoryError"),
    ("gpu_hang", "timeout", "no result within"),
])
def test_gpu_fault_gives_its_row_and_frees_the_gpu(tmp_path, fault, status, words):
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # this process's own context, in the baseline
    baseline = _used_bytes()
    run, counts = execute(["backend=local", "experts=fault", "model=deepseek_v2_lite", "quant=bf16",
                           "reduction=experts", "overlap=none", "runner.device=cuda",
                           "workload.tokens_per_rank=[64]", f"experts.fault={fault},none",
                           "runner.timeout_s=30", *QUICK], None, str(tmp_path / fault), quiet=True)
    df = RunStore(run).load().set_index("fault")
    assert df.loc[fault, "status"] == status and words in df.loc[fault, "reason"], df.loc[fault, "reason"]
    assert df.loc["none", "status"] == "ok"  # the next combination, in a clean process group
    after = _used_bytes()
    print(f"{fault}: GPU memory in use {baseline / 2**20:.0f} MiB before, {after / 2**20:.0f} MiB after")
    assert after - baseline < 64 * 2**20
