"""Sweep overrides -> Combinations, expanded with Hydra's override parser, and
the validity rules of DESIGN.md (a combination that fails one is a skipped row
with its reason, never an exception)."""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from . import paths
from .schema import GROUP_SCHEMAS, GROUPS, BackendConf, register_schemas

LOCAL_BACKENDS = ("local", "local_batched")
NVSHMEM_BACKENDS = ("deepep_ll", "pplx")  # each initialises NVSHMEM once per process
TOLERANCE = {"bf16": 2e-2, "fp8_block": 6e-2, "fp8_tensor": 1e-1}
# identity of a combination (everything but the token count); resume keys on it
IDENTITY_KEYS = (
    "backend", "experts", "reduction", "overlap", "model", "num_experts", "topk", "hidden",
    "intermediate", "num_shared_experts", "shared_intermediate", "quant", "world_size",
    "simulate_ep", "max_tokens_per_rank", "num_sms", "dispatch_nvl_chunk",
    "combine_nvl_chunk", "shared_sm_carveout", "deepgemm_min_tokens", "row_layout", "routing", "skew",
    "seed", "timing_mode", "graph_max_tokens", "l2_flush", "trace", "device", "extra",
)
# keys added later: left out of the key at their default, so earlier runs' keys still resume
DEFAULT_OMITTED = {"dispatch_nvl_chunk": 0, "combine_nvl_chunk": 0, "shared_sm_carveout": 0, "row_layout": "auto"}

RENAMED = {"experts.fp8_layout": "experts.row_layout"}  # old key -> new (a clear error, not 'unknown key')


@dataclass
class Combination:
    """One resolved combination: a plain config dict and its token counts."""

    cfg: dict  # the fully resolved config (plain containers)
    overrides: list[str]
    combo: dict = field(default_factory=dict)  # flat view used by supports()
    reason: Optional[str] = None  # why it cannot run (all token counts)
    token_reasons: dict = field(default_factory=dict)  # tokens -> reason

    @property
    def key(self) -> str:
        ident = {k: self.combo[k] for k in IDENTITY_KEYS
                 if k not in DEFAULT_OMITTED or self.combo.get(k, DEFAULT_OMITTED[k]) != DEFAULT_OMITTED[k]}
        return hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def tokens(self) -> list[int]:
        return list(self.combo["tokens_per_rank"])

    @property
    def runnable_tokens(self) -> list[int]:
        if self.reason:
            return []
        return [t for t in self.tokens if t not in self.token_reasons]

    @property
    def label(self) -> str:
        c = self.combo
        s = f"{c['backend']}/{c['experts']}/{c['reduction']}/{c['overlap']}/{c['quant']}/{c['model']}"
        if c["world_size"] > 1:
            s += f"/ws{c['world_size']}"
        if c["simulate_ep"] > 1:
            s += f"/sim_ep{c['simulate_ep']}"
        # knobs off their defaults (so that a sweep over them has distinct labels)
        if c["backend"] == "deepep_ht" and c["num_sms"] != BackendConf.num_sms:
            s += f"/sms{c['num_sms']}"
        for k, tag in (("dispatch_nvl_chunk", "dchunk"), ("combine_nvl_chunk", "cchunk"), ("shared_sm_carveout", "carve")):
            if c.get(k):
                s += f"/{tag}{c[k]}"
        if c.get("row_layout", "auto") != "auto":
            s += f"/{c['row_layout']}"
        return s

    @property
    def family(self) -> tuple:
        """Combinations of one family may share a process group. NVSHMEM backends
        get their own; deepep_ll (and pplx over NVSHMEM) one per buffer shape, since its one NVSHMEM buffer
        is sized by (hidden, experts, max tokens) and NVSHMEM initialises once per process."""
        c = self.combo
        b = c["backend"]
        fam = (c["world_size"], c["device"], b if b in NVSHMEM_BACKENDS else "")
        if b == "deepep_ll" or (b == "pplx" and (c.get("extra") or {}).get("pplx_mode") == "internode"):
            fam += (c["hidden"], c["num_experts"], c["max_tokens_per_rank"])
        return fam


# ---------------------------------------------------------------------------
# composing


@lru_cache(maxsize=1)
def _init_hydra() -> None:
    register_schemas()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    initialize_config_dir(config_dir=str(paths.conf_dir()), version_base=None)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (paths.conf_dir() / group).glob("*.yaml"))


@lru_cache(maxsize=None)
def _group_node(group: str, option: str):
    valid = group_options(group)
    if option not in valid:
        raise ValueError(f"unknown {group}={option!r}; valid options: {', '.join(valid)}")
    return OmegaConf.load(paths.conf_dir() / group / f"{option}.yaml")


@lru_cache(maxsize=1)
def _defaults() -> dict:
    """Group choices of conf/config.yaml's defaults list."""
    data = yaml.safe_load((paths.conf_dir() / "config.yaml").read_text())
    out = {}
    for item in data.get("defaults", []):
        if isinstance(item, dict):
            out.update(item)
    return out


def compose_config(overrides: list[str]) -> dict:
    """Compose one combination's config (no sweep values) into plain containers.

    Same result as Hydra's compose() for group choices and `key=value`
    overrides (tests/test_configs.py checks that), at a fraction of its cost:
    each group option is merged into its typed schema once and cached, so a
    misspelled key or a wrong type still fails here.
    """
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ValueError(f"cannot parse overrides {overrides}: {e}") from None
    choices = dict(_defaults())
    per_group: dict[str, list[str]] = {}
    extra: dict = {}
    for ov in parsed:
        if ov.is_sweep_override():
            raise ValueError(f"{ov.input_line!r} sweeps several values: use `moebench sweep`")
        key = ov.key_or_group
        if ov.is_delete() or ov.is_force_add():
            raise ValueError(f"unsupported override {ov.input_line!r}: use key=value or group=option")
        if key in GROUPS:
            choices[key] = ov.get_value_element_as_str()
        elif ov.is_add() and key.startswith("extra."):
            extra[key[len("extra."):]] = ov.value()
        elif ov.is_add():
            raise ValueError(f"'+{key}': only extra.* keys may be added")
        else:
            if key in RENAMED:
                raise ValueError(f"{key} was renamed to {RENAMED[key]} (it picks the row layout for bf16 too)")
            group, _, sub = key.partition(".")
            if group not in GROUPS or not sub:
                raise ValueError(f"unknown config key {key!r}; groups: {', '.join(GROUPS)}")
            per_group.setdefault(group, []).append(f"{sub}={ov.get_value_element_as_str()}")
    cfg = {g: _typed_group(g, choices[g], tuple(per_group.get(g, ()))) for g in GROUPS}
    cfg["extra"] = extra
    return copy.deepcopy(cfg)


@lru_cache(maxsize=None)
def _typed_group(group: str, option: str, values: tuple[str, ...]) -> dict:
    """One group's option merged into its schema, with `sub.key=value` overrides."""
    node = OmegaConf.merge(OmegaConf.structured(GROUP_SCHEMAS[group]), _group_node(group, option))
    try:
        for raw in values:
            ov = OverridesParser.create().parse_overrides([raw])[0]
            key = ov.key_or_group
            if OmegaConf.select(node, key, default="__missing__") == "__missing__":
                raise ValueError(f"unknown config key '{group}.{key}' (see conf/{group}/ and moebench/schema.py)")
            OmegaConf.update(node, key, ov.value(), merge=True)
        return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except ValueError:
        raise
    except Exception as e:  # omegaconf validation errors (wrong key or type)
        raise ValueError(f"config error in {group}={option} {list(values)}: {e}") from None


def compose_with_hydra(overrides: list[str]) -> dict:
    """Hydra's own compose (slow: ~0.1 s); the tests check compose_config against it."""
    _init_hydra()
    cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def load_sweep(name_or_path: str) -> dict:
    """A sweep file: {'description': str, 'overrides': {key: value-or-sweep-string}}."""
    p = Path(name_or_path)
    if not p.suffix:
        p = paths.sweeps_dir() / f"{name_or_path}.yaml"
    if not p.exists():
        valid = sorted(x.stem for x in paths.sweeps_dir().glob("*.yaml"))
        raise ValueError(f"no sweep {name_or_path!r}; named sweeps: {', '.join(valid)}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{p} is not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("overrides", {}), dict):
        raise ValueError(f"{p}: expected a mapping with 'description' and 'overrides: {{key: value(s)}}'")
    bad = [k for k, v in data.get("overrides", {}).items() if isinstance(v, dict)]
    if bad:
        raise ValueError(f"{p}: overrides {bad} must be a value, a comma list or a [list], not a mapping")
    data.setdefault("overrides", {})
    data["name"] = p.stem
    return data


def _value_str(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


def expand(sweep_overrides: dict, cli_overrides: list[str]) -> list[list[str]]:
    """Cartesian product of sweep values; CLI overrides replace the sweep file's
    value for the same key."""
    merged: dict[str, str] = {k: f"{k}={_value_str(v)}" for k, v in sweep_overrides.items()}
    parser = OverridesParser.create()
    try:
        parsed_cli = parser.parse_overrides(list(cli_overrides))
    except HydraException as e:
        raise ValueError(f"cannot parse overrides {cli_overrides}: {e}") from None
    for raw, ov in zip(cli_overrides, parsed_cli):
        merged[ov.key_or_group] = raw
    axes: list[list[str]] = []
    for raw in merged.values():
        try:
            ov = parser.parse_overrides([raw])[0]
        except HydraException as e:
            raise ValueError(f"cannot parse override {raw!r}: {e}") from None
        if ov.is_sweep_override():
            key = ov.get_key_element()  # keeps a leading '+'
            axes.append([f"{key}={v}" for v in ov.sweep_string_iterator()])
        else:
            axes.append([raw])
    return [list(p) for p in itertools.product(*axes)]


# ---------------------------------------------------------------------------
# validity


def resolve_device(requested: str) -> str:
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def flat_combo(cfg: dict) -> dict:
    """The flat dict every supports(combo) receives."""
    b, m, r = cfg["backend"], cfg["model"], cfg["runner"]
    local = b["name"] in LOCAL_BACKENDS
    return {
        "backend": b["name"],
        "experts": cfg["experts"]["name"],
        "reduction": cfg["reduction"]["name"],
        "overlap": cfg["overlap"]["name"],
        "model": m["name"],
        "hidden": m["hidden"],
        "intermediate": m["intermediate"],
        "num_experts": m["num_experts"],
        "topk": m["topk"],
        "num_shared_experts": m["num_shared_experts"],
        "shared_intermediate": m["shared_intermediate"],
        "quant": cfg["quant"]["name"],
        "world_size": 1 if local else r["world_size"],
        "simulate_ep": b["simulate_ep"] if local else 1,
        "max_tokens_per_rank": b["max_tokens_per_rank"],
        "num_sms": b["num_sms"],
        "dispatch_nvl_chunk": b["dispatch_nvl_chunk"],
        "combine_nvl_chunk": b["combine_nvl_chunk"],
        "shared_sm_carveout": cfg["overlap"]["shared_sm_carveout"],
        "deepgemm_min_tokens": cfg["experts"]["deepgemm_min_tokens"],
        "row_layout": cfg["experts"].get("row_layout", "auto"),
        "routing": cfg["workload"]["routing"],
        "skew": cfg["workload"]["skew"],
        "seed": cfg["workload"]["seed"],
        "tokens_per_rank": list(cfg["workload"]["tokens_per_rank"]),
        "timing_mode": r["timing"],
        "graph_max_tokens": r["graph_max_tokens"],
        "l2_flush": r["l2_flush"],
        "device": resolve_device(r["device"]),
        "trace": cfg["trace"]["name"],
        "extra": dict(cfg.get("extra", {})),
    }


CHOICES = {
    ("workload", "routing"): ("uniform", "balanced", "zipf"),
    ("runner", "timing"): ("events", "graph", "profiler"),
    ("runner", "device"): ("auto", "cpu", "cuda"),
    ("experts", "row_layout"): ("auto", "gathered", "contiguous"),
}
POSITIVE = (("runner", "reps"), ("runner", "timeout_s"), ("runner", "world_size"), ("runner", "phase_reps"),
            ("model", "hidden"), ("model", "intermediate"), ("model", "num_experts"), ("model", "topk"),
            ("backend", "simulate_ep"), ("backend", "max_tokens_per_rank"))


def check_values(cfg: dict) -> None:
    """Bad values in a composed config: a clear error before any work starts."""
    for (g, k), valid in CHOICES.items():
        if cfg[g][k] not in valid:
            raise ValueError(f"{g}.{k}={cfg[g][k]!r}; valid: {', '.join(valid)}")
    for g, k in POSITIVE:
        if not cfg[g][k] > 0:
            raise ValueError(f"{g}.{k}={cfg[g][k]!r} must be > 0")
    for g, k in (("runner", "warmup"), ("runner", "warmup_ms"), ("backend", "dispatch_nvl_chunk"),
                 ("backend", "combine_nvl_chunk"), ("overlap", "shared_sm_carveout")):
        if cfg[g][k] < 0:
            raise ValueError(f"{g}.{k}={cfg[g][k]!r} must be >= 0")
    m = cfg["model"]
    if m["topk"] > m["num_experts"]:
        raise ValueError(f"model.topk={m['topk']} exceeds model.num_experts={m['num_experts']}")


def validate(combo: dict) -> Optional[str]:
    """Reason this combination cannot run (every token count), or None."""
    from .kernels import registry
    from .kernels.experts.triton import CONTIGUOUS_QUANTS

    registry.discover()
    b, e = combo["backend"], combo["experts"]
    if b not in registry.BACKENDS:
        return f"backend={b} has no implementation registered in this build"
    if e not in registry.EXPERTS:
        return f"experts={e} has no implementation registered in this build"
    B, X = registry.BACKENDS[b], registry.EXPERTS[e]
    if B.activation_format != X.activation_format:
        return (
            f"layouts differ: backend={b} produces the {B.activation_format.value} layout, "
            f"experts={e} reads {X.activation_format.value}"
        )
    if B.activation_format.value == "batched" and combo["reduction"] != "finalize":
        return f"batched backend={b} weights and reduces in its combine: only reduction=finalize"
    if combo["overlap"] != "none" and combo["num_shared_experts"] == 0:
        return f"overlap={combo['overlap']} needs shared experts; model={combo['model']} has none"
    carveout = combo.get("shared_sm_carveout", 0)
    if carveout and combo["num_shared_experts"] == 0:
        return f"overlap.shared_sm_carveout={carveout} applies to shared experts; model={combo['model']} has none"
    if carveout and combo["device"] != "cuda":
        return f"overlap.shared_sm_carveout={carveout} leaves GPU SMs free (cuBLASLt): it needs CUDA"
    layout = combo.get("row_layout", "auto")
    if layout != "auto" and (e != "triton" or combo["quant"] not in CONTIGUOUS_QUANTS):
        return (f"experts.row_layout={layout} picks the row layout of experts=triton with quant="
                f"{' or '.join(CONTIGUOUS_QUANTS)} only")
    if b != "deepep_ht" and (combo.get("dispatch_nvl_chunk") or combo.get("combine_nvl_chunk")):
        return "backend.dispatch_nvl_chunk / combine_nvl_chunk configure DeepEP's intranode kernels: backend=deepep_ht only"
    E, ws, sim = combo["num_experts"], combo["world_size"], combo["simulate_ep"]
    if b in LOCAL_BACKENDS:
        if E % sim:
            return f"simulate_ep={sim} does not divide num_experts={E}"
    else:
        if sim != 1:
            return "simulate_ep applies to local backends only"
        if ws < 2:
            return f"backend={b} is an EP backend: it needs runner.world_size >= 2 (one rank per GPU)"
        if E % ws:
            return f"world_size={ws} does not divide num_experts={E}"
    q = combo["quant"]
    if q == "fp8_block" and (combo["hidden"] % 128 or combo["intermediate"] % 128):
        return f"fp8_block needs hidden and intermediate multiples of 128 (got {combo['hidden']}, {combo['intermediate']})"
    if e.startswith("deepgemm") and q != "fp8_block":
        return f"experts={e} (DeepGEMM) needs quant=fp8_block"
    if combo["timing_mode"] == "profiler" and combo["device"] != "cuda":
        return "timing=profiler reports GPU kernel durations: it needs CUDA"
    for cls in (B, X):
        reason = cls.supports(combo)
        if reason:
            return reason
    return None


def validate_tokens(combo: dict, tokens: int) -> Optional[str]:
    """Reason one token count cannot run (e.g. over a batched buffer's cap)."""
    from .kernels import registry

    B, X = registry.BACKENDS[combo["backend"]], registry.EXPERTS[combo["experts"]]
    if combo["timing_mode"] == "graph" and tokens <= combo["graph_max_tokens"]:
        # above graph_max_tokens, graph mode times with events
        if combo["device"] != "cuda":
            return "timing=graph needs CUDA"
        if not B.graph_capturable:
            return f"backend={combo['backend']} cannot be captured in a CUDA graph: use runner.timing=events"
        if not X.graph_capturable:
            return f"experts={combo['experts']} syncs the host (data-dependent sizes): no CUDA graph; use runner.timing=events"
    if tokens < 1:
        return f"tokens_per_rank={tokens} must be >= 1"
    if B.activation_format.value == "batched" and tokens > combo["max_tokens_per_rank"]:
        return (
            f"{tokens} tokens per rank exceed the batched buffers' cap "
            f"backend.max_tokens_per_rank={combo['max_tokens_per_rank']}"
        )
    return None


def check_world_size(combos: list[Combination]) -> None:
    """Refuse a device or world size the machine lacks, with the numbers, before any work."""
    if any(c.combo["device"] not in ("cpu", "cuda") for c in combos):
        raise ValueError("runner.device must be auto, cpu or cuda")
    cuda = [c for c in combos if c.combo["device"] == "cuda" and not c.reason]
    if not cuda:
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError("runner.device=cuda but no CUDA GPU is visible: use runner.device=cpu or auto")
    need, have = max(c.combo["world_size"] for c in cuda), torch.cuda.device_count()
    if need > have:
        raise ValueError(
            f"runner.world_size={need} needs {need} GPUs (one rank per GPU) but this machine has {have}: "
            f"set runner.world_size<={have} or run on a larger machine"
        )
    carveout = max(c.combo.get("shared_sm_carveout", 0) for c in cuda)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if carveout >= sms:
        raise ValueError(
            f"overlap.shared_sm_carveout={carveout} leaves no SM for the shared experts: this GPU has {sms} SMs"
        )


def plan(cli_overrides: list[str], sweep: Optional[str] = None) -> tuple[list[Combination], dict]:
    """Expand overrides (and a sweep file) into validated Combinations."""
    sweep_data = load_sweep(sweep) if sweep else {"name": "adhoc", "overrides": {}}
    combos = []
    seen = set()
    for ovs in expand(sweep_data["overrides"], cli_overrides):
        cfg = compose_config(ovs)
        check_values(cfg)
        c = Combination(cfg=cfg, overrides=ovs, combo=flat_combo(cfg))
        if c.key in seen:  # e.g. local backends with different world sizes
            continue
        seen.add(c.key)
        c.reason = validate(c.combo)
        if not c.reason:
            for t in c.tokens:
                r = validate_tokens(c.combo, t)
                if r:
                    c.token_reasons[t] = r
        combos.append(c)
    check_world_size(combos)
    return combos, sweep_data


def run_name(sweep_name: str, cli_overrides: list[str]) -> str:
    """Default run directory name: the same command resumes into the same place."""
    h = hashlib.sha1("\0".join(sorted(cli_overrides)).encode()).hexdigest()[:8]
    return f"{sweep_name}-{h}" if cli_overrides else sweep_name


def default_runs_dir() -> Path:
    return Path(os.environ.get("MOEBENCH_RUNS", "runs"))
