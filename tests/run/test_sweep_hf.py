"""A sweep of a layer read from a Hugging Face config.json (model=hf:..., issue #49) on CPU: the
rows carry the config's own name, sizes and digest, and fp8_w8a8 is stored as moebench's value."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from moebench import cli
from moebench.results.store import RunStore

CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "tiny_qwen3_moe" / "config.json"
QUICK = ["runner.reps=3", "runner.warmup=1", "runner.phase_reps=2", "runner.warmup_ms=0"]


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.mark.multiprocess
def test_a_sweep_of_an_hf_config_stores_its_name_sizes_and_digest(tmp_path):
    out = tmp_path / "run"
    argv = ["sweep", f"model=hf:{CONFIG.parent}", "backend=local", "experts=torch", "reduction=experts,finalize"]
    argv += ["overlap=none", "quant=bf16,fp8_w8a8", "workload.tokens_per_rank=[4,8]", *QUICK, "--out", str(out)]
    assert cli.main(argv) == 0
    df = RunStore(out).load()
    assert len(df) == 8 and set(df["status"]) == {"ok"}
    digest = hashlib.sha256(CONFIG.read_bytes()).hexdigest()
    assert set(df["model"]) == {"tiny-qwen3-moe"} and set(df["model_config_sha256"]) == {digest}
    sizes = df[["hidden", "intermediate", "num_experts", "topk", "num_shared_experts"]].drop_duplicates()
    assert sizes.values.tolist() == [[256, 128, 16, 4, 0]]
    assert set(df["quant"]) == {"bf16", "fp8_tensor"}


@pytest.mark.multiprocess
def test_a_tensor_parallel_shard_of_an_hf_config_stores_the_models_width_and_the_ranks(tmp_path):
    out = tmp_path / "run"
    argv = ["sweep", f"model=hf:{CONFIG.parent}", "backend=local", "experts=torch", "reduction=experts"]
    argv += ["overlap=none", "quant=bf16", "backend.simulate_tp=4", "workload.tokens_per_rank=[4,8]", *QUICK]
    assert cli.main([*argv, "--out", str(out)]) == 0
    df = RunStore(out).load()
    assert len(df) == 2 and set(df["status"]) == {"ok"}  # the shard agrees with its own reference
    assert set(df["intermediate"]) == {128} and set(df["intermediate_per_rank"]) == {32}
    assert set(df["simulate_tp"]) == {4} and all(lbl.endswith("/tp4") for lbl in df["label"])
    # one rank's shard does a quarter of the experts' FLOPs of the whole layer
    whole = tmp_path / "whole"
    unsharded = [a for a in argv if not a.startswith("backend.simulate_tp=")]
    assert cli.main([*unsharded, "--out", str(whole)]) == 0
    full = RunStore(whole).load().set_index("tokens_per_rank")["expert_flops"]
    shard = df.set_index("tokens_per_rank")["expert_flops"]
    assert (shard * 4 == full).all()
