"""Where a sweep's time went: the rows' `harness_*_s` columns (run/worker.py's Stopwatch)
summed over one invocation, beside its wall time and the timed samples themselves — the line a
sweep prints at its end, so a user sees how much of the wait was measurement."""

from __future__ import annotations

import math
import time

from moebench.util.words import counted

# stage column -> what the line calls it, in the order a row's time is spent
STAGES = (
    ("harness_start_s", "rank starts"),
    ("harness_setup_s", "setup"),
    ("harness_check_s", "checks"),
    ("harness_inputs_s", "inputs"),
    ("harness_probe_s", "probes"),
    ("harness_timing_s", "timing"),
    ("harness_phases_s", "phases"),
    ("harness_memory_s", "memory"),
    ("harness_trace_s", "traces"),
)


class HarnessTally:
    """The stages of the rows one invocation wrote, and its wall time since construction."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.stages = {col: 0.0 for col, _ in STAGES}
        self.samples_s = 0.0
        self.rows = 0

    def add(self, rows: list[dict]) -> None:
        for r in rows:
            if not math.isfinite(r.get("harness_total_s", math.nan)):
                continue  # skipped rows, and rows a failed combination was given
            self.rows += 1
            for col in self.stages:
                v = r.get(col, math.nan)
                self.stages[col] += v if math.isfinite(v) else 0.0
            samples = r.get("samples_us")  # a list, or a NumPy array where rows were read back (SLURM)
            self.samples_s += float(sum(samples if samples is not None else ())) * 1e-6

    def line(self) -> str:
        """'moebench: 165 s wall: rank starts 20 s, setup 40 s, ... timing 60 s (timed samples
        13.4 s, 8 % of the wall) ...' or '' when no row was measured here."""
        if not self.rows:
            return ""
        wall = time.monotonic() - self.t0
        parts = [f"{name} {self.stages[col]:.1f} s" for col, name in STAGES if self.stages[col] >= 0.05]
        rest = wall - sum(self.stages.values())
        share = 100 * self.samples_s / wall if wall > 0 else math.nan
        rest_text = (
            f"the rest {rest:.1f} s (row writes, process exits)"
            if rest >= 0
            else "the stages add up to more than the wall: jobs ran side by side"
        )
        return (
            f"moebench: {wall:.1f} s wall for {counted(self.rows, 'measured row')}: {', '.join(parts)}; the timed "
            f"samples themselves {self.samples_s:.2f} s ({share:.0f} % of the wall); {rest_text}; per row: the "
            "harness_*_s columns"
        )
