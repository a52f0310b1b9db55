"""Dataclass schemas behind every Hydra config group: a misspelled key or a
wrong type fails when the config is composed, before any work starts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class BackendConf:
    name: str = MISSING
    simulate_ep: int = 1  # local*: keep 1/N of the experts (one rank of EP-N)
    max_tokens_per_rank: int = 512  # batched buffers' cap (deepep_ll / pplx)
    num_sms: int = 24  # SMs DeepEP's high-throughput kernels may use
    # deepep_ht: tokens per NVLink chunk (Config's num_max_nvl_chunked_send_tokens, with a
    # 256-token receive buffer as DeepEP's test_intranode tunes them); 0 = DeepEP's recommended
    # config for the world size
    dispatch_nvl_chunk: int = 0
    combine_nvl_chunk: int = 0


@dataclass
class ExpertsConf:
    name: str = MISSING
    # triton_or_deepgemm: DeepGEMM at or above this many rows after dispatch
    deepgemm_min_tokens: int = 256
    # triton + bf16 / fp8_block: gathered rows (vLLM's fused_moe) or the contiguous layout (rows
    # permuted per expert, TMA loads); auto = contiguous from 1024 (bf16) / 128 (fp8_block)
    # expected local pairs per expert (kernels/experts/triton.py)
    row_layout: str = "auto"


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


@dataclass
class QuantConf:
    name: str = MISSING  # bf16 | fp8_block | fp8_tensor


@dataclass
class WorkloadConf:
    tokens_per_rank: list[int] = field(default_factory=lambda: [16, 64])
    routing: str = "uniform"  # uniform | balanced | zipf
    skew: float = 1.2  # zipf exponent
    seed: int = 0


@dataclass
class RunnerConf:
    device: str = "auto"  # auto | cpu | cuda
    world_size: int = 2  # ranks for EP backends (local* always run 1)
    timing: str = "events"  # events | graph | profiler
    graph_max_tokens: int = 256  # graph mode above this many tokens falls back to events
    reps: int = 30
    warmup: int = 5
    warmup_ms: float = 200.0  # GPU: keep calling this long after warmup, so samples see the sustained clock
    phase_reps: int = 10  # extra samples with phase events recorded
    l2_flush: bool = True
    timeout_s: float = 600.0  # per combination, all token counts together
    check: bool = True  # compare with the float32 reference before timing
    memory: bool = True


@dataclass
class TraceConf:
    name: str = "none"  # none | nvtx | torch | nsys
    dir: str = "traces"  # under the run directory
    samples: int = 3  # forward samples inside a captured trace


@dataclass
class MoeBenchConf:
    backend: BackendConf = MISSING
    experts: ExpertsConf = MISSING
    reduction: ReductionConf = MISSING
    overlap: OverlapConf = MISSING
    model: ModelConf = MISSING
    quant: QuantConf = MISSING
    workload: WorkloadConf = MISSING
    runner: RunnerConf = MISSING
    trace: TraceConf = MISSING
    extra: dict[str, Any] = field(default_factory=dict)


GROUP_SCHEMAS = {
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
GROUPS = tuple(GROUP_SCHEMAS)


def register_schemas() -> None:
    cs = ConfigStore.instance()
    cs.store(name="moebench_schema", node=MoeBenchConf)
