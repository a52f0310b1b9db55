"""Memory: the allocator peak of one forward and device-level use (so that
buffers allocated outside PyTorch's allocator, e.g. DeepEP's / NVSHMEM's, count)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

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


def region_start(device: torch.device) -> Optional[int]:
    """Start of a measured region: cached blocks released and the peak counters reset, so
    that reserved_peak_bytes counts what the region's work makes the allocator reserve
    above what is allocated now (what runner.memory_budget caps). Returns the bytes
    allocated now; None on CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def reserved_peak_bytes(device: torch.device, base: Optional[int]) -> Optional[int]:
    """The allocator's reserved peak since region_start above the bytes allocated then: the
    layer's allocations plus the caching allocator's rounding and fragmentation, including
    free space left in the segments held at the start (at least the allocations' peak)."""
    if device.type != "cuda" or base is None:
        return None
    return torch.cuda.max_memory_reserved(device) - base


@contextmanager
def capped(device: torch.device, budget_bytes: int) -> Iterator[int]:
    """Cap what the caching allocator may reserve on `device` at what is allocated now plus
    `budget_bytes` (runner.memory_budget): an allocation past it raises torch's
    OutOfMemoryError, as on a GPU that much smaller. Cached blocks are released first. The
    cap counts from the allocated bytes, not the reserved ones: free space left in the
    segments held now (one H200 run held 1.6 GB of it after the correctness check, varying
    with what ran before) would otherwise be a budget on top of the budget. Yields the cap
    in bytes; lifted on exit. 0: no cap."""
    if not budget_bytes or device.type != "cuda":
        yield 0
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    held = torch.cuda.memory_allocated(device)
    total = torch.cuda.get_device_properties(device).total_memory
    cap = held + int(budget_bytes)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    try:
        yield cap
    finally:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, device)
