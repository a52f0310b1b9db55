"""backend.simulate_tp=N (issue #49): one rank's shard of a tensor-parallel MoE layer as vLLM's
fused MoE shards it, the rules that keep it apart from expert parallelism, and vLLM's
quantization names moebench cannot run (skipped rows with the reason, not a refusal, where another
combination of the request runs)."""

from __future__ import annotations

import pytest

from moebench import cli
from moebench.config.compose import compose_config, to_combo
from moebench.config.validity import validate
from moebench.measure.layer import layer_shape

BASE = ["backend=local", "experts=torch", "reduction=experts", "overlap=none", "quant=bf16", "runner.device=cpu"]


def combo(*overrides):
    return to_combo(compose_config([*BASE, *overrides]))


def test_the_shard_splits_each_experts_width_and_keeps_every_expert():
    c = combo("model=qwen3_30b_a3b", "backend.simulate_tp=4")
    assert (c.intermediate, c.intermediate_per_rank, c.simulate_tp) == (768, 192, 4)
    shape = layer_shape(c)
    assert (shape.intermediate, shape.num_experts, shape.hidden) == (192, 128, 2048)
    assert c.columns()["intermediate_per_rank"] == 192 and "tp4" in c.label
    assert validate(c) is None
    # shared experts are split the same way (DeepSeek-V2-Lite: 2 shared of 1408)
    d = combo("model=deepseek_v2_lite", "backend.simulate_tp=2")
    assert (layer_shape(d).shared_intermediate, layer_shape(d).intermediate) == (704, 704)
    assert combo("model=qwen3_30b_a3b").key != c.key  # another workload, another combination


def test_fp8_blocks_need_the_shards_width_a_multiple_of_128():
    c = combo("model=qwen3_30b_a3b", "backend.simulate_tp=4", "quant=fp8_block")
    assert "192 (intermediate 768 / simulate_tp=4)" in validate(c)
    assert validate(combo("model=qwen3_30b_a3b", "backend.simulate_tp=2", "quant=fp8_block")) is None


def test_a_width_the_split_does_not_divide_is_skipped():
    assert "does not divide" in validate(combo("model=qwen3_30b_a3b", "backend.simulate_tp=5"))


def test_ep_backends_take_no_tp_split():
    c = to_combo(compose_config(["backend=naive", "experts=torch", "runner.world_size=2", "backend.simulate_tp=2"]))
    assert "EP replaces the experts' TP split" in validate(c)


def test_tp_with_ep_is_refused_before_any_work(capsys):
    assert cli.main(["list", "backend=local", "backend.simulate_tp=2", "backend.simulate_ep=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expert parallelism replaces the experts' TP split" in err[0]


@pytest.mark.parametrize("name", ["int8_w8a16", "mxfp4", "w4a16"])
def test_vllms_other_quantizations_are_skipped_rows_with_the_reason(name):
    c = combo("model=tiny", f"quant={name}")
    assert c.quant == name
    why = validate(c)
    assert why.startswith(f"quant={name} is ") and "no moebench experts implementation runs it" in why


def test_the_report_says_once_that_the_tp_all_reduce_is_not_timed():
    import pandas as pd

    from moebench.report.flags import run_notes

    df = pd.DataFrame({"status": ["ok", "ok", "skipped"], "simulate_tp": [4, 1, 4], "git_sha": ["a" * 40] * 3})
    notes = [n for n in run_notes(df, {}) if "TP-4" in n]
    assert len(notes) == 1 and notes[0].startswith("1 row times one rank's shard of TP-4")
    assert "not timed" in notes[0]
    assert not [n for n in run_notes(df.assign(simulate_tp=1), {}) if "TP-" in n]


# -- backend=tp: TP over runner.world_size real ranks -------------------------------------------
def tp_combo(*overrides):
    return to_combo(compose_config(["backend=tp", *BASE[1:], *overrides]))


def test_tp_ranks_split_each_experts_width_by_the_world_size():
    c = tp_combo("model=qwen3_30b_a3b", "runner.world_size=2")
    assert (c.world_size, c.simulate_tp, c.tp_size, c.intermediate_per_rank) == (2, 1, 2, 384)
    assert c.columns()["intermediate_per_rank"] == 384 and validate(c) is None
    shape = layer_shape(c)
    assert (shape.intermediate, shape.num_experts) == (384, 128)  # every expert, its shard's width
    d = tp_combo("model=deepseek_v2_lite", "runner.world_size=2")
    assert (layer_shape(d).intermediate, layer_shape(d).shared_intermediate) == (704, 704)
    assert "192 (intermediate 768 / world_size=4)" in validate(
        tp_combo("model=qwen3_30b_a3b", "runner.world_size=4", "quant=fp8_block")
    )


def test_tp_ranks_take_every_expert_on_every_rank():
    import torch

    from moebench.measure.layer import kernel_context

    c = tp_combo("model=tiny", "runner.world_size=2")
    for rank in (0, 1):
        ctx = kernel_context(c, rank, 2, None, torch.device("cpu"))
        assert (ctx.tp_size, ctx.ep_size, ctx.num_local_experts, ctx.first_local_expert) == (2, 1, 8, 0)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["runner.world_size=3"], "world_size=3 does not divide the experts' intermediate=128"),
        (["runner.world_size=1"], "backend=tp is tensor parallel: it needs runner.world_size >= 2"),
        (["runner.world_size=2", "backend.simulate_tp=2"], "backend.simulate_tp shards one rank"),
        (["runner.world_size=2", "overlap=combine"], "only overlap=none"),
        (["runner.world_size=2", "workload.routing=imbalanced_ranks"], "needs an EP split"),
    ],
)
def test_tp_ranks_rules_are_skipped_rows_with_the_reason(overrides, words):
    assert words in (validate(tp_combo("model=tiny", *overrides)) or "")


@pytest.mark.multiprocess
def test_a_world_size_that_does_not_divide_the_width_is_a_skipped_row(tmp_path, capsys):
    """A skipped row beside a combination that runs (one rank of backend=local); alone, no machine
    runs it: refused in one line, exit 2 (docs/design.md, "Validity")."""
    import pandas as pd

    from moebench.results.store import RunStore

    one = ["runner.world_size=3", "experts=torch", "model=tiny", "runner.device=cpu", "reduction=experts"]
    one += ["overlap=none", "quant=bf16", "workload.tokens_per_rank=[4]", "runner.reps=1", "runner.warmup=0"]
    rc = cli.main(["sweep", "backend=tp,local", *one, "--oversubscribe", "--out", str(tmp_path / "run")])
    df = RunStore(tmp_path / "run").load()
    assert rc == 0 and dict(zip(df.backend, df.status, strict=True)) == {"tp": "skipped", "local": "ok"}
    tp = df[df.backend == "tp"]
    assert tp.reason.str.contains("world_size=3 does not divide the experts' intermediate=128").all()
    assert (pd.to_numeric(tp.world_size) == 3).all()
    capsys.readouterr()
    assert cli.main(["sweep", "backend=tp", *one, "--oversubscribe", "--out", str(tmp_path / "tp")]) == 2
    assert "world_size=3 does not divide the experts' intermediate=128" in capsys.readouterr().err
    assert not (tmp_path / "tp").exists()


def test_the_report_says_the_tp_ranks_all_reduce_is_timed():
    import pandas as pd

    from moebench.report.flags import run_notes

    df = pd.DataFrame(
        {"status": ["ok", "ok"], "backend": ["tp", "naive"], "world_size": [2, 2], "git_sha": ["a" * 40] * 2}
    )
    (note,) = [n for n in run_notes(df, {}) if "backend=tp" in n]
    assert note.startswith("1 row runs TP-2 over real ranks") and "is timed" in note
