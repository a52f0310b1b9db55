"""deepep_ht on 2 GPUs: MoEKernel(DeepEP HT, torch experts, shared experts) against
the fp32 reference, for every reduction x overlap x quant x tokens of a model.

Each model spawns one 2-rank NCCL job (spawning per case would spend most of the
time on process groups and NVLink buffers). Expert weights are generated per
global expert from a seed, so every rank builds its local experts and computes
the reference of its own tokens with all experts. Besides rel_err, each rank
checks what DeepEP handed over: local ids, row counts, comm_bytes().

Run: pytest -m gpu tests/gpu/test_deepep_ht.py -s
"""

from __future__ import annotations

import copy
import json
import math
import os
import socket
import traceback

import pytest
import torch

from moebench.kernels.interfaces import KernelContext, LayerShape, NoOp, QuantSpec
from moebench.kernels.quant import dequant_activations, dequant_weight, quant_weights
from moebench.kernels.reference import reference_moe, rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.needs("deep_ep")]  # --require: tests/support/_require.py

WORLD = 2
SEED = 1234
TOL = {"bf16": 2e-2, "fp8_block": 6e-2, "fp8_tensor": 1e-1}  # docs/design.md
MODELS = {
    "deepseek_v2_lite": LayerShape(
        hidden=2048, intermediate=1408, num_experts=64, topk=6, num_shared_experts=2, shared_intermediate=1408
    ),
    "deepseek_v3": LayerShape(
        hidden=7168, intermediate=2048, num_experts=256, topk=8, num_shared_experts=1, shared_intermediate=2048
    ),
}
# fp8_tensor (dispatched bf16, quantized after) on the small model only
QUANTS = {"deepseek_v2_lite": ("bf16", "fp8_block", "fp8_tensor"), "deepseek_v3": ("bf16", "fp8_block")}
TOKENS = (128, 4096)
REDUCTIONS = ("experts", "finalize")
OVERLAPS = ("none", "dispatch", "combine")
# never NVLink multicast / NVLS on the shared machines
COMM_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# ---------------------------------------------------------------------------
# deterministic weights and inputs


def _expert_fp32(shape: LayerShape, e: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Global expert e: (w13 [2I, K], w2 [K, I]) fp32, the same on every rank."""
    g = torch.Generator(device=device)
    g.manual_seed(SEED * 1_000_003 + e)
    K, I = shape.hidden, shape.intermediate
    w13 = torch.randn(2 * I, K, generator=g, device=device) / math.sqrt(K)
    w2 = torch.randn(K, I, generator=g, device=device) / math.sqrt(I)
    return w13, w2


def _expert_stored(shape, quant, e, device):
    """Expert e as the layer stores it: ((w13, scale13), (w2, scale2)), leading dim 1."""
    w13, w2 = _expert_fp32(shape, e, device)
    return quant_weights(w13[None], quant), quant_weights(w2[None], quant)


def _reference_weights(shape, quant, device):
    def fn(e):
        (q13, s13), (q2, s2) = _expert_stored(shape, quant, e, device)
        return dequant_weight(q13, s13, quant)[0], dequant_weight(q2, s2, quant)[0]

    return fn


def _local_weights(shape, quant, ctx):
    from moebench.kernels.interfaces import ExpertWeights

    E, first = ctx.num_local_experts, ctx.first_local_expert
    parts = [_expert_stored(shape, quant, first + i, ctx.device) for i in range(E)]

    def stack(j, k):
        items = [p[j][k] for p in parts]
        return None if items[0] is None else torch.cat(items)

    return ExpertWeights(stack(0, 0), stack(1, 0), stack(0, 1), stack(1, 1), quant)


def _shared_weights(shape, device):
    """Fused shared experts: w13 [2S, K], w2 [K, S] bf16 (S = all shared widths)."""
    g = torch.Generator(device=device)
    g.manual_seed(SEED - 1)
    K, S = shape.hidden, shape.num_shared_experts * shape.shared_intermediate
    w13 = (torch.randn(2 * S, K, generator=g, device=device) / math.sqrt(K)).to(torch.bfloat16)
    w2 = (torch.randn(K, S, generator=g, device=device) / math.sqrt(S)).to(torch.bfloat16)
    return w13, w2


def _inputs(shape, T, rank, device):
    """hidden [T, K] bf16, top-k weights [T, P] fp32 (softmax over the top-k), ids [T, P]."""
    g = torch.Generator(device=device)
    g.manual_seed(SEED * 7 + rank * 131 + T)
    x = torch.randn(T, shape.hidden, generator=g, device=device).to(torch.bfloat16)
    logits = torch.randn(T, shape.num_experts, generator=g, device=device)
    vals, ids = torch.topk(logits, shape.topk, dim=-1)
    return x, torch.softmax(vals, dim=-1), ids


# ---------------------------------------------------------------------------
# checks on what DeepEP hands over


def _check_prepared(pf, ctx, x, w, ids, quant):
    """Direct prepare: local ids, counts and comm_bytes() against independent counts."""
    import torch.distributed as dist

    prep = pf.prepare(x, w, ids, quant if quant.is_fp8 else None)
    E, R, r = ctx.num_local_experts, ctx.world_size, ctx.rank
    ids_MP = prep.topk_ids_MP
    M = prep.x.shape[0]
    ok_range = bool(((ids_MP >= -1) & (ids_MP < E)).all())
    # pairs routed to this rank's experts, counted from every rank's own ids
    owner_TP = ids // E
    mine = torch.tensor([int((owner_TP == j).sum()) for j in range(R)], device=x.device)
    dist.all_reduce(mine)
    rows_to_R = torch.stack([(owner_TP == j).any(dim=1).sum() for j in range(R)])
    gathered = [torch.zeros_like(rows_to_R) for _ in range(R)]
    dist.all_gather(gathered, rows_to_R)
    rows_in_R = torch.stack([gg[r] for gg in gathered])  # from each source rank
    rows_out = int(rows_to_R.sum() - rows_to_R[r])
    rows_in = int(rows_in_R.sum() - rows_in_R[r])
    K, P = ctx.shape.hidden, ctx.shape.topk
    block = quant.is_block
    row = (K if block else 2 * K) + (4 * K // 128 if block else 0) + 12 * P + 4
    expect_bytes = (rows_out + rows_in) * (row + 2 * K)
    checks = {
        "local_ids": ok_range,
        "local_pairs": int((ids_MP >= 0).sum()) == int(mine[r]),
        "rows": M == int(rows_in_R.sum()) and M <= pf.max_rows(x.shape[0]),
        "per_expert": sum(prep.handle.num_tokens_per_expert) == int(mine[r]),
        "dtype": prep.x.dtype == (torch.float8_e4m3fn if quant.is_fp8 else torch.bfloat16)
        and (None if prep.x_scale is None else tuple(prep.x_scale.shape))
        == {"bf16": None, "fp8_block": (M, K // 128), "fp8_tensor": (1,)}[quant.name],
        "comm_bytes": pf.comm_bytes(x.shape[0], prep) == expect_bytes,
    }
    # a NoOp finalize of the received rows sums each token's copies: x * (ranks it went to)
    out = torch.empty_like(x)
    xr = dequant_activations(prep.x, prep.x_scale, quant).to(torch.bfloat16)
    pf.finalize(out, xr, prep, NoOp())
    copies = torch.stack([(owner_TP == j).any(dim=1) for j in range(R)], dim=1).sum(dim=1, keepdim=True)
    checks["combine_sum"] = rel_err(out, x.float() * copies) < (1e-2 if quant.name == "bf16" else TOL[quant.name])
    return checks, M


# ---------------------------------------------------------------------------
# one rank


def _run_rank(rank, shape_name, shape, quants, tokens, device):
    import torch.distributed as dist

    from moebench.kernels.experts.torch import TorchExperts
    from moebench.kernels.modular import MoEKernel, SharedExperts
    from moebench.kernels.prepare_finalize import _deepep
    from moebench.kernels.prepare_finalize.deepep_ht import DeepEPHTPrepareFinalize

    rows = []
    sh13, sh2 = _shared_weights(shape, device)
    shared = SharedExperts(sh13, sh2)
    for qname in quants:
        quant = QuantSpec(qname)
        ctx = KernelContext(
            shape=shape,
            quant=quant,
            device=device,
            rank=rank,
            world_size=WORLD,
            group=dist.group.WORLD,
            options={"num_sms": 24},
        )
        experts = {"experts": TorchExperts(_local_weights(shape, quant, ctx), "experts", ctx)}
        experts["finalize"] = copy.copy(experts["experts"])  # shares the bf16 weight copies
        experts["finalize"].reduction = "finalize"
        ref_w = _reference_weights(shape, quant, device)
        for T in tokens:
            x, w, ids = _inputs(shape, T, rank, device)
            ref = reference_moe(x, w, ids, ref_w, shared=(sh13.float(), sh2.float()))
            pf = DeepEPHTPrepareFinalize(ctx)
            checks, M = _check_prepared(pf, ctx, x, w, ids, quant)
            for red in REDUCTIONS:
                for ov in OVERLAPS:
                    kernel = MoEKernel(DeepEPHTPrepareFinalize(ctx), experts[red], shared, overlap=ov)
                    errs = [rel_err(kernel(x, w, ids), ref) for _ in range(2)]  # reuse: workspaces, buffer
                    kernel.close()
                    rows.append(
                        dict(
                            model=shape_name,
                            quant=qname,
                            tokens=T,
                            reduction=red,
                            overlap=ov,
                            rel_err=max(errs),
                            tol=TOL[qname],
                            rows=M,
                            checks=checks,
                        )
                    )
        del experts
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rows.append(dict(buffers=_deepep.cached_buffer_count()))
    return rows


def _worker(rank, port, shape_name, shape, quants, tokens, out_dir, device_type="cuda"):
    import torch.distributed as dist

    os.environ.update(COMM_ENV)
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, device_id=device
        )
    else:  # a CPU dry run of this test's own logic (with a stand-in deep_ep)
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    out = os.path.join(out_dir, f"rank{rank}.json")
    try:
        rows = _run_rank(rank, shape_name, shape, quants, tokens, device)
        with open(out, "w") as f:
            json.dump(rows, f)
    except Exception:
        with open(out, "w") as f:
            json.dump([{"error": traceback.format_exc()}], f)
        raise
    finally:
        from moebench.kernels.prepare_finalize._deepep import release_buffers

        try:
            release_buffers()  # collective: both ranks get here
        finally:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(shape_name, shape, quants, tokens, out_dir, device_type="cuda"):
    """Spawn WORLD ranks and return their result rows (rank 0's first)."""
    import torch.multiprocessing as mp

    os.environ.update(COMM_ENV)
    mp.spawn(
        _worker,
        args=(_free_port(), shape_name, shape, quants, tokens, str(out_dir), device_type),
        nprocs=WORLD,
        join=True,
    )
    per_rank = []
    for r in range(WORLD):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            per_rank.append(json.load(f))
    return per_rank


def report(per_rank) -> list[str]:
    """Print one line per case (max rel_err over ranks); return the failures."""
    failures = []
    cases = [r for r in per_rank[0] if "rel_err" in r]
    print(
        f"\n{'model':17s} {'quant':10s} {'tokens':>6s} {'reduction':9s} {'overlap':8s} "
        f"{'rows/rank':>14s} {'rel_err':>9s}  tol"
    )
    for i, c in enumerate(cases):
        errs = [pr[i]["rel_err"] for pr in per_rank]
        rows = "/".join(str(pr[i]["rows"]) for pr in per_rank)
        bad_checks = sorted({k for pr in per_rank for k, v in pr[i]["checks"].items() if not v})
        print(
            f"{c['model']:17s} {c['quant']:10s} {c['tokens']:6d} {c['reduction']:9s} {c['overlap']:8s} "
            f"{rows:>14s} {max(errs):9.2e}  {c['tol']:.0e} {'FAIL ' + ','.join(bad_checks) if bad_checks else ''}"
        )
        if not max(errs) <= c["tol"]:
            failures.append(
                f"{c['model']}/{c['quant']}/{c['tokens']}/{c['reduction']}/{c['overlap']}: rel_err {max(errs):.3e} "
                f"> {c['tol']}"
            )
        if bad_checks:
            failures.append(f"{c['model']}/{c['quant']}/{c['tokens']}: checks failed {bad_checks}")
    buffers = [pr[-1].get("buffers") for pr in per_rank]
    print(f"cached DeepEP buffers per rank before release: {buffers}")
    if any(b != 1 for b in buffers):
        failures.append(f"expected one shared DeepEP buffer per rank, got {buffers}")
    return sorted(set(failures))


@pytest.mark.parametrize("model", list(MODELS))
def test_deepep_ht_matches_reference(model, tmp_path):
    from moebench.kernels.prepare_finalize import _deepep

    if torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs, found {torch.cuda.device_count()}")
    reason = _deepep.unavailable_reason()
    if reason:
        pytest.skip(reason)
    per_rank = run_job(model, MODELS[model], QUANTS[model], TOKENS, tmp_path)
    failures = report(per_rank)
    assert not failures, "\n".join(failures)


def test_deepep_ht_chunk_configs_and_carveout_through_the_sweep(tmp_path):
    """backend.dispatch_nvl_chunk / combine_nvl_chunk (Config(num_sms, chunk, 256), as DeepEP's
    test_intranode.py tunes them) and overlap.shared_sm_carveout: every row matches the
    reference, off the recommended config too."""
    from moebench.kernels.prepare_finalize import _deepep
    from moebench.results.store import RunStore
    from moebench.run.sweep import execute

    if torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs, found {torch.cuda.device_count()}")
    reason = _deepep.unavailable_reason()
    if reason:
        pytest.skip(reason)
    os.environ.update(COMM_ENV)
    run_dir, _ = execute(
        [
            "backend=deepep_ht",
            "experts=torch",
            "reduction=finalize",
            "overlap=none,combine",
            "quant=bf16,fp8_block",
            "model=deepseek_v2_lite",
            "workload.tokens_per_rank=[128,1024]",
            "backend.dispatch_nvl_chunk=0,24",
            "backend.combine_nvl_chunk=8",
            "overlap.shared_sm_carveout=24",
            "runner.device=cuda",
            "runner.reps=5",
            "runner.warmup_ms=0",
            "runner.warmup=2",
            "runner.phase_reps=2",
        ],
        None,
        str(tmp_path),
        quiet=False,
    )
    df = RunStore(run_dir).load()
    print(df[["label", "tokens_per_rank", "status", "rel_err", "overlap_fraction"]].to_string())
    assert len(df) == 16 and (df.status == "ok").all(), df[["label", "tokens_per_rank", "status", "reason"]]
    assert set(df.combine_nvl_chunk) == {8} and set(df.dispatch_nvl_chunk) == {0, 24}
