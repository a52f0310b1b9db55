"""The SM clock each GPU sample ran at, read in the stream as nvbench reads it, and which samples
were throttled (docs/design.md, "Timing": the clock of each sample).

Method (nvbench's `timestamps_kernel.cu` / `gpu_frequency.cxx`): a tiny kernel reads
`%globaltimer` (ns, one timer for the whole GPU) and `%clock64` (SM cycles) right before a
sample's start event and again right after its end event, in the same stream; the cycles over
the nanoseconds between the two reads are the clock the sample ran at. `%clock64` is a counter
per SM, never comparable across SMs, so nvbench launches one single-thread block per SM and
keeps the reading of SM 0. Here every block writes its reading into its SM's slot (`%smid`) and
a sample's clock is the median over the SMs that read both before and after it: the same
counter always meets itself, and no SM has to be hit by the scheduler.

A sample is **throttled** (`throttled_samples`) where its clock is below THROTTLE_CLOCK_FRACTION
of the row's median clock, or where NVML reported a thermal, power or sync-boost clocks-event
reason (THROTTLE_MASK) while it ran (measure/nvml.py). nvbench flags a clock below 0.75 × the
device's default clock; at the power cap a lent H200 moves between 1515 and 1965 MHz from
sample to sample (docs/findings/timing.md), above that bound and yet 23 % apart, so the bound
is relative to the row's own median.

The pure functions here take arrays (tests run them on the CPU); `ClockProbe` is the GPU part.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np
import torch

MAX_SLOTS = 512  # samples a pass may stamp (reps x callables): 8 MiB of stamps on a 132-SM GPU
THROTTLE_CLOCK_FRACTION = 0.9  # a sample below this share of the row's median clock is throttled
# NVML's clocks-event reasons (nvml.h nvmlClocksEventReason*): the bits that slow the SM clock
NVML_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock",
}
# thermal, power and sync-boost: a sample during which one was active is throttled
THROTTLE_MASK = 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80


def reason_names(mask: int) -> list[str]:
    """The names of the NVML reasons set in `mask` (gpu_idle left out: it says nothing of a sample)."""
    return [name for bit, name in NVML_REASONS.items() if int(mask) & bit and bit != 0x1]


def clock_mhz(start_ns, start_cycles, end_ns, end_cycles) -> np.ndarray:
    """Each sample's SM clock (MHz) from the stamps before and after it: arrays [samples, SMs]
    of `%globaltimer` ns and `%clock64` cycles (0: that SM did not read). Per SM, cycles over
    ns; the sample's clock is the median over the SMs that read both times; NaN where none did."""
    # differences in int64 first: globaltimer counts ns since the epoch (~1.8e18), where a
    # float64 is 256 ns coarse
    s_ns, s_cy, e_ns, e_cy = (np.asarray(a, dtype=np.int64) for a in (start_ns, start_cycles, end_ns, end_cycles))
    ok = (s_ns > 0) & (e_ns > s_ns) & (s_cy > 0) & (e_cy > s_cy)
    d_ns, d_cy = (e_ns - s_ns).astype(np.float64), (e_cy - s_cy).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mhz = np.where(ok, d_cy / d_ns * 1e3, np.nan)  # cycles per ns = GHz
    out = np.full(mhz.shape[0], np.nan)
    has = ok.any(axis=1)
    out[has] = np.nanmedian(mhz[has], axis=1)
    return out


def sample_masks(spans_ns: Sequence[tuple[int, int]], poll_ns: Sequence[int], poll_masks: Sequence[int]) -> np.ndarray:
    """Each sample's NVML reasons: the OR of the mask in effect when it started (the last poll
    at or before its start) and of every poll inside it. `spans_ns`: (start, end) per sample on
    the host's clock (time.time_ns); polls sorted by time. 0 where no poll covers a sample."""
    t = np.asarray(poll_ns, dtype=np.int64)
    m = np.asarray(poll_masks, dtype=np.int64)
    out = np.zeros(len(spans_ns), dtype=np.int64)
    for i, (a, b) in enumerate(spans_ns):
        lo = max(int(np.searchsorted(t, a, side="right")) - 1, 0)
        hi = int(np.searchsorted(t, b, side="right"))
        if hi > lo:
            out[i] = np.bitwise_or.reduce(m[lo:hi])
    return out


def throttled(clocks_mhz, masks=None, fraction: float = THROTTLE_CLOCK_FRACTION) -> np.ndarray:
    """Which samples were throttled (bool per sample): a clock below `fraction` of the samples'
    median clock, or a THROTTLE_MASK reason in `masks` (NVML's, one per sample; None: not polled).
    A NaN clock is never called slow."""
    c = np.asarray(clocks_mhz, dtype=np.float64)
    slow = np.zeros(c.shape, dtype=bool)
    if np.isfinite(c).any():
        with np.errstate(invalid="ignore"):
            slow = c < fraction * np.nanmedian(c)
    if masks is not None and len(masks) == len(c):
        slow |= (np.asarray(masks, dtype=np.int64) & THROTTLE_MASK) != 0
    return slow


_KERNEL = None


def _stamp_kernel():
    """The Triton kernel: one single-warp program per SM writes (globaltimer, clock64) into
    its SM's slot. Built on first use (Triton is imported only on a GPU)."""
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit(do_not_specialize=["base"])
        def stamp(out_ptr, base, WIDTH: tl.constexpr):
            smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
            gt = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
            cy = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
            at = base + 2 * smid
            tl.store(out_ptr + at, gt, mask=smid < WIDTH)
            tl.store(out_ptr + at + 1, cy, mask=smid < WIDTH)

        _KERNEL = stamp
    return _KERNEL


class ClockProbe:
    """Stamps around each GPU sample (timing.time_interleaved): `begin(pass_slots)` before a pass,
    `stamp(slot, end)` before a sample's start event and after its end event, `read()` after
    the pass has synced: per slot its clock (MHz) and its span on the host's clock.

    Host cost: one Triton launch per stamp (`host_us`, measured once): the start stamp is
    enqueued between the hold and the start event, so the hold grows by it
    (timing.time_interleaved); the end stamp follows the end event, outside the sample."""

    def __init__(self, device: torch.device, max_slots: int = 0):
        self.device = device
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        # %smid may exceed the SM count (ids need not be dense): room for twice as many
        self.width = 1 << (2 * self.num_sms - 1).bit_length()
        # allocated once, with the harness's own buffers (measure/samples.py rank_sync), never
        # inside a row's measured memory region or under runner.memory_budget's cap
        self.max_slots = max_slots or MAX_SLOTS
        self.buf = torch.zeros((self.max_slots + 1) * 2 * self.width * 2, dtype=torch.int64, device=device)
        self.slots, self._skipped = 0, 0
        self._kernel = _stamp_kernel()
        self._host_us: Optional[float] = None

    def begin(self, slots: int) -> None:
        """Zeroes the slots of a pass of `slots` samples (+1: the host-clock alignment's stamp).
        A pass longer than max_slots is not stamped (its clocks read NaN)."""
        self.slots = slots if slots <= self.max_slots else 0
        self._skipped = slots - self.slots
        self.buf[: (self.slots + 1) * 2 * self.width * 2].zero_()

    def stamp(self, slot: int, end: bool) -> None:
        if self._skipped and slot < self._skipped:  # a pass past max_slots: not stamped
            return
        base = (2 * slot + int(end)) * self.width * 2
        self._kernel[(self.num_sms,)](self.buf, base, WIDTH=self.width, num_warps=1)

    @property
    def host_us(self) -> float:
        """The host's time to enqueue one stamp (µs, median of 20, measured once; compiles first)."""
        if self._host_us is None:
            self.begin(1)
            self.stamp(0, False)
            torch.cuda.synchronize(self.device)
            out = []
            for _ in range(20):
                t0 = time.perf_counter()
                self.stamp(0, False)
                out.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize(self.device)
            self._host_us = float(np.median(out))
        return self._host_us

    def read(self) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """(clock MHz per slot, (start, end) per slot on time.time_ns's clock). Syncs the device;
        the offset between globaltimer and the host's clock is read from one more stamp, taken
        between two host readings (a few tens of µs of error, far under NVML's poll period)."""
        torch.cuda.synchronize(self.device)
        if self._skipped:  # nothing was stamped: no reference stamp, no copy
            return np.full(self._skipped, np.nan), [(0, 0)] * self._skipped
        t0 = time.time_ns()
        self.stamp(self.slots, False)
        torch.cuda.synchronize(self.device)
        t1 = time.time_ns()
        st = self.buf[: (self.slots + 1) * 2 * self.width * 2].view(self.slots + 1, 2, self.width, 2).cpu().numpy()
        ref = st[self.slots, 0, :, 0]
        offset = (t0 + t1) // 2 - int(ref[ref > 0].max()) if (ref > 0).any() else 0
        st = st[: self.slots]
        mhz = clock_mhz(st[:, 0, :, 0], st[:, 0, :, 1], st[:, 1, :, 0], st[:, 1, :, 1])
        spans = []
        for s in st:
            a, b = s[0, :, 0], s[1, :, 0]
            a, b = a[a > 0], b[b > 0]
            spans.append((int(a.min()) + offset, int(b.max()) + offset) if len(a) and len(b) else (0, 0))
        return mhz, spans
