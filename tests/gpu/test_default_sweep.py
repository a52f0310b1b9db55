"""The README's main command on the lent GPU machine: `moebench sweep` on the embedded
default sweep runs a real model (DeepSeek-V3's EP-8 share at 128 and 4096 tokens per rank)
and ends with ok rows for every combination this machine can run, each checked against the
reference; the EP combinations a machine with fewer GPUs cannot run are skipped rows that
say how many GPUs they need."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from moebench.kernels.reference import TOLERANCE
from moebench.results.store import RunStore

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_default_sweep_on_this_machine(tmp_path):
    # MOEBENCH_DEFAULT_SWEEP_OUT: a run folder the same command wrote before (a GPU call that
    # keeps its rows); the sweep then resumes there and must still end with these rows
    out = Path(os.environ.get("MOEBENCH_DEFAULT_SWEEP_OUT") or tmp_path / "default")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "moebench.cli", "sweep", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ),
    )
    wall = time.monotonic() - t0
    print(proc.stderr[-3000:])
    print(f"default sweep: {wall:.0f} s on {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = RunStore(out).load()
    ok = df[df.status == "ok"]
    assert set(df.status) == {"ok", "skipped"}, df[df.status != "ok"][["label", "status", "reason"]]
    assert set(ok.model) == {"deepseek_v3"} and set(ok.tokens_per_rank) == {128, 4096}
    assert (ok.simulate_ep == 8).all() and (ok.world_size == 1).all()
    for q, tol in TOLERANCE.items():
        assert (ok[ok.quant == q].rel_err <= tol).all()
    assert {"local", "local_batched"} <= set(ok.backend)
    assert {"torch", "triton", "torch_batched", "triton_batched"} <= set(ok.experts)
    if torch.cuda.device_count() < 2:
        ep = df[df.backend.isin(["naive", "allgather_rs"])]
        assert len(ep) and (ep.status == "skipped").all()
        # the pairings that could run say how many GPUs they need (the rest break a rule first, or
        # lack an optional library: deep_gemm's absence is said before the GPU count)
        runnable = ep[
            ~ep.reason.str.contains("layouts differ|need quant=fp8_block|only reduction=finalize|not installed")
        ]
        assert (
            len(runnable)
            and runnable.reason.str.contains("ranks (one per GPU): this machine has 1 GPU", regex=False).all()
        )
    # the default timing at decode sizes: graph replays where the layer can be captured
    small = ok[ok.tokens_per_rank == 128]
    assert (
        small[small.experts.isin(["triton", "triton_batched"]) & small.backend.eq("local")].timing_mode == "graph"
    ).all()
