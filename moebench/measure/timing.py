"""Timing: CUDA events (or the host clock on CPU), CUDA-graph replay, raw
samples with median / p20 / p80, an L2 flush between samples, ranks barriered
before each sample, and a hold before each GPU sample so that the events time
the GPU, not the host's launches."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np
import torch

from moebench.config.limits import HOST_PACED_MAX, HOST_SYNCS_US, NOISY_SPREAD  # noqa: F401 (timing.<name>: the loop's thresholds)

if TYPE_CHECKING:
    from moebench.measure.clock import ClockProbe

L2_FLUSH_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2
HOLD_RETRIES = 2  # samples retaken with a doubled hold when the GPU caught up with the host


@dataclass
class Samples:
    """Raw per-sample times in µs; `host_paced` of them started on the GPU before the host
    had enqueued the whole callable (their time may hold the host's launch gaps)."""

    us: list[float]
    host_paced: int = 0
    paced_at: list[int] = field(default_factory=list)  # which samples (0-based) the host paced
    # with a clock probe (measure/clock.py): each sample's SM clock (MHz) and its span on the
    # host's clock (time.time_ns: start, end), where NVML's readings are placed
    clock_mhz: list[float] = field(default_factory=list)
    spans_ns: list[tuple[int, int]] = field(default_factory=list)

    def paced_which(self) -> str:
        """Which samples the host paced, for a line: ' (sample 1)', ' (samples 1 and 4)' (1-based); ''
        where none did or none are known."""
        at = [str(i + 1) for i in self.paced_at]
        if not at:
            return ""
        return f" (sample {at[0]})" if len(at) == 1 else f" (samples {', '.join(at[:-1])} and {at[-1]})"

    def q(self, p: float) -> float:
        return float(np.percentile(self.us, p)) if self.us else float("nan")

    @property
    def median(self) -> float:
        return self.q(50)

    @property
    def p20(self) -> float:
        return self.q(20)

    @property
    def p80(self) -> float:
        return self.q(80)

    @property
    def spread(self) -> float:
        """p80 / p20 (1.0 = no spread)."""
        return self.p80 / self.p20 if self.us and self.p20 > 0 else float("nan")

    @property
    def host_paced_share(self) -> float:
        return self.host_paced / len(self.us) if self.us else 0.0


class L2Flusher:
    """Writes a buffer larger than L2 so each sample starts with a cold cache. Repeated, it
    is also the hold's work (sample_start): memory-bound on every SM, so the GPU is as busy
    before a sample as in a run of layers."""

    def __init__(self, device: torch.device):
        self.buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
        self._us: Optional[float] = None

    def __call__(self) -> None:
        self.buf.zero_()

    def us(self) -> float:
        """One flush's GPU time (µs), measured once (20 back to back after one; syncs the device)."""
        if self._us is None:
            self()
            self._us = back_to_back_us(self, self.buf.device, 20)
        return self._us

    def count_for(self, cycles: int) -> int:
        """Flushes that keep the GPU busy for at least `cycles` of the spin clock."""
        return math.ceil(cycles / (self.us() * _cycles_per_us(self.buf.device))) if cycles > 0 else 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_samples(
    fn: Callable[[], object],
    device: torch.device,
    reps: int,
    warmup: int,
    barrier: Optional[Callable[[], None]] = None,
    flush: Optional[L2Flusher] = None,
    align: Optional[Callable[[], None]] = None,
    graph: bool = False,
    warmup_ms: float = 0.0,
    agree: Optional[Callable[[float], float]] = None,
    hold_us: Optional[float] = None,
    probe: Optional[ClockProbe] = None,
    retake: Optional[Callable[[list[Samples]], float]] = None,
) -> Samples:
    """Time fn() `reps` times after `warmup` calls (see time_interleaved)."""
    return time_interleaved(
        [fn], device, reps, warmup, barrier, flush, align, graph, warmup_ms, agree, hold_us, probe, retake
    )[0]


def time_interleaved(
    fns: Sequence[Callable[[], object]],
    device: torch.device,
    reps: int,
    warmup: int,
    barrier: Optional[Callable[[], None]] = None,
    flush: Optional[L2Flusher] = None,
    align: Optional[Callable[[], None]] = None,
    graph: bool = False,
    warmup_ms: float = 0.0,
    agree: Optional[Callable[[float], float]] = None,
    hold_us: Optional[float] = None,
    probe: Optional[ClockProbe] = None,
    retake: Optional[Callable[[list[Samples]], float]] = None,
    share_pool: bool = False,
) -> list[Samples]:
    """Time several callables with their samples interleaved (A B C A B C ...),
    so that drift (clocks, temperature, other tenants of the host) hits them
    alike, which an ablation (the layer with and without its shared experts)
    needs; one Samples per callable, µs.

    CPU: the monotonic clock around each call (after `barrier` on several ranks).

    GPU, one rank or several: CUDA events around each sample, and before each the
    barrier (several ranks: all start together), the L2 flush, a **hold**: GPU work
    (more flushes; without a flush, a spin: sample_start) long enough for the host to
    enqueue the whole callable before the GPU reaches the start event, so the events
    time the GPU's work, never the host's launches (an eager MoE layer takes the host
    0.5-2 ms to enqueue, more than its GPU time at decode sizes), then `align` (several
    ranks: a one-element all-reduce on the GPU, so that the ranks' start events fire
    together on the devices).
    The hold is `hold_us` of host enqueue time (the eager forward's, so that graph
    replays and eager samples see the same GPU duty cycle) or, without it, each
    callable's own (host_enqueue_us), times 1.25 plus 20 µs. A callable whose
    enqueue outlasts HOST_SYNCS_US syncs the host: it gets no hold (none would help).

    After enqueueing a sample the host asks whether the GPU already passed its start
    event: if so, the GPU waited for the host inside that sample (`host_paced`).
    Should any sample be host-paced while holds were on, every sample is taken
    again with the holds doubled (HOLD_RETRIES times at most; with several ranks
    the decision is agreed). One rank reads its events once at the end; several
    ranks wait for each sample's end before the next barrier.

    graph=True captures each callable in a CUDA graph and times its replays. Each graph has
    its own private memory pool, unless `share_pool`: then one pool (torch.cuda.graph_pool_handle,
    one per call) serves every capture, so the graphs hold about one callable's temporaries
    rather than one set per callable (a tune's 18 whole-layer options at 16384 tokens: a pool of
    several GB each). That is safe here because the graphs are replayed one at a time on one stream,
    never concurrently, and nothing a replay leaves in the pool is read by another: each callable
    writes its temporaries before it reads them and its outputs are discarded (a tensor kept
    alive past its capture stays allocated, never handed to another), so the blocks one capture
    freed can serve the next. Not for callables that read what another's replay wrote there.

    warmup_ms (GPU only): after the `warmup` calls, keep calling for about this
    long, so that sampling starts at the clock the GPU sustains under this load
    rather than at its idle boost (an H200 runs a GEMM ~10% faster in its first
    tens of ms than after ~100 ms: docs/findings/timing.md). With several ranks,
    `agree` (a max over the ranks) makes them run the same number of calls.

    probe (GPU, measure/clock.py): stamps the SM clock right before each sample's start event
    and right after its end event, so each Samples carries its samples' clocks and spans; the
    start stamp's host enqueue is added to the hold. `retake(pass)`: samples of the pass to
    drop (runner.drop_throttled: the throttled ones); any makes the pass taken again, as a
    host-paced sample does, within the same HOLD_RETRIES.
    """
    if graph:
        pool = torch.cuda.graph_pool_handle() if share_pool else None
        fns = [_capture(fn, device, warmup, pool) for fn in fns]
    for _ in range(warmup):
        for fn in fns:
            fn()
    _sync(device)
    if device.type != "cuda":
        return _host_clock(fns, reps, barrier)
    # before the time-based warm-up: measuring idles the GPU for 20 ms spins, long enough
    # for the clock to climb back to its idle boost
    if hold_us is None:
        holds = [lead_cycles(fn, device, agree) for fn in fns]
    else:
        holds = [hold_cycles(agree(hold_us) if agree is not None else hold_us, device)] * len(fns)
    if probe is not None:  # the start stamp is enqueued after the hold: the hold covers it too
        extra = hold_cycles(probe.host_us, device) - hold_cycles(0.0, device)
        holds = [h + extra if h else 0 for h in holds]
    if warmup_ms > 0:
        warm_for(fns, device, warmup_ms, flush, agree)
    for attempt in range(HOLD_RETRIES + 1):
        out = _held_samples(fns, device, reps, holds, barrier, flush, align, probe)
        # only a held callable can be helped by a longer hold
        paced = float(sum(s.host_paced for s, h in zip(out, holds, strict=True) if h))
        dropped = retake(out) if retake is not None else 0.0
        if agree is not None:
            paced = agree(paced)
            dropped = agree(dropped) if retake is not None else dropped  # the same calls on every rank
        if attempt == HOLD_RETRIES or not ((paced and any(holds)) or dropped):
            return out
        if paced:
            holds = [2 * h for h in holds]
    return out  # pragma: no cover (the loop returns)


def _host_clock(fns, reps: int, barrier) -> list[Samples]:
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for j, fn in enumerate(fns):
            if barrier is not None:
                barrier()
            t0 = time.perf_counter_ns()
            fn()
            out[j].append((time.perf_counter_ns() - t0) / 1e3)
    return [Samples(o) for o in out]


def _held_samples(fns, device, reps: int, holds: list[int], barrier, flush, align, probe=None) -> list[Samples]:
    """One pass of `reps` interleaved samples, each after its start (barrier, flush, align,
    hold); µs and the count of host-paced samples per callable, and with a probe each
    sample's clock, stamped right outside its events."""
    several = barrier is not None
    events: list[list[tuple]] = [[] for _ in fns]
    starts = [sample_start(barrier, flush, align, h) for h in holds]
    if not several:
        # the lead-in, untimed: one round of every callable, each behind its hold, so that the first
        # sample follows GPU work as every later one does (its predecessor's), not an idle GPU after the
        # sync before the pass with only its own hold ahead, and no callable's first call after that
        # sync is a timed one (a decisions tune's first option read host-paced in 1 sample of 5, the
        # first, twice in a row on an H100)
        for start, fn in zip(starts, fns, strict=True):
            start()
            fn()
    if probe is not None:
        probe.begin(reps * len(fns))
    for i in range(reps):
        for j, fn in enumerate(fns):
            starts[j]()
            if probe is not None:
                probe.stamp(i * len(fns) + j, end=False)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            paced = s.query()  # the GPU passed the start before the host had enqueued all of fn
            e.record()
            if probe is not None:
                probe.stamp(i * len(fns) + j, end=True)
            if several:
                e.synchronize()
            events[j].append((s, e, paced))
    torch.cuda.synchronize(device)
    out = [
        Samples(
            [s.elapsed_time(e) * 1e3 for s, e, _ in evs],
            sum(p for _, _, p in evs),
            [i for i, x in enumerate(evs) if x[2]],
        )
        for evs in events
    ]
    if probe is not None:
        mhz, spans = probe.read()
        for j, o in enumerate(out):
            o.clock_mhz = [float(x) for x in mhz[j :: len(fns)]]
            o.spans_ns = spans[j :: len(fns)]
    return out


_CYCLES_PER_US: dict = {}


def back_to_back_us(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """An independent reference for a timed callable (do_bench's way): `reps` calls enqueued
    back to back between two events, no flush or host gap between them; the mean per call (µs)."""
    with torch.cuda.device(device):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
    return s.elapsed_time(e) * 1e3 / reps


def _cycles_per_us(device: torch.device) -> float:
    """Clock cycles per µs of torch.cuda._sleep's spin, measured once per device."""
    if device not in _CYCLES_PER_US:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        b.synchronize()
        _CYCLES_PER_US[device] = 10_000_000 / (a.elapsed_time(b) * 1e3)
    return _CYCLES_PER_US[device]


PROBE_SPIN_US = 20_000  # the queued GPU work host_enqueue_us calls the callable behind


def host_enqueue_us(fn: Callable[[], object], device: torch.device, tries: int = 5) -> float:
    """Median host time (µs) of calling fn() while the GPU has work queued, so no launch
    waits for the GPU: fn's pure enqueue cost, the median of `tries` calls. A result above
    HOST_SYNCS_US means fn waits on the GPU (e.g. reads a count back).

    One spin of PROBE_SPIN_US, then the `tries` calls back to back behind it, each timed on
    the host; an event after the spin says whether the GPU was still spinning when the last
    call returned. If it was, no call waited for the GPU. If not (a call synced the host, or
    the calls outlasted the spin), each call is measured again behind a spin of its own
    (_host_enqueue_each), as the probe did before: the spin's 20 ms are then paid per call,
    not once (~25 ms a probe against ~100 ms)."""
    cyc = _cycles_per_us(device)
    torch.cuda._sleep(int(PROBE_SPIN_US * cyc))
    spun = torch.cuda.Event()
    spun.record()
    out = []
    for _ in range(tries):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    still_busy = not spun.query()
    _sync(device)
    if still_busy:
        return float(np.median(out))
    return _host_enqueue_each(fn, device, tries, cyc)


def _host_enqueue_each(fn: Callable[[], object], device: torch.device, tries: int, cyc: float) -> float:
    """host_enqueue_us's fallback: each call behind a spin of its own, synced after it."""
    out = []
    for _ in range(tries):
        torch.cuda._sleep(int(PROBE_SPIN_US * cyc))
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
        _sync(device)
    return float(np.median(out))


def hold_cycles(enqueue_us: float, device: torch.device) -> int:
    """The hold before a sample whose callable takes the host `enqueue_us` to enqueue, in
    the spin clock's cycles (its unit whether the hold is a spin or flushes: sample_start):
    1.25 x that + 20 µs; 0 for a callable that syncs the host."""
    if not enqueue_us <= HOST_SYNCS_US:  # NaN too: no measurement, no hold
        return 0
    return int((1.25 * enqueue_us + 20.0) * _cycles_per_us(device))


def lead_cycles(fn, device, agree) -> int:
    """The hold before each sample of fn (hold_cycles of its measured enqueue time; 0
    when fn syncs the host). Calls fn `host_enqueue_us`'s tries, then `agree` once (the
    same calls on every rank, whatever each measures)."""
    us = host_enqueue_us(fn, device)
    if agree is not None:
        us = agree(us)
    return hold_cycles(us, device)


def sample_start(barrier=None, flush: Optional[L2Flusher] = None, align=None, lead: int = 0) -> Callable[[], None]:
    """What precedes each GPU sample, outside its timing (timed, phase, profiler and trace
    samples): the barrier, the L2 flush, the hold of `lead` spin cycles, then the GPU
    alignment (several ranks: whatever each rank's hold took, their start events fire
    together).

    The hold is busy work: with a flush, as many more flushes as fill `lead` cycles (at
    least that long, L2Flusher.count_for). A one-thread spin (torch.cuda._sleep) leaves the
    GPU nearly idle, and the sample after it ran slow: a ~220 µs Triton GEMM read 3.2 %
    above do_bench behind the spin (4.7 % behind a 520 µs one) and 0.0 % behind flushes of
    the same length (benchmarks/hold_bias.py, docs/findings/timing.md). Without a flush
    (runner.l2_flush=false: more flushes would empty the cache the run keeps warm) the hold
    is that spin."""
    flushes = flush.count_for(lead) if flush is not None else 0

    def start() -> None:
        if barrier is not None:
            barrier()
        if flush is not None:
            for _ in range(1 + flushes):
                flush()
        elif lead:
            torch.cuda._sleep(lead)
        if align is not None:
            align()

    return start


def warm_for(fns, device, warmup_ms: float, flush, agree) -> None:
    """Call the callables (in turn, flushing L2 as sampling will) for ~warmup_ms."""

    def one_round():
        for fn in fns:
            if flush is not None:
                flush()
            fn()

    t0 = time.perf_counter()
    one_round()
    _sync(device)
    round_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
    n = float(min(10_000, math.ceil(warmup_ms / round_ms)))
    if agree is not None:
        n = agree(n)
    for _ in range(int(n)):
        one_round()
    _sync(device)


def _capture(fn: Callable[[], object], device: torch.device, warmup: int, pool=None) -> Callable[[], None]:
    """fn() captured once in a CUDA graph; returns its replay (launch gaps removed). `pool`: a
    torch.cuda.graph_pool_handle() the capture allocates from (shared with other captures), or
    None for the graph's own private pool."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):  # warm up outside the capture (allocator, autotuning)
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    _sync(device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        fn()
    return g.replay
