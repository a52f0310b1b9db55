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
