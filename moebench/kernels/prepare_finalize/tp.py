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
from ..interfaces import Contiguous, NoOp, PreparedTokens, PrepareFinalize, resolve_weight_and_reduce
from ..registry import register_backend
from ._common import quant_and_localize


@register_backend("tp")
class TPPrepareFinalize(TPCard, PrepareFinalize):
    noop_finalize_copies = True
    reduces_output = True

    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        ctx = self.ctx
        with self.phases("prepare"):  # no dispatch: every rank holds every expert
            x, scale, ids = quant_and_localize(
                hidden_TK, topk_ids_TP, quant, ctx.first_local_expert, ctx.num_local_experts, ctx.shape.num_experts
            )
        prepared = PreparedTokens(x=x, x_scale=scale, topk_ids_MP=ids, topk_weights_MP=topk_weights_TP)
        return lambda: prepared

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        # the rank's partial output into out_TK; reduce_output all-reduces it after the shared experts
        wr = resolve_weight_and_reduce(weight_and_reduce, Contiguous())
        if isinstance(wr, NoOp):
            if expert_out is not out_TK:  # (none where the experts wrote out_TK: noop_finalize_copies)
                out_TK.copy_(expert_out)
        else:
            with self.phases("weight_reduce"):
                wr.apply(out_TK, expert_out, prepared.topk_weights_MP, prepared.topk_ids_MP, prepared)
        return lambda: None

    def reduce_output(self, out_TK) -> None:
        with self.phases("combine"):  # vLLM's tensor_model_parallel_all_reduce, timed
            dist.all_reduce(out_TK, group=self.ctx.group)

    def comm_bytes(self, num_tokens, prepared):
        """Ring all-reduce of [T, K] bf16: each rank sends and receives 2*(W-1)/W of it each way."""
        W, K = self.ctx.world_size, self.ctx.shape.hidden
        return 2 * (2 * (W - 1) * num_tokens * K * 2) // W
