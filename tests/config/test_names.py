"""The names engineers type (moebench/config/names.py, issue #49): vLLM's fp8_w8a8 stored as
moebench's own quant value, and 'did you mean' for a misspelled group value, group or key."""

from __future__ import annotations

import pytest

from moebench import cli
from moebench.config import compose


def combo(*overrides):
    cfg = compose.compose_config(["backend=local", "experts=triton", "model=deepseek_v3", *overrides])
    compose.check_values(cfg)
    return compose.to_combo(cfg, device="cpu")


def test_fp8_w8a8_is_fp8_tensor_and_with_128_blocks_fp8_block():
    assert combo("quant=fp8_w8a8").quant == "fp8_tensor"
    assert combo("quant=fp8_w8a8").key == combo("quant=fp8_tensor").key
    blocked = combo("quant=fp8_w8a8", "quant.block_shape=[128,128]")
    assert blocked.quant == "fp8_block" and blocked.key == combo("quant=fp8_block").key


def test_fp8_w8a8_is_listed_under_moebenchs_name(capsys):
    assert (
        cli.main(["list", "backend=local", "experts=triton", "quant=fp8_w8a8", "overlap=none", "reduction=experts"])
        == 0
    )
    out = capsys.readouterr().out
    assert "/fp8_tensor/" in out and "fp8_w8a8" not in out


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["quant=fp8_w8a8", "quant.block_shape=[64,64]"], "moebench's fp8 blocks are [128, 128]"),
        (["quant=bf16", "quant.block_shape=[128,128]"], "applies to quant=fp8_w8a8"),
    ],
)
def test_block_shapes_moebench_lacks_are_one_line(overrides, words, capsys):
    assert cli.main(["list", "backend=local", "experts=triton", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize(
    "override, words",
    [
        ("experts=tritn", "did you mean triton"),
        ("backend=locl", "did you mean local"),
        ("quant=fp8_blok", "did you mean fp8_block"),
        ("expert=triton", "did you mean experts"),
        ("experts.row_layot=gathered", "did you mean experts.row_layout"),
        ("runner.rep=3", "did you mean runner.reps"),
    ],
)
def test_a_misspelled_value_group_or_key_says_did_you_mean(override, words, capsys):
    assert cli.main(["list", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_a_name_far_from_any_valid_one_lists_the_valid_ones(capsys):
    assert cli.main(["list", "experts=zzzzzz"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "valid options: deepgemm" in err
