"""What one rank measured for one (combination, tokens per rank) (`RankResult`, the typed
message a rank sends, which results/rows.py aggregates over ranks into a row), what one
combination produced (`Finished`) and why it has no complete result (`Failure`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from moebench.config.spec import Combination
from moebench.results.row import Status

NAN = float("nan")


@dataclass
class RankResult:
    """One rank's figures for one token count (µs, bytes; NaN where not measured)."""

    rank: int
    status: Status = Status.OK  # ok | incorrect (failed / timeout / oom come as an Error)
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
    # samples the GPU started before the host had enqueued the whole forward (timing.Samples):
    # the layer's timed ones, the ablation's, the phase forwards' (of num_phase_samples) and the
    # trace's (of num_trace_samples); NaN where none were taken or off a GPU
    host_paced_samples: float = NAN
    host_paced_no_shared: float = NAN
    host_paced_shared: float = NAN
    num_phase_samples: float = NAN
    host_paced_phases: float = NAN
    num_trace_samples: float = NAN
    host_paced_trace: float = NAN
    # memory
    workspace_bytes_analytic: float = NAN
    analytic_peak_bytes: float = NAN
    workspace_bytes_peak: float = NAN
    device_bytes_peak: float = NAN
    memory_cap_bytes: float = NAN  # runner.memory_budget: the allocator's cap (allocated + budget)
    # what the caching allocator reserved above the bytes allocated at the start of the measured
    # work (timed samples, phases, one forward): what runner.memory_budget caps, fragmentation included
    reserved_bytes_peak: float = NAN
    # derived (moebench/measure/derived.py)
    tflops: float = NAN
    hbm_gbps: float = NAN
    nvlink_gbps: float = NAN
    expert_flops: float = NAN
    expert_bytes: float = NAN
    row_layout_used: str = ""
    contiguous_gemm_used: str = ""
    # routing (moebench/routing/generate.py): what the measured inputs were
    imbalance_experts: float = NAN
    imbalance_ranks: float = NAN
    received_tokens: float = NAN
    simulated_rank: float = NAN
    routing_window: str = ""
    routing_source: str = ""
    fill_rows: float = NAN
    fill_max: float = NAN
    fill_mean: float = NAN
    # where the rank's time went (s; run/worker.py's Stopwatch): setup and start on a
    # combination's first row only
    harness_start_s: float = NAN
    harness_setup_s: float = NAN
    harness_check_s: float = NAN
    harness_inputs_s: float = NAN
    harness_probe_s: float = NAN
    harness_timing_s: float = NAN
    harness_phases_s: float = NAN
    harness_memory_s: float = NAN
    harness_trace_s: float = NAN
    harness_total_s: float = NAN
    # traces (moebench/measure/capture.py)
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
