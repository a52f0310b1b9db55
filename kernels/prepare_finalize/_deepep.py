"""DeepEP (v1 API, `deep_ep.Buffer`) helpers: a lazy import that says how to
install the library, and a per-process cache of intranode NVLink buffers.

`deep_ep` is imported inside functions only, so this module (and every backend
built on it) imports fine on machines without the library.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

INSTALL_HINT = (
    "build DeepEP v1.2.1 from github.com/deepseek-ai/DeepEP against NVSHMEM "
    "(see README 'Optional libraries')"
)
# DeepEP's intranode kernels are instantiated for these rank counts (SWITCH_RANKS
# in csrc/kernels/launch.cuh); more ranks go internode over NVSHMEM/RDMA, not wired here.
INTRANODE_WORLD_SIZES = (2, 4, 8)


@functools.lru_cache(maxsize=1)
def _import() -> tuple[Optional[Any], Optional[str]]:
    try:
        import deep_ep  # noqa: F401  (imports the compiled deep_ep_cpp too)

        return deep_ep, None
    except Exception as e:  # ImportError, or OSError for a missing libnvshmem
        return None, f"{type(e).__name__}: {e}"


def unavailable_reason() -> Optional[str]:
    """Why `deep_ep` cannot be used here (with how to install it), or None."""
    mod, err = _import()
    if mod is not None:
        return None
    return f"deep_ep is not installed: {INSTALL_HINT} [import failed: {err}]"


def require() -> Any:
    """The `deep_ep` module; ImportError with the install hint when missing."""
    mod, _ = _import()
    if mod is None:
        raise ImportError(unavailable_reason())
    return mod


def reset_import_cache() -> None:
    """Forget the import outcome (tests simulate a missing library)."""
    _import.cache_clear()


# ----------------------------------------------------------------------------
# Buffer cache: allocating and IPC-mapping NVLink buffers is expensive (a
# cudaMalloc plus an all-gather of IPC handles), so every combination that runs
# in one process group shares one buffer per (group, hidden bytes, SMs).


@dataclass
class HTBuffer:
    """A `deep_ep.Buffer` and the high-throughput configs sized for it."""

    group: Any  # the torch.distributed process group it was built on
    buffer: Any  # deep_ep.Buffer
    dispatch_config: Any  # deep_ep.Config
    combine_config: Any  # deep_ep.Config
    num_nvl_bytes: int


_BUFFERS: dict[tuple, HTBuffer] = {}


def ht_configs(world_size: int, num_sms: int) -> tuple[Any, Any]:
    """DeepEP's recommended (dispatch, combine) configs for `world_size` ranks,
    with `num_sms` SMs (Buffer.num_sms is a class-wide default; restore it)."""
    deep_ep = require()
    old = deep_ep.Buffer.num_sms
    deep_ep.Buffer.num_sms = num_sms
    try:
        return deep_ep.Buffer.get_dispatch_config(world_size), deep_ep.Buffer.get_combine_config(world_size)
    finally:
        deep_ep.Buffer.num_sms = old


def get_ht_buffer(group: Any, hidden_bytes: int, num_sms: int) -> HTBuffer:
    """The shared high-throughput buffer of `group` for rows of `hidden_bytes`
    (DeepEP sizes by hidden * max(element size, 2): bf16 and fp8 rows share one).

    Collective on first use: every rank of `group` must call it in the same order.
    """
    deep_ep = require()
    world_size = group.size()
    key = (id(group), world_size, hidden_bytes, num_sms)
    hit = _BUFFERS.get(key)
    if hit is not None and hit.group is group:
        return hit
    # one buffer per group: free another size's buffer first, so a combination's
    # device memory holds only its own (every rank reaches this point in the same order)
    release_buffers(group)
    dispatch_cfg, combine_cfg = ht_configs(world_size, num_sms)
    # bytes: the larger of DeepEP's own size hints for the two configs (README's get_buffer)
    num_nvl_bytes = max(c.get_nvl_buffer_size_hint(hidden_bytes, world_size) for c in (dispatch_cfg, combine_cfg))
    # explicitly_destroy: release_buffers() frees it; a destructor-time free can
    # hang Python's exception handling (DeepEP's docstring)
    buf = deep_ep.Buffer(group, num_nvl_bytes, 0, low_latency_mode=False, explicitly_destroy=True)
    entry = HTBuffer(group, buf, dispatch_cfg, combine_cfg, num_nvl_bytes)
    _BUFFERS[key] = entry
    return entry


def release_buffers(group: Any = None) -> int:
    """Destroy the cached buffers of `group` (all groups when None); returns how many.

    Collective: DeepEP's destroy() barriers over NVLink, so every rank of the
    group must call this (the harness does, before tearing the group down).
    """
    n = 0
    for key, entry in list(_BUFFERS.items()):
        if group is not None and entry.group is not group:
            continue
        del _BUFFERS[key]
        entry.buffer.destroy()
        n += 1
    return n


def cached_buffer_count() -> int:
    return len(_BUFFERS)
