"""Issue #4's first criterion for its collective: moebench's multi-rank timing of an
NCCL all-gather (64 MiB per rank, 2 GPUs) against an independent timing of the same
callable, calls enqueued back to back between two events (do_bench's way;
moebench.measure.timing.back_to_back_us). benchmarks/nccl_timing.py prints the same figures
beside a hand-written barrier loop."""

from __future__ import annotations

import pytest
import torch
from _ranks import WORLD

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < WORLD, reason=f"needs {WORLD} GPUs"),
]
MIB, REPS, RUNS = 64, 50, 3


def _allgather_job(rank, device, mib, reps, runs):
    """On each rank: `runs` pairs of (moebench's samples, back-to-back mean), as plain dicts."""
    import torch.distributed as dist

    from moebench.measure import timing
    from moebench.measure.samples import rank_sync

    inp = torch.randn(mib * 2**20 // 2, device=device, dtype=torch.bfloat16)
    out = torch.empty(WORLD * inp.numel(), device=device, dtype=torch.bfloat16)
    fn = lambda: dist.all_gather_into_tensor(out, inp)
    sync = rank_sync(dist.group.WORLD, device)  # barrier, flush, align, agree: as the rows' samples start
    for _ in range(30):
        fn()
    pairs = []
    for _ in range(runs):
        s = timing.time_samples(fn, device, reps=reps, warmup=10, warmup_ms=200, **sync.kwargs())
        dist.barrier(device_ids=[rank])
        ref = timing.back_to_back_us(fn, device, reps)
        pairs.append(dict(median=s.median, p20=s.p20, p80=s.p80, ref=ref))
    return pairs


def test_allgather_timing_matches_back_to_back_events(tmp_path):
    from _ranks import run_job

    per_rank = run_job(__name__, "_allgather_job", (MIB, REPS, RUNS), tmp_path, timeout_s=300)
    for rank, pairs in enumerate(per_rank):
        medians = [p["median"] for p in pairs]
        print(
            f"all-gather rank {rank}: moebench "
            + " / ".join(f"{m:.1f}" for m in medians)
            + " µs, back to back "
            + " / ".join(f"{p['ref']:.1f}" for p in pairs)
            + " µs, p80/p20 "
            + " ".join(f"{p['p80'] / p['p20']:.3f}" for p in pairs)
        )
        for p in pairs:  # within 5 % of the independent timing; tight within a set
            assert abs(p["median"] / p["ref"] - 1) <= 0.05, (rank, pairs)
            assert p["p80"] / p["p20"] <= 1.05, (rank, pairs)
        assert max(medians) / min(medians) <= 1.03, (rank, medians)  # repeated runs agree
