"""The clock of each sample and the GPU's state on a real GPU (issue #50): the in-stream probe
(measure/clock.py) reads a plausible SM clock around every sample of a Triton GEMM, within what
NVML says the device can run at; and a row a sweep writes on the GPU carries its clock band,
its per-sample clocks and NVML's columns (measure/nvml.py), none of them empty.

Run: pytest -m gpu tests/gpu/test_clock_gpu.py -s   (prints the clocks it read)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from moebench.measure import gpu_state, timing

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[2]
PLAUSIBLE_MHZ = (200.0, 3000.0)


def _nvml_max_sm_mhz(device: torch.device) -> float:
    """NVML's max SM clock of the device (NaN without NVML)."""
    mod, h, _ = gpu_state.nvml_for(device)
    if mod is None:
        return float("nan")
    return float(mod.nvmlDeviceGetMaxClockInfo(h, 1))  # NVML_CLOCK_SM


def test_the_probe_reads_each_samples_clock_in_a_plausible_band():
    dev = torch.device("cuda", torch.cuda.current_device())
    probe, why = gpu_state.probe_for(dev)
    assert probe is not None, why
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    flush = timing.L2Flusher(dev)
    s = timing.time_samples(lambda: a @ b, dev, reps=30, warmup=3, flush=flush, warmup_ms=100.0, probe=probe)
    mhz = np.array(s.clock_mhz)
    print(
        f"probe: host {probe.host_us:.1f} µs a stamp; clocks {np.nanmin(mhz):.0f}–{np.nanmedian(mhz):.0f}–"
        f"{np.nanmax(mhz):.0f} MHz over {len(mhz)} samples of {s.median:.1f} µs; NVML max {_nvml_max_sm_mhz(dev):.0f}"
    )
    assert len(mhz) == 30 and np.isfinite(mhz).all()
    assert ((mhz >= PLAUSIBLE_MHZ[0]) & (mhz <= PLAUSIBLE_MHZ[1])).all(), mhz
    top = _nvml_max_sm_mhz(dev)
    if np.isfinite(top):
        assert (mhz <= 1.05 * top).all(), (mhz, top)  # globaltimer's granularity: a few % on short samples
    # the spans are in order on the host's clock and each about as long as its sample
    spans = np.array(s.spans_ns, dtype=float)
    assert (spans[:, 1] > spans[:, 0]).all() and (np.diff(spans[:, 0]) > 0).all()
    assert np.median((spans[:, 1] - spans[:, 0]) / 1e3 / np.array(s.us)) == pytest.approx(1.0, abs=0.5)


def test_a_gpu_row_carries_its_clock_and_nvml_columns(tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "moebench.cli",
        "sweep",
        "--out",
        str(out),
        "backend=local",
        "experts=triton",
        "model=qwen3_30b_a3b",
        "quant=bf16",
        "workload.tokens_per_rank=[256]",
        "runner.reps=20",
        "runner.nvml_poll_ms=20",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from moebench.results.store import RunStore

    df = RunStore(out).load()
    ok = df[df.status == "ok"]
    assert len(ok), df[["label", "status", "reason"]]
    r = ok.iloc[0]
    print(
        {k: r[k] for k in ("sm_clock_mhz_min", "sm_clock_mhz_median", "sm_clock_mhz_max", "throttled_samples")}
        | {k: r[k] for k in ("gpu_power_w_median", "gpu_power_limit_w", "gpu_temp_c_max", "mem_clock_mhz_median")}
        | {"nvml_polls": r["nvml_polls"], "clock_reasons": r["clock_reasons"], "clock_note": r["clock_note"]}
    )
    assert (
        PLAUSIBLE_MHZ[0]
        <= r["sm_clock_mhz_min"]
        <= r["sm_clock_mhz_median"]
        <= r["sm_clock_mhz_max"]
        <= PLAUSIBLE_MHZ[1]
    )
    assert len(r["sm_clock_mhz_samples"]) == len(r["samples_us"])
    assert np.isfinite(r["throttled_samples"]) and 0 <= r["throttled_samples"] <= len(r["samples_us"])
    for col in ("gpu_power_w_median", "gpu_power_limit_w", "gpu_temp_c_max", "mem_clock_mhz_median", "nvml_polls"):
        assert np.isfinite(r[col]) and r[col] > 0, (col, r[col], r["clock_note"])
    assert r["clock_note"] == ""
