"""Issue #34, the local backend's prepare: the fp8 activation quantization (1 x 128 groups)
and the expert ids' localization in one Triton launch and one allocation
(triton/quant.py: group_quant_and_localize) equal the two kernels they replace bit for bit,
and the prepare takes it exactly where both would launch a kernel; on a machine without
CUDA through Triton's interpreter (tests/gpu/test_triton_gpu.py: the prepare on CUDA)."""

from __future__ import annotations

import functools
import os
import sys

import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

from moebench.kernels.interfaces import FP8_DTYPE, KernelContext, LayerShape, QuantSpec
from moebench.kernels.prepare_finalize import _common, local
from moebench.kernels.quant import quant_activations
from moebench.kernels.triton import quant as tquant
from moebench.kernels.triton.quant import group_quant_and_localize, per_token_group_quant_fp8
from moebench.kernels.triton.routing import localize_ids_triton

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _inputs(T: int, K: int, P: int, dtype: torch.dtype, seed: int = 0, high: int = 10):
    """x [T, K] bf16 with rows of other magnitudes; ids [T, P] in [-1, high): -1 (dropped pairs)
    and ids past the local range (other ranks' experts) among them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g) * torch.logspace(-3, 3, T).unsqueeze(1) if T else torch.empty(0, K)
    ids = torch.randint(-1, high, (T, P), generator=g)
    return x.to(torch.bfloat16).to(DEV), ids.to(dtype).to(DEV)


def _same_as_two_kernels(got, x, group, ids, first, num_local):
    """got (q, scale, local ids) equals per_token_group_quant_fp8 and localize_ids_triton: the
    values bit for bit, the shapes, dtypes and strides; the three views of one buffer."""
    q, scale, local = got
    q2, s2 = per_token_group_quant_fp8(x.contiguous(), group)
    l2 = localize_ids_triton(ids, first, num_local)
    for a, b in ((q, q2), (scale, s2), (local, l2)):
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride()) and a.is_contiguous()
    assert q.dtype == FP8_DTYPE and scale.dtype == torch.float32 and local.dtype == torch.int64
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8))
    assert torch.equal(scale, s2) and torch.equal(local, l2)
    buf = q.untyped_storage().data_ptr()
    assert scale.untyped_storage().data_ptr() == buf == local.untyped_storage().data_ptr()
    assert all(t.data_ptr() % 16 == 0 for t in (q, scale, local))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize(
    "T, K, P, first, num_local",
    [
        (0, 256, 2, 4, 4),  # no rows: empty outputs, no launch
        (1, 256, 8, 0, 2),
        (37, 256, 3, 4, 4),  # rows past the last full block of 16, P not a power of two
        (64, 384, 8, 2, 3),  # three groups a row
    ],
)
def test_fused_equals_the_two_kernels(dtype, T, K, P, first, num_local):
    x, ids = _inputs(T, K, P, dtype, seed=T + P)
    got = group_quant_and_localize(x, 128, ids, first, num_local)
    _same_as_two_kernels(got, x, 128, ids, first, num_local)
    local = got[2].cpu()
    if T > 8:  # the ids cover every case: kept, other ranks' (-1), dropped (-1)
        assert (local >= 0).any() and (local == -1).any()
        assert ((ids.cpu() >= 0) & (local == -1)).any()


def test_fused_takes_rows_with_a_stride_and_non_contiguous_ids():
    wide, ids = _inputs(20, 512, 4, torch.int64, seed=5)
    x = wide[:, :256]  # rows with a stride past K: read as they are
    ids_t = ids.t().contiguous().t()  # [T, P] column-major: made contiguous
    assert not x.is_contiguous() and not ids_t.is_contiguous()
    _same_as_two_kernels(group_quant_and_localize(x, 128, ids_t, 1, 4), x, 128, ids, 1, 4)


def test_fused_is_one_launch(monkeypatch):
    """One launch (the fused kernel's) and one allocation, where the two kernels took two
    launches and three allocations."""
    launches, allocs = [], []
    real_launch, real_empty = tquant.launch, torch.empty

    def empty(*a, **k):
        if sys._getframe(1).f_code.co_filename == tquant.__file__:  # quant.py's own (not the interpreter's)
            allocs.append(a)
        return real_empty(*a, **k)

    monkeypatch.setattr(tquant, "launch", lambda fn, *a, **k: (launches.append(fn), real_launch(fn, *a, **k)))
    monkeypatch.setattr(torch, "empty", empty)
    x, ids = _inputs(40, 256, 8, torch.int64)
    group_quant_and_localize(x, 128, ids, 2, 4)
    assert launches == [tquant._quant_localize_kernel] and len(allocs) == 1


def test_fused_kernel_can_tell_a_wrong_localization():
    """The comparison above sees a kernel that localizes with other bounds (the test can fail)."""
    x, ids = _inputs(37, 256, 8, torch.int64, seed=2)
    with pytest.raises(AssertionError):
        _same_as_two_kernels(group_quant_and_localize(x, 128, ids, 3, 4), x, 128, ids, 2, 4)


def _one_buffer(out) -> bool:
    """The fused path's signature: the activations and the ids share one allocation."""
    return out[0].untyped_storage().data_ptr() == out[2].untyped_storage().data_ptr()


def _equal(got, want):
    for a, b in zip(got, want, strict=True):
        if b is None:
            assert a is None
            continue
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.element_size() == 1 else torch.equal(a, b)


@pytest.mark.parametrize(
    "quant, dtype, first, num_local, num_experts, fused",
    [
        ("fp8_block", torch.int64, 4, 4, 8, True),  # another rank's experts: ids to localize
        ("fp8_block", torch.int32, 0, 8, 8, True),  # every expert local, int32 ids: converted by a kernel
        ("fp8_block", torch.int64, 0, 8, None, True),  # no global count: localized
        ("fp8_block", torch.int64, 0, 8, 8, False),  # every expert local, int64: the ids as they are, one kernel
        ("fp8_tensor", torch.int64, 4, 4, 8, False),  # per-tensor scale: the torch quantization
        ("bf16", torch.int64, 4, 4, 8, False),
        (None, torch.int32, 4, 4, 8, False),
    ],
)
def test_quant_and_localize_fuses_where_both_halves_launch(quant, dtype, first, num_local, num_experts, fused):
    q = None if quant is None else QuantSpec(quant)
    x, ids = _inputs(37, 256, 4, dtype, seed=7)
    assert _common.fuses_quant_and_localize(q, ids, first, num_local, num_experts) == fused
    got = _common.quant_and_localize(x, ids, q, first, num_local, num_experts, fuse=True)
    assert _one_buffer(got) == fused
    if fused:
        _same_as_two_kernels(got, x, 128, ids, first, num_local)
    else:  # the two calls as they were
        _equal(got, (*quant_activations(x, q), _common.localize_ids(ids, first, num_local, num_experts)))
        if quant == "fp8_block":
            assert got[2] is ids
    # without `fuse` the tensors' device decides: CUDA fuses, a CPU keeps the two calls
    default = _common.quant_and_localize(x, ids, q, first, num_local, num_experts)
    assert _one_buffer(default) == (fused and DEV.type == "cuda")
    _equal(default, got)


def test_quant_and_localize_takes_non_contiguous_rows():
    """quant_activations made the rows contiguous; the fused path does too (a column-major x)."""
    x, ids = _inputs(24, 256, 4, torch.int64, seed=9)
    xt = x.t().contiguous().t()
    assert xt.stride(1) != 1
    got = _common.quant_and_localize(xt, ids, QuantSpec("fp8_block"), 4, 4, 8, fuse=True)
    assert _one_buffer(got)
    _same_as_two_kernels(got, x, 128, ids, 4, 4)


@pytest.mark.parametrize("simulate_ep, dtype", [(2, torch.int64), (2, torch.int32), (1, torch.int32), (1, torch.int64)])
def test_local_prepare_takes_the_fused_path_with_the_same_values(monkeypatch, simulate_ep, dtype):
    """LocalPrepareFinalize.prepare with fp8_block: where the ids need a kernel (another rank's
    experts, int32 ids) the fused one, with the values of the two kernels it ran before on CUDA;
    every expert local with int64 ids: the plain quantization, the ids as they are."""
    quant = QuantSpec("fp8_block")
    ctx = KernelContext(
        LayerShape(hidden=256, intermediate=128, num_experts=8, topk=4), quant, DEV, simulate_ep=simulate_ep
    )
    if DEV.type == "cpu":  # the prepare fuses on CUDA: here the interpreter runs the fused kernel
        monkeypatch.setattr(_common, "quant_and_localize", functools.partial(_common.quant_and_localize, fuse=True))
    x, ids = _inputs(37, 256, 4, dtype, seed=simulate_ep, high=8)  # a router's ids: the 8 experts, -1
    w = torch.rand(37, 4, generator=torch.Generator().manual_seed(0)).to(DEV)
    prepared = local.LocalPrepareFinalize(ctx).prepare(x, w, ids, quant)
    first, num_local = ctx.first_local_expert, ctx.num_local_experts
    got = (prepared.x, prepared.x_scale, prepared.topk_ids_MP)
    fused = simulate_ep > 1 or dtype == torch.int32
    assert _one_buffer(got) == fused and prepared.topk_weights_MP is w
    if fused:  # before, on CUDA: per_token_group_quant_fp8 and localize_ids_triton
        _same_as_two_kernels(got, x, 128, ids, first, num_local)
        assert ((ids.cpu() >= num_local) & (prepared.topk_ids_MP.cpu() == -1)).any() == (simulate_ep > 1)
    else:
        _equal(got, (*quant_activations(x, quant), ids))
        assert prepared.topk_ids_MP is ids
