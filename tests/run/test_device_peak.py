"""device_bytes_peak (measure/samples.py memory_figures: setup_used - baseline_used + peak) reads
the driver's view after the layer is built, which counts the caching allocator's free blocks
too. Building the expert weights frees its temporaries into that cache (drawing and quantizing
them: ~4 GiB for deepseek_v2_lite fp8_block), and only a combination that built its weights
holds them, not the next of its family that reuses the kept ones (issue #33): on one H200
(results/tune_decisions/after_h200) the first combination read ~4 GiB more than the same
layer's other rows. The worker releases them before it reads the setup figure."""

from __future__ import annotations

import torch

from moebench.measure import memory, workload
from moebench.run import plan, worker
from moebench.run.messages import Task

GiB = 1 << 30
PEAK = 12345  # the allocator peak of one forward (bytes)


def test_the_setup_figure_leaves_out_the_blocks_the_weights_build_freed(monkeypatch, tmp_path):
    """A CPU stand-in for the driver's view: in use = held + the allocator's free cached blocks;
    building a set of weights leaves 4 GiB of them, the worker's release empties them."""
    monkeypatch.setattr(workload, "_weights", {})
    monkeypatch.setattr(workload, "_routed", workload._Kept(4 << 30))
    monkeypatch.setattr(workload, "_references", workload._Kept(4 << 30))
    cached = {"bytes": 0}
    builds = []
    real_build, real_release = workload.build_expert_weights, worker._release_cached

    def build(*a):
        builds.append(a)
        cached["bytes"] += 4 * GiB  # the build's temporaries, freed into the cache
        return real_build(*a)

    def release(device):
        real_release(device)
        cached["bytes"] = 0  # torch.cuda.empty_cache()

    monkeypatch.setattr(workload, "build_expert_weights", build)
    monkeypatch.setattr(worker, "_release_cached", release)
    monkeypatch.setattr(memory, "device_used_bytes", lambda device: GiB + cached["bytes"])
    monkeypatch.setattr(memory, "forward_peak_bytes", lambda fn, device, before_fn: PEAK)
    base = [
        "backend=local",
        "model=tiny",
        "overlap=none",
        "experts=torch",
        "runner.device=cpu",
        "runner.reps=2",
        "runner.warmup=1",
        "runner.phase_reps=1",
        "workload.tokens_per_rank=[4]",
    ]
    peaks, built = [], []
    for reduction in ("experts", "finalize"):  # the first builds the weights, the second reuses them
        (c,), _ = plan.plan([*base, f"reduction={reduction}"])
        rows = [
            r
            for _, r in worker.run_combination(
                Task(0, c.combo, (4,)), 0, 1, None, torch.device("cpu"), str(tmp_path), baseline_used=GiB
            )
            if r is not None
        ]
        assert [r.status for r in rows] == ["ok"]
        peaks.append(rows[0].device_bytes_peak)
        built.append(len(builds))
    assert built == [1, 1]  # the second combination reused the kept weights: the case the fix is for
    # nothing held above the baseline on the stand-in: the figure is the forward's peak, built or reused
    assert peaks == [float(PEAK), float(PEAK)]
