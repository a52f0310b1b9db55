"""The contract's validity rules (docs/design.md, "Validity"): a combination that fails one
is a skipped row with its reason, never an exception. Rules of one entry live in that
entry's `supports`; the rules here hold for every entry. And which timing runs for a token
count (runner.timing: auto's choice between graph replays and held events)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from moebench.config.names import not_implemented
from moebench.config.spec import Combo
from moebench.kernels.entry import Rule

# the batched backends whose rows per expert follow workload.fill (kernels' `rows_per_expert`)
FILL_BACKENDS = ("local_batched", "naive_batched")


@dataclass(frozen=True)
class Skip:
    """Why a combination cannot run: the skipped row's `reason`, and whether it breaks a rule
    of the plan, which no machine lifts (`rule`: layouts that differ, a split that does not
    divide, an entry's own limit its `supports` marks as a `Rule`, ...), or names what this
    machine lacks (a plugin, CUDA, and every reason of `supports` left a plain `str`: an
    entry's library, its GPU)."""

    reason: str
    rule: bool


def validate(combo: Combo) -> Optional[str]:
    """Reason this combination cannot run (every token count), or None."""
    skip = check(combo)
    return skip.reason if skip else None


def check(combo: Combo) -> Optional[Skip]:
    """Why this combination cannot run (every token count), or None: the rules of the plan
    first (the contract's, then the entries' `Rule`s), then what the machine lacks
    (docs/design.md, "Validity")."""
    return check_with_tokens(combo, ())[0]


def check_with_tokens(combo: Combo, tokens: Iterable[int]) -> tuple[Optional[Skip], dict[int, Skip]]:
    """check's answer for `combo`, and check_tokens's for each of `tokens` that cannot run:
    asked where the entries are registered and the combination breaks no rule of the plan
    itself, beside what this machine lacks too (a token count's rule, a cap the config sets,
    rules it out wherever it runs)."""
    from moebench.kernels import registry

    registry.discover()
    entries = (("backend", combo.backend, registry.BACKENDS), ("experts", combo.experts, registry.EXPERTS))
    for kind, name, known in entries:
        if name not in known:
            return Skip(registry.unavailable(kind, name), rule=False), {}  # e.g. a plugin disabled here
    why = _plan_rule(combo)
    if why:
        return Skip(why, rule=True), {}
    # a plugin that raises: a plain reason saying so (the machine's: its code, not the plan). The
    # experts are not asked where the backend's Rule decided (their machine: torch, CUDA's start)
    said: Optional[str] = None
    for kind, name, _ in entries:
        why = registry.ask(kind, name, "supports", combo)
        if isinstance(why, Rule):
            return Skip(str(why), rule=True), {}
        said = said or why
    why = _needs_cuda(combo) or said
    return (Skip(str(why), rule=False) if why else None), {t: s for t in tokens if (s := check_tokens(combo, t))}


def _plan_rule(combo: Combo) -> Optional[str]:
    """The contract's rules that hold whatever the machine: a combination that breaks one can
    never run (its entries are registered: check)."""
    from moebench.kernels import registry

    b, e = combo.backend, combo.experts
    unrun = not_implemented(combo.quant)
    if unrun:
        return unrun
    B, X = registry.BACKENDS[b], registry.EXPERTS[e]
    if B.activation_format != X.activation_format:
        return (
            f"layouts differ: backend={b} produces the {B.activation_format.value} layout, "
            f"experts={e} reads {X.activation_format.value}"
        )
    batched = B.activation_format.value == "batched"
    if batched and combo.reduction != "finalize":
        return f"batched backend={b} weights and reduces in its combine: only reduction=finalize"
    if combo.overlap != "none" and combo.num_shared_experts == 0:
        return f"overlap={combo.overlap} needs shared experts; model={combo.model} has none"
    if combo.shared_sm_carveout and combo.num_shared_experts == 0:
        return (
            f"overlap.shared_sm_carveout={combo.shared_sm_carveout} applies to shared experts; "
            f"model={combo.model} has none"
        )
    E, ws, sim = combo.num_experts, combo.world_size, combo.simulate_ep
    single, tp_ranks = B.single_rank, B.tensor_parallel
    ep = registry.ep_split(combo).ep  # the EP split the routing sees (kernels/split.py)
    why = _tp_rule(combo, b, single, tp_ranks)
    if why:
        return why
    if single:
        if E % sim:
            return f"simulate_ep={sim} does not divide num_experts={E}"
    elif not tp_ranks:
        if ws < 2:
            return f"backend={b} is an EP backend: it needs runner.world_size >= 2 (one rank per GPU)"
        if E % ws:
            return f"world_size={ws} does not divide num_experts={E}"
    if combo.routing == "imbalanced_ranks":
        if ep < 2:
            return (
                "workload.routing=imbalanced_ranks loads one EP rank's experts: it needs an EP split "
                "(an EP backend, or backend.simulate_ep=N on one GPU)"
            )
        from moebench.routing import rules

        why = rules.check(rules.RoutingSpec(name=combo.routing, imbalance=combo.imbalance, ep_size=ep), E, combo.topk)
        if why:
            return why
    if combo.fill and b not in FILL_BACKENDS:
        if not batched:
            return f"workload.fill sizes the batched layouts' buffers: backend={b} uses the standard layout"
        return (
            f"workload.fill sizes the buffers per token count; backend={b} allocates its buffers once per process "
            "group (set backend.max_tokens_per_rank instead)"
        )
    inter, tp = combo.intermediate_per_rank, combo.tp_size
    if combo.quant == "fp8_block" and (combo.hidden % 128 or inter % 128):
        by = "world_size" if tp_ranks else "simulate_tp"
        shard = f" (intermediate {combo.intermediate} / {by}={tp})" if tp > 1 else ""
        return f"fp8_block needs hidden and intermediate multiples of 128 (got {combo.hidden}, {inter}{shard})"
    return None


def _needs_cuda(combo: Combo) -> Optional[str]:
    """What needs CUDA where the combination runs on the CPU (runner.device=auto on a machine
    without a GPU, or runner.device=cpu): counted as the machine's."""
    if combo.device == "cuda":
        return None
    if combo.shared_sm_carveout:
        return f"overlap.shared_sm_carveout={combo.shared_sm_carveout} leaves GPU SMs free (cuBLASLt): it needs CUDA"
    if combo.timing == "profiler":
        return "timing=profiler reports GPU kernel durations: it needs CUDA"
    if combo.memory_budget:
        return "runner.memory_budget caps the CUDA caching allocator: it needs CUDA"
    return None


def _tp_rule(combo: Combo, b: str, single: bool, tp_ranks: bool) -> Optional[str]:
    """The experts' TP split (docs/models.md, "Tensor parallelism"): simulate_tp on one rank of a
    single-rank backend, world_size ranks on a tensor_parallel one, never beside EP; it must
    divide the experts' and the shared experts' widths."""
    if combo.simulate_tp > 1 and not single:
        if tp_ranks:
            return (
                f"backend={b} splits the experts over runner.world_size={combo.world_size} ranks: "
                "backend.simulate_tp shards one rank of a single-rank backend (leave it 1)"
            )
        return (
            f"backend={b} is expert parallel: EP replaces the experts' TP split (as in vLLM); "
            "backend.simulate_tp shards one rank of a single-rank backend"
        )
    if tp_ranks and combo.world_size < 2:
        return f"backend={b} is tensor parallel: it needs runner.world_size >= 2 (one rank per GPU)"
    tp = combo.tp_size
    if combo.intermediate % tp or combo.shared_intermediate % tp:
        by = "world_size" if tp_ranks else "simulate_tp"
        return f"{by}={tp} does not divide the experts' intermediate={combo.intermediate}" + (
            f" and shared {combo.shared_intermediate}" if combo.shared_intermediate % tp else ""
        )
    return None


def graph_capturable(combo: Combo) -> Optional[str]:
    """Why a forward of `combo` cannot be captured in a CUDA graph, or None."""
    from moebench.kernels import registry

    if combo.device != "cuda":
        return "capturing a CUDA graph needs CUDA"
    if not registry.entry("backend", combo.backend).graph_capturable:
        return f"backend={combo.backend} cannot be captured in a CUDA graph"
    if not registry.entry("experts", combo.experts).graph_capturable:
        return f"experts={combo.experts} syncs the host (data-dependent sizes): no CUDA graph"
    return None


def auto_events(combo: Combo) -> Optional[str]:
    """Why runner.timing=auto times eager forwards (held events) rather than CUDA-graph
    replays for `combo`, or None where it replays graphs: a forward that cannot be captured,
    one whose captured form does other work than the eager one (an entry's `graph_differs`),
    or runner.memory_budget (a graph's private memory pool would count against the budget)."""
    from moebench.kernels import registry

    why = graph_capturable(combo)
    if why:
        return why
    for kind, entry in (
        ("backend", registry.entry("backend", combo.backend)),
        ("experts", registry.entry("experts", combo.experts)),
    ):
        if entry.graph_differs:
            return f"{kind}={getattr(combo, kind)}: a CUDA graph would do other work ({entry.graph_differs})"
    if combo.memory_budget:
        return "runner.memory_budget is set: a CUDA graph's private memory pool would count against it"
    return None


def timing_mode(combo: Combo, tokens: int) -> str:
    """The timing that runs for `tokens` (docs/design.md, "Timing"): auto is CUDA-graph replays
    wherever the layer can be captured and the graph does the eager forward's work (at any
    size), held events elsewhere (auto_events); graph is replays at <= graph_max_tokens and
    events above; events and profiler are themselves. A CPU has no events: its rows are timed by
    the host's monotonic clock whatever was asked (`cpu`)."""
    if combo.device != "cuda":
        return "cpu"
    if combo.timing == "auto":
        return "graph" if auto_events(combo) is None else "events"
    if combo.timing == "graph":
        return "graph" if tokens <= combo.graph_max_tokens else "events"
    return combo.timing


def timing_note(combo: Combo, tokens: int) -> str:
    """Why the timing that runs is not the replays the request would prefer ('' where it is):
    the reason auto or graph times eager forwards."""
    if combo.device != "cuda" or timing_mode(combo, tokens) != "events" or combo.timing == "events":
        return ""
    if combo.timing == "auto":
        return f"auto timed eager forwards: {auto_events(combo)}"
    return f"graph timing above runner.graph_max_tokens={combo.graph_max_tokens}: eager forwards"


def check_tokens(combo: Combo, tokens: int) -> Optional[Skip]:
    """Why one token count cannot run, or None, with whether it breaks a rule of the plan
    (docs/design.md, "Validity"); `combo`'s entries are registered here (check_with_tokens asks
    it only then). timing=graph at or below graph_max_tokens: needing CUDA is the
    machine's (as _needs_cuda's), an entry that cannot be captured is its card's declaration, the
    same everywhere: a rule. A backend's `token_limit`: a `Rule` (the cards' cap, from
    backend.max_tokens_per_rank) is a rule, a plain str the machine's."""
    from moebench.kernels import registry

    if combo.timing == "graph" and tokens <= combo.graph_max_tokens:
        why = graph_capturable(combo)
        if why:
            return Skip(f"timing=graph: {why}; use runner.timing=auto or events", rule=combo.device == "cuda")
    said = registry.ask("backend", combo.backend, "token_limit", combo, tokens)
    return Skip(str(said), rule=isinstance(said, Rule)) if said else None
