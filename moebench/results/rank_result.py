"""What one rank measured for one (combination, tokens per rank) (`RankResult`, the typed
message a rank sends, which results/rows.py aggregates over ranks into a row), what one
combination produced (`Finished`) and why it has no complete result (`Failure`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from moebench.config.spec import Combination
from moebench.results import row
from moebench.results.row import Status

NAN = float("nan")


# RankResult's own fields, beside the columns a rank measures (row.py `rank_columns`): what
# rows.py turns into columns of their own (phases, the ablation, the trace's span and matched
# overlap) or keeps out of the row (the profiler's trace file)
RANK_ONLY: tuple[tuple[str, Any, Any], ...] = (
    ("rank", int, dataclasses.MISSING),
    ("phases_us", dict, field(default_factory=dict)),  # phase -> median µs (the `<phase>_us` columns)
    # the ablation's samples (layers with shared experts): shared_us, latency_no_shared_us, overlap_*
    ("no_shared_samples_us", Optional[list], None),
    ("shared_samples_us", Optional[list], None),
    ("trace_layer_us", Optional[float], None),  # this rank's layer span in its trace (trace_layer_us_per_rank)
    ("trace_matched_overlap_per_rank", Optional[list], None),  # rank 0 only, from every rank's trace
    ("profiler_trace_path", str, ""),  # profiler mode: the torch profiler's trace file
)
_TYPES = {"float": float, "str": str, "list": list, "int": int, "bool": bool}


def _field(c: row.Column) -> tuple[str, Any, Any]:
    default = Status.OK if c.name == "status" else c.rank_default  # failed / timeout / oom come as an Error
    typ = _TYPES[c.dtype] if default is not None else Optional[_TYPES[c.dtype]]
    return c.name, typ, field(default_factory=list) if isinstance(default, list) else field(default=default)


def rank_result_class() -> type:
    """RankResult, made from the declarations: RANK_ONLY and a field per column a rank measures
    (row.py's `rank_columns`, at each one's rank default: NaN, "", None for a trace's figure).
    A column declared with `rank` in row.py is a field here without another edit."""
    made = dataclasses.make_dataclass(
        "RankResult", [*RANK_ONLY[:1], *(_field(c) for c in row.rank_columns()), *RANK_ONLY[1:]]
    )
    made.__module__ = __name__  # pickled across the rank processes' queue: importable by this name
    made.__doc__ = "One rank's figures for one token count (µs, bytes; NaN where not measured)."
    return made


if TYPE_CHECKING:

    class RankResult:
        """The checker's view of the made class: a dataclass whose fields are the declarations'
        (any type)."""

        __dataclass_fields__: ClassVar[dict[str, Any]]
        rank: int
        status: Status
        phases_us: dict

        def __init__(self, **fields: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...

else:
    RankResult = rank_result_class()


@dataclass(frozen=True)
class Failure:
    """Why a combination has no (complete) result: from an Error, a dead rank or a timeout."""

    status: Status  # failed | timeout | oom
    reason: str
    tokens: Optional[int] = None


@dataclass
class Finished:
    """What one combination produced: per tokens, the per-rank results; or why not."""

    combo: Combination
    tokens: list[int]
    results: dict = field(default_factory=dict)  # tokens -> {rank: RankResult}
    failure: Optional[Failure] = None
    rest_follows: bool = False  # the token counts after the failed one run in a fresh process group
