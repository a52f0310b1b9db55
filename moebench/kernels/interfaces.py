"""The modular MoE kernel contract: PrepareFinalize, Experts, WeightAndReduce.

Shape legend (suffixes on tensor names):
  T  tokens on this rank (the layer's input rows)
  M  token rows the experts see after dispatch (standard layout)
  P  top-k (pairs per token)
  K  hidden size
  N  width of the gate/up projection = 2 * I
  I  intermediate size per expert
  E  local experts on this rank
  X  max tokens per expert in the batched layout
  G  number of 1x128 activation-scale groups along K (= K / 128)

Kernels never import moebench: this package is the system under test.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import torch

from .entry import ActivationFormat, BackendCard, ExpertsCard, Rule  # noqa: F401 (ActivationFormat, Rule: re-exported)
from .split import split

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


@dataclass(frozen=True)
class QuantSpec:
    """How weights and activations are represented.

    bf16:        bf16 everywhere.
    fp8_block:   fp8 e4m3 weights with one fp32 scale per 128x128 block,
                 activations fp8 with one fp32 scale per 1x128 group.
    fp8_tensor:  fp8 weights with one scale per expert matrix, activations fp8
                 with one dynamic scale per tensor.
    """

    name: str = "bf16"
    block_n: int = 128
    block_k: int = 128

    @property
    def is_fp8(self) -> bool:
        return self.name.startswith("fp8")

    @property
    def is_block(self) -> bool:
        return self.name == "fp8_block"

    @property
    def act_bytes(self) -> int:
        return 1 if self.is_fp8 else 2


@dataclass(frozen=True)
class LayerShape:
    """Sizes of one MoE layer (global view)."""

    hidden: int  # K
    intermediate: int  # I (per routed expert)
    num_experts: int  # global routed experts
    topk: int
    num_shared_experts: int = 0
    shared_intermediate: int = 0  # I of one shared expert

    @property
    def n(self) -> int:
        return 2 * self.intermediate


@dataclass
class KernelContext:
    """What a PrepareFinalize / Experts needs to know about where it runs."""

    shape: LayerShape
    quant: QuantSpec
    device: torch.device
    rank: int = 0
    world_size: int = 1
    group: Any = None  # torch.distributed process group, None for one rank
    simulate_ep: int = 1  # local backends: keep 1/simulate_ep of the experts
    max_tokens_per_rank: int = 512  # batched buffers' cap
    options: dict = field(default_factory=dict)  # the chosen entries' knobs by name (kernels/knobs.py)
    # ranks each expert's intermediate is split over (a tensor_parallel backend: world_size); the
    # shape is then rank `rank`'s shard and every expert is local (TP replaces EP, as in vLLM)
    tp_size: int = 1

    @property
    def ep_size(self) -> int:
        """Ranks the routed experts are split over (split.py's rule: 1 under TP)."""
        return split(self.world_size, self.simulate_ep, tensor_parallel=self.tp_size > 1).ep

    @property
    def num_local_experts(self) -> int:
        return self.shape.num_experts // self.ep_size

    @property
    def first_local_expert(self) -> int:
        """Global id of local expert 0 (simulate_ep keeps rank 0's share)."""
        return self.rank * self.num_local_experts if self.world_size > 1 and self.ep_size > 1 else 0


@dataclass
class ExpertWeights:
    """This rank's routed experts. Weights are bf16 or fp8 (with fp32 scales)."""

    w13_ENK: torch.Tensor  # gate rows [0, I), up rows [I, 2I)
    w2_EKI: torch.Tensor
    w13_scale: Optional[torch.Tensor]  # fp8_block [E, N/128, K/128]; fp8_tensor [E]
    w2_scale: Optional[torch.Tensor]  # fp8_block [E, K/128, I/128]; fp8_tensor [E]
    quant: QuantSpec

    @property
    def num_local_experts(self) -> int:
        return self.w13_ENK.shape[0]

    def nbytes_per_expert(self) -> int:
        """Bytes of one expert's weights and scales."""
        n = self.w13_ENK[0].numel() * self.w13_ENK.element_size()
        n += self.w2_EKI[0].numel() * self.w2_EKI.element_size()
        for s in (self.w13_scale, self.w2_scale):
            if s is not None:
                n += s[0].numel() * s.element_size()
        return n


@dataclass
class PreparedTokens:
    """What prepare hands to the experts.

    standard: x [M, K] (bf16 or fp8), x_scale [M, G] / [1] / None,
              topk_ids_MP local expert ids with -1 for pairs not on this rank,
              topk_weights_MP.
    batched:  x [E, X, K], x_scale [E, X, G] / [1] / None,
              expert_num_tokens_E valid rows per expert.
    handle:   backend-private state the finalize needs (e.g. slot -> (token, k)).
    """

    x: torch.Tensor
    x_scale: Optional[torch.Tensor]
    topk_ids_MP: Optional[torch.Tensor] = None
    topk_weights_MP: Optional[torch.Tensor] = None
    expert_num_tokens_E: Optional[torch.Tensor] = None
    handle: Any = None


# Top-k weight-and-reduce strategies live in their own module; re-exported here
from .knobs import Knob  # noqa: E402,F401 (re-exported: plugins declare knobs with it)
from .weight_and_reduce import (  # noqa: E402,F401 (re-exported for the backends, beside the types they take)
    Batched,
    BatchedHandle,
    Contiguous,
    Delegate,
    NoOp,
    WeightAndReduce,
    resolve_weight_and_reduce,
)

# ----------------------------------------------------------------------------
# Phase markers: the harness passes a recorder; the default costs nothing.


class _NullPhases:
    """No-op phase recorder (zero cost when measurement is off)."""

    import contextlib as _cl

    _null = _cl.nullcontext()

    def __call__(self, name: str):
        return self._null


NULL_PHASES = _NullPhases()


class OpenRange:
    """A phase range entered at launch and left by the receiver (`close()`), so that what runs
    between (shared experts under overlap=dispatch|combine) counts inside the communication's
    span."""

    def __init__(self, phases, name: str):
        self.cm = phases(name)
        self.cm.__enter__()

    def close(self) -> None:
        if self.cm is not None:
            self.cm.__exit__(None, None, None)
            self.cm = None


# ----------------------------------------------------------------------------


Receiver = Callable[[], Any]


class PrepareFinalize(BackendCard, ABC):
    """Quantize + dispatch tokens in, weight-and-reduce + combine them out. The class
    attributes and the rules (activation_format, carries_fp8, graph_capturable, graph_differs,
    single_rank, knobs; supports, process_group_family, token_limit) are the card's
    (kernels/entry.py): what planning reads without importing an implementation."""

    # True where the finalize of a NoOp weight-and-reduce only copies the experts' output
    # into out_TK (one rank, nothing to combine): MoEKernel then lets the experts write out_TK
    # itself and the finalize skips the copy (issue #34)
    noop_finalize_copies: bool = False
    # True where the layer's output is a partial sum to reduce after the shared experts added
    # theirs (TP: `reduce_output`, one all-reduce of routed + shared, as vLLM's MoE layers)
    reduces_output: bool = False

    def __init__(self, ctx: KernelContext):
        self.ctx = ctx
        self.phases = NULL_PHASES
        # batched layouts that honour workload.fill: rows per expert set by the harness for the
        # token count it measures next (None: the layout's own max_rows)
        self.rows_per_expert: Optional[int] = None

    def reduced_rows(
        self, expert_out: torch.Tensor, prepared: "PreparedTokens", weight_and_reduce, fmt: "WeightAndReduce"
    ) -> torch.Tensor:
        """The rows a finalize sends back: the experts' output where they weighted and summed it
        already (`NoOp`), else `fmt`'s weight-and-reduce of it into partial [M, K] rows, inside
        the `weight_reduce` phase."""
        wr = resolve_weight_and_reduce(weight_and_reduce, fmt)
        if isinstance(wr, NoOp):
            return expert_out
        assert prepared.topk_weights_MP is not None, "a weight-and-reduce weighs by the prepared top-k weights"
        with self.phases("weight_reduce"):
            return wr.apply(None, expert_out, prepared.topk_weights_MP, prepared.topk_ids_MP, prepared)

    @abstractmethod
    def prepare_async(
        self,
        hidden_TK: torch.Tensor,
        topk_weights_TP: torch.Tensor,
        topk_ids_TP: torch.Tensor,
        quant: Optional[QuantSpec],
    ) -> Callable[[], PreparedTokens]:
        """Launch the dispatch; the returned receiver waits for it."""

    def prepare(self, hidden_TK, topk_weights_TP, topk_ids_TP, quant) -> PreparedTokens:
        return self.prepare_async(hidden_TK, topk_weights_TP, topk_ids_TP, quant)()

    @abstractmethod
    def finalize_async(
        self,
        out_TK: torch.Tensor,
        expert_out: torch.Tensor,
        prepared: PreparedTokens,
        weight_and_reduce: WeightAndReduce,
    ) -> Receiver:
        """Weight-and-reduce if asked, launch the combine into out_TK; the
        returned receiver waits for it."""

    def finalize(self, out_TK, expert_out, prepared, weight_and_reduce) -> None:
        self.finalize_async(out_TK, expert_out, prepared, weight_and_reduce)()

    def reduce_output(self, out_TK: torch.Tensor) -> None:
        """Where `reduces_output`: reduce the rank's partial output [T, K] in place, after the
        shared experts (MoEKernel calls it last)."""

    def comm_bytes(self, num_tokens: int, prepared: PreparedTokens) -> int:
        """Bytes this rank sends + receives in dispatch + combine (0 on one rank)."""
        return 0

    def max_rows(self, num_tokens: int) -> int:
        """Upper bound of M (standard) or X (batched) for workspace planning."""
        return num_tokens

    def prepared_bytes(self, num_tokens: int, quant: Optional[QuantSpec]) -> int:
        """Bytes prepare allocates that live through the forward (default: the
        quantized copy of the dispatched rows, fp8 + fp32 group scales)."""
        if quant is None or not quant.is_fp8:
            return 0
        rows, K = self.max_rows(num_tokens), self.ctx.shape.hidden
        return rows * K + (rows * (K // quant.block_k) * 4 if quant.is_block else 4)

    def close(self) -> None:
        """Release this instance's resources (buffers shared across a group stay)."""

    @classmethod
    def release_group(cls, group) -> None:
        """Free what instances cached for `group` (collective: every rank calls it
        before the process group is destroyed)."""


class Experts(ExpertsCard, ABC):
    """Grouped expert GEMMs: gate/up, SiLU-and-mul, down, optional reduce. The class
    attributes (activation_format, graph_capturable, graph_differs, knobs) and `supports` are
    the card's (kernels/entry.py)."""

    def __init__(self, weights: ExpertWeights, reduction: str, ctx: KernelContext):
        assert reduction in ("experts", "finalize"), reduction
        self.w = weights
        self.reduction = reduction
        self.ctx = ctx
        self.phases = NULL_PHASES

    @property
    def input_quant(self) -> Optional[QuantSpec]:
        """Quantization the experts want their input in (None: bf16)."""
        return self.w.quant if self.w.quant.is_fp8 else None

    @abstractmethod
    def workspace_shapes(
        self, M: int, N: int, K: int, topk: int, num_local_experts: int
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(workspace13, workspace2, output) shapes, elements of `workspace_dtype`.

        M is rows after dispatch (standard) or max tokens per expert (batched).
        """

    workspace_dtype: ClassVar[torch.dtype] = torch.bfloat16

    def transient_bytes(self, M: int, N: int, K: int, topk: int, num_local_experts: int) -> int:
        """Bytes allocated inside apply() beyond the declared workspaces."""
        return 0

    def finalize_weight_and_reduce(self) -> WeightAndReduce:
        return NoOp() if self.reduction == "experts" else Delegate()

    @abstractmethod
    def apply(
        self,
        output: torch.Tensor,
        prepared: PreparedTokens,
        workspace13: torch.Tensor,
        workspace2: torch.Tensor,
    ) -> None:
        """Compute into `output` (shape from workspace_shapes)."""
