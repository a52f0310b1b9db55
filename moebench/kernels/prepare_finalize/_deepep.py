"""DeepEP (v1 API, `deep_ep.Buffer`) helpers: a lazy import that says how to
install the library, and a per-process cache of buffers: high-throughput
(intranode NVLink IPC) for deepep_ht, low-latency (NVSHMEM) for deepep_ll.

`deep_ep` is imported inside functions only, so this module (and every backend
built on it) imports fine on machines without the library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .._optional import OptionalLibrary

INSTALL_HINT = (
    "build DeepEP v1.2.1 from github.com/deepseek-ai/DeepEP against NVSHMEM "
    "(see README 'GPU machines and the optional libraries')"
)
# DeepEP's intranode kernels are instantiated for these rank counts (SWITCH_RANKS
# in csrc/kernels/launch.cuh); more ranks go internode over NVSHMEM/RDMA, not wired here.
INTRANODE_WORLD_SIZES = (2, 4, 8)


def _import() -> tuple[Optional[Any], Optional[str]]:
    try:
        import deep_ep  # imports the compiled deep_ep_cpp too

        return deep_ep, None
    except Exception as e:  # noqa: BLE001 (ImportError, or OSError for a missing libnvshmem: unavailable, with why)
        return None, f"{type(e).__name__}: {e}"


_LIB = OptionalLibrary("deep_ep is not installed", _import, INSTALL_HINT, module="deep_ep")
load = _LIB.load  # (module, None) or (None, why not and how to install it)
unavailable_reason = _LIB.unavailable_reason  # why `deep_ep` cannot be used here, or None
require = _LIB.require  # the module; ImportError with the install hint when missing


def reset_import_cache() -> None:
    """Forget the import outcome (tests simulate a missing or a fake library)."""
    _LIB.reset()


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


# the NVLink receive buffer (tokens per channel) of a tuned chunk: DeepEP's test_intranode.py
NVL_RECV_TOKENS = 256


def ht_configs(world_size: int, num_sms: int, dispatch_chunk: int = 0, combine_chunk: int = 0) -> tuple[Any, Any]:
    """(dispatch, combine) configs for `world_size` ranks with `num_sms` SMs: DeepEP's
    recommended ones (Buffer.num_sms is a class-wide default; restored), or, for a chunk > 0,
    Config(num_sms, chunk, NVL_RECV_TOKENS) as DeepEP's test_intranode.py tunes them."""
    deep_ep = require()
    for name, chunk in (("dispatch", dispatch_chunk), ("combine", combine_chunk)):
        if not 0 <= chunk < NVL_RECV_TOKENS:
            raise ValueError(f"{name}_nvl_chunk={chunk}: 0 (recommended) or 1..{NVL_RECV_TOKENS - 1} tokens")
    old = deep_ep.Buffer.num_sms
    deep_ep.Buffer.num_sms = num_sms
    try:
        d, c = deep_ep.Buffer.get_dispatch_config(world_size), deep_ep.Buffer.get_combine_config(world_size)
    finally:
        deep_ep.Buffer.num_sms = old
    if dispatch_chunk:
        d = deep_ep.Config(num_sms, dispatch_chunk, NVL_RECV_TOKENS)
    if combine_chunk:
        c = deep_ep.Config(num_sms, combine_chunk, NVL_RECV_TOKENS)
    return d, c


def get_ht_buffer(
    group: Any, hidden_bytes: int, num_sms: int, dispatch_chunk: int = 0, combine_chunk: int = 0
) -> HTBuffer:
    """The shared high-throughput buffer of `group` for rows of `hidden_bytes`
    (DeepEP sizes by hidden * max(element size, 2): bf16 and fp8 rows share one).

    Collective on first use: every rank of `group` must call it in the same order.
    """
    deep_ep = require()
    world_size = group.size()
    key = (id(group), world_size, hidden_bytes, num_sms, dispatch_chunk, combine_chunk)
    hit = _BUFFERS.get(key)
    if hit is not None and hit.group is group:
        return hit
    # one HT buffer per group: free another size's buffer first, so a combination's
    # device memory holds only its own (every rank reaches this point in the same order)
    release_buffers(group, kind="ht")
    dispatch_cfg, combine_cfg = ht_configs(world_size, num_sms, dispatch_chunk, combine_chunk)
    # bytes: the larger of DeepEP's own size hints for the two configs (README's get_buffer)
    num_nvl_bytes = max(c.get_nvl_buffer_size_hint(hidden_bytes, world_size) for c in (dispatch_cfg, combine_cfg))
    # explicitly_destroy: release_buffers() frees it; a destructor-time free can
    # hang Python's exception handling (DeepEP's docstring)
    buf = deep_ep.Buffer(group, num_nvl_bytes, 0, low_latency_mode=False, explicitly_destroy=True)
    entry = HTBuffer(group, buf, dispatch_cfg, combine_cfg, num_nvl_bytes)
    _BUFFERS[key] = entry
    return entry


def release_buffers(group: Any = None, kind: Optional[str] = None) -> int:
    """Destroy the cached buffers of `group` (all groups when None) of `kind`
    ("ht", "ll"; both when None); returns how many.

    Collective: DeepEP's destroy() barriers over NVLink (HT) or NVSHMEM (LL), so
    every rank of the group must call this, in the same order (the harness does,
    before tearing the group down).
    """
    global _LL, _LL_DESTROYED
    n = 0
    if kind in (None, "ht"):
        for key, entry in list(_BUFFERS.items()):
            if group is not None and entry.group is not group:
                continue
            del _BUFFERS[key]
            entry.buffer.destroy()
            n += 1
    if kind in (None, "ll") and _LL is not None and (group is None or _LL.group is group):
        ll, _LL = _LL, None
        _LL_DESTROYED = True  # NVSHMEM is finalised now: no second LL buffer in this process
        ll.buffer.destroy()
        n += 1
    return n


def cached_buffer_count() -> int:
    return len(_BUFFERS) + (_LL is not None)


# ----------------------------------------------------------------------------
# Low-latency buffer: DeepEP's low-latency kernels live in one NVSHMEM symmetric
# buffer, and creating it initialises NVSHMEM, which a process may do once
# (NVSHMEM's docs: a second nvshmem_init in the same program is undefined, and
# destroy() finalises it). So a process holds at most one LL buffer, of one shape,
# for its whole life; moebench's planner gives every deepep_ll buffer shape its
# own process group (plan.Combination.family).


@dataclass
class LLBuffer:
    """The process's `deep_ep.Buffer` in low-latency mode and the shape it is sized for."""

    group: Any
    buffer: Any  # deep_ep.Buffer(low_latency_mode=True)
    max_tokens_per_rank: int  # num_max_dispatch_tokens_per_rank, the same on every rank
    hidden: int
    num_experts: int  # global experts
    num_rdma_bytes: int  # NVSHMEM symmetric bytes per rank

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.max_tokens_per_rank, self.hidden, self.num_experts)


_LL: Optional[LLBuffer] = None
_LL_DESTROYED = False  # an LL buffer was destroyed: NVSHMEM was finalised in this process


def ll_rdma_bytes(max_tokens_per_rank: int, hidden: int, world_size: int, num_experts: int) -> int:
    """DeepEP's own size hint for the low-latency buffer (bytes per rank): two
    halves of send, receive and signal buffers for `max_tokens_per_rank` tokens."""
    return int(require().Buffer.get_low_latency_rdma_size_hint(max_tokens_per_rank, hidden, world_size, num_experts))


def get_ll_buffer(group: Any, max_tokens_per_rank: int, hidden: int, num_experts: int) -> LLBuffer:
    """The process's low-latency buffer for `group`, sized for (max tokens per
    rank, hidden, experts); created on first use.

    Collective on first use (an all-gather of device ids and the NVSHMEM unique id,
    then NVSHMEM initialisation): every rank of `group` must call it in the same
    order. Asking for another group or shape once one exists, or for any after one
    was destroyed, raises: NVSHMEM cannot initialise twice in a process.
    """
    global _LL
    deep_ep = require()
    shape = (max_tokens_per_rank, hidden, num_experts)
    if _LL is not None:
        if _LL.group is group and _LL.shape == shape:
            return _LL
        raise RuntimeError(
            f"this process already holds a DeepEP low-latency buffer for (max tokens per rank, hidden, "
            f"experts)={_LL.shape} on another group or shape than {shape}: DeepEP's low-latency buffer "
            "initialises NVSHMEM, which a process may do once; run each buffer shape in its own process "
            "(moebench sweeps do: one process group per deepep_ll buffer shape)"
        )
    if _LL_DESTROYED:
        raise RuntimeError(
            "a DeepEP low-latency buffer was already destroyed in this process, which finalised NVSHMEM; "
            "NVSHMEM cannot initialise again in the same process: create the next buffer in a new process"
        )
    world_size = group.size()
    if num_experts % world_size:
        raise ValueError(f"world_size={world_size} does not divide num_experts={num_experts}")
    num_rdma_bytes = ll_rdma_bytes(max_tokens_per_rank, hidden, world_size, num_experts)
    # num_nvl_bytes=0: the low-latency kernels use only the NVSHMEM buffer (DeepEP's
    # README get_buffer and tests/test_low_latency.py pass 0 too); one QP per local
    # expert, as DeepEP requires (its dispatch asserts num_rc_per_pe >= local experts);
    # NVLink between the ranks of a node instead of RDMA loopback; explicitly_destroy:
    # release_buffers() frees it (a destructor-time free can hang exception handling)
    buf = deep_ep.Buffer(
        group,
        0,
        num_rdma_bytes,
        low_latency_mode=True,
        num_qps_per_rank=num_experts // world_size,
        allow_nvlink_for_low_latency_mode=True,
        explicitly_destroy=True,
    )
    _LL = LLBuffer(group, buf, max_tokens_per_rank, hidden, num_experts, num_rdma_bytes)
    return _LL
