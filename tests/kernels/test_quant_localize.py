"""Issue #34, the local backend's prepare: the fp8 activation quantization (1 x 128 groups)
and the expert ids' localization in one Triton launch and one allocation
(triton/quant.py: group_quant_and_localize) equal the two kernels they replace bit for bit;
on a machine without CUDA through Triton's interpreter."""
from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from moebench.kernels.interfaces import FP8_DTYPE  # noqa: E402
from moebench.kernels.triton import quant as tquant  # noqa: E402
from moebench.kernels.triton.quant import group_quant_and_localize, per_token_group_quant_fp8  # noqa: E402
from moebench.kernels.triton.routing import localize_ids_triton  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _inputs(T: int, K: int, P: int, dtype: torch.dtype, seed: int = 0):
    """x [T, K] bf16 with rows of other magnitudes; ids [T, P] in [-1, 10): -1 (dropped pairs)
    and ids past the local range (other ranks' experts) among them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g) * torch.logspace(-3, 3, T).unsqueeze(1) if T else torch.empty(0, K)
    ids = torch.randint(-1, 10, (T, P), generator=g)
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
@pytest.mark.parametrize("T, K, P, first, num_local", [
    (0, 256, 2, 4, 4),  # no rows: empty outputs, no launch
    (1, 256, 8, 0, 2),
    (37, 256, 3, 4, 4),  # rows past the last full block of 16, P not a power of two
    (64, 384, 8, 2, 3),  # three groups a row
])
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
