"""`moebench list` tells a rule of the plan (no machine lifts it) from what this machine lacks
(docs/design.md, "Validity"): `--json` gives each skip reason its kind, `reason_kind` and
`skipped_token_kinds` ('rule' | 'machine'), and `--verbose` marks a skipped token count that
breaks a rule `[rule]`."""

from __future__ import annotations

import json

import pytest

from moebench import cli
from moebench.kernels import registry
from moebench.kernels.entry import Rule

BASE = ["experts=torch", "reduction=experts", "overlap=none", "quant=bf16", "model=tiny", "runner.device=cpu"]
# 16 tokens: timing=graph without CUDA (the machine's); 32 runs; 128: over the cap below (a rule)
TOKENS = ["runner.timing=graph", "runner.graph_max_tokens=16", "workload.tokens_per_rank=[16,32,128]"]


@pytest.fixture
def capped(monkeypatch):
    """backend=local with a cap of 64 tokens per rank, a Rule as deepep_ll's and pplx's are."""
    local = registry.entry("backend", "local")
    monkeypatch.setattr(
        local, "token_limit", classmethod(lambda cls, combo, t: Rule(f"cap 64: {t}") if t > 64 else None)
    )


def _records(capsys, *args: str) -> dict:
    assert cli.main(["list", "--json", *args]) == 0
    return {r["backend"]: r for r in json.loads(capsys.readouterr().out)}


def test_list_json_gives_each_skip_reason_its_kind(capped, capsys):
    got = _records(capsys, "backend=local,local_batched", *BASE, *TOKENS)
    local, batched = got["local"], got["local_batched"]
    assert local["status"] == "valid" and local["reason"] is None and local["reason_kind"] is None
    assert list(local["skipped_tokens"]) == ["16", "128"] and "needs CUDA" in local["skipped_tokens"]["16"]
    assert local["skipped_token_kinds"] == {"16": "machine", "128": "rule"}
    assert "layouts differ" in batched["reason"] and batched["reason_kind"] == "rule"
    assert batched["skipped_tokens"] == batched["skipped_token_kinds"] == {}
    pplx = _records(capsys, "backend=pplx", "experts=torch_batched", "reduction=finalize", "quant=bf16", "model=tiny")
    assert "pplx_kernels" in pplx["pplx"]["reason"] and pplx["pplx"]["reason_kind"] == "machine"


def test_list_verbose_marks_the_token_counts_a_rule_skips(capped, capsys):
    assert cli.main(["list", "--verbose", "backend=local", *BASE, *TOKENS]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("valid ")]
    assert "(skipped tokens: 16: timing=graph: " in line and "; 128 [rule]: cap 64: 128)" in line
    assert cli.main(["list", "backend=local", *BASE, *TOKENS]) == 0  # the default line as it was
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("valid ")]
    assert "[rule]" not in line and "; 128: cap 64: 128)" in line


PPLX = ["backend=pplx", "experts=torch_batched", "reduction=finalize", "quant=bf16", "model=tiny"]


def test_list_json_says_whether_a_rule_rules_out_each_combination(capped, capsys):
    """`ruled_out`: no machine runs any of the combination (a rule of the plan skips it, or each of
    its token counts), told too where this machine skips it whole and lists no token reason."""
    got = _records(capsys, "backend=local,local_batched", *BASE, *TOKENS)
    assert got["local"]["ruled_out"] is False  # 32 runs
    assert got["local_batched"]["ruled_out"] is True and got["local_batched"]["reason_kind"] == "rule"
    over = _records(capsys, "backend=local", *BASE, "workload.tokens_per_rank=[128,256]")["local"]
    assert over["status"] == "valid" and over["ruled_out"] is True  # each token count over the cap
    for tokens, ruled_out in (("[1024]", True), ("[16,1024]", False)):
        pplx = _records(capsys, *PPLX, f"workload.tokens_per_rank={tokens}")["pplx"]
        assert pplx["reason_kind"] == "machine" and pplx["skipped_tokens"] == {}  # pplx_kernels lacking
        assert pplx["ruled_out"] is ruled_out, tokens  # 1024 over pplx's cap of 512


def test_list_verbose_marks_the_combinations_a_rule_skips(capsys):
    """--verbose: a combination skipped by a rule is marked `[rule]` before its reason; of one this
    machine skips, the token counts a rule skips wherever it ran follow, marked `[rule]` too."""
    assert cli.main(["list", "--verbose", "backend=pplx,local", *PPLX[1:], "workload.tokens_per_rank=[16,1024]"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("skipped ")]
    pplx = [x for x in lines if x.startswith("skipped pplx/")]
    local = [x for x in lines if x.startswith("skipped local/")]
    assert pplx and local
    for line in local:
        assert "  [rule] (layouts differ: " in line and "skipped tokens" not in line
    for line in pplx:
        assert "  (pplx_kernels is not installed" in line and "[rule] (" not in line
        assert line.endswith(
            "  (skipped tokens: 1024 [rule]: backend.max_tokens_per_rank=512 caps the batched "
            "buffers: 1024 tokens per rank exceed it (raise backend.max_tokens_per_rank or lower "
            "workload.tokens_per_rank))"
        )
    assert cli.main(["list", "backend=pplx,local", *PPLX[1:], "workload.tokens_per_rank=[16,1024]"]) == 0
    assert "[rule]" not in capsys.readouterr().out  # the default listing as it was
