"""Per-phase durations, the stream timeline and shared/communication overlap of a `Trace`.

Definitions (all µs, per sample, then the median across samples):
- phase `cpu_us`: summed duration of the phase's CPU ranges (inclusive of nested ones);
- phase `gpu_us`: union busy time of the GPU activities launched inside any range of
  that phase (inclusive: `finalize` counts its `combine` and `weight_reduce` kernels);
- phase `parent`: the phase whose range holds it (model.phase_tree: finalize holds weight_reduce
  and combine; an overlapped dispatch or combine the shared experts); the phases without one
  follow one another and add up to the layer, gaps aside; `summary.phases` in that reading order;
- `shared_us`: union time of the shared-expert kernels (launched inside `shared_experts`);
- `comm_us`: union time of the communication kernels (NCCL, DeepEP, pplx, symm-mem);
- `overlap_us` = |shared ∩ comm| (the intersection);
  `intersection_fraction` = overlap_us / shared_us (the plain figure: the share of the
  shared-expert kernels' time during which a communication kernel also ran);
- `window_us` = |shared ∪ comm|: how long communication or shared experts kept the GPU busy;
- `layer_us`: the sample's GPU span, first kernel start to last kernel end.
A layer sample is a `sample/<i>` range; without them the whole trace is one sample.

The overlap figure, `trace_overlap_fraction`, is the share of the shared experts' own
time that the overlap hides, measured in the trace as the ablation measures it with
events. Two kernels running side by side slow each other (DeepEP's combine 419 -> 530 µs
beside the shared experts on H200), so their intersection overstates what is saved. The
trace therefore also holds, after the layer samples, as many samples of the layer
without its shared experts (`sample_noshared/<i>`) and of the shared experts alone
(`sample_shared/<i>`), and:
- `comm_alone_us`  = median over `sample_noshared` samples of the comm kernels' busy time;
- `shared_alone_us` = median over `sample_shared` samples of the shared kernels' busy time
  (every non-communication kernel of such a sample);
- `shared_exposed_us` = max(0, median(window_us) − comm_alone_us): what comm + shared
  cost in the layer beyond what comm costs alone;
- `trace_overlap_fraction` = clamp(1 − shared_exposed_us / shared_alone_us, 0, 1), and
  never above median(overlap_us) / shared_alone_us.
Since window = comm + shared − overlap, the hidden time shared_alone − exposed equals
overlap − (comm in layer − comm alone) − (shared in layer − shared alone): the
intersection less both kernels' stretch. Both stretches are ≥ 0 but for noise, so the
hidden time is bounded by the intersection; the bound keeps noise (e.g. a comm kernel a
little shorter in the layer than alone) from reporting hidden time where shared and
comm kernels never ran together (overlap=none gives 0). `comm_stretch` = median(comm_us)
/ comm_alone_us and `shared_stretch` = median(shared_us) / shared_alone_us.
Several ranks (traces/matched.py `trim_comm_waits`, `matched_overlap`): a collective kernel starts on each
rank when that rank launches it, and on the rank that arrives first it spins until the
last one arrives; that wait holds no transfer, and it differs between the layer samples
and the ablation samples (one rank's figure read 0.13 against its peer's 0.68 in the same
run, docs/findings/trace-vs-ablation.md). With every rank's trace of one combination and token
count (one host, one clock: matching NCCL kernels end within ~15 µs of each other on the
2 x H200 machine), the i-th communication kernel of a sample starts, on every rank, when
the last rank's i-th one started; the figure above is then computed per rank on those
intervals (`method` "stretch_matched"). The rank that waits least for its peers in the
layer samples (`wait_us`, summed over the collectives that ran beside shared-expert
kernels) is the one the others wait for: its timeline is the layer's critical path, and a row holds its figure. (An
early rank's shared experts also hide in its wait, which the trimmed intervals charge
as exposed: its figure is a lower bound.)
A trace without both ablation families (older traces; `overlap=none`, which records
none) falls back to the plain figure: `trace_overlap_fraction` = median of the per-sample
`intersection_fraction`, `shared_exposed_us` = median of shared_us − overlap_us, and the
summary says so (`method` "intersection", a note).
Samples the capture marked host-paced (model.py `HOST_PACED_PREFIX`: the GPU started them
before the host had enqueued them, behind the hold every trace sample gets) stay in the
figures; the summary names them (`host_paced`, a note), since their kernels may hold the
host's launch gaps.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Optional

from moebench.traces.model import ABLATION_PREFIXES, PHASES, Trace, phase_tree

METHOD_STRETCH = "stretch"  # window − comm alone, over shared alone (ablation samples in the trace)
METHOD_INTERSECTION = "intersection"  # |shared ∩ comm| / |shared| (no ablation samples)
METHOD_MATCHED = "stretch_matched"  # stretch, on communication intervals trimmed of the wait for peer ranks
PLAIN_NOTE = "plain intersection: no ablation samples in this trace"


# -- interval arithmetic (µs) -------------------------------------------------
def union(intervals) -> list:
    """Merge (start, end) intervals into sorted disjoint ones."""
    out: list = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(disjoint) -> float:
    return float(sum(e - s for s, e in disjoint))


def intersect(a, b) -> list:
    """Intersection of two sorted disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


# -- results ------------------------------------------------------------------
@dataclass
class PhaseStats:
    """Median over samples of one phase: CPU range time and GPU kernel busy time (µs)."""

    name: str
    cpu_us: Optional[float]
    gpu_us: Optional[float]
    num_ranges: int  # per sample (median)
    num_kernels: int  # per sample (median)
    # the phase whose range holds this one's (model.phase_tree), its time counted there too;
    # None: a top-level phase, one of those that follow one another and add up to the layer
    parent: Optional[str] = None


@dataclass
class StreamStats:
    """One GPU stream: median over samples of its busy time (µs) and of what ran on it."""

    lane: str
    num_kernels: int  # over all samples
    busy_us: float  # union busy time per sample (median)
    comm_us: float
    shared_us: float
    phases: dict  # innermost phase -> busy µs per sample (median)


@dataclass
class TraceSummary:
    source: str
    fmt: str
    num_samples: int
    combos: list
    phases: dict  # name -> PhaseStats
    streams: list  # [StreamStats]
    shared_us: Optional[float]  # shared-expert kernels' busy time in a layer sample
    comm_us: Optional[float]  # communication kernels' busy time in a layer sample
    overlap_us: Optional[float]  # |shared ∩ comm|
    trace_overlap_fraction: Optional[float]  # stretch-aware, or the plain figure (see `method`)
    shared_exposed_us: Optional[float]  # of the method in use
    intersection_fraction: Optional[float] = None  # the plain figure, always
    window_us: Optional[float] = None  # |shared ∪ comm|
    layer_us: Optional[float] = None  # a layer sample's GPU span (first kernel start to last end)
    layer_cpu_us: Optional[float] = None  # a layer sample's range on the CPU (`sample/<i>`; None without)
    shared_alone_us: Optional[float] = None  # sample_shared/<i>
    comm_alone_us: Optional[float] = None  # sample_noshared/<i>
    comm_stretch: Optional[float] = None  # comm_us / comm_alone_us
    shared_stretch: Optional[float] = None  # shared_us / shared_alone_us
    method: Optional[str] = None  # "stretch" | "intersection" | None (no figure)
    num_ablation_samples: dict = field(default_factory=dict)  # kind -> number of samples
    # the sample ranges the capture marked host-paced (model.HOST_PACED_PREFIX): their kernels may
    # hold the host's launch gaps, so the figures above may too
    host_paced: list = field(default_factory=list)
    per_sample: list = field(default_factory=list)  # [dict] raw per-sample figures
    ablation_samples: list = field(default_factory=list)  # [dict] raw figures of the ablation samples
    notes: list = field(default_factory=list)

    def as_row(self) -> dict:
        """Flat figures for the results store (µs; fractions in [0, 1]; None where absent)."""
        row = {
            "trace_overlap_fraction": self.trace_overlap_fraction,
            "trace_overlap_method": self.method,
            "trace_intersection_fraction": self.intersection_fraction,
            "trace_shared_us": self.shared_us,
            "trace_comm_us": self.comm_us,
            "trace_overlap_us": self.overlap_us,
            "trace_window_us": self.window_us,
            "trace_layer_us": self.layer_us,
            "trace_shared_alone_us": self.shared_alone_us,
            "trace_comm_alone_us": self.comm_alone_us,
            "trace_comm_stretch": self.comm_stretch,
            "trace_shared_stretch": self.shared_stretch,
            "trace_shared_exposed_us": self.shared_exposed_us,
        }
        for name, p in self.phases.items():
            row[f"trace_{name}_cpu_us"] = p.cpu_us
            row[f"trace_{name}_gpu_us"] = p.gpu_us
        return row


def _median(values) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _sample_figures(kernels: list, ranges: list) -> dict:
    fig: dict = {"phases": {}}
    for ph in PHASES:
        rs = [r for r in ranges if r.name == ph]
        ks = [k for k in kernels if ph in k.phases]
        fig["phases"][ph] = {
            "cpu_us": sum(r.dur_us for r in rs) if rs else None,
            "gpu_us": length(union((k.start_us, k.end_us) for k in ks)) if ks else None,
            "num_ranges": len(rs),
            "num_kernels": len(ks),
        }
    shared = union((k.start_us, k.end_us) for k in kernels if k.shared)
    comm = union((k.start_us, k.end_us) for k in kernels if k.comm)
    have_gpu = bool(kernels)
    shared_us, comm_us = length(shared), length(comm)
    overlap_us = length(intersect(shared, comm))
    fig["shared_us"] = shared_us if have_gpu else None
    fig["comm_us"] = comm_us if have_gpu else None
    fig["overlap_us"] = overlap_us if have_gpu else None
    fig["window_us"] = length(union(shared + comm)) if have_gpu else None
    fig["intersection_fraction"] = overlap_us / shared_us if shared_us > 0 else None
    fig["shared_exposed_us"] = shared_us - overlap_us if have_gpu else None
    # the sample's GPU span: first kernel start to last kernel end
    fig["layer_us"] = max(k.end_us for k in kernels) - min(k.start_us for k in kernels) if have_gpu else None
    return fig


def _ablation_figures(kernels: list) -> dict:
    """Busy time of one ablation sample's communication kernels and of the rest (the shared experts, µs)."""
    if not kernels:
        return {"comm_us": None, "shared_us": None, "num_kernels": 0}
    return {
        "comm_us": length(union((k.start_us, k.end_us) for k in kernels if k.comm)),
        # in `sample_shared/<i>` every kernel is the shared experts' (whether or not a
        # `shared_experts` range was around the call)
        "shared_us": length(union((k.start_us, k.end_us) for k in kernels if not k.comm)),
        "num_kernels": len(kernels),
    }


def stretch_aware(
    window_us: Optional[float],
    comm_alone_us: Optional[float],
    shared_alone_us: Optional[float],
    overlap_us: Optional[float] = None,
) -> tuple:
    """(shared_exposed_us, trace_overlap_fraction) from the medians (module docstring).

    exposed = max(0, window − comm alone); fraction = clamp(1 − exposed / shared alone, 0, 1),
    and at most overlap / shared alone when the intersection is given. (None, None) when a
    figure is missing or the shared experts took no time alone.
    """
    if window_us is None or comm_alone_us is None or not shared_alone_us or shared_alone_us <= 0:
        return None, None
    exposed = max(0.0, window_us - comm_alone_us)
    frac = min(1.0, max(0.0, 1.0 - exposed / shared_alone_us))
    if overlap_us is not None:
        frac = min(frac, max(0.0, overlap_us / shared_alone_us))
    return exposed, frac


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def _lane_key(lane: str) -> tuple:
    """Sort "dev<d>/s<s>" lanes numerically."""
    m = re.fullmatch(r"dev(-?\d+)/s(-?\d+)", lane)
    return (int(m.group(1)), int(m.group(2)), "") if m else (1 << 30, 0, lane)


def _busy(ks: list, sel) -> float:
    """The time covered by the kernels of `ks` that `sel` picks (overlaps counted once)."""
    return length(union((k.start_us, k.end_us) for k in ks if sel(k)))


def _stream_stats(groups: list) -> list:
    """Per-lane figures: busy/comm/shared/phase time per sample, medians across `groups` (lists of kernels)."""
    lanes = sorted({k.lane for ks in groups for k in ks}, key=_lane_key)
    out = []
    for lane in lanes:
        per = []  # per sample: (busy, comm, shared, {phase: busy})
        count = 0
        for ks in groups:
            ks = [k for k in ks if k.lane == lane]
            count += len(ks)
            phases = {ph: _busy(ks, lambda k, ph=ph: k.phase == ph) for ph in PHASES}
            per.append((_busy(ks, lambda k: True), _busy(ks, lambda k: k.comm), _busy(ks, lambda k: k.shared), phases))
        phases = {ph: statistics.median(p[3][ph] for p in per) for ph in PHASES}
        out.append(
            StreamStats(
                lane=lane,
                num_kernels=count,
                busy_us=statistics.median(p[0] for p in per),
                comm_us=statistics.median(p[1] for p in per),
                shared_us=statistics.median(p[2] for p in per),
                phases={ph: v for ph, v in phases.items() if v > 0},
            )
        )
    return out


def host_paced_note(paced: list, total: int) -> str:
    """The note of a trace whose capture marked samples host-paced (`paced`: their range names)."""
    shown = ", ".join(paced[:6]) + (f" (+{len(paced) - 6} more)" if len(paced) > 6 else "")
    return (
        f"{len(paced)} of {total} samples host-paced ({shown}): the GPU started them before the host had "
        "enqueued them, so their kernels may hold the host's launch gaps and the figures from them host time"
    )


def summarize(trace: Trace) -> TraceSummary:
    """Phases, streams and overlap of an attributed trace (see the module docstring for definitions)."""
    samples = trace.sample_ranges()
    notes = list(trace.notes)
    if samples:
        groups = []
        for idx, sr in samples:
            ks = [k for k in trace.kernels if k.sample == idx]
            rs = [r for r in trace.ranges if r.name in PHASES and sr.start_us <= r.start_us <= sr.end_us]
            groups.append((idx, ks, rs))
        outside = sum(k.sample is None and k.ablation is None for k in trace.kernels)
        if outside:
            notes.append(
                f"{outside} GPU activities outside every sample range (warm-up, the ranks' alignment "
                "before each sample?) left out"
            )
    else:
        groups = [(None, [k for k in trace.kernels if k.ablation is None], trace.phase_ranges())]
    if not trace.kernels:
        notes.append("no GPU activity in the trace: only CPU range times")
    elif not any(k.launch_us is not None for k in trace.kernels):
        notes.append("no launch records: kernels cannot be mapped to phases")

    per_sample = []
    for idx, ks, rs in groups:
        fig = _sample_figures(ks, rs)
        fig["sample"] = idx
        per_sample.append(fig)

    # ablation samples: the layer without its shared experts, the shared experts alone
    ablation_samples = []
    num_ablation = {}
    for kind in ABLATION_PREFIXES:
        rs = trace.ablation_ranges(kind)
        num_ablation[kind] = len(rs)
        for idx, _ in rs:
            fig = _ablation_figures([k for k in trace.kernels if k.ablation == (kind, idx)])
            ablation_samples.append({"kind": kind, "sample": idx, **fig})
    comm_alone = _median(f["comm_us"] for f in ablation_samples if f["kind"] == "noshared")
    shared_alone = _median(f["shared_us"] for f in ablation_samples if f["kind"] == "shared")

    shared_us = _median(f["shared_us"] for f in per_sample)
    comm_us = _median(f["comm_us"] for f in per_sample)
    overlap_us = _median(f["overlap_us"] for f in per_sample)
    window_us = _median(f["window_us"] for f in per_sample)
    intersection_fraction = _median(f["intersection_fraction"] for f in per_sample)
    plain_exposed = _median(f["shared_exposed_us"] for f in per_sample)
    method, fraction, exposed = None, None, plain_exposed
    if trace.has_ablation() and shared_us:
        exposed, fraction = stretch_aware(window_us, comm_alone, shared_alone, overlap_us)
        if fraction is not None:
            method = METHOD_STRETCH
    if method is None and intersection_fraction is not None:
        method, fraction, exposed = METHOD_INTERSECTION, intersection_fraction, plain_exposed
        notes.append(
            PLAIN_NOTE
            if not trace.has_ablation()
            else "plain intersection: the ablation samples hold no GPU time of the shared experts"
        )

    paced = trace.host_paced()
    if paced:
        total = len(samples) + sum(num_ablation.values())
        notes.append(host_paced_note(paced, total))

    # in reading order: top-level phases as they start, each followed by its parts
    tree = phase_tree(r for _, _, rs in groups for r in rs)
    parents = dict(tree)
    phases = {}
    for ph in [name for name, _ in tree] + [p for p in PHASES if p not in parents]:
        vals = [f["phases"][ph] for f in per_sample]
        if not any(v["num_ranges"] or v["num_kernels"] for v in vals):
            continue
        phases[ph] = PhaseStats(
            name=ph,
            cpu_us=_median(v["cpu_us"] for v in vals),
            gpu_us=_median(v["gpu_us"] for v in vals),
            num_ranges=int(statistics.median(v["num_ranges"] for v in vals)),
            num_kernels=int(statistics.median(v["num_kernels"] for v in vals)),
            parent=parents.get(ph),
        )
    return TraceSummary(
        source=trace.source,
        fmt=trace.fmt,
        num_samples=len(samples),
        combos=trace.combos(),
        phases=phases,
        streams=_stream_stats([ks for _, ks, _ in groups]),
        shared_us=shared_us,
        comm_us=comm_us,
        overlap_us=overlap_us,
        trace_overlap_fraction=fraction,
        shared_exposed_us=exposed,
        intersection_fraction=intersection_fraction,
        window_us=window_us,
        layer_us=_median(f["layer_us"] for f in per_sample),
        layer_cpu_us=_median(r.dur_us for _, r in samples),
        shared_alone_us=shared_alone,
        comm_alone_us=comm_alone,
        comm_stretch=_ratio(comm_us, comm_alone),
        shared_stretch=_ratio(shared_us, shared_alone),
        method=method,
        num_ablation_samples=num_ablation,
        host_paced=paced,
        per_sample=per_sample,
        ablation_samples=ablation_samples,
        notes=notes,
    )


# -- markdown -----------------------------------------------------------------
