"""What travels between the launcher and its ranks (moebench/launch.py <-> worker.py),
as typed values: a rank receives `Task`s and puts `Started`, `Result`, `Done`, `Error`
and `Exited` messages on one queue. A `RankResult` is one rank's measurement of one
(combination, tokens per rank); moebench/rows.py aggregates them over ranks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .spec import Combo

NAN = float("nan")


@dataclass(frozen=True)
class Task:
    """One combination for a process group: its index in the group's work, its spec and
    the token counts to run, in order."""

    idx: int
    combo: Combo
    tokens: tuple[int, ...]

    @property
    def key(self) -> str:
        return self.combo.key


@dataclass
class RankResult:
    """One rank's figures for one token count (µs, bytes; NaN where not measured)."""

    rank: int
    status: str = "ok"  # ok | incorrect (failed / timeout / oom come as an Error)
    reason: str = ""
    rel_err: float = NAN
    # the mode that ran: events | graph | profiler, or host where the host set the pace of the
    # samples (measure.paced_mode): its latency is host time, not GPU time
    timing_mode: str = ""
    timing_note: str = ""  # why the timing that ran is not the requested replays, or is host time
    samples_us: list = field(default_factory=list)
    no_shared_samples_us: Optional[list] = None  # the ablation (layers with shared experts)
    shared_samples_us: Optional[list] = None
    phases_us: dict = field(default_factory=dict)  # phase -> median µs
    host_enqueue_us: float = NAN  # host time to enqueue one eager forward (timing.host_enqueue_us)
    # samples the GPU started before the host had enqueued the whole forward (timing.Samples)
    host_paced_samples: float = NAN
    # memory
    workspace_bytes_analytic: float = NAN
    analytic_peak_bytes: float = NAN
    workspace_bytes_peak: float = NAN
    device_bytes_peak: float = NAN
    memory_cap_bytes: float = NAN  # runner.memory_budget: the allocator's cap (allocated + budget)
    # what the caching allocator reserved above the bytes allocated at the start of the measured
    # work (timed samples, phases, one forward): what runner.memory_budget caps, fragmentation included
    reserved_bytes_peak: float = NAN
    # derived (moebench/derived.py)
    tflops: float = NAN
    hbm_gbps: float = NAN
    nvlink_gbps: float = NAN
    expert_flops: float = NAN
    expert_bytes: float = NAN
    row_layout_used: str = ""
    # traces (moebench/capture.py)
    trace_path: str = ""
    trace_error: str = ""
    trace_overlap_fraction: Optional[float] = None
    trace_overlap_method: str = ""
    trace_intersection_fraction: Optional[float] = None
    trace_layer_us: Optional[float] = None
    trace_matched_overlap_per_rank: Optional[list] = None  # rank 0 only, from every rank's trace
    trace_wait_us_per_rank: Optional[list] = None
    # profiler mode
    kernel_us: Optional[str] = None  # JSON: communication kernel -> µs
    profiler_trace_path: str = ""


@dataclass(frozen=True)
class Started:
    idx: int
    rank: int


@dataclass(frozen=True)
class Result:
    idx: int
    rank: int
    tokens: int
    result: RankResult


@dataclass(frozen=True)
class Done:
    idx: int
    rank: int


@dataclass(frozen=True)
class Exited:
    rank: int


@dataclass(frozen=True)
class Error:
    """A rank raised: what becomes the combination's failed / oom row."""

    idx: Optional[int]
    rank: int
    status: str  # failed | oom
    reason: str
    tokens: Optional[int] = None  # the token count it was running, if any
    traceback: str = ""


@dataclass(frozen=True)
class Failure:
    """Why a combination has no (complete) result: from an Error, a dead rank or a timeout."""

    status: str  # failed | timeout | oom
    reason: str
    tokens: Optional[int] = None
