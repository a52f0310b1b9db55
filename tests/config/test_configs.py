"""Every option of every group composes; typos fail at compose time; the fast
composer agrees with Hydra's compose()."""

from __future__ import annotations

import pytest

from moebench.config import compose
from moebench.config.schema import GROUPS


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes(group):
    options = compose.group_options(group)
    assert options, f"conf/{group} is empty"
    for opt in options:
        cfg = compose.compose_config([f"{group}={opt}"])
        assert set(cfg) >= set(GROUPS)
        if "name" in cfg[group]:
            assert cfg[group]["name"] == opt, f"conf/{group}/{opt}.yaml must say name: {opt}"


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        # (a card read from a public config, `hf_config:`, is composed by compose_config alone:
        # tests/config/test_hf.py checks those against the mapping)
        ["backend=naive", "experts=torch", "model=tiny", "quant=fp8_block", "workload.tokens_per_rank=[1,2]"],
        ["backend=local", "backend.simulate_ep=8", "runner.reps=3", "trace=torch"],
        [
            "backend=deepep_ht",
            "backend.num_sms=16",
            "experts=triton",
            "experts.row_layout=gathered",
            "runner.memory_budget=16GiB",
        ],
    ],
)
def test_fast_compose_matches_hydra(overrides):
    assert compose.compose_config(overrides) == compose.compose_with_hydra(overrides)


@pytest.mark.parametrize(
    "bad, words",
    [
        (["backend=nccl_magic"], ["unknown backend", "allgather_rs", "local"]),
        (["model.hiden=3"], ["unknown config key", "model.hiden"]),
        (["model.hidden=abc"], ["abc"]),
        (["nosuchgroup=1"], ["unknown config key"]),
        (["runner.world_size=two"], ["two"]),
        (["backend.num_sm=16"], ["unknown config key", "backend.num_sm", "--knobs"]),
        (["experts.fp8_layout=gathered"], ["experts.row_layout"]),
        (["+extra.pplx_mode=internode"], ["backend.pplx_mode"]),
        (["+extra.sleep_s=1"], ["unsupported override", "knobs"]),
    ],
)
def test_bad_overrides_are_clear(bad, words):
    with pytest.raises(ValueError) as e:
        compose.compose_config(bad)
    for w in words:
        assert w in str(e.value)


def test_model_shapes_are_real():
    v3 = compose.compose_config(["model=deepseek_v3"])["model"]
    assert (v3["hidden"], v3["intermediate"], v3["num_experts"], v3["topk"]) == (7168, 2048, 256, 8)
    q = compose.compose_config(["model=qwen3_30b_a3b"])["model"]
    assert (q["hidden"], q["intermediate"], q["num_experts"], q["topk"], q["num_shared_experts"]) == (
        2048,
        768,
        128,
        8,
        0,
    )


@pytest.mark.parametrize(
    "override, words",
    [
        (
            "workload.tokens_per_rank=abc",
            "workload.tokens_per_rank=abc: expects a list, e.g. workload.tokens_per_rank=[16,256]",
        ),
        ("runner.reps=abc", "runner.reps=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    ],
)
def test_a_config_librarys_multi_line_error_is_one_line_naming_the_override(override, words, capsys):
    from moebench import cli

    assert cli.main(["list", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
