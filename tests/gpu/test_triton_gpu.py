"""The `triton` / `triton_batched` experts on a CUDA GPU at real shapes:

* correctness: both layouts x 3 quants x valid reductions, against the fp32
  reference, for Qwen3-30B-A3B (E=128, top-8) and one EP-8 rank of DeepSeek-V3
  (simulate_ep=8: 32 local experts, the other ranks' pairs arrive as -1), at
  16, 256 and 4096 tokens, plus skewed routing (every quant and layout, and the
  contiguous rows of the standard layout); the local prepare's fused fp8
  quantize-and-localize against the two kernels it replaces; issue #35's Gluon grouped GEMM
  (opt-in) against the fp32 product, in a process of its own (a hang fails, not stalls);
* memory: the allocator peak of experts.apply stays within its declared
  transient_bytes, the whole forward matches the analytic peak plus what the
  backend itself holds, and reduction=experts saves T * (topk - 1) * K * 2 bytes.

Run: pytest -m gpu tests/gpu/test_triton_gpu.py
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moebench.kernels.experts.triton import CONTIGUOUS_QUANTS
from moebench.kernels.interfaces import ExpertWeights, KernelContext, LayerShape, QuantSpec
from moebench.kernels.modular import MoEKernel
from moebench.kernels.prepare_finalize.local import LocalPrepareFinalize
from moebench.kernels.prepare_finalize.local_batched import LocalBatchedPrepareFinalize
from moebench.kernels.quant import dequant_weight, quant_weights
from moebench.kernels.reference import reference_moe, rel_err
from moebench.kernels.registry import get_experts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = torch.device("cuda")
TOL = {"bf16": 2e-2, "fp8_block": 6e-2, "fp8_tensor": 1e-1}  # docs/design.md
# (shape, simulate_ep): DeepSeek-V3 at EP 8 keeps 32 of its 256 experts
MODELS = {
    "qwen3_30b_a3b": (LayerShape(hidden=2048, intermediate=768, num_experts=128, topk=8), 1),
    "deepseek_v3_ep8": (LayerShape(hidden=7168, intermediate=2048, num_experts=256, topk=8), 8),
}
TOKENS = (16, 256, 4096)
QUANTS = ("bf16", "fp8_block", "fp8_tensor")
LAYOUTS = (("standard", "experts"), ("standard", "finalize"), ("batched", "finalize"))


@functools.lru_cache(maxsize=2)
def layer(model: str, quant: str):
    """(ctx, local ExpertWeights, e -> fp32 dequantized (w13, w2) of local expert e)."""
    shape, ep = MODELS[model]
    q = QuantSpec(quant)
    ctx = KernelContext(shape, q, DEV, simulate_ep=ep)
    E, K, I = ctx.num_local_experts, shape.hidden, shape.intermediate
    g = torch.Generator(device=DEV).manual_seed(0)
    w13 = torch.randn(E, 2 * I, K, generator=g, device=DEV) * K**-0.5
    w2 = torch.randn(E, K, I, generator=g, device=DEV) * I**-0.5
    a, sa = quant_weights(w13, q)
    b, sb = quant_weights(w2, q)
    del w13, w2

    def ref_weights(e: int):
        s13 = None if sa is None else sa[e : e + 1]
        s2 = None if sb is None else sb[e : e + 1]
        return dequant_weight(a[e : e + 1], s13, q)[0], dequant_weight(b[e : e + 1], s2, q)[0]

    return ctx, ExpertWeights(a, b, sa, sb, q), ref_weights


def inputs(shape: LayerShape, T: int, routing: str = "uniform", seed: int = 1):
    """hidden [T, K] bf16, topk weights [T, P] fp32 (sum 1), global topk ids [T, P] int64."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(T, shape.hidden, generator=g, device=DEV).to(torch.bfloat16)
    logits = torch.randn(T, shape.num_experts, generator=g, device=DEV)
    if routing == "skewed":  # every token's first pair on expert 0, a few hot experts, many cold,
        logits[:, 0] += 100.0  # and experts 8-15 (local in both models) never chosen
        logits[:, 1:8] += 3.0
        logits[:, 8:16] -= 100.0
    ids = torch.topk(logits, shape.topk, dim=1).indices
    # weights independent of the logits, so that no pair's contribution vanishes
    w = torch.rand(T, shape.topk, generator=g, device=DEV) + 0.1
    return x, w / w.sum(1, keepdim=True), ids


def build(model: str, quant: str, layout: str, reduction: str, row_layout: str = ""):
    """row_layout: the standard layout's rows (ctx.options["row_layout"]), "" for auto."""
    ctx, w, ref_weights = layer(model, quant)
    if row_layout:
        ctx = dataclasses.replace(ctx, options={"row_layout": row_layout})
    pf = (LocalBatchedPrepareFinalize if layout == "batched" else LocalPrepareFinalize)(ctx)
    experts = get_experts("triton_batched" if layout == "batched" else "triton")(w, reduction, ctx)
    return ctx, MoEKernel(pf, experts), ref_weights


# -- correctness --------------------------------------------------------------


@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("layout,reduction", LAYOUTS)
@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("model", list(MODELS))
def test_matches_reference(model, quant, layout, reduction, T):
    ctx, kernel, ref_weights = build(model, quant, layout, reduction)
    x, tw, ids = inputs(ctx.shape, T)
    y = kernel(x, tw, ids)
    ref = reference_moe(x, tw, ids, ref_weights, kept_experts=range(ctx.num_local_experts))
    err = rel_err(y, ref)
    assert err <= TOL[quant], f"rel_err {err:.4g} > {TOL[quant]}"


# (model, quant, layout, reduction, row_layout): every quant and layout on DeepSeek-V3's EP-8
# share (pairs of other ranks too), fp8_block on Qwen3 as well; the contiguous rows for each
# quant they run, each reduction on one model (at 512 tokens `auto` picks gathered rows).
# Sorted by weights: layer() caches two.
SKEWED_CASES = sorted(
    [("deepseek_v3_ep8", q, lay, red, "gathered" if lay == "standard" else "") for q in QUANTS for lay, red in LAYOUTS]
    + [("qwen3_30b_a3b", "fp8_block", lay, red, "gathered" if lay == "standard" else "") for lay, red in LAYOUTS]
    + [
        (m, q, "standard", red, "contiguous")
        for q in CONTIGUOUS_QUANTS
        for m, red in (("qwen3_30b_a3b", "experts"), ("deepseek_v3_ep8", "finalize"))
    ],
    key=lambda case: case[:2],
)


@pytest.mark.parametrize("model,quant,layout,reduction,row_layout", SKEWED_CASES, ids=lambda v: v or "none")
def test_skewed_routing(model, quant, layout, reduction, row_layout):
    """Most pairs on a few experts (long segments, local experts without a pair)."""
    if row_layout == "contiguous" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the contiguous layout loads through TMA: SM90 or newer")
    ctx, kernel, ref_weights = build(model, quant, layout, reduction, row_layout)
    x, tw, ids = inputs(ctx.shape, 512, routing="skewed")
    local = ids[ids < ctx.num_local_experts]
    assert (torch.bincount(local, minlength=ctx.num_local_experts) == 0).any(), "no empty local expert"
    y = kernel(x, tw, ids)
    if layout == "standard" and quant in CONTIGUOUS_QUANTS:
        assert kernel.experts.last_layout == row_layout
    ref = reference_moe(x, tw, ids, ref_weights, kept_experts=range(ctx.num_local_experts))
    err = rel_err(y, ref)
    assert err <= TOL[quant], f"rel_err {err:.4g} > {TOL[quant]}"


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="the contiguous layout loads through TMA: SM90 or newer",
)
@pytest.mark.parametrize("model,T", [("deepseek_v3_ep8", 4096), ("qwen3_30b_a3b", 256)])
@pytest.mark.parametrize("reduction", ["experts", "finalize"])
@pytest.mark.parametrize("quant", ["fp8_block", "bf16"])
def test_row_layouts_agree(model, T, reduction, quant):
    """The two row layouts (gathered rows, contiguous TMA) against the reference and each
    other, at sizes where `auto` would pick the other one."""
    ctx, w, ref_weights = layer(model, quant)
    x, tw, ids = inputs(ctx.shape, T)
    ref = reference_moe(x, tw, ids, ref_weights, kept_experts=range(ctx.num_local_experts))
    ys = {}
    for row_layout in ("gathered", "contiguous"):
        c = dataclasses.replace(ctx, options={"row_layout": row_layout})
        experts = get_experts("triton")(w, reduction, c)
        assert experts.contiguous(T, ctx.shape.topk) == (row_layout == "contiguous")
        ys[row_layout] = MoEKernel(LocalPrepareFinalize(c), experts)(x, tw, ids)
        assert experts.last_layout == row_layout
        assert rel_err(ys[row_layout], ref) <= TOL[quant], row_layout
    assert rel_err(ys["contiguous"], ys["gathered"]) <= 2e-2  # same operands, other accumulation order


def test_finalize_rows_of_nonlocal_pairs_are_zero():
    """reduction=finalize: rows of pairs routed to other ranks are 0 (not garbage)."""
    ctx, w, _ = layer("deepseek_v3_ep8", "bf16")
    pf = LocalPrepareFinalize(ctx)
    experts = get_experts("triton")(w, "finalize", ctx)
    x, tw, ids = inputs(ctx.shape, 256)
    prepared = pf.prepare(x, tw, ids, experts.input_quant)
    shapes = experts.workspace_shapes(256, ctx.shape.n, ctx.shape.hidden, ctx.shape.topk, ctx.num_local_experts)
    ws13, ws2, out = (torch.full(s, float("nan"), dtype=torch.bfloat16, device=DEV) for s in shapes)
    experts.apply(out, prepared, ws13, ws2)
    rows = out.view(-1, ctx.shape.hidden)
    nonlocal_ = prepared.topk_ids_MP.reshape(-1) < 0
    assert nonlocal_.any() and torch.isfinite(rows).all()
    assert (rows[nonlocal_] == 0).all()


@pytest.mark.parametrize("T", [1, 37, 4096])
@pytest.mark.parametrize("model", list(MODELS))
def test_prepare_fuses_fp8_block_quant_and_localize(model, T):
    """The local prepare with fp8_block launches one kernel: where the ids need one too (DeepSeek-V3's
    EP-8 share, int32 ids) the fused quantize-and-localize, its three outputs views of one buffer,
    bit-equal to per_token_group_quant_fp8 and localize_ids_triton (the two kernels it ran before);
    every expert local with int64 ids (qwen3): the quantization alone, the ids as they are."""
    from torch.profiler import ProfilerActivity, profile

    from moebench.kernels.triton.quant import per_token_group_quant_fp8
    from moebench.kernels.triton.routing import localize_ids_triton

    shape, ep = MODELS[model]
    ctx = KernelContext(shape, QuantSpec("fp8_block"), DEV, simulate_ep=ep)
    pf = LocalPrepareFinalize(ctx)
    x, tw, ids64 = inputs(shape, T)
    for ids in (ids64, ids64.int()):
        fused = ep > 1 or ids.dtype == torch.int32
        p = pf.prepare(x, tw, ids, ctx.quant)
        q, s = per_token_group_quant_fp8(x, ctx.quant.block_k)
        local = localize_ids_triton(ids, ctx.first_local_expert, ctx.num_local_experts) if fused else ids
        for got, want in ((p.x, q), (p.x_scale, s), (p.topk_ids_MP, local)):
            assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride())
        assert torch.equal(p.x.view(torch.uint8), q.view(torch.uint8)) and torch.equal(p.x_scale, s)
        assert torch.equal(p.topk_ids_MP, local) and p.topk_weights_MP is tw
        assert (p.x.untyped_storage().data_ptr() == p.topk_ids_MP.untyped_storage().data_ptr()) == fused
        if ep > 1:
            assert (p.topk_ids_MP == -1).any()  # other ranks' pairs
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            pf.prepare(x, tw, ids, ctx.quant)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        assert len(names) == 1, names  # two before where the ids needed a kernel


# -- memory -------------------------------------------------------------------


def _peak(fn) -> int:
    """Allocator peak during fn() above what was allocated before it (bytes)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _held_bytes(tensors) -> int:
    """Caching-allocator bytes (512-byte blocks) of the tensors' storages, each storage once: the
    fused prepare's fp8 rows, scales and local ids are views of one allocation."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(-(-n // 512) * 512 for n in storages.values())


def forward_memory(model: str, quant: str, reduction: str, T: int) -> dict:
    """Peaks (bytes) of one standard-layout forward and of its phases."""
    ctx, kernel, _ = build(model, quant, "standard", reduction)
    pf, experts = kernel.pf, kernel.experts
    x, tw, ids = inputs(ctx.shape, T)
    kernel(x, tw, ids)  # compile the kernels first
    kernel.clear_workspaces()
    dims = (T, ctx.shape.n, ctx.shape.hidden, ctx.shape.topk, ctx.num_local_experts)

    def phases() -> tuple[int, int, int, int]:
        """What the backend allocates on its own (prepare's peak, what it hands over,
        the finalize's peak, e.g. Contiguous's reduce output) and apply's peak."""
        prepare_peak = _peak(lambda: pf.prepare(x, tw, ids, experts.input_quant))
        prepared = pf.prepare(x, tw, ids, experts.input_quant)
        held = [prepared.x if prepared.x.data_ptr() != x.data_ptr() else None, prepared.x_scale, prepared.topk_ids_MP]
        ws = [torch.empty(s, dtype=torch.bfloat16, device=DEV) for s in experts.workspace_shapes(*dims)]
        apply_peak = _peak(lambda: experts.apply(ws[2], prepared, ws[0], ws[1]))
        out_TK = torch.empty(T, ctx.shape.hidden, dtype=torch.bfloat16, device=DEV)
        finalize_peak = _peak(lambda: pf.finalize(out_TK, ws[2], prepared, experts.finalize_weight_and_reduce()))
        return prepare_peak, _held_bytes(held), finalize_peak, apply_peak

    prepare_peak, prepared_bytes, finalize_peak, apply_peak = phases()  # its tensors are freed on return
    forward_peak = _peak(lambda: kernel(x, tw, ids))  # workspaces were cleared: they count
    kernel.clear_workspaces()
    return dict(
        forward=forward_peak,
        apply=apply_peak,
        prepare=prepare_peak,
        prepared=prepared_bytes,
        finalize=finalize_peak,
        workspaces=kernel.workspace_bytes(T),
        transient=experts.transient_bytes(*dims),
        analytic=kernel.analytic_peak_bytes(T),
        out=T * ctx.shape.hidden * 2,
    )


# fp8_block at 4096 tokens and bf16 qwen3 at 16384 (1024 pairs per expert) run the contiguous layout
MEMORY_CASES = [(m, q, T) for m in MODELS for q in ("bf16", "fp8_block") for T in (256, 4096)] + [
    ("qwen3_30b_a3b", "bf16", 16384)
]


@pytest.mark.parametrize("model,quant,T", MEMORY_CASES)
def test_allocator_peak_matches_analytic(model, quant, T):
    for reduction in ("experts", "finalize"):
        m = forward_memory(model, quant, reduction, T)
        # the experts allocate nothing beyond their declared transient bytes
        assert m["apply"] <= m["transient"], m
        assert m["transient"] - m["apply"] <= 0.05 * (m["workspaces"] + m["transient"]), m
        # whole forward: the analytic terms (workspaces, transient, layer output) plus
        # what the backend holds or allocates itself, at whichever moment peaks
        later = m["prepared"] + m["workspaces"] + max(m["transient"], m["out"] + m["finalize"])
        expected = max(m["prepare"], later)
        assert abs(m["forward"] - expected) <= 0.05 * expected, (reduction, m, expected)
        # and the analytic figure covers everything the experts account for
        assert m["forward"] <= m["analytic"] + m["prepared"] + m["finalize"] + 0.05 * m["analytic"], (reduction, m)


@pytest.mark.parametrize("model,quant,T", MEMORY_CASES)
def test_reduction_in_experts_saves_the_topk_buffer(model, quant, T):
    shape = MODELS[model][0]
    saved = (
        forward_memory(model, quant, "finalize", T)["forward"] - forward_memory(model, quant, "experts", T)["forward"]
    )
    # reduction=experts never stores the [T, topk, K] bf16 rows, but still writes a [T, K] bf16
    # output (workspace_shapes; test_triton_kernels.py checks the same difference on a CPU)
    expect = T * (shape.topk - 1) * shape.hidden * 2
    assert abs(saved - expect) <= 0.05 * expect, (saved, expect)


ROOT = Path(__file__).resolve().parents[2]


def _run_or_fail(cmd: list, what: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """cmd in a process of its own from the checkout's root, its output printed; a hang (past
    `timeout` s) fails the calling test with what it printed so far instead of stalling the suite.
    The checkout leads PYTHONPATH: a script under benchmarks/ imports the moebench this suite
    tests, installed or not (session 20's device ran the suite from an uninstalled checkout)."""
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired as e:  # (its stdout is bytes, text=True or not)
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{what} did not finish in {timeout} s (a hang?); printed so far:\n{out}")
    print(res.stdout[-6000:])
    return res


def _gluon_variants():
    from moebench.kernels.triton.gluon_contiguous import GLUON_VARIANTS

    return GLUON_VARIANTS


@pytest.mark.parametrize(
    "option",
    [[], ["--group-n", "5"], ["--scale-tma"], ["--scale-tma", "--producer-1w"]],
    ids=["row-groups", "column-bands", "scales-by-tma", "one-warp-producer"],
)
def test_gluon_contiguous_gemm_matches_the_fp32_product(option):
    """kernels/triton/gluon_contiguous.py (issue #35: the block-scale promotion beside the tensor
    cores' work), its kernels as benchmarks/triton_fp8_contiguous.py's GLUON_VARIANTS run them
    (warp-specialized at 4 and 6 stages, pipelined at 4, warp-specialized with the block scales two
    K steps ahead, with a TMA-store epilogue at 4, 5 and 6 stages, and that at a 128 x 192 tile,
    gluon_wide.py: a weight scale per column where a tile spans two scale blocks, N not a multiple of
    192 for all but qwen3's gate/up), both GEMMs of qwen3 and DeepSeek-V3's
    EP-8 share (most row tiles padding) at 256 and 4096 tokens, beside our Triton tile: within
    1e-2 of the fp32 torch product, as a whole and row by row, every output row written
    (`--gluon --check`). In both tile orders (gluon_common.tile_coords): groups of 8 row tiles, and
    bands of 5 column tiles, which leaves a part band in every GEMM here; and with the 128 x 192
    tile's activation scales TMA-loaded with its stages (SCALE_TMA), and that with its TMA producer
    one warp (PRODUCER_1W: a barrier the partitions disagree on would hang). In a subprocess with a
    timeout: Triton's automatic warp specialization of the Triton kernel hung on this GPU
    (docs/findings/triton-vs-deepgemm.md), and a hung kernel must fail this test, not stall the suite."""
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "triton_fp8_contiguous.py"),
        "--gluon",
        "--check",
        "1e-2",
        "--models",
        "qwen3_30b_a3b",
        "deepseek_v3",
        "--tokens",
        "256",
        "4096",
        *option,
    ]
    res = _run_or_fail(cmd, "the Gluon GEMM")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "failed:" not in res.stdout and "FAILED" not in res.stdout, res.stdout[-4000:]
    # 2 models x 2 sizes x 2 GEMMs x the Gluon variants (each line beside our tile's)
    n = len(_gluon_variants())
    assert res.stdout.count("gluon 128x") == 8 * n and n >= 8, res.stdout[-4000:]
    assert res.stdout.count(" band5 ") == (8 * n if "--group-n" in option else 0), res.stdout[-4000:]
    assert res.stdout.count(" scales-tma") == (8 if "--scale-tma" in option else 0), res.stdout[-4000:]
    assert res.stdout.count(" producer-1w") == (8 if "--producer-1w" in option else 0), res.stdout[-4000:]


_GLUON_LAYER = """if True:
    import sys
    import torch
    from moebench.config import compose
    from moebench.kernels.reference import rel_err
    from moebench.measure.layer import build_layer
    from moebench.measure.workload import make_inputs

    dev = torch.device("cuda", 0)
    worst = 0.0
    for model, ep, T in (("qwen3_30b_a3b", 1, 4096), ("deepseek_v3", 8, 2048), ("deepseek_v3", 8, 16)):
        out = {}
        for gemm in ("triton", "gluon", "auto", "gluon_wide"):
            ovs = ["backend=local", f"backend.simulate_ep={ep}", "experts=triton", f"model={model}",
                   "reduction=experts", "quant=fp8_block", "overlap=none", "experts.row_layout=contiguous",
                   f"experts.contiguous_gemm={gemm}"]
            layer = build_layer(compose.to_combo(compose.compose_config(ovs)), 0, 1, None, dev)
            x, w, ids = make_inputs(layer.ctx.shape, T, "uniform", 1.0, 0, 0, 2, dev)
            out[gemm] = layer.kernel(x, w, ids).float()
            assert layer.kernel.experts.last_layout == "contiguous"
            # auto: Gluon for every GEMM on this SM90 GPU (GLUON_MIN_N 0)
            used = {"auto": "gluon/gluon"}.get(gemm, f"{gemm}/{gemm}")
            assert layer.kernel.experts.last_gemm == used, (model, gemm, layer.kernel.experts.last_gemm)
        assert rel_err(out["auto"], out["gluon"]) <= 1e-2
        err = rel_err(out["gluon"], out["triton"])
        wide = rel_err(out["gluon_wide"], out["triton"])
        worst = max(worst, err, wide)
        print(f"{model} EP-{ep} {T} tokens: gluon vs triton layer output rel err {err:.2e}, "
              f"gluon_wide {wide:.2e}", flush=True)
    sys.exit(0 if worst <= 1e-2 else 1)
"""


def test_the_layer_with_the_gluon_gemm_matches_the_triton_one():
    """experts.contiguous_gemm=gluon (issue #35) in the whole layer: the fp8_block forward of qwen3
    (4096 tokens) and DeepSeek-V3's EP-8 share (2048 and 16 tokens: most row tiles padding, at 16
    a handful of rows) on the contiguous layout with the Gluon GEMM matches the same layer with
    the Triton GEMM within 1e-2 (the same block-scaled products), and the default, auto, runs the
    kernel its rule names (experts' last_gemm: Gluon for both models' GEMMs on an SM90 GPU) with
    that kernel's output; gluon_wide (the 128 x 192 tile, opt-in) matches too. In a subprocess
    with a timeout, as the GEMM's own test: a hang fails here instead of stalling the suite."""
    res = _run_or_fail([sys.executable, "-c", _GLUON_LAYER], "the layer with the Gluon GEMM")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert res.stdout.count("rel err") == 3, res.stdout[-4000:]
