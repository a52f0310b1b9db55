"""Phase ranges: NVTX (for nsys), torch record_function, and per-phase timing.

The harness installs `make_phase_recorder(...)` on a `MoEKernel` (`kernel.phases =
rec`); the kernel then calls `with rec("experts"): ...` around each phase. Every
range is emitted with the same name to NVTX (for nsys) and to
`torch.profiler.record_function` (for torch traces), nested under
`combo_range(key)` and, per timed forward, `sample_range(i)` (or, for the ablation
samples of a trace, `ablation_range("noshared" | "shared", i)`). With trace=nsys,
`capture_range(key)` marks the timed work of each row for nsys's capture.

NVTX ranges go to the default domain, named `moebench/<name>` (`moebench/experts`,
`moebench/combo/<key>`, the capture range `moebench/timed`), through the API the
nsys in use records (`nvtx_emitter()`):
- with CUDA, `torch.cuda.nvtx` (range_push / range_pop): the Nsight Systems 2024.2
  target records these ranges;
- without CUDA, the `nvtx` package (push_range / pop_range, default domain). That
  nsys records none of its ranges (only its domain's creation, on the GPU machine and
  on a CPU alike), so there a capture range never opens; CPU ranks have no kernels
  to trace anyway.
MOEBENCH_NVTX_API=torch|nvtx|none forces one. Without any, no NVTX range is emitted
(one warning).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Optional

import torch

from moebench.traces.model import ABLATION_PREFIXES, CAPTURE_RANGE, COMBO_PREFIX, SAMPLE_PREFIX
from moebench.traces.nsys import NVTX_PREFIX

log = logging.getLogger(__name__)

API_TORCH = "torch.cuda.nvtx"
API_PACKAGE = "nvtx package"


class NvtxEmitter:
    """Pushes and pops default-domain NVTX ranges named `moebench/<name>` through one API."""

    def __init__(self, api: str, push, pop):
        self.api = api
        self._push, self._pop = push, pop
        self._names: dict = {}

    def push(self, name: str) -> None:
        full = self._names.get(name)
        if full is None:
            full = self._names[name] = NVTX_PREFIX + name
        self._push(full)

    def pop(self) -> None:
        self._pop()


_EMITTER: Optional[NvtxEmitter] = None  # resolved once per process
_RESOLVED = False


def _torch_emitter() -> Optional[NvtxEmitter]:
    if not (torch.cuda.is_available() and hasattr(torch._C, "_nvtx")):
        return None
    nv = torch.cuda.nvtx
    return NvtxEmitter(API_TORCH, nv.range_push, nv.range_pop)


def _package_emitter() -> Optional[NvtxEmitter]:
    try:
        import nvtx  # a core dependency; absent in some installs
    except ImportError:
        return None
    return NvtxEmitter(API_PACKAGE, lambda m: nvtx.push_range(message=m), nvtx.pop_range)


def nvtx_emitter() -> Optional[NvtxEmitter]:
    """The process's NVTX emitter (module docstring), or None when no API is there (one warning)."""
    global _EMITTER, _RESOLVED
    if not _RESOLVED:
        _RESOLVED = True
        forced = os.environ.get("MOEBENCH_NVTX_API", "").strip().lower()
        if forced not in ("", "torch", "nvtx", "none"):
            raise ValueError(f"MOEBENCH_NVTX_API={forced!r}; valid: torch, nvtx, none")
        if forced == "torch":
            _EMITTER = _torch_emitter()
        elif forced == "nvtx":
            _EMITTER = _package_emitter()
        elif forced == "":
            _EMITTER = _torch_emitter() or _package_emitter()
        if _EMITTER is None and forced != "none":
            log.warning(
                "no NVTX API: no CUDA build of torch with a GPU, and the nvtx package is not installed "
                "(pip install nvtx): no NVTX ranges"
            )
    return _EMITTER


def nvtx_api() -> Optional[str]:
    """Which API emits moebench's NVTX ranges in this process: "torch.cuda.nvtx", "nvtx package" or None."""
    e = nvtx_emitter()
    return e.api if e is not None else None


class _Range:
    """Context manager for one phase range (a class: cheaper than a generator)."""

    __slots__ = ("rec", "name", "rf", "mark")

    def __init__(self, rec: "PhaseRecorder", name: str):
        self.rec = rec
        self.name = name
        self.rf = None
        self.mark = None

    def __enter__(self):
        rec = self.rec
        if rec._nvtx is not None:
            rec._nvtx.push(self.name)
        if rec.record_function:
            self.rf = torch.profiler.record_function(self.name)
            self.rf.__enter__()
        # timing innermost, so it measures the phase and not the annotations
        if rec._cuda_timing:
            self.mark = torch.cuda.Event(enable_timing=True)
            self.mark.record()
        elif rec.timing:
            self.mark = time.perf_counter_ns()
        return self

    def __exit__(self, *exc):
        rec = self.rec
        if rec._cuda_timing:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            rec.events.append((self.name, self.mark, end))
        elif rec.timing:
            rec.events.append((self.name, self.mark, time.perf_counter_ns()))
        if self.rf is not None:
            self.rf.__exit__(*exc)
        if rec._nvtx is not None:
            rec._nvtx.pop()
        return False


class PhaseRecorder:
    """`rec(name)` -> context manager emitting NVTX + record_function + timing for one phase.

    `rec.events` holds (name, start, end): CUDA events on a CUDA device, else
    `time.perf_counter_ns()` integers. `durations_us()` sums them per phase (µs).
    """

    def __init__(self, nvtx: bool, record_function: bool, cuda_events: bool, device=None):
        self.record_function = bool(record_function)
        self.timing = bool(cuda_events)
        dev = torch.device(device) if device is not None else torch.device("cpu")
        self.device = dev
        self._cuda_timing = self.timing and dev.type == "cuda"
        self._nvtx = nvtx_emitter() if nvtx else None
        self.events: list = []

    def __call__(self, name: str) -> _Range:
        return _Range(self, name)

    def reset(self) -> None:
        """Forget the recorded events (call before each timed sample)."""
        self.events.clear()

    def durations_us(self) -> dict:
        """Phase name -> summed duration (µs) of the events since the last reset.

        On CUDA this synchronizes the device first (events must have completed).
        """
        out: dict = {}
        if self._cuda_timing:
            if self.events:
                torch.cuda.synchronize(self.device)
            for name, start, end in self.events:
                out[name] = out.get(name, 0.0) + start.elapsed_time(end) * 1e3  # ms -> µs
        else:
            for name, t0, t1 in self.events:
                out[name] = out.get(name, 0.0) + (t1 - t0) / 1e3  # ns -> µs
        return out

    def counts(self) -> dict:
        """Phase name -> number of ranges recorded since the last reset."""
        out: dict = {}
        for name, _, _ in self.events:
            out[name] = out.get(name, 0) + 1
        return out


def make_phase_recorder(nvtx: bool, record_function: bool, cuda_events: bool, device=None):
    """The recorder the harness installs on a kernel; `NULL_PHASES` (free) when everything is off.

    nvtx: NVTX ranges `moebench/<phase>` (`nvtx_emitter()`);
    record_function: torch.profiler.record_function ranges (for torch traces);
    cuda_events: per-phase timing (CUDA events on a CUDA `device`, host clock otherwise).
    """
    if not (nvtx or record_function or cuda_events):
        from moebench.kernels.interfaces import NULL_PHASES

        return NULL_PHASES
    return PhaseRecorder(nvtx, record_function, cuda_events, device)


@contextlib.contextmanager
def named_range(name: str, nvtx: bool = True, record_function: bool = True):
    """NVTX range `moebench/<name>` + record_function range `name`, no timing."""
    em = nvtx_emitter() if nvtx else None
    if em is not None:
        em.push(name)
    try:
        if record_function:
            with torch.profiler.record_function(name):
                yield
        else:
            yield
    finally:
        if em is not None:
            em.pop()


def combo_range(key: str, nvtx: bool = True, record_function: bool = True):
    """The outer `combo/<key>` range around everything measured for one combination."""
    return named_range(f"{COMBO_PREFIX}{key}", nvtx, record_function)


@contextlib.contextmanager
def capture_range(key: str):
    """trace=nsys: the NVTX range `moebench/timed` (CAPTURE_RANGE) around the timed work of
    one row, `moebench/combo/<key>` inside it. NVTX only, as nsys sees nothing else: each one
    is a capture of the nsys the rank runs under (traces/nsys.py `nsys_rank_prefix`), and the
    combo range opened inside it lands in that report (the outer one opened before the capture
    does not). Yields the API that pushed it (`nvtx_api()`), or None when there is none (then
    nsys captures nothing)."""
    em = nvtx_emitter()
    if em is None:
        yield None
        return
    with named_range(CAPTURE_RANGE, record_function=False), combo_range(key, record_function=False):
        yield em.api


def sample_range(i: int, nvtx: bool = True, record_function: bool = True):
    """The `sample/<i>` range around one timed forward (the unit of per-sample trace metrics)."""
    return named_range(f"{SAMPLE_PREFIX}{i}", nvtx, record_function)


def ablation_range(kind: str, i: int, nvtx: bool = True, record_function: bool = True):
    """The range around one ablation sample: `sample_noshared/<i>` (kind "noshared": the layer
    without its shared experts) or `sample_shared/<i>` (kind "shared": the shared experts alone)."""
    if kind not in ABLATION_PREFIXES:
        raise ValueError(f"ablation kind {kind!r}; valid: {', '.join(ABLATION_PREFIXES)}")
    return named_range(f"{ABLATION_PREFIXES[kind]}{i}", nvtx, record_function)


def phase_recorder_for(trace_mode: str, device, cuda_events: bool = True) -> Optional[object]:
    """Recorder for a `trace` config value: none | nvtx | torch | nsys (cuda_events: per-phase timing)."""
    if trace_mode not in ("none", "nvtx", "torch", "nsys"):
        raise ValueError(f"trace={trace_mode!r}; valid: none, nvtx, torch, nsys")
    return make_phase_recorder(
        nvtx=trace_mode in ("nvtx", "nsys"),
        record_function=trace_mode == "torch",
        cuda_events=cuda_events,
        device=device,
    )
