"""What the harness reads of an entry without importing its implementation: its *card*.

A card is a light class (no torch, no Triton, no library import at module level) holding an
entry's metadata (layout, single rank, CUDA-graph flags, knobs) and its rules as
classmethods (`supports`, `token_limit`, `process_group_family`). moebench's own cards live
in kernels/cards/ and name the module that implements them (`implementation`); the
implementation class subclasses its card (PrepareFinalize / Experts subclass these bases), so
each fact has one home. Planning (`moebench list`, validity, the config schema) reads cards;
building a layer imports the implementation (registry.get_backend / get_experts).

A plugin's class is its own card (it subclasses PrepareFinalize or Experts, which subclass
these): plugins need not split theirs.

Kernels never import moebench.
"""

from __future__ import annotations

import enum
from typing import ClassVar, Optional

from .knobs import Knob


class ActivationFormat(str, enum.Enum):
    STANDARD = "standard"  # [M, K] rows + topk ids per row
    BATCHED = "batched"  # [E, X, K] per-expert buffers + per-expert counts


class Rule(str):
    """A reason `supports` returns where no machine could run the combination: a quant, layout,
    size or setting the entry never runs (`return Rule(f"... hidden={k}")`). The harness counts it
    as a rule of the plan (a request made only of such combinations is refused, exit 2); a plain
    `str` is what this machine lacks (a library, a GPU, its compute capability): a skipped row.
    It is a `str`, so a reason marked so reads as one everywhere."""

    __slots__ = ()


def first_reason(*reasons: Optional[str]) -> Optional[str]:
    """The first `Rule` among `reasons`, else the first reason, else None: a rule no machine
    lifts comes before what this machine lacks, whichever was asked first."""
    return next((why for why in reasons if isinstance(why, Rule) and why), None) or next(
        (why for why in reasons if why), None
    )


class EntryCard:
    """What every entry declares, backend or experts."""

    activation_format: ClassVar[ActivationFormat] = ActivationFormat.STANDARD
    # whether a forward (dispatch + combine, or apply()) may be captured into a CUDA graph:
    # no host sync
    graph_capturable: ClassVar[bool] = False
    # non-empty: why a captured forward does other work than an eager one (e.g. it pads to an
    # upper bound where the eager forward reads counts on the host), so that runner.timing=auto
    # times eager forwards instead of replays of a different computation
    graph_differs: ClassVar[str] = ""
    # settings beside the axes (backend.<name> / experts.<name>), read from ctx.options
    # (kernels/knobs.py)
    knobs: ClassVar[tuple[Knob, ...]] = ()
    # moebench's own cards: the module under moebench.kernels that implements this one
    # (e.g. "prepare_finalize.local"), imported only when a layer is built
    implementation: ClassVar[str] = ""

    @classmethod
    def supports(cls, combo) -> Optional[str]:
        """Reason this entry cannot run `combo`, or None. `combo` is a read-only mapping: the
        axes, the model's sizes, quant, world_size, simulate_ep, device, timing and the chosen
        entries' knobs, by name. A reason no machine lifts is a `Rule`; check those before what
        the machine lacks, so that the answer is the same on every machine."""
        return None


class BackendCard(EntryCard):
    """A backend's (PrepareFinalize's) metadata and rules."""

    # which quant formats the dispatch can carry; others dispatch bf16 and the
    # experts quantize after dispatch
    carries_fp8: ClassVar[bool] = False
    # one rank that keeps every expert (or, with simulate_ep=N, one rank's share of an
    # EP-N deployment); otherwise runner.world_size ranks, one per GPU: an EP backend, or a TP
    # one (`tensor_parallel`)
    single_rank: ClassVar[bool] = False
    # tensor parallel over runner.world_size ranks (vLLM's fused MoE under TP without EP): every
    # rank holds every expert at intermediate / world_size and routes the same tokens
    tensor_parallel: ClassVar[bool] = False

    @classmethod
    def process_group_family(cls, combo) -> tuple:
        """What, beyond the world size and device, a process group shared by several
        combinations must agree on: combinations of different families never share
        one. () by default; a backend whose library initialises per-process state once
        (NVSHMEM) returns what sizes that state."""
        return ()

    @classmethod
    def token_limit(cls, combo, tokens: int) -> Optional[str]:
        """Reason `tokens` per rank cannot run with `combo` (e.g. a buffer's cap), or None; a
        `Rule` where no machine lifts it (a cap the config sets), as `supports`'s."""
        return None


class ExpertsCard(EntryCard):
    """An experts implementation's metadata and rules."""
