"""DeepEP backends without deep_ep (CPU CI): deepep_ht and deepep_ll are
registered, their modules import, and supports() says why they are disabled and
how to install DeepEP. With the library 'present', each says which of the
combination's own limits it breaks. deepep_ll's buffer rules (one NVSHMEM buffer
per process, one process group per buffer shape) are checked on stubs, and its
plumbing runs end to end on 2 gloo ranks over a CPU stand-in of DeepEP's
low-latency API (tests/support/deepep_ll_standin.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moebench.config import validity
from moebench.config.compose import compose_config, to_combo
from moebench.kernels import registry
from moebench.kernels.prepare_finalize import _deepep
from moebench.run import plan

COMBO = {
    "backend": "deepep_ht",
    "experts": "torch",
    "reduction": "finalize",
    "overlap": "none",
    "model": "deepseek_v3",
    "hidden": 7168,
    "intermediate": 2048,
    "num_experts": 256,
    "topk": 8,
    "num_shared_experts": 1,
    "shared_intermediate": 2048,
    "quant": "bf16",
    "world_size": 2,
    "num_sms": 24,
    "device": "cuda",
}
LL_COMBO = dict(COMBO, backend="deepep_ll", experts="triton_batched", max_tokens_per_rank=512)
SUPPORT = Path(__file__).resolve().parents[1] / "support"  # the helpers, by bare name


def planned(backend="deepep_ht", experts="torch", **changes):
    """validity.validate on a deepseek_v3 Combo on CUDA: the contract's rules beside the entry's."""
    cfg = compose_config([f"backend={backend}", f"experts={experts}", "reduction=finalize", "model=deepseek_v3"])
    return validity.validate(to_combo(cfg, device="cuda").replace(**changes))


REPO = SUPPORT.parents[1]


@pytest.fixture
def no_deep_ep(monkeypatch):
    """Hide deep_ep whether or not this machine has it (None in sys.modules
    makes `import deep_ep` raise ImportError)."""
    monkeypatch.setitem(sys.modules, "deep_ep", None)
    _deepep.reset_import_cache()
    yield
    _deepep.reset_import_cache()


@pytest.mark.parametrize(
    "backend, module, cls",
    [
        ("deepep_ht", "deepep_ht", "DeepEPHTPrepareFinalize"),
        ("deepep_ll", "deepep_ll", "DeepEPLLPrepareFinalize"),
    ],
)
def test_module_imports_without_deep_ep(backend, module, cls):
    """A fresh interpreter where `import deep_ep` fails still imports the backend."""
    code = (
        "import sys; sys.modules['deep_ep'] = None; sys.modules['deep_ep_cpp'] = None\n"
        f"from moebench.kernels.prepare_finalize import {module} as m\n"
        "from moebench.kernels.registry import BACKENDS\n"
        f"assert BACKENDS['{backend}'] is m.{cls}\n"
        f"print(m.{cls}.supports({{'device': 'cuda', 'world_size': 2}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "deep_ep is not installed" in out.stdout


@pytest.mark.parametrize("backend", ["deepep_ht", "deepep_ll"])
def test_registered_and_reason_says_how_to_install(no_deep_ep, backend):
    cls = registry.get_backend(backend)
    reason = cls.supports(dict(COMBO, backend=backend))
    assert reason is not None
    assert "deep_ep is not installed" in reason
    assert "github.com/deepseek-ai/DeepEP" in reason and "v1.2.1" in reason and "NVSHMEM" in reason


def test_planned_deepep_ll_rows_are_skipped_with_how_to_install(no_deep_ep):
    combos, _ = plan.plan(
        [
            "backend=deepep_ll",
            "experts=triton_batched,torch_batched",
            "reduction=finalize",
            "overlap=none",
            "quant=bf16",
            "model=deepseek_v3",
        ],
        None,
    )
    assert len(combos) == 2
    assert all("deep_ep is not installed" in c.reason and "v1.2.1" in c.reason for c in combos)


def test_require_raises_with_hint(no_deep_ep):
    with pytest.raises(ImportError, match="DeepEP v1.2.1"):
        _deepep.require()


def test_structural_reasons_when_library_present(monkeypatch):
    """With the library 'present', the combo's own limits give the reasons."""
    monkeypatch.setattr(_deepep, "unavailable_reason", lambda: None)
    cls = registry.get_backend("deepep_ht")
    assert cls.supports(dict(COMBO)) is None
    assert "CUDA" in cls.supports(dict(COMBO, device="cpu"))
    assert "world_size >= 2" in planned(world_size=1)  # the contract's rule, not the entry's
    assert "intranode" in cls.supports(dict(COMBO, world_size=16))
    assert "top-k" in cls.supports(dict(COMBO, topk=40))
    assert "multiples of 128" in planned(quant="fp8_block", hidden=7168 + 64)
    assert "bytes" in cls.supports(dict(COMBO, hidden=8192))  # 16 KiB bf16 rows exceed the TMA stage
    assert cls.supports(dict(COMBO, hidden=8192, quant="fp8_block")) is None  # fp8 rows are half
    assert "even" in cls.supports(dict(COMBO, num_sms=23))
    assert cls.supports(dict(COMBO, combine_nvl_chunk=4, dispatch_nvl_chunk=8)) is None
    assert "receive buffer holds 256" in cls.supports(dict(COMBO, combine_nvl_chunk=256))


def test_deepep_ll_structural_reasons_when_library_present(monkeypatch):
    monkeypatch.setattr(_deepep, "unavailable_reason", lambda: None)
    cls = registry.get_backend("deepep_ll")
    assert cls.supports(dict(LL_COMBO)) is None
    for quant in ("bf16", "fp8_block", "fp8_tensor"):
        assert cls.supports(dict(LL_COMBO, quant=quant)) is None
    assert cls.supports(dict(LL_COMBO, hidden=2048, num_experts=64, topk=6)) is None  # deepseek_v2_lite
    assert cls.supports(dict(LL_COMBO, world_size=8)) is None
    assert cls.supports(dict(LL_COMBO, world_size=16)) is None
    assert "CUDA" in cls.supports(dict(LL_COMBO, device="cpu"))
    assert "world_size >= 2" in planned("deepep_ll", "triton_batched", world_size=1)
    assert "multiple of 8" in cls.supports(dict(LL_COMBO, world_size=12))
    assert "does not divide" in planned("deepep_ll", "triton_batched", world_size=6)
    assert "hidden" in cls.supports(dict(LL_COMBO, hidden=2880))  # gpt_oss_120b
    assert "hidden" in cls.supports(dict(LL_COMBO, hidden=256))  # tiny
    assert "top-k <= 11" in cls.supports(dict(LL_COMBO, topk=12))
    assert "multiple of 4" in cls.supports(dict(LL_COMBO, max_tokens_per_rank=3))


def test_deepep_ll_layout_rules_in_plan(monkeypatch):
    from batched_rules import check_batched_layout_rules

    monkeypatch.setattr(_deepep, "unavailable_reason", lambda: None)
    check_batched_layout_rules("deepep_ll", "deepseek_v3")


def test_deepep_ll_graph_capture_is_declared():
    from moebench.kernels.prepare_finalize.deepep_ht import DeepEPHTPrepareFinalize
    from moebench.kernels.prepare_finalize.deepep_ll import DeepEPLLPrepareFinalize

    assert DeepEPLLPrepareFinalize.graph_capturable  # no host sync: vLLM / SGLang capture it
    assert not DeepEPHTPrepareFinalize.graph_capturable
    cfg = compose_config(
        [
            "backend=deepep_ll",
            "experts=triton_batched",
            "reduction=finalize",
            "model=deepseek_v3",
            "runner.timing=graph",
        ]
    )
    combo = to_combo(cfg, device="cuda")
    assert validity.check_tokens(combo, 128) is None
    assert "max_tokens_per_rank=512" in validity.check_tokens(combo, 513).reason


# ---------------------------------------------------------------------------
# process families: NVSHMEM initialises once per process


def _families(overrides):
    combos, _ = plan.plan([*overrides, "runner.device=cpu"], None)  # families do not depend on validity
    return {
        (c.combo["backend"], c.combo["model"], c.combo["experts"], c.combo["quant"], c.combo["overlap"]): c.family
        for c in combos
    }


def test_deepep_ll_gets_one_process_group_per_buffer_shape():
    fam = _families(
        [
            "backend=deepep_ll,deepep_ht",
            "experts=triton_batched,torch_batched",
            "reduction=finalize",
            "overlap=none,combine",
            "quant=bf16,fp8_block",
            "model=deepseek_v2_lite,deepseek_v3",
        ]
    )
    ll = {k: v for k, v in fam.items() if k[0] == "deepep_ll"}
    ht = {k: v for k, v in fam.items() if k[0] == "deepep_ht"}
    # one family per model (buffer shape), shared by every experts / quant / overlap of it
    assert len(set(ll.values())) == 2
    assert len({v for k, v in ll.items() if k[1] == "deepseek_v3"}) == 1
    # never with the HT buffer (or any other backend) in one process
    assert not set(ll.values()) & set(ht.values())
    (v3,) = {v for k, v in ll.items() if k[1] == "deepseek_v3"}
    assert v3[2:] == ("nvshmem", 7168, 256, 512)
    # another token cap is another buffer shape
    capped = _families(
        [
            "backend=deepep_ll",
            "experts=triton_batched",
            "reduction=finalize",
            "overlap=none",
            "quant=bf16",
            "model=deepseek_v3",
            "backend.max_tokens_per_rank=128",
        ]
    )
    assert set(capped.values()) != {v3}


class _StubGroup:
    def __init__(self, size=2, rank=0):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


class _StubDeepEP:
    """Records Buffer constructions (what get_ll_buffer passes)."""

    class Buffer:
        made: list = []

        def __init__(
            self,
            group,
            num_nvl_bytes=0,
            num_rdma_bytes=0,
            low_latency_mode=False,
            num_qps_per_rank=24,
            allow_nvlink_for_low_latency_mode=True,
            allow_mnnvl=False,
            explicitly_destroy=False,
            comm=None,
        ):
            self.args = dict(
                num_nvl_bytes=num_nvl_bytes,
                num_rdma_bytes=num_rdma_bytes,
                low_latency_mode=low_latency_mode,
                num_qps_per_rank=num_qps_per_rank,
                allow_nvlink=allow_nvlink_for_low_latency_mode,
                explicitly_destroy=explicitly_destroy,
            )
            self.destroyed = False
            type(self).made.append(self)

        @staticmethod
        def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
            return 128 * num_max_dispatch_tokens_per_rank * hidden * num_experts

        def destroy(self):
            self.destroyed = True


@pytest.fixture
def stub_ll(monkeypatch):
    _StubDeepEP.Buffer.made = []
    monkeypatch.setattr(_deepep, "require", lambda: _StubDeepEP)
    monkeypatch.setattr(_deepep, "_LL", None)
    monkeypatch.setattr(_deepep, "_LL_DESTROYED", False)
    return _StubDeepEP


def test_ll_buffer_is_one_per_process(stub_ll):
    g = _StubGroup()
    a = _deepep.get_ll_buffer(g, 512, 7168, 256)
    assert _deepep.get_ll_buffer(g, 512, 7168, 256) is a  # cached: every combination of the shape shares it
    (buf,) = stub_ll.Buffer.made
    assert buf.args == dict(
        num_nvl_bytes=0,
        num_rdma_bytes=128 * 512 * 7168 * 256,
        low_latency_mode=True,
        num_qps_per_rank=128,
        allow_nvlink=True,
        explicitly_destroy=True,
    )
    assert _deepep.cached_buffer_count() == 1
    with pytest.raises(RuntimeError, match="NVSHMEM"):
        _deepep.get_ll_buffer(g, 512, 2048, 64)  # another shape in the same process
    with pytest.raises(RuntimeError, match="NVSHMEM"):
        _deepep.get_ll_buffer(_StubGroup(), 512, 7168, 256)  # another group
    assert _deepep.release_buffers(g, kind="ht") == 0  # the HT cache leaves it alone
    assert _deepep.release_buffers(g) == 1 and buf.destroyed
    assert _deepep.cached_buffer_count() == 0
    with pytest.raises(RuntimeError, match="new process"):
        _deepep.get_ll_buffer(g, 512, 7168, 256)  # NVSHMEM was finalised
    assert len(stub_ll.Buffer.made) == 1


# ---------------------------------------------------------------------------
# deepep_ll's plumbing end to end over the CPU stand-in (2 gloo ranks)

STANDIN_QUANTS = ("bf16", "fp8_block", "fp8_tensor")
STANDIN_TOKENS = (1, 7, 16)  # 16 = the cap
STANDIN_CAP = 16


def _standin_rank(rank: int, port: int, out_dir: str) -> None:
    """One rank: MoEKernel(deepep_ll, torch_batched, shared experts) against the
    fp32 reference, plus what the backend hands over, for every quant x tokens x overlap."""
    import torch
    import torch.distributed as dist

    from moebench.kernels.experts.torch_batched import TorchBatchedExperts
    from moebench.kernels.interfaces import Delegate, KernelContext, LayerShape, NoOp, QuantSpec
    from moebench.kernels.modular import MoEKernel
    from moebench.kernels.prepare_finalize.deepep_ll import DeepEPLLPrepareFinalize, dispatch_msg_bytes
    from moebench.kernels.reference import reference_moe, rel_err
    from moebench.measure.workload import build_expert_weights, build_shared, make_inputs, reference_expert_fn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    import deep_ep

    assert hasattr(deep_ep.Buffer, "created"), "expected the stand-in, not a real DeepEP"
    rows, dev, seed = [], torch.device("cpu"), 3
    shape = LayerShape(
        hidden=512, intermediate=128, num_experts=8, topk=3, num_shared_experts=1, shared_intermediate=128
    )
    shared = build_shared(shape, seed, dev)
    shared_ref = (shared.w13_NK.float(), shared.w2_KS.float())
    try:
        for qname in STANDIN_QUANTS:
            quant = QuantSpec(qname)
            ctx = KernelContext(
                shape=shape,
                quant=quant,
                device=dev,
                rank=rank,
                world_size=2,
                group=dist.group.WORLD,
                max_tokens_per_rank=STANDIN_CAP,
            )
            experts = TorchBatchedExperts(build_expert_weights(ctx, seed), "finalize", ctx)
            ref_w = reference_expert_fn(shape, quant, seed, dev)
            E, R, K, X = ctx.num_local_experts, 2, shape.hidden, 2 * STANDIN_CAP
            for T in STANDIN_TOKENS:
                x, w, ids = make_inputs(shape, T, "uniform", 1.2, seed, rank, 1, dev)
                ref = reference_moe(x, w, ids, ref_w, None, shared_ref)
                pf = DeepEPLLPrepareFinalize(ctx)
                fp8 = quant.is_block
                prep = pf.prepare(x, w, ids, experts.input_quant)
                # independent counts: every rank's ids
                all_ids = [torch.zeros_like(ids) for _ in range(R)]
                dist.all_gather(all_ids, ids)
                mine = torch.stack([(a // E == rank) & (a >= 0) for a in all_ids])  # [R, T, P]
                per_expert = [int(sum(((a - rank * E) == e).sum() for a in all_ids)) for e in range(E)]
                pairs_in = int(mine.sum() - mine[rank].sum())
                pairs_out = int(((ids >= 0) & (ids // E != rank)).sum())
                checks = {
                    "x": tuple(prep.x.shape) == (E, X, K)
                    and prep.x.dtype == (torch.float8_e4m3fn if fp8 else torch.bfloat16),
                    "scale": (prep.x_scale is None) != fp8
                    and (
                        not fp8
                        or (tuple(prep.x_scale.shape) == (E, X, K // 128) and prep.x_scale.stride()[1:] == (1, X))
                    ),
                    "counts": prep.expert_num_tokens_E.dtype == torch.int32
                    and prep.expert_num_tokens_E.tolist() == per_expert,
                    "max_rows": pf.max_rows(T) == X,
                    "comm_bytes": pf.comm_bytes(T, prep)
                    == (pairs_out + pairs_in) * (dispatch_msg_bytes(K, fp8) + 2 * K),
                    "prepared_bytes": pf.prepared_bytes(T, experts.input_quant)
                    == prep.x.numel() * prep.x.element_size()
                    + (prep.x_scale.numel() * 4 if fp8 else 0)
                    + E * X * 4
                    + E * R * 8
                    + E * 4,
                }
                # identity experts: the combine gives back x * sum of the token's weights (= 1)
                ident = prep.x.float()
                if fp8:
                    ident = ident * prep.x_scale.float().repeat_interleave(128, dim=2)
                out = torch.empty_like(x)
                pf.finalize(out, ident.to(torch.bfloat16), prep, Delegate())
                checks["combine_identity"] = rel_err(out, x.float()) < (1e-2 if not fp8 else 6e-2)
                try:
                    pf.finalize(out, ident.to(torch.bfloat16), prep, NoOp())
                    checks["refuses_noop"] = False
                except ValueError:
                    checks["refuses_noop"] = True
                for ov in ("none", "dispatch", "combine"):
                    kernel = MoEKernel(DeepEPLLPrepareFinalize(ctx), experts, shared, overlap=ov)
                    errs = [rel_err(kernel(x, w, ids), ref) for _ in range(2)]  # reuse: workspaces, buffer
                    kernel.close()
                    rows.append(dict(quant=qname, tokens=T, overlap=ov, rel_err=max(errs), checks=checks))
        rows.append(dict(buffers=_deepep_cached(), made=deep_ep.Buffer.created))
    finally:
        from moebench.kernels.prepare_finalize._deepep import release_buffers

        release_buffers()
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(rows, f)


def _deepep_cached() -> int:
    from moebench.kernels.prepare_finalize import _deepep as d

    return d.cached_buffer_count()


def _standin_job(out_dir: str) -> None:
    """Entry point of the subprocess: spawn the two ranks."""
    import torch.multiprocessing as mp

    from moebench.run.launch import free_port

    mp.spawn(_standin_rank, args=(free_port(), out_dir), nprocs=2, join=True)


@pytest.mark.multiprocess
def test_deepep_ll_plumbing_over_a_cpu_standin(tmp_path):
    """deepep_ll + torch_batched + shared experts, every quant x overlap, match the
    reference on 2 gloo ranks over a stand-in that reproduces DeepEP's layouts."""
    pkg = tmp_path / "standin" / "deep_ep"
    pkg.mkdir(parents=True)
    shutil.copy(SUPPORT / "deepep_ll_standin.py", pkg / "__init__.py")
    code = (
        f"import sys; sys.path[:0] = [{str(tmp_path / 'standin')!r}, {str(SUPPORT)!r}, {str(REPO)!r}]\n"
        "import tests.kernels.test_deepep_skip as t\n"
        f"t._standin_job({str(tmp_path)!r})\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "standin"), str(SUPPORT), str(REPO)]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    per_rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    from moebench.kernels.reference import TOLERANCE as tol

    for r, rows in enumerate(per_rank):
        *cases, tail = rows
        assert len(cases) == len(STANDIN_QUANTS) * len(STANDIN_TOKENS) * 3
        assert tail == {"buffers": 1, "made": 1}, tail  # one buffer for every quant and instance
        for c in cases:
            bad = sorted(k for k, v in c["checks"].items() if not v)
            assert not bad, (r, c)
            assert c["rel_err"] <= tol[c["quant"]], (r, c)
