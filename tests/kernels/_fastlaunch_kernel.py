"""A @triton.jit body for tests/kernels/test_triton_launch.py (JITFunction reads its source)."""

import triton.language as tl


def kernel_body(x_ptr, n, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
