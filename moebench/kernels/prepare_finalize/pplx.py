"""pplx-kernels all-to-all, batched layout (vLLM's PplxPrepareAndFinalize).

prepare:  quantize (fp8_block: fp8 rows + 1x128 fp32 scales, carried by the dispatch;
          fp8_tensor dispatches bf16 and the experts quantize the counted rows), then
          pplx's dispatch writes each (token, k) pair into the expert's rows of
          x [E, X, K] (X = max_tokens_per_rank * W) and the per-expert counts.
finalize: pplx's combine returns every pair's expert row to its token's rank and there
          weights it by the top-k weight and sums it into out [T, K] (reduction=finalize).
Async:    the send/receive split of both kernels (do_send / do_recv): prepare_async and
          finalize_async launch the send half, the receiver launches the receive half on
          the same stream, so the shared experts run between them.

The AllToAll (buffers for max_tokens_per_rank) is cached per process group (_pplx.py);
`backend.pplx_mode=internode` picks the NVSHMEM transport (pplx's own benchmark) over the
default CUDA-IPC intranode one (vLLM on one node).

Upstream defect (pplx-kernels csrc/all_to_all/intranode_dispatch.cu, send loop): the
intranode dispatch runs one block per SM (132 on an H200), each block stages a token in
one shared-memory row and sends it, and nothing stops the block's next token from being
copied into that row while warps still send the previous one. With more tokens per rank
than blocks, received rows mix two tokens. Confirmed on 2 x H200 (docs/findings/deepep-pplx.md):
intranode 132 tokens per rank ok (rel_err 0.004), 133 incorrect (0.039), 512 incorrect
(0.43); internode at 512 ok (0.004). Build pplx with
a __syncthreads() at the end of that loop body; the internode transport stages rows in
global memory and does not share this race.

Legend: T tokens on this rank, P top-k, K hidden, G = K / 128 (Gp: G rounded up to 4),
E local experts, X rows per expert, W ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..cards.backends import PplxCard
from ..cards.backends import pplx_dispatch_format as _dispatch_format
from ..cards.backends import pplx_mode as _mode
from ..interfaces import Delegate, PreparedTokens, PrepareFinalize
from ..quant import quant_activations
from ..registry import register_backend
from . import _pplx
from ._dist import OpenRange


@dataclass(frozen=True)
class PplxHandle:
    """What the combine needs, plus the routing comm_bytes() reads."""

    ids_TP: torch.Tensor  # uint32 global expert ids (pplx's index dtype)
    weights_TP: torch.Tensor  # fp32 top-k weights, applied by the combine
    topk_ids_TP: torch.Tensor  # the caller's ids (int64), for accounting
    dispatch_row_bytes: int  # bytes one dispatched pair carries


@register_backend("pplx")
class PplxPrepareFinalize(PplxCard, PrepareFinalize):
    def __init__(self, ctx):
        super().__init__(ctx)
        if ctx.group is not None:
            self.group = ctx.group
        else:
            import torch.distributed as dist

            self.group = dist.group.WORLD
        self.mode = _mode(ctx.options)
        s, W = ctx.shape, ctx.world_size
        self.block = ctx.quant.is_block
        row, scale_bytes, self.gp = _dispatch_format(s.hidden, "fp8_block" if self.block else "bf16")
        self.spec = _pplx.A2ASpec(
            mode=self.mode,
            max_num_tokens=ctx.max_tokens_per_rank,
            num_experts=s.num_experts,
            experts_per_token=s.topk,
            rank=ctx.rank,
            world_size=W,
            hidden_dim=s.hidden,
            hidden_dim_bytes=row,
            hidden_dim_scale_bytes=scale_bytes,
        )
        self.X = ctx.max_tokens_per_rank * W  # rows per expert: every rank's tokens may pick it
        # allocate (collectively) at setup, not in the first timed forward
        self._entry = _pplx.get_all_to_all(self.group, self.spec, ctx.device)

    # -- prepare ----------------------------------------------------------------
    def _settle(self) -> None:
        """Finish a dispatch that was never combined (e.g. a prepare() for accounting):
        pplx's protocol needs a combine after each dispatch on every rank."""
        pending, self._entry.pending = self._entry.pending, None
        if pending is not None:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("pplx: a dispatch without its combine is pending while a CUDA graph is captured")
            pending()

    def _dummy_combine(self, handle: PplxHandle, x_EXK: torch.Tensor):
        """A combine that returns the AllToAll to idle, its output discarded: the received
        bf16 rows stand in for the experts' output (fp8 rows: a scratch buffer)."""
        a2a, E, K = self._entry.a2a, self.ctx.num_local_experts, self.ctx.shape.hidden
        dev = handle.ids_TP.device

        def run() -> None:
            y = x_EXK if x_EXK.dtype == torch.bfloat16 else torch.empty(E, self.X, K, dtype=torch.bfloat16, device=dev)
            out = torch.empty(handle.ids_TP.shape[0], K, dtype=torch.bfloat16, device=dev)
            a2a.combine(out, handle.ids_TP, handle.weights_TP, y, None)

        return run

    def _launch_dispatch(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant, split: bool):
        assert hidden_TK.dtype == torch.bfloat16, "pplx dispatches bf16 (or fp8_block) rows"
        ctx, a2a = self.ctx, self._entry.a2a
        T, K = hidden_TK.shape
        if T > ctx.max_tokens_per_rank:
            raise ValueError(
                f"{T} tokens exceed the pplx buffers' cap backend.max_tokens_per_rank={ctx.max_tokens_per_rank}"
            )
        block = quant is not None and quant.is_block
        if block != self.block:
            raise ValueError(f"this pplx AllToAll was sized for {'fp8_block' if self.block else 'bf16'} rows")
        self._settle()
        E, dev = ctx.num_local_experts, hidden_TK.device
        with self.phases("prepare"):
            if block:
                x_TK, scale_TG = quant_activations(hidden_TK, quant)  # fp8 [T, K], fp32 [T, G]
                G = scale_TG.shape[1]
                # pplx copies Gp scales a row (16-byte multiples): pad, so no read runs past a row
                scale_TG = F.pad(scale_TG, (0, self.gp - G)) if self.gp != G else scale_TG.contiguous()
            else:
                x_TK, scale_TG, G = hidden_TK.contiguous(), None, 0
            ids_TP = topk_ids_TP.to(torch.int32).contiguous().view(torch.uint32)
            w_TP = topk_weights_TP.to(torch.float32).contiguous()
            counts_E = torch.empty(E, dtype=torch.int32, device=dev)
            x_EXK = torch.empty(E, self.X, K, dtype=x_TK.dtype, device=dev)
            xs_EXG = torch.empty(E, self.X, self.gp, dtype=torch.float32, device=dev) if block else None
        handle = PplxHandle(
            ids_TP, w_TP, topk_ids_TP, self.spec.hidden_dim_bytes + self.spec.hidden_dim_scale_bytes + 4
        )
        span = OpenRange(self.phases, "dispatch")  # launch -> receive
        a2a.dispatch(counts_E, x_EXK, xs_EXG, x_TK, scale_TG, ids_TP, None, do_send=True, do_recv=not split)
        entry = self._entry
        combine_later = self._dummy_combine(handle, x_EXK)
        if split:

            def finish_recv():
                a2a.dispatch(counts_E, x_EXK, xs_EXG, x_TK, scale_TG, ids_TP, None, do_send=False, do_recv=True)

            entry.pending = lambda: (finish_recv(), combine_later())
        else:
            entry.pending = combine_later

        def receive() -> PreparedTokens:
            if split:
                entry.pending = combine_later
                finish_recv()
            span.close()
            return PreparedTokens(
                x=x_EXK,
                x_scale=None if xs_EXG is None else xs_EXG[:, :, :G],
                expert_num_tokens_E=counts_E,
                handle=handle,
            )

        return receive

    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        return self._launch_dispatch(hidden_TK, topk_weights_TP, topk_ids_TP, quant, split=True)

    def prepare(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant) -> PreparedTokens:
        return self._launch_dispatch(hidden_TK, topk_weights_TP, topk_ids_TP, quant, split=False)()

    # -- finalize ---------------------------------------------------------------
    def _launch_combine(self, out_TK, expert_out, prepared, weight_and_reduce, split: bool):
        if not isinstance(weight_and_reduce, Delegate):
            raise ValueError(
                f"pplx's combine weights and sums the top-k rows itself; the experts must return "
                f"per-expert rows (reduction=finalize), got {weight_and_reduce!r}"
            )
        h: PplxHandle = prepared.handle
        if expert_out.dtype != torch.bfloat16 or not expert_out.is_contiguous():
            expert_out = expert_out.to(torch.bfloat16).contiguous()
        assert out_TK.dtype == torch.bfloat16 and out_TK.is_contiguous() and out_TK.shape[0] == h.ids_TP.shape[0]
        entry, a2a = self._entry, self._entry.a2a
        # this combine settles the dispatch (whatever the order of the receiver calls)
        entry.pending = None
        span = OpenRange(self.phases, "combine")  # launch -> receive
        a2a.combine(out_TK, h.ids_TP, h.weights_TP, expert_out, None, do_send=True, do_recv=not split)

        def finish_recv() -> None:
            a2a.combine(out_TK, h.ids_TP, h.weights_TP, expert_out, None, do_send=False, do_recv=True)

        if split:
            entry.pending = finish_recv

        def receive() -> None:
            if split:
                entry.pending = None
                finish_recv()
            span.close()

        return receive

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        return self._launch_combine(out_TK, expert_out, prepared, weight_and_reduce, split=True)

    def finalize(self, out_TK, expert_out, prepared, weight_and_reduce) -> None:
        self._launch_combine(out_TK, expert_out, prepared, weight_and_reduce, split=False)()

    # -- planning and accounting ------------------------------------------------
    def max_rows(self, num_tokens: int) -> int:
        """X: the receive buffers hold max_tokens_per_rank rows from each rank per expert."""
        return self.ctx.max_tokens_per_rank * self.ctx.world_size

    def prepared_bytes(self, num_tokens: int, quant) -> int:
        """Bytes prepare allocates that live through the forward:
        received rows x [E, X, K] (K bytes fp8_block, else 2K) + scales [E, X, Gp] fp32
        + counts [E] int32; sent: the fp8 copy [T, K] + its scales [T, Gp] (fp8_block);
        top-k ids (uint32) and weights (fp32) [T, P] for the combine."""
        ctx, s = self.ctx, self.ctx.shape
        E, X, T, K = ctx.num_local_experts, self.max_rows(num_tokens), num_tokens, s.hidden
        n = E * 4 + T * s.topk * (4 + 4)
        if self.block:
            n += E * X * (K + 4 * self.gp) + T * (K + 4 * self.gp)
        else:
            n += E * X * 2 * K
        return n

    def comm_bytes(self, num_tokens: int, prepared: PreparedTokens) -> int:
        """Bytes this rank sends + receives over NVLink in dispatch + combine.

        pplx moves each (token, k) pair separately (no per-rank de-duplication):
        pairs_out = this rank's pairs routed to other ranks' experts
        pairs_in  = pairs it receives from other ranks = sum(expert counts) - pairs to itself
        dispatch moves a pair as its row (K fp8 / 2K bf16) + scales (fp8_block: 4 Gp) + a 4-byte index;
        combine sends each received pair back as 2K bf16 bytes and receives its own pairs.
        total = (pairs_out + pairs_in) * (dispatch_row_bytes + 2K). Pairs a rank routes to
        its own experts stay in local memory and are not counted.
        """
        h: PplxHandle = prepared.handle
        ctx = self.ctx
        ids_TP = h.topk_ids_TP.long()
        owner_TP = ids_TP // ctx.num_local_experts
        routed = ids_TP >= 0  # an id of -1 (no expert) sends nothing
        to_self = int(((owner_TP == ctx.rank) & routed).sum())
        pairs_out = int(routed.sum()) - to_self
        assert prepared.expert_num_tokens_E is not None, "pplx's dispatch counts each expert's rows"
        pairs_in = int(prepared.expert_num_tokens_E.long().sum()) - to_self
        return (pairs_out + pairs_in) * (h.dispatch_row_bytes + 2 * ctx.shape.hidden)

    def close(self) -> None:
        """Drop this instance's reference; the AllToAll stays cached for the group's other
        combinations (release_group() frees it). A dispatch still waiting for its combine
        is settled by the next dispatch or by the release, which every rank reaches in the
        same order; a close after a failure on one rank adds no collective."""
        self._entry = None

    @classmethod
    def release_group(cls, group) -> None:
        _pplx.release_group(group)
