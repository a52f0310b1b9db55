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
