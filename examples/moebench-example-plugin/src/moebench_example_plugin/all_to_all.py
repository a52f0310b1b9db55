"""`backend=example_a2a`: expert parallelism over torch.distributed.all_to_all_single.

Dispatch: each token travels once to every rank that owns at least one of its top-k
experts (with all its top-k ids and weights; the receiver keeps its own experts' ids and
marks the others -1). Combine: each rank sends back, per received row, the weighted sum
over its own experts; the sender adds the partial sums of its token's ranks. The split
sizes are exchanged first (a small all-to-all whose counts reach the host), so the
layer cannot be captured in a CUDA graph.

Legend: T tokens on this rank, W ranks, S rows this rank sends, M rows it receives,
K hidden, P top-k, E experts per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from moebench.kernels.interfaces import ActivationFormat, Contiguous, Knob, OpenRange, PreparedTokens, PrepareFinalize
from moebench.kernels.quant import quant_activations
from moebench.kernels.registry import register_backend


@dataclass
class Route:
    """Where the dispatched rows went: what finalize needs to send them back."""

    token_S: torch.Tensor  # the local token of each sent row, rows grouped by destination rank
    send_W: list  # rows sent to each rank
    recv_W: list  # rows received from each rank


@register_backend("example_a2a")
class AllToAllPrepareFinalize(PrepareFinalize):
    activation_format = ActivationFormat.STANDARD
    carries_fp8 = False  # bf16 travels; fp8 experts get their input quantized after the dispatch
    graph_capturable = False
    knobs = (
        Knob(
            "a2a_async",
            True,
            "launch the all-to-alls asynchronously (false: wait inside the launch, so "
            "shared experts cannot overlap them)",
            tag="a2a_sync",
        ),
    )

    def max_rows(self, num_tokens: int) -> int:
        return num_tokens * self.ctx.world_size  # at most every peer's every token

    def prepared_bytes(self, num_tokens, quant) -> int:
        """The received rows [M, K] bf16 with their top-k ids (int64) and weights (fp32), and
        the quantized copy of them where the experts want fp8."""
        rows, s = self.max_rows(num_tokens), self.ctx.shape
        return rows * (s.hidden * 2 + s.topk * (8 + 4)) + super().prepared_bytes(num_tokens, quant)

    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        ctx = self.ctx
        W, E, dev = ctx.world_size, ctx.num_local_experts, hidden_TK.device
        with self.phases("prepare"):
            dest_TP = topk_ids_TP.long() // E
            to_rank_WT = (dest_TP.unsqueeze(0) == torch.arange(W, device=dev).view(W, 1, 1)).any(dim=2)
            _, token_S = torch.nonzero(to_rank_WT, as_tuple=True)  # grouped by rank, token order inside
            send_counts_W = to_rank_WT.sum(dim=1)
        rng = OpenRange(self.phases, "dispatch")
        recv_counts_W = torch.empty_like(send_counts_W)
        dist.all_to_all_single(recv_counts_W, send_counts_W, group=ctx.group)
        send_W, recv_W = send_counts_W.tolist(), recv_counts_W.tolist()
        M = sum(recv_W)
        outs, works = [], []
        for t in (hidden_TK, topk_weights_TP, topk_ids_TP.long()):
            out = t.new_empty((M, *t.shape[1:]))
            works.append(
                dist.all_to_all_single(out, t[token_S].contiguous(), recv_W, send_W, group=ctx.group, async_op=True)
            )
            outs.append(out)
        if not ctx.options.get("a2a_async", True):
            for w in works:
                w.wait()

        def receive() -> PreparedTokens:
            for w in works:
                w.wait()
            rng.close()
            x_MK, w_MP, ids_MP = outs
            with self.phases("prepare"):  # quantize after the dispatch; keep this rank's experts
                x, scale = quant_activations(x_MK, quant)
                local_MP = ids_MP - ctx.rank * E
                local_MP = torch.where((local_MP >= 0) & (local_MP < E), local_MP, torch.full_like(local_MP, -1))
            return PreparedTokens(
                x=x, x_scale=scale, topk_ids_MP=local_MP, topk_weights_MP=w_MP, handle=Route(token_S, send_W, recv_W)
            )

        return receive

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        ctx, route = self.ctx, prepared.handle
        partial_MK = self.reduced_rows(expert_out, prepared, weight_and_reduce, Contiguous())
        rng = OpenRange(self.phases, "combine")
        back_SK = partial_MK.new_empty((route.token_S.numel(), partial_MK.shape[1]))
        work = dist.all_to_all_single(
            back_SK, partial_MK.contiguous(), route.send_W, route.recv_W, group=ctx.group, async_op=True
        )
        if not ctx.options.get("a2a_async", True):
            work.wait()

        def receive() -> None:
            work.wait()
            acc_TK = torch.zeros(out_TK.shape, dtype=torch.float32, device=out_TK.device)
            acc_TK.index_add_(0, route.token_S, back_SK.float())  # a token's ranks' partial sums
            out_TK.copy_(acc_TK)
            rng.close()

        return receive

    def comm_bytes(self, num_tokens, prepared):
        """Rows to and from the other ranks (a rank's rows to itself stay local): in, a bf16
        row with its top-k ids (int64) and weights (fp32); out, a bf16 row."""
        route, s, me = prepared.handle, self.ctx.shape, self.ctx.rank
        rows = sum(route.send_W) - route.send_W[me] + sum(route.recv_W) - route.recv_W[me]
        return rows * (s.hidden * 2 + s.topk * (8 + 4)) + rows * s.hidden * 2
