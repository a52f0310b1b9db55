"""A row's clock and GPU-state columns (results/row.py, group "clock"): the stamps of the SM
clock around each sample (measure/clock.py) and NVML's readings over them (measure/nvml.py),
and which samples were throttled. `ClockWatch` is what the timed loop is given; off a GPU, or
without the probe or NVML, the columns stay empty and `note` says why."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Optional

import numpy as np
import torch

from moebench.measure import clock, nvml
from moebench.measure.timing import Samples

_PROBES: dict = {}  # device -> ClockProbe, or the why of its absence (str)
_HANDLES: dict = {}  # device index -> (nvml module, handle) or (None, why)


def probe_for(device: torch.device) -> tuple[Optional[clock.ClockProbe], str]:
    """(the device's clock probe, "") or (None, why not): built once per device and process."""
    if device.type != "cuda":
        return None, ""
    if device not in _PROBES:
        try:
            p = clock.ClockProbe(device)
            p.host_us  # noqa: B018 (compiles and launches once: a failure shows here, not mid-row)
            _PROBES[device] = p
        except Exception as e:  # noqa: BLE001 (Triton missing or the kernel failing: no clock, the row still runs)
            _PROBES[device] = f"clock not recorded ({type(e).__name__}: {str(e)[:120]})"
    p = _PROBES[device]
    return (None, p) if isinstance(p, str) else (p, "")


def nvml_for(device: torch.device, nvml_module: Any = None) -> tuple[Any, Any, str]:
    """(NVML module, the device's handle, "") or (None, None, why not), once per device."""
    if device.type != "cuda":
        return None, None, ""
    key = device.index
    if key not in _HANDLES:
        mod, why = nvml.open_nvml(nvml_module)
        if mod is None:
            _HANDLES[key] = (None, why)
        else:
            uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
            try:
                _HANDLES[key] = (mod, nvml.device_handle(mod, uuid, device.index or 0))
            except nvml.nvml_error(mod):  # a UUID NVML does not know: by index
                try:
                    _HANDLES[key] = (mod, nvml.device_handle(mod, "", device.index or 0))
                except nvml.nvml_error(mod) as e:  # no handle: no NVML columns, the row still runs
                    _HANDLES[key] = (None, f"no NVML handle for {device} ({type(e).__name__})")
    mod, h = _HANDLES[key]
    return (None, None, h) if mod is None else (mod, h, "")


class ClockWatch:
    """The probe and the NVML poller of one row's timed samples (`timing.time_interleaved`'s
    `probe`, its `retake` under runner.drop_throttled, and `polling()` around it)."""

    def __init__(
        self,
        probe: Optional[clock.ClockProbe],
        nvml_module: Any = None,
        handle: Any = None,
        poll_ms: float = 0.0,
        drop_throttled: bool = False,
        note: str = "",
    ):
        self.probe, self.drop = probe, drop_throttled
        self.poller = nvml.NvmlPoller(nvml_module, handle, poll_ms) if nvml_module is not None and poll_ms > 0 else None
        self.note = note

    @classmethod
    def for_device(cls, device: torch.device, poll_ms: float, drop_throttled: bool) -> "ClockWatch":
        """The watch of a row on `device`: empty on the CPU (no note: a CPU row has no clock)."""
        probe, why_probe = probe_for(device)
        mod, h, why_nvml = nvml_for(device) if poll_ms > 0 else (None, None, "")
        note = "; ".join(w for w in (why_probe, why_nvml) if w)
        return cls(probe, mod, h, poll_ms, drop_throttled, note)

    def polling(self) -> AbstractContextManager:
        return self.poller if self.poller is not None else nullcontext()

    def masks(self, s: Samples) -> Optional[np.ndarray]:
        """NVML's reasons per sample (None without readings or spans)."""
        if self.poller is None or not s.spans_ns:
            return None
        t, m = self.poller.timeline()
        return clock.sample_masks(s.spans_ns, t, m)

    def throttled(self, s: Samples) -> np.ndarray:
        """Which of `s`'s samples were throttled (clock.throttled)."""
        if not s.clock_mhz and self.masks(s) is None:
            return np.zeros(len(s.us), dtype=bool)
        clocks = s.clock_mhz or [float("nan")] * len(s.us)
        return clock.throttled(clocks, self.masks(s))

    def retake(self) -> Optional[Any]:
        """timing.time_interleaved's `retake` (runner.drop_throttled), or None: given wherever the
        knob is on, even without a probe or NVML here (0 then), since its count is agreed over
        the ranks and every rank must make that call."""
        if not self.drop:  # never by what this rank measured: every rank must agree alike
            return None
        return lambda out: float(sum(int(self.throttled(s).sum()) for s in out))

    def fields(self, s: Samples, cuda: bool) -> dict:
        """The row's clock columns from the layer's samples `s` (empty on the CPU)."""
        if not cuda:
            return {}
        out: dict[str, Any] = {"clock_note": self.note}
        measured = bool(s.clock_mhz) or self.poller is not None
        out["throttled_samples"] = float(self.throttled(s).sum()) if measured else float("nan")
        if s.clock_mhz:
            out["sm_clock_mhz_samples"] = [float(x) for x in s.clock_mhz]
        if self.poller is not None:
            polls = self.poller.polls
            if s.spans_ns and any(a for a, _ in s.spans_ns):
                lo = min(a for a, _ in s.spans_ns if a) - int(self.poller.period_s * 1e9)
                hi = max(b for _, b in s.spans_ns)
                polls = [p for p in polls if lo <= p.t_ns <= hi] or polls
            out.update(nvml.summary(polls))
        return out
