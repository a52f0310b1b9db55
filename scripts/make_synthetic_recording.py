#!/usr/bin/env python3
"""A synthetic routing recording: a randomly initialized transformers MoE model with a
moebench model's routing shape (experts, top-k), fed random token ids, captured with
moebench.routing (docs/routing.md, "Capture"). No trained weights: the routing is that of a
random router on random tokens, not of real traffic; `source` in the file says so.

    python scripts/make_synthetic_recording.py --model qwen3_30b_a3b --tokens 8192 --out qwen3_synth.npz
    python scripts/make_synthetic_recording.py --experts 256 --topk 8 --tokens 8192 --out dsv3_synth.npz

--arch auto takes DeepSeek-V3's router (sigmoid score, 8 groups, top-4 groups) for 256 experts,
Mixtral's for 8 experts, Qwen3-MoE's otherwise. Small hidden sizes: seconds on a CPU.
Exit status: 0 written; 2 bad arguments (one line saying what to change).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from moebench.util.arg_errors import OneLineErrors, script_prog

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ("auto", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")


def model_shape(name: str) -> tuple[int, int]:
    """(num_experts, topk) of moebench's conf/model/NAME.yaml, as moebench composes it (a card may
    name a public config.json instead of holding the sizes: hf_config)."""
    path = ROOT / "conf" / "model" / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
        raise ValueError(f"--model {name}: no conf/model/{name}.yaml (models: {', '.join(names)})")
    from moebench.config.compose import compose_config

    cfg = compose_config([f"model={name}"])["model"]
    return int(cfg["num_experts"]), int(cfg["topk"])


def pick_arch(arch: str, experts: int) -> str:
    if arch != "auto":
        return arch
    return {256: "deepseek_v3", 8: "mixtral"}.get(experts, "qwen3_moe")


def build(arch: str, experts: int, topk: int, layers: int, hidden: int, vocab: int):
    """A randomly initialized *ForCausalLM of `arch` with `experts` routed experts, top-`topk`."""
    import transformers as tf

    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    if arch == "mixtral":
        cfg = tf.MixtralConfig(num_local_experts=experts, num_experts_per_tok=topk, **common)
        return tf.MixtralForCausalLM(cfg)
    if arch in ("qwen2_moe", "qwen3_moe"):
        cfg_cls, model_cls = (
            (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM)
            if arch == "qwen2_moe"
            else (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM)
        )
        extra = {"shared_expert_intermediate_size": hidden} if arch == "qwen2_moe" else {}
        # Qwen3-30B-A3B renormalizes its top-k weights; Qwen2-MoE (57B-A14B) does not
        cfg = cfg_cls(
            num_experts=experts,
            num_experts_per_tok=topk,
            moe_intermediate_size=hidden // 2,
            norm_topk_prob=arch == "qwen3_moe",
            **extra,
            **common,
        )
        return model_cls(cfg)
    # DeepSeek-V3's router: 8 groups, the best 4 by their top-2 scores, top-k within them;
    # fewer experts than that needs (2 a group, topk among 4 groups) fall back to one group
    groups, topk_group = (8, 4) if experts % 8 == 0 and experts // 8 >= 2 and topk <= 4 * (experts // 8) else (1, 1)
    common.pop("num_key_value_heads")
    cfg = tf.DeepseekV3Config(
        n_routed_experts=experts,
        num_experts_per_tok=topk,
        n_group=groups,
        topk_group=topk_group,
        first_k_dense_replace=0,
        moe_intermediate_size=hidden // 2,
        n_shared_experts=1,
        kv_lora_rank=16,
        q_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        **common,
    )
    return tf.DeepseekV3ForCausalLM(cfg)


def parse_args(argv):
    p = OneLineErrors(
        prog=script_prog(__file__), description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--model", help="take --experts and --topk from conf/model/MODEL.yaml")
    p.add_argument("--experts", type=int, help="routed experts (e.g. 128 for qwen3_30b_a3b, 256 for DeepSeek-V3)")
    p.add_argument("--topk", type=int, help="experts per token")
    p.add_argument("--tokens", type=int, default=4096, help="tokens recorded per layer (default 4096)")
    p.add_argument("--seq", type=int, default=512, help="tokens per forward call, one `step` each (default 512)")
    p.add_argument("--layers", type=int, default=2, help="MoE layers, each recorded (default 2)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--arch", choices=ARCHS, default="auto", help="transformers model family (default auto)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the .npz to write")
    a = p.parse_args(argv)
    if a.model:
        if a.experts is not None or a.topk is not None:
            raise ValueError("--model sets --experts and --topk: give one or the other")
        a.experts, a.topk = model_shape(a.model)
    if a.experts is None or a.topk is None:
        raise ValueError("give --model NAME, or --experts and --topk")
    if not 1 <= a.topk <= a.experts:
        raise ValueError(f"--topk {a.topk} must lie in 1..--experts ({a.experts})")
    for name in ("tokens", "seq", "layers"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name} {getattr(a, name)}: give a positive count")
    if a.hidden < 16 or a.hidden % 8:
        raise ValueError(f"--hidden {a.hidden}: give a multiple of 8, at least 16 (4 attention heads)")
    out_dir = os.path.dirname(os.path.abspath(a.out))
    if not os.path.isdir(out_dir):
        raise ValueError(f"--out {a.out}: folder {out_dir} does not exist")
    return a


def main(argv=None) -> int:
    try:
        a = parse_args(argv)
    except ValueError as e:
        print(f"make_synthetic_recording: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config built here; nothing to download
    import torch

    from moebench.routing import hf

    arch = pick_arch(a.arch, a.experts)
    torch.manual_seed(a.seed)
    model = build(arch, a.experts, a.topk, a.layers, a.hidden, vocab=1024)
    g = torch.Generator().manual_seed(a.seed)
    batches = [torch.randint(0, 1024, (1, min(a.seq, a.tokens - i)), generator=g) for i in range(0, a.tokens, a.seq)]
    cls = type(model).__name__.removesuffix("ForCausalLM")
    source = (
        f"synthetic: randomly initialized transformers {cls} (no trained weights), seed {a.seed}; "
        f"{a.experts} experts top-{a.topk}, random token ids"
    )
    rec = hf.capture_from_hf(model, batches, a.out, source=source)
    for s in rec.summary():
        print(f"layer {s.layer}: {s.tokens} tokens in {s.steps} steps")
    print(f"wrote {a.out} ({a.experts} experts, top-{a.topk}, {cls}, seed {a.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
