"""pplx without pplx_kernels (CPU CI): the backend is registered, its module imports,
and supports() / planned rows say why it is disabled and how to get the library. With
the library 'present', supports() names the combination's own limits. The backend's
plumbing (layouts, fp8 scale padding, the send/receive split, the dispatch-then-combine
protocol, the per-group AllToAll cache, NVSHMEM init for internode) runs end to end on
2 gloo ranks over a CPU stand-in of pplx_kernels.AllToAll defined below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moebench.config import validity
from moebench.config.compose import compose_config, to_combo
from moebench.kernels import registry
from moebench.kernels.prepare_finalize import _pplx
from moebench.run import plan

SUPPORT = Path(__file__).resolve().parents[1] / "support"  # the helpers, by bare name
REPO = SUPPORT.parents[1]
COMBO = {
    "backend": "pplx",
    "experts": "triton_batched",
    "reduction": "finalize",
    "overlap": "none",
    "model": "deepseek_v2_lite",
    "hidden": 2048,
    "intermediate": 1408,
    "num_experts": 64,
    "topk": 6,
    "num_shared_experts": 2,
    "shared_intermediate": 1408,
    "quant": "bf16",
    "world_size": 2,
    "max_tokens_per_rank": 512,
    "device": "cuda",
    "pplx_mode": "intranode",
}


def planned(*overrides, **changes):
    """validity.validate on a deepseek_v2_lite pplx Combo on CUDA: the contract's rules beside the entry's."""
    cfg = compose_config(
        ["backend=pplx", "experts=triton_batched", "reduction=finalize", "model=deepseek_v2_lite", *overrides]
    )
    return validity.validate(to_combo(cfg, device="cuda").replace(**changes))


@pytest.fixture
def no_pplx(monkeypatch):
    """Hide pplx_kernels whether or not this machine has it."""
    monkeypatch.setitem(sys.modules, "pplx_kernels", None)
    _pplx.reset_import_cache()
    yield
    _pplx.reset_import_cache()


def test_module_imports_without_pplx_kernels():
    code = (
        "import sys; sys.modules['pplx_kernels'] = None\n"
        "from moebench.kernels.prepare_finalize import pplx as m\n"
        "from moebench.kernels.registry import BACKENDS\n"
        "assert BACKENDS['pplx'] is m.PplxPrepareFinalize\n"
        "print(m.PplxPrepareFinalize.supports({'device': 'cuda', 'world_size': 2}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "pplx_kernels is not installed" in out.stdout


def test_registered_and_reason_says_how_to_install(no_pplx):
    reason = registry.get_backend("pplx").supports(dict(COMBO))
    assert reason.startswith(
        "pplx_kernels is not installed: build it from github.com/ppl-ai/pplx-kernels "
        "(README: 'GPU machines and the optional libraries')"
    )
    with pytest.raises(ImportError, match="github.com/ppl-ai/pplx-kernels"):
        _pplx.require()


def test_a_library_that_failed_to_load_counts_as_missing(monkeypatch):
    """pplx_kernels' ops.py swallows a failed load of libpplx_kernels.so (empty `_ops`)."""
    import types

    fake = types.ModuleType("pplx_kernels")
    fake.ops = types.SimpleNamespace(_ops=types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "pplx_kernels", fake)
    _pplx.reset_import_cache()
    try:
        assert "libpplx_kernels.so did not load" in _pplx.unavailable_reason()
    finally:
        _pplx.reset_import_cache()


def test_planned_rows_are_skipped_with_how_to_install(no_pplx):
    combos, _ = plan.plan(
        [
            "backend=pplx",
            "experts=triton_batched,torch_batched",
            "reduction=finalize",
            "overlap=none,dispatch,combine",
            "quant=bf16,fp8_block",
            "model=deepseek_v2_lite",
            "runner.device=cuda",
        ],
        None,
    )
    assert len(combos) == 12
    for c in combos:
        assert "pplx_kernels is not installed" in c.reason and "github.com/ppl-ai/pplx-kernels" in c.reason
        assert c.family[2] == "pplx"  # NVSHMEM backends never share a process with another backend


def test_structural_reasons_when_library_present(monkeypatch):
    monkeypatch.setattr(_pplx, "unavailable_reason", lambda: None)
    cls = registry.get_backend("pplx")
    for quant in ("bf16", "fp8_block", "fp8_tensor"):
        assert cls.supports(dict(COMBO, quant=quant)) is None
    assert cls.supports(dict(COMBO, hidden=7168, num_experts=256, topk=8)) is None  # deepseek_v3
    assert cls.supports(dict(COMBO, pplx_mode="internode")) is None
    assert "CUDA" in cls.supports(dict(COMBO, device="cpu"))
    assert "world_size >= 2" in planned(world_size=1)  # the contract's rules, not the entry's
    assert "does not divide" in planned(world_size=3)
    assert "reduction=finalize" in planned(reduction="experts")
    assert "multiples of 128" in planned(quant="fp8_block", hidden=2048 + 64)
    assert "backend.pplx_mode=" in cls.supports(dict(COMBO, pplx_mode="nvlink"))
    with pytest.raises(ValueError, match="backend.pplx_mode='nvlink'; valid: intranode, internode"):
        plan.plan(["backend=pplx", "experts=triton_batched", "backend.pplx_mode=nvlink"], None)  # before any work
    assert "16-byte" in cls.supports(dict(COMBO, hidden=2044))
    assert "48 KiB" in cls.supports(dict(COMBO, hidden=32768))  # a 64 KiB bf16 row
    assert cls.supports(dict(COMBO, hidden=32768, quant="fp8_block")) is None  # fp8 rows are half
    assert cls.supports(dict(COMBO, hidden=32768, pplx_mode="internode")) is None


def test_layout_rules_in_plan(monkeypatch):
    from batched_rules import check_batched_layout_rules

    monkeypatch.setattr(_pplx, "unavailable_reason", lambda: None)
    check_batched_layout_rules("pplx", "deepseek_v2_lite")
    cfg = compose_config(
        [
            "backend=pplx",
            "experts=triton_batched",
            "reduction=finalize",
            "model=deepseek_v2_lite",
            "runner.timing=graph",
        ]
    )
    combo = to_combo(cfg, device="cuda")
    assert validity.check_tokens(combo, 128) is None  # pplx may be captured in a CUDA graph
    assert "max_tokens_per_rank=512" in validity.check_tokens(combo, 513).reason


def test_sizes():
    from moebench.kernels.prepare_finalize.pplx import _dispatch_format

    assert _dispatch_format(2048, "bf16") == (4096, 0, 0)
    assert _dispatch_format(2048, "fp8_block") == (2048, 64, 16)
    assert _dispatch_format(256, "fp8_block") == (256, 16, 4)  # 2 scales padded to 16 bytes
    assert _dispatch_format(7168, "fp8_block") == (7168, 224, 56)
    spec = _pplx.A2ASpec("intranode", 512, 64, 6, 0, 2, 2048, 4096, 0)
    # per peer: counters (16 + 32 local experts x 4) + 512 x 32 x max(4112-byte rows, 8 KiB fp32 rows)
    assert spec.token_stride == 4112
    assert spec.buffer_bytes() == 2 * (16 + 128 + 512 * 32 * 2048 * 4) + 6 * 32 * 2 * 512 * 4
    assert spec.nvshmem_bytes() == 0
    inter = _pplx.A2ASpec("internode", 512, 64, 6, 0, 2, 2048, 4096, 0)
    batch = 32 * 2 * 512
    assert inter.nvshmem_bytes() == 8 * (2 * 64 + 512 + 2) + (512 + batch) * 4112 + batch * 8192 + 512 * 64 * 8192
    assert _pplx._parse_size("2G") == 2 << 30 and _pplx._parse_size("1073741824") == 1 << 30


# ---------------------------------------------------------------------------
# A CPU stand-in of pplx_kernels over the default (gloo) process group: the same
# arguments, layouts and send/receive split as csrc/bindings/all_to_all_ops.cpp,
# and it refuses what the real kernels would hang or corrupt memory on.


class StandinAllToAll:
    created = 0

    def __init__(
        self,
        mode,
        max_num_tokens,
        num_experts,
        experts_per_token,
        rank,
        world_size,
        dp_size,
        hidden_dim,
        hidden_dim_bytes,
        hidden_dim_scale_bytes,
    ):
        assert world_size % dp_size == 0 and world_size // dp_size > 1
        assert hidden_dim_bytes % 16 == 0 and hidden_dim_scale_bytes % 16 == 0, "pplx: 16-byte multiples"
        assert hidden_dim_scale_bytes <= hidden_dim_bytes
        self.mode, self.T, self.E, self.P = mode, max_num_tokens, num_experts, experts_per_token
        self.rank, self.W, self.K = rank, world_size, hidden_dim
        self.row_bytes, self.scale_bytes = hidden_dim_bytes, hidden_dim_scale_bytes
        self.El = num_experts // world_size
        self.state = "idle"
        self._ptr = 1
        type(self).created += 1

    @classmethod
    def intranode(cls, group_name="default", **kw):
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _resolve_process_group

        pg = _resolve_process_group(group_name)
        # the IPC handles travel as CPU tensors: the group must run gloo
        assert dist.get_backend(pg) == "gloo", dist.get_backend(pg)
        return cls("intranode", **kw)

    @classmethod
    def internode(cls, **kw):
        assert STANDIN_NVSHMEM["initialized"], "internode AllToAll before nvshmem_init"
        return cls("internode", **kw)

    def destroy(self):
        assert self.state == "idle", f"destroyed while {self.state}"
        self._ptr = None

    def dispatch(
        self,
        out_expert_num_tokens,
        out_expert_x,
        out_expert_x_scale,
        dp_x,
        dp_x_scale,
        indices,
        bound_m,
        do_send=True,
        do_recv=True,
    ):
        import torch.distributed as dist

        assert self._ptr is not None
        has = self.scale_bytes > 0
        assert (out_expert_x_scale is not None) == has and (dp_x_scale is not None) == has
        T = dp_x.shape[0]
        assert indices.dtype == torch.uint32 and indices.is_contiguous() and tuple(indices.shape) == (T, self.P)
        assert T <= self.T and dp_x.is_contiguous() and dp_x.shape[1] * dp_x.element_size() == self.row_bytes
        assert out_expert_x.is_contiguous() and out_expert_x.dim() == 3 and out_expert_x.shape[0] == self.El
        assert out_expert_num_tokens.dtype == torch.int32 and out_expert_num_tokens.shape == (self.El,)
        gp = self.scale_bytes // 4
        if has:
            # the kernels copy gp floats a row on both sides
            assert dp_x_scale.dtype == torch.float32 and tuple(dp_x_scale.shape) == (T, gp)
            assert out_expert_x_scale.dim() == 3 and out_expert_x_scale.shape[2] >= gp
        if do_send:
            assert self.state == "idle", f"dispatch while {self.state}: a dispatch must be followed by a combine"
            pad = torch.zeros(self.T, self.row_bytes, dtype=torch.uint8)
            pad[:T] = dp_x.view(torch.uint8).reshape(T, -1)
            ids = torch.full((self.T, self.P), -1, dtype=torch.int64)
            ids[:T] = indices.view(torch.int32).long()
            sc = torch.zeros(self.T, max(gp, 1))
            if has:
                sc[:T] = dp_x_scale
            got = {}
            for name, t in (("x", pad), ("ids", ids), ("scale", sc)):
                parts = [torch.empty_like(t) for _ in range(self.W)]
                dist.all_gather(parts, t)
                got[name] = parts
            self.sent = got
            self.state = "sent"
        if do_recv:
            assert self.state == "sent", f"dispatch receive while {self.state}"
            got, X = self.sent, out_expert_x.shape[1]
            x_bytes = out_expert_x.view(torch.uint8).reshape(self.El, X, -1)
            counts = [0] * self.El
            self.slots = []  # (local expert, slot, source rank, token, k)
            for r in range(self.W):
                for t in range(self.T):
                    for k in range(self.P):
                        e = int(got["ids"][r][t, k]) - self.rank * self.El
                        if not 0 <= e < self.El:
                            continue
                        s = counts[e]
                        assert s < X, "expert rows overflow"
                        x_bytes[e, s] = got["x"][r][t]
                        if has:
                            out_expert_x_scale[e, s, :gp] = got["scale"][r][t, :gp]
                        self.slots.append((e, s, r, t, k))
                        counts[e] += 1
            out_expert_num_tokens.copy_(torch.tensor(counts, dtype=torch.int32))
            self.state = "dispatched"

    def combine(self, out_tokens, indices, weights, expert_y, bound_m, do_send=True, do_recv=True):
        import torch.distributed as dist

        assert self._ptr is not None
        T = out_tokens.shape[0]
        assert indices.dtype == torch.uint32 and indices.is_contiguous() and tuple(indices.shape) == (T, self.P)
        assert weights.dtype == torch.float32 and weights.is_contiguous() and tuple(weights.shape) == (T, self.P)
        assert expert_y.is_contiguous() and expert_y.dtype in (torch.bfloat16, torch.float16, torch.float32)
        assert out_tokens.is_contiguous() and out_tokens.dtype in (torch.bfloat16, torch.float16)
        if do_send:
            assert self.state == "dispatched", f"combine while {self.state}"
            rows = torch.zeros(self.W, self.T, self.P, self.K)
            for e, s, r, t, k in self.slots:
                rows[r, t, k] = expert_y[e, s].float()
            dist.all_reduce(rows)
            self.back = rows[self.rank]
            self.state = "combining"
        if do_recv:
            assert self.state == "combining", f"combine receive while {self.state}"
            out = (self.back[:T] * weights.unsqueeze(-1)).sum(dim=1)
            out_tokens.copy_(out)
            self.state = "idle"


STANDIN_NVSHMEM = {"initialized": False, "inits": 0, "finalized": 0}


def _standin_module():
    """A `pplx_kernels` module object made of the stand-in."""
    import types

    m = types.ModuleType("pplx_kernels")
    m.AllToAll = StandinAllToAll
    m.ops = types.SimpleNamespace(_ops=types.SimpleNamespace(all_to_all_intranode_create=None))
    m.nvshmem_get_unique_id = lambda: torch.arange(128, dtype=torch.uint8)
    m.nvshmem_alloc_empty_unique_id = lambda: torch.zeros(128, dtype=torch.uint8)

    def init(uid, rank, world_size):
        assert torch.equal(uid, torch.arange(128, dtype=torch.uint8)), "unique id not broadcast from rank 0"
        assert "NVSHMEM_SYMMETRIC_SIZE" in os.environ
        STANDIN_NVSHMEM.update(initialized=True, inits=STANDIN_NVSHMEM["inits"] + 1, rank=rank)
        return 0

    def finalize():
        STANDIN_NVSHMEM.update(initialized=False, finalized=STANDIN_NVSHMEM["finalized"] + 1)

    m.nvshmem_init, m.nvshmem_finalize = init, finalize
    m.nvshmem_my_pe = lambda: STANDIN_NVSHMEM["rank"]
    return m


STANDIN_QUANTS = ("bf16", "fp8_block", "fp8_tensor")
STANDIN_TOKENS = (1, 7, 16)  # 16 = the cap
STANDIN_CAP = 16


def _standin_rank(rank: int, port: int, out_dir: str) -> None:
    """One rank: MoEKernel(pplx, torch_batched, shared experts) against the fp32 reference,
    plus what the backend hands over, for every mode x quant x tokens x overlap."""
    import torch.distributed as dist

    sys.modules["pplx_kernels"] = _standin_module()
    from moebench.kernels.experts.torch_batched import TorchBatchedExperts
    from moebench.kernels.interfaces import Delegate, KernelContext, LayerShape, NoOp, QuantSpec
    from moebench.kernels.modular import MoEKernel
    from moebench.kernels.prepare_finalize import _pplx as P
    from moebench.kernels.prepare_finalize.pplx import PplxPrepareFinalize
    from moebench.kernels.reference import reference_moe, rel_err
    from moebench.measure.workload import build_expert_weights, build_shared, make_inputs, reference_expert_fn

    torch.set_num_threads(1)
    os.environ.pop("NVSHMEM_SYMMETRIC_SIZE", None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    P.reset_import_cache()
    assert P.unavailable_reason() is None
    rows, dev, seed, R = [], torch.device("cpu"), 3, 2
    # hidden 256: two 1x128 scale groups a row, padded to four (16 bytes) for pplx
    shape = LayerShape(
        hidden=256, intermediate=128, num_experts=8, topk=3, num_shared_experts=1, shared_intermediate=128
    )
    shared = build_shared(shape, seed, dev)
    shared_ref = (shared.w13_NK.float(), shared.w2_KS.float())
    try:
        for mode in ("intranode", "internode"):
            for qname in STANDIN_QUANTS:
                quant = QuantSpec(qname)
                ctx = KernelContext(
                    shape=shape,
                    quant=quant,
                    device=dev,
                    rank=rank,
                    world_size=R,
                    group=dist.group.WORLD,
                    max_tokens_per_rank=STANDIN_CAP,
                    options={"pplx_mode": mode},
                )
                experts = TorchBatchedExperts(build_expert_weights(ctx, seed), "finalize", ctx)
                ref_w = reference_expert_fn(shape, quant, seed, dev)
                E, K, X = ctx.num_local_experts, shape.hidden, R * STANDIN_CAP
                block = quant.is_block
                for T in STANDIN_TOKENS:
                    x, w, ids = make_inputs(shape, T, "uniform", 1.2, seed, rank, 1, dev)
                    ref = reference_moe(x, w, ids, ref_w, None, shared_ref)
                    pf = PplxPrepareFinalize(ctx)
                    all_ids = [torch.zeros_like(ids) for _ in range(R)]
                    dist.all_gather(all_ids, ids)
                    per_expert = [int(sum(((a - rank * E) == e).sum() for a in all_ids)) for e in range(E)]
                    to_self = int((ids // E == rank).sum())
                    pairs_in = sum(per_expert) - to_self
                    pairs_out = ids.numel() - to_self
                    row = (K + 16 + 4) if block else (2 * K + 4)
                    # a prepare with no finalize (as the harness's accounting does): the next
                    # dispatch must settle it first
                    pf.prepare(x, w, ids, experts.input_quant)
                    prep = pf.prepare(x, w, ids, experts.input_quant)
                    checks = {
                        "x": tuple(prep.x.shape) == (E, X, K)
                        and prep.x.dtype == (torch.float8_e4m3fn if block else torch.bfloat16),
                        "scale": (prep.x_scale is None) != block
                        and (not block or tuple(prep.x_scale.shape) == (E, X, K // 128)),
                        "counts": prep.expert_num_tokens_E.dtype == torch.int32
                        and prep.expert_num_tokens_E.tolist() == per_expert,
                        "max_rows": pf.max_rows(T) == X,
                        "comm_bytes": pf.comm_bytes(T, prep) == (pairs_out + pairs_in) * (row + 2 * K),
                    }
                    # identity experts: the combine gives back x * sum of the token's weights (= 1)
                    ident = prep.x.float()
                    if block:
                        ident = ident * prep.x_scale.float().repeat_interleave(128, dim=2)
                    out = torch.empty_like(x)
                    try:
                        pf.finalize(out, ident.to(torch.bfloat16), prep, NoOp())
                        checks["refuses_noop"] = False
                    except ValueError:
                        checks["refuses_noop"] = True
                    pf.finalize(out, ident.to(torch.bfloat16), prep, Delegate())
                    checks["combine_identity"] = rel_err(out, x.float()) < (6e-2 if block else 1e-2)
                    pf.close()
                    for ov in ("none", "dispatch", "combine"):
                        kernel = MoEKernel(PplxPrepareFinalize(ctx), experts, shared, overlap=ov)
                        errs = [rel_err(kernel(x, w, ids), ref) for _ in range(2)]  # reuse: workspaces, AllToAll
                        kernel.close()
                        rows.append(
                            dict(mode=mode, quant=qname, tokens=T, overlap=ov, rel_err=max(errs), checks=checks)
                        )
        rows.append(dict(cached=P.cached_count(), created=StandinAllToAll.created, nvshmem=dict(STANDIN_NVSHMEM)))
    finally:
        P.release_group(dist.group.WORLD)
        rows.append(dict(after_release=P.cached_count(), nvshmem_after=P.nvshmem_initialized()))
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(rows, f, default=str)


def _standin_job(out_dir: str) -> None:
    import torch.multiprocessing as mp

    from moebench.run.launch import free_port

    mp.spawn(_standin_rank, args=(free_port(), out_dir), nprocs=2, join=True)


@pytest.mark.multiprocess
def test_plumbing_over_a_cpu_standin(tmp_path):
    """pplx + torch_batched + shared experts, intranode and internode, every quant x
    overlap, match the reference on 2 gloo ranks over the stand-in above."""
    code = (
        f"import sys; sys.path[:0] = [{str(SUPPORT)!r}, {str(REPO)!r}]\n"
        "import tests.kernels.test_pplx_skip as t\n"
        f"t._standin_job({str(tmp_path)!r})\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SUPPORT), str(REPO)]))
    env.pop("NVSHMEM_SYMMETRIC_SIZE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    per_rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    from moebench.kernels.reference import TOLERANCE as tol

    for r, rows in enumerate(per_rank):
        *cases, tail, released = rows
        assert len(cases) == 2 * len(STANDIN_QUANTS) * len(STANDIN_TOKENS) * 3
        # one AllToAll per group: a new one per (mode, dispatched format); bf16 and
        # fp8_tensor rows share one; NVSHMEM initialised once, for internode only
        assert tail["cached"] == 1 and tail["created"] == 2 * 3, tail
        assert tail["nvshmem"]["inits"] == 1 and tail["nvshmem"]["finalized"] == 0, tail
        assert released == {"after_release": 0, "nvshmem_after": False}, released
        for c in cases:
            bad = sorted(k for k, v in c["checks"].items() if not v)
            assert not bad, (r, c)
            assert c["rel_err"] <= tol[c["quant"]], (r, c)
