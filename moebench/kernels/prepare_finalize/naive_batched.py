"""EP over torch.distributed in the batched layout: all-gather in, then each
rank scatters the pairs routed to its experts into [E, X, K] buffers (X = W*T
rows at most per expert); the finalize weights each row, sums per token and a
reduce-scatter returns each rank its rows.

Legend: T tokens per rank, W ranks, M = W*T, E local experts, X rows per expert, K hidden.
"""

from __future__ import annotations

from ..cards.backends import NaiveBatchedCard
from ..interfaces import Batched, resolve_weight_and_reduce
from ..registry import register_backend
from ._common import localize_ids, to_batched
from ._dist import EPPrepareFinalize, row_bytes


@register_backend("naive_batched")
class NaiveBatchedPrepareFinalize(NaiveBatchedCard, EPPrepareFinalize):
    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        ctx = self.ctx
        gathered = self.gather_quantized(hidden_TK, topk_weights_TP, topk_ids_TP, quant)
        T = hidden_TK.shape[0]

        def receive():
            x_MK, scale_M, w_MP, ids_MP = gathered()
            with self.phases("prepare"):
                ids = localize_ids(ids_MP, ctx.first_local_expert, ctx.num_local_experts)
                prepared = to_batched(x_MK, scale_M, ids, ctx.num_local_experts, self.max_rows(T))
            prepared.topk_ids_MP = ids
            prepared.topk_weights_MP = w_MP
            return prepared

        return receive

    def max_rows(self, num_tokens: int) -> int:
        # every rank's tokens may pick an expert once; workload.fill sets its own (validity.FILL_BACKENDS)
        return self.rows_per_expert or num_tokens * self.ctx.world_size

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        wr = resolve_weight_and_reduce(weight_and_reduce, Batched())
        with self.phases("weight_reduce"):
            partial_MK = wr.apply(None, expert_out, prepared.topk_weights_MP, prepared.topk_ids_MP, prepared)
        return self.reduce_scatter_async(out_TK, partial_MK)

    def comm_bytes(self, num_tokens, prepared):
        """Ring all-gather in, ring reduce-scatter out (see allgather_rs)."""
        W, s, q = self.ctx.world_size, self.ctx.shape, self.ctx.quant
        scale_bytes = 4 * (s.hidden // q.block_k) if q.is_block else 0
        return 2 * (W - 1) * num_tokens * (row_bytes(s.hidden, q.act_bytes, s.topk, scale_bytes) + s.hidden * 2)
