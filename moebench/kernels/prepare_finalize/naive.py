"""EP over torch.distributed as vLLM's naive all2all: every rank broadcasts its
tokens to all (dispatch), each rank runs its local experts on all tokens, and an
all-reduce sums the partial outputs (combine). bf16 travels; fp8 experts
quantize after the dispatch.

Legend: T tokens per rank, W ranks, M = W*T rows after dispatch, K hidden, P top-k.
"""

from __future__ import annotations

import torch.distributed as dist

from ..cards.backends import NaiveCard
from ..interfaces import Contiguous, PreparedTokens
from ..quant import quant_activations
from ..registry import register_backend
from ._common import localize_ids
from ._dist import EPPrepareFinalize, OpenRange, broadcast_rows, row_bytes, wait_all


@register_backend("naive")
class NaivePrepareFinalize(NaiveCard, EPPrepareFinalize):
    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        ctx = self.ctx
        rng = OpenRange(self.phases, "dispatch")
        (x_MK, w_MP, ids_MP), works = broadcast_rows(
            [hidden_TK, topk_weights_TP, topk_ids_TP], ctx.group, ctx.world_size, ctx.rank
        )

        def receive() -> PreparedTokens:
            wait_all(works)
            rng.close()
            with self.phases("prepare"):  # quantize after the dispatch
                x, scale = quant_activations(x_MK, quant)
                ids = localize_ids(ids_MP, ctx.first_local_expert, ctx.num_local_experts)
            return PreparedTokens(x=x, x_scale=scale, topk_ids_MP=ids, topk_weights_MP=w_MP)

        return receive

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        ctx = self.ctx
        partial_MK = self.reduced_rows(expert_out, prepared, weight_and_reduce, Contiguous())
        rng = OpenRange(self.phases, "combine")
        work = dist.all_reduce(partial_MK, group=ctx.group, async_op=True)
        T, r = out_TK.shape[0], ctx.rank

        def receive() -> None:
            work.wait()
            out_TK.copy_(partial_MK[r * T : (r + 1) * T])
            rng.close()

        return receive

    def comm_bytes(self, num_tokens, prepared):
        """dispatch: each rank sends its T rows to W-1 peers and receives (W-1)*T rows;
        combine: ring all-reduce of [W*T, K] bf16 sends and receives 2*(W-1)/W of it each way."""
        W, s = self.ctx.world_size, self.ctx.shape
        dispatch = 2 * (W - 1) * num_tokens * row_bytes(s.hidden, 2, s.topk)
        combine = 2 * 2 * (W - 1) * num_tokens * s.hidden * 2
        return dispatch + combine
