"""backend=tp over two gloo ranks (issue #49): TP-2 as vLLM runs fused MoE under TP without EP.
Each rank holds every expert at intermediate / 2 and routes the same tokens; the all-reduce of
the partial outputs is timed (the combine phase), and the check against the whole layer's float32
reference passes only where the shards' sum is the whole layer's output."""

from __future__ import annotations

import pytest

from moebench.kernels.reference import TOLERANCE
from moebench.results.store import RunStore
from moebench.run.sweep import execute

QUICK = ["runner.reps=3", "runner.warmup=1", "runner.phase_reps=2", "runner.memory=false", "runner.device=cpu"]


@pytest.mark.multiprocess
def test_two_gloo_tp_ranks_sum_to_the_whole_layer(tmp_path):
    run_dir, _ = execute(
        [
            "backend=tp",
            "runner.world_size=2",
            "experts=torch",
            "overlap=none",
            "reduction=experts,finalize",
            "quant=bf16,fp8_block,fp8_tensor",
            "model=tiny",
            "model.intermediate=256",  # shards of 128: fp8_block's blocks fit one shard
            "workload.tokens_per_rank=[1,9]",
            *QUICK,
        ],
        "default",
        str(tmp_path / "tp"),
        quiet=True,
    )
    df = RunStore(run_dir).load()
    assert len(df) == 2 * 3 * 2 and set(df.status) == {"ok"}, df[["label", "status", "reason"]]
    assert (df.world_size == 2).all() and (df.intermediate == 256).all() and (df.intermediate_per_rank == 128).all()
    for q, tol in TOLERANCE.items():
        assert (df[df.quant == q].rel_err <= tol).all()
    assert df.combine_us.notna().all() and (df.combine_us > 0).all()  # the all-reduce, timed
    assert df.dispatch_us.isna().all()  # no dispatch: every rank holds every expert
    assert df.latency_us_per_rank.map(len).eq(2).all()
    assert (df.imbalance_ranks == 1).all()  # no EP split
