"""Sweep overrides -> planned Combinations, expanded with Hydra's override parser, and
the contract's validity rules (docs/design.md, "Validity"): a combination that fails
one is a skipped row with its reason, never an exception. Rules of one entry live in
that entry's `supports`; the rules here hold for every entry."""
from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from . import paths
from .config import (CHOICES, RENAMED, check_values, compose_config, compose_with_hydra, group_options,  # noqa: F401
                     rename, resolve_device, set_knobs, to_combo)
from .spec import Combo

DEVICE_SECTIONS = ("cpu", "cuda")  # a sweep file's per-device overrides


@dataclass(frozen=True)
class Combination:
    """One planned combination: its spec, token counts, and why (some of) it cannot run."""

    combo: Combo
    tokens: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    reason: Optional[str] = None  # why it cannot run (all token counts)
    token_reasons: dict = field(default_factory=dict)  # tokens -> reason

    @property
    def key(self) -> str:
        return self.combo.key

    @property
    def label(self) -> str:
        return self.combo.label

    @property
    def runnable_tokens(self) -> list[int]:
        if self.reason:
            return []
        return [t for t in self.tokens if t not in self.token_reasons]

    @property
    def family(self) -> tuple:
        """Combinations of one family may share a process group: same ranks and device, and
        what the backend's library sizes once per process (PrepareFinalize.process_group_family)."""
        from .kernels import registry

        c = self.combo
        return (c.world_size, c.device, *registry.get_backend(c.backend).process_group_family(c))


# ---------------------------------------------------------------------------
# sweep files


def load_sweep(name_or_path: str) -> dict:
    """A sweep file: {'description', 'overrides': {key: value-or-sweep-string}}, optionally
    'cpu:' / 'cuda:' sections merged over 'overrides' on that device."""
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
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a mapping with 'description' and 'overrides: {{key: value(s)}}'")
    unknown = set(data) - {"description", "overrides", *DEVICE_SECTIONS}
    if unknown:
        raise ValueError(f"{p}: unknown sections {sorted(unknown)}; a sweep file has description, overrides "
                         f"and optionally {' / '.join(DEVICE_SECTIONS)}")
    for section in ("overrides", *DEVICE_SECTIONS):
        values = data.get(section) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{p}: '{section}' must map keys to a value, a comma list or a [list]")
        bad = [k for k, v in values.items() if isinstance(v, dict)]
        if bad:
            raise ValueError(f"{p}: '{section}': {bad} must be a value, a comma list or a [list], not a mapping")
        data[section] = values
    data["name"] = p.stem
    return data


def _value_str(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


def _parse(raw: list[str]):
    try:
        return OverridesParser.create().parse_overrides(list(raw))
    except HydraException as e:
        raise ValueError(f"cannot parse overrides {raw}: {e}") from None


def sweep_device(cli_overrides: list[str]) -> str:
    """The device a sweep runs on: runner.device from the command line, else auto."""
    device = "auto"
    for ov in _parse(cli_overrides):
        if ov.key_or_group == "runner.device" and not ov.is_sweep_override():
            device = ov.get_value_element_as_str()
    return resolve_device(device) if device in CHOICES[("runner", "device")] else device


def expand(sweep_overrides: dict, cli_overrides: list[str]) -> list[list[str]]:
    """Cartesian product of sweep values; CLI overrides replace the sweep file's value for
    the same key."""
    merged: dict[str, str] = {k: f"{k}={_value_str(v)}" for k, v in sweep_overrides.items()}
    for raw, ov in zip(cli_overrides, _parse(cli_overrides)):
        merged[ov.key_or_group] = raw
    axes: list[list[str]] = []
    for raw in merged.values():
        ov = _parse([raw])[0]
        if ov.is_sweep_override():
            key = ov.get_key_element()
            axes.append([f"{key}={v}" for v in ov.sweep_string_iterator()])
        else:
            axes.append([raw])
    return [list(p) for p in itertools.product(*axes)]


# ---------------------------------------------------------------------------
# validity


def validate(combo: Combo) -> Optional[str]:
    """Reason this combination cannot run (every token count), or None."""
    from .kernels import registry

    registry.discover()
    b, e = combo.backend, combo.experts
    if b not in registry.BACKENDS:
        return registry.unavailable("backend", b)
    if e not in registry.EXPERTS:
        return registry.unavailable("experts", e)
    B, X = registry.BACKENDS[b], registry.EXPERTS[e]
    if B.activation_format != X.activation_format:
        return (f"layouts differ: backend={b} produces the {B.activation_format.value} layout, "
                f"experts={e} reads {X.activation_format.value}")
    if B.activation_format.value == "batched" and combo.reduction != "finalize":
        return f"batched backend={b} weights and reduces in its combine: only reduction=finalize"
    if combo.overlap != "none" and combo.num_shared_experts == 0:
        return f"overlap={combo.overlap} needs shared experts; model={combo.model} has none"
    if combo.shared_sm_carveout and combo.num_shared_experts == 0:
        return f"overlap.shared_sm_carveout={combo.shared_sm_carveout} applies to shared experts; model={combo.model} has none"
    if combo.shared_sm_carveout and combo.device != "cuda":
        return f"overlap.shared_sm_carveout={combo.shared_sm_carveout} leaves GPU SMs free (cuBLASLt): it needs CUDA"
    E, ws, sim = combo.num_experts, combo.world_size, combo.simulate_ep
    if B.single_rank:
        if E % sim:
            return f"simulate_ep={sim} does not divide num_experts={E}"
    else:
        if ws < 2:
            return f"backend={b} is an EP backend: it needs runner.world_size >= 2 (one rank per GPU)"
        if E % ws:
            return f"world_size={ws} does not divide num_experts={E}"
    if combo.quant == "fp8_block" and (combo.hidden % 128 or combo.intermediate % 128):
        return f"fp8_block needs hidden and intermediate multiples of 128 (got {combo.hidden}, {combo.intermediate})"
    if combo.timing == "profiler" and combo.device != "cuda":
        return "timing=profiler reports GPU kernel durations: it needs CUDA"
    if combo.memory_budget and combo.device != "cuda":
        return "runner.memory_budget caps the CUDA caching allocator: it needs CUDA"
    for kind, name in (("backend", b), ("experts", e)):
        reason = registry.ask(kind, name, "supports", combo)  # a plugin that raises: the reason says so
        if reason:
            return reason
    return None


def graph_capturable(combo: Combo) -> Optional[str]:
    """Why a forward of `combo` cannot be captured in a CUDA graph, or None."""
    from .kernels import registry

    if combo.device != "cuda":
        return "capturing a CUDA graph needs CUDA"
    if not registry.get_backend(combo.backend).graph_capturable:
        return f"backend={combo.backend} cannot be captured in a CUDA graph"
    if not registry.get_experts(combo.experts).graph_capturable:
        return f"experts={combo.experts} syncs the host (data-dependent sizes): no CUDA graph"
    return None


def auto_events(combo: Combo) -> Optional[str]:
    """Why runner.timing=auto times eager forwards (held events) rather than CUDA-graph
    replays for `combo`, or None where it replays graphs: a forward that cannot be captured,
    one whose captured form does other work than the eager one (an entry's `graph_differs`),
    or runner.memory_budget (a graph's private memory pool would count against the budget)."""
    from .kernels import registry

    why = graph_capturable(combo)
    if why:
        return why
    for kind, entry in (("backend", registry.get_backend(combo.backend)),
                        ("experts", registry.get_experts(combo.experts))):
        if entry.graph_differs:
            return f"{kind}={getattr(combo, kind)}: a CUDA graph would do other work ({entry.graph_differs})"
    if combo.memory_budget:
        return "runner.memory_budget is set: a CUDA graph's private memory pool would count against it"
    return None


def timing_mode(combo: Combo, tokens: int) -> str:
    """The timing that runs for `tokens` (docs/design.md, "Timing"): auto is CUDA-graph replays
    wherever the layer can be captured and the graph does the eager forward's work (at any
    size), held events elsewhere (auto_events); graph is replays at <= graph_max_tokens and
    events above; events and profiler are themselves."""
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


def validate_tokens(combo: Combo, tokens: int) -> Optional[str]:
    """Reason one token count cannot run (e.g. over a batched buffer's cap)."""
    from .kernels import registry

    if combo.timing == "graph" and tokens <= combo.graph_max_tokens:
        why = graph_capturable(combo)
        if why:
            return f"timing=graph: {why}; use runner.timing=auto or events"
    return registry.ask("backend", combo.backend, "token_limit", combo, tokens)


def _ranks_available(device: str) -> int:
    if device == "cuda":
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return os.cpu_count() or 1


def check_machine(combos: list[Combination], explicit_world_size: bool, oversubscribe: bool = False) -> None:
    """Refuse a device or an explicitly given world size the machine lacks, with the numbers,
    before any work (a world size the sweep file or the default asks for instead skips the
    combinations that need it: machine_reason)."""
    if any(c.combo.device not in ("cpu", "cuda") for c in combos):
        raise ValueError("runner.device must be auto, cpu or cuda")
    live = [c for c in combos if not c.reason]
    cuda = [c for c in live if c.combo.device == "cuda"]
    if cuda:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("runner.device=cuda but no CUDA GPU is visible: use runner.device=cpu or auto")
        carveout = max(c.combo.shared_sm_carveout for c in cuda)
        sms = torch.cuda.get_device_properties(0).multi_processor_count if carveout else 0
        if carveout and carveout >= sms:
            raise ValueError(f"overlap.shared_sm_carveout={carveout} leaves no SM for the shared experts: "
                             f"this GPU has {sms} SMs")
    if not explicit_world_size:
        return
    for device in ("cuda", "cpu"):
        # every combination asked for, skipped ones too: runner.world_size=64 on 2 cores is refused
        # even where each 64-rank combination would also be skipped for another reason
        sizes = [c.combo.world_size for c in combos if c.combo.device == device]
        if not sizes:
            continue
        need, have = max(sizes), _ranks_available(device)
        if need <= have or (device == "cpu" and oversubscribe):
            continue
        if device == "cuda":
            raise ValueError(f"runner.world_size={need} needs {need} GPUs (one rank per GPU) but this machine "
                             f"has {have}: set runner.world_size<={have} or run on a larger machine")
        raise ValueError(f"runner.world_size={need} starts {need} CPU ranks but this machine has {have} cores: "
                         f"set runner.world_size<={have}, or pass --oversubscribe (timings will contend)")


def machine_reason(combo: Combo, oversubscribe: bool = False) -> Optional[str]:
    """Why this machine cannot run `combo`'s ranks (world size it was not explicitly given)."""
    have = _ranks_available(combo.device)
    if combo.world_size <= have or (combo.device == "cpu" and oversubscribe):
        return None
    what = "GPUs" if combo.device == "cuda" else "CPU cores"
    return (f"backend={combo.backend} runs runner.world_size={combo.world_size} ranks (one per "
            f"{'GPU' if combo.device == 'cuda' else 'core'}): this machine has {have} {what if have != 1 else what[:-1]}")


def plan(cli_overrides: list[str], sweep: Optional[str] = None,
         oversubscribe: bool = False, this_machine: bool = True) -> tuple[list[Combination], dict]:
    """Expand overrides (and a sweep file) into validated Combinations. `this_machine=False`:
    the ranks run elsewhere (torchrun, SLURM jobs), so this machine's cores and GPUs decide
    nothing."""
    sweep_data = load_sweep(sweep) if sweep else {"name": "adhoc", "overrides": {}}
    cli_overrides = list(cli_overrides)
    renamed = [o for o in cli_overrides if rename(o) != o]
    if renamed:
        raise ValueError(f"{renamed[0]}: renamed, use {rename(renamed[0])}")
    device = sweep_device(cli_overrides)
    overrides = {**sweep_data["overrides"], **sweep_data.get(device, {})}
    explicit_ws = any(ov.key_or_group == "runner.world_size" for ov in _parse(cli_overrides))
    combos, seen, knobs_set, knobs_taken = [], set(), set(), set()
    for ovs in expand(overrides, cli_overrides):
        cfg = compose_config(ovs)
        check_values(cfg)
        combo = to_combo(cfg)
        knobs_set |= set(set_knobs(cfg))
        knobs_taken |= {f"{g}.{k}" for g in ("backend", "experts") for k, _ in combo.knobs if k in cfg[g]}
        if combo.key in seen:  # e.g. single-rank backends with different world sizes
            continue
        seen.add(combo.key)
        reason = validate(combo)
        if not reason and not explicit_ws and this_machine and _ranks_available(combo.device):  # no GPU at all: refused below
            reason = machine_reason(combo, oversubscribe)
        token_reasons = {}
        if not reason:
            for t in cfg["workload"]["tokens_per_rank"]:
                why = validate_tokens(combo, t)
                if why:
                    token_reasons[t] = why
        combos.append(Combination(combo, tuple(cfg["workload"]["tokens_per_rank"]), tuple(ovs), reason,
                                  token_reasons))
    unused = sorted(knobs_set - knobs_taken)
    if unused:
        raise ValueError(f"{unused[0]} is set, but none of the chosen entries takes it "
                         f"(`moebench list --knobs` shows which entry declares which knob)")
    if this_machine:
        check_machine(combos, explicit_ws, oversubscribe)
    return combos, sweep_data


def run_name(sweep_name: str, cli_overrides: list[str]) -> str:
    """Default run directory name: the same command resumes into the same place."""
    h = hashlib.sha1("\0".join(sorted(cli_overrides)).encode()).hexdigest()[:8]
    return f"{sweep_name}-{h}" if cli_overrides else sweep_name


def default_runs_dir() -> Path:
    return Path(os.environ.get("MOEBENCH_RUNS", "runs"))
