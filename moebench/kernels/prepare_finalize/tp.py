"""TP over torch.distributed as vLLM runs fused MoE under tensor parallelism without EP
(MoEPrepareAndFinalizeNoEP, then tensor_model_parallel_all_reduce): every rank holds every
expert at intermediate / W (its slice of the same weights), routes the same T tokens, and ends
with a partial sum of the output; one all-reduce over the W ranks adds the partials, the shared
experts' (sharded the same way) included.

Legend: T tokens (the same on every rank), W ranks, K hidden.
"""

from __future__ import annotations

import torch.distributed as dist

from ..cards.backends import TPCard
from ..interfaces import PrepareFinalize
from ..registry import register_backend
from ._common import finalize_on_rank, prepare_on_rank


@register_backend("tp")
class TPPrepareFinalize(TPCard, PrepareFinalize):
    noop_finalize_copies = True
    reduces_output = True

    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        # no dispatch: every rank holds every expert (and routes the same tokens)
        return prepare_on_rank(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant)

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        # the rank's partial output into out_TK; reduce_output all-reduces it after the shared
        # experts (the copy takes no phase: the combine phase is the all-reduce)
        return finalize_on_rank(self, out_TK, expert_out, prepared, weight_and_reduce, copy_phase=None)

    def reduce_output(self, out_TK) -> None:
        with self.phases("combine"):  # vLLM's tensor_model_parallel_all_reduce, timed
            dist.all_reduce(out_TK, group=self.ctx.group)

    def comm_bytes(self, num_tokens, prepared):
        """Ring all-reduce of [T, K] bf16: each rank sends and receives 2*(W-1)/W of it each way."""
        W, K = self.ctx.world_size, self.ctx.shape.hidden
        return 2 * (2 * (W - 1) * num_tokens * K * 2) // W
