"""runner.device=auto and this machine's GPU count, without importing torch where the answer
is certain (importing torch takes 1-3 s: most of `moebench list` once it did).

torch.cuda.is_available() is certainly False when CUDA_VISIBLE_DEVICES hides every GPU, or,
on Linux, when no GPU device node exists (/dev/nvidia<N>; /dev/kfd for ROCm; /dev/dxg under
WSL). Anywhere else torch answers, so a CPU-only torch build on a GPU host still says cpu."""

from __future__ import annotations

import functools
import glob
import os
import sys


def no_gpu_for_certain() -> bool:
    """True where torch.cuda.is_available() would be False whatever torch build is installed."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        first = visible.split(",")[0].strip()
        if not first or first.startswith("-"):  # "" or "-1": no device is visible
            return True
    return sys.platform.startswith("linux") and not gpu_device_nodes()


@functools.lru_cache(maxsize=1)
def gpu_device_nodes() -> tuple[str, ...]:
    """The GPU device nodes of this Linux machine (read once a process: planning asks per
    combination)."""
    return tuple(glob.glob("/dev/nvidia[0-9]*") + [p for p in ("/dev/kfd", "/dev/dxg") if os.path.exists(p)])


def cuda_available() -> bool:
    """torch.cuda.is_available(), answered without torch where it is certainly False."""
    if no_gpu_for_certain():
        return False
    import torch

    return torch.cuda.is_available()


def cuda_device_count() -> int:
    """The CUDA GPUs torch sees (0 without CUDA)."""
    if not cuda_available():
        return 0
    import torch

    return torch.cuda.device_count()


def resolve_device(requested: str) -> str:
    """runner.device: auto is cuda where a CUDA GPU is visible, else cpu."""
    if requested != "auto":
        return requested
    return "cuda" if cuda_available() else "cpu"


CPU_THREADS = "MOEBENCH_CPU_THREADS"


def cpu_threads() -> int:
    """The torch threads each CPU rank runs: MOEBENCH_CPU_THREADS, else 1. One by default: CPU
    figures check the pipeline, and on a shared 2-core machine two threads of one rank wait on
    each other at every small op (docs/findings/harness.md, "The CPU default"). ValueError for
    a value that is no positive integer."""
    raw = os.environ.get(CPU_THREADS, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(
            f"{CPU_THREADS}={raw!r}: give a positive integer, the torch threads of each CPU rank (unset: 1)"
        )
    return int(raw)


def available_memory_bytes() -> int | None:
    """The memory this machine can give a new process without swapping (bytes): Linux's
    MemAvailable, else the free physical pages; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None
