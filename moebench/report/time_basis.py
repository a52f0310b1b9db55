"""What a row's latency measures: GPU time, host time or CPU time (``figure_basis``), why a GPU
row's latency is host time (``host_cause``: the host paced the samples, the layer syncs the host,
or an older eager row's flags) and what would give GPU time (``GPU_TIME_ADVICE``,
``gpu_time_advice``). The summary, ``compare``'s verdicts and ``tune --results`` rank rows on
GPU time only (docs/design.md, "Timing").

The host-time causes are data-quality flags (moebench/report/flags.py ``flags_of``).
"""

from __future__ import annotations

import numpy as np

from moebench.report.flags import FLAG_TEXT, flags_of, float_of

GPU, HOST, CPU = "gpu", "host", "cpu"

# what would give GPU time where a GPU row's latency is host time, by its host_cause (docs/design.md, "Timing")
GPU_TIME_ADVICE = {
    "host": "the host paced the samples behind their hold: CUDA graphs time the GPU's work alone "
    "(`runner.timing=graph`, or `auto` where the layer can be captured)",
    "host-sync": "the forward waits on the GPU inside, which no hold helps: GPU time needs a forward without "
    "that sync (`runner.timing=auto` then holds or captures it)",
    **dict.fromkeys(
        ("host-bound", "eager-decode", "gpu-idle"),
        "the rows predate the hold before each sample: a run at today's code times the GPU "
        "(`runner.timing=auto`, the default: CUDA graphs where the layer can be captured, held events elsewhere)",
    ),
}
# what would give GPU time where a row ran on the CPU (a pipeline check)
CPU_ADVICE = "a run on a GPU times one (`runner.device=auto`, the default, where the machine has one)"


def gpu_time_advice(row) -> str:
    """What would give GPU time where a row's latency is none: GPU_TIME_ADVICE by its host_cause,
    or CPU_ADVICE for a CPU row ('' for a GPU-time row)."""
    if str(row.get("device")) == "cpu":
        return CPU_ADVICE
    return GPU_TIME_ADVICE.get(host_cause(row), "")


def host_cause(row) -> str:
    """Why a GPU row's latency is host time: `host` (timing_mode host: the host set the pace),
    a flag (`host-sync`; in rows from before each sample had its hold `host-bound`,
    `eager-decode` or `gpu-idle`), or '' (GPU time). GPU_TIME_ADVICE says what would give GPU time."""
    if str(row.get("timing_mode")) == "host":
        return "host"
    tags = flags_of(row)
    # rows from before each sample had its hold: the old signs of a host-paced figure
    older = ("host-bound", "eager-decode", "gpu-idle") if not np.isfinite(float_of(row, "host_paced_samples")) else ()
    return next((tag for tag in ("host-sync", *older) if tag in tags), "")


def figure_basis(row) -> tuple[str, str]:
    """(basis, why) of an ok row's latency: GPU time, host time (the host set the pace, the
    layer syncs it, or an older eager row that was host-bound or may have been: host_cause), or
    CPU time (a pipeline check). Verdicts, fastest names and tuned tables rest on GPU time only."""
    if str(row.get("device")) == "cpu":
        return CPU, "CPU time: a pipeline check, no performance figure"
    cause = host_cause(row)
    if cause == "host":
        note = row.get("timing_note")
        return HOST, "host time: " + (str(note) if isinstance(note, str) and note else "the host paced the samples")
    return (HOST, "host time: " + FLAG_TEXT[cause]) if cause else (GPU, "")
