"""The cards of moebench's backends: layout, ranks, CUDA-graph flags, knobs and the rules
(`supports`, `token_limit`, `process_group_family`) planning reads without importing the
implementations (kernels/prepare_finalize/, named by each card's `implementation`)."""

from __future__ import annotations

from typing import Optional

from ..entry import ActivationFormat, BackendCard, Rule
from ..knobs import Knob
from ..prepare_finalize import _deepep, _pplx
from ..registry import card

# the batched buffers of deepep_ll and pplx are sized for this many tokens per rank
MAX_TOKENS_KNOB = Knob(
    "max_tokens_per_rank",
    512,
    "tokens per rank the batched buffers hold (DeepEP "
    "low-latency's num_max_dispatch_tokens_per_rank, pplx's max_num_tokens)",
    minimum=1,
    tag="cap{}",
)


def max_tokens_reason(combo, tokens: int):
    """Why `tokens` per rank do not fit the batched buffers of `combo`, or None: a `Rule`, the
    cap is the config's knob, the same on every machine. The text before ':' names the cap alone,
    so a sweep's reasons group by cap."""
    cap = combo.get("max_tokens_per_rank", MAX_TOKENS_KNOB.default)
    if tokens > cap:
        return Rule(
            f"backend.max_tokens_per_rank={cap} caps the batched buffers: {tokens} tokens per rank exceed it "
            "(raise backend.max_tokens_per_rank or lower workload.tokens_per_rank)"
        )
    return None


@card("backend", "local")
class LocalCard(BackendCard):
    implementation = "prepare_finalize.local"
    single_rank = True
    activation_format = ActivationFormat.STANDARD
    carries_fp8 = True
    graph_capturable = True


@card("backend", "local_batched")
class LocalBatchedCard(BackendCard):
    implementation = "prepare_finalize.local_batched"
    single_rank = True
    activation_format = ActivationFormat.BATCHED
    carries_fp8 = True
    graph_capturable = True  # the scatter and the reduce are sized for every pair: no host sync


@card("backend", "naive")
class NaiveCard(BackendCard):
    implementation = "prepare_finalize.naive"
    activation_format = ActivationFormat.STANDARD
    carries_fp8 = False


@card("backend", "naive_batched")
class NaiveBatchedCard(BackendCard):
    implementation = "prepare_finalize.naive_batched"
    activation_format = ActivationFormat.BATCHED
    carries_fp8 = True


@card("backend", "allgather_rs")
class AllGatherReduceScatterCard(BackendCard):
    implementation = "prepare_finalize.allgather_rs"
    activation_format = ActivationFormat.STANDARD
    carries_fp8 = True


@card("backend", "tp")
class TPCard(BackendCard):
    implementation = "prepare_finalize.tp"
    activation_format = ActivationFormat.STANDARD
    carries_fp8 = True  # no dispatch: the rank quantizes its own (everyone's) tokens
    tensor_parallel = True

    @classmethod
    def supports(cls, combo) -> Optional[str]:
        overlap = combo.get("overlap", "none")
        if overlap != "none":
            # vLLM's MoE under TP adds the shared experts' partial output to the routed one and
            # all-reduces the sum once: no dispatch to hide them behind, no combine without them
            return Rule(
                f"overlap={overlap}: backend=tp all-reduces the shared experts' partial output with the "
                "routed one (one all-reduce, as vLLM's MoE layers under TP): only overlap=none"
            )
        return None


# -- DeepEP high-throughput ---------------------------------------------------------
DEFAULT_NUM_SMS = 24  # DeepEP's tests and README use 24 SMs for the HT kernels
# intranode dispatch stages half a row per warp in 8 KiB of shared memory (TMA),
# in 32-byte units: row bytes % 32 == 0 and row bytes / 2 + 8 <= 8192
MAX_HT_ROW_BYTES = 2 * (8192 - 8)
MAX_HT_TOPK = 32  # one lane per top-k entry
MAX_HT_LOCAL_EXPERTS = 1024  # NUM_MAX_LOCAL_EXPERTS in csrc/kernels/configs.cuh


def ht_row_bytes(hidden: int, quant_name: str) -> int:
    """Bytes of one dispatched x row of deepep_ht: fp8 for fp8_block, bf16 otherwise."""
    return hidden * (1 if quant_name == "fp8_block" else 2)


def _deepep_unusable(name: str, combo: dict) -> Optional[str]:
    """Why DeepEP cannot run this combination at all (library or device), or None."""
    reason = _deepep.unavailable_reason()
    if reason:
        return reason
    device = combo.get("device", "cuda")
    return None if device == "cuda" else f"{name} needs CUDA GPUs linked by NVLink (device={device})"


@card("backend", "deepep_ht")
class DeepEPHTCard(BackendCard):
    implementation = "prepare_finalize.deepep_ht"
    activation_format = ActivationFormat.STANDARD
    carries_fp8 = True  # fp8_block: fp8 rows + 1x128 scales; fp8_tensor: bf16 then quantize
    graph_capturable = False  # dispatch waits on the CPU for the received counts
    knobs = (
        Knob("num_sms", DEFAULT_NUM_SMS, "SMs DeepEP's high-throughput kernels may use (even)", minimum=2, tag="sms{}"),
        Knob(
            "dispatch_nvl_chunk",
            0,
            "tokens per NVLink chunk of the dispatch (Config's "
            "num_max_nvl_chunked_send_tokens, with a 256-token receive buffer); 0 = DeepEP's recommended config",
            minimum=0,
            tag="dchunk{}",
        ),
        Knob("combine_nvl_chunk", 0, "the same for the combine", minimum=0, tag="cchunk{}"),
    )

    @classmethod
    def supports(cls, combo: dict) -> Optional[str]:
        # the kernels' limits (DeepEP v1.2.1's, as wired here: Rules) before its library and GPUs
        ws = combo.get("world_size", 2)
        if ws not in _deepep.INTRANODE_WORLD_SIZES:
            return Rule(
                f"deepep_ht runs DeepEP's intranode kernels: world_size in {_deepep.INTRANODE_WORLD_SIZES} (got {ws})"
            )
        E, P, K = combo.get("num_experts", ws), combo.get("topk", 1), combo.get("hidden", 128)
        quant = combo.get("quant", "bf16")
        if E // ws > MAX_HT_LOCAL_EXPERTS:
            return Rule(f"DeepEP supports at most {MAX_HT_LOCAL_EXPERTS} experts per rank (got {E // ws})")
        if P > MAX_HT_TOPK:
            return Rule(f"DeepEP HT supports top-k <= {MAX_HT_TOPK} (got {P})")
        row = ht_row_bytes(K, quant)
        if row % 32 or row > MAX_HT_ROW_BYTES:
            return Rule(
                f"DeepEP intranode dispatch needs rows of a multiple of 32 bytes and at most "
                f"{MAX_HT_ROW_BYTES} bytes (hidden={K}, quant={quant}: {row} bytes)"
            )
        sms = combo.get("num_sms", DEFAULT_NUM_SMS)
        if sms <= 0 or sms % 2:
            return Rule(f"backend.num_sms={sms}: DeepEP needs a positive even SM count")
        for name in ("dispatch_nvl_chunk", "combine_nvl_chunk"):
            chunk = combo.get(name, 0)
            if not 0 <= chunk < _deepep.NVL_RECV_TOKENS:
                return Rule(
                    f"backend.{name}={chunk}: 0 (DeepEP's recommended config) or 1..{_deepep.NVL_RECV_TOKENS - 1} "
                    f"tokens per chunk (the receive buffer holds {_deepep.NVL_RECV_TOKENS})"
                )
        return _deepep_unusable("deepep_ht", combo)


# -- DeepEP low-latency ---------------------------------------------------------------
# DeepEP v1.2.1's low-latency kernels are instantiated for these hidden sizes
# (SWITCH_HIDDEN in csrc/kernels/launch.cuh); others fail a host assert
SUPPORTED_HIDDEN = (2048, 2560, 4096, 5120, 6144, 7168, 8192)
MAX_TOPK = 11  # kNumMaxTopK of the dispatch and combine kernels (csrc/kernels/internode_ll.cu)
MAX_NVL_PEERS = 8  # NUM_MAX_NVL_PEERS: DeepEP asserts ranks < 8 or a multiple of 8


@card("backend", "deepep_ll")
class DeepEPLLCard(BackendCard):
    implementation = "prepare_finalize.deepep_ll"
    activation_format = ActivationFormat.BATCHED
    carries_fp8 = True  # fp8_block rows + 1x128 scales; fp8_tensor travels bf16
    graph_capturable = True  # fixed-shape outputs, counts stay on the GPU, no host sync
    knobs = (MAX_TOKENS_KNOB,)

    @classmethod
    def supports(cls, combo: dict) -> Optional[str]:
        # the kernels' limits (DeepEP v1.2.1's: Rules) before its library and GPUs
        ws = combo.get("world_size", 2)
        if ws >= MAX_NVL_PEERS and ws % MAX_NVL_PEERS:
            return Rule(f"DeepEP needs fewer than {MAX_NVL_PEERS} ranks or a multiple of {MAX_NVL_PEERS} (got {ws})")
        P, K = combo.get("topk", 1), combo.get("hidden", 7168)
        if K not in SUPPORTED_HIDDEN:
            return Rule(f"DeepEP low-latency kernels exist for hidden in {SUPPORTED_HIDDEN} (got hidden={K})")
        if P > MAX_TOPK:
            return Rule(f"DeepEP low-latency supports top-k <= {MAX_TOPK} (got {P})")
        cap = combo.get("max_tokens_per_rank", 512)
        if (ws * cap) % 4:
            return Rule(
                f"DeepEP low-latency needs world_size * backend.max_tokens_per_rank to be a multiple of 4 "
                f"(got {ws} * {cap})"
            )
        return _deepep_unusable("deepep_ll", combo)

    @classmethod
    def process_group_family(cls, combo) -> tuple:
        # NVSHMEM initialises once per process, and DeepEP's one low-latency buffer is sized
        # by (hidden, experts, max tokens): one process group per buffer shape
        return ("nvshmem", combo["hidden"], combo["num_experts"], combo["max_tokens_per_rank"])

    @classmethod
    def token_limit(cls, combo, tokens: int):
        return max_tokens_reason(combo, tokens)


# -- pplx -------------------------------------------------------------------------------
def pplx_mode(combo_or_options) -> str:
    return str(combo_or_options.get("pplx_mode", _pplx.DEFAULT_MODE))


def pplx_dispatch_format(hidden: int, quant_name: str) -> tuple[int, int, int]:
    """(row bytes, scale bytes, padded scale columns Gp) of one token pplx dispatches."""
    if quant_name == "fp8_block":
        groups = hidden // 128
        gp = _pplx.round_up(groups, _pplx.SCALE_ALIGN // 4)
        return hidden, 4 * gp, gp
    return 2 * hidden, 0, 0


@card("backend", "pplx")
class PplxCard(BackendCard):
    implementation = "prepare_finalize.pplx"
    activation_format = ActivationFormat.BATCHED
    carries_fp8 = True  # fp8_block rows + scales; fp8_tensor travels bf16
    graph_capturable = True  # no host sync; pplx supports CUDA graphs (vLLM captures it)
    knobs = (
        MAX_TOKENS_KNOB,
        Knob(
            "pplx_mode",
            _pplx.DEFAULT_MODE,
            "pplx's transport: intranode (CUDA IPC, as vLLM runs it on one "
            "node) or internode (NVSHMEM, what pplx's own benchmark times)",
            choices=_pplx.MODES,
            tag="{}",
        ),
    )

    @classmethod
    def supports(cls, combo: dict) -> Optional[str]:
        # the kernels' limits (Rules) before the library and the GPUs
        mode = pplx_mode(combo)
        if mode not in _pplx.MODES:
            return Rule(f"backend.pplx_mode={mode!r}; valid: {', '.join(_pplx.MODES)}")
        K = combo.get("hidden", 128)
        quant = combo.get("quant", "bf16")
        row, scale_bytes, _ = pplx_dispatch_format(K, quant)
        if row % 16 or K % 8:
            return Rule(
                f"pplx moves rows in 16-byte units: hidden={K} ({row} bytes a row) must be a multiple of 16 bytes "
                "and of 8"
            )
        staged = _pplx.round_up(row + scale_bytes + 4, 16)
        if mode == "intranode" and staged > _pplx.MAX_STAGED_ROW_BYTES:
            return Rule(
                f"pplx's intranode dispatch stages a row in <= 48 KiB of shared memory (hidden={K}, {quant}: "
                f"{staged} bytes)"
            )
        reason = _pplx.unavailable_reason()
        if reason:
            return reason
        device = combo.get("device", "cuda")
        if device != "cuda":
            return f"pplx needs CUDA GPUs (device={device})"
        return None

    @classmethod
    def process_group_family(cls, combo) -> tuple:
        # NVSHMEM initialises once per process: pplx never shares a process with deepep_ll;
        # its NVSHMEM transport also sizes one buffer per (hidden, experts, max tokens)
        if pplx_mode(combo) == "internode":
            return ("nvshmem", "pplx", combo["hidden"], combo["num_experts"], combo["max_tokens_per_rank"])
        return ("pplx",)

    @classmethod
    def token_limit(cls, combo, tokens: int):
        return max_tokens_reason(combo, tokens)
