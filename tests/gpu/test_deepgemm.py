"""The `deepgemm`, `deepgemm_masked` and `triton_or_deepgemm` experts on an SM90 GPU
with the real deep_gemm (2.8.2, built by scripts/install_deep_gemm.sh):

* through `moebench sweep` (the path `moebench run` takes: planning, a spawned
  rank, build_layer, the float32 reference check, timing, memory): every valid
  combination of {local, local_batched} x the three experts x reductions, fp8_block,
  models tiny (K 256, I 128, 128-aligned) and deepseek_v2_lite, at 1 token (most
  experts idle), below and at / above deepgemm_min_tokens (256: triton_or_deepgemm
  switches from Triton to DeepGEMM), uniform and zipf routing (cold experts);
* in-process: both grouped layouts of the contiguous GEMM (psum ends and per-row
  expert ids), an explicit routing that leaves experts without tokens, a bf16 input
  (a dispatch that cannot carry fp8), which implementation triton_or_deepgemm ran;
* memory: apply()'s allocator peak against its declared transient_bytes;
* CUDA graphs: capture + replay equals eager, and `runner.timing=graph` rows are ok.

Run: python3 -m pytest -m gpu tests/gpu/test_deepgemm.py --require deep_gemm
(with third_party/deepgemm_build on PYTHONPATH; without the library the tests
fail under --require and skip otherwise).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.needs("deep_gemm"),  # one GPU: the one-GPU suite's --require deep_gemm (tests/support/_require.py)
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOL = 6e-2  # fp8_block (docs/design.md)
MODELS = ("tiny", "deepseek_v2_lite")
MIN_TOKENS = 256  # experts.deepgemm_min_tokens (the default)
TOKENS = (1, 100, 256, 512)  # 1 / 100: Triton in triton_or_deepgemm; 256 / 512: DeepGEMM
DEV = torch.device("cuda", 0)


@pytest.fixture(scope="module", autouse=True)
def deep_gemm_here():
    """Skip without the library or off SM90: both failures under --require deep_gemm (the needs mark)."""
    from moebench.kernels.experts import _deep_gemm

    mod, reason = _deep_gemm.load()
    if mod is None:
        pytest.skip(reason)  # the reason names deep_gemm, so --require turns this into a failure
    reason = _deep_gemm.deepgemm_unsupported(
        {"quant": "fp8_block", "hidden": 2048, "intermediate": 1408, "device": "cuda"}
    )
    if reason:
        pytest.skip(reason)
    print(
        f"\ndeep_gemm {getattr(mod, '__version__', '?')} from {mod.__file__}, "
        f"mk alignment {mod.get_mk_alignment_for_contiguous_layout()}"
    )


# -- through moebench sweep ------------------------------------------------------


def _execute(overrides, out):
    from moebench.results.store import RunStore
    from moebench.run.sweep import execute

    run_dir, _ = execute(overrides, None, str(out), quiet=False)
    return RunStore(run_dir).load()


def _show(df):
    cols = [
        "backend",
        "experts",
        "reduction",
        "routing",
        "tokens_per_rank",
        "status",
        "rel_err",
        "experts_us",
        "workspace_bytes_peak",
        "analytic_peak_bytes",
        "reason",
    ]
    print(df[[c for c in cols if c in df.columns]].sort_values(cols[:5]).to_string(max_colwidth=60))


@pytest.mark.parametrize("model", MODELS)
def test_every_valid_combination_through_moebench(model, tmp_path):
    df = _execute(
        [
            "backend=local,local_batched",
            "experts=deepgemm,deepgemm_masked,triton_or_deepgemm",
            "reduction=experts,finalize",
            "overlap=none",
            "quant=fp8_block",
            f"model={model}",
            f"workload.tokens_per_rank=[{','.join(map(str, TOKENS))}]",
            "workload.routing=uniform,zipf",
            f"experts.deepgemm_min_tokens={MIN_TOKENS}",
            "runner.device=cuda",
            "runner.timing=events",
            "runner.reps=5",
            "runner.warmup=2",
            "runner.phase_reps=2",
            "runner.warmup_ms=0",
        ],
        tmp_path / model,
    )
    _show(df)
    ran = df[df.status != "skipped"]
    # local x {deepgemm, triton_or_deepgemm} x 2 reductions + local_batched x deepgemm_masked x finalize
    assert len(ran) == 5 * 2 * len(TOKENS), df[["backend", "experts", "reduction", "status", "reason"]].to_string()
    assert set(ran.status) == {"ok"}, ran[ran.status != "ok"][
        ["label", "tokens_per_rank", "status", "reason"]
    ].to_string()
    assert (ran.rel_err <= TOL).all()
    skipped = df[df.status == "skipped"]
    assert all(("layouts differ" in r) or ("reduction=finalize" in r) for r in skipped.reason), skipped.reason.unique()


def test_graph_timing_through_moebench(tmp_path):
    """runner.timing=graph captures the standard-layout experts (<= 256 tokens)."""
    df = _execute(
        [
            "backend=local",
            "experts=deepgemm,triton_or_deepgemm",
            "reduction=experts,finalize",
            "overlap=none",
            "quant=fp8_block",
            "model=deepseek_v2_lite",
            "workload.tokens_per_rank=[16,256]",
            "runner.device=cuda",
            "runner.timing=graph",
            "runner.reps=5",
            "runner.warmup=2",
            "runner.phase_reps=2",
        ],
        tmp_path / "graph",
    )
    _show(df)
    assert len(df) == 2 * 2 * 2 and set(df.status) == {"ok"}, df[["label", "status", "reason"]].to_string()
    assert set(df.timing_mode) == {"graph"}


# -- in-process ------------------------------------------------------------------


def build(model: str, backend: str, experts: str, reduction: str, min_tokens: int = MIN_TOKENS):
    """(ctx, kernel, reference weights fn) exactly as a moebench rank builds them."""
    from moebench.config import compose, validity
    from moebench.measure.layer import build_layer
    from moebench.measure.workload import reference_expert_fn

    cfg = compose.compose_config(
        [
            f"backend={backend}",
            f"experts={experts}",
            f"reduction={reduction}",
            "overlap=none",
            "quant=fp8_block",
            f"model={model}",
            f"experts.deepgemm_min_tokens={min_tokens}",
            "runner.device=cuda",
        ]
    )
    combo = compose.to_combo(cfg)
    assert validity.validate(combo) is None, validity.validate(combo)
    layer = build_layer(combo, 0, 1, None, DEV)
    ctx, kernel = layer.ctx, layer.kernel
    return ctx, kernel, reference_expert_fn(ctx.shape, ctx.quant, combo.seed, DEV)


def inputs(ctx, T, routing="uniform", seed=1):
    from moebench.measure.workload import make_inputs

    return make_inputs(ctx.shape, T, routing, 1.5, seed, 0, 1, DEV)


def check(ctx, kernel, ref_w, x, w, ids) -> float:
    from moebench.kernels.reference import reference_moe, rel_err

    shared = (kernel.shared.w13_NK.float(), kernel.shared.w2_KS.float()) if kernel.shared is not None else None
    y = kernel(x, w, ids)
    err = rel_err(y, reference_moe(x, w, ids, ref_w, None, shared))
    assert err <= TOL, err
    return err


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("psum", [True, False])
@pytest.mark.parametrize("reduction", ["experts", "finalize"])
def test_contiguous_both_grouped_layouts(model, psum, reduction):
    ctx, kernel, ref_w = build(model, "local", "deepgemm", reduction)
    kernel.experts.use_psum_layout = psum
    for T in (1, 37, 300):
        check(ctx, kernel, ref_w, *inputs(ctx, T))
    # every token on the same P experts: the others get no token (empty segments
    # before, between and after); 200 pairs per expert span two 128-row blocks
    x, w, _ = inputs(ctx, 200)
    P = ctx.shape.topk
    ids = torch.tensor([1, 4, 6, 9, 12, 20][:P], device=DEV).repeat(200, 1)
    check(ctx, kernel, ref_w, x, w, ids)


def test_contiguous_with_a_bf16_input():
    """Behind a dispatch that cannot carry fp8 (naive) the permute quantizes."""
    from moebench.kernels.interfaces import PreparedTokens
    from moebench.kernels.prepare_finalize._common import localize_ids
    from moebench.kernels.reference import reference_moe, rel_err

    ctx, kernel, ref_w = build("deepseek_v2_lite", "local", "deepgemm", "experts")
    ex, T = kernel.experts, 300
    x, w, ids = inputs(ctx, T)
    prepared = PreparedTokens(
        x=x, x_scale=None, topk_ids_MP=localize_ids(ids, 0, ctx.num_local_experts), topk_weights_MP=w
    )
    s = ctx.shape
    ws13, ws2, out = (
        torch.empty(sh, dtype=torch.bfloat16, device=DEV)
        for sh in ex.workspace_shapes(T, s.n, s.hidden, s.topk, ctx.num_local_experts)
    )
    ex.apply(out, prepared, ws13, ws2)
    assert rel_err(out, reference_moe(x, w, ids, ref_w)) <= TOL


@pytest.mark.parametrize("T", [1, 100, 128, 512])
def test_masked_padded_and_in_place(T):
    """X = T rows per expert: 1 / 100 go through the padded copy, 128 / 512 are used in place."""
    ctx, kernel, ref_w = build("deepseek_v2_lite", "local_batched", "deepgemm_masked", "finalize")
    check(ctx, kernel, ref_w, *inputs(ctx, T))
    x, w, _ = inputs(ctx, T)
    ids = torch.arange(ctx.shape.topk, device=DEV).repeat(T, 1)  # experts >= topk get no token
    check(ctx, kernel, ref_w, x, w, ids)


def test_triton_or_deepgemm_switches_at_the_threshold(monkeypatch):
    ctx, kernel, ref_w = build("deepseek_v2_lite", "local", "triton_or_deepgemm", "experts", min_tokens=64)
    ex = kernel.experts
    ran = []
    for name in ("deepgemm", "triton"):
        impl = getattr(ex, name)
        orig = impl.apply
        monkeypatch.setattr(impl, "apply", lambda *a, _o=orig, _n=name, **k: (ran.append(_n), _o(*a, **k))[1])
    for T in (63, 64):
        check(ctx, kernel, ref_w, *inputs(ctx, T))
    assert ran == ["triton", "deepgemm"]


# -- memory ----------------------------------------------------------------------


def _peak(fn) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


@pytest.mark.parametrize(
    "backend,experts,reduction,T",
    [
        ("local", "deepgemm", "experts", 16),
        ("local", "deepgemm", "finalize", 512),
        ("local_batched", "deepgemm_masked", "finalize", 100),
        ("local_batched", "deepgemm_masked", "finalize", 256),
    ],
)
def test_apply_allocates_what_it_declares(backend, experts, reduction, T):
    ctx, kernel, _ = build("deepseek_v2_lite", backend, experts, reduction)
    ex, pf = kernel.experts, kernel.pf
    x, w, ids = inputs(ctx, T)
    kernel(x, w, ids)  # compile first
    prepared = pf.prepare(x, w, ids, ex.input_quant)
    rows = prepared.x.shape[1] if ex.activation_format.value == "batched" else prepared.x.shape[0]
    s = ctx.shape
    dims = (rows, s.n, s.hidden, s.topk, ctx.num_local_experts)
    ws = [torch.empty(sh, dtype=torch.bfloat16, device=DEV) for sh in ex.workspace_shapes(*dims)]
    apply_peak = _peak(lambda: ex.apply(ws[2], prepared, ws[0], ws[1]))
    transient = ex.transient_bytes(*dims)
    total = sum(t.numel() * 2 for t in ws) + transient
    print(
        f"{experts} T={T}: apply peak {apply_peak} B, declared transient {transient} B, "
        f"workspaces {total - transient} B"
    )
    assert apply_peak <= transient, (apply_peak, transient)
    assert transient - apply_peak <= 0.05 * total, (apply_peak, transient, total)


# -- CUDA graphs -----------------------------------------------------------------


@pytest.mark.parametrize("experts,T", [("deepgemm", 16), ("deepgemm", 300), ("triton_or_deepgemm", 300)])
def test_graph_replay_equals_eager(experts, T):
    from moebench.kernels.reference import rel_err

    ctx, kernel, _ = build("deepseek_v2_lite", "local", experts, "experts")
    x, w, ids = inputs(ctx, T)
    eager = kernel(x, w, ids).clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        kernel(x, w, ids)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = kernel(x, w, ids)
    x2, w2, ids2 = inputs(ctx, T, seed=2)
    x.copy_(x2)
    w.copy_(w2)
    ids.copy_(ids2)
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(out, kernel(x, w, ids)) <= 1e-3  # replay on new inputs == eager on them
    assert rel_err(eager, out) > 1e-2  # and it did recompute
