"""Helpers shared by the Triton kernels, including work-arounds that apply only
under Triton's CPU interpreter (TRITON_INTERPRET=1), so GPU code is unchanged.

Interpreter defects worked around (Triton 3.6):
  * tl.dot on bf16 operands multiplies their raw uint16 bits: operands are
    upcast to fp32 first (exact; the accumulation was fp32 anyway);
  * fp32 -> fp8e4nv casts round without carrying into the exponent (124.3 -> 64),
    fp32 -> bf16 casts truncate: values are rounded to the target precision in
    fp32 first, so the cast is exact;
  * `range(runtime_scalar)` fails with numpy >= 2: loops over runtime bounds use
    `while` (GEMM K loops use a constexpr K).
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

# host-side integer helpers: triton.cdiv / next_power_of_2 are ConstexprFunctions in 3.6, whose
# call from host code unwraps its arguments and reads TRITON_INTERPRET each time (issue #34);
# their plain Python functions give the same values
cdiv = getattr(triton.cdiv, "fn", triton.cdiv)
next_power_of_2 = getattr(triton.next_power_of_2, "fn", triton.next_power_of_2)


def align16(n: int) -> int:
    """n rounded up to a multiple of 16 (bytes: a carved view's offset Triton keys as aligned)."""
    return -(-n // 16) * 16


def carve(flat_u8: torch.Tensor, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A `dtype` view of `shape` at byte `offset` of a flat uint8 buffer."""
    esize = dtype.itemsize
    n = math.prod(shape)
    assert offset % esize == 0 and offset + n * esize <= flat_u8.numel(), (offset, n, esize, flat_u8.numel())
    return flat_u8[offset : offset + n * esize].view(dtype).view(shape)


def as_bytes(ws: torch.Tensor) -> torch.Tensor:
    """A contiguous workspace as the flat uint8 buffer `carve` takes."""
    assert ws.is_contiguous(), "workspaces must be contiguous"
    return ws.reshape(-1).view(torch.uint8)


def interpreting() -> bool:
    """Whether Triton kernels run in the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _round_mantissa(x, MANT: tl.constexpr, MIN_EXP: tl.constexpr):
    """Round fp32 x to MANT mantissa bits, nearest even (step 2^(max(exp, MIN_EXP) - MANT));
    rint via the 1.5 * 2^23 trick, exact for |x / step| < 2^22."""
    bits = x.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    step_exp = tl.maximum(e, MIN_EXP) - MANT
    step = ((step_exp + 127) << 23).to(tl.float32, bitcast=True)
    t = x / step
    t = (t + 12582912.0) - 12582912.0
    return t * step


@triton.jit
def to_fp8(x, dtype: tl.constexpr, EXACT_ROUND: tl.constexpr):
    """Cast fp32 x (already clamped to +-448) to fp8 e4m3, nearest even.
    EXACT_ROUND (interpreter only): round in fp32 first so the cast is exact."""
    if EXACT_ROUND:
        x = _round_mantissa(x, 3, -6)
    return x.to(dtype)


@triton.jit
def cast_out(x, dtype: tl.constexpr, EXACT_ROUND: tl.constexpr):
    """Cast an fp32 tile for a store; EXACT_ROUND (interpreter only) makes bf16
    round to nearest even (the interpreter truncates)."""
    if EXACT_ROUND:
        if dtype == tl.bfloat16:
            x = _round_mantissa(x, 7, -119)
    return x.to(dtype)


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    """The GPU's SM count, read once per device (persistent grids size themselves by it)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count
