"""Capturing routing (moebench/routing/capture.py, hf.py; docs/routing.md, "Capture"): the
recorder on plain modules, and on tiny randomly initialized transformers MoE models built
here (no download), where the recorded ids and weights must be those the block dispatched:
what its experts module received, and what reproduces the block's output.
scripts/make_synthetic_recording.py at small sizes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from moebench.routing import file
from moebench.routing.capture import RoutingRecorder

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model here is built from a config
ROOT = Path(__file__).resolve().parents[2]
E, K, H = 8, 2, 32  # experts, top-k, hidden size of every tiny model


class Router(torch.nn.Module):
    """A plain router: softmax over a linear's logits, top-k; returns (weights, ids)."""

    def __init__(self, hidden=H, experts=E, topk=K, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(hidden, experts)
        self.topk = topk

    def forward(self, x):
        return torch.topk(torch.softmax(self.lin(x), dim=-1), self.topk, dim=-1)


def _route(router, x):
    with torch.no_grad():
        w, ids = router(x)
    return ids.reshape(-1, K).numpy(), w.reshape(-1, K).numpy()


# -- the recorder on plain modules --------------------------------------------------------


def test_recorder_keeps_each_layers_rows_in_routing_order(tmp_path):
    r0, r1 = Router(seed=0), Router(seed=1)
    xs = [torch.randn(2, 3, H), torch.randn(5, H), torch.randn(1, 4, H)]  # batched [B, S, H] and [T, H]
    rec = RoutingRecorder()
    with rec, torch.no_grad():
        rec.attach(r0, layer=0)
        rec.attach(r1, layer=5)
        for x in xs:
            r0(x)
        r1(xs[0])
    assert [(s.layer, s.tokens, s.steps, s.dropped) for s in rec.summary()] == [(0, 15, 3, 0), (5, 6, 1, 0)]
    path = tmp_path / "r.npz"
    rec.save(str(path), num_experts=E, source="plain routers")
    for layer, router, calls in ((0, r0, xs), (5, r1, xs[:1])):
        got = file.load(str(path), layer=layer, num_experts=E, topk=K)
        ids, w = zip(*(_route(router, x) for x in calls), strict=True)
        np.testing.assert_array_equal(got.ids, np.concatenate(ids))
        np.testing.assert_array_equal(got.weights, np.concatenate(w))
        assert got.source == "plain routers" and got.layers == (0, 5)
    with np.load(path) as z:
        assert z["step"].tolist() == [0] * 6 + [1] * 5 + [2] * 4 + [0] * 6
        assert z["layer"].tolist() == [0] * 15 + [5] * 6 and int(z["num_experts"]) == E
        assert z["topk_ids"].dtype == np.int32 and z["topk_weights"].dtype == np.float32


@dataclass
class RouterOut:
    logits: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor


class ObjectRouter(Router):
    def forward(self, x):
        logits = self.lin(x)
        w, ids = torch.topk(torch.softmax(logits, dim=-1), self.topk, dim=-1)
        return RouterOut(logits, ids, w)


class DictRouter(Router):
    def forward(self, x):
        return {"ids": torch.topk(self.lin(x), self.topk, dim=-1)[1]}


def test_an_object_output_and_a_custom_parse(tmp_path):
    obj, dct = ObjectRouter(seed=2), DictRouter(seed=3)
    x = torch.randn(6, H)
    rec = RoutingRecorder()
    with rec, torch.no_grad():
        rec.attach(obj, layer=1)  # attributes: the logits [6, E] are not taken for weights
        obj(x)
    got, want = rec.arrays(), obj(x)
    np.testing.assert_array_equal(got["topk_ids"], want.topk_ids.numpy())
    np.testing.assert_array_equal(got["topk_weights"], want.topk_weights.detach().numpy())

    rec2 = RoutingRecorder()
    with rec2, torch.no_grad():
        rec2.attach(dct, layer=0, parse=lambda mod, inputs, out: (out["ids"], None))
        dct(x)
    rec2.save(str(tmp_path / "d.npz"), num_experts=E)
    got2 = file.load(str(tmp_path / "d.npz"))
    assert got2.weights is None and got2.layer == 0
    np.testing.assert_array_equal(got2.ids, dct(x)["ids"].numpy())


def test_max_tokens_bounds_a_layer_and_counts_what_it_dropped(tmp_path):
    router = Router()
    xs = [torch.randn(5, H) for _ in range(4)]
    rec = RoutingRecorder(max_tokens=12)
    with rec, torch.no_grad():
        rec.attach(router, layer=2)
        for x in xs:
            router(x)
    (s,) = rec.summary()
    assert (s.tokens, s.dropped, s.steps) == (12, 8, 4)
    rec.save(str(tmp_path / "m.npz"))
    got = file.load(str(tmp_path / "m.npz"), layer=2)
    np.testing.assert_array_equal(got.ids, np.concatenate([_route(router, x)[0] for x in xs])[:12])
    with np.load(tmp_path / "m.npz") as z:
        assert z["step"].tolist() == [0] * 5 + [1] * 5 + [2] * 2  # the third call is cut, the fourth dropped


def test_detach_removes_the_hooks():
    router = Router()
    with RoutingRecorder() as rec:
        rec.attach(router, layer=0)
        router(torch.randn(3, H))
    assert not router._forward_hooks
    router(torch.randn(3, H))
    assert rec.summary()[0].tokens == 3


class TwoInts(torch.nn.Module):
    def forward(self, x):
        return torch.zeros(4, 2, dtype=torch.long), torch.ones(4, 2, dtype=torch.long)


def test_bad_outputs_and_uses_say_what_to_do(tmp_path):
    two = TwoInts()
    with RoutingRecorder() as rec, pytest.raises(ValueError, match="parse="):
        rec.attach(two, layer=0)
        two(torch.randn(4, H))
    with pytest.raises(ValueError, match="nothing recorded"):
        RoutingRecorder().save(str(tmp_path / "x.npz"))
    with pytest.raises(ValueError, match="max_tokens"):
        RoutingRecorder(max_tokens=0)
    rec = RoutingRecorder()
    rec.record(0, torch.tensor([[0, 1]]), torch.tensor([[0.5, 0.5]]))
    with pytest.raises(ValueError, match="one recording holds one top-k"):
        rec.record(1, torch.tensor([[0, 1, 2]]))
    rec.record(0, torch.tensor([[2, 3]]))
    with pytest.raises(ValueError, match="1 of 2 recorded calls gave no weights"):
        rec.arrays()
    rec = RoutingRecorder()
    rec.record(0, torch.tensor([[0, 9]]))
    with pytest.raises(ValueError, match="num_experts=8"):
        rec.save(str(tmp_path / "y.npz"), num_experts=8)
    assert not (tmp_path / "y.npz").exists()


def test_moebench_routing_imports_without_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import moebench.routing.hf, moebench.routing.capture, moebench.routing.file; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# -- transformers MoE blocks --------------------------------------------------------------


def tiny_model(arch: str):
    """A randomly initialized *ForCausalLM with 8 experts, top-2, hidden 32. Qwen2-MoE and
    DeepSeek-V3 get a dense first layer, so that their MoE layers are 1 and 2."""
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=H, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    if arch == "mixtral":
        return tf.MixtralForCausalLM(
            tf.MixtralConfig(num_local_experts=E, num_experts_per_tok=K, num_hidden_layers=2, **common)
        )
    if arch == "qwen2_moe":
        return tf.Qwen2MoeForCausalLM(
            tf.Qwen2MoeConfig(
                num_experts=E,
                num_experts_per_tok=K,
                moe_intermediate_size=16,
                shared_expert_intermediate_size=16,
                norm_topk_prob=False,
                num_hidden_layers=3,
                mlp_only_layers=[0],
                **common,
            )
        )
    if arch == "qwen3_moe":
        return tf.Qwen3MoeForCausalLM(
            tf.Qwen3MoeConfig(
                num_experts=E,
                num_experts_per_tok=K,
                moe_intermediate_size=16,
                norm_topk_prob=True,
                num_hidden_layers=2,
                **common,
            )
        )
    common.pop("num_key_value_heads")
    model = tf.DeepseekV3ForCausalLM(
        tf.DeepseekV3Config(
            n_routed_experts=E,
            num_experts_per_tok=K,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            num_hidden_layers=3,
            moe_intermediate_size=16,
            n_shared_experts=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            **common,
        )
    )
    with torch.no_grad():  # a trained model's correction bias is not zero; the top-k must take it in
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.normal_(0, 0.01)
    return model


ARCHS = {
    "mixtral": ("MixtralSparseMoeBlock", [0, 1]),
    "qwen2_moe": ("Qwen2MoeSparseMoeBlock", [1, 2]),
    "qwen3_moe": ("Qwen3MoeSparseMoeBlock", [0, 1]),
    "deepseek_v3": ("DeepseekV3MoE", [1, 2]),
}


class Dispatch:
    """What each MoE block of a model did, seen from outside the adapter: its input and output
    rows, its shared experts' part, and (a 3-D experts module, transformers 5) the ids and
    weights its experts module was called with."""

    def __init__(self, model):
        from moebench.routing import hf

        self.blocks = {layer: block for layer, _, block in hf.find_moe_blocks(model)}
        self.calls: dict = {k: [] for k in self.blocks}
        self.handles = []
        for layer, block in self.blocks.items():
            self._watch(layer, block)

    def _watch(self, layer, block):
        calls = self.calls[layer]
        on = self.handles.append

        def block_in(mod, args):
            calls.append({"x": args[0].reshape(-1, args[0].shape[-1]).clone()})

        def block_out(mod, args, out):
            out = out[0] if isinstance(out, tuple) else out  # transformers 4 returns (hidden, logits)
            calls[-1]["y"] = out.reshape(-1, out.shape[-1]).clone()

        def experts_in(mod, args, kwargs):
            args = list(args) + [kwargs[k] for k in ("top_k_index", "top_k_weights") if k in kwargs]
            calls[-1]["ids"], calls[-1]["w"] = args[1].clone(), args[2].clone()

        on(block.register_forward_pre_hook(block_in))
        on(block.register_forward_hook(block_out))
        if not isinstance(block.experts, torch.nn.ModuleList):
            on(block.experts.register_forward_pre_hook(experts_in, with_kwargs=True))
        for name in ("shared_expert", "shared_expert_gate", "shared_experts"):
            if hasattr(block, name):
                on(
                    getattr(block, name).register_forward_hook(
                        lambda mod, args, out, name=name: calls[-1].__setitem__(name, out.reshape(-1, out.shape[-1]))
                    )
                )

    def remove(self):
        for h in self.handles:
            h.remove()

    def routed(self, layer, call, ids, w):
        """The block's output rebuilt from `ids` and `w` [T, P] with its own experts."""
        block, x = self.blocks[layer], call["x"]
        ids, w = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(w, dtype=x.dtype)
        if isinstance(block.experts, torch.nn.ModuleList):  # one module per expert (transformers 4)
            y = torch.zeros_like(x)
            for e in ids.unique().tolist():
                tok, slot = torch.where(ids == e)
                y.index_add_(0, tok, block.experts[e](x[tok]) * w[tok, slot, None])
        else:
            y = block.experts(x, ids, w)
        if "shared_expert" in call:  # Qwen2-MoE: a sigmoid-gated shared expert
            y = y + torch.sigmoid(call["shared_expert_gate"]) * call["shared_expert"]
        if "shared_experts" in call:  # DeepSeek-V3
            y = y + call["shared_experts"]
        return y


@pytest.mark.parametrize("arch", list(ARCHS))
def test_capture_records_the_routing_the_block_dispatched(arch, tmp_path):
    from moebench.routing import hf

    cls, layers = ARCHS[arch]
    # never skipped: every transformers in the test extra's range (>= 4.57) has all four blocks,
    # so a missing one is a broken install, failed with the import's own words
    assert cls not in (missing := hf.missing_blocks()), missing[cls]
    model = tiny_model(arch)
    g = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, 128, (2, 5), generator=g),
        torch.randint(0, 128, (7,), generator=g),
        torch.randint(0, 128, (1, 4), generator=g),
    ]
    seen = Dispatch(model)
    path = tmp_path / f"{arch}.npz"
    rec = hf.capture_from_hf(model, batches, str(path), source=f"tiny {arch}")
    seen.remove()

    assert [s.layer for s in rec.summary()] == layers == sorted(seen.blocks)
    for layer in layers:
        got = file.load(str(path), layer=layer, num_experts=E, topk=K)
        assert got.source == f"tiny {arch}" and got.layers == tuple(layers) and got.tokens == 21
        rows = np.cumsum([0, 10, 7, 4])
        assert len(seen.calls[layer]) == 3
        for i, call in enumerate(seen.calls[layer]):
            ids, w = got.ids[rows[i] : rows[i + 1]], got.weights[rows[i] : rows[i + 1]]
            if "ids" in call:  # what the experts module was handed, exactly
                np.testing.assert_array_equal(ids, call["ids"].numpy())
                np.testing.assert_array_equal(w, call["w"].float().numpy())
            torch.testing.assert_close(seen.routed(layer, call, ids, w), call["y"], rtol=1e-5, atol=1e-6)
            # the check has teeth: another expert for one token changes the output
            wrong = ids.copy()
            wrong[0, 0] = next(e for e in range(E) if e not in ids[0])
            assert not torch.allclose(seen.routed(layer, call, wrong, w), call["y"], rtol=1e-5, atol=1e-6)
        assert len(np.unique(got.ids)) > K  # the random router spreads tokens over the experts
    with np.load(path) as z:
        assert z["step"].tolist() == ([0] * 10 + [1] * 7 + [2] * 4) * len(layers)
        assert int(z["num_experts"]) == E
    if arch == "deepseek_v3":  # group-limited: a token's experts lie in one (topk_group) of 2 groups of 4
        ids = file.load(str(path), layer=1).ids
        assert (ids[:, 0] // 4 == ids[:, 1] // 4).all() and len(np.unique(ids // 4)) == 2


def test_a_model_without_moe_blocks_names_the_classes_looked_for():
    from moebench.routing import hf

    with pytest.raises(ValueError) as e:
        hf.find_moe_blocks(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    for cls in ("MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock", "DeepseekV3MoE"):
        assert cls in str(e.value)
    assert all(hf.available_blocks().values())


def test_a_block_whose_import_fails_is_reported_with_the_import_s_own_exception(monkeypatch):
    """A dependency of transformers shadowed (the repository's kernels/ once stood in for Hugging
    Face's `kernels`): the reason names that ImportError, not "transformers has no block"."""
    import importlib

    from moebench.routing import hf

    real = importlib.import_module

    def failing(name, *a, **k):
        if name.endswith("modeling_qwen3_moe"):
            raise ImportError("cannot import name 'CUDAProperties' from 'kernels' (/repo/kernels/__init__.py)")
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", failing)
    missing = hf.missing_blocks()
    assert list(missing) == ["Qwen3MoeSparseMoeBlock"]
    assert "ImportError: cannot import name 'CUDAProperties' from 'kernels'" in missing["Qwen3MoeSparseMoeBlock"]
    with pytest.raises(ValueError, match=r"Qwen3MoeSparseMoeBlock \(importing transformers\.models\.qwen3_moe"):
        hf.find_moe_blocks(torch.nn.Sequential(torch.nn.Linear(4, 4)))


# -- scripts/make_synthetic_recording.py --------------------------------------------------


def _script():
    spec = importlib.util.spec_from_file_location(
        "make_synthetic_recording", ROOT / "scripts" / "make_synthetic_recording.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_synthetic_recording_script(tmp_path, capsys):
    script = _script()
    args = [
        "--experts",
        "32",
        "--topk",
        "8",
        "--tokens",
        "40",
        "--seq",
        "16",
        "--arch",
        "deepseek_v3",
        "--hidden",
        "32",
    ]
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    assert script.main(args + ["--out", str(a)]) == 0
    assert script.main(args + ["--out", str(b)]) == 0
    for layer in (0, 1):
        got = file.load(str(a), layer=layer, num_experts=32, topk=8)
        assert got.tokens == 40 and got.source.startswith(
            "synthetic: randomly initialized transformers DeepseekV3 (no trained weights), seed 0"
        )
        # DeepSeek-V3's router, scaled down: 8 groups of 4 experts, a token's 8 in at most 4 of them
        assert max(len(set(e // 4 for e in row)) for row in got.ids.tolist()) <= 4
        np.testing.assert_array_equal(got.ids, file.load(str(b), layer=layer).ids)  # one seed, one recording
    with np.load(a) as z:
        assert z["step"].tolist() == ([0] * 16 + [1] * 16 + [2] * 8) * 2
    # a moebench model's shape: Mixtral-8x7B's 8 experts top-2, Mixtral's router
    m = tmp_path / "m.npz"
    assert script.main(["--model", "mixtral_8x7b", "--tokens", "8", "--hidden", "16", "--out", str(m)]) == 0
    got = file.load(str(m), layer=0, num_experts=8, topk=2)
    assert "transformers Mixtral " in got.source and got.tokens == 8
    capsys.readouterr()
    for bad, says in (
        (["--experts", "4", "--topk", "8"], "--topk 8 must lie in 1..--experts (4)"),
        (["--model", "nope"], "no conf/model/nope.yaml"),
        (["--model", "tiny", "--topk", "2"], "give one or the other"),
    ):
        assert script.main(bad + ["--out", str(tmp_path / "x.npz")]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.npz").exists()
