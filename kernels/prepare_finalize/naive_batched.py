"""EP over torch.distributed in the batched layout: all-gather in, then each
rank scatters the pairs routed to its experts into [E, X, K] buffers (X = W*T
rows at most per expert); the finalize weights each row, sums per token and a
reduce-scatter returns each rank its rows.

Legend: T tokens per rank, W ranks, M = W*T, E local experts, X rows per expert, K hidden.
"""
from __future__ import annotations

import torch.distributed as dist

from ..interfaces import FP8_MAX, ActivationFormat, Batched, PrepareFinalize, resolve_weight_and_reduce
from ..quant import quant_activations, quant_fp8_with_scale
from ..registry import register_backend
from ._common import localize_ids, to_batched
from ._dist import OpenRange, all_gather_rows, row_bytes, wait_all


@register_backend("naive_batched")
class NaiveBatchedPrepareFinalize(PrepareFinalize):
    activation_format = ActivationFormat.BATCHED
    carries_fp8 = True

    @classmethod
    def supports(cls, combo):
        if combo.get("world_size", 1) < 2:
            return "naive_batched is an EP backend: runner.world_size >= 2"
        return None

    def max_rows(self, num_tokens: int) -> int:
        return num_tokens * self.ctx.world_size

    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        ctx = self.ctx
        per_tensor = quant is not None and quant.is_fp8 and not quant.is_block
        with self.phases("prepare"):
            if per_tensor:
                amax = hidden_TK.abs().amax().float().reshape(1)
                dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=ctx.group)
                x, scale = quant_fp8_with_scale(hidden_TK, amax / FP8_MAX)
            else:
                x, scale = quant_activations(hidden_TK, quant)
        send = [x, topk_weights_TP, topk_ids_TP] + ([scale] if scale is not None and not per_tensor else [])
        rng = OpenRange(self.phases, "dispatch")
        outs, works = all_gather_rows(send, ctx.group, ctx.world_size)
        T = hidden_TK.shape[0]

        def receive():
            wait_all(works)
            rng.close()
            x_MK, w_MP, ids_MP = outs[:3]
            scale_M = outs[3] if len(outs) > 3 else scale
            with self.phases("prepare"):
                ids = localize_ids(ids_MP, ctx.first_local_expert, ctx.num_local_experts)
                prepared = to_batched(x_MK, scale_M, ids, ctx.num_local_experts, self.max_rows(T))
            prepared.topk_ids_MP = ids
            prepared.topk_weights_MP = w_MP
            return prepared

        return receive

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        ctx = self.ctx
        wr = resolve_weight_and_reduce(weight_and_reduce, Batched())
        with self.phases("weight_reduce"):
            partial_MK = wr.apply(None, expert_out, prepared.topk_weights_MP, prepared.topk_ids_MP, prepared)
        rng = OpenRange(self.phases, "combine")
        work = dist.reduce_scatter_tensor(out_TK, partial_MK.contiguous(), group=ctx.group, async_op=True)

        def receive():
            work.wait()
            rng.close()

        return receive

    def comm_bytes(self, num_tokens, prepared):
        """Ring all-gather in, ring reduce-scatter out (see allgather_rs)."""
        W, s, q = self.ctx.world_size, self.ctx.shape, self.ctx.quant
        scale_bytes = 4 * (s.hidden // q.block_k) if q.is_block else 0
        return 2 * (W - 1) * num_tokens * (row_bytes(s.hidden, q.act_bytes, s.topk, scale_bytes) + s.hidden * 2)
