"""fp8 quantization helpers in plain torch (the reference math; Triton versions
live in kernels/triton/quant.py, and `quant_activations` uses the 1 x 128 one on CUDA).

Legend: T rows, K columns, G = K / group groups, E experts.
"""

from __future__ import annotations

from typing import Optional

import torch

from .interfaces import FP8_DTYPE, FP8_MAX, QuantSpec

_EPS = 1e-10


def quant_fp8_per_token_group(x_TK: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """1 x `group` dynamic activation quantization -> (fp8 [T, K], fp32 scales [T, G])."""
    T, K = x_TK.shape
    assert K % group == 0, f"K={K} is not a multiple of the group size {group}"
    xg = x_TK.float().reshape(T, K // group, group)
    amax = xg.abs().amax(dim=-1).clamp_min(_EPS)
    scale_TG = amax / FP8_MAX
    q = (xg / scale_TG.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(T, K), scale_TG


def quant_fp8_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor quantization -> (fp8 like x, fp32 scale [1])."""
    scale = (x.float().abs().amax().clamp_min(_EPS) / FP8_MAX).reshape(1)
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def quant_fp8_with_scale(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize with a given per-tensor scale [1] (e.g. agreed across ranks)."""
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def quant_activations(x_TK: torch.Tensor, quant: Optional[QuantSpec]):
    """Quantize activations the way `quant` asks: (x, scale or None)."""
    if quant is None or not quant.is_fp8:
        return x_TK, None
    if quant.is_block:
        if x_TK.is_cuda:
            # one pass of our Triton kernel (kernels/triton/quant.py, checked against the torch
            # code below in tests/kernels/test_triton_kernels.py); the torch code's fp32 temporaries took
            # 1.6 ms of prepare at 16384 x 7168 on an H200 (docs/findings/triton-vs-deepgemm.md)
            from .triton.quant import per_token_group_quant_fp8

            return per_token_group_quant_fp8(x_TK.contiguous(), quant.block_k)
        return quant_fp8_per_token_group(x_TK, quant.block_k)
    return quant_fp8_per_tensor(x_TK)


def dequant_activations(x: torch.Tensor, scale: Optional[torch.Tensor], quant: Optional[QuantSpec]) -> torch.Tensor:
    """Back to fp32: x [..., K] with scale [..., G] (block), [1] (tensor) or None."""
    if scale is None:
        return x.float()
    if scale.numel() == 1:
        return x.float() * scale.float()
    G = scale.shape[-1]
    K = x.shape[-1]
    xs = x.float().reshape(*x.shape[:-1], G, K // G) * scale.float().unsqueeze(-1)
    return xs.reshape(x.shape)


def quant_weight_block(w_ENK: torch.Tensor, bn: int = 128, bk: int = 128):
    """128x128 block weight quantization -> (fp8 [E, N, K], fp32 [E, ceil(N/bn), K/bk])."""
    E, N, K = w_ENK.shape
    assert K % bk == 0, f"K={K} must be a multiple of {bk} for block fp8"
    Np = -(-N // bn) * bn
    w = torch.nn.functional.pad(w_ENK.float(), (0, 0, 0, Np - N))
    wb = w.reshape(E, Np // bn, bn, K // bk, bk)
    amax = wb.abs().amax(dim=(2, 4)).clamp_min(_EPS)
    scale = amax / FP8_MAX
    q = (wb / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(E, Np, K)[:, :N].contiguous(), scale


def quant_weight_tensor(w_ENK: torch.Tensor):
    """One scale per expert matrix -> (fp8 [E, N, K], fp32 [E])."""
    E = w_ENK.shape[0]
    amax = w_ENK.float().reshape(E, -1).abs().amax(dim=1).clamp_min(_EPS)
    scale = amax / FP8_MAX
    q = (w_ENK.float() / scale[:, None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequant_weight(w_ENK: torch.Tensor, scale: Optional[torch.Tensor], quant: QuantSpec) -> torch.Tensor:
    """fp32 copy of (quantized) weights."""
    if not quant.is_fp8:
        return w_ENK.float()
    assert scale is not None, "fp8 weights come with their scales"
    if quant.is_block:
        E, N, K = w_ENK.shape
        s = scale.repeat_interleave(quant.block_n, dim=1)[:, :N].repeat_interleave(quant.block_k, dim=2)[:, :, :K]
        return w_ENK.float() * s
    return w_ENK.float() * scale.float()[:, None, None]


def quant_weights(w_ENK: torch.Tensor, quant: QuantSpec):
    """Quantize one weight tensor the way `quant` asks: (w, scale or None)."""
    if not quant.is_fp8:
        return w_ENK.to(torch.bfloat16), None
    if quant.is_block:
        return quant_weight_block(w_ENK, quant.block_n, quant.block_k)
    return quant_weight_tensor(w_ENK)
