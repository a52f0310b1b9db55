"""One rank, standard layout: no communication (vLLM's MoEPrepareAndFinalizeNoEP).

With simulate_ep=N the rank keeps experts [0, E/N) and only the pairs routed to
them, so one GPU measures the per-rank expert work of an EP-N deployment.
"""

from __future__ import annotations

from ..cards.backends import LocalCard
from ..interfaces import (
    Contiguous,
    NoOp,
    PreparedTokens,
    PrepareFinalize,
    resolve_weight_and_reduce,
)
from ..registry import register_backend
from ._common import quant_and_localize


@register_backend("local")
class LocalPrepareFinalize(LocalCard, PrepareFinalize):
    noop_finalize_copies = True

    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        with self.phases("prepare"):
            # on CUDA with fp8_block and ids to localize: one kernel for both (issue #34)
            x, scale, ids = quant_and_localize(
                hidden_TK,
                topk_ids_TP,
                quant,
                self.ctx.first_local_expert,
                self.ctx.num_local_experts,
                self.ctx.shape.num_experts,
            )
        prepared = PreparedTokens(x=x, x_scale=scale, topk_ids_MP=ids, topk_weights_MP=topk_weights_TP)
        return lambda: prepared

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        wr = resolve_weight_and_reduce(weight_and_reduce, Contiguous())
        if isinstance(wr, NoOp):
            with self.phases("combine"):  # nothing to communicate: a copy, none where the
                if expert_out is not out_TK:  # experts wrote out_TK (MoEKernel, noop_finalize_copies)
                    out_TK.copy_(expert_out)
        else:
            with self.phases("weight_reduce"):
                wr.apply(out_TK, expert_out, prepared.topk_weights_MP, prepared.topk_ids_MP, prepared)
        return lambda: None
