"""EP over torch.distributed: all-gather in (fp8 travels quantized, with its
scales), reduce-scatter out (the combine sums the ranks' partial outputs and
hands each rank its own rows).

Legend: T tokens per rank, W ranks, M = W*T rows after dispatch, K hidden, P top-k, G scale groups.
"""

from __future__ import annotations

from ..cards.backends import AllGatherReduceScatterCard
from ..interfaces import Contiguous, PreparedTokens
from ..registry import register_backend
from ._common import localize_ids
from ._dist import EPPrepareFinalize, row_bytes


@register_backend("allgather_rs")
class AllGatherReduceScatter(AllGatherReduceScatterCard, EPPrepareFinalize):
    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        ctx = self.ctx
        gathered = self.gather_quantized(hidden_TK, topk_weights_TP, topk_ids_TP, quant)

        def receive() -> PreparedTokens:
            x_MK, scale_M, w_MP, ids_MP = gathered()
            with self.phases("prepare"):
                ids = localize_ids(ids_MP, ctx.first_local_expert, ctx.num_local_experts)
            return PreparedTokens(x=x_MK, x_scale=scale_M, topk_ids_MP=ids, topk_weights_MP=w_MP)

        return receive

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        partial_MK = self.reduced_rows(expert_out, prepared, weight_and_reduce, Contiguous())
        return self.reduce_scatter_async(out_TK, partial_MK)

    def comm_bytes(self, num_tokens, prepared):
        """Ring all-gather: each rank sends and receives (W-1)*T rows; ring
        reduce-scatter: sends and receives (W-1)*T rows of K bf16."""
        W, s, q = self.ctx.world_size, self.ctx.shape, self.ctx.quant
        scale_bytes = 4 * (s.hidden // q.block_k) if q.is_block else 0
        dispatch = 2 * (W - 1) * num_tokens * row_bytes(s.hidden, q.act_bytes, s.topk, scale_bytes)
        combine = 2 * (W - 1) * num_tokens * s.hidden * 2
        return dispatch + combine
