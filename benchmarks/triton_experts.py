"""Latency of the `triton` experts (standard layout, reduction=experts) against
the roofline floor, on one GPU. The harness (`moebench sweep`) is the real
measurement; this is the quick loop for kernel work.

    python benchmarks/triton_experts.py [--models qwen3_30b_a3b deepseek_v3_ep8]
        [--quants bf16 fp8_block] [--tokens 16 64 256 1024 4096 16384] [--out results.json]

Floor = max(bytes / measured copy bandwidth, FLOPs / measured bf16 GEMM peak);
`floor_pct` is floor / latency (100 = at the roofline).
"""
from __future__ import annotations

import argparse
import json

import torch
import triton.testing

from moebench.kernels.interfaces import ExpertWeights, KernelContext, LayerShape, PreparedTokens, QuantSpec
from moebench.kernels.prepare_finalize.local import LocalPrepareFinalize
from moebench.kernels.quant import quant_weights
from moebench.kernels.registry import get_experts

MODELS = {  # (shape, simulate_ep)
    "qwen3_30b_a3b": (LayerShape(hidden=2048, intermediate=768, num_experts=128, topk=8), 1),
    "deepseek_v3_ep8": (LayerShape(hidden=7168, intermediate=2048, num_experts=256, topk=8), 8),
}


def expert_flops(pairs: int, K: int, I: int) -> int:
    # 3 matmuls per pair: gate and up (2I x K), down (K x I); 2 FLOPs per multiply-add
    return 2 * pairs * 3 * K * I


def expert_bytes(hit: int, w: ExpertWeights, rows_in: int, pairs: int, K: int, act_bytes: int) -> int:
    # weights (+ scales) of every hit expert read once, activations in, [M, K] bf16 out
    return hit * w.nbytes_per_expert() + rows_in * K * act_bytes + rows_in * K * 2


def copy_bandwidth() -> float:
    """Measured device copy bandwidth (bytes/s): read + write of 1 GiB."""
    a = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a))
    return 2 * a.numel() * 2 / (ms * 1e-3)


def gemm_peak() -> float:
    """Measured dense bf16 GEMM FLOP/s (8192^3)."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = triton.testing.do_bench(lambda: a @ a)
    return 2 * 8192**3 / (ms * 1e-3)


def bench(model: str, quant: str, T: int, bw: float, peak: float) -> dict:
    shape, ep = MODELS[model]
    q = QuantSpec(quant)
    ctx = KernelContext(shape, q, torch.device("cuda"), simulate_ep=ep)
    E, K, I, P = ctx.num_local_experts, shape.hidden, shape.intermediate, shape.topk
    w13, s13 = quant_weights(torch.randn(E, 2 * I, K, device="cuda") * K**-0.5, q)
    w2, s2 = quant_weights(torch.randn(E, K, I, device="cuda") * I**-0.5, q)
    w = ExpertWeights(w13, w2, s13, s2, q)
    experts = get_experts("triton")(w, "experts", ctx)
    x = torch.randn(T, K, device="cuda").to(torch.bfloat16)
    ids = torch.rand(T, shape.num_experts, device="cuda").topk(P, dim=1).indices
    tw = torch.full((T, P), 1.0 / P, device="cuda")
    prepared: PreparedTokens = LocalPrepareFinalize(ctx).prepare(x, tw, ids, experts.input_quant)
    ws = [torch.empty(s, dtype=torch.bfloat16, device="cuda") for s in experts.workspace_shapes(T, 2 * I, K, P, E)]
    ms = triton.testing.do_bench(lambda: experts.apply(ws[2], prepared, ws[0], ws[1]), warmup=25, rep=200)
    local = prepared.topk_ids_MP[prepared.topk_ids_MP >= 0]
    pairs, hit = local.numel(), int(torch.unique(local).numel())
    nbytes = expert_bytes(hit, w, T, pairs, K, q.act_bytes)
    flops = expert_flops(pairs, K, I)
    floor_s = max(nbytes / bw, flops / peak)
    us = ms * 1e3
    return dict(model=model, quant=quant, tokens=T, experts_us=us, floor_us=floor_s * 1e6,
                floor_pct=100 * floor_s * 1e6 / us, tflops=flops / (us * 1e-6) / 1e12,
                hbm_gbps=nbytes / (us * 1e-6) / 1e9, config=experts._config(T, P))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--quants", nargs="+", default=["bf16", "fp8_block"])
    p.add_argument("--tokens", nargs="+", type=int, default=[16, 64, 256, 1024, 4096, 16384])
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args()
    bw, peak = copy_bandwidth(), gemm_peak()
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s, bf16 GEMM {peak / 1e12:.0f} TFLOP/s")
    print(f"{'model':<18}{'quant':<12}{'tokens':>7}{'us':>10}{'floor us':>10}{'% floor':>9}{'TFLOP/s':>9}{'GB/s':>8}")
    rows = []
    for model in args.models:
        for quant in args.quants:
            for T in args.tokens:
                r = bench(model, quant, T, bw, peak)
                rows.append(r)
                print(f"{model:<18}{quant:<12}{T:>7}{r['experts_us']:>10.1f}{r['floor_us']:>10.1f}"
                      f"{r['floor_pct']:>9.1f}{r['tflops']:>9.1f}{r['hbm_gbps']:>8.0f}")
                torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(copy_bytes_per_s=bw, gemm_flops_per_s=peak, gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
