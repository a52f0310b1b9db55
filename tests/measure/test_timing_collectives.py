"""The multi-rank timing loop's collective safety, on the CPU: every rank must make the
same sequence of calls that hold collectives (the callable itself, `agree`, barrier,
align), whatever its own host measures, or an NCCL group deadlocks; and the CPU path
never touches CUDA. The CUDA calls are stand-ins here (no figure is measured): what is
checked is the order of calls, which depends only on agreed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moebench.measure import timing

CUDA = torch.device("cuda", 0)


class _Event:
    def __init__(self, enable_timing=True):
        pass

    def record(self):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 0.05  # ms

    def query(self):
        return False  # the GPU had not reached the sample's start when the host was done


class _Flusher(timing.L2Flusher):
    """An L2 flush that logs its calls and takes 50 µs of GPU time."""

    def __init__(self, log: list):
        self.log, self._us, self.buf = log, 50.0, type("Buf", (), {"device": CUDA})()

    def __call__(self):
        self.log.append(("flush",))


def _rank(monkeypatch, host_s: float, agreed: list, fns: int = 2, flush: bool = False) -> list:
    """Run time_interleaved as one rank whose callable takes `host_s` of host time;
    `agree` answers `agreed` in turn (what the max over the ranks would be)."""
    log, clock = [], [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(timing, "_sync", lambda device: None)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("sleep", cycles)))
    monkeypatch.setitem(timing._CYCLES_PER_US, CUDA, 1000.0)
    answers = list(agreed)

    def make(j):
        def fn():
            log.append(("fn", j))
            clock[0] += host_s

        return fn

    def agree(v):
        log.append(("agree",))
        return answers.pop(0)

    timing.time_interleaved(
        [make(j) for j in range(fns)],
        CUDA,
        reps=3,
        warmup=2,
        barrier=lambda: log.append(("barrier",)),
        align=lambda: log.append(("align",)),
        flush=_Flusher(log) if flush else None,
        warmup_ms=50.0,
        agree=agree,
    )
    assert not answers, "every agreed value was asked for"
    return log


def test_ranks_make_the_same_calls_whatever_their_hosts_measure(monkeypatch):
    # each callable's enqueue time (agreed 120 µs, 30 ms), then the warm-up rounds (agreed 40),
    # then the host-paced samples over the ranks (agreed 0: no retake)
    agreed = [120.0, 30_000.0, 40.0, 0.0]
    fast = _rank(monkeypatch, 1e-5, agreed)  # this rank's callables enqueue in 10 µs
    slow = _rank(monkeypatch, 0.03, agreed)  # this one's wait on its GPU (30 ms)
    assert fast == slow
    assert fast.count(("agree",)) == 4
    # the head start: the agreed 120 µs for the first callable, none for one that syncs the host
    sleeps = [e for e in fast if e[0] == "sleep" and e[1] < 20_000 * 1000]
    assert sleeps == [("sleep", int((1.25 * 120 + 20) * 1000))] * 3
    # barrier, hold, then the alignment: the ranks' start events fire together whatever
    # each one's hold took
    j = fast.index(sleeps[0])
    assert fast[j - 1] == ("barrier",) and fast[j + 1] == ("align",) and fast[j + 2] == ("fn", 0)
    # the head start is measured before the time-based warm-up (its 20 ms spins idle the
    # GPU), so sampling follows the warm-up rounds directly
    warm_agree = [i for i, e in enumerate(fast) if e == ("agree",)][2]
    assert fast[warm_agree + 1 :].index(("barrier",)) == 40 * 2


def test_with_a_flush_the_hold_is_more_flushes_not_a_spin(monkeypatch):
    """The hold is busy work: the agreed 170 µs (1.25 x 120 + 20) of hold as flushes of 50 µs
    each -> 4 after the sample's own; a callable that syncs the host gets the one flush."""
    agreed = [120.0, 30_000.0, 40.0, 0.0]
    log = _rank(monkeypatch, 1e-5, agreed, flush=True)
    assert not [e for e in log if e[0] == "sleep" and e[1] < 20_000 * 1000]  # no spin hold
    j = log.index(("align",))
    assert log[j - 6 : j + 2] == [("barrier",)] + [("flush",)] * 5 + [("align",), ("fn", 0)]
    # the second callable (30 ms of host: it syncs) gets its flush and no hold
    k = log.index(("fn", 1), j)
    assert log[k - 3 : k] == [("barrier",), ("flush",), ("align",)]


def test_a_retake_of_host_paced_samples_is_agreed(monkeypatch):
    """A rank whose GPU caught up with its host asks for a retake; the agreed count decides
    on every rank, and the retake doubles the holds."""
    agreed = [120.0, 120.0, 40.0, 1.0, 0.0]  # one host-paced sample somewhere: retake once
    log = _rank(monkeypatch, 1e-5, agreed)
    hold = int((1.25 * 120 + 20) * 1000)
    sleeps = [e[1] for e in log if e[0] == "sleep" and e[1] < 20_000 * 1000]
    assert sleeps == [hold] * 6 + [2 * hold] * 6  # 3 reps x 2 callables, then again doubled


def test_one_rank_and_cpu_paths_ask_nothing_of_the_others(monkeypatch):
    def no_cuda(*a, **k):
        raise AssertionError("the CPU path touched CUDA")

    monkeypatch.setattr(torch.cuda, "_sleep", no_cuda)
    monkeypatch.setattr(torch.cuda, "Event", no_cuda)
    monkeypatch.setattr(torch.cuda, "synchronize", no_cuda)
    asked = []
    out = timing.time_interleaved(
        [lambda: None],
        torch.device("cpu"),
        reps=2,
        warmup=1,
        barrier=lambda: None,
        warmup_ms=50.0,
        agree=lambda v: asked.append(v) or v,
    )
    assert len(out[0].us) == 2 and not asked


@pytest.mark.parametrize("host_us, lead", [(100.0, int((1.25 * 100 + 20) * 1000)), (16_000.0, 0)])
def test_lead_cycles_is_zero_for_a_callable_that_syncs_the_host(monkeypatch, host_us, lead):
    monkeypatch.setattr(timing, "host_enqueue_us", lambda fn, device: host_us)
    monkeypatch.setitem(timing._CYCLES_PER_US, CUDA, 1000.0)
    assert timing.lead_cycles(lambda: None, CUDA, agree=lambda v: v) == lead
    # the max over the ranks decides: one rank that syncs turns the head start off everywhere
    assert timing.lead_cycles(lambda: None, CUDA, agree=lambda v: max(v, 20_000.0)) == 0


def test_phase_samples_get_the_timed_samples_head_start(monkeypatch):
    """The per-phase samples start like the timed ones: on a GPU (one rank or several) the
    hold is measured with the phase recorder on (and agreed over ranks); on the CPU, never."""
    from moebench.measure import samples as measure
    from moebench.measure.samples import RankSync
    from moebench.traces.nvtx import make_phase_recorder

    asked = []

    def lead(fn, device, agree):
        asked.append((device, agree))
        fn()
        return 0

    monkeypatch.setattr(timing, "lead_cycles", lead)
    kernel = type("K", (), {"phases": None})()
    rec = make_phase_recorder(nvtx=False, record_function=False, cuda_events=True, device="cpu")
    seen = []

    def fn():
        seen.append(kernel.phases is rec)
        with rec("experts"):
            pass

    agree = lambda v: v
    ranks = RankSync(barrier=lambda: None, flush=None, align=None, agree=agree)
    assert measure.phase_head_start(kernel, fn, rec, ranks, CUDA) == 0
    assert asked == [(CUDA, agree)] and seen == [True] and kernel.phases is not rec
    assert measure.phase_head_start(kernel, fn, rec, ranks, torch.device("cpu")) == 0  # gloo
    assert len(asked) == 1
    assert measure.phase_head_start(kernel, fn, rec, RankSync(None, None, None, None), CUDA) == 0  # one GPU
    assert asked[1] == (CUDA, None) and len(asked) == 2
    out = measure.phase_samples(kernel, fn, rec, 3, ranks, lead=0)
    # two measured holds, one forward not counted (the holds behind it queue as the rest do), three samples
    assert "experts" in out.us and len(seen) == 6
    assert out.taken == 3 and np.isnan(out.host_paced)  # no GPU: nothing the host could pace
