"""model=hf:<path-or-id> (moebench/config/hf.py, issue #49): each committed family's config.json
(tests/fixtures/hf_configs/) maps to the layer its own numbers say, `moebench list` shows the
sizes, a model id is read from the local Hugging Face cache only, and bad input is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from moebench import cli
from moebench.config import compose, hf

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
ROOT = Path(__file__).resolve().parents[2]
FAMILIES = (
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2_lite",
    "deepseek_v3",
    "kimi_k2",
    "glm4_moe",
    "llama4",
    "gpt_oss",
    "gpt_oss_120b",
)
FIELDS = ("hidden", "intermediate", "num_experts", "topk", "num_shared_experts", "shared_intermediate")


def own(family: str) -> dict:
    return json.loads((FIXTURES / family / "config.json").read_text())


def expected(family: str) -> tuple:
    """(hidden, intermediate, experts, topk, shared experts, shared width, MoE layers) from the
    config's own fields, spelled the way each family's transformers model reads them."""
    c = own(family)
    n = c.get("num_hidden_layers")
    if family == "mixtral":
        return c["hidden_size"], c["intermediate_size"], c["num_local_experts"], c["num_experts_per_tok"], 0, 0, n
    if family == "qwen2_moe":  # one shared expert of its own width beside the routed experts
        return (
            c["hidden_size"],
            c["moe_intermediate_size"],
            c["num_experts"],
            c["num_experts_per_tok"],
            1,
            c["shared_expert_intermediate_size"],
            n,
        )
    if family == "qwen3_moe":
        return c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["num_experts_per_tok"], 0, 0, n
    if family in ("deepseek_v2_lite", "deepseek_v3", "kimi_k2", "glm4_moe"):  # n_shared_experts of the experts' width
        return (
            c["hidden_size"],
            c["moe_intermediate_size"],
            c["n_routed_experts"],
            c["num_experts_per_tok"],
            c["n_shared_experts"],
            c["moe_intermediate_size"],
            n - c["first_k_dense_replace"],
        )
    if family == "llama4":  # the text model's layers; one shared expert of the experts' width
        t = c["text_config"]
        return (
            t["hidden_size"],
            t["intermediate_size"],
            t["num_local_experts"],
            t["num_experts_per_tok"],
            1,
            t["intermediate_size"],
            t["num_hidden_layers"],
        )
    assert family in ("gpt_oss", "gpt_oss_120b")
    return c["hidden_size"], c["intermediate_size"], c["num_local_experts"], c["experts_per_token"], 0, 0, n


# the published numbers, so a fixture edited by mistake fails too
PUBLISHED = {
    "mixtral": ("Mixtral-8x7B-v0.1", 4096, 14336, 8, 2, 0, 0),
    "qwen2_moe": ("Qwen1.5-MoE-A2.7B", 2048, 1408, 60, 4, 1, 5632),
    "qwen3_moe": ("Qwen3-30B-A3B", 2048, 768, 128, 8, 0, 0),
    "deepseek_v2_lite": ("DeepSeek-V2-Lite", 2048, 1408, 64, 6, 2, 1408),
    "deepseek_v3": ("DeepSeek-V3", 7168, 2048, 256, 8, 1, 2048),
    "kimi_k2": ("Kimi-K2-Instruct", 7168, 2048, 384, 8, 1, 2048),
    "glm4_moe": ("GLM-4.5-Air", 4096, 1408, 128, 8, 1, 1408),
    "llama4": ("Llama-4-Scout-17B-16E-Instruct", 5120, 8192, 16, 1, 1, 8192),
    "gpt_oss": ("gpt-oss-20b", 2880, 2880, 32, 4, 0, 0),
    "gpt_oss_120b": ("gpt-oss-120b", 2880, 2880, 128, 4, 0, 0),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_mapped_field_is_the_configs_own_number(family):
    layer = hf.resolve(f"hf:{FIXTURES / family}")
    got = tuple(getattr(layer, f) for f in FIELDS) + (layer.moe_layers,)
    assert got == expected(family)
    assert (layer.name, *got[:6]) == PUBLISHED[family]
    raw = (FIXTURES / family / "config.json").read_bytes()
    import hashlib

    assert layer.config_sha256 == hashlib.sha256(raw).hexdigest()
    # composed as an ordinary model config: the combination carries the name, sizes and digest
    cfg = compose.compose_config([f"model=hf:{FIXTURES / family / 'config.json'}"])
    compose.check_values(cfg)
    combo = compose.to_combo(cfg, device="cpu")
    assert (combo.model, *(combo[f] for f in FIELDS)) == PUBLISHED[family]
    assert combo.model_config_sha256 == layer.config_sha256 and combo.label.endswith(f"cfg{layer.config_sha256[:8]}")


# every built-in card (conf/model/) but the CPU-sized tiny is a public model's: its config gives the same layer
CARDS = {
    "mixtral_8x7b": "mixtral",
    "qwen3_30b_a3b": "qwen3_moe",
    "deepseek_v2_lite": "deepseek_v2_lite",
    "deepseek_v3": "deepseek_v3",
    "gpt_oss_120b": "gpt_oss_120b",
}


@pytest.mark.parametrize("card", sorted(CARDS))
def test_the_built_in_cards_are_read_from_their_configs(card):
    # one path from a config to a layer: the card names its public config, the mapping reads it
    text = (ROOT / "conf" / "model" / f"{card}.yaml").read_text()
    assert f"hf_config: {CARDS[card]}\n" in text and "hidden:" not in text
    built_in = compose.compose_config([f"model={card}"])["model"]
    layer = hf.resolve(f"hf:{FIXTURES / CARDS[card]}")
    assert tuple(built_in[f] for f in FIELDS) == tuple(getattr(layer, f) for f in FIELDS) == PUBLISHED[CARDS[card]][1:]
    # named by the card, with no digest: the combinations of stored runs keep their keys
    assert built_in["name"] == card and built_in["config_sha256"] == ""


@pytest.mark.parametrize("family", FAMILIES)
def test_list_shows_the_layers_sizes_as_plain_integers(family, capsys):
    argv = ["list", f"model=hf:{FIXTURES / family}", "backend=local", "experts=torch", "runner.device=cpu"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    name, hidden, inter, experts, topk, shared, width = PUBLISHED[family]
    line = f"{name}: hidden {hidden}, intermediate {inter}, experts {experts}, topk {topk}, shared {shared} x {width}"
    assert f"model   {line}" in out, out
    assert f"/{name}/cfg" in out  # the rows' model is the config's own name, tagged with its digest


def test_list_verbose_shows_a_built_in_cards_sizes(capsys):
    assert cli.main(["list", "--verbose", "model=deepseek_v3", "backend=local", "experts=torch"]) == 0
    assert (
        "deepseek_v3: hidden 7168, intermediate 2048, experts 256, topk 8, shared 1 x 2048" in capsys.readouterr().out
    )


def test_a_model_id_is_read_from_the_local_cache_only(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--acme--moe-hf-test-1" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.copy(FIXTURES / "qwen3_moe" / "config.json", snap / "config.json")
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    layer = hf.resolve("hf:acme/moe-hf-test-1")
    assert layer.path == str(snap / "config.json") and layer.num_experts == 128
    # no _name_or_path: the id's name
    data = own("qwen3_moe")
    del data["_name_or_path"]
    (snap / "config.json").write_text(json.dumps(data))
    hf.resolve.cache_clear()
    assert hf.resolve("hf:acme/moe-hf-test-1").name == "moe-hf-test-1"


@pytest.mark.parametrize(
    "option, words",
    [
        (
            "hf:acme/not-cached-anywhere",
            ["not in the Hugging Face cache", "huggingface-cli download acme/not-cached-anywhere config.json"],
        ),
        ("hf:/nonexistent/folder", ["no config.json at /nonexistent/folder"]),
        ("hf:", ["names no config"]),
    ],
)
def test_a_missing_config_is_one_line_and_exit_2(option, words, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert cli.main(["list", f"model={option}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(w in err for w in words), err


def test_a_config_the_mapping_does_not_know_names_the_fields_it_looked_for(tmp_path, capsys):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336})
    )
    assert cli.main(["list", f"model=hf:{tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'llama'" in err and "num_local_experts" in err and "num_experts_per_tok" in err


def test_two_configs_of_one_name_do_not_compare(tmp_path):
    a, b = tmp_path / "a" / "m", tmp_path / "b" / "m"
    for d, experts in ((a, 16), (b, 32)):
        d.mkdir(parents=True)
        data = own("tiny_qwen3_moe")
        del data["_name_or_path"]
        (d / "config.json").write_text(json.dumps({**data, "num_experts": experts}))
    ca, cb = (compose.to_combo(compose.compose_config([f"model=hf:{d}"]), device="cpu") for d in (a, b))
    assert ca.model == cb.model == "m" and ca.key != cb.key
    # the same sizes under another digest (a config that differs only outside the layer) still differ
    (b / "config.json").write_text(json.dumps({**json.loads((a / "config.json").read_text()), "vocab_size": 7}))
    hf.resolve.cache_clear()
    compose._group_node.cache_clear()
    compose._typed_group.cache_clear()
    cb = compose.to_combo(compose.compose_config([f"model=hf:{b}"]), device="cpu")
    assert (ca.num_experts, ca.hidden) == (cb.num_experts, cb.hidden) and ca.key != cb.key


def test_a_sweep_over_hf_and_built_in_models_expands_each(capsys):
    argv = ["list", f"model=tiny,hf:{FIXTURES / 'tiny_qwen3_moe'}", "backend=local", "experts=torch", "quant=bf16"]
    assert cli.main([*argv, "overlap=none", "reduction=experts"]) == 0
    out = capsys.readouterr().out
    assert "valid   local/torch/experts/none/bf16/tiny\n" in out and "/bf16/tiny-qwen3-moe/cfg" in out
    assert (
        "model   tiny-qwen3-moe: hidden 256, intermediate 128, experts 16, topk 4, shared 0 x 0, 3 of 4 layers" in out
    )


def test_tune_reads_model_hf_through_the_same_plan(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert cli.main(["tune", "model=hf:acme/tune-not-cached", "experts=triton", "backend=local"]) == 2
    assert "huggingface-cli download acme/tune-not-cached config.json" in capsys.readouterr().err
