"""Memory: the allocator peak of one forward and device-level use (so that
buffers allocated outside PyTorch's allocator, e.g. DeepEP's / NVSHMEM's, count)."""
from __future__ import annotations

from typing import Callable, Optional

import torch


def device_used_bytes(device: torch.device) -> Optional[int]:
    """Bytes in use on the whole device (driver view), None on CPU."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def forward_peak_bytes(fn: Callable[[], object], device: torch.device, before_fn: Callable[[], None]) -> Optional[int]:
    """Allocator peak during fn() above what was allocated before it (bytes).

    before_fn runs first (e.g. dropping cached workspaces so that they count)."""
    if device.type != "cuda":
        return None
    before_fn()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base
