"""Hook Hugging Face transformers' MoE blocks with a `RoutingRecorder` (routing/capture.py).

The blocks looked for (BLOCKS, by class name, subclasses included) and what is recorded:

    MixtralSparseMoeBlock     softmax -> top-k -> renormalize
    Qwen2MoeSparseMoeBlock    softmax -> top-k -> renormalize if config.norm_topk_prob
    Qwen3MoeSparseMoeBlock    (the same)
    DeepseekV3MoE             sigmoid (+ correction bias) -> group-limited top-k -> renormalize · scale

Transformers versions differ in where the top-k happens, and the recorder takes it from where
the model makes it, so the recorded ids are those the block dispatches:
- the block's `gate` is a router module that returns the ids (transformers 5: (logits, weights,
  ids); DeepSeek-V3 in 4.x: (ids, weights)): its output is read as it is (`default_parse`);
- the `gate` is a plain `nn.Linear` returning logits (Mixtral, Qwen2/3-MoE in 4.x): the block's
  own few lines (softmax in float32, top-k, the renormalization, the cast to the logits' dtype)
  are applied to those logits, as the block's forward does next.

transformers is imported only inside these functions: moebench imports without it.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional

import torch

from moebench.routing.capture import RoutingRecorder

# block class name -> the transformers module that defines it
BLOCKS = {
    "MixtralSparseMoeBlock": "mixtral",
    "Qwen2MoeSparseMoeBlock": "qwen2_moe",
    "Qwen3MoeSparseMoeBlock": "qwen3_moe",
    "DeepseekV3MoE": "deepseek_v3",
}
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def missing_blocks() -> dict[str, str]:
    """Each block class of BLOCKS the installed transformers cannot give -> why, in the words of
    the failure itself (the import's exception, e.g. a shadowed dependency), not a guess."""
    import importlib

    import transformers

    out = {}
    for cls, mod in BLOCKS.items():
        where = f"transformers.models.{mod}.modeling_{mod}"
        try:
            m = importlib.import_module(where)
        except Exception as e:  # noqa: BLE001 (any failure of the import is the reason, reported whole)
            out[cls] = f"importing {where} (transformers {transformers.__version__}) failed: {type(e).__name__}: {e}"
            continue
        if not hasattr(m, cls):
            out[cls] = f"{where} (transformers {transformers.__version__}) defines no {cls}"
    return out


def available_blocks() -> dict[str, bool]:
    """Each block class of BLOCKS -> whether the installed transformers gives it (missing_blocks)."""
    missing = missing_blocks()
    return {cls: cls not in missing for cls in BLOCKS}


def _block_kind(module: torch.nn.Module) -> Optional[str]:
    for c in type(module).__mro__:
        if c.__name__ in BLOCKS:
            return c.__name__
    return None


def find_moe_blocks(model: torch.nn.Module) -> list[tuple[int, str, torch.nn.Module]]:
    """(decoder layer index, qualified name, block) of every MoE block of BLOCKS in `model`, by
    layer. The layer is the index in the decoder's `layers` list (dense layers keep their
    numbers, so DeepSeek-V3's first MoE layer is 3, as in the model)."""
    found = []
    for name, m in model.named_modules():
        if _block_kind(m) is None:
            continue
        hits = _LAYER_RE.findall(name)
        if not hits:
            raise ValueError(
                f"MoE block {name} ({type(m).__name__}) is not under a `layers.N` module: "
                "attach it with RoutingRecorder.attach(block.gate, layer=N) instead"
            )
        found.append((int(hits[-1]), name, m))
    if not found:
        import transformers

        missing = missing_blocks()
        looked = ", ".join(f"{c} ({missing.get(c, 'in this transformers')})" for c in BLOCKS)
        raise ValueError(
            f"no MoE block found in {type(model).__name__} (transformers {transformers.__version__}); "
            f"looked for {looked}; for another model, hook its router with RoutingRecorder.attach"
        )
    layers = [k for k, _, _ in found]
    if len(set(layers)) != len(layers):
        raise ValueError(f"several MoE blocks share a layer number ({layers}): attach them by hand")
    return sorted(found, key=lambda f: f[0])


def num_experts_of(block: torch.nn.Module) -> int:
    """The routed expert count of one block (its router's output width)."""
    gate: Any = block.gate  # every block of BLOCKS has one
    if isinstance(gate, torch.nn.Linear):
        return int(gate.out_features)
    for attr in ("num_experts", "n_routed_experts"):
        if isinstance(getattr(gate, attr, None), int):
            return int(getattr(gate, attr))
    return int(gate.weight.shape[0])


def _linear_gate_parse(block: torch.nn.Module):
    """For a block whose gate returns logits [T, E]: the block's own selection from them."""
    kind = _block_kind(block)
    if kind == "MixtralSparseMoeBlock":
        renorm = True
    elif kind in ("Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock"):
        renorm = bool(block.norm_topk_prob)
    else:
        raise ValueError(
            f"{type(block).__name__}: its gate returns logits, and this adapter knows the selection "
            "after it only for Mixtral and Qwen2/3-MoE; pass RoutingRecorder.attach a parse="
        )
    top_k = int(block.top_k)  # type: ignore[arg-type]  # an int attribute of the blocks that have a Linear gate

    def parse(gate, inputs, logits_TE):
        # as the block's forward: softmax in float32, top-k, renormalize, back to the input dtype
        probs = torch.softmax(logits_TE, dim=1, dtype=torch.float)
        w_TP, ids_TP = torch.topk(probs, top_k, dim=-1)
        if renorm:
            w_TP = w_TP / w_TP.sum(dim=-1, keepdim=True)
        return ids_TP, w_TP.to(inputs[0].dtype)

    return parse


def attach_hf(model: torch.nn.Module, recorder: RoutingRecorder) -> list[int]:
    """Hook every MoE block of `model` (find_moe_blocks) into `recorder`; returns the layers."""
    layers = []
    for layer, _name, block in find_moe_blocks(model):
        gate: Any = block.gate  # every block of BLOCKS has one
        parse = _linear_gate_parse(block) if type(gate) is torch.nn.Linear else None
        recorder.attach(gate, layer, parse=parse)
        layers.append(layer)
    return layers


def model_num_experts(model: torch.nn.Module) -> int:
    """The routed expert count shared by every MoE block of `model`."""
    counts = {num_experts_of(b) for _, _, b in find_moe_blocks(model)}
    if len(counts) != 1:
        raise ValueError(f"the MoE blocks route to different expert counts {sorted(counts)}")
    return counts.pop()


def capture_from_hf(
    model: torch.nn.Module,
    input_ids_batches: Iterable,
    path: str,
    source: Optional[str] = None,
    max_tokens: Optional[int] = None,
) -> RoutingRecorder:
    """Run `model` (eval, no grad, no KV cache) on each batch of token ids ([B, S] or [S]),
    record every MoE block's routing and write it to `path` (routing/file.py's format), one
    step per batch. Every position is recorded, padding included: pass batches without
    padding for a recording of real tokens. Returns the (detached) recorder."""
    import transformers

    recorder = RoutingRecorder(max_tokens=max_tokens)
    num_experts = model_num_experts(model)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with recorder, torch.no_grad():
            attach_hf(model, recorder)
            for batch in input_ids_batches:
                ids = torch.as_tensor(batch, device=device)
                model(input_ids=ids[None] if ids.dim() == 1 else ids, use_cache=False)
    finally:
        model.train(was_training)
    if source is None:
        source = f"transformers {transformers.__version__} {type(model).__name__} capture"
    recorder.save(path, num_experts=num_experts, source=source)
    return recorder
