"""`model=hf:<path-or-id>`: one MoE layer read from a Hugging Face `config.json` (issue #49).

The config is a local folder or file, or a model id found in the local Hugging Face cache only
(no network: a missing id says where it looked and how to fetch it). Its JSON is read here, with
no transformers import, and mapped to moebench's model group (schema.ModelConf) by the fields
each family spells (docs/models.md): the rest of the pipeline sees an ordinary model config, named
after the config (`_name_or_path`'s last part, else the folder) and carrying the file's sha256, so
two configs of one name never compare.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

PREFIX = "hf:"

# where each mapped size is looked for, in this order (the first present wins)
EXPERTS_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "moe_k")
HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd")
# the routed experts' width: the MoE width where a family spells both, else the one width
INTERMEDIATE_KEYS = ("moe_intermediate_size", "intermediate_size")
LLAMA4 = ("llama4", "llama4_text")


def is_hf(option: str) -> bool:
    return option.startswith(PREFIX)


@dataclass(frozen=True)
class Layer:
    """One config's MoE layer: what moebench's model group holds, and the layer structure
    around it (not a column: the layer is timed alone)."""

    name: str
    hidden: int
    intermediate: int
    num_experts: int
    topk: int
    num_shared_experts: int
    shared_intermediate: int
    config_sha256: str
    model_type: str
    num_layers: int  # 0: the config does not say
    moe_layers: int  # how many of them are MoE layers (first-dense layers, MoE frequency)
    path: str

    def model_node(self) -> dict:
        """The model group's values (schema.ModelConf)."""
        d = asdict(self)
        return {k: d[k] for k in MODEL_KEYS}


MODEL_KEYS = (
    "name",
    "hidden",
    "intermediate",
    "num_experts",
    "topk",
    "num_shared_experts",
    "shared_intermediate",
    "config_sha256",
)


def cache_dirs() -> list[Path]:
    """The Hugging Face hub caches, as huggingface_hub resolves them (HF_HUB_CACHE, then
    HF_HOME/hub, then XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub)."""
    out = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        out.append(Path(os.environ["HF_HOME"]) / "hub")
    xdg = os.environ.get("XDG_CACHE_HOME")
    out.append((Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub")
    return list(dict.fromkeys(p.expanduser() for p in out))


def locate(given: str) -> tuple[Path, str]:
    """(the config.json, the name its folder gives) of `hf:<given>`; ValueError saying where it
    looked when there is none."""
    p = Path(given).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json", p.resolve().name
    if p.is_file():
        return p, p.resolve().parent.name
    org, sep, name = given.partition("/")
    if p.is_absolute() or given.startswith(".") or given.endswith(".json") or not sep or "/" in name:
        raise ValueError(
            f"model=hf:{given}: no config.json at {p} (give a folder holding config.json, the file, or ORG/NAME)"
        )
    dirs = cache_dirs()
    for d in dirs:
        repo = d / f"models--{org}--{name}"
        ref = repo / "refs" / "main"
        if ref.is_file():
            cfg = repo / "snapshots" / ref.read_text().strip() / "config.json"
            if cfg.is_file():
                return cfg, name
        found = sorted((repo / "snapshots").glob("*/config.json"), key=lambda f: f.stat().st_mtime)
        if found:
            return found[-1], name
    where = ", ".join(str(d) for d in dirs)
    raise ValueError(
        f"model=hf:{given}: not a local path and not in the Hugging Face cache (looked in {where}); "
        f"fetch it with `huggingface-cli download {given} config.json` (moebench never reads the network)"
    )


def _int(cfg: dict, keys: tuple[str, ...]) -> Optional[int]:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _moe_layers(cfg: dict, n: int, model_type: str) -> int:
    """How many of the n decoder layers are MoE, as transformers builds them."""
    if not n:
        return 0
    if model_type in LLAMA4:
        if isinstance(cfg.get("moe_layers"), list):
            return len(cfg["moe_layers"])
        step = int(cfg.get("interleave_moe_layer_step") or 1)
        return len(range(step - 1, n, step))
    if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:  # DeepSeek, GLM-4.5, Kimi-K2
        k, freq = int(cfg.get("first_k_dense_replace") or 0), int(cfg.get("moe_layer_freq") or 1)
        return sum(1 for i in range(n) if i >= k and i % freq == 0)
    if "decoder_sparse_step" in cfg or "mlp_only_layers" in cfg:  # Qwen2-MoE, Qwen3-MoE
        step, dense = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or ())
        return sum(1 for i in range(n) if i not in dense and (i + 1) % step == 0)
    return n


def _shared(cfg: dict, model_type: str, intermediate: int) -> tuple[int, int]:
    """(shared experts, the width of each)."""
    n = _int(cfg, ("n_shared_experts", "moe_num_shared_experts", "num_shared_experts"))
    if n:  # DeepSeek / GLM-4.5 / Kimi-K2: n experts of the routed experts' width (one n x I MLP)
        return n, intermediate
    width = _int(cfg, ("shared_expert_intermediate_size",))
    if width:  # Qwen2-MoE: one shared expert of its own width
        return 1, width
    if model_type in LLAMA4:  # Llama-4: one shared expert of the experts' width
        return 1, intermediate
    return 0, 0


def layer_of(cfg: dict, folder_name: str, path: str, digest: str) -> Layer:
    """The MoE layer a parsed config.json describes; ValueError naming the fields looked for."""
    top = cfg
    model_type = str(cfg.get("model_type") or "")
    if isinstance(cfg.get("text_config"), dict) and _int(cfg, EXPERTS_KEYS) is None:
        cfg = {**cfg["text_config"]}  # Llama-4 and other multimodal configs: the text model's layers
        model_type = str(cfg.get("model_type") or model_type)
    experts, topk, hidden = _int(cfg, EXPERTS_KEYS), _int(cfg, TOPK_KEYS), _int(cfg, HIDDEN_KEYS)
    intermediate = _int(cfg, INTERMEDIATE_KEYS)
    if not (experts and topk and hidden and intermediate):
        raise ValueError(
            f"{path} (model_type {model_type or 'unset'!r}) is not a MoE config moebench can map: it looked for "
            f"routed experts in {'/'.join(EXPERTS_KEYS)}, top-k in {'/'.join(TOPK_KEYS)}, hidden size in "
            f"{'/'.join(HIDDEN_KEYS)} and the experts' width in {'/'.join(INTERMEDIATE_KEYS)} (docs/models.md)"
        )
    shared, width = _shared(cfg, model_type, intermediate)
    n = _int(cfg, ("num_hidden_layers", "n_layer", "num_layers")) or 0
    own = str(top.get("_name_or_path") or "").rstrip("/")
    return Layer(
        name=own.rsplit("/", 1)[-1] if own else folder_name,
        hidden=hidden,
        intermediate=intermediate,
        num_experts=experts,
        topk=topk,
        num_shared_experts=shared,
        shared_intermediate=width,
        config_sha256=digest,
        model_type=model_type,
        num_layers=n,
        moe_layers=_moe_layers(cfg, n, model_type),
        path=path,
    )


@lru_cache(maxsize=None)
def resolve(option: str) -> Layer:
    """`hf:<path-or-id>` -> its Layer (read once per process)."""
    given = option[len(PREFIX) :] if is_hf(option) else option
    if not given:
        raise ValueError("model=hf: names no config: give model=hf:PATH (a folder or config.json) or model=hf:ORG/NAME")
    path, folder = locate(given)
    raw = path.read_bytes()
    try:
        cfg: Any = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"model=hf:{given}: {path} is not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"model=hf:{given}: {path} holds no JSON object")
    try:
        return layer_of(cfg, folder, str(path), hashlib.sha256(raw).hexdigest())
    except ValueError as e:
        raise ValueError(f"model=hf:{given}: {e}") from None


def card_node(name: str, folder: Path) -> dict:
    """A built-in model card's values (conf/model/NAME.yaml with `hf_config: FOLDER`): the layer
    the mapping reads from that public config, under the card's name. No digest: the card's name
    is its identity (as before cards were read from configs), so stored rows keep their keys."""
    node = resolve(f"{PREFIX}{folder}").model_node()
    return {**node, "name": name, "config_sha256": ""}


def sizes_line(layer: Layer) -> str:
    """The layer's sizes as plain integers (`moebench list`)."""
    structure = f", {layer.moe_layers} of {layer.num_layers} layers MoE" if layer.num_layers else ""
    return (
        f"{layer.name}: hidden {layer.hidden}, intermediate {layer.intermediate}, experts {layer.num_experts}, "
        f"topk {layer.topk}, shared {layer.num_shared_experts} x {layer.shared_intermediate}{structure} "
        f"({layer.model_type or 'no model_type'}, config sha256 {layer.config_sha256[:12]}, {layer.path})"
    )
