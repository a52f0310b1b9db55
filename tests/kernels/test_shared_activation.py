"""The shared experts' SiLU-and-mul (issue #34): one Triton kernel on CUDA for bf16
(kernels/triton/activation.py: silu_and_mul_rows, here through the interpreter) equals the
torch form (reference.silu_and_mul) within bf16 rounding; the CPU keeps the torch form."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from moebench.kernels import modular
from moebench.kernels.reference import silu_and_mul


@pytest.mark.parametrize("T, S", [(1, 16), (37, 128), (64, 300), (0, 64), (5, 2048)])
def test_rows_kernel_equals_the_torch_form(T, S):
    from moebench.kernels.triton.activation import silu_and_mul_rows

    g = torch.Generator().manual_seed(T + S)
    h = (torch.randn(T, 2 * S, generator=g) * 3).to(torch.bfloat16)
    got = silu_and_mul_rows(h.to(_dev()))
    assert got.dtype == torch.bfloat16 and got.shape == (T, S)
    exact = silu_and_mul(h.float())  # the fp32 value both forms round
    torch_form = silu_and_mul(h)  # bf16 silu, then a bf16 multiply: rounded twice
    # one rounding: within half a bf16 ulp of the exact value (2^-8 relative), as close as torch's two
    err = (got.cpu().float() - exact).abs()
    assert (err <= exact.abs() * 2**-8 * (1 + 2**-10)).all()  # (slack: the GPU's exp is approximate)
    assert err.sum() <= (torch_form.float() - exact).abs().sum() * 1.01 + 1e-6
    assert torch.allclose(got.cpu().float(), torch_form.float(), rtol=2**-7, atol=1e-6)


def test_rows_kernel_reads_strided_rows():
    """h with a row stride past 2S (a slice of a wider buffer): only its own columns are read."""
    from moebench.kernels.triton.activation import silu_and_mul_rows

    g = torch.Generator().manual_seed(1)
    wide = torch.randn(9, 3 * 64, generator=g).to(torch.bfloat16)
    h = wide[:, : 2 * 64]
    assert torch.equal(silu_and_mul_rows(h.to(_dev())).cpu(), silu_and_mul_rows(h.contiguous().to(_dev())).cpu())
    with pytest.raises(AssertionError):
        silu_and_mul_rows(wide.float())  # bf16 only


def test_cpu_keeps_the_torch_form_and_its_bytes():
    g = torch.Generator().manual_seed(2)
    h = torch.randn(7, 64, generator=g).to(torch.bfloat16)
    assert not modular.triton_activation_fits(h)
    assert torch.equal(modular.shared_activation(h), silu_and_mul(h))
    w13, w2 = torch.randn(64, 32).bfloat16(), torch.randn(32, 32).bfloat16()
    # gate/up + torch's SiLU temporary + activation + output, bf16
    assert modular.SharedExperts(w13, w2).transient_bytes(10) == 2 * 10 * (64 + 32 + 32 + 32)


# the CUDA path (one Triton kernel): tests/gpu/test_triton_fastlaunch.py::test_shared_activation_one_kernel


def _dev():
    return "cuda" if torch.cuda.is_available() else "cpu"
