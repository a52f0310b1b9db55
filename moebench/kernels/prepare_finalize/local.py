"""One rank, standard layout: no communication (vLLM's MoEPrepareAndFinalizeNoEP).

With simulate_ep=N the rank keeps experts [0, E/N) and only the pairs routed to
them, so one GPU measures the per-rank expert work of an EP-N deployment.
"""

from __future__ import annotations

from ..cards.backends import LocalCard
from ..interfaces import PrepareFinalize
from ..registry import register_backend
from ._common import finalize_on_rank, prepare_on_rank


@register_backend("local")
class LocalPrepareFinalize(LocalCard, PrepareFinalize):
    noop_finalize_copies = True

    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        return prepare_on_rank(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant)

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        # nothing to communicate: the combine is the copy (none where the experts wrote out_TK)
        return finalize_on_rank(self, out_TK, expert_out, prepared, weight_and_reduce, copy_phase="combine")
