"""A CPU row's timing_mode is `cpu` (docs/design.md's column table): a CPU has no events; rows
stored before the CPU's mode had its name load as `cpu` (results/migrate.py cpu_timing)."""

import pandas as pd

from moebench.results.migrate import migrate
from moebench.results.synthetic import make_row


def test_cpu_rows_stored_as_events_load_as_cpu():
    cpu = make_row("local", "torch", "experts", "none", "bf16", 16, samples_us=[10.0, 11.0], device="cpu")
    gpu = make_row("local", "torch", "experts", "none", "bf16", 16, samples_us=[10.0, 11.0])
    assert cpu["timing_mode"] == "cpu" and gpu["timing_mode"] == "events"
    old = pd.DataFrame([{**cpu, "timing_mode": "events"}, gpu])
    out = migrate(old, "test")
    assert list(out["timing_mode"]) == ["cpu", "events"]
    assert list(old["timing_mode"]) == ["events", "events"]  # the caller's frame untouched
