"""GPU suite for the harness: NCCL sweeps, timing validated against independent
timers, and trace-vs-ablation overlap agreement. Run with
`python -m pytest -m gpu tests/gpu` on a machine with 2 GPUs."""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.gpu

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
needs_2gpu = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def _execute(overrides, out, sweep="default"):
    from moebench.store import RunStore
    from moebench.sweep import execute

    run_dir, _ = execute(overrides, sweep, str(out), quiet=False)
    return RunStore(run_dir).load()


@needs_2gpu
def test_ep_backends_over_nccl_are_ok(tmp_path):
    df = _execute(["backend=naive,allgather_rs,naive_batched", "experts=torch,torch_batched",
                   "reduction=experts,finalize", "overlap=none,dispatch,combine", "quant=bf16,fp8_block",
                   "model=tiny,deepseek_v2_lite", "workload.tokens_per_rank=[128]", "runner.device=cuda",
                   "runner.reps=10", "runner.warmup=3"], tmp_path / "nccl")
    ran = df[df.status != "skipped"]
    assert len(ran) == 2 * 2 * (6 + 6 + 3), ran[["label", "status"]]
    assert set(ran.status) == {"ok"}, ran[ran.status != "ok"][["label", "status", "reason"]].to_string()
    assert (ran.device == "cuda").all() and (ran.world_size == 2).all()
    assert ran.workspace_bytes_peak.gt(0).all() and ran.device_bytes_peak.gt(0).all()
    print(ran.groupby("backend").latency_us_median.describe().to_string())


def _rel(a, b):
    return abs(a / b - 1.0)


@needs_gpu
def test_timing_matches_do_bench_for_a_triton_gemm_and_a_moe_layer():
    import triton
    import triton.language as tl
    from triton.testing import do_bench

    from moebench import plan, timing
    from moebench.worker import build_layer
    from moebench.workload import make_inputs

    @triton.jit
    def matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
            y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))

    dev = torch.device("cuda", 0)
    n = 4096
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    gemm = lambda: matmul[(n // 128, n // 128)](a, b, c, n, n, n, 128, 128, 64, num_warps=8, num_stages=3)  # noqa: E731
    gemm()
    torch.testing.assert_close(c, (a.float() @ b.float()).bfloat16(), rtol=2e-2, atol=1)

    cfg = plan.compose_config(["backend=local", "backend.simulate_ep=8", "experts=torch", "model=deepseek_v3",
                               "reduction=experts", "quant=bf16", "overlap=none"])
    combo = plan.flat_combo(cfg)
    ctx, _, kernel = build_layer(cfg, combo, 0, 1, None, dev)
    x, w, ids = make_inputs(ctx.shape, 256, "uniform", 1.0, 0, 0, 2, dev)
    layer = lambda: kernel(x, w, ids)  # noqa: E731

    flush = timing.L2Flusher(dev)
    for name, fn in (("triton gemm", gemm), ("moe layer", layer)):
        ours1 = timing.time_samples(fn, dev, reps=100, warmup=10, flush=flush)
        ours2 = timing.time_samples(fn, dev, reps=100, warmup=10, flush=flush)  # same thermal state
        # do_bench over about the same wall time as our 100 samples: a 300 ms window of
        # back-to-back GEMMs runs ~7% slower on the H200 (sustained load lowers the clock)
        window_ms = max(5.0, 100 * ours1.median * 1e-3)
        ref = do_bench(fn, warmup=10, rep=window_ms, return_mode="median") * 1e3  # ms -> µs
        ref_long = do_bench(fn, warmup=50, rep=300, return_mode="median") * 1e3
        ours_long = timing.time_samples(fn, dev, reps=max(100, int(300e3 / ours1.median)), warmup=10, flush=flush)
        print(f"{name}: moebench {ours1.median:.1f} / {ours2.median:.1f} µs (p80/p20 {ours1.p80 / ours1.p20:.3f}), "
              f"do_bench {ref:.1f} µs ({window_ms:.0f} ms window); over 300 ms: moebench {ours_long.median:.1f}, do_bench {ref_long:.1f}")
        assert _rel(ours1.median, ref) <= 0.05, (name, ours1.median, ref)
        assert _rel(ours_long.median, ref_long) <= 0.05, (name, ours_long.median, ref_long)
        assert _rel(ours1.median, ours2.median) <= 0.03, (name, ours1.median, ours2.median)
        if ours1.median > 50:
            assert ours1.p80 / ours1.p20 <= 1.05, (name, ours1.p20, ours1.p80)


def _allgather_rank(rank, port, q):
    import torch.distributed as dist

    from moebench import timing

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, device_id=dev)
    inp = torch.randn(64 * 2**20 // 2, device=dev, dtype=torch.bfloat16)  # 64 MiB per rank
    out = torch.empty(2 * inp.numel(), device=dev, dtype=torch.bfloat16)
    fn = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
    barrier = lambda: dist.barrier(device_ids=[rank])  # noqa: E731
    flush = timing.L2Flusher(dev)
    one = torch.zeros(1, device=dev)
    align = lambda: dist.all_reduce(one)  # noqa: E731

    def independent():
        # the same method written out by hand: barrier, flush, events around the call
        ts = []
        for _ in range(50):
            dist.barrier(device_ids=[rank])
            flush.buf.zero_()
            dist.all_reduce(one)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1e3)
        return sorted(ts)[len(ts) // 2]

    for _ in range(30):  # warm NCCL's channels and the clocks before any figure counts
        fn()
    ours = timing.time_samples(fn, dev, reps=50, warmup=10, barrier=barrier, flush=flush, align=align)
    ours2 = timing.time_samples(fn, dev, reps=50, warmup=10, barrier=barrier, flush=flush, align=align)
    ind = independent()
    q.put((rank, ours.median, ours2.median, ind, ours.p20, ours.p80))
    dist.destroy_process_group()


@needs_2gpu
@pytest.mark.xfail(reason="known miss (docs/perf-notes.md): run-to-run spread of NCCL all-gathers on the lent "
                   "2 x H200 machine is 3-20% between sets of 50 samples", strict=False)
def test_timing_matches_an_independent_timer_for_an_nccl_all_gather():
    import torch.multiprocessing as mp

    from moebench.launch import free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_allgather_rank, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    for rank, m1, m2, ind, p20, p80 in res:
        print(f"all-gather rank {rank}: moebench {m1:.1f} / {m2:.1f} µs, independent {ind:.1f} µs, p80/p20 {p80 / p20:.3f}")
        assert _rel(m1, ind) <= 0.05 and _rel(m1, m2) <= 0.03
        assert p80 / p20 <= 1.05


@needs_2gpu
@pytest.mark.xfail(reason="known miss (docs/perf-notes.md): with NCCL the comm and shared-expert kernels slow "
                   "each other down, so kernels overlap in time (trace) more than latency is saved (ablation)",
                   strict=False)
def test_trace_overlap_agrees_with_ablation(tmp_path):
    df = _execute(["backend=allgather_rs,naive", "experts=torch", "reduction=experts", "overlap=combine", "quant=bf16",
                   "model=deepseek_v3", "workload.tokens_per_rank=[4096]", "runner.device=cuda", "trace=torch",
                   "runner.reps=20"], tmp_path / "ovl")
    ok = df[df.status == "ok"]
    assert len(ok) == 2
    for _, r in ok.iterrows():
        print(f"{r.backend}: overlap_fraction {r.overlap_fraction:.3f} (shared {r.shared_us:.0f} µs, exposed "
              f"{r.shared_exposed_us:.0f} µs), trace_overlap_fraction {r.trace_overlap_fraction:.3f}, trace {r.trace_path}")
        assert os.path.exists(os.path.join(tmp_path / "ovl", r.trace_path))
        assert abs(r.overlap_fraction - r.trace_overlap_fraction) <= 0.10
