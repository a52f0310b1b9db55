"""Dataclass schemas behind every Hydra config group: a misspelled key or a
wrong type fails when the config is composed, before any work starts.

The one home of the defaults: conf/*.yaml name only what an option changes, and the
combination spec (spec.py) takes its fields' defaults from here."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from functools import lru_cache

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class BackendConf:
    """backend.* keys; the entries' knobs (kernels/knobs.py) are added as fields by
    group_schemas(), so that backend.num_sms is typed like the rest."""

    name: str = MISSING
    simulate_ep: int = 1  # single-rank backends: keep 1/N of the experts (one rank of EP-N)
    # with simulate_ep=N: "" keeps rank 0's share of this rank's own tokens (simulate_ep's
    # meaning before this key); "hottest" or K: the tokens all N ranks send to the most loaded
    # rank, or to rank K, of a real EP-N run (docs/routing.md)
    simulate_rank: str = ""
    # single-rank backends: one rank of TP-N as vLLM's fused MoE shards it (each expert's and the
    # shared experts' intermediate split N ways, every expert kept); EP replaces it (no both)
    simulate_tp: int = 1


@dataclass
class ExpertsConf:
    """experts.* keys; the entries' knobs are added by group_schemas()."""

    name: str = MISSING


@dataclass
class ReductionConf:
    name: str = MISSING  # experts | finalize


@dataclass
class OverlapConf:
    name: str = MISSING  # none | dispatch | combine
    # SMs the shared experts' GEMMs leave to other work (torch's experimental cuBLASLt SM
    # carveout, CUDA only); 0 = all SMs, as cuBLAS chooses
    shared_sm_carveout: int = 0


@dataclass
class ModelConf:
    name: str = MISSING
    hidden: int = MISSING
    intermediate: int = MISSING  # per routed expert
    num_experts: int = MISSING
    topk: int = MISSING
    num_shared_experts: int = 0
    shared_intermediate: int = 0  # per shared expert
    # model=hf:<path-or-id> (config/hf.py): sha256 of the config.json the layer was read from
    config_sha256: str = ""


@dataclass
class QuantConf:
    name: str = MISSING  # bf16 | fp8_block | fp8_tensor (vLLM's names: compose.QUANT_ALIASES)
    # quant=fp8_w8a8 (vLLM's name): [] is moebench's fp8_tensor, [128,128] its fp8_block
    block_shape: list[int] = field(default_factory=list)


@dataclass
class WorkloadConf:
    tokens_per_rank: list[int] = field(default_factory=lambda: [16, 64])
    # uniform | balanced | zipf | imbalanced_experts | imbalanced_ranks | replay (docs/routing.md)
    routing: str = "uniform"
    skew: float = 1.2  # zipf exponent
    imbalance: float = 2.0  # imbalanced_*: the hot expert's (rank's) load over the mean
    routing_file: str = ""  # replay: the recording (.npz, routing/file.py)
    routing_layer: int = -1  # replay: the recording's layer (-1: the file holds one)
    # batched layouts: the rows per expert the buffers hold are sized so the busiest local
    # expert fills this fraction of them (0: the layout's own size)
    fill: float = 0.0
    seed: int = 0


@dataclass
class RunnerConf:
    device: str = "auto"  # auto | cpu | cuda
    world_size: int = 2  # ranks for EP backends (local* always run 1)
    # auto: CUDA-graph replays wherever the layer can be captured and the graph does the eager
    # forward's work, held events elsewhere | events | graph | profiler (docs/design.md, "Timing")
    timing: str = "auto"
    graph_max_tokens: int = 256  # timing=graph: above this many tokens, events
    reps: int = 30
    warmup: int = 5
    warmup_ms: float = 200.0  # GPU: keep calling this long after warmup, so samples see the sustained clock
    phase_reps: int = 10  # extra samples with phase events recorded
    l2_flush: bool = True
    # GPU: NVML's power, temperature, clocks and throttle reasons read every this many ms over
    # the timed samples (0: off; measure/nvml.py); records only, never sets a clock or a limit
    nvml_poll_ms: float = 50.0
    drop_throttled: bool = False  # retake a pass with throttled samples, as a host-paced one (twice at most)
    timeout_s: float = 600.0  # per combination, all token counts together
    # seconds a process group may take to form once its first rank is ready (every rank
    # joined): a rank lost before that fails the combination instead of holding the sweep
    startup_timeout_s: float = 30.0
    check: bool = True  # compare with the float32 reference before timing
    memory: bool = True
    # bytes the layer may allocate above what the correctness check holds (0: no cap), e.g.
    # "16GiB"; a forward that needs more is an `oom` row
    memory_budget: str = "0"


@dataclass
class TraceConf:
    name: str = "none"  # none | nvtx | torch | nsys
    dir: str = "traces"  # under the run directory
    samples: int = 3  # forward samples inside a captured trace


_BASE_SCHEMAS = {
    "backend": BackendConf,
    "experts": ExpertsConf,
    "reduction": ReductionConf,
    "overlap": OverlapConf,
    "model": ModelConf,
    "quant": QuantConf,
    "workload": WorkloadConf,
    "runner": RunnerConf,
    "trace": TraceConf,
}
GROUPS = tuple(_BASE_SCHEMAS)


@lru_cache(maxsize=1)
def group_schemas() -> dict:
    """Each group's dataclass; backend and experts with a field per registered knob (the
    caller has run spec.knob_meta() first, which disables the plugins whose knobs are named
    like moebench's own fields: compose.py does)."""
    from moebench.kernels import registry

    out = dict(_BASE_SCHEMAS)
    for group in ("backend", "experts"):
        base = _BASE_SCHEMAS[group]
        own = {f.name for f in fields(base)}
        extra = []
        for name, knob in sorted(registry.knobs(group).items()):
            if name in own:
                raise ValueError(f"{group} knob {name!r} clashes with {group}.{name} of moebench's schema")
            extra.append((name, knob.type, field(default=knob.default)))
        out[group] = make_dataclass(base.__name__, extra, bases=(base,))
    return out


def register_schemas() -> None:
    """The typed primary config for Hydra's own compose (moebench.config.compose_with_hydra)."""
    schemas = group_schemas()
    root = make_dataclass("MoeBenchConf", [(g, schemas[g], field(default=MISSING)) for g in GROUPS])
    ConfigStore.instance().store(name="moebench_schema", node=root)
