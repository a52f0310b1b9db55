"""DeepGEMM behind every EP backend on 2 GPUs (the card's example, `backend=deepep_ht
experts=deepgemm`): deepep_ht with `deepgemm` and `triton_or_deepgemm` for both reductions and
the three overlap modes, deepep_ll and pplx with `deepgemm_masked`, each against the float32
reference with skewed (zipf) routing that sends every token to rank 0's experts, so that rank
1's experts get no token."""

from __future__ import annotations

import json
import os

import pytest
import torch

from moebench.run.launch import run_ranks

pytestmark = pytest.mark.gpu
WORLD = 2
CASES = [  # (backend, experts, reductions, tokens)
    ("deepep_ht", "deepgemm", ("experts", "finalize"), (128, 4096)),
    ("deepep_ht", "triton_or_deepgemm", ("experts", "finalize"), (128, 4096)),
    ("deepep_ll", "deepgemm_masked", ("finalize",), (128, 512)),
    ("pplx", "deepgemm_masked", ("finalize",), (128, 512)),
]
# what each case exercises, for --require (tests/support/_require.py): both libraries and 2 GPUs, so the
# one-GPU suite's --require deep_gemm lets them skip and --require deep_ep,deep_gemm does not
NEEDS = {
    "deepep_ht": ("deep_ep", "deep_gemm"),
    "deepep_ll": ("deep_ep", "deep_gemm"),
    "pplx": ("pplx_kernels", "deep_gemm"),
}
OVERLAPS = ("none", "dispatch", "combine")


def _skewed_inputs(shape, T, rank, device, skew=1.5):
    """hidden, top-k weights and ids: zipf popularity over rank 0's experts only."""
    g = torch.Generator().manual_seed(7919 * (rank + 1) + T)
    E0 = shape.num_experts // WORLD  # rank 0 owns experts [0, E0)
    pop = 1.0 / torch.arange(1, E0 + 1, dtype=torch.float64) ** skew
    ids = torch.multinomial(pop.float().expand(T, E0).contiguous(), shape.topk, replacement=False, generator=g)
    x = torch.randn(T, shape.hidden, generator=g).to(torch.bfloat16)
    w = torch.softmax(torch.randn(T, shape.topk, generator=g), dim=-1)
    return x.to(device), w.to(device), ids.to(torch.int64).to(device)


def _rank(rank, port, backend, experts, reductions, tokens, q):
    import torch.distributed as dist

    from moebench.config.compose import compose_config, to_combo
    from moebench.config.validity import validate
    from moebench.kernels.reference import TOLERANCE, reference_moe, rel_err
    from moebench.measure.layer import build_layer
    from moebench.measure.workload import reference_expert_fn

    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, device_id=dev)
    out = []
    try:
        for red in reductions:
            for ov in OVERLAPS:
                cfg = compose_config(
                    [
                        f"backend={backend}",
                        f"experts={experts}",
                        f"reduction={red}",
                        f"overlap={ov}",
                        "quant=fp8_block",
                        "model=deepseek_v3",
                        f"runner.world_size={WORLD}",
                    ]
                )
                combo = to_combo(cfg, device="cuda")
                why = validate(combo)
                if why:
                    out.append({"case": f"{red}/{ov}", "skipped": why})
                    continue
                layer = build_layer(combo, rank, WORLD, dist.group.WORLD, dev)
                shape, kernel = layer.ctx.shape, layer.kernel
                ref_w = reference_expert_fn(shape, layer.ctx.quant, combo.seed, dev)
                sh = kernel.shared
                for T in tokens:
                    x, w, ids = _skewed_inputs(shape, T, rank, dev)
                    local = int(
                        (
                            (ids >= layer.ctx.first_local_expert)
                            & (ids < layer.ctx.first_local_expert + layer.ctx.num_local_experts)
                        ).sum()
                    )
                    ref = reference_moe(x, w, ids, ref_w, None, (sh.w13_NK.float(), sh.w2_KS.float()))
                    errs = [rel_err(kernel(x, w, ids), ref) for _ in range(2)]  # reuses workspaces, buffers
                    out.append(
                        {
                            "case": f"{red}/{ov}",
                            "tokens": T,
                            "rel_err": max(errs),
                            "tol": TOLERANCE["fp8_block"],
                            "own_pairs_routed_here": local,
                        }
                    )
                kernel.close()
                del layer
                torch.cuda.empty_cache()
        q.put((rank, json.dumps(out)))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < WORLD, reason=f"needs {WORLD} GPUs")
@pytest.mark.parametrize(
    "backend, experts, reductions, tokens",
    [pytest.param(*c, marks=pytest.mark.needs(*NEEDS[c[0]]), id=f"{c[0]}-{c[1]}") for c in CASES],
)
def test_deepgemm_behind_the_ep_backend_with_an_empty_rank(backend, experts, reductions, tokens):
    results = dict(run_ranks(_rank, WORLD, (backend, experts, reductions, tokens), timeout_s=900))
    rows = {r: json.loads(v) for r, v in results.items()}
    for r, cases in rows.items():
        skipped = [c for c in cases if "skipped" in c]
        assert not skipped, (r, skipped)  # on 2 H200s with DeepEP, DeepGEMM and pplx, every case runs
        assert len(cases) == len(reductions) * len(OVERLAPS) * len(tokens)
        bad = [c for c in cases if not c["rel_err"] <= c["tol"]]
        assert not bad, (r, bad)
    # every token went to rank 0's experts: rank 1's experts got none
    assert all(c["own_pairs_routed_here"] == 0 for c in rows[1])
