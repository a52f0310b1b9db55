"""Host-paced samples are counted wherever a GPU figure is made (docs/design.md, "Timing"): the
layer's timed samples, the ablation's, the phase forwards' and the trace's; the row keeps each
count. The GPU is stood in for by events whose `query()` says whether the GPU had passed them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from moebench.measure import samples as measure
from moebench.measure import timing
from moebench.results import rows
from moebench.results.rank_result import RankResult
from moebench.run import plan

CUDA = torch.device("cuda", 0)


class _Events:
    """torch.cuda.Event stand-ins: the n-th event recorded reports `passed[n]` from query()."""

    def __init__(self, passed: list[bool]):
        self.passed, self.made = list(passed), 0

    def __call__(self, *a, **k):
        outer = self

        class Event:
            def __init__(self):
                self.i = outer.made
                outer.made += 1

            def record(self):
                pass

            def query(self):
                return outer.passed[self.i]

        return Event()


def test_pace_count_counts_what_the_gpu_started_before_the_host_had_enqueued(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Events([False, True, True, False]))
    count = measure.PaceCount(CUDA)
    seen = []
    for _ in range(4):
        count.started()
        seen.append(count.enqueued())
    assert seen == [False, True, True, False] and count.taken == 4 and count.host_paced == 2.0
    cpu = measure.PaceCount(torch.device("cpu"))  # no GPU: nothing to ask, the samples still counted
    cpu.started()
    assert cpu.enqueued() is False and cpu.taken == 1 and np.isnan(cpu.host_paced)


def test_phase_samples_count_the_phase_forwards_the_host_paced(monkeypatch):
    from moebench.traces.nvtx import make_phase_recorder

    monkeypatch.setattr(torch.cuda, "Event", _Events([True, False, True]))
    kernel = SimpleNamespace(phases=None)
    rec = make_phase_recorder(nvtx=False, record_function=False, cuda_events=True, device="cpu")

    def fn():
        with rec("experts"):
            pass

    out = measure.phase_samples(kernel, fn, rec, 3, measure.RankSync(None, None, None, None, CUDA))
    assert "experts" in out.us and out.taken == 3 and out.host_paced == 2.0


def _shared_layer():
    from moebench.config import compose
    from moebench.measure.layer import build_layer

    cfg = compose.compose_config(
        ["backend=local", "experts=torch", "model=tiny", "reduction=finalize", "quant=bf16", "overlap=dispatch"]
    )
    return build_layer(compose.to_combo(cfg), 0, 1, None, torch.device("cpu")).kernel


def test_the_ablations_host_paced_counts_reach_the_row(monkeypatch):
    """time_layer keeps each callable's count (the layer, without its shared experts, the shared
    experts alone), and the row takes the max over ranks of each."""
    kernel = _shared_layer()
    per_rank = [(5, 3, 2), (1, 4, 0)]
    calls = iter(per_rank)

    def interleaved(fns, *a, **k):
        counts = next(calls)
        assert len(fns) == 3  # the layer, the layer without shared experts, the shared experts alone
        return [timing.Samples([100.0 + j] * 30, n) for j, n in enumerate(counts)]

    monkeypatch.setattr(timing, "time_interleaved", interleaved)
    combo = SimpleNamespace(phase_reps=0, reps=30, warmup=1, warmup_ms=0.0)
    sync = measure.RankSync(None, None, None, None, CUDA)
    results = []
    for r in range(2):
        timed = measure.time_layer(kernel, (None, None, None), combo, sync, CUDA, rec=None, graph=False)
        assert (timed.host_paced, timed.host_paced_no_shared, timed.host_paced_shared) == per_rank[r]
        fields = timed.paced_fields(cuda=True)
        assert np.isnan(fields["num_phase_samples"]) and np.isnan(fields["host_paced_phases"])  # no phases
        results.append(
            RankResult(
                rank=r,
                timing_mode="events",
                samples_us=timed.samples_us,
                no_shared_samples_us=timed.no_shared_samples_us,
                shared_samples_us=timed.shared_samples_us,
                **fields,
            )
        )
    c = plan.plan(["backend=local", "experts=torch", "model=tiny", "overlap=dispatch"], None)[0][0]
    row = rows.measured_row(c, 16, results, {})
    assert (row["host_paced_samples"], row["host_paced_no_shared"], row["host_paced_shared"]) == (5.0, 4.0, 2.0)
    # off a GPU no count is claimed: NaN, not 0
    assert all(np.isnan(v) for k, v in timed.paced_fields(cuda=False).items() if k.startswith("host_paced"))
