"""The result row: every column a row holds, and every status and verdict, named once.

A row is one (combination, tokens per rank), aggregated over ranks. Its columns come from
two places only: the combination spec (`config/spec.py`: the identity fields and the
entries' knobs, each with its type and doc) and `MEASURED` below (outcome, time, phases,
overlap, traces, memory, rates, provenance). `rows.py` builds rows from these lists,
`report/load.py` takes its column groups from them, `synthetic.py` starts from `empty()`,
and `tests/golden/row_schema.json` and docs/design.md's column table are generated from
them (`python -m moebench.results.row --write`; a test fails when either drifts).

Adding a column: a `Column` in `MEASURED`, the code that measures it (`measure/` for a
rank's figure, with its `combine` rule here; `rows.py` where the rule is special), then
`--write`. A column older rows lack loads as its default (NaN / "" / None), so a new
measurement column needs no schema bump; a renamed or re-meant one does
(`SCHEMA_VERSION`, and a migration in `migrate.py`).
"""

from __future__ import annotations

import enum
import json
import sys
import typing
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from moebench.config.spec import AXIS, BARE, COMBO, MODEL_SIZE, PLACE, REQUIRED, RUNNER, WORKLOAD
from moebench.util.arg_errors import OneLineErrors

SCHEMA_VERSION = 2  # of the stored rows; migrate.py upgrades older ones
NAN = float("nan")


class Status(str, enum.Enum):
    """A row's outcome (the `status` column)."""

    OK = "ok"
    SKIPPED = "skipped"  # not run: why in `reason` (a rule, a missing library, too few GPUs)
    FAILED = "failed"
    TIMEOUT = "timeout"
    OOM = "oom"
    INCORRECT = "incorrect"  # ran, but the output is off the float32 reference

    def __str__(self) -> str:
        return self.value


STATUSES = tuple(s.value for s in Status)
# measured and not ok: what `--redo failed` runs again and what compare calls broken
BAD_STATUSES = (Status.FAILED, Status.TIMEOUT, Status.OOM, Status.INCORRECT)


class Verdict(str, enum.Enum):
    """What a comparison calls a matched pair (the `verdict` column of `moebench compare`'s
    table; moebench/report/compare.py says when each is given). Declared in the order the
    comparison counts them. `SKIPPED` is not `Status.SKIPPED`: a verdict says the candidate
    became skipped, a status says a row was."""

    BROKEN = "broken"  # ok in the baseline; failed / timeout / oom / incorrect in the candidate
    SLOWER = "slower"
    SKIPPED = "skipped"  # ok in the baseline, skipped in the candidate
    FASTER = "faster"
    FIXED = "fixed"  # not ok in the baseline, ok in the candidate
    SIMILAR = "~"  # ok on both sides, no change called
    HOST = "host"  # ok on both sides, a side's latency is host time: no verdict
    CPU = "cpu"  # ok on both sides, CPU time on both: no verdict unless --cpu-verdict
    CLOCK = "clock differs"  # ok on both sides, their GPU clocks differ: no verdict (report/clock_verdict.py)
    NEITHER_OK = "n/a"  # ok on neither side
    # ok in the baseline; the candidate's combination breaks a rule of the plan
    # (config/validity.py), whatever the machine: it can never run that way, so no verdict
    CANNOT_RUN = "cannot run"

    def __str__(self) -> str:
        return self.value


CHANGED_VERDICTS = (Verdict.BROKEN, Verdict.SLOWER, Verdict.SKIPPED, Verdict.FASTER, Verdict.FIXED)
NO_VERDICT = (Verdict.HOST, Verdict.CPU, Verdict.CLOCK)  # ok on both sides, but a figure no verdict may rest on

# how the ranks' values make the row's (`Column.combine`)
SAME = "same"  # the combination's, equal on every rank
RUN = "run"  # the invocation's (provenance)
WORST = "worst"  # the first rank that was not ok decides
SAMPLES = "samples"  # from the per-sample maximum over ranks (ranks start each sample together)
MAX = "max"
MEAN = "mean"
PER_RANK = "per-rank"  # a list, one value per rank
CRITICAL = "critical"  # the critical rank's (the one that sets the layer's end)
PROFILED = "per-rank, profiler"  # a list, one value per rank, in profiler mode only (None otherwise)
DERIVED = "derived"  # computed from the row's other columns

DTYPES = ("str", "int", "float", "bool", "list")


# a column's roles in the report (`Column.roles`): the identity's are on the spec's fields
# (config/spec.py: AXIS, COMBO, BARE, WORKLOAD, MODEL_SIZE, PLACE, REQUIRED, RUNNER); these are the rest
PER_ROW = "per-row"  # a row's, not its combination's (graph timing runs events above graph_max_tokens)
ORIGIN = "origin"  # which row it is and where it came from: identity a table never shows
# the report's tables that show a column (report/run_tables.py, summary.py, compare_tables.py)
LATENCY_TABLE = "latency table"  # each side of a compared pair's latency cell
MEMORY_TABLE = "memory table"
OVERLAP_TABLE = "overlap table"  # the ablation's figures and the trace's
PROVENANCE_TABLE = "provenance table"  # where a row came from (the provenance table)
ROWS_TABLE = "rows table"  # what names a row beside its identity in the every-row tables
ROOFLINE = "roofline"  # what the roofline table needs
ROLES: tuple[str, ...] = (AXIS, COMBO, BARE, WORKLOAD, MODEL_SIZE, PLACE, REQUIRED, RUNNER, PER_ROW, ORIGIN)
ROLES += (LATENCY_TABLE, MEMORY_TABLE, OVERLAP_TABLE, PROVENANCE_TABLE, ROWS_TABLE, ROOFLINE)


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # DTYPES; "float" columns may hold NaN, others None where absent
    group: str  # GROUPS
    combine: str
    doc: str
    roles: tuple[str, ...] = ()  # ROLES: what the report does with it
    short: str = ""  # the label a table or plot names it by ("" : its name)
    unit: str = ""  # µs | bytes | s | GB/s | TFLOP/s | FLOP ("" : none)
    rank: bool = False  # a rank measures it: a field of RankResult (results/rank_result.py)
    nullable: bool = False  # None where not measured, not the dtype's empty value ("" then says something)

    @property
    def label(self) -> str:
        return self.short or self.name

    @property
    def rank_default(self):
        """A RankResult's value where the rank did not measure it: None for a trace's figure
        (a rank without a trace) and a list a rank may not send, else the row's default."""
        if (self.dtype == "float" and self.combine == CRITICAL) or (self.dtype == "list" and self.combine != SAMPLES):
            return None
        return self.default

    @property
    def default(self):
        """What a row without the measurement holds."""
        if self.combine == PROFILED or self.nullable:
            return None
        return {"float": NAN, "str": "", "list": []}.get(self.dtype)


def _unit(name: str) -> str:
    """The unit a column's name says (`_us` µs, `_bytes` bytes, `_s` seconds, rates)."""
    if name.endswith("_us") or "_us_" in name:
        return "µs"
    if "bytes" in name:
        return "bytes"
    if name.endswith("_s"):
        return "s"
    return {"tflops": "TFLOP/s", "hbm_gbps": "GB/s", "nvlink_gbps": "GB/s", "expert_flops": "FLOP"}.get(
        name.removesuffix("_per_rank"), ""
    )


# what a rank measures by default: the columns combined from every rank's value
_BY_RANK = (WORST, MAX, MEAN, CRITICAL, PROFILED)


def _c(name, dtype, group, combine, doc, roles=(), short="", unit=None, rank=None, nullable=False) -> Column:
    """A column; `rank` (default: its combine rule takes every rank's value, phases aside: they
    come in `phases_us`) makes it a RankResult field."""
    assert dtype in DTYPES, (name, dtype)
    assert set(roles) <= set(ROLES), (name, roles)
    rank = combine in _BY_RANK and group != "phase" if rank is None else rank
    unit = _unit(name) if unit is None else unit
    return Column(name, dtype, group, combine, doc, tuple(roles), short, unit, rank, nullable)


GROUPS = (
    "identity",
    "provenance",
    "outcome",
    "latency",
    "host",
    "clock",
    "phase",
    "overlap",
    "trace",
    "memory",
    "rate",
    "layout",
    "routing",
    "harness",
)
PHASES = ("prepare", "dispatch", "experts", "weight_reduce", "combine", "shared_experts")
_PROV, _PROV_ORIGIN = (PROVENANCE_TABLE,), (PROVENANCE_TABLE, ORIGIN)
_LAT, _MEM = (REQUIRED, LATENCY_TABLE), (MEMORY_TABLE,)

MEASURED: tuple[Column, ...] = (
    # provenance (the invocation's)
    _c("run_id", "str", "provenance", RUN, "the invocation that wrote the row (envs/<run_id>.json)", _PROV_ORIGIN),
    _c("sweep", "str", "provenance", RUN, "the sweep file's name", _PROV_ORIGIN),
    _c("gpu", "str", "provenance", RUN, "GPU name (cpu on the CPU)", _PROV),
    _c("git_sha", "str", "provenance", RUN, "the commit measured (a bare hex commit)", _PROV),
    _c("env_id", "str", "provenance", RUN, "digest of the environment fingerprint", _PROV),
    _c("timestamp", "str", "provenance", RUN, "when the row was written (UTC, ISO 8601)", _PROV),
    _c(
        "write_seq",
        "int",
        "provenance",
        RUN,
        "the run folder's write sequence (results/sequence.py): the newest of a pair's rows, not the clock",
        (ORIGIN,),
    ),
    _c(
        "backend_origin",
        "str",
        "provenance",
        SAME,
        "where the backend came from: moebench, a plugin's "
        "`<distribution> <version>` or `module <name>` (not identity)",
    ),
    _c("experts_origin", "str", "provenance", SAME, "where the experts came from (as backend_origin)"),
    # outcome
    _c(
        "status",
        "str",
        "outcome",
        WORST,
        "ok | skipped | failed | timeout | oom | incorrect",
        (REQUIRED, ROWS_TABLE, LATENCY_TABLE),
    ),
    _c("reason", "str", "outcome", WORST, "why a row is not ok (empty when ok)", (ROWS_TABLE,)),
    _c("rel_err", "float", "outcome", MAX, "‖y − ref‖ / ‖ref‖ against the float32 reference"),
    # time (µs)
    _c(
        "timing_mode",
        "str",
        "latency",
        WORST,
        "the mode that ran: graph | events | profiler | cpu, or host where the host paced the samples",
        (COMBO, RUNNER, PER_ROW, ROWS_TABLE, LATENCY_TABLE),
        "timing",
    ),
    _c("latency_us_median", "float", "latency", SAMPLES, "median of samples_us (µs)", _LAT),
    _c("latency_us_p20", "float", "latency", SAMPLES, "20th percentile of samples_us (µs)", _LAT),
    _c("latency_us_p80", "float", "latency", SAMPLES, "80th percentile of samples_us (µs)", _LAT),
    _c("samples_us", "list", "latency", SAMPLES, "the timed samples, each the maximum over ranks (µs)", rank=True),
    _c("latency_us_per_rank", "list", "latency", PER_RANK, "each rank's median (µs)"),
    _c("timing_note", "str", "host", WORST, "why auto timed eager forwards, or why the row is host time"),
    _c("host_enqueue_us", "float", "host", MAX, "the host's time to enqueue one eager forward (µs, median of five)"),
    _c(
        "host_paced_samples",
        "float",
        "host",
        MAX,
        "samples the GPU started before the host had enqueued them (NaN before the hold and on the CPU)",
        (LATENCY_TABLE,),
    ),
    _c(
        "host_paced_no_shared",
        "float",
        "host",
        MAX,
        "the same of the ablation's samples of the layer "
        "without its shared experts (of as many as samples_us; NaN without the ablation)",
    ),
    _c(
        "host_paced_shared",
        "float",
        "host",
        MAX,
        "the same of the ablation's samples of the shared experts "
        "alone (of as many as samples_us; NaN without the ablation)",
    ),
    _c(
        "num_phase_samples",
        "float",
        "host",
        MAX,
        "the forwards the phases are medians of (the profiled samples in profiler mode; NaN without phases)",
    ),
    _c(
        "host_paced_phases",
        "float",
        "host",
        MAX,
        "the same as host_paced_samples of the phase forwards (of num_phase_samples)",
    ),
    _c(
        "num_trace_samples",
        "float",
        "host",
        MAX,
        "the samples of the row's torch trace, its ablation samples included (NaN without one)",
    ),
    _c(
        "host_paced_trace",
        "float",
        "host",
        MAX,
        "the same as host_paced_samples of the trace's samples "
        "(of num_trace_samples; the trace marks them `host_paced/<sample>`)",
    ),
    # the GPU's clock and state over the samples (measure/clock.py, measure/nvml.py; empty on the CPU)
    *(
        _c(
            f"sm_clock_mhz_{q}",
            "float",
            "clock",
            SAMPLES,
            f"{q} SM clock of the samples (MHz, read in the stream)",
            unit="MHz",
        )
        for q in ("min", "median", "max")
    ),
    _c(
        "sm_clock_mhz_samples",
        "list",
        "clock",
        SAMPLES,
        "each sample's SM clock, the slowest rank's (MHz; globaltimer and clock64 before and after it)",
        unit="MHz",
        rank=True,
    ),
    _c(
        "throttled_samples",
        "float",
        "clock",
        MAX,
        "samples below 0.9 x the median clock or under an NVML thermal / power / sync-boost reason",
    ),
    _c("clock_reasons", "str", "clock", WORST, "NVML clocks-event reasons seen over the samples (the ranks' union)"),
    _c("gpu_power_w_median", "float", "clock", MAX, "median power draw over the samples (W, NVML)", unit="W"),
    _c("gpu_power_limit_w", "float", "clock", MAX, "the enforced power limit (W, NVML)", unit="W"),
    _c("gpu_temp_c_max", "float", "clock", MAX, "highest GPU temperature over the samples (°C, NVML)", unit="°C"),
    _c("mem_clock_mhz_median", "float", "clock", MAX, "median memory clock over the samples (MHz, NVML)", unit="MHz"),
    _c("nvml_polls", "float", "clock", MAX, "NVML readings over the samples (runner.nvml_poll_ms; NaN: none)"),
    _c("clock_note", "str", "clock", WORST, "why a GPU row lacks its clock or NVML columns"),
    *(
        _c(
            f"{p}_us",
            "float",
            "phase",
            MAX,
            f"the {p.replace('_', ' ')} phase of the phase forwards (µs)",
            (ROOFLINE,) if p == "experts" else (),
        )
        for p in PHASES
    ),
    # overlap by ablation
    _c(
        "shared_us",
        "float",
        "overlap",
        SAMPLES,
        "median of the shared experts alone, as the layer runs them "
        "(µs; `overlap=none`: added into an output by their down GEMM)",
        (OVERLAP_TABLE,),
    ),
    _c(
        "latency_no_shared_us",
        "float",
        "overlap",
        SAMPLES,
        "median of the layer without its shared experts (µs)",
        (OVERLAP_TABLE,),
    ),
    _c(
        "shared_exposed_us",
        "float",
        "overlap",
        DERIVED,
        "latency − latency without shared experts (µs)",
        (OVERLAP_TABLE,),
    ),
    _c("overlap_fraction", "float", "overlap", DERIVED, "clamp(1 − exposed / shared, 0, 1)", (OVERLAP_TABLE,)),
    _c(
        "overlap_fraction_lo",
        "float",
        "overlap",
        DERIVED,
        "90 % bootstrap interval of overlap_fraction, low",
        (OVERLAP_TABLE,),
    ),
    _c(
        "overlap_fraction_hi",
        "float",
        "overlap",
        DERIVED,
        "90 % bootstrap interval of overlap_fraction, high",
        (OVERLAP_TABLE,),
    ),
    # traces
    _c(
        "trace_overlap_fraction",
        "float",
        "trace",
        CRITICAL,
        "the shared experts' overlap read from the trace",
        (OVERLAP_TABLE,),
    ),
    _c("trace_intersection_fraction", "float", "trace", CRITICAL, "the intersection figure of the trace"),
    _c("trace_overlap_method", "str", "trace", CRITICAL, "stretch | intersection | matched | mixed"),
    _c("trace_critical_rank", "float", "trace", CRITICAL, "the rank whose trace figures the row shows", rank=False),
    _c("trace_overlap_fraction_per_rank", "list", "trace", PER_RANK, "trace_overlap_fraction of each rank"),
    _c("trace_layer_us_per_rank", "list", "trace", PER_RANK, "each rank's layer span in its trace (µs)"),
    _c(
        "trace_wait_us_per_rank",
        "list",
        "trace",
        PER_RANK,
        "each rank's wait for the last rank (µs; rank 0 sends every rank's)",
        rank=True,
    ),
    _c("trace_trimmed_overlap_per_rank", "list", "trace", PER_RANK, "overlap on communication trimmed of the wait"),
    _c("trace_path", "str", "trace", CRITICAL, "the trace file, relative to the run (empty: none kept)", _PROV),
    _c(
        "nsys_capture",
        "str",
        "trace",
        CRITICAL,
        "trace=nsys: the raw capture (.qdstrm[.xz], relative to the run) when that is all there is "
        "(empty otherwise: the report is trace_path; run/nsys_import.py)",
        rank=False,
    ),
    _c("trace_error", "str", "trace", WORST, "why a trace could not be read"),
    _c("kernel_us", "list", "trace", PROFILED, "profiler mode: communication kernel → µs, JSON per rank"),
    # memory (bytes)
    _c(
        "workspace_bytes_analytic",
        "float",
        "memory",
        MAX,
        "the workspace the kernels declare (bytes)",
        _MEM,
        "workspace analytic",
    ),
    _c("analytic_peak_bytes", "float", "memory", MAX, "the declared peak of one forward (bytes)"),
    _c(
        "workspace_bytes_peak",
        "float",
        "memory",
        MAX,
        "allocator peak of one forward above what was allocated before it (bytes)",
        _MEM,
        "workspace peak",
    ),
    _c(
        "device_bytes_peak",
        "float",
        "memory",
        MAX,
        "the driver's view of the peak (bytes; other processes count)",
        _MEM,
        "device peak",
    ),
    _c(
        "reserved_bytes_peak",
        "float",
        "memory",
        MAX,
        "what the caching allocator reserved over the timed work (bytes): what runner.memory_budget caps",
    ),
    _c("memory_cap_bytes", "float", "memory", MAX, "the cap under runner.memory_budget (bytes)"),
    # rates
    _c("tflops", "float", "rate", MEAN, "expert TFLOP/s (mean over ranks)"),
    _c("hbm_gbps", "float", "rate", MEAN, "expert HBM GB/s (mean over ranks)"),
    _c("nvlink_gbps", "float", "rate", MEAN, "link GB/s (mean over ranks)"),
    _c("expert_flops", "float", "rate", MEAN, "the experts' FLOPs, tflops' numerator", (ROOFLINE,)),
    _c("expert_bytes", "float", "rate", MEAN, "the experts' bytes, hbm_gbps' numerator", (ROOFLINE,)),
    _c("tflops_per_rank", "list", "rate", PER_RANK, "tflops of each rank"),
    _c("hbm_gbps_per_rank", "list", "rate", PER_RANK, "hbm_gbps of each rank"),
    _c("nvlink_gbps_per_rank", "list", "rate", PER_RANK, "nvlink_gbps of each rank"),
    _c(
        "row_layout_used",
        "str",
        "layout",
        WORST,
        "the row layout the triton bf16 / fp8_block experts ran (mixed when ranks differ)",
    ),
    _c(
        "contiguous_gemm_used",
        "str",
        "layout",
        WORST,
        "the triton experts' contiguous GEMM kernels, gate/up's "
        "and down's (e.g. gluon/gluon; empty off the contiguous layout, mixed when ranks differ)",
    ),
    _c(
        "tuned_files",
        "str",
        "layout",
        WORST,
        "the tuned files the Triton experts (triton, triton_or_deepgemm, triton_batched) read for the "
        "layer's shape, found once at build: the tiles file, then the decisions sidecar, joined by '; ', "
        "each as kernels/configs/[partial/]NAME or $MOEBENCH_TRITON_CONFIG_DIR/NAME; empty: none "
        "(heuristic tiles, today's constants); None where the experts read no Triton config (torch, "
        "deepgemm) or the row did not run; mixed when ranks differ. Files found, not entries used: an "
        "entry serves a token count within 2x of its own (the nearest-key rule), and a forced row_layout "
        "or contiguous_gemm leaves the sidecar unread; row_layout_used and contiguous_gemm_used say what ran",
        nullable=True,
    ),
    # routing (moebench/routing/generate.py; docs/routing.md)
    _c("imbalance_experts", "float", "routing", MAX, "max / mean pairs per expert over every rank's tokens (1: even)"),
    _c(
        "imbalance_ranks",
        "float",
        "routing",
        MAX,
        "max / mean pairs per rank of the EP split (world_size or simulate_ep; 1 without one)",
    ),
    _c("simulated_rank", "float", "routing", MAX, "simulate_rank: the EP rank whose received tokens ran"),
    _c("received_tokens", "float", "routing", MAX, "simulate_rank: the tokens that rank receives from all N ranks"),
    _c("routing_window", "str", "routing", SAME, "replay: rank 0's rows of the recording (start:end of n)", rank=True),
    _c("routing_source", "str", "routing", SAME, "replay: what made the recording (its `source`)", rank=True),
    _c("fill_rows", "float", "routing", MAX, "workload.fill: rows per expert the batched buffers held"),
    _c("fill_max", "float", "routing", MAX, "workload.fill: the busiest local expert's pairs / fill_rows"),
    _c("fill_mean", "float", "routing", MAX, "workload.fill: mean pairs per local expert / fill_rows"),
    # where the sweep's time went (s, the slowest rank's; run/worker.py's Stopwatch; not a measurement)
    _c(
        "harness_start_s",
        "float",
        "harness",
        MAX,
        "the rank processes' start, imports and process group "
        "(s): on the first row a process ran, 0 after it; NaN where not known",
    ),
    _c(
        "harness_setup_s",
        "float",
        "harness",
        MAX,
        "the combination's setup: layer, weights, reference "
        "weights (s); on its first token count's row, 0 on the others",
    ),
    _c("harness_check_s", "float", "harness", MAX, "the check against the float32 reference (s)"),
    _c("harness_inputs_s", "float", "harness", MAX, "the timed inputs and their routing figures (s)"),
    _c("harness_probe_s", "float", "harness", MAX, "the host-enqueue and phase-hold probes (s)"),
    _c("harness_timing_s", "float", "harness", MAX, "warm-up and the timed samples, the ablation's interleaved (s)"),
    _c("harness_phases_s", "float", "harness", MAX, "the phase forwards (s)"),
    _c("harness_memory_s", "float", "harness", MAX, "the memory forward (s)"),
    _c("harness_trace_s", "float", "harness", MAX, "derived figures, traces and profiler phases (s)"),
    _c("harness_total_s", "float", "harness", MAX, "the row's time on the rank, its setup and start included (s)"),
)


def _type_name(t) -> str:
    t = typing.get_args(t)[0] if typing.get_origin(t) is typing.Union else t
    return {int: "int", float: "float", bool: "bool", str: "str"}.get(t, "str")


@cache
def identity_columns() -> tuple[Column, ...]:
    """The spec's columns (config/spec.py: fields with their roles and short labels, then the
    built-in entries' knobs), the key, the label, the knob tags, the token count and the overrides."""
    from moebench.config.spec import builtin_knobs

    head, tail = _identity_parts()
    knobs = tuple(_c(k.name, _type_name(k.type), "identity", SAME, f"knob: {k.help}") for k in builtin_knobs().values())
    return head + knobs + tail


@cache
def _identity_parts() -> tuple[tuple[Column, ...], tuple[Column, ...]]:
    """identity_columns() before and after the knobs: the columns that may have roles (a knob has
    none), read without the registry (so without torch: the report runs on a laptop)."""
    from moebench.config.spec import COLUMN_FIELDS, Combo

    hints = typing.get_type_hints(Combo)
    out = [
        _c("schema_version", "int", "identity", SAME, "the row's schema (migrate.py upgrades older ones)", (ORIGIN,)),
        _c("combo_key", "str", "identity", SAME, "digest of the combination's identity", _KEY),
        _c("label", "str", "identity", SAME, "backend/experts/reduction/overlap/quant/model, then tags"),
    ]
    out += [
        _c(
            f.name,
            _type_name(hints[f.name]),
            "identity",
            SAME,
            f.metadata.get("doc") or f.name,
            f.metadata["roles"],
            f.metadata["short"],
        )
        for f in fields(Combo)
        if f in COLUMN_FIELDS
    ]
    tail = (
        _c("knobs", "str", "identity", SAME, "tags of the knobs off their defaults", (COMBO, ROWS_TABLE)),
        _c(
            "intermediate_per_rank",
            "int",
            "identity",
            SAME,
            "one rank's width of each routed expert: intermediate / simulate_tp, "
            "or / world_size on backend=tp (vLLM's N)",
            short="inter/rank",
        ),
        _c("tokens_per_rank", "int", "identity", SAME, "tokens each rank routes", (REQUIRED,)),
        _c("overrides", "str", "identity", SAME, "the overrides the combination was planned from"),
    )
    return tuple(out), tail


_KEY = (ORIGIN, REQUIRED, ROWS_TABLE)


def columns() -> tuple[Column, ...]:
    """Every column of a row, identity first (a plugin's knobs are columns of its rows only)."""
    return identity_columns() + MEASURED


def column(name: str) -> Column:
    """The declaration of `name` (KeyError for an undeclared column)."""
    for c in columns():
        if c.name == name:
            return c
    raise KeyError(name)


def names(
    group: str | None = None, combine: str | None = None, dtype: str | None = None, role: str | None = None
) -> list[str]:
    """The measured columns' names, filtered (`role`: every column's, identity first; a knob
    has no role)."""
    assert role is None or role in ROLES, role
    return [
        c.name
        for c in (MEASURED if role is None else (*_identity_parts()[0], *_identity_parts()[1], *MEASURED))
        if (group is None or c.group == group)
        and (combine is None or c.combine == combine)
        and (dtype is None or c.dtype == dtype)
        and (role is None or role in c.roles)
    ]


def having(role: str) -> list[str]:
    """Every column with `role` (ROLES), in declaration order: the spec's fields first."""
    return names(role=role)


def label(name: str) -> str:
    """The short label a table or plot names a column by (`world` for world_size); a knob and an
    undeclared column by its name."""
    return next((c.label for c in (*_identity_parts()[0], *MEASURED) if c.name == name), name)


def rank_columns() -> tuple[Column, ...]:
    """The columns a rank measures: RankResult's fields beside its own (results/rank_result.py)."""
    return tuple(c for c in MEASURED if c.rank)


def declared(name: str) -> bool:
    """Whether `name` is a declared column: row.py's or the spec's, or a registered knob's
    (a plugin's knobs are columns of its rows)."""
    from moebench.config.spec import knob_meta

    return any(c.name == name for c in columns()) or name in knob_meta()


def empty() -> dict:
    """A row's measured columns at their defaults (a row without measurements)."""
    return {c.name: (list(c.default) if isinstance(c.default, list) else c.default) for c in MEASURED}


# -- the generated files -----------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "row_schema.json"
DESIGN = ROOT / "docs" / "design.md"
BEGIN = "<!-- row columns: generated by `python -m moebench.results.row --write` from moebench/results/row.py -->"
END = "<!-- end of row columns -->"


def golden_text(cols=None) -> str:
    cols = columns() if cols is None else cols
    return (
        json.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "columns": {c.name: c.dtype for c in sorted(cols, key=lambda c: c.name)},
            },
            indent=1,
        )
        + "\n"
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table_text(cols=None) -> str:
    cols = columns() if cols is None else cols
    lines = ["| column | type | group | over ranks | meaning |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{c.name}` | {c.dtype} | {c.group} | {c.combine} | {_cell(c.doc)} |" for c in cols]
    return "\n".join(lines)


ROLES_BEGIN = "<!-- column roles: generated by `python -m moebench.results.row --write` from the declarations -->"
ROLES_END = "<!-- end of column roles -->"
ROLE_DOCS = {
    AXIS: "names a combination in every table, in this order; a caption names it even at its default",
    COMBO: "names a combination where it varies within a table; a caption names it off its default",
    BARE: "shown bare in a combination's label (local/triton mixtral_8x7b)",
    WORKLOAD: "the competing-workload key: rows equal in all of these saw the same tokens and compete for "
    "fastest (the report's bold cell, `moebench tune --results`)",
    MODEL_SIZE: "shown only where it varies within one model",
    PLACE: "where a row ran: what a compared pair shares and a figure's basis reads",
    REQUIRED: "a row file without it is malformed",
    RUNNER: "how the runner measured, not what the layer is: the layer's allocations do not depend on it "
    "(a capped row confirms the capacity line of its layer whatever these were)",
    PER_ROW: "a row's, not its combination's: left out of a combination's label and columns",
    ORIGIN: "which row it is and where it came from; never a table's column",
    LATENCY_TABLE: "each side's latency cell of a compared pair",
    MEMORY_TABLE: "a column of the memory tables (MiB, under its short label)",
    OVERLAP_TABLE: "the overlap figures of the every-row table",
    PROVENANCE_TABLE: "where a row came from (filled with None where a row lacks it)",
    ROWS_TABLE: "names a row beside its identity in the every-row and unmatched tables",
    ROOFLINE: "what the roofline table needs",
}


def roles_text(cols=None) -> str:
    """The roles and the columns that have each (short labels in parentheses)."""
    cols = columns() if cols is None else cols
    lines = ["| role | meaning | columns |", "| --- | --- | --- |"]
    for role in ROLES:
        have = [f"`{c.name}`" + (f" ({c.short})" if c.short else "") for c in cols if role in c.roles]
        lines.append(f"| {role} | {_cell(ROLE_DOCS[role])} | {', '.join(have)} |")
    return "\n".join(lines)


def _between(text: str, begin: str, end: str, body: str) -> str:
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise ValueError(f"{DESIGN}: the markers {begin!r} … {end!r} are missing")
    return f"{head}{begin}\n{body}\n{end}{tail}"


def design_text(current: str, cols=None) -> str:
    """docs/design.md with the column table between BEGIN and END, and the roles between
    ROLES_BEGIN and ROLES_END, replaced by the declarations'."""
    return _between(_between(current, BEGIN, END, table_text(cols)), ROLES_BEGIN, ROLES_END, roles_text(cols))


def main(argv=None) -> int:
    ap = OneLineErrors(
        prog="python -m moebench.results.row",
        description="the golden row schema and design.md's column table, from row.py",
    )
    ap.add_argument("--write", action="store_true", help="rewrite both files (default: check them, exit 1 on drift)")
    args = ap.parse_args(argv)
    if not DESIGN.is_file():
        print(f"moebench: {DESIGN} not found: run this from a source checkout of moebench", file=sys.stderr)
        return 2
    want = {GOLDEN: golden_text(), DESIGN: design_text(DESIGN.read_text())}
    stale = [p for p, text in want.items() if not p.is_file() or p.read_text() != text]
    if args.write:
        for p in stale:
            p.write_text(want[p])
            print(f"wrote {p.relative_to(ROOT)}")
        return 0
    for p in stale:
        print(
            f"{p.relative_to(ROOT)} differs from moebench/results/row.py: run `python -m moebench.results.row --write`",
            file=sys.stderr,
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
