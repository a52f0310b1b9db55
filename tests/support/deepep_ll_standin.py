"""A CPU stand-in for DeepEP v1.2.1's low-latency API (`deep_ep.Buffer` in
low-latency mode), over gloo. Not DeepEP: it reproduces the Python signatures,
the host-side asserts of csrc/deep_ep.cpp, and the layouts DeepEP returns, so
that deepep_ll's plumbing (batched layout, column-major scales, handle, hook
semantics, in-place combine with weights) runs on machines without GPUs.

tests/kernels/test_deepep_skip.py copies this file to <tmp>/deep_ep/__init__.py and
runs ranks in a subprocess with <tmp> first on sys.path; nothing imports it as
`deep_ep` otherwise.

Faithful where it matters: received rows per expert are packed from row 0 in
an order that is not the source rank order (DeepEP's is an atomicAdd race);
padding rows and scales are NaN (DeepEP leaves them uninitialised); before a
receive hook runs, the outputs hold garbage; fp8 uses one fp32 scale = amax / 448
per 1x128 group (amax >= 1e-4), scales [E, X, G] as a transposed [E, G, X] tensor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

FP8 = torch.float8_e4m3fn
_NUM_BUFFER_ALIGNMENT_BYTES = 128


class EventOverlap:
    def __init__(self, event=None, extra_tensors=None) -> None:
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        assert self.event is not None


def _layout_bytes(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """LowLatencyLayout(...).total_bytes of csrc/config.hpp."""
    num_scales = hidden // 128
    dispatch_msg = 16 + max(hidden * 2, hidden + num_scales * 4)
    combine_msg = num_scales * 4 + hidden * 2
    send = max(
        num_max_dispatch_tokens_per_rank * dispatch_msg, num_experts * num_max_dispatch_tokens_per_rank * combine_msg
    )
    recv = num_experts * num_max_dispatch_tokens_per_rank * max(dispatch_msg, combine_msg)
    signal = -(-(num_experts * 4) // 128) * 128
    return 2 * (send + recv + signal)


class Buffer:
    num_sms: int = 20
    created: int = 0  # Buffers made in this process (the tests check there is one)

    def __init__(
        self,
        group,
        num_nvl_bytes: int = 0,
        num_rdma_bytes: int = 0,
        low_latency_mode: bool = False,
        num_qps_per_rank: int = 24,
        allow_nvlink_for_low_latency_mode: bool = True,
        allow_mnnvl: bool = False,
        explicitly_destroy: bool = False,
        comm=None,
    ) -> None:
        assert group is not None
        assert num_rdma_bytes % _NUM_BUFFER_ALIGNMENT_BYTES == 0 and num_nvl_bytes % _NUM_BUFFER_ALIGNMENT_BYTES == 0
        assert low_latency_mode and num_rdma_bytes > 0, "the stand-in models the low-latency mode only"
        self.group, self.rank, self.group_size = group, group.rank(), group.size()
        assert self.group_size < 8 or self.group_size % 8 == 0
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self.low_latency_mode, self.explicitly_destroy = low_latency_mode, explicitly_destroy
        self.num_qps_per_rank = num_qps_per_rank
        self.low_latency_buffer_idx = 0
        self.runtime = object()
        Buffer.created += 1
        dist.barrier(group)  # the real constructor all-gathers device ids and the NVSHMEM id

    def destroy(self) -> None:
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"
        assert self.runtime is not None
        dist.barrier(self.group)
        self.runtime = None

    @staticmethod
    def get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int
    ) -> int:
        n = _layout_bytes(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)
        return ((n + _NUM_BUFFER_ALIGNMENT_BYTES) // _NUM_BUFFER_ALIGNMENT_BYTES) * _NUM_BUFFER_ALIGNMENT_BYTES

    def _check_layout(self, max_tokens: int, hidden: int, num_experts: int) -> None:
        assert self.runtime is not None, "buffer destroyed"
        assert _layout_bytes(max_tokens, hidden, self.group_size, num_experts) <= self.num_rdma_bytes
        assert self.num_qps_per_rank >= num_experts // self.group_size  # the dispatch kernel's device assert
        self.low_latency_buffer_idx ^= 1

    # -- dispatch -----------------------------------------------------------------
    def low_latency_dispatch(
        self,
        x,
        topk_idx,
        num_max_dispatch_tokens_per_rank: int,
        num_experts: int,
        cumulative_local_expert_recv_stats=None,
        dispatch_wait_recv_cost_stats=None,
        use_fp8: bool = True,
        round_scale: bool = False,
        use_ue8m0: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
    ):
        R, r, X0 = self.group_size, self.rank, num_max_dispatch_tokens_per_rank
        assert x.dim() == 2 and x.is_contiguous() and x.dtype == torch.bfloat16
        assert x.size(1) % 8 == 0 and x.size(1) % 128 == 0
        assert topk_idx.dim() == 2 and topk_idx.is_contiguous() and topk_idx.dtype == torch.int64
        assert x.size(0) == topk_idx.size(0) and x.size(0) <= X0
        assert num_experts % R == 0 and not (async_finish and return_recv_hook)
        assert (R * X0) % 4 == 0, "TMA requires the number of tokens to be multiple of 4"
        assert not use_ue8m0 and not round_scale, "the stand-in models fp32 scales only"
        T, K = x.shape
        E, X, G = num_experts // R, R * X0, K // 128
        if use_fp8:
            assert K % 512 == 0
        self._check_layout(X0, K, num_experts)

        # send phase: every rank's payload reaches every rank (the real kernel sends per pair)
        if use_fp8:
            xg = x.float().reshape(T, G, 128)
            amax = xg.abs().amax(dim=-1).clamp_min(1e-4)
            q = (xg * (448.0 / amax).unsqueeze(-1)).clamp(-448, 448).to(FP8).reshape(T, K)
            payload = (q.view(torch.uint8), amax / 448.0)
        else:
            payload = (x.clone(), None)
        objs = [None] * R
        dist.all_gather_object(objs, (payload, topk_idx.clone()), group=self.group)

        recv_x = torch.empty(E, X, K, dtype=FP8 if use_fp8 else torch.bfloat16)
        if use_fp8:
            recv_x.view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
        else:
            recv_x.fill_(float("nan"))
        scales = torch.full((E, G, X), float("nan")).transpose(1, 2) if use_fp8 else None
        src_info = torch.full((E, X), -7, dtype=torch.int32)
        layout = torch.full((E, R), -7, dtype=torch.int64)
        count = torch.full((E,), -7, dtype=torch.int32)

        def recv() -> None:
            count.zero_()
            for e in range(E):
                g = r * E + e
                for j in reversed(range(R)):  # not rank order: nothing may rely on it
                    (xj, sj), idj = objs[j]
                    tok = torch.nonzero((idj == g).any(dim=1)).squeeze(1)
                    n, b = tok.numel(), int(count[e])
                    if n:
                        recv_x[e, b : b + n] = xj.view(FP8)[tok] if use_fp8 else xj[tok]
                        if use_fp8:
                            scales[e, b : b + n] = sj[tok]
                        src_info[e, b : b + n] = tok.to(torch.int32)
                    layout[e, j] = (b << 32) | n
                    count[e] += n

        hook = None
        if return_recv_hook:
            hook = recv
        else:
            recv()
        handle = (src_info, layout, X0, K, num_experts)
        return (recv_x, scales) if use_fp8 else recv_x, count, handle, EventOverlap(None), hook

    # -- combine ------------------------------------------------------------------
    def low_latency_combine(
        self,
        x,
        topk_idx,
        topk_weights,
        handle,
        use_logfmt: bool = False,
        zero_copy: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
        out=None,
        combine_wait_recv_cost_stats=None,
    ):
        src_info, layout, X0, K, num_experts = handle
        R, r = self.group_size, self.rank
        E = num_experts // R
        assert x.dim() == 3 and x.is_contiguous() and x.dtype == torch.bfloat16
        assert x.size(0) == E and x.size(1) == R * X0 and x.size(2) % 128 == 0
        assert topk_idx.dim() == 2 and topk_idx.is_contiguous() and topk_idx.dtype == torch.int64
        assert topk_idx.shape == topk_weights.shape and topk_weights.is_contiguous()
        assert topk_weights.dtype == torch.float32 and topk_weights.size(0) <= X0
        assert src_info.dtype == torch.int32 and layout.dtype == torch.int64 and tuple(layout.shape) == (E, R)
        assert not (async_finish and return_recv_hook) and not use_logfmt and not zero_copy
        T = topk_idx.size(0)
        if out is not None:
            assert (
                out.dim() == 2 and out.is_contiguous() and tuple(out.shape) == (T, x.size(2)) and out.dtype == x.dtype
            )
        self._check_layout(X0, x.size(2), num_experts)

        # send phase: each counted row goes back to its source rank, keyed by (global expert, source token)
        sends: list[list] = [[] for _ in range(R)]
        for e in range(E):
            for j in range(R):
                b, n = int(layout[e, j]) >> 32, int(layout[e, j]) & 0xFFFFFFFF
                for i in range(b, b + n):
                    sends[j].append((r * E + e, int(src_info[e, i]), x[e, i].clone()))
        objs = [None] * R
        dist.all_gather_object(objs, sends, group=self.group)
        rows = {(g, t): row for per_dest in objs for g, t, row in per_dest[r]}
        combined = out if out is not None else torch.empty(T, x.size(2), dtype=torch.bfloat16)
        combined.fill_(float("nan"))

        def recv() -> None:
            acc = torch.zeros(T, x.size(2))
            for t in range(T):
                for k in range(topk_idx.size(1)):
                    g = int(topk_idx[t, k])
                    if g >= 0:
                        acc[t] += float(topk_weights[t, k]) * rows[(g, t)].float()
            combined.copy_(acc)

        hook = None
        if return_recv_hook:
            hook = recv
        else:
            recv()
        return combined, EventOverlap(None), hook
