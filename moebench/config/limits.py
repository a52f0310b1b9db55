"""The measurement's thresholds, which the timing loop acts on and the reports flag by
(docs/design.md, "Timing" and "Data quality")."""

NOISY_SPREAD = 1.10  # p80/p20 above this is reported as a wide spread
HOST_SYNCS_US = 15_000.0  # a callable whose enqueue outlasts a 20 ms busy GPU waits on it
# a row whose samples the host paced more often than this is host time (timing_mode "host"):
# beyond a fifth of the samples the p20-p80 interval a verdict reads may hold host gaps
HOST_PACED_MAX = 0.2
# the float32 reference keeps every expert's dequantized weights only while they fit in this
# (measure/workload.py reference_expert_fn; DeepSeek-V3's need 45 GB): above it, one at a time
REFERENCE_KEEP_BYTES = 2 * 2**30
