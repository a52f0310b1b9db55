"""One rank, batched layout: tokens scattered into [E, X, K] per-expert buffers,
as the low-latency dispatchers produce them; the finalize weights and sums."""

from __future__ import annotations

from ..cards.backends import LocalBatchedCard
from ..interfaces import Batched, PrepareFinalize, resolve_weight_and_reduce
from ..quant import quant_activations
from ..registry import register_backend
from ._common import localize_ids, to_batched


@register_backend("local_batched")
class LocalBatchedPrepareFinalize(LocalBatchedCard, PrepareFinalize):
    def max_rows(self, num_tokens: int) -> int:
        # an expert gets each token at most once; workload.fill sets its own (validity.FILL_BACKENDS)
        return self.rows_per_expert or num_tokens

    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        with self.phases("prepare"):
            x, scale = quant_activations(hidden_TK, quant)
            ids = localize_ids(
                topk_ids_TP, self.ctx.first_local_expert, self.ctx.num_local_experts, self.ctx.shape.num_experts
            )
            prepared = to_batched(x, scale, ids, self.ctx.num_local_experts, self.max_rows(hidden_TK.shape[0]))
            prepared.topk_ids_MP = ids
            prepared.topk_weights_MP = topk_weights_TP
        return lambda: prepared

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        wr = resolve_weight_and_reduce(weight_and_reduce, Batched())
        with self.phases("weight_reduce"):
            wr.apply(out_TK, expert_out, prepared.topk_weights_MP, prepared.topk_ids_MP, prepared)
        return lambda: None
