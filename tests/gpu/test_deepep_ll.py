"""deepep_ll on 2 GPUs (NCCL group, NVSHMEM over NVLink).

1. The sweep path (`moebench sweep`: plan -> launch -> worker, which checks each
   combination against the fp32 reference before timing it): every valid
   deepep_ll x {triton_batched, torch_batched} x {bf16, fp8_block} x
   {none, dispatch, combine} on deepseek_v2_lite at 1, 128 and 256 tokens per rank
   and on deepseek_v3 at 128: every row `ok` within docs/design.md's tolerance.
2. One graph-timing sweep (runner.timing=graph, triton_batched).
3. Directly on 2 spawned ranks: what DeepEP hands over (the [E, X, K] layout,
   column-major 1x128 scales, counts and layout ranges against independently
   computed ones, comm_bytes(), prepared_bytes()), the combine's weighted sum, hook
   and plain dispatch agreeing, and CUDA-graph replays of whole layers matching the
   reference on fresh inputs.
4. A probe: can an HT buffer and an LL buffer live in one process? (The planner
   never puts them in one, so a "no" is an expected failure with its reason.)

Run: python3 -m pytest -m gpu tests/gpu/test_deepep_ll.py --require deep_ep -s
"""

from __future__ import annotations

import os

import pytest
import torch
from _ranks import COMM_ENV, WORLD

pytestmark = [pytest.mark.gpu, pytest.mark.needs("deep_ep")]  # --require: tests/support/_require.py

TOL = {"bf16": 2e-2, "fp8_block": 6e-2, "fp8_tensor": 1e-1}  # docs/design.md
SWEEP_TOKENS = {"deepseek_v2_lite": [1, 128, 256], "deepseek_v3": [128]}
# correctness sweeps: no time-based warm-up (runner.warmup_ms, 200 ms a token count on a GPU)
QUICK = ["runner.device=cuda", "runner.reps=5", "runner.warmup=2", "runner.phase_reps=2", "runner.warmup_ms=0"]
JOB_TIMEOUT_S = 600


def _require_setup():
    if torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs, found {torch.cuda.device_count()}")
    from moebench.kernels.prepare_finalize import _deepep

    reason = _deepep.unavailable_reason()
    if reason:
        pytest.skip(reason)  # names deep_ep: `--require deep_ep` turns this into a failure


def _execute(overrides, out):
    from moebench.results.store import RunStore
    from moebench.run.sweep import execute

    os.environ.update(COMM_ENV)
    run_dir, _ = execute(overrides, None, str(out), quiet=False)
    return RunStore(run_dir).load()


def _show(df) -> None:
    cols = [
        "label",
        "tokens_per_rank",
        "status",
        "rel_err",
        "timing_mode",
        "latency_us_median",
        "dispatch_us",
        "experts_us",
        "combine_us",
        "nvlink_gbps",
        "overlap_fraction",
        "workspace_bytes_peak",
        "analytic_peak_bytes",
        "device_bytes_peak",
        "reason",
    ]
    print("\n" + df[[c for c in cols if c in df.columns]].sort_values(["label", "tokens_per_rank"]).to_string())


# ---------------------------------------------------------------------------
# 1-2. through the sweep path


@pytest.mark.parametrize("model", list(SWEEP_TOKENS))
def test_deepep_ll_matches_reference_through_the_sweep(model, tmp_path):
    _require_setup()
    tokens = SWEEP_TOKENS[model]
    df = _execute(
        [
            "backend=deepep_ll",
            "experts=triton_batched,torch_batched",
            "reduction=finalize",
            "overlap=none,dispatch,combine",
            "quant=bf16,fp8_block",
            f"model={model}",
            f"workload.tokens_per_rank=[{','.join(map(str, tokens))}]",
            *QUICK,
        ],
        tmp_path / model,
    )
    _show(df)
    assert len(df) == 2 * 2 * 3 * len(tokens), "every combination is valid: none may be missing or skipped"
    bad = df[df.status != "ok"]
    assert bad.empty, bad[["label", "tokens_per_rank", "status", "reason"]].to_string()
    over = df[df.rel_err > df["quant"].map(TOL)]
    assert over.empty, over[["label", "tokens_per_rank", "rel_err"]].to_string()
    assert (df.timing_mode == "events").all()
    assert df.latency_us_median.gt(0).all() and df.device_bytes_peak.gt(0).all()
    # a link rate wherever it is defined (overlap=none; at 128+ tokens some pairs surely cross ranks)
    linked = df[(df.overlap == "none") & (df.tokens_per_rank >= 128)]
    assert not linked.empty and linked.nvlink_gbps.gt(0).all()


def test_deepep_ll_graph_timing(tmp_path):
    _require_setup()
    df = _execute(
        [
            "backend=deepep_ll",
            "experts=triton_batched",
            "reduction=finalize",
            "overlap=none,dispatch,combine",
            "quant=fp8_block",
            "model=deepseek_v2_lite",
            "workload.tokens_per_rank=[128]",
            "runner.timing=graph",
            *QUICK,
        ],
        tmp_path / "graph",
    )
    _show(df)
    assert len(df) == 3
    bad = df[df.status != "ok"]
    assert bad.empty, bad[["label", "status", "reason"]].to_string()
    assert (df.timing_mode == "graph").all() and df.latency_us_median.gt(0).all()


# ---------------------------------------------------------------------------
# 3-4. directly, on two spawned ranks


def _after_job(rows):
    """Collective clean-up on both ranks (_ranks.run_job calls it after the job)."""
    from moebench.kernels.prepare_finalize._deepep import release_buffers

    release_buffers()


def _run_job(fn_name, args, out_dir, timeout_s=JOB_TIMEOUT_S):
    """Spawn WORLD ranks running fn_name(rank, device, *args) of this module (tests/gpu/_ranks.py)."""
    from _ranks import run_job

    return run_job(__name__, fn_name, args, out_dir, timeout_s, hang_hint="")


def _shape(name):
    from moebench.kernels.interfaces import LayerShape

    return {
        "deepseek_v2_lite": LayerShape(
            hidden=2048, intermediate=1408, num_experts=64, topk=6, num_shared_experts=2, shared_intermediate=1408
        ),
        "deepseek_v3": LayerShape(
            hidden=7168, intermediate=2048, num_experts=256, topk=8, num_shared_experts=1, shared_intermediate=2048
        ),
    }[name]


def _handover_checks(pf, ctx, x, w, ids, quant, hook):
    """What DeepEP hands over, against what every rank's own ids say."""
    import torch.distributed as dist

    from moebench.kernels.interfaces import Delegate, NoOp
    from moebench.kernels.prepare_finalize.deepep_ll import dispatch_msg_bytes
    from moebench.kernels.reference import rel_err

    rank, R, E, K = ctx.rank, ctx.world_size, ctx.num_local_experts, ctx.shape.hidden
    X = R * ctx.max_tokens_per_rank
    fp8 = quant is not None and quant.is_block
    prep = pf.prepare_async(x, w, ids, quant)() if hook else pf.prepare(x, w, ids, quant)
    torch.cuda.synchronize()
    all_x = [torch.empty_like(x) for _ in range(R)]
    all_ids = [torch.empty_like(ids) for _ in range(R)]
    dist.all_gather(all_x, x)
    dist.all_gather(all_ids, ids)
    count_E = prep.expert_num_tokens_E
    src_info_EX, layout_ER = prep.handle.deepep[0], prep.handle.deepep[1]
    per_expert = [sum(int((a == rank * E + e).sum()) for a in all_ids) for e in range(E)]
    checks = {
        "x": tuple(prep.x.shape) == (E, X, K) and prep.x.dtype == (torch.float8_e4m3fn if fp8 else torch.bfloat16),
        "scale": (prep.x_scale is None) != fp8
        and (not fp8 or (tuple(prep.x_scale.shape) == (E, X, K // 128) and prep.x_scale.stride()[1:] == (1, X))),
        "counts": count_E.dtype == torch.int32 and count_E.tolist() == per_expert,
        "max_rows": pf.max_rows(x.shape[0]) == X,
    }
    # rows: the range of source rank j holds j's tokens routed to expert e, as src_info names them
    rows_ok, ranges_ok = True, True
    xs = prep.x.float()
    if fp8:
        xs = xs * prep.x_scale.float().repeat_interleave(128, dim=2)
    for e in range(E):
        total = 0
        for j in range(R):
            packed = int(layout_ER[e, j])
            begin, n = packed >> 32, packed & 0xFFFFFFFF
            want = int((all_ids[j] == rank * E + e).any(dim=1).sum())
            ranges_ok &= n == want
            total += n
            if n:
                src = src_info_EX[e, begin : begin + n].long()
                got = xs[e, begin : begin + n]
                exp = all_x[j][src].float()
                ok = torch.equal(got, exp) if not fp8 else rel_err(got, exp) < 6e-2
                rows_ok &= bool(ok) and bool((all_ids[j][src] == rank * E + e).any(dim=1).all())
        ranges_ok &= total == per_expert[e]
    checks["rows"], checks["layout_range"] = rows_ok, ranges_ok
    pairs_in = sum(int(((a // E) == rank).logical_and(a >= 0).sum()) for j, a in enumerate(all_ids) if j != rank)
    pairs_out = int(((ids >= 0) & (ids // E != rank)).sum())
    checks["comm_bytes"] = pf.comm_bytes(x.shape[0], prep) == (pairs_out + pairs_in) * (
        dispatch_msg_bytes(K, fp8) + 2 * K
    )
    nbytes = prep.x.numel() * prep.x.element_size() + (prep.x_scale.numel() * 4 if fp8 else 0)
    nbytes += src_info_EX.numel() * 4 + layout_ER.numel() * 8 + count_E.numel() * 4
    checks["prepared_bytes"] = pf.prepared_bytes(x.shape[0], quant) == nbytes
    # identity experts: the combine weights and sums a token's rows back to x * sum(weights) = x
    out = torch.empty_like(x)
    ident = torch.zeros(E, X, K, dtype=torch.bfloat16, device=x.device)
    ident.copy_(xs.nan_to_num())  # padding rows are never read
    if hook:
        pf.finalize_async(out, ident, prep, Delegate())()
    else:
        pf.finalize(out, ident, prep, Delegate())
    checks["combine_weighted_sum"] = rel_err(out, x.float() * w.sum(dim=1, keepdim=True)) < (1e-2 if not fp8 else 6e-2)
    try:
        pf.finalize(out, ident, prep, NoOp())
        checks["refuses_noop"] = False
    except ValueError:
        checks["refuses_noop"] = True
    return checks


def _graph_errors(kernel, shape, T, rank, device, cases):
    """Capture one forward of `kernel` and replay it on fresh inputs copied into the
    captured ones; rel_err of each replay against its reference. cases: [(x, w, ids, ref)]."""
    from moebench.kernels.reference import rel_err
    from moebench.measure.workload import make_inputs

    x, w, ids = make_inputs(shape, T, "uniform", 1.2, 0, rank, 1, device)
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(2):  # even: a forward is two LL calls either way
            kernel(x, w, ids)
    torch.cuda.current_stream(device).wait_stream(s)
    torch.cuda.synchronize(device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kernel(x, w, ids)
    errs = []
    for x2, w2, ids2, ref in cases:
        x.copy_(x2)
        w.copy_(w2)
        ids.copy_(ids2)
        g.replay()
        torch.cuda.synchronize(device)
        errs.append(rel_err(y, ref))
    del g
    torch.cuda.synchronize(device)
    return errs


def _direct(rank, device, model, quants, tokens, cap):
    import torch.distributed as dist

    from moebench.kernels.experts.triton_batched import TritonBatchedExperts
    from moebench.kernels.interfaces import KernelContext, QuantSpec
    from moebench.kernels.modular import MoEKernel
    from moebench.kernels.prepare_finalize import _deepep
    from moebench.kernels.prepare_finalize.deepep_ll import DeepEPLLPrepareFinalize
    from moebench.kernels.reference import reference_moe
    from moebench.measure.workload import build_expert_weights, build_shared, make_inputs, reference_expert_fn

    shape, seed, rows = _shape(model), 0, []
    shared = build_shared(shape, seed, device)
    shared_ref = (shared.w13_NK.float(), shared.w2_KS.float())
    for qname in quants:
        quant = QuantSpec(qname)
        ctx = KernelContext(
            shape=shape,
            quant=quant,
            device=device,
            rank=rank,
            world_size=WORLD,
            group=dist.group.WORLD,
            max_tokens_per_rank=cap,
        )
        experts = TritonBatchedExperts(build_expert_weights(ctx, seed), "finalize", ctx)
        ref_fn = reference_expert_fn(shape, quant, seed, device)
        for T in tokens:
            x, w, ids = make_inputs(shape, T, "uniform", 1.2, seed, rank, 1, device)
            for hook in (False, True):
                checks = _handover_checks(DeepEPLLPrepareFinalize(ctx), ctx, x, w, ids, experts.input_quant, hook)
                rows.append(dict(what=f"handover {'hook' if hook else 'plain'}", quant=qname, tokens=T, checks=checks))
            cases = []
            for salt in (5, 6, 7):  # fresh inputs for the replays, and their references
                x2, w2, ids2 = make_inputs(shape, T, "uniform", 1.2, seed, rank, salt, device)
                cases.append((x2, w2, ids2, reference_moe(x2, w2, ids2, ref_fn, None, shared_ref)))
            for ov in ("none", "dispatch", "combine"):
                kernel = MoEKernel(DeepEPLLPrepareFinalize(ctx), experts, shared, overlap=ov)
                errs = _graph_errors(kernel, shape, T, rank, device, cases)
                kernel.close()
                rows.append(dict(what=f"graph replay overlap={ov}", quant=qname, tokens=T, rel_err=max(errs)))
        del experts
        torch.cuda.empty_cache()
    rows.append(dict(buffers=_deepep.cached_buffer_count()))
    return rows


def test_deepep_ll_hands_over_what_deepep_promises_and_replays_in_graphs(tmp_path):
    _require_setup()
    per_rank = _run_job("_direct", ("deepseek_v2_lite", ("bf16", "fp8_block"), (1, 128, 256), 512), tmp_path)
    failures = []
    print()
    for i, c in enumerate(per_rank[0][:-1]):
        bad = sorted({k for pr in per_rank for k, v in pr[i].get("checks", {}).items() if not v})
        errs = [pr[i].get("rel_err") for pr in per_rank]
        err = max(errs) if errs[0] is not None else None
        print(
            f"{c['what']:30s} {c['quant']:10s} {c['tokens']:4d} "
            + (f"rel_err {err:.2e}" if err is not None else f"checks {'FAIL ' + ','.join(bad) if bad else 'ok'}")
        )
        if bad:
            failures.append(f"{c['what']} {c['quant']} T={c['tokens']}: {bad}")
        if err is not None and not err <= TOL[c["quant"]]:
            failures.append(f"{c['what']} {c['quant']} T={c['tokens']}: rel_err {err:.3e} > {TOL[c['quant']]}")
    buffers = [pr[-1]["buffers"] for pr in per_rank]
    if buffers != [1] * WORLD:
        failures.append(f"expected one LL buffer per rank for every quant and instance, got {buffers}")
    assert not failures, "\n".join(failures)


def _coexist(rank, device):
    """An HT buffer, then an LL buffer, then both again, in one process."""
    import torch.distributed as dist

    from moebench.kernels.experts.torch import TorchExperts
    from moebench.kernels.experts.torch_batched import TorchBatchedExperts
    from moebench.kernels.interfaces import KernelContext, QuantSpec
    from moebench.kernels.modular import MoEKernel
    from moebench.kernels.prepare_finalize.deepep_ht import DeepEPHTPrepareFinalize
    from moebench.kernels.prepare_finalize.deepep_ll import DeepEPLLPrepareFinalize
    from moebench.kernels.reference import reference_moe, rel_err
    from moebench.measure.workload import build_expert_weights, make_inputs, reference_expert_fn

    shape, quant, seed = _shape("deepseek_v2_lite"), QuantSpec("bf16"), 0
    ctx = KernelContext(
        shape=shape,
        quant=quant,
        device=device,
        rank=rank,
        world_size=WORLD,
        group=dist.group.WORLD,
        options={"num_sms": 24},
    )
    weights = build_expert_weights(ctx, seed)
    x, w, ids = make_inputs(shape, 64, "uniform", 1.2, seed, rank, 1, device)
    ref = reference_moe(x, w, ids, reference_expert_fn(shape, quant, seed, device))
    ht = MoEKernel(DeepEPHTPrepareFinalize(ctx), TorchExperts(weights, "finalize", ctx))
    errs = {"ht": rel_err(ht(x, w, ids), ref)}
    ll = MoEKernel(DeepEPLLPrepareFinalize(ctx), TorchBatchedExperts(weights, "finalize", ctx))
    errs["ll"] = rel_err(ll(x, w, ids), ref)
    errs["ht_again"] = rel_err(ht(x, w, ids), ref)
    errs["ll_again"] = rel_err(ll(x, w, ids), ref)
    return [errs]


def test_probe_ht_and_ll_buffers_in_one_process(tmp_path):
    """Not a requirement (the planner keeps them apart): the answer, for the notes."""
    _require_setup()
    try:
        per_rank = _run_job("_coexist", (), tmp_path, timeout_s=240)
    except RuntimeError as e:
        pytest.xfail(f"an HT and an LL DeepEP buffer cannot share a process here: {str(e)[-1500:]}")
    errs = {k: max(pr[0][k] for pr in per_rank) for k in per_rank[0][0]}
    print(f"\nHT and LL buffers in one process: rel_err {errs}")
    assert all(v <= TOL["bf16"] for v in errs.values()), errs
