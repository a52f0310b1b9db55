"""The clock of each sample and the throttled-sample rule (measure/clock.py), and NVML's poller
(measure/nvml.py) with an injected NVML module: aggregation and absence, on the CPU. The
GPU's own readings are tests/gpu/test_clock_gpu.py's."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from moebench.measure import clock, gpu_state, nvml
from moebench.measure.timing import Samples


def test_clock_is_cycles_over_ns_per_sm_and_the_median_over_sms():
    # two samples, three SMs: SM 2 missed the first sample's end stamp (0), SM 1 read nothing
    start_ns = [[1000, 0, 1000], [5000, 0, 5000]]
    start_cy = [[10, 0, 7], [100, 0, 90]]
    end_ns = [[2000, 0, 0], [6000, 0, 6000]]  # 1000 ns later
    end_cy = [[1810, 0, 0], [1600, 0, 1590]]  # 1800 and 1500 cycles: 1.8 and 1.5 GHz
    mhz = clock.clock_mhz(start_ns, start_cy, end_ns, end_cy)
    assert mhz == pytest.approx([1800.0, 1500.0])
    # no SM read both stamps: NaN, never a made-up clock
    none = clock.clock_mhz([[0, 0]], [[0, 0]], [[5, 0]], [[9, 0]])
    assert math.isnan(none[0])


def test_the_clock_keeps_nanoseconds_of_an_epoch_timer():
    # globaltimer counts ns since the epoch: a float64 there is 256 ns coarse, a 1 µs sample's
    # clock would be off by a quarter
    t0 = 1_800_000_000_000_000_123
    mhz = clock.clock_mhz([[t0]], [[5_000_000]], [[t0 + 1000]], [[5_001_900]])
    assert mhz[0] == pytest.approx(1900.0, rel=1e-9)


def test_a_sample_below_nine_tenths_of_the_median_clock_is_throttled():
    clocks = [1965.0, 1960.0, 1950.0, 1700.0, 1515.0, float("nan")]
    got = clock.throttled(clocks)
    # median 1950: the bound is 1755 MHz; a NaN clock is never called slow
    assert got.tolist() == [False, False, False, True, True, False]
    assert clock.THROTTLE_CLOCK_FRACTION == 0.9


def test_an_nvml_thermal_power_or_sync_boost_reason_marks_a_sample_whatever_its_clock():
    clocks = [1900.0, 1900.0, 1900.0, 1900.0]
    masks = [0x0, 0x1, 0x4, 0x40]  # none, idle (not a throttle), sw power cap, hw thermal
    assert clock.throttled(clocks, masks).tolist() == [False, False, True, True]
    assert clock.reason_names(0x1 | 0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]
    # without clocks (no probe) NVML's reasons alone decide
    assert clock.throttled([float("nan")] * 2, [0x10, 0]).tolist() == [True, False]


def test_a_samples_reasons_are_the_mask_in_effect_at_its_start_and_every_poll_inside_it():
    polls = [0, 100, 200, 300]
    masks = [0x0, 0x4, 0x0, 0x20]
    spans = [(50, 90), (150, 250), (310, 400), (-10, -5)]
    got = clock.sample_masks(spans, polls, masks)
    # 0's mask in effect over (50, 90); 100's at 150 and 200's inside; 300's at 310; before any poll: 0
    assert got.tolist() == [0x0, 0x4, 0x20, 0x0]


class FakeNvml:
    """An NVML module's surface: the readings it gives are scripted (a state reader, not a
    measurement: an injected reader is a fair test of aggregation)."""

    class NVMLError(Exception):
        pass

    def __init__(self, power_mw=(500_000.0, 700_000.0), reasons=(0x0, 0x4), fail_init=False, no_temp=False):
        self.power, self.reasons, self.fail_init, self.no_temp = list(power_mw), list(reasons), fail_init, no_temp
        self.n = 0

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        assert uuid.startswith("GPU-")
        return ("uuid", uuid)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("index", i)

    def nvmlDeviceGetPowerUsage(self, h):
        self.n += 1
        return self.power[self.n % len(self.power)]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTemperature(self, h, sensor):
        if self.no_temp:
            raise self.NVMLError("Not Supported")
        return 60 + self.n

    def nvmlDeviceGetClockInfo(self, h, kind):
        return {1: 1980, 2: 3201}[kind]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons[self.n % len(self.reasons)]


def test_the_poller_aggregates_power_temperature_clocks_and_reasons():
    fake = FakeNvml()
    mod, why = nvml.open_nvml(fake)
    assert mod is fake and why == ""
    with nvml.NvmlPoller(fake, nvml.device_handle(fake, "abc", 0), period_ms=2) as p:
        time.sleep(0.03)
    assert len(p.polls) >= 3  # one at each end and some between
    s = nvml.summary(p.polls)
    assert s["gpu_power_w_median"] in (500.0, 600.0, 700.0)
    assert s["gpu_power_limit_w"] == 700.0
    assert s["gpu_temp_c_max"] == 60 + fake.n
    assert s["mem_clock_mhz_median"] == 3201.0
    assert s["nvml_polls"] == float(len(p.polls))
    assert s["clock_reasons"] == "sw_power_cap"
    t, m = p.timeline()
    assert t == sorted(t) and set(m) <= {0, 4}


def test_a_figure_the_driver_does_not_give_is_nan_and_the_rest_stand():
    fake = FakeNvml(no_temp=True)
    s = nvml.summary([nvml.read(fake, None)])
    assert math.isnan(s["gpu_temp_c_max"]) and s["gpu_power_limit_w"] == 700.0


def test_absent_nvml_leaves_the_columns_empty_and_says_why():
    mod, why = nvml.open_nvml(FakeNvml(fail_init=True))
    assert mod is None and why.startswith("no NVML") and "Driver Not Loaded" in why
    s = nvml.summary([])
    assert math.isnan(s["gpu_power_w_median"]) and s["clock_reasons"] == "" and math.isnan(s["nvml_polls"])


def test_a_watch_names_throttled_samples_from_clocks_and_nvml_and_fills_the_row():
    fake = FakeNvml(reasons=(0x0,))
    watch = gpu_state.ClockWatch(None, fake, ("index", 0), poll_ms=1.0)
    with watch.polling():
        time.sleep(0.005)
    t0 = watch.poller.polls[0].t_ns
    s = Samples(
        [100.0] * 4, clock_mhz=[1900.0, 1900.0, 1600.0, 1900.0], spans_ns=[(t0 + i, t0 + i + 1) for i in range(4)]
    )
    assert watch.throttled(s).tolist() == [False, False, True, False]
    row = watch.fields(s, cuda=True)
    assert row["throttled_samples"] == 1.0 and row["sm_clock_mhz_samples"][2] == 1600.0
    assert row["gpu_power_limit_w"] == 700.0 and row["clock_note"] == ""
    # retakes only under runner.drop_throttled
    assert watch.retake() is None
    drop = gpu_state.ClockWatch(None, fake, ("index", 0), poll_ms=1.0, drop_throttled=True)
    assert drop.retake() is not None


def test_on_the_cpu_a_watch_is_empty_and_without_a_probe_or_nvml_it_records_nothing():
    cpu = gpu_state.ClockWatch.for_device(torch.device("cpu"), 50.0, True)
    assert cpu.probe is None and cpu.poller is None and cpu.note == "" and cpu.retake() is not None
    assert cpu.fields(Samples([1.0, 2.0]), cuda=False) == {}
    # a GPU row without the probe or NVML: NaN counts and the note, no list
    bare = gpu_state.ClockWatch(None, note="clock not recorded (ImportError: triton)")
    row = bare.fields(Samples([1.0, 2.0]), cuda=True)
    assert math.isnan(row["throttled_samples"]) and "sm_clock_mhz_samples" not in row
    assert row["clock_note"].startswith("clock not recorded")
    assert not np.any(bare.throttled(Samples([1.0, 2.0])))


class _FakeProbe:
    """ClockProbe's surface: logs its stamps; its clocks are scripted per pass."""

    def __init__(self, log: list, passes: list[list[float]], host_us: float = 40.0):
        self.log, self.passes, self.host_us = log, list(passes), host_us

    def begin(self, slots: int) -> None:
        self.slots = slots

    def stamp(self, slot: int, end: bool) -> None:
        self.log.append(("stamp", slot, end))

    def read(self):
        mhz = self.passes.pop(0)
        assert len(mhz) == self.slots
        return np.array(mhz), [(10 * i, 10 * i + 5) for i in range(self.slots)]


def test_the_loop_stamps_right_outside_each_sample_grows_the_hold_and_retakes_throttled_passes(monkeypatch):
    from moebench.measure import timing
    from tests.measure.test_timing_collectives import CUDA, _Event

    log: list = []
    monkeypatch.setattr(timing, "_sync", lambda device: None)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("sleep", cycles)))
    monkeypatch.setitem(timing._CYCLES_PER_US, CUDA, 1000.0)
    # pass 1: a sample at 1500 MHz among 1900s (throttled: retaken); pass 2: all at 1900
    probe = _FakeProbe(log, [[1900.0, 1500.0, 1900.0], [1900.0] * 3])
    watch = gpu_state.ClockWatch(probe, drop_throttled=True)  # type: ignore[arg-type] (a stand-in probe)
    out = timing.time_interleaved(
        [lambda: log.append(("fn",))], CUDA, reps=3, warmup=0, hold_us=120.0, probe=probe, retake=watch.retake()
    )[0]
    hold = int((1.25 * (120 + 40) + 20) * 1000)  # the start stamp's 40 µs of host time held too
    sleeps = [e for e in log if e[0] == "sleep"]
    # two passes, no doubling (nothing was host-paced), each of the untimed lead-in and 3 samples
    assert sleeps == [("sleep", hold)] * 8
    assert log[:2] == [("sleep", hold), ("fn",)]  # the lead-in: held, called, no stamp
    i = log.index(("stamp", 0, False))
    assert log[i - 1 : i + 3] == [("sleep", hold), ("stamp", 0, False), ("fn",), ("stamp", 0, True)]
    assert out.clock_mhz == [1900.0] * 3 and out.spans_ns[1] == (10, 15)
    assert not watch.throttled(out).any()
