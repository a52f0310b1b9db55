"""backend=tp over two NCCL ranks (issue #49; docs/models.md "Tensor parallelism"): TP-2 as vLLM
runs fused MoE under TP without EP. Each GPU holds every expert at intermediate / 2 and routes the
same tokens; the rows are ok (the all-reduced shards match the whole layer's float32 reference),
store intermediate_per_rank and time the all-reduce (the combine phase).

Needs 2 GPUs. On fewer it skips, except where the run promises the 2-GPU suite (`--require` naming
a library that runs only on 2 GPUs: deep_ep or pplx_kernels, README "Tests"): there it fails, as
the suite's other 2-GPU tests do under that promise (tests/support/_require.py)."""

from __future__ import annotations

import pytest
import torch
from _require import required

pytestmark = pytest.mark.gpu
TWO_GPU_LIBRARIES = ("deep_ep", "pplx_kernels")  # what the 2-GPU suite's --require promises


@pytest.fixture
def two_gpus(request):
    """Skip on fewer than 2 GPUs, or fail where --require promises the 2-GPU suite."""
    have = torch.cuda.device_count()
    if have >= 2:
        return
    promised = [lib for lib in required(request.config) if lib in TWO_GPU_LIBRARIES]
    why = f"needs 2 GPUs (backend=tp over NCCL), found {have}"
    if promised:
        pytest.fail(f"{why}, although --require {','.join(promised)} promises the 2-GPU suite")
    pytest.skip(why)


def test_tp_over_two_nccl_ranks_sums_to_the_whole_layer(two_gpus, tmp_path):
    from moebench.kernels.reference import TOLERANCE
    from moebench.results.store import RunStore
    from moebench.run.sweep import execute

    run_dir, _ = execute(
        [
            "backend=tp",
            "runner.world_size=2",
            "experts=torch,triton",
            "reduction=experts,finalize",
            "overlap=none",
            "quant=bf16,fp8_block",
            "model=tiny,qwen3_30b_a3b",
            "workload.tokens_per_rank=[1,128]",
            "runner.device=cuda",
            "runner.reps=10",
            "runner.warmup=3",
            "runner.warmup_ms=0",
        ],
        "default",
        str(tmp_path / "tp"),
        quiet=False,
    )
    df = RunStore(run_dir).load()
    ran = df[df.status != "skipped"]
    # tiny's shard (128 / 2 = 64) is no fp8_block width: skipped with the reason; qwen3_30b_a3b's
    # (768 / 2 = 384) is
    skipped = df[df.status == "skipped"]
    assert set(skipped.model) == {"tiny"} and set(skipped.quant) == {"fp8_block"}
    assert skipped.reason.str.contains("intermediate 128 / world_size=2").all()
    assert len(ran) == 3 * 2 * 2 * 2, df[["label", "status", "reason"]].to_string()
    assert set(ran.status) == {"ok"}, ran[ran.status != "ok"][["label", "status", "reason"]].to_string()
    for q in ("bf16", "fp8_block"):
        assert (ran[ran.quant == q].rel_err <= TOLERANCE[q]).all()
    assert (ran.world_size == 2).all() and (ran.intermediate_per_rank * 2 == ran.intermediate).all()
    assert ran.combine_us.notna().all() and (ran.combine_us > 0).all()  # the NCCL all-reduce, timed
    assert ran.latency_us_per_rank.map(len).eq(2).all()
    print(ran[["label", "tokens_per_rank", "latency_us_median", "combine_us", "experts_us"]].to_string())
