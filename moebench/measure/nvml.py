"""The GPU's state over a row's samples through NVML (`nvidia-ml-py`, imported as `pynvml`, an
optional library): power draw and limit, temperature, memory and SM clocks and the
clocks-event (throttle) reasons, polled by a host thread every `runner.nvml_poll_ms`.

This only records: it never locks a clock nor changes a power limit. Where NVML is absent (the
CPU, a machine without the library or driver), `open_nvml` says why once and the row's NVML
columns stay empty. The poller sleeps between reads (ctypes calls release the GIL), so at
20-50 ms it takes a few µs of the host every period (scripts/clock_poll_ab.py measures what
that does to the host's enqueue).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from moebench.measure.clock import reason_names

NAN = float("nan")


@dataclass(frozen=True)
class Poll:
    """One reading: host time (time.time_ns), W, °C, MHz and NVML's reasons bitmask."""

    t_ns: int
    power_w: float
    power_limit_w: float
    temp_c: float
    mem_clock_mhz: float
    sm_clock_mhz: float
    reasons: int


_ABSENT: dict[str, str] = {}  # why NVML is absent, once per process


def open_nvml(nvml: Any = None) -> tuple[Any, str]:
    """(the initialised NVML module, "") or (None, why not). `nvml` injects a module (tests);
    else `pynvml` is imported."""
    if nvml is None:
        if "why" in _ABSENT:
            return None, _ABSENT["why"]
        try:
            import pynvml  # optional: nvidia-ml-py
        except ImportError:
            _ABSENT["why"] = "no NVML (nvidia-ml-py is not installed)"
            return None, _ABSENT["why"]
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml_error(nvml) as e:  # no driver, no library
        why = f"no NVML ({type(e).__name__}: {str(e)[:120]})"
        _ABSENT.setdefault("why", why)
        return None, why
    return nvml, ""


def device_handle(nvml: Any, uuid: str = "", index: int = 0) -> Any:
    """The NVML handle of a CUDA device: by its UUID (CUDA's index need not be NVML's under
    CUDA_VISIBLE_DEVICES), else by index."""
    if uuid:
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    return nvml.nvmlDeviceGetHandleByIndex(index)


def nvml_error(nvml: Any) -> type[BaseException]:
    """NVML's exception class (pynvml.NVMLError; OSError where a module lacks it)."""
    return getattr(nvml, "NVMLError", OSError)


def _reasons(nvml: Any, h: Any) -> int:
    # the name since driver 535; the older one before
    get = (
        getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return int(get(h))


def read(nvml: Any, h: Any) -> Poll:
    """One reading of the device's state (NaN for a figure this driver does not give)."""

    def num(fn, *args, scale=1.0) -> float:
        try:
            return float(getattr(nvml, fn)(h, *args)) * scale
        except nvml_error(nvml):  # NVMLError_NotSupported and the like: that figure only
            return NAN

    try:
        reasons = _reasons(nvml, h)
    except nvml_error(nvml):
        reasons = 0
    return Poll(
        time.time_ns(),
        num("nvmlDeviceGetPowerUsage", scale=1e-3),
        num("nvmlDeviceGetEnforcedPowerLimit", scale=1e-3),
        num("nvmlDeviceGetTemperature", 0),  # NVML_TEMPERATURE_GPU
        num("nvmlDeviceGetClockInfo", 2),  # NVML_CLOCK_MEM
        num("nvmlDeviceGetClockInfo", 1),  # NVML_CLOCK_SM
        reasons,
    )


class NvmlPoller:
    """Reads the device's state every `period_ms` on a host thread while inside `with`; `polls`
    holds the readings (one taken at the start and one at the end, however short the window)."""

    def __init__(self, nvml: Any, handle: Any, period_ms: float):
        self.nvml, self.handle, self.period_s = nvml, handle, period_ms / 1e3
        self.polls: list[Poll] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.polls.append(read(self.nvml, self.handle))

    def __enter__(self) -> "NvmlPoller":
        self.polls = [read(self.nvml, self.handle)]
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="moebench-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.polls.append(read(self.nvml, self.handle))

    def timeline(self) -> tuple[list[int], list[int]]:
        """(host ns, reasons) per reading, in time order (clock.sample_masks' input)."""
        return [p.t_ns for p in self.polls], [p.reasons for p in self.polls]


def summary(polls: list[Poll]) -> dict:
    """The row's NVML columns (results/row.py, group "clock") over its readings; empty values
    (NaN, "") without any."""
    out: dict[str, Any] = {
        "gpu_power_w_median": NAN,
        "gpu_power_limit_w": NAN,
        "gpu_temp_c_max": NAN,
        "mem_clock_mhz_median": NAN,
        "nvml_polls": NAN,
        "clock_reasons": "",
    }
    if not polls:
        return out

    def agg(key: str, how) -> float:
        v = np.array([getattr(p, key) for p in polls], dtype=float)
        v = v[np.isfinite(v)]
        return float(how(v)) if len(v) else NAN

    mask = 0
    for p in polls:
        mask |= p.reasons
    out.update(
        gpu_power_w_median=agg("power_w", np.median),
        gpu_power_limit_w=agg("power_limit_w", np.max),
        gpu_temp_c_max=agg("temp_c", np.max),
        mem_clock_mhz_median=agg("mem_clock_mhz", np.median),
        nvml_polls=float(len(polls)),
        clock_reasons=",".join(reason_names(mask)),
    )
    return out
