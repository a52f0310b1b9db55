"""GPU suite for the harness: NCCL sweeps, timing validated against independent
timers, and trace-vs-ablation overlap agreement. Run with
`python -m pytest -m gpu tests/gpu` on a machine with 2 GPUs."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
needs_2gpu = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def _execute(overrides, out, sweep="default"):
    from moebench.results.store import RunStore
    from moebench.run.sweep import execute

    run_dir, _ = execute(overrides, sweep, str(out), quiet=False)
    return RunStore(run_dir).load()


@needs_2gpu
def test_ep_backends_over_nccl_are_ok(tmp_path):
    df = _execute(
        [
            "backend=naive,allgather_rs,naive_batched",
            "experts=torch,torch_batched",
            "reduction=experts,finalize",
            "overlap=none,dispatch,combine",
            "quant=bf16,fp8_block",
            "model=tiny,deepseek_v2_lite",
            "workload.tokens_per_rank=[128]",
            "runner.device=cuda",
            "runner.reps=10",
            "runner.warmup=3",
            "runner.warmup_ms=0",
        ],
        tmp_path / "nccl",
    )
    ran = df[df.status != "skipped"]
    assert len(ran) == 2 * 2 * (6 + 6 + 3), ran[["label", "status"]]
    assert set(ran.status) == {"ok"}, ran[ran.status != "ok"][["label", "status", "reason"]].to_string()
    assert (ran.device == "cuda").all() and (ran.world_size == 2).all()
    assert ran.workspace_bytes_peak.gt(0).all() and ran.device_bytes_peak.gt(0).all()
    print(ran.groupby("backend").latency_us_median.describe().to_string())


@needs_gpu
def test_memory_budget_caps_the_allocator_and_rows_carry_its_reserved_peak(tmp_path):
    """runner.memory_budget=1GiB on qwen3_30b_a3b's triton experts: 256 tokens per rank fit (their
    allocator reserved peak under the cap), 65536 do not (an oom row with torch's whole account
    of allowed / allocated / reserved memory); rows carry the reserved peak of the timed work,
    at least the forward's allocations."""
    common = [
        "backend=local",
        "experts=triton",
        "reduction=experts,finalize",
        "overlap=none",
        "quant=bf16",
        "model=qwen3_30b_a3b",
        "runner.device=cuda",
        "runner.reps=3",
        "runner.warmup=1",
        "runner.warmup_ms=0",
        "runner.phase_reps=1",
    ]
    df = _execute(common + ["workload.tokens_per_rank=[256,65536]", "runner.memory_budget=1GiB"], tmp_path / "cap")
    by = df.set_index(["reduction", "tokens_per_rank"])
    for red in ("experts", "finalize"):
        small, big = by.loc[(red, 256)], by.loc[(red, 65536)]
        assert small.status == "ok", small.reason
        assert 0.95 * small.workspace_bytes_peak <= small.reserved_bytes_peak <= 2**30
        assert small.memory_cap_bytes > 2**30
        assert big.status == "oom" and "runner.memory_budget=1073741824" in big.reason, big.reason
        assert "reserved by PyTorch" in big.reason, big.reason
    free = _execute(common + ["workload.tokens_per_rank=[4096]"], tmp_path / "free")
    assert set(free.status) == {"ok"}
    assert (free.reserved_bytes_peak >= 0.95 * free.workspace_bytes_peak).all(), free[
        ["reduction", "workspace_bytes_peak", "reserved_bytes_peak"]
    ]
    print(free[["reduction", "workspace_bytes_peak", "reserved_bytes_peak"]].to_string())


def _rel(a, b):
    return abs(a / b - 1.0)


@needs_gpu
def test_timing_matches_do_bench_for_a_triton_gemm_and_a_moe_layer():
    from triton.testing import do_bench

    from moebench.config import compose
    from moebench.measure import timing
    from moebench.measure.layer import build_layer
    from moebench.measure.workload import make_inputs

    bench_dir = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    from hold_bias import gemm as make_gemm  # the same GEMM benchmarks/hold_bias.py times

    gemm, a, b, c = make_gemm(4096)
    dev = torch.device("cuda", 0)
    gemm()
    torch.testing.assert_close(c, (a.float() @ b.float()).bfloat16(), rtol=2e-2, atol=1)

    cfg = compose.compose_config(
        [
            "backend=local",
            "backend.simulate_ep=8",
            "experts=torch",
            "model=deepseek_v3",
            "reduction=experts",
            "quant=bf16",
            "overlap=none",
        ]
    )
    layer = build_layer(compose.to_combo(cfg), 0, 1, None, dev)
    ctx, kernel = layer.ctx, layer.kernel
    # 4096 tokens: do_bench calls back to back with no hold, so it times the host wherever the
    # layer's enqueue is longer than its GPU work (this layer: ~2.1 ms of host at 256 tokens
    # against 1.27 ms of GPU, do_bench then read 1280-1575 µs); at 4096 the GPU's 2.9 ms
    # exceed the host's ~2.3 ms, and the independent figure is the GPU's too
    x, w, ids = make_inputs(ctx.shape, 4096, "uniform", 1.0, 0, 0, 2, dev)
    layer = lambda: kernel(x, w, ids)

    flush = timing.L2Flusher(dev)
    for name, fn in (("triton gemm", gemm), ("moe layer", layer)):
        # The lent H200's clock moves on a ~100 ms scale under sustained load (this GEMM
        # read 205-253 µs within one test, in moebench and do_bench alike; its SM clock read
        # 1515-1965 MHz at its power cap). So each of our sets is paired with a do_bench run over
        # about the same window, right before or after it (the order alternates, so a clock
        # moving one way favours neither), and the pairs are short (15 samples, ~3 ms of GEMM
        # a side; do_bench's window takes ~11-12 of its own, its estimate counting its L2
        # clear) so both sides of a pair see one clock. 48 pairs: their ratios' median must
        # be within 3% of 1 (a bias of moebench's own, such as session 8's 3-5% of the spin
        # hold, moves every pair), and each third's (16 pairs) within 5%. The design before, 18
        # pairs of 60 samples (~13 ms a side) in three runs of six, failed 7 of 11 runs in sessions
        # 9-10 on that clock, runs' ratios 0.941-1.026 (docs/findings/timing.md, session 10).
        # The hold is measured once, here, and passed as hold_us as the sweep's runner passes it:
        # host_enqueue_us idles the GPU behind a 20 ms spin, and measured per set it would start
        # every ~5 ms moebench set on a clock back at its idle boost, a bias in every pair.
        hold_us = timing.host_enqueue_us(fn, dev)
        do_bench(fn, warmup=10, rep=2000)  # 2 s of load first: past the clock's first drop
        pairs = []
        window_ms = 2.0  # each pair's window is set by the even pair before it, before an odd one reads it
        for i in range(48):
            if i % 2:
                ref = do_bench(fn, warmup=2, rep=window_ms, return_mode="median") * 1e3  # ms -> µs
            ours = timing.time_samples(fn, dev, reps=15, warmup=3, flush=flush, warmup_ms=5, hold_us=hold_us)
            window_ms = max(2.0, 15 * ours.median * 1e-3)
            if not i % 2:
                ref = do_bench(fn, warmup=2, rep=window_ms, return_mode="median") * 1e3
            pairs.append((ours, ref))
        ratios = [o.median / r for o, r in pairs]
        runs = [statistics.median(ratios[i : i + 16]) for i in (0, 16, 32)]
        pooled = statistics.median(ratios)
        print(
            f"{name}: moebench "
            + " / ".join(f"{o.median:.1f}" for o, _ in pairs)
            + " µs, do_bench "
            + " / ".join(f"{r:.1f}" for _, r in pairs)
            + " µs, run ratios "
            + " ".join(f"{x:.3f}" for x in runs)
            + f", pooled {pooled:.3f}, p80/p20 "
            + " ".join(f"{o.p80 / o.p20:.3f}" for o, _ in pairs)
        )
        for run_ratio in runs:  # (not `x`: the layer's lambda reads the input x)
            assert abs(run_ratio - 1) <= 0.05, (name, runs)
        assert abs(pooled - 1) <= 0.03, (name, pooled, ratios)
        # The sets' spread (p80/p20, printed above) is the machine's, not moebench's: a set read
        # 1.075 on a quiet clock once (its first sample 1753 µs against a 1360 µs median). It is
        # no assertion here: benchmarks/timing_modes.py prints it beside independent timers.


@needs_2gpu
def test_trace_overlap_is_measured_from_real_kernels(tmp_path):
    """Traces exist and give an overlap in [0, 1] beside the ablation figure; with
    overlap=none nothing overlaps; with overlap=combine the two figures agree within 10
    percentage points (issue #4; the sweep behind it, with the SM carveout and torch
    experts beside, is sweeps/trace_vs_ablation.yaml, docs/findings/trace-vs-ablation.md)."""
    df = _execute(
        [
            "backend=allgather_rs",
            "experts=triton",
            "reduction=experts",
            "overlap=none,combine",
            "quant=bf16",
            "model=deepseek_v3",
            "workload.tokens_per_rank=[4096]",
            "runner.device=cuda",
            "trace=torch",
            "trace.samples=10",
            "runner.reps=40",
        ],
        tmp_path / "ovl",
    )
    ok = df[df.status == "ok"].set_index("overlap")
    assert set(ok.index) == {"none", "combine"}
    for ovl, r in ok.iterrows():
        print(
            f"{ovl}: overlap_fraction {r.overlap_fraction:.3f} (shared {r.shared_us:.0f} µs, exposed "
            f"{r.shared_exposed_us:.0f} µs), trace_overlap_fraction {r.trace_overlap_fraction:.3f} "
            f"({r.trace_overlap_method}; plain intersection {r.trace_intersection_fraction:.3f})"
        )
        assert os.path.exists(os.path.join(tmp_path / "ovl", r.trace_path))
    assert ok.loc["none", "trace_overlap_fraction"] == 0.0
    # with overlap=none the shared experts run after the combine: the ablation must find
    # (nearly) nothing hidden; it read 0.23 (and 0.84-0.88 at 128 tokens) while each
    # sample of the short shared-experts callable still held its host launch latency
    assert ok.loc["none", "overlap_fraction"] <= 0.15, ok.loc["none", ["shared_us", "shared_exposed_us"]].to_dict()
    # the shared experts' kernels ran beside the reduce-scatter for 0.54-0.79 of their time
    # on H200 (docs/findings/overlap.md): some concurrency must show
    assert ok.loc["combine", "trace_intersection_fraction"] > 0.1
    assert 0.0 <= ok.loc["combine", "trace_overlap_fraction"] <= 1.0
    # issue #4's criterion: 0.5-7.5 points apart in 5 sweeps at 40-80 reps (docs/findings/trace-vs-ablation.md)
    combine = ok.loc["combine"]
    assert abs(combine.trace_overlap_fraction - combine.overlap_fraction) <= 0.10, (
        combine.overlap_fraction,
        combine.overlap_fraction_lo,
        combine.overlap_fraction_hi,
        combine.trace_overlap_fraction,
    )
    # the traces hold the ablation samples, and rank 0 read both ranks' traces: the figure of
    # the rank its peer waited for, on collectives trimmed of that wait
    assert ok.loc["combine", "trace_overlap_method"] == "stretch_matched"
    waits = ok.loc["combine", "trace_wait_us_per_rank"]
    assert min(waits) == waits[int(ok.loc["combine", "trace_critical_rank"])]


@needs_2gpu
def test_profiler_mode_reports_kernel_durations_per_phase(tmp_path):
    """runner.timing=profiler: phase figures are the kernels' busy time from the torch
    profiler (no host gaps), with the communication kernels' durations per rank."""
    import json

    df = _execute(
        [
            "backend=allgather_rs",
            "experts=triton",
            "reduction=experts",
            "overlap=none",
            "quant=bf16",
            "model=deepseek_v2_lite",
            "workload.tokens_per_rank=[256]",
            "runner.device=cuda",
            "runner.timing=profiler",
            "runner.reps=10",
        ],
        tmp_path / "prof",
    )
    ok = df[df.status == "ok"]
    assert len(ok) == 1, df[["label", "status", "reason"]].to_string()
    r = ok.iloc[0]
    print(
        f"profiler: layer {r.latency_us_median:.1f} µs, dispatch {r.dispatch_us:.1f}, experts {r.experts_us:.1f}, "
        f"combine {r.combine_us:.1f}, kernels {list(r.kernel_us)}"
    )
    assert r.timing_mode == "profiler"
    for phase in ("dispatch", "experts", "combine"):
        assert 0 < r[f"{phase}_us"] < r.latency_us_median, phase  # busy time of a part of the layer
    kernels = [json.loads(k) for k in r.kernel_us]
    assert len(kernels) == 2 and all(any("nccl" in name.lower() for name in k) for k in kernels), kernels
    assert list((tmp_path / "prof").rglob("traces/profiler/*")), "the profiler's trace per rank is kept"


@needs_gpu
def test_shared_sm_carveout_limits_the_shared_experts_gemms():
    """overlap.shared_sm_carveout: same output, torch's global state restored, and the
    GEMMs leave SMs free: with 16 of the SMs left, the deepseek_v3 shared expert at 4096
    tokens (~0.5 ms on all 132 SMs) must take clearly longer. If cuBLASLt treated the
    SM-count target as a mere hint, this fails and the knob measures nothing."""
    from triton.testing import do_bench

    from moebench.kernels.modular import SharedExperts

    dev = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    K, S, T = 7168, 2048, 4096
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = (torch.randn(2 * S, K, device=dev, generator=g) * K**-0.5).bfloat16()
    w2 = (torch.randn(K, S, device=dev, generator=g) * S**-0.5).bfloat16()
    x = torch.randn(T, K, device=dev, generator=g).bfloat16()
    full, carved = SharedExperts(w13, w2), SharedExperts(w13, w2, sm_carveout=sms - 16)
    before = (torch._C._get_sm_carveout_experimental(), torch.backends.cuda.preferred_blas_library())
    ref = full(x)
    out = carved(x)
    assert (torch._C._get_sm_carveout_experimental(), torch.backends.cuda.preferred_blas_library()) == before
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    t_full = do_bench(lambda: full(x), warmup=50, rep=300, return_mode="median")
    t_carved = do_bench(lambda: carved(x), warmup=50, rep=300, return_mode="median")
    t_half = do_bench(lambda: SharedExperts(w13, w2, sm_carveout=sms // 2)(x), warmup=50, rep=300, return_mode="median")
    print(
        f"shared expert T={T}: all {sms} SMs {t_full * 1e3:.1f} µs, {sms - sms // 2} SMs {t_half * 1e3:.1f} µs, "
        f"16 SMs {t_carved * 1e3:.1f} µs"
    )
    assert t_carved > 2.0 * t_full, (t_full, t_carved)
