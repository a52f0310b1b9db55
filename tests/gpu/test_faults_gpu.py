"""The fault-injection suite's one-GPU variant: a real CUDA out-of-memory and a kernel that
never returns each give their row (`oom`, `timeout`), the next combination runs clean, no
rank is left, and the GPU's memory is back to its baseline after each faulty combination."""

from __future__ import annotations

import pytest
import torch

from moebench.results.store import RunStore
from moebench.run.sweep import execute

pytestmark = pytest.mark.gpu
QUICK = ["runner.reps=3", "runner.warmup=1", "runner.phase_reps=1", "runner.warmup_ms=0"]


def _used_bytes() -> int:
    free, total = torch.cuda.mem_get_info(0)
    return total - free


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "fault, status, words",
    [
        ("oom", "oom", "OutOfMemoryError"),
        ("gpu_hang", "timeout", "no result within"),
    ],
)
def test_gpu_fault_gives_its_row_and_frees_the_gpu(tmp_path, fault, status, words):
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # this process's own context, in the baseline
    baseline = _used_bytes()
    run, counts = execute(
        [
            "backend=local",
            "experts=fault",
            "model=deepseek_v2_lite",
            "quant=bf16",
            "reduction=experts",
            "overlap=none",
            "runner.device=cuda",
            "workload.tokens_per_rank=[64]",
            f"experts.fault={fault},none",
            "runner.timeout_s=30",
            *QUICK,
        ],
        None,
        str(tmp_path / fault),
        quiet=True,
    )
    df = RunStore(run).load().set_index("fault")
    assert df.loc[fault, "status"] == status and words in df.loc[fault, "reason"], df.loc[fault, "reason"]
    assert df.loc["none", "status"] == "ok"  # the next combination, in a clean process group
    after = _used_bytes()
    print(f"{fault}: GPU memory in use {baseline / 2**20:.0f} MiB before, {after / 2**20:.0f} MiB after")
    assert after - baseline < 64 * 2**20


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_a_hang_inside_an_nccl_collective_times_out_and_frees_both_gpus(tmp_path):
    """Rank 0 waits in a barrier its peer never reaches (the peer sleeps): the row is a
    timeout, the next combination runs in a clean group, each GPU's memory is back."""
    torch.zeros(1, device="cuda:0"), torch.zeros(1, device="cuda:1")
    base = [torch.cuda.mem_get_info(d) for d in (0, 1)]
    run, _ = execute(
        [
            "backend=naive",
            "experts=fault",
            "model=deepseek_v2_lite",
            "quant=bf16",
            "reduction=experts",
            "overlap=none",
            "runner.device=cuda",
            "runner.world_size=2",
            "workload.tokens_per_rank=[64]",
            "experts.fault=hang_collective,none",
            "experts.fault_rank=0",
            "runner.timeout_s=30",
            *QUICK,
        ],
        None,
        str(tmp_path / "nccl_hang"),
        quiet=True,
    )
    df = RunStore(run).load().set_index("fault")
    assert df.loc["hang_collective", "status"] == "timeout" and df.loc["none", "status"] == "ok"
    for d, (free0, _) in zip((0, 1), base, strict=True):
        free, _ = torch.cuda.mem_get_info(d)
        assert free0 - free < 64 * 2**20, (d, free0, free)
