"""torch.distributed plumbing shared by the naive / allgather_rs / naive_batched
backends: async collectives behind receivers, phase ranges that span launch ->
receive (so shared experts run inside the communication's window).

Legend: T tokens per rank, W ranks, K hidden, P top-k.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..interfaces import FP8_MAX, OpenRange, PrepareFinalize  # OpenRange: the backends' import
from ..quant import quant_activations, quant_fp8_with_scale

# torch 2.13 renamed the tensor collectives (the old names warn FutureWarning into every sweep's
# progress); the GPU image's torch 2.11 has only the old ones
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def comm_view(t: torch.Tensor) -> torch.Tensor:
    """fp8 travels as bytes (not every process-group backend knows fp8)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


def all_gather_rows(tensors: list[torch.Tensor], group, world_size: int) -> tuple[list[torch.Tensor], list]:
    """Launch all-gathers of each [T, ...] tensor into [W*T, ...]; returns (outputs, works)."""
    outs, works = [], []
    for t in tensors:
        t = t.contiguous()
        out = torch.empty((world_size * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
        works.append(_all_gather(comm_view(out), comm_view(t), group=group, async_op=True))
        outs.append(out)
    return outs, works


def broadcast_rows(tensors: list[torch.Tensor], group, world_size: int, rank: int) -> tuple[list[torch.Tensor], list]:
    """vLLM's naive dispatch: every rank broadcasts its rows to all; returns ([W*T, ...], works)."""
    outs, works = [], []
    for t in tensors:
        T = t.shape[0]
        out = torch.empty((world_size * T, *t.shape[1:]), dtype=t.dtype, device=t.device)
        out[rank * T : (rank + 1) * T].copy_(t)
        for src in range(world_size):
            src_global = dist.get_global_rank(group, src) if group is not None and group != dist.group.WORLD else src
            works.append(
                dist.broadcast(comm_view(out[src * T : (src + 1) * T]), src_global, group=group, async_op=True)
            )
        outs.append(out)
    return outs, works


def wait_all(works) -> None:
    for w in works:
        w.wait()


def row_bytes(hidden: int, act_bytes: int, topk: int, scale_bytes: int = 0) -> int:
    """Bytes one token carries in the dispatch: activations (+ scales), ids (int64), weights (fp32)."""
    return hidden * act_bytes + scale_bytes + topk * (8 + 4)


class EPPrepareFinalize(PrepareFinalize):
    """Base of the torch.distributed EP backends: W ranks, each sees W*T rows."""

    def max_rows(self, num_tokens: int) -> int:
        return num_tokens * self.ctx.world_size

    def prepared_bytes(self, num_tokens, quant) -> int:
        """The gathered rows [W*T, K] (at the dispatched precision, + scales), their
        top-k ids (int64) and weights (fp32), live through the forward."""
        rows, s = self.max_rows(num_tokens), self.ctx.shape
        fp8 = quant is not None and quant.is_fp8
        act = 0 if (fp8 and self.carries_fp8) else rows * s.hidden * 2  # bf16 rows travel
        act += super().prepared_bytes(num_tokens, quant)  # the fp8 copy, where there is one
        return act + rows * s.topk * (8 + 4)

    def gather_quantized(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant):
        """Quantize locally (a per-tensor scale agreed over ranks), launch the
        all-gathers; the receiver returns (x [M, K], scale, weights [M, P], ids [M, P])."""
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
        gather_scale = scale is not None and not per_tensor
        send = [x, topk_weights_TP, topk_ids_TP] + ([scale] if gather_scale else [])
        rng = OpenRange(self.phases, "dispatch")
        outs, works = all_gather_rows(send, ctx.group, ctx.world_size)

        def receive():
            wait_all(works)
            rng.close()
            return outs[0], (outs[3] if gather_scale else scale), outs[1], outs[2]

        return receive

    def reduce_scatter_async(self, out_TK, partial_MK):
        """Launch the reduce-scatter of the partial outputs into out_TK; returns the receiver."""
        rng = OpenRange(self.phases, "combine")
        work = _reduce_scatter(out_TK, partial_MK.contiguous(), group=self.ctx.group, async_op=True)

        def receive():
            work.wait()
            rng.close()

        return receive
