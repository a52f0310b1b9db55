"""Hydra-style overrides -> one typed config -> one `Combo` (moebench/config/spec.py).

`compose_config` composes one combination's config (no sweep values) the way Hydra's
compose() does, at a fraction of its cost; `check_values` refuses bad values with a
clear error; `to_combo` makes the frozen spec every later step uses.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Optional

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from moebench.config import hf, names, paths
from moebench.config.device import resolve_device
from moebench.config.schema import GROUPS, group_schemas, register_schemas
from moebench.config.spec import Combo, knob_meta

# old key -> new key: a clear error (and results/README's commands rendered through it)
RENAMED = {
    "experts.fp8_layout": "experts.row_layout",
    "extra.pplx_mode": "backend.pplx_mode",
}


def rename(override: str) -> str:
    """An override as it is spelled today ('+extra.pplx_mode=x' -> 'backend.pplx_mode=x')."""
    key, sep, value = override.partition("=")
    bare = key.lstrip("+~")
    return f"{RENAMED[bare]}{sep}{value}" if bare in RENAMED else override


@lru_cache(maxsize=1)
def _init_hydra() -> None:
    knob_meta()  # before the schemas: a plugin whose knob clashes with moebench's fields is disabled first
    register_schemas()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    initialize_config_dir(config_dir=str(paths.conf_dir()), version_base=None)


def _registered(group: str) -> set[str]:
    """Entries registered for a group without a conf/ file of their own (plugins)."""
    if group not in ("backend", "experts"):
        return set()
    from moebench.kernels import registry

    registry.discover()
    disabled = {name for kind, name in registry.DISABLED if kind == group}  # their rows say why
    return set(registry.BACKENDS if group == "backend" else registry.EXPERTS) | disabled


def group_options(group: str) -> list[str]:
    extra = set(names.NOT_IMPLEMENTED) if group == "quant" else set()  # accepted: their rows are skipped
    return sorted({p.stem for p in (paths.conf_dir() / group).glob("*.yaml")} | _registered(group) | extra)


@lru_cache(maxsize=None)
def _group_node(group: str, option: str):
    if group == "model" and hf.is_hf(option):  # a Hugging Face config.json (config/hf.py)
        return OmegaConf.create(hf.resolve(option).model_node())
    if group == "quant":  # vLLM's names (config/names.py)
        option = names.quant_option(option)
        if option in names.NOT_IMPLEMENTED:  # accepted; its rows are skipped (config/validity.py)
            return OmegaConf.create({"name": option})
    path = paths.conf_dir() / group / f"{option}.yaml"
    if path.exists():
        node = OmegaConf.load(path)
        if group == "model" and isinstance(node, DictConfig) and "hf_config" in node:  # a card of a public config
            return OmegaConf.create(hf.card_node(str(node.name), paths.hf_configs_dir() / str(node.hf_config)))
        return node
    if option in _registered(group):  # an entry registered from outside: its knobs are its config
        return OmegaConf.create({"name": option})
    hint = ""
    if group in ("backend", "experts"):  # the option may be a broken plugin's (docs/plugins.md)
        from moebench.config.plugins import problems

        hint = "".join(f"; {line}" for line in problems())
    valid = group_options(group) + (sorted(names.QUANT_ALIASES) if group == "quant" else [])
    near = names.did_you_mean(option, valid)
    raise ValueError(f"unknown {group}={option!r}{near or ';'} valid options: {', '.join(valid)}{hint}")


@lru_cache(maxsize=1)
def _defaults() -> dict:
    """Group choices of conf/config.yaml's defaults list."""
    data = yaml.safe_load((paths.conf_dir() / "config.yaml").read_text())
    out = {}
    for item in data.get("defaults", []):
        if isinstance(item, dict):
            out.update(item)
    return out


@lru_cache(maxsize=4096)
def _parse_one(raw: str):
    """One override parsed by Hydra's grammar, once per string: a sweep's combinations are
    made of a few dozen distinct overrides, and the ANTLR parse of each (~3 ms) was most of
    planning a sweep (1008 combinations: 10,094 parses). The parsed Override is only read."""
    return OverridesParser.create().parse_overrides([raw])[0]


def compose_config(overrides: list[str]) -> dict:
    """Compose one combination's config (no sweep values) into plain containers.

    Same result as Hydra's compose() for group choices and `key=value` overrides
    (tests/config/test_configs.py checks that): each group option is merged into its typed
    schema once and cached, so a misspelled key or a wrong type still fails here.
    """
    return {g: _copy(node) for g, node in compose_shared(overrides).items()}


def compose_shared(overrides: list[str]) -> dict:
    """compose_config's answer without the copy: each group is the cached dict that every
    combination choosing that group option shares, so the caller must not change it. What
    planning a sweep reads (run/plan.py): per combination it costs a dict of cached groups."""
    try:
        for raw in overrides:
            _parse_one(raw)
    except HydraException as e:
        raise ValueError(f"cannot parse overrides {list(overrides)}: {e}") from None
    choices = dict(_defaults())
    per_group: dict[str, list[str]] = {}
    for raw in overrides:
        what, key, value = _meaning(raw)
        if what == "choice":
            choices[key] = value
        else:
            per_group.setdefault(key, []).append(value)
    return {g: _typed_group(g, choices[g], tuple(per_group.get(g, ()))) for g in GROUPS}


@lru_cache(maxsize=4096)
def _meaning(raw: str) -> tuple[str, str, str]:
    """("choice", group, option) or ("value", group, "sub.key=value") of one parsed override;
    ValueError for one compose_config does not take."""
    ov = _parse_one(raw)
    if ov.is_sweep_override():
        raise ValueError(f"{ov.input_line!r} sweeps several values: use `moebench sweep`")
    key = ov.key_or_group
    if key in RENAMED:
        raise ValueError(f"{key} is now {RENAMED[key]}: use {RENAMED[key]}={ov.get_value_element_as_str()}")
    if ov.is_delete() or ov.is_force_add() or ov.is_add():
        raise ValueError(
            f"unsupported override {ov.input_line!r}: use key=value or group=option "
            "(entries declare their knobs: `moebench list --knobs`)"
        )
    if key in GROUPS:
        value = ov.value()  # `hf:ORG/NAME` as given (the element's string escapes the colon)
        return "choice", key, value if isinstance(value, str) else ov.get_value_element_as_str()
    group, _, sub = key.partition(".")
    if group not in GROUPS or not sub:
        near = names.did_you_mean(group, GROUPS)
        raise ValueError(f"unknown config key {key!r}{near or ';'} groups: {', '.join(GROUPS)}")
    return "value", group, f"{sub}={ov.get_value_element_as_str()}"


def _copy(node):
    """A copy of a cached group (dicts, lists and scalars): the caller may change it. A tenth of
    copy.deepcopy's cost, which was a quarter of planning the default sweep."""
    if isinstance(node, dict):
        return {k: _copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy(v) for v in node]
    return node


@lru_cache(maxsize=None)
def _typed_group(group: str, option: str, values: tuple[str, ...]) -> dict:
    """One group's option merged into its schema, with `sub.key=value` overrides."""
    knob_meta()
    node = OmegaConf.merge(OmegaConf.structured(group_schemas()[group]), _group_node(group, option))
    try:
        for raw in values:
            ov = OverridesParser.create().parse_overrides([raw])[0]
            key = ov.key_or_group
            if OmegaConf.select(node, key, default="__missing__") == "__missing__":
                near = names.did_you_mean(key, [str(k) for k in node], prefix=f"{group}.")
                raise ValueError(
                    f"unknown config key '{group}.{key}'{near} (see conf/{group}/, "
                    "moebench/config/schema.py and `moebench list --knobs`)"
                )
            OmegaConf.update(node, key, ov.value(), merge=True)
        out = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
        assert isinstance(out, dict)  # a group's schema is a dataclass: a DictConfig
        return names.resolve_quant(option, out) if group == "quant" else out
    except ValueError:
        raise
    # an override that does not parse; omegaconf's wrong key or type
    except (HydraException, OmegaConfBaseException) as e:
        raise ValueError(f"config error in {group}={option} {list(values)}: {e}") from None


def compose_with_hydra(overrides: list[str]) -> dict:
    """Hydra's own compose (slow: ~0.1 s); the tests check compose_config against it."""
    _init_hydra()
    cfg = compose(config_name="config", overrides=list(overrides))
    out = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(out, dict)  # Hydra composes a DictConfig
    return out


CHOICES = {
    ("workload", "routing"): ("uniform", "balanced", "zipf", "imbalanced_experts", "imbalanced_ranks", "replay"),
    ("runner", "timing"): ("auto", "events", "graph", "profiler"),
    ("runner", "device"): ("auto", "cpu", "cuda"),
}
POSITIVE = (
    ("runner", "reps"),
    ("runner", "timeout_s"),
    ("runner", "startup_timeout_s"),
    ("runner", "world_size"),
    ("runner", "phase_reps"),
    ("model", "hidden"),
    ("model", "intermediate"),
    ("model", "num_experts"),
    ("model", "topk"),
    ("backend", "simulate_ep"),
    ("backend", "simulate_tp"),
    ("trace", "samples"),
)
NON_NEGATIVE = (
    ("runner", "warmup"),
    ("runner", "warmup_ms"),
    ("runner", "nvml_poll_ms"),
    ("runner", "graph_max_tokens"),
    ("overlap", "shared_sm_carveout"),
    ("model", "num_shared_experts"),
    ("model", "shared_intermediate"),
)
_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


def parse_bytes(text) -> int:
    """'16GiB' / '1.5GB' / '4096' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size: give bytes, or a number with KiB, MiB, GiB (or KB, MB, GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def check_values(cfg: dict) -> None:
    """Bad values in a composed config: a clear error before any work starts."""
    for (g, k), valid in CHOICES.items():
        if cfg[g][k] not in valid:
            raise ValueError(f"{g}.{k}={cfg[g][k]!r}; valid: {', '.join(valid)}")
    for g, k in POSITIVE:
        if not cfg[g][k] > 0:
            raise ValueError(f"{g}.{k}={cfg[g][k]!r} must be > 0")
    for g, k in NON_NEGATIVE:
        if cfg[g][k] < 0:
            raise ValueError(f"{g}.{k}={cfg[g][k]!r} must be >= 0")
    m = cfg["model"]
    if m["topk"] > m["num_experts"]:
        raise ValueError(f"model.topk={m['topk']} exceeds model.num_experts={m['num_experts']}")
    tokens = cfg["workload"]["tokens_per_rank"]
    if not tokens:
        raise ValueError("workload.tokens_per_rank=[] holds no token count: give at least one, e.g. [16,64]")
    bad = [t for t in tokens if not isinstance(t, int) or t < 1]
    if bad:
        raise ValueError(f"workload.tokens_per_rank={list(tokens)}: token counts must be integers >= 1 (got {bad})")
    dup = sorted({t for t in tokens if list(tokens).count(t) > 1})
    if dup:
        raise ValueError(f"workload.tokens_per_rank={list(tokens)} lists {dup} twice: give each count once")
    parse_bytes(cfg["runner"]["memory_budget"])
    _check_routing(cfg)
    meta = knob_meta()
    for group in ("backend", "experts"):
        for name, value in cfg[group].items():
            knob = meta.get(name)
            why = knob.check(value) if knob is not None else None
            if why:
                raise ValueError(f"{group}.{name}={why}")


def _check_routing(cfg: dict) -> None:
    """The routing keys of a composed config (routing/generate.py, routing/file.py): a
    recording that cannot be replayed on this model, an imbalance out of reach, a fill outside
    (0, 1], a simulate_rank without simulate_ep."""
    from moebench.routing import rules

    w, m, b = cfg["workload"], cfg["model"], cfg["backend"]
    routing = w["routing"]
    if routing == "replay":
        from moebench.routing import file  # numpy: only where a recording is read

        if not w["routing_file"]:
            raise ValueError(
                "workload.routing=replay needs workload.routing_file=PATH (a recording, .npz: docs/routing.md)"
            )
        file.load(
            routing_file(cfg), None if w["routing_layer"] < 0 else w["routing_layer"], m["num_experts"], m["topk"]
        )
    # other routings leave routing_file and routing_layer out of the combination (to_combo): a
    # sweep crossing routings names the recording once, for its replay rows
    # EP-N's own limits (imbalanced_ranks) are validity.py's: a sweep may cross backends
    spec = rules.RoutingSpec(name=routing, imbalance=float(w["imbalance"]), ep_size=1)
    why = rules.check(spec, m["num_experts"], m["topk"])
    if why:
        raise ValueError(why)
    if not 0.0 <= w["fill"] <= 1.0:
        raise ValueError(f"workload.fill={w['fill']!r} must be in (0, 1] (0: the layout's own rows per expert)")
    if b["simulate_tp"] > 1 and b["simulate_ep"] > 1:
        raise ValueError(
            f"backend.simulate_tp={b['simulate_tp']} with backend.simulate_ep={b['simulate_ep']}: expert "
            "parallelism replaces the experts' TP split (as in vLLM), so a rank is one or the other: set one to 1"
        )
    rank = _sim_rank(b)
    if rank:
        if rank != "hottest" and not rank.isdigit():
            raise ValueError(f"backend.simulate_rank={rank!r}; valid: hottest, or a rank 0 .. simulate_ep-1")
        if b["simulate_ep"] <= 1:
            raise ValueError(f"backend.simulate_rank={rank} emulates a rank of EP-N: set backend.simulate_ep=N too")
        if rank.isdigit() and int(rank) >= b["simulate_ep"]:
            raise ValueError(
                f"backend.simulate_rank={rank} is not a rank of EP-{b['simulate_ep']} (0 .. {b['simulate_ep'] - 1})"
            )


def to_combo(cfg: dict, device: Optional[str] = None) -> Combo:
    """The Combo of a composed config. Fields that cannot matter are set to their defaults,
    so that two configs measuring the same thing have one key: world_size for single-rank
    backends, simulate_ep for EP backends, skew without zipf routing, graph_max_tokens
    outside graph timing (auto replays graphs at every size). Knobs: only those the chosen
    backend and experts declare."""
    from moebench.kernels import registry

    b, m, r, w = cfg["backend"], cfg["model"], cfg["runner"], cfg["workload"]
    single = registry.entry("backend", b["name"]).single_rank if b["name"] in registry.BACKENDS else False
    declared = set()
    for kind, name in (("backend", b["name"]), ("experts", cfg["experts"]["name"])):
        table = registry.BACKENDS if kind == "backend" else registry.EXPERTS
        if name in table:
            declared |= {(kind, k.name) for k in table[name].knobs}
    knobs = tuple(sorted((k, cfg[g][k]) for g, k in declared))
    timing = r["timing"]
    replay = w["routing"] == "replay"
    return Combo(
        backend=b["name"],
        experts=cfg["experts"]["name"],
        reduction=cfg["reduction"]["name"],
        overlap=cfg["overlap"]["name"],
        quant=cfg["quant"]["name"],
        model=m["name"],
        hidden=m["hidden"],
        intermediate=m["intermediate"],
        num_experts=m["num_experts"],
        topk=m["topk"],
        num_shared_experts=m["num_shared_experts"],
        shared_intermediate=m["shared_intermediate"],
        model_config_sha256=m["config_sha256"],
        device=device or resolve_device(r["device"]),
        world_size=1 if single else r["world_size"],
        simulate_ep=b["simulate_ep"] if single else 1,
        shared_sm_carveout=cfg["overlap"]["shared_sm_carveout"],
        simulate_rank=_sim_rank(b) if single and b["simulate_ep"] > 1 else "",
        simulate_tp=b["simulate_tp"],
        routing=w["routing"],
        skew=float(w["skew"]) if w["routing"] == "zipf" else 1.2,
        seed=w["seed"],
        imbalance=float(w["imbalance"]) if w["routing"].startswith("imbalanced") else 2.0,
        routing_file_sha256=_digest(cfg) if replay else "",
        routing_file=routing_file(cfg) if replay else "",
        routing_layer=w["routing_layer"] if replay else -1,
        fill=float(w["fill"]),
        timing=timing,
        graph_max_tokens=r["graph_max_tokens"] if timing == "graph" else 256,
        l2_flush=r["l2_flush"],
        memory_budget=parse_bytes(r["memory_budget"]),
        trace=cfg["trace"]["name"],
        knobs=knobs,
        reps=r["reps"],
        warmup=r["warmup"],
        warmup_ms=float(r["warmup_ms"]),
        phase_reps=r["phase_reps"],
        nvml_poll_ms=float(r["nvml_poll_ms"]),
        drop_throttled=r["drop_throttled"],
        timeout_s=float(r["timeout_s"]),
        startup_timeout_s=float(r["startup_timeout_s"]),
        check=r["check"],
        memory=r["memory"],
        trace_samples=cfg["trace"]["samples"],
        trace_dir=cfg["trace"]["dir"],
    )


def _sim_rank(b: dict) -> str:
    """backend.simulate_rank as the spec holds it: "" (also spelled none: a sweep's list cannot
    hold an empty value), hottest, or a rank."""
    rank = str(b["simulate_rank"])
    return "" if rank in ("none", "None") else rank


def routing_file(cfg: dict) -> str:
    """workload.routing_file with `%model%` replaced by the model's name, so that one sweep over
    several models replays each one's own recording (sweeps/routing.yaml)."""
    return str(cfg["workload"]["routing_file"]).replace("%model%", cfg["model"]["name"])


def _digest(cfg: dict) -> str:
    from moebench.routing import file

    w = cfg["workload"]
    return file.load(routing_file(cfg), None if w["routing_layer"] < 0 else w["routing_layer"]).sha256


def set_knobs(cfg: dict) -> list[str]:
    """'backend.num_sms' for each knob the config sets off its default (for the check that
    some chosen entry takes it)."""
    meta = knob_meta()
    return [f"{g}.{k}" for g in ("backend", "experts") for k, v in cfg[g].items() if k in meta and v != meta[k].default]
