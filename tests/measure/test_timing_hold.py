"""The hold before each GPU sample (moebench/measure/timing.py), on the CPU: a small model of one
CUDA stream stands in for the GPU. The host pays a launch cost per kernel and the stream
runs the kernels in order, each starting when both the previous one ended and the host
had launched it; events complete when the stream reaches them. What is checked is the
timing loop's logic against that model, not a figure of a real GPU (tests/gpu does that):

- a forward whose host enqueue is longer than its GPU work reads its GPU time, with no
  host-paced sample, once each sample waits behind its hold; without the hold the same
  loop would read the host's launch time;
- a forward that syncs the host inside is detected (its enqueue outlasts HOST_SYNCS_US),
  gets no hold, every sample is host-paced, and the row's timing mode says `host`;
- a host that is sometimes slower than the hold makes the loop take the samples again
  with a doubled hold;
- a host whose first call after a sync is slow (a cold start) paces no sample: an untimed
  lead-in takes that call, and the first sample follows GPU work as every later one does.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from moebench.measure import samples as measure
from moebench.measure import timing

CUDA = torch.device("cuda", 0)
CYCLES_PER_US = 1000.0


class Stream:
    """One in-order stream and the host beside it, in µs."""

    def __init__(self):
        self.host = 0.0  # the host's clock
        self.gpu = 0.0  # when the stream has finished everything launched so far

    def launch(self, gpu_us: float, host_us: float) -> float:
        """The host spends `host_us` launching a kernel of `gpu_us`; returns when it ends."""
        self.host += host_us
        self.gpu = max(self.gpu, self.host) + gpu_us
        return self.gpu

    def sync(self) -> None:
        self.host = max(self.host, self.gpu)


class Event:
    stream: Stream = None

    def __init__(self, enable_timing=True):
        self.at = None

    def record(self):
        self.at = Event.stream.launch(0.0, 1.0)

    def query(self):
        return self.at <= Event.stream.host

    def synchronize(self):
        Event.stream.host = max(Event.stream.host, self.at)

    def elapsed_time(self, other):
        return (other.at - self.at) / 1e3  # ms


@pytest.fixture
def stream(monkeypatch):
    st = Stream()
    Event.stream = st
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: st.launch(cycles / CYCLES_PER_US, 5.0))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: st.sync())
    monkeypatch.setattr(timing, "_sync", lambda device: st.sync())
    monkeypatch.setattr(timing.time, "perf_counter", lambda: st.host / 1e6)
    monkeypatch.setitem(timing._CYCLES_PER_US, CUDA, CYCLES_PER_US)
    return st


def layer(st: Stream, kernels: int = 15, gpu_us: float = 20.0, host_us: float = 50.0, sync_at: int = -1):
    """An eager forward: `kernels` launches of `host_us` host time and `gpu_us` GPU time each
    (a Triton launcher's ~50 µs against short kernels); `sync_at`: the host waits for the GPU
    after that many launches (reading a count back)."""

    def fn():
        for i in range(kernels):
            st.launch(gpu_us, host_us)
            if i == sync_at:
                st.sync()

    return fn


def test_held_samples_time_the_gpu_not_the_launches(stream):
    fn = layer(stream)  # 300 µs of GPU work, 750 µs of host enqueue
    held = timing.time_samples(fn, CUDA, reps=10, warmup=2)
    assert held.host_paced == 0
    assert held.median == pytest.approx(300.0, abs=2.0)  # the kernels' time (and the event's)
    # the same loop with the hold forced off reads the host's launch time
    unheld = timing.time_samples(fn, CUDA, reps=10, warmup=2, hold_us=float("nan"))
    assert unheld.host_paced == 10 and unheld.median == pytest.approx(750.0, abs=5.0)
    assert (
        unheld.paced_at == list(range(10))
        and unheld.paced_which() == f" (samples {', '.join(map(str, range(1, 10)))} and 10)"
    )
    assert held.paced_which() == "" and timing.Samples([1.0, 2.0], 1, [1]).paced_which() == " (sample 2)"


class Flusher(timing.L2Flusher):
    """The L2 flush as one kernel of the model: 60 µs of GPU work, 7 µs of host."""

    def __init__(self, st: Stream):
        self.st, self._us, self.buf = st, None, type("Buf", (), {"device": CUDA})()
        self.launches = 0

    def __call__(self):
        self.launches += 1
        self.st.launch(60.0, 7.0)


def test_with_a_flush_the_hold_is_flushes_and_still_covers_the_host(stream, monkeypatch):
    """The hold as busy work (more flushes, their time measured back to back: 60 µs): the
    GPU is still flushing when the host has launched the flushes and the whole forward, so
    the samples read the GPU's 300 µs, none host-paced, and no spin runs."""
    spins = []

    def spin(cycles):
        spins.append(cycles)
        stream.launch(cycles / CYCLES_PER_US, 5.0)

    monkeypatch.setattr(torch.cuda, "_sleep", spin)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    flush = Flusher(stream)
    fn = layer(stream)  # 300 µs of GPU work, 750 µs of host enqueue
    s = timing.time_samples(fn, CUDA, reps=10, warmup=2, flush=flush)
    assert flush.us() == pytest.approx(60.0, abs=1.0)  # (the event records cost the model 1 µs)
    assert s.host_paced == 0 and s.median == pytest.approx(300.0, abs=2.0)
    hold_us = 1.25 * 750.0 + 20.0
    per_sample = 1 + -(-hold_us // 60.0)  # the sample's own flush, then the hold's: 17
    assert flush.launches == 1 + 20 + (1 + 10) * per_sample  # measuring once, then the lead-in and the samples
    assert not [c for c in spins if c < timing.PROBE_SPIN_US * CYCLES_PER_US]  # only the probe's spin


def test_the_hold_follows_the_eager_forward_for_every_callable(stream):
    """hold_us (the eager forward's enqueue) holds every interleaved callable alike, so a
    cheap callable (a graph replay, the shared experts alone) sees the same duty cycle."""
    slow, cheap = layer(stream), layer(stream, kernels=2, host_us=5.0)
    out = timing.time_interleaved([slow, cheap], CUDA, reps=5, warmup=1, hold_us=750.0)
    assert [s.host_paced for s in out] == [0, 0]
    assert out[0].median == pytest.approx(300.0, abs=2.0) and out[1].median == pytest.approx(40.0, abs=2.0)


class Graphs:
    """torch.cuda's graph capture in the model: a capture records the forward's kernels without
    running them, a replay launches their GPU work as one launch of 5 µs of host time; which
    pool each capture was given is kept."""

    def __init__(self, st: Stream, monkeypatch):
        self.st, self.pools, self.handles = st, [], 0
        graphs = self

        class CUDAGraph:
            def __init__(self):
                self.gpu_us = 0.0

            def replay(self):
                graphs.st.launch(self.gpu_us, 5.0)

        @contextlib.contextmanager
        def graph(g, pool=None):
            self.pools.append(pool)

            def record(gpu_us: float, host_us: float) -> float:
                g.gpu_us += gpu_us
                return st.gpu

            st.launch = record  # captured, not run
            try:
                yield
            finally:
                del st.launch

        def graph_pool_handle():
            self.handles += 1
            return ("pool", self.handles)

        side = type("SideStream", (), {"wait_stream": lambda self, other: None})()
        monkeypatch.setattr(torch.cuda, "CUDAGraph", CUDAGraph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", graph_pool_handle)
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: side)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: side)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())


@pytest.mark.parametrize("share", [False, True])
def test_graph_captures_share_one_pool_only_when_asked(stream, monkeypatch, share):
    """time_interleaved(graph=True, share_pool=True) makes one pool per call and captures every
    callable into it (decide.py's whole-layer options: one forward's temporaries, not one per
    option); without share_pool each graph keeps its own private pool (pool=None)."""
    graphs = Graphs(stream, monkeypatch)
    slow, cheap = layer(stream), layer(stream, kernels=2, host_us=5.0)
    for call in (1, 2):
        out = timing.time_interleaved([slow, cheap], CUDA, reps=5, warmup=1, graph=True, share_pool=share)
        assert [len(s.us) for s in out] == [5, 5] and [s.host_paced for s in out] == [0, 0]
        assert out[0].median == pytest.approx(300.0, abs=2.0) and out[1].median == pytest.approx(40.0, abs=2.0)
        got = graphs.pools[-2:]
        assert got == ([("pool", call)] * 2 if share else [None, None])
    assert graphs.handles == (2 if share else 0)


def test_a_forward_that_syncs_the_host_is_detected_and_labelled(stream):
    fn = layer(stream, sync_at=7)
    host_us = timing.host_enqueue_us(fn, CUDA)  # the host waits for the 20 ms of queued work
    assert host_us > timing.HOST_SYNCS_US
    assert timing.hold_cycles(host_us, CUDA) == 0  # no hold would help
    s = timing.time_samples(fn, CUDA, reps=10, warmup=1, hold_us=host_us)
    assert s.host_paced == 10  # every sample started before the host had enqueued it
    mode = measure.paced_mode("events", host_us, s.host_paced, len(s.us))
    assert mode == "host"
    assert "syncs the host" in measure.host_time_note(host_us, s.host_paced, len(s.us))


def test_the_probe_spins_once_for_a_forward_that_never_waits(stream):
    """Five calls back to back behind one 20 ms spin: the enqueue time (750 µs) is read in
    about 20 ms of GPU time plus the five forwards', where a spin per call took 100 ms."""
    fn = layer(stream)
    t0 = stream.host
    assert timing.host_enqueue_us(fn, CUDA) == pytest.approx(750.0)
    assert stream.host - t0 < timing.PROBE_SPIN_US + 5 * 750.0 + 100.0
    assert stream.host - t0 < 0.3 * 5 * timing.PROBE_SPIN_US


def test_the_probe_measures_each_call_alone_when_the_calls_outlast_the_spin(stream):
    """A 6 ms enqueue: five calls outlast one 20 ms spin, so the GPU idles before the last
    ones; each call is then timed behind a spin of its own, and still reads 6 ms."""
    fn = layer(stream, kernels=120)  # 120 x 50 µs of host time
    t0 = stream.host
    assert timing.host_enqueue_us(fn, CUDA) == pytest.approx(6000.0)
    assert stream.host - t0 > 5 * timing.PROBE_SPIN_US  # the fallback's spins


def test_a_host_slower_than_its_hold_gets_the_samples_taken_again(stream):
    """The enqueue measured at 750 µs; later forwards take the host 1300 µs (another tenant
    of the host): the GPU catches up with the host inside those samples, so every sample is
    taken again with the hold doubled, and then none is host-paced."""
    costs = iter([50.0] * 15 * 5 + [86.7] * 10_000)  # the measurement's five calls, then slower

    def fn():
        for _ in range(15):
            stream.launch(20.0, next(costs))

    hold = timing.hold_cycles(timing.host_enqueue_us(fn, CUDA), CUDA)
    first = timing._held_samples([fn], CUDA, 10, [hold], None, None, None)[0]
    assert first.host_paced == 10  # the hold (957 µs) is shorter than 1300 µs of launches
    costs = iter([50.0] * 15 * 5 + [86.7] * 10_000)
    s = timing.time_samples(fn, CUDA, reps=10, warmup=0)
    assert s.host_paced == 0 and s.median == pytest.approx(300.0, abs=2.0)
    assert measure.paced_mode("events", 750.0, s.host_paced, len(s.us)) == "events"


def test_paced_mode_thresholds():
    assert measure.paced_mode("graph", 500.0, 0, 30) == "graph"
    assert measure.paced_mode("events", 500.0, 6, 30) == "events"  # a fifth: still GPU time
    assert measure.paced_mode("events", 500.0, 7, 30) == "host"
    assert measure.paced_mode("profiler", 16_000.0, 0, 30) == "host"


def test_the_first_sample_of_a_pass_follows_gpu_work_not_a_synced_idle_gpu(stream, monkeypatch):
    """A callable whose first call after a sync takes 6 × its usual enqueue (a cold start: on an H100 a
    decisions tune's first option read host-paced in the first of 5 samples, twice in a row, the
    hold doubled twice each time): the pass opens with an untimed lead-in, one round of every
    callable behind its hold, so the cold call is not timed and the first sample, like every later
    one, starts behind its predecessor's GPU work. One pass, no retake. Without the lead-in the first
    sample of every pass was host-paced, the doubled holds (at most 4 × 1.25 ×) short of the cold call."""
    normal = layer(stream)  # 300 µs of GPU work, 750 µs of host enqueue

    def cold_after_sync():
        stream.host += 5 * 750.0 if stream.synced else 0.0
        stream.synced = False
        normal()

    stream.synced = False
    plain_sync = stream.sync

    def sync():
        plain_sync()
        stream.synced = True

    stream.sync = sync
    passes = []
    held = timing._held_samples
    monkeypatch.setattr(timing, "_held_samples", lambda *a, **k: passes.append(1) or held(*a, **k))
    fns = [cold_after_sync, layer(stream, kernels=3)]
    out = timing.time_interleaved(fns, CUDA, reps=5, warmup=1)
    assert passes == [1]  # no retake: the holds were enough once the cold call was the lead-in's
    assert [s.host_paced for s in out] == [0, 0] and [s.paced_at for s in out] == [[], []]
    assert out[0].median == pytest.approx(300.0, abs=2.0)
