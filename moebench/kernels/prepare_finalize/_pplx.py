"""pplx-kernels helpers: a lazy import that says how to get the library, NVSHMEM
initialised once per process, and one `pplx_kernels.AllToAll` cached per process group.

`pplx_kernels` is imported inside functions only, so this module (and the backend
built on it) imports fine on machines without the library.

Two transports (`AllToAll.intranode` / `.internode`, the same dispatch/combine API):
- intranode: CUDA-IPC buffers between the GPUs of one node, handles exchanged over a
  gloo process group (vLLM's choice on one node); NVSHMEM is not initialised;
- internode: NVSHMEM symmetric buffers (what pplx's own benchmark runs); NVSHMEM is
  initialised once per process from a unique id broadcast over the torch group.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from .._optional import OptionalLibrary

if TYPE_CHECKING:  # torch is imported where it is used: planning reads this module without it
    import torch

INSTALL_HINT = "build it from github.com/ppl-ai/pplx-kernels (README: 'GPU machines and the optional libraries')"
MODES = ("intranode", "internode")
DEFAULT_MODE = "intranode"
SCALE_ALIGN = 16  # pplx needs row and scale byte counts that are multiples of 16
# the intranode dispatch stages one token row (+ scales + a 4-byte index) in shared
# memory at launch, without opting in to more than the default 48 KiB
MAX_STAGED_ROW_BYTES = 48 * 1024
# NVSHMEM's symmetric heap is fixed at init: what we ask for when the user did not
# set NVSHMEM_SYMMETRIC_SIZE (at least 1 GiB, 2x the first AllToAll's need)
_MIN_HEAP_BYTES = 1 << 30


def _import() -> tuple[Optional[Any], Optional[str]]:
    try:
        import pplx_kernels

        # pplx_kernels/ops.py logs and goes on when libpplx_kernels.so fails to load
        # (its `_ops` is then an empty namespace instead of torch.ops.pplx_kernels)
        ops = getattr(getattr(pplx_kernels, "ops", None), "_ops", None)
        if not hasattr(ops, "all_to_all_intranode_create"):
            return None, "libpplx_kernels.so did not load (its import logged the reason)"
        return pplx_kernels, None
    except Exception as e:  # noqa: BLE001 (ImportError, or OSError for a missing libnvshmem_host: unavailable, with why)
        return None, f"{type(e).__name__}: {e}"


_LIB = OptionalLibrary("pplx_kernels is not installed", _import, INSTALL_HINT, module="pplx_kernels")
load = _LIB.load  # (module, None) or (None, why not and how to install it)
unavailable_reason = _LIB.unavailable_reason  # why `pplx_kernels` cannot be used here, or None
require = _LIB.require  # the module; ImportError with the install hint when missing


def reset_import_cache() -> None:
    """Forget the import outcome (tests simulate a missing or a fake library)."""
    _LIB.reset()


# ----------------------------------------------------------------------------
# Sizes (bytes), as pplx's AllToAll computes them


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class A2ASpec:
    """Arguments of AllToAll.intranode / .internode (dp_size 1: every rank its own DP group)."""

    mode: str
    max_num_tokens: int  # per rank
    num_experts: int
    experts_per_token: int
    rank: int
    world_size: int
    hidden_dim: int  # elements
    hidden_dim_bytes: int  # one dispatched row: K (fp8) or 2K (bf16)
    hidden_dim_scale_bytes: int  # fp8_block: 4 * G rounded up to 16; else 0
    dp_size: int = 1

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.world_size

    @property
    def token_stride(self) -> int:
        """Bytes of one staged token: row + scales + a uint32 source index, 16-aligned."""
        return round_up(self.hidden_dim_bytes + self.hidden_dim_scale_bytes + 4, 16)

    def kwargs(self) -> dict:
        return dict(
            max_num_tokens=self.max_num_tokens,
            num_experts=self.num_experts,
            experts_per_token=self.experts_per_token,
            rank=self.rank,
            world_size=self.world_size,
            dp_size=self.dp_size,
            hidden_dim=self.hidden_dim,
            hidden_dim_bytes=self.hidden_dim_bytes,
            hidden_dim_scale_bytes=self.hidden_dim_scale_bytes,
        )

    def buffer_bytes(self) -> int:
        """Device memory the AllToAll allocates (csrc/all_to_all/{intranode,internode}.cpp).

        intranode: one buffer per peer of max(dispatch, combine) bytes, where
          dispatch = 16 + 16-aligned counters + T_max * E_local * token_stride,
          combine  = 16 + 16-aligned counters + T_max * E_local * 4K (fp32 rows);
        internode (NVSHMEM heap): dispatch in T_max and out B rows of token_stride, combine in
          B rows and out T_max * E rows of 4K, B = E_local * W * T_max; plus small counters.
        Token-tracking arrays (B uint32 each: 6 intranode, 5 internode) are cudaMalloc'd.
        """
        T, El, W, K = self.max_num_tokens, self.num_local_experts, self.world_size, self.hidden_dim
        batch = El * W * T
        tracking = (6 if self.mode == "intranode" else 5) * batch * 4
        if self.mode == "intranode":
            counters = 16 + round_up(El * 4, 16)
            per_peer = max(counters + T * El * self.token_stride, counters + T * El * 4 * K)
            return W * per_peer + tracking
        return self.nvshmem_bytes() + tracking

    def nvshmem_bytes(self) -> int:
        """NVSHMEM symmetric-heap bytes of an internode AllToAll (0 for intranode)."""
        if self.mode != "internode":
            return 0
        T, E, El, W, K = self.max_num_tokens, self.num_experts, self.num_local_experts, self.world_size, self.hidden_dim
        batch = El * W * T
        counters = 8 * (2 * El * W + T + W)
        return counters + (T + batch) * self.token_stride + batch * 4 * K + T * E * 4 * K


# ----------------------------------------------------------------------------
# NVSHMEM: once per process


@dataclass
class _NvshmemState:
    ranks: Optional[tuple] = None  # global ranks of the group it was initialised over
    heap_bytes: int = 0


_NVSHMEM = _NvshmemState()


def nvshmem_initialized() -> bool:
    return _NVSHMEM.ranks is not None


def _group_ranks(group) -> tuple:
    import torch.distributed as dist

    return tuple(dist.get_process_group_ranks(group))


def ensure_nvshmem(group: Any, device: torch.device, need_bytes: int) -> None:
    """Initialise NVSHMEM over `group` unless this process already did (collective on
    first use: rank 0 makes the unique id, the group broadcasts it, every rank inits)."""
    import torch.distributed as dist

    pk = require()
    ranks = _group_ranks(group)
    if _NVSHMEM.ranks is not None:
        if _NVSHMEM.ranks != ranks:
            raise RuntimeError(
                f"NVSHMEM was initialised over ranks {_NVSHMEM.ranks} in this process; "
                f"pplx internode over {ranks} needs a process of its own"
            )
        return
    # the heap size is read at init and fixed afterwards
    if "NVSHMEM_SYMMETRIC_SIZE" not in os.environ:
        heap = max(_MIN_HEAP_BYTES, round_up(2 * need_bytes, 1 << 30))
        os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(heap)
    _NVSHMEM.heap_bytes = _parse_size(os.environ["NVSHMEM_SYMMETRIC_SIZE"])
    rank = group.rank()
    uid = pk.nvshmem_get_unique_id() if rank == 0 else pk.nvshmem_alloc_empty_unique_id()
    # through the device: an NCCL-only group cannot broadcast CPU tensors
    uid_dev = uid.to(device)
    dist.broadcast(uid_dev, src=ranks[0], group=group)
    status = pk.nvshmem_init(uid_dev.cpu(), rank, group.size())
    if status != 0:
        raise RuntimeError(f"nvshmem_init returned {status} on rank {rank}")
    pe = pk.nvshmem_my_pe()
    assert pe == rank, f"NVSHMEM PE {pe} != group rank {rank}"
    _NVSHMEM.ranks = ranks


def _parse_size(s: str) -> int:
    """NVSHMEM size strings: bytes, or with a K/M/G/T suffix (powers of 1024)."""
    s = s.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def finalize_nvshmem() -> None:
    """nvshmem_finalize (collective over the PEs) once nothing uses the heap."""
    if _NVSHMEM.ranks is None:
        return
    require().nvshmem_finalize()
    _NVSHMEM.ranks = None


# ----------------------------------------------------------------------------
# AllToAll cache: one per process group. Creating one allocates and maps buffers
# collectively, so every combination of a process group that needs the same
# shapes reuses it; another shape frees it first (a combination's device memory
# then holds only its own buffers).


@dataclass
class A2AEntry:
    group: Any  # the torch.distributed process group
    spec: A2ASpec
    a2a: Any  # pplx_kernels.AllToAll
    # what brings the dispatch/combine protocol back to idle (a dispatch must be
    # followed by a combine on every rank): set by the backend, run before the next
    # dispatch and before the AllToAll is destroyed
    pending: Optional[Callable[[], None]] = None


_ENTRIES: dict[int, A2AEntry] = {}
_GLOO: dict[int, tuple[Any, Any]] = {}  # id(group) -> (group, gloo group for IPC handles)


def _gloo_group(group: Any) -> Any:
    """A gloo group over `group`'s ranks: the intranode AllToAll exchanges its CUDA-IPC
    handles with a c10d all-to-all of CPU tensors, which an NCCL group cannot run.
    Collective over the default group on first use (dist.new_group)."""
    import torch.distributed as dist

    hit = _GLOO.get(id(group))
    if hit is not None and hit[0] is group:
        return hit[1]
    if dist.get_backend(group) == "gloo":
        g = group
    else:
        g = dist.new_group(list(_group_ranks(group)), backend="gloo")
    _GLOO[id(group)] = (group, g)
    return g


def get_all_to_all(group: Any, spec: A2ASpec, device: torch.device) -> A2AEntry:
    """The cached AllToAll of `group` for `spec` (created, collectively, on first use).

    Every rank of `group` must call it in the same order with the same spec (rank aside).
    """
    pk = require()
    hit = _ENTRIES.get(id(group))
    if hit is not None and hit.group is group and hit.spec == spec:
        return hit
    release_all_to_all(group)  # one per group: free another shape's buffers first
    if spec.mode == "internode":
        ensure_nvshmem(group, device, spec.nvshmem_bytes())
        if spec.nvshmem_bytes() > _NVSHMEM.heap_bytes:
            raise RuntimeError(
                f"pplx internode needs {spec.nvshmem_bytes() / 2**30:.2f} GiB of NVSHMEM heap but "
                f"NVSHMEM_SYMMETRIC_SIZE is {_NVSHMEM.heap_bytes / 2**30:.2f} GiB (fixed at init): "
                f"set it larger, or lower backend.max_tokens_per_rank"
            )
        a2a = pk.AllToAll.internode(**spec.kwargs())
    elif spec.mode == "intranode":
        a2a = pk.AllToAll.intranode(**spec.kwargs(), group_name=_gloo_group(group).group_name)
    else:
        raise ValueError(f"pplx mode {spec.mode!r}; valid: {MODES}")
    entry = A2AEntry(group=group, spec=spec, a2a=a2a)
    _ENTRIES[id(group)] = entry
    return entry


def _quiesce(group: Any) -> None:
    """Every rank's kernels done before buffers that peers map are freed."""
    import torch.distributed as dist

    _sync()
    dist.barrier(group=_GLOO[id(group)][1] if id(group) in _GLOO else group)


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def release_all_to_all(group: Any = None) -> int:
    """Destroy the cached AllToAll of `group` (all groups when None); returns how many.

    Collective: intranode peers map each other's buffers, internode frees NVSHMEM
    memory (nvshmem_free is collective), so every rank of the group calls this.
    """
    n = 0
    for key, entry in list(_ENTRIES.items()):
        if group is not None and entry.group is not group:
            continue
        del _ENTRIES[key]
        if entry.pending is not None:
            pending, entry.pending = entry.pending, None
            pending()
        _quiesce(entry.group)
        entry.a2a.destroy()
        n += 1
    return n


def release_group(group: Any = None) -> None:
    """Free everything cached for `group` (all groups when None): its AllToAll, its
    gloo group, and NVSHMEM when no internode AllToAll is left. Collective."""
    import torch.distributed as dist

    release_all_to_all(group)
    for key, (g, gloo) in list(_GLOO.items()):
        if group is not None and g is not group:
            continue
        del _GLOO[key]
        if gloo is not g and dist.is_initialized():
            dist.destroy_process_group(gloo)
    if not _ENTRIES and nvshmem_initialized():
        _sync()
        finalize_nvshmem()


def cached_count() -> int:
    return len(_ENTRIES)


@atexit.register
def _leak_at_exit() -> None:
    # a destructor at interpreter exit would free collectively (NVSHMEM) or while a
    # peer still writes (IPC) with no peer to meet: leave the memory to the process exit
    for entry in _ENTRIES.values():
        entry.a2a._ptr = None
    _ENTRIES.clear()
