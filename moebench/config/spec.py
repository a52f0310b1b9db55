"""One definition of a combination: the frozen, typed `Combo`.

Every field carries its role in metadata: whether it is part of the combination's
identity (`identity`), whether a row stores it as a column of the same name
(`column`), and the tag the label shows when it is off its default (`tag`). The
combination key, the label, a row's identity columns, the loader's columns and
`compare`'s matching all derive from these fields, so they cannot drift apart.

Beside the fields, `knobs` holds the chosen entries' declared knobs (kernels/knobs.py:
backend.num_sms, experts.row_layout, a plugin's own...), each an identity field and a
column too. A field or knob at its default is left out of the key, so a knob or field
added later keeps the keys of stored rows.

A Combo is also a read-only mapping (`combo["backend"]`, `combo.get("num_sms")`): what
an entry's `supports(combo)` reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from moebench.config.schema import BackendConf, ModelConf, OverlapConf, RunnerConf, TraceConf, WorkloadConf

# a column's roles in the report (moebench/results/row.py reads them into `Column.roles`; the
# report derives its lists from them, docs/design.md "The vocabulary of columns")
AXIS = "axis"  # names a combination in every table, in this order; a caption names it even at its default
COMBO = "combo"  # names a combination where it varies within a table; a caption names it off its default
BARE = "bare"  # shown as its bare value in a combination's label (local/triton mixtral_8x7b)
WORKLOAD = "workload"  # rows equal in every workload column saw the same tokens: only they compete for fastest
MODEL_SIZE = "model size"  # shown only where it varies within one model (the model's name tells it)
PLACE = "place"  # where a row ran: what a comparison's pair shares and a figure's basis reads
REQUIRED = "required"  # a row file lacking it is malformed (no table can be drawn without it)
# how the runner measured, not what the layer is: the layer's allocations do not depend on it
# (a capped row confirms the capacity line of its layer whatever these were: report/capacity.py)
RUNNER = "runner"
_AXIS, _COMBO, _WORK, _SIZE = (AXIS, REQUIRED), (COMBO,), (COMBO, WORKLOAD), (COMBO, MODEL_SIZE)
_RUN = (COMBO, RUNNER)

_NO_DEFAULT = dataclasses.MISSING


def _f(
    default: Any = _NO_DEFAULT,
    *,
    identity: bool = True,
    column: Optional[bool] = None,
    tag: Optional[str] = None,
    doc: str = "",
    roles: tuple[str, ...] = (),
    short: str = "",
):
    """A Combo field: `column` defaults to `identity` (every identity field is stored). `roles`
    and `short`: the column's roles in the report and its short label (results/row.py: AXIS...)."""
    meta = {
        "identity": identity,
        "column": identity if column is None else column,
        "tag": tag,
        "doc": doc,
        "roles": roles,
        "short": short,
    }
    return field(default=default, metadata=meta) if default is not _NO_DEFAULT else field(metadata=meta)


@dataclass(frozen=True)
class Combo:
    # the four axes
    backend: str = _f(roles=(*_AXIS, BARE), doc="all2all backend (backend=...)")
    experts: str = _f(roles=(*_AXIS, BARE), doc="expert implementation (experts=...)")
    reduction: str = _f(roles=_AXIS, short="red", doc="top-k weight-and-reduce placement: experts | finalize")
    overlap: str = _f(roles=_AXIS, short="ovl", doc="shared-expert overlap: none | dispatch | combine")
    quant: str = _f(roles=_AXIS, doc="bf16 | fp8_block | fp8_tensor (fp8_w8a8 is stored as one of these)")
    # the layer
    model: str = _f(roles=(*_AXIS, BARE, WORKLOAD), doc="model name (conf/model/, or the name of an hf: config)")
    hidden: int = _f(roles=_SIZE, doc="K")
    intermediate: int = _f(roles=_SIZE, short="inter", doc="I per routed expert")
    num_experts: int = _f(roles=_SIZE, short="E", doc="routed experts (global)")
    topk: int = _f(roles=_SIZE)
    device: str = _f(roles=(COMBO, PLACE), doc="cpu | cuda (runner.device=auto resolved)")
    num_shared_experts: int = _f(ModelConf.num_shared_experts, roles=_SIZE)
    shared_intermediate: int = _f(ModelConf.shared_intermediate, roles=_SIZE, doc="I of one shared expert")
    model_config_sha256: str = _f(
        ModelConf.config_sha256,
        roles=_SIZE,
        short="config",
        tag="cfg{:.8}",
        doc="model=hf:...: sha256 of the config.json the layer was read from (empty: a conf/model/ card)",
    )
    # where it runs
    world_size: int = _f(
        1, roles=(*_AXIS, WORKLOAD, PLACE), short="world", tag="ws{}", doc="ranks (1 for single-rank backends)"
    )
    simulate_ep: int = _f(
        BackendConf.simulate_ep,
        roles=_WORK,
        short="sim_ep",
        tag="sim_ep{}",
        doc="single-rank backends: one rank's share of EP-N",
    )
    simulate_rank: str = _f(
        BackendConf.simulate_rank,
        roles=_WORK,
        tag="rank_{}",
        doc="simulate_ep=N: the emulated rank, hottest | K (empty: rank 0's share of one rank's tokens)",
    )
    simulate_tp: int = _f(
        BackendConf.simulate_tp,
        roles=_WORK,
        short="sim_tp",
        tag="tp{}",
        doc="single-rank backends: one rank's shard of TP-N (intermediate / N per expert, every expert)",
    )
    shared_sm_carveout: int = _f(
        OverlapConf.shared_sm_carveout,
        roles=_COMBO,
        tag="carve{}",
        doc="SMs the shared experts' GEMMs leave free (CUDA)",
    )
    # workload
    routing: str = _f(
        WorkloadConf.routing,
        roles=_WORK,
        tag="{}",
        doc="uniform | balanced | zipf | imbalanced_experts | imbalanced_ranks | replay",
    )
    skew: float = _f(WorkloadConf.skew, roles=_WORK, tag="skew{}", doc="zipf exponent (zipf routing only)")
    imbalance: float = _f(
        WorkloadConf.imbalance,
        roles=_WORK,
        tag="imb{}",
        doc="imbalanced_*: the hot expert's or rank's load over the mean",
    )
    routing_file_sha256: str = _f("", roles=_WORK, tag="rec{:.8}", doc="replay: sha256 of the recording")
    routing_layer: int = _f(
        WorkloadConf.routing_layer, roles=_WORK, tag="layer{}", doc="replay: the recording's layer (-1: its only one)"
    )
    routing_file: str = _f(
        WorkloadConf.routing_file,
        identity=False,
        column=True,
        doc="replay: the recording's path as given (not identity: its digest is)",
    )
    fill: float = _f(
        WorkloadConf.fill,
        roles=_WORK,
        tag="fill{}",
        doc="batched layouts: the busiest local expert's share of its buffer rows (0: the layout's own size)",
    )
    seed: int = _f(WorkloadConf.seed, roles=_WORK, tag="seed{}")
    # how it is measured
    timing: str = _f(RunnerConf.timing, roles=_RUN, tag="{}", doc="requested timing: auto | events | graph | profiler")
    graph_max_tokens: int = _f(
        RunnerConf.graph_max_tokens, roles=_RUN, tag="gmax{}", doc="timing=graph: CUDA graphs up to this many tokens"
    )
    l2_flush: bool = _f(RunnerConf.l2_flush, roles=_RUN, tag="noflush")
    memory_budget: int = _f(
        int(RunnerConf.memory_budget),
        roles=_RUN,
        tag="budget{}",
        doc="bytes the layer may allocate above the check's (0: no cap)",
    )
    trace: str = _f(TraceConf.name, roles=_RUN, tag="trace_{}", doc="none | nvtx | torch | nsys")
    # the chosen entries' knobs, (name, value) sorted by name; each is identity and a column
    knobs: tuple = _f((), column=False)
    # settings that do not change what is measured, only how long and how often
    reps: int = _f(RunnerConf.reps, identity=False)
    warmup: int = _f(RunnerConf.warmup, identity=False)
    warmup_ms: float = _f(RunnerConf.warmup_ms, identity=False)
    phase_reps: int = _f(RunnerConf.phase_reps, identity=False)
    nvml_poll_ms: float = _f(RunnerConf.nvml_poll_ms, identity=False)
    drop_throttled: bool = _f(RunnerConf.drop_throttled, identity=False)
    timeout_s: float = _f(RunnerConf.timeout_s, identity=False)
    startup_timeout_s: float = _f(
        RunnerConf.startup_timeout_s, identity=False, doc="s for a process group to form (every rank joined)"
    )
    check: bool = _f(RunnerConf.check, identity=False)
    memory: bool = _f(RunnerConf.memory, identity=False)
    trace_samples: int = _f(TraceConf.samples, identity=False)
    trace_dir: str = _f(TraceConf.dir, identity=False)

    # -- mapping view (what supports(combo) reads) ----------------------------------
    def __getitem__(self, name: str) -> Any:
        if name in _FIELD_NAMES:
            return getattr(self, name)
        for k, v in self.knobs:
            if k == name:
                return v
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:
        return name in _FIELD_NAMES or any(k == name for k, _ in self.knobs)

    def keys(self) -> Iterator[str]:
        yield from _FIELD_NAMES
        yield from (k for k, _ in self.knobs)

    @property
    def tp_size(self) -> int:
        """The experts' TP split: world_size on a tensor_parallel backend (backend=tp), else
        simulate_tp (one rank's shard timed on one GPU): kernels/split.py's rule."""
        from moebench.kernels import registry

        return registry.ep_split(self).tp

    @property
    def intermediate_per_rank(self) -> int:
        """One rank's width of each routed expert: intermediate / tp_size (vLLM's
        intermediate_size_per_partition; the tuned files' N)."""
        return self.intermediate // self.tp_size

    @property
    def shared_intermediate_per_rank(self) -> int:
        """One rank's width of each shared expert (vLLM shards them with the same TP split)."""
        return self.shared_intermediate // self.tp_size

    @property
    def options(self) -> dict:
        """The knobs as KernelContext.options ({name: value})."""
        return dict(self.knobs)

    # -- identity ---------------------------------------------------------------------
    def identity(self) -> dict:
        """The fields and knobs that make the key: identity fields off their defaults (and
        those without one), knobs off their defaults."""
        out = {}
        for f in IDENTITY_FIELDS:
            v = getattr(self, f.name)
            if f.default is _NO_DEFAULT or v != f.default:
                out[f.name] = v
        defaults = knob_defaults()
        for k, v in self.knobs:
            if k not in defaults or v != defaults[k]:
                out[k] = v
        return out

    @property
    def key(self) -> str:
        """12 hex digits of sha1 over identity() as sorted JSON."""
        return key_of(self.identity())

    @property
    def tags(self) -> list[str]:
        """Label tags of the fields and knobs off their defaults (knobs last)."""
        out = []
        for f in IDENTITY_FIELDS:
            tag, v = f.metadata["tag"], getattr(self, f.name)
            if tag and f.default is not _NO_DEFAULT and v != f.default:
                out.append(tag.format(v))
        meta = knob_meta()
        for k, v in self.knobs:
            knob = meta.get(k)
            if knob is not None and v != knob.default:
                out.append(knob.label(v))
        return out

    @property
    def knob_tags(self) -> str:
        """'sms16 carve24': the tags of knobs (and the carveout) off their defaults."""
        meta = knob_meta()
        tags = [meta[k].label(v) for k, v in self.knobs if k in meta and v != meta[k].default]
        if self.shared_sm_carveout:
            tags.insert(0, f"carve{self.shared_sm_carveout}")
        return " ".join(tags)

    @property
    def label(self) -> str:
        head = f"{self.backend}/{self.experts}/{self.reduction}/{self.overlap}/{self.quant}/{self.model}"
        return "/".join([head, *self.tags])

    def columns(self) -> dict:
        """A row's identity columns: every column field, then every built-in knob (None where
        the chosen entries do not take it) and the chosen entries' own, plus combo_key, label
        and knobs (tags)."""
        out = {f.name: getattr(self, f.name) for f in COLUMN_FIELDS}
        out.update({k: None for k in builtin_knobs()})
        out.update(dict(self.knobs))
        out.update(combo_key=self.key, label=self.label, knobs=self.knob_tags)
        out["intermediate_per_rank"] = self.intermediate_per_rank
        return out

    def replace(self, **changes) -> "Combo":
        return dataclasses.replace(self, **changes)


_ALL_FIELDS = tuple(dataclasses.fields(Combo))
_FIELD_NAMES = frozenset(f.name for f in _ALL_FIELDS)
IDENTITY_FIELDS = tuple(f for f in _ALL_FIELDS if f.metadata["identity"] and f.name != "knobs")
COLUMN_FIELDS = tuple(f for f in _ALL_FIELDS if f.metadata["column"])
# the row columns a combination is stored as (knob columns beside them: knob_meta())
IDENTITY_COLUMNS = tuple(f.name for f in COLUMN_FIELDS)
RESERVED = _FIELD_NAMES | {"combo_key", "label", "tokens_per_rank", "name"}


def tensor_parallel(backend: str) -> bool:
    """Whether a backend runs TP over its ranks (backend=tp); False for one not registered here."""
    from moebench.kernels import registry

    try:
        return bool(registry.entry("backend", str(backend)).tensor_parallel)
    except ValueError:
        return False


def key_of(identity: dict) -> str:
    return hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


_KNOB_META: dict = {}  # registry.generation() -> knob_meta()'s answer (read-only)


def knob_meta() -> dict:
    """Every registered knob by name (backends' and experts'): kernels/knobs.py. Computed once
    per state of the registry (planning asks for it a few times per combination)."""
    from moebench.kernels import registry

    registry.discover()
    hit = _KNOB_META.get(registry.generation())
    if hit is not None:
        return hit
    # a plugin's knob named like a field is disabled with the plugin; a built-in's is a bug
    registry.refuse_knob_names(RESERVED, "moebench's own fields (moebench/config/spec.py)")
    meta = {**registry.knobs("backend"), **registry.knobs("experts")}
    _KNOB_META.clear()
    _KNOB_META[registry.generation()] = meta  # after the refusal: it may have disabled a plugin
    return meta


def builtin_knobs() -> dict:
    """The knobs of moebench's own entries: columns of every row."""
    from moebench.kernels import registry

    return {**registry.knobs("backend", builtin_only=True), **registry.knobs("experts", builtin_only=True)}


def knob_defaults() -> dict:
    return {k: v.default for k, v in knob_meta().items()}


def field_default(name: str) -> Any:
    for f in _ALL_FIELDS:
        if f.name == name:
            return None if f.default is _NO_DEFAULT else f.default
    raise KeyError(name)


def from_row(row) -> Combo:
    """The Combo a stored row (schema 2, a mapping of its columns) was measured as."""
    kw = {}
    for f in COLUMN_FIELDS:
        v = row.get(f.name) if hasattr(row, "get") else row[f.name]
        if v is None or (isinstance(v, float) and v != v):
            if f.default is _NO_DEFAULT:
                raise ValueError(f"row lacks identity column {f.name!r}")
            v = f.default
        kw[f.name] = _typed(f.type, v)
    knobs = []
    for name, knob in knob_meta().items():
        v = row.get(name) if hasattr(row, "get") else None
        if v is not None and not (isinstance(v, float) and v != v):
            knobs.append((name, _typed(knob.type, v)))
    return Combo(**kw, knobs=tuple(sorted(knobs)))


def _typed(typ, value):
    """Parquet hands back numpy scalars: the field's Python type again."""
    t = typ if isinstance(typ, type) else {"int": int, "float": float, "str": str, "bool": bool}.get(str(typ), None)
    if t is None:
        return value
    if t is bool:
        return bool(value)
    if t is int:
        return int(value)
    if t is float:
        return float(value)
    return str(value)


@dataclass(frozen=True)
class Combination:
    """One planned combination: its spec, token counts, and why (some of) it cannot run."""

    combo: Combo
    tokens: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    reason: Optional[str] = None  # why it cannot run (all token counts)
    # `reason` breaks a rule of the plan, which no machine lifts (config/validity.py's Skip.rule);
    # False where this machine, a library or a plugin is why
    rule: bool = False
    # tokens -> config/validity.py's Skip (its reason, and whether it is a rule), the token counts
    # that cannot run (check_tokens), asked where the combination breaks no rule itself, beside
    # this machine's reason too: a token count's rule (a cap the config sets) comes before what
    # the machine lacks
    token_skips: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.combo.key

    @property
    def label(self) -> str:
        return self.combo.label

    @property
    def token_reasons(self) -> dict[int, str]:
        """tokens -> reason, the token counts skipped on their own: none where the whole
        combination is (`reason`)."""
        return {} if self.reason else {t: s.reason for t, s in self.token_skips.items()}

    @property
    def token_rules(self) -> dict[int, str]:
        """tokens -> reason, the token counts that break a rule of the plan, the combination's
        machine reason aside: no machine runs a combination every token count of which is here."""
        return {t: s.reason for t, s in self.token_skips.items() if s.rule}

    @property
    def runnable_tokens(self) -> list[int]:
        if self.reason:
            return []
        return [t for t in self.tokens if t not in self.token_skips]

    @property
    def ruled_out(self) -> bool:
        """No machine runs any of it: the combination breaks a rule of the plan, or each of its
        token counts does (False for a combination without token counts)."""
        rules = self.token_rules
        return self.rule or (bool(self.tokens) and all(t in rules for t in self.tokens))

    @property
    def family(self) -> tuple:
        """Combinations of one family may share a process group: same ranks and device, and
        what the backend's library sizes once per process (PrepareFinalize.process_group_family)."""
        from moebench.kernels import registry

        c = self.combo
        return (c.world_size, c.device, *registry.entry("backend", c.backend).process_group_family(c))
