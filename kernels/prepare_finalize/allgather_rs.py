"""EP over torch.distributed: all-gather in (fp8 travels quantized, with its
scales), reduce-scatter out (the combine sums the ranks' partial outputs and
hands each rank its own rows).

Legend: T tokens per rank, W ranks, M = W*T rows after dispatch, K hidden, P top-k, G scale groups.
"""
from __future__ import annotations

import torch.distributed as dist

from ..interfaces import ActivationFormat, Contiguous, NoOp, PreparedTokens, PrepareFinalize, resolve_weight_and_reduce
from ..interfaces import FP8_MAX
from ..quant import quant_activations, quant_fp8_with_scale
from ..registry import register_backend
from ._common import localize_ids
from ._dist import OpenRange, all_gather_rows, row_bytes, wait_all


@register_backend("allgather_rs")
class AllGatherReduceScatter(PrepareFinalize):
    activation_format = ActivationFormat.STANDARD
    carries_fp8 = True

    @classmethod
    def supports(cls, combo):
        if combo.get("world_size", 1) < 2:
            return "allgather_rs is an EP backend: runner.world_size >= 2"
        return None

    def max_rows(self, num_tokens: int) -> int:
        return num_tokens * self.ctx.world_size

    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        ctx = self.ctx
        per_tensor = quant is not None and quant.is_fp8 and not quant.is_block
        with self.phases("prepare"):
            if per_tensor:
                # one dynamic scale for the whole dispatched tensor: the max over ranks
                amax = hidden_TK.abs().amax().float().reshape(1)
                dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=ctx.group)
                x, scale = quant_fp8_with_scale(hidden_TK, amax / FP8_MAX)
            else:
                x, scale = quant_activations(hidden_TK, quant)
        send = [x, topk_weights_TP, topk_ids_TP] + ([scale] if scale is not None and not per_tensor else [])
        rng = OpenRange(self.phases, "dispatch")
        outs, works = all_gather_rows(send, ctx.group, ctx.world_size)

        def receive() -> PreparedTokens:
            wait_all(works)
            rng.close()
            x_MK, w_MP, ids_MP = outs[:3]
            scale_M = outs[3] if len(outs) > 3 else scale
            with self.phases("prepare"):
                ids = localize_ids(ids_MP, ctx.first_local_expert, ctx.num_local_experts)
            return PreparedTokens(x=x_MK, x_scale=scale_M, topk_ids_MP=ids, topk_weights_MP=w_MP)

        return receive

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        ctx = self.ctx
        wr = resolve_weight_and_reduce(weight_and_reduce, Contiguous())
        if isinstance(wr, NoOp):
            partial_MK = expert_out
        else:
            with self.phases("weight_reduce"):
                partial_MK = wr.apply(None, expert_out, prepared.topk_weights_MP, prepared.topk_ids_MP, prepared)
        rng = OpenRange(self.phases, "combine")
        work = dist.reduce_scatter_tensor(out_TK, partial_MK.contiguous(), group=ctx.group, async_op=True)

        def receive() -> None:
            work.wait()
            rng.close()

        return receive

    def comm_bytes(self, num_tokens, prepared):
        """Ring all-gather: each rank sends and receives (W-1)*T rows; ring
        reduce-scatter: sends and receives (W-1)*T rows of K bf16."""
        W, s, q = self.ctx.world_size, self.ctx.shape, self.ctx.quant
        scale_bytes = 4 * (s.hidden // q.block_k) if q.is_block else 0
        dispatch = 2 * (W - 1) * num_tokens * row_bytes(s.hidden, q.act_bytes, s.topk, scale_bytes)
        combine = 2 * (W - 1) * num_tokens * s.hidden * 2
        return dispatch + combine
