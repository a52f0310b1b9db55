"""MoEKernel: prepare -> experts -> finalize, with shared experts overlapped.

Legend: T tokens on this rank, P top-k, K hidden, S shared-expert width,
M rows after dispatch (standard), E local experts, X max rows per expert (batched).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .interfaces import (
    NULL_PHASES,
    ActivationFormat,
    Experts,
    NoOp,
    PreparedTokens,
    PrepareFinalize,
)
from .reference import silu_and_mul

OVERLAP_MODES = ("none", "dispatch", "combine")


_silu_and_mul_rows = None  # kernels/triton/activation.py's, imported at the first CUDA call


def triton_activation_fits(h_TN: torch.Tensor) -> bool:
    """Whether the shared experts' SiLU-and-mul runs as one Triton kernel: a CUDA bf16 2-D h with
    unit column stride (issue #34: torch's silu and mul are two kernels and two launches)."""
    return h_TN.is_cuda and h_TN.dtype == torch.bfloat16 and h_TN.dim() == 2 and h_TN.stride(-1) == 1


def shared_activation(h_TN: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of the shared experts' [T, 2S] -> [T, S]: one Triton kernel where
    triton_activation_fits, reference.silu_and_mul (torch) elsewhere (the CPU)."""
    global _silu_and_mul_rows
    if not triton_activation_fits(h_TN):
        return silu_and_mul(h_TN)
    if _silu_and_mul_rows is None:
        from .triton.activation import silu_and_mul_rows

        _silu_and_mul_rows = silu_and_mul_rows
    return _silu_and_mul_rows(h_TN)


class SharedExperts:
    """The shared experts fused into one MLP (widths of all shared experts summed).

    w13_NK [2S, K] (gate rows then up rows), w2_KS [K, S], bf16; inputs x_TK [T, K]; torch matmuls, the SiLU-and-mul
    between them one Triton kernel on CUDA (shared_activation).
    `sm_carveout` > 0 (CUDA): the two GEMMs run through cuBLASLt with an SM-count target of
    (SMs - sm_carveout), torch's experimental carveout, so that communication kernels beside
    them (DeepEP's combine holds `num_sms`) keep their SMs; torch's global setting and
    preferred BLAS library are restored after each call."""

    def __init__(self, w13_NK: torch.Tensor, w2_KS: torch.Tensor, sm_carveout: int = 0):
        if sm_carveout < 0:
            raise ValueError(f"sm_carveout={sm_carveout} must be >= 0")
        self.w13_NK = w13_NK
        self.w2_KS = w2_KS
        self.sm_carveout = sm_carveout
        # the weights as mm's right operands, transposed views made once: torch.mm on them is
        # linear's math without its composite dispatch (a t() view and matmul's checks a call)
        self._w13_KN = w13_NK.t()
        self._w2_SK = w2_KS.t()

    def _mlp(self, x_TK: torch.Tensor, into_TK: Optional[torch.Tensor] = None) -> torch.Tensor:
        act = shared_activation(torch.mm(x_TK, self._w13_KN))
        if into_TK is None:
            return torch.mm(act, self._w2_SK)
        # into += act @ w2^T as the down GEMM's own epilogue (beta = 1): no [T, K] output and no
        # add kernel (issue #34); the sum is rounded to bf16 once instead of twice
        return into_TK.addmm_(act, self._w2_SK)

    def _carved(self, fn, *args):
        if not self.sm_carveout or args[0].device.type != "cuda":
            return fn(*args)
        # cuBLAS (the default for bf16 mm) ignores the carveout; cuBLASLt reads it per call
        old_carveout = torch._C._get_sm_carveout_experimental()
        old_lib = torch.backends.cuda.preferred_blas_library()
        try:
            torch._C._set_sm_carveout_experimental(self.sm_carveout)
            torch.backends.cuda.preferred_blas_library("cublaslt")
            return fn(*args)
        finally:
            torch._C._set_sm_carveout_experimental(old_carveout)
            torch.backends.cuda.preferred_blas_library(old_lib)

    def __call__(self, x_TK: torch.Tensor) -> torch.Tensor:
        """The shared experts' output [T, K] bf16."""
        return self._carved(self._mlp, x_TK)

    def add_to(self, out_TK: torch.Tensor, x_TK: torch.Tensor) -> torch.Tensor:
        """out_TK += the shared experts' output, the add inside the down GEMM (beta = 1); -> out_TK."""
        return self._carved(self._mlp, x_TK, out_TK)

    def transient_bytes(self, T: int, into_output: bool = False) -> int:
        """gate/up [T, 2S] + activation [T, S] + output [T, K] (none `into_output`: add_to),
        bf16, + torch's SiLU(gate) [T, S] where the activation is torch's (not
        shared_activation's one kernel: the CPU)."""
        S2, K = self.w13_NK.shape
        silu = 0 if self.w13_NK.is_cuda and self.w13_NK.dtype == torch.bfloat16 else S2 // 2
        return 2 * T * (S2 + S2 // 2 + silu + (0 if into_output else K))


class MoEKernel:
    """One modular MoE layer: a PrepareFinalize and an Experts, plus shared experts.

    forward() emits one phase range per step through `self.phases` (the harness
    installs a recorder that adds NVTX, record_function and CUDA events; the
    default records nothing) and reuses workspaces across calls.
    """

    def __init__(
        self,
        prepare_finalize: PrepareFinalize,
        experts: Experts,
        shared_experts: Optional[SharedExperts] = None,
        overlap: str = "none",
    ):
        if overlap not in OVERLAP_MODES:
            raise ValueError(f"overlap={overlap!r}; valid: {OVERLAP_MODES}")
        if prepare_finalize.activation_format != experts.activation_format:
            raise ValueError(
                f"{type(prepare_finalize).__name__} produces the {prepare_finalize.activation_format.value} "
                f"layout but {type(experts).__name__} reads {experts.activation_format.value}"
            )
        self.pf = prepare_finalize
        self.experts = experts
        self.shared = shared_experts
        self.overlap = overlap
        self._phases = NULL_PHASES
        self._ws: dict[str, torch.Tensor] = {}
        # (rows, tokens, device) -> the three workspace views: shapes and carve-up are
        # worked out once per size, not per forward (issue #34)
        self._ws_views: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    # -- phases ---------------------------------------------------------------
    @property
    def phases(self):
        return self._phases

    @phases.setter
    def phases(self, rec):
        self._phases = rec
        self.pf.phases = rec
        self.experts.phases = rec

    # -- workspaces -----------------------------------------------------------
    def _dims(self, rows: int) -> tuple[int, int, int, int, int]:
        s = self.pf.ctx.shape
        return rows, s.n, s.hidden, s.topk, self.pf.ctx.num_local_experts

    def workspace_bytes(self, num_tokens: int) -> int:
        """Analytic bytes of (workspace13, workspace2, output) at the planned size."""
        shapes = self.experts.workspace_shapes(*self._dims(self.pf.max_rows(num_tokens)))
        esize = torch.empty((), dtype=self.experts.workspace_dtype).element_size()
        return sum(math.prod(sh) for sh in shapes) * esize

    def analytic_peak_bytes(self, num_tokens: int, with_shared: bool = True) -> int:
        """Workspaces + declared transients of experts, prepare and shared experts + the layer output."""
        dims = self._dims(self.pf.max_rows(num_tokens))
        n = self.workspace_bytes(num_tokens) + self.experts.transient_bytes(*dims)
        n += self.pf.prepared_bytes(num_tokens, self.experts.input_quant)
        n += num_tokens * self.pf.ctx.shape.hidden * 2  # the layer output [T, K] bf16
        if with_shared and self.shared is not None:
            n += self.shared.transient_bytes(num_tokens, into_output=self.shared_last)
        return n

    def clear_workspaces(self) -> None:
        self._ws.clear()
        self._ws_views.clear()

    def _workspace(self, key: str, shape: tuple[int, ...], max_shape: tuple[int, ...], device) -> torch.Tensor:
        """A view of `shape` on a flat buffer sized for `max_shape` (allocated once)."""
        need = math.prod(max_shape)
        buf = self._ws.get(key)
        if buf is None or buf.numel() < max(need, math.prod(shape)):
            buf = torch.empty(max(need, math.prod(shape)), dtype=self.experts.workspace_dtype, device=device)
            self._ws[key] = buf
            self._ws_views.clear()  # views of the old buffer must not outlive it
        return buf[: math.prod(shape)].view(shape)

    def _workspaces(self, prepared: PreparedTokens, num_tokens: int):
        if self.experts.activation_format == ActivationFormat.BATCHED:
            rows = prepared.x.shape[1]
        else:
            rows = prepared.x.shape[0]
        dev = prepared.x.device
        key = (rows, num_tokens, dev)
        views = self._ws_views.get(key)
        if views is not None:
            return views
        shapes = self.experts.workspace_shapes(*self._dims(rows))
        max_shapes = self.experts.workspace_shapes(*self._dims(self.pf.max_rows(num_tokens)))
        ws13 = self._workspace("ws13", shapes[0], max_shapes[0], dev)
        ws2 = self._workspace("ws2", shapes[1], max_shapes[1], dev)
        # the output never aliases a workspace the experts still read
        out = self._workspace("out", shapes[2], max_shapes[2], dev)
        # a buffer grown by a later call clears this (_workspace): a view never outlives its buffer
        self._ws_views[key] = views = (ws13, ws2, out)
        return views

    def _writes_output_directly(self, wr, expert_out: torch.Tensor, out_TK: torch.Tensor) -> bool:
        """Whether the experts may write the layer output itself: the finalize would only copy
        their [T, K] bf16 output into it (the out workspace stays allocated, so memory is as planned)."""
        return (
            self.pf.noop_finalize_copies
            and isinstance(wr, NoOp)
            and expert_out.shape == out_TK.shape
            and expert_out.dtype == out_TK.dtype
        )

    # -- forward --------------------------------------------------------------
    def forward(
        self,
        hidden_TK: torch.Tensor,
        topk_weights_TP: torch.Tensor,
        topk_ids_TP: torch.Tensor,
        with_shared: bool = True,
    ) -> torch.Tensor:
        """Routed experts (+ shared experts) output [T, K] bf16."""
        ph = self._phases
        shared = self.shared if with_shared else None
        quant = self.experts.input_quant
        shared_out = None
        T = hidden_TK.shape[0]

        # the ablation (with_shared=False) keeps the overlap mode's async path and leaves
        # the gap between launch and receive empty: only the shared experts' work differs
        if self.shared is not None and self.overlap == "dispatch":
            receive = self.pf.prepare_async(hidden_TK, topk_weights_TP, topk_ids_TP, quant)
            if shared is not None:
                with ph("shared_experts"):
                    shared_out = shared(hidden_TK)
            prepared = receive()
        else:
            prepared = self.pf.prepare(hidden_TK, topk_weights_TP, topk_ids_TP, quant)

        ws13, ws2, expert_out = self._workspaces(prepared, T)
        out_TK = torch.empty(T, hidden_TK.shape[1], dtype=torch.bfloat16, device=hidden_TK.device)
        wr = self.experts.finalize_weight_and_reduce()
        if self._writes_output_directly(wr, expert_out, out_TK):
            expert_out = out_TK  # the finalize's copy would be all it does (noop_finalize_copies)
        with ph("experts"):
            self.experts.apply(expert_out, prepared, ws13, ws2)

        with ph("finalize"):
            if self.shared is not None and self.overlap == "combine":
                receive = self.pf.finalize_async(out_TK, expert_out, prepared, wr)
                if shared is not None:
                    with ph("shared_experts"):
                        shared_out = shared(hidden_TK)
                receive()
            else:
                self.pf.finalize(out_TK, expert_out, prepared, wr)

        if shared is not None and shared_out is None:  # shared_last: added by the down GEMM itself
            with ph("shared_experts"):
                shared.add_to(out_TK, hidden_TK)
        elif shared_out is not None:
            out_TK.add_(shared_out)
        if self.pf.reduces_output:  # TP: the ranks' partial sums, shared experts' included
            self.pf.reduce_output(out_TK)
        return out_TK

    @property
    def shared_last(self) -> bool:
        """Whether the shared experts run after the finalize (no overlap), adding into the output."""
        return self.overlap not in ("dispatch", "combine")

    __call__ = forward

    def close(self) -> None:
        self.pf.close()
