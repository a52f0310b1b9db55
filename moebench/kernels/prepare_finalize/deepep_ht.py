"""DeepEP high-throughput all-to-all, standard layout (vLLM's DeepEPHTPrepareAndFinalize).

prepare:  quantize (fp8_block: fp8 rows + 1x128 fp32 scales, carried by the
          dispatch) -> get_dispatch_layout -> dispatch; fp8_tensor dispatches
          bf16 and quantizes the received rows (DeepEP carries per-row scales,
          not one scale for a tensor made of several ranks' rows).
finalize: weight-and-reduce [M, P, K] -> [M, K] unless the experts did (NoOp),
          then combine, which sums each token's rows from all ranks (no weights).
Async:    prepare_async / finalize_async launch on DeepEP's communication stream
          with async_finish=True; the receiver makes the current stream wait on
          the returned EventOverlap, so shared experts overlap the transfer.

Legend: T tokens on this rank, M rows received, P top-k, K hidden, G = K / 128,
R ranks, E local experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cards.backends import DEFAULT_NUM_SMS, DeepEPHTCard, ht_row_bytes
from ..interfaces import (
    Contiguous,
    NoOp,
    PreparedTokens,
    PrepareFinalize,
    resolve_weight_and_reduce,
)
from ..quant import quant_activations
from ..registry import register_backend
from . import _deepep
from ._deepep import release_buffers
from ._dist import OpenRange


@dataclass(frozen=True)
class DeepEPHTHandle:
    """What the combine needs, plus the counts comm_bytes() reads."""

    # DeepEP's intranode handle: (rank_prefix_matrix [R, R], channel_prefix_matrix,
    # recv_channel_prefix_matrix, recv_src_idx [M], is_token_in_rank [T, R], send_head)
    deepep: tuple
    num_tokens_per_expert: list  # rows received per local expert (python ints)
    dispatch_row_bytes: int  # bytes one dispatched row carries (see comm_bytes)


@register_backend("deepep_ht")
class DeepEPHTPrepareFinalize(DeepEPHTCard, PrepareFinalize):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.num_sms = int(ctx.options.get("num_sms", DEFAULT_NUM_SMS))
        if self.num_sms <= 0 or self.num_sms % 2:
            raise ValueError(
                f"num_sms={self.num_sms}: DeepEP needs a positive even SM count (one send + one receive SM per channel)"
            )
        if ctx.group is not None:
            self.group = ctx.group
        else:
            import torch.distributed as dist

            self.group = dist.group.WORLD
        # allocate (collectively) at setup, not in the first timed forward;
        # bf16 and fp8 rows share one buffer sized for hidden * 2 bytes
        self._ht = _deepep.get_ht_buffer(
            self.group,
            ctx.shape.hidden * 2,
            self.num_sms,
            int(ctx.options.get("dispatch_nvl_chunk", 0)),
            int(ctx.options.get("combine_nvl_chunk", 0)),
        )

    # -- prepare ----------------------------------------------------------------
    def _launch_dispatch(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant, async_finish: bool):
        assert hidden_TK.dtype == torch.bfloat16, "deepep_ht dispatches bf16 (or fp8_block) rows"
        ht = self._ht
        block = quant is not None and quant.is_block
        with self.phases("prepare"):
            if block:
                x_TK, scale_TG = quant_activations(hidden_TK, quant)  # fp8 [T, K], fp32 [T, G]
                payload = (x_TK, scale_TG)
            else:
                payload = hidden_TK.contiguous()
            ids_TP = topk_ids_TP.to(torch.int64).contiguous()
            w_TP = topk_weights_TP.to(torch.float32).contiguous()
            # runs on DeepEP's stream; the current stream waits for it (async_finish=False)
            n_rank, n_rdma, n_expert, in_rank_TR, _ = ht.buffer.get_dispatch_layout(ids_TP, self.ctx.shape.num_experts)
        span = OpenRange(self.phases, "dispatch")  # launch -> receive
        recv, recv_ids_MP, recv_w_MP, per_expert, handle, event = ht.buffer.dispatch(
            payload,
            num_tokens_per_rank=n_rank,
            num_tokens_per_rdma_rank=n_rdma,
            is_token_in_rank=in_rank_TR,
            num_tokens_per_expert=n_expert,
            topk_idx=ids_TP,
            topk_weights=w_TP,
            config=ht.dispatch_config,
            async_finish=async_finish,
        )
        K = hidden_TK.shape[1]
        qname = "fp8_block" if block else "bf16"
        # x row + its scales + top-k ids (int64) and weights (fp32) + source index (int32)
        row_bytes = ht_row_bytes(K, qname) + (4 * (K // 128) if block else 0) + 12 * ids_TP.shape[1] + 4

        def receive() -> PreparedTokens:
            if async_finish:
                event.current_stream_wait()
            span.close()
            x_MK, scale = recv if block else (recv, None)
            if quant is not None and quant.is_fp8 and not block:
                # fp8_tensor: one scale over the received rows of all ranks
                with self.phases("prepare"):
                    if x_MK.shape[0]:
                        x_MK, scale = quant_activations(x_MK, quant)
                    else:
                        x_MK = x_MK.to(torch.float8_e4m3fn)
                        scale = torch.ones(1, dtype=torch.float32, device=x_MK.device)
            # DeepEP already maps the received ids to this rank's local experts
            # (-1 where the pair belongs to another rank) and zeroes those weights
            return PreparedTokens(
                x=x_MK,
                x_scale=scale,
                topk_ids_MP=recv_ids_MP,
                topk_weights_MP=recv_w_MP,
                handle=DeepEPHTHandle(handle, list(per_expert), row_bytes),
            )

        return receive

    def prepare_async(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        return self._launch_dispatch(hidden_TK, topk_weights_TP, topk_ids_TP, quant, async_finish=True)

    def prepare(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant) -> PreparedTokens:
        return self._launch_dispatch(hidden_TK, topk_weights_TP, topk_ids_TP, quant, async_finish=False)()

    # -- finalize ---------------------------------------------------------------
    def _launch_combine(self, out_TK, expert_out, prepared, weight_and_reduce, async_finish: bool):
        ht = self._ht
        wr = resolve_weight_and_reduce(weight_and_reduce, Contiguous())
        if isinstance(wr, NoOp):
            x_MK = expert_out  # the experts weighted and summed already
        else:
            with self.phases("weight_reduce"):
                x_MK = wr.apply(None, expert_out, prepared.topk_weights_MP, prepared.topk_ids_MP, prepared)
        if x_MK.dtype != torch.bfloat16 or not x_MK.is_contiguous():
            x_MK = x_MK.to(torch.bfloat16).contiguous()
        span = OpenRange(self.phases, "combine")  # launch -> receive
        combined_TK, _, event = ht.buffer.combine(
            x_MK, prepared.handle.deepep, config=ht.combine_config, async_finish=async_finish
        )

        def receive() -> None:
            if async_finish:
                event.current_stream_wait()
            out_TK.copy_(combined_TK)
            span.close()

        return receive

    def finalize_async(self, out_TK, expert_out, prepared, weight_and_reduce):
        return self._launch_combine(out_TK, expert_out, prepared, weight_and_reduce, async_finish=True)

    def finalize(self, out_TK, expert_out, prepared, weight_and_reduce) -> None:
        self._launch_combine(out_TK, expert_out, prepared, weight_and_reduce, async_finish=False)()

    # -- planning and accounting ------------------------------------------------
    def max_rows(self, num_tokens: int) -> int:
        """Every token of every rank may land here: M <= T * R."""
        return num_tokens * self.ctx.world_size

    def comm_bytes(self, num_tokens: int, prepared: PreparedTokens) -> int:
        """Bytes this rank sends + receives over NVLink in dispatch + combine.

        rows_out = rows this rank dispatches to other ranks = sum_{j != r} is_token_in_rank[:, j]
        rows_in  = rows it receives from other ranks
                 = sum_{i != r} (rank_prefix_matrix[i, r] - rank_prefix_matrix[i-1, r])
        dispatch moves each row as x (K bytes fp8 or 2K bf16) + scales (4 K/128, fp8_block)
                 + top-k ids and weights (12 P) + source index (4);
        combine sends back each received row as 2K bf16 bytes and receives the rows it sent.
        total = (rows_out + rows_in) * (dispatch_row_bytes + 2K). Rows a rank keeps
        for itself go through local memory and are not counted.
        """
        h = prepared.handle
        rank_prefix_RR, is_token_in_rank_TR = h.deepep[0], h.deepep[4]
        r = self.group.rank()
        sent_R = is_token_in_rank_TR.sum(dim=0)
        rows_out = int(sent_R.sum() - sent_R[r])
        col = rank_prefix_RR[:, r].long()
        recv_R = col - torch.cat([col.new_zeros(1), col[:-1]])
        rows_in = int(recv_R.sum() - recv_R[r])
        combine_row_bytes = 2 * self.ctx.shape.hidden
        return (rows_out + rows_in) * (h.dispatch_row_bytes + combine_row_bytes)

    def close(self) -> None:
        """Drop this instance's reference; the buffer stays cached for the
        group's other combinations (release_buffers() frees it)."""
        self._ht = None

    @classmethod
    def release_group(cls, group) -> None:
        release_buffers(group)
