"""A sweep's plan: its overrides expanded (config/sweeps.py) into Combinations, each checked by
the validity rules (config/validity.py) and against this machine (its GPUs or cores), and the
run folder's name. A combination that cannot run is a skipped row with its reason."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from typing import Optional

from moebench.config.compose import check_values, compose_shared, rename, set_knobs, to_combo
from moebench.config.device import cuda_available, cuda_device_count
from moebench.config.paths import ADHOC
from moebench.config.spec import Combination, Combo
from moebench.config.sweeps import expand, load_sweep, parse_overrides, sweep_device
from moebench.config.validity import validate, validate_tokens


def _ranks_available(device: str) -> int:
    if device == "cuda":
        return cuda_device_count()  # no torch import on a machine that certainly has no GPU
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
        if not cuda_available():
            raise ValueError("runner.device=cuda but no CUDA GPU is visible: use runner.device=cpu or auto")
        carveout = max(c.combo.shared_sm_carveout for c in cuda)
        if carveout:
            import torch

            sms = torch.cuda.get_device_properties(0).multi_processor_count
            if carveout >= sms:
                raise ValueError(
                    f"overlap.shared_sm_carveout={carveout} leaves no SM for the shared experts: this GPU has {sms} SMs"
                )
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
            raise ValueError(
                f"runner.world_size={need} needs {need} GPUs (one rank per GPU) but this machine "
                f"has {have}: set runner.world_size<={have} or run on a larger machine"
            )
        raise ValueError(
            f"runner.world_size={need} starts {need} CPU ranks but this machine has {have} cores: "
            f"set runner.world_size<={have}, or pass --oversubscribe (timings will contend)"
        )


def machine_reason(combo: Combo, oversubscribe: bool = False) -> Optional[str]:
    """Why this machine cannot run `combo`'s ranks (world size it was not explicitly given)."""
    have = _ranks_available(combo.device)
    if combo.world_size <= have or (combo.device == "cpu" and oversubscribe):
        return None
    what = "GPUs" if combo.device == "cuda" else "CPU cores"
    return (
        f"backend={combo.backend} runs runner.world_size={combo.world_size} ranks (one per "
        f"{'GPU' if combo.device == 'cuda' else 'core'}): this machine has {have} {what if have != 1 else what[:-1]}"
    )


# a device section's keys that size its model's share (sweeps/default.yaml's cuda section runs
# DeepSeek-V3's EP-8 share): they go with that section's model
MODEL_SHARE_KEYS = ("backend.simulate_ep", "backend.simulate_tp", "backend.simulate_rank")


def model_share(section: dict, cli_overrides: list[str], sweep_name: str, device: str) -> tuple[dict, list[str]]:
    """(the device section to merge, notes to print): where the section sets a model and the
    command line names another, the section's MODEL_SHARE_KEYS (set for its model) are dropped
    unless the command line sets them too, and a note says so; `model=mixtral_8x7b` on a GPU is
    then the whole layer, not one eighth of its experts."""
    if "model" not in section:
        return section, []
    given = {ov.key_or_group: ov for ov in parse_overrides(cli_overrides)}
    if "model" not in given:
        return section, []
    dropped = [k for k in MODEL_SHARE_KEYS if k in section and k not in given]
    if not dropped:
        return section, []
    kept = {k: v for k, v in section.items() if k not in dropped}
    what = ", ".join(f"{k}={section[k]}" for k in dropped)
    keep = " ".join(f"{k}={section[k]}" for k in dropped)
    return kept, [
        f"the {sweep_name} sweep's {device} section sets {what} for its model ({section['model']}); "
        f"{given['model'].input_line} runs without it (pass {keep} to keep it)"
    ]


def plan(
    cli_overrides: list[str], sweep: Optional[str] = None, oversubscribe: bool = False, this_machine: bool = True
) -> tuple[list[Combination], dict]:
    """Expand overrides (and a sweep file) into validated Combinations. `this_machine=False`:
    the ranks run elsewhere (torchrun, SLURM jobs), so this machine's cores and GPUs decide
    nothing."""
    sweep_data: dict = load_sweep(sweep) if sweep else {"name": ADHOC, "overrides": {}}
    cli_overrides = list(cli_overrides)
    renamed = [o for o in cli_overrides if rename(o) != o]
    if renamed:
        raise ValueError(f"{renamed[0]}: renamed, use {rename(renamed[0])}")
    device = sweep_device(cli_overrides)
    section, notes = model_share(sweep_data.get(device, {}), cli_overrides, sweep_data["name"], device)
    overrides = {**sweep_data["overrides"], **section}
    if notes:
        sweep_data = {**sweep_data, "notes": notes}
    explicit_ws = any(ov.key_or_group == "runner.world_size" for ov in parse_overrides(cli_overrides))
    combos, seen, knobs_set, knobs_taken = [], set(), set(), set()
    for ovs in expand(overrides, cli_overrides):
        cfg = compose_shared(ovs)  # read only: its groups are shared with other combinations
        check_values(cfg)
        combo = to_combo(cfg)
        knobs_set |= set(set_knobs(cfg))
        knobs_taken |= {f"{g}.{k}" for g in ("backend", "experts") for k, _ in combo.knobs if k in cfg[g]}
        key = combo.key
        if key in seen:  # e.g. single-rank backends with different world sizes
            continue
        seen.add(key)
        reason = validate(combo)
        if (
            not reason and not explicit_ws and this_machine and _ranks_available(combo.device)
        ):  # no GPU at all: refused below
            reason = machine_reason(combo, oversubscribe)
        token_reasons = {}
        if not reason:
            for t in cfg["workload"]["tokens_per_rank"]:
                why = validate_tokens(combo, t)
                if why:
                    token_reasons[t] = why
        combos.append(Combination(combo, tuple(cfg["workload"]["tokens_per_rank"]), tuple(ovs), reason, token_reasons))
    unused = sorted(knobs_set - knobs_taken)
    if unused:
        raise ValueError(
            f"{unused[0]} is set, but none of the chosen entries takes it "
            f"(`moebench list --knobs` shows which entry declares which knob)"
        )
    if this_machine:
        check_machine(combos, explicit_ws, oversubscribe)
    return combos, sweep_data


def reason_groups(reasons: list[str]) -> list[tuple[int, str]]:
    """(count, text) per reason, most frequent first; reasons that share their head (the
    text before the first ':', e.g. 'layouts differ') are one group: its most frequent
    reason as the example and how many variants it has."""
    groups: dict[str, Counter] = {}
    for r in reasons:
        groups.setdefault(r.split(":")[0] if ":" in r else r, Counter())[r] += 1
    out = []
    for variants in groups.values():
        example, _ = variants.most_common(1)[0]
        more = f" (and {len(variants) - 1} more like it)" if len(variants) > 1 else ""
        out.append((sum(variants.values()), f"{example}{more}"))
    return sorted(out, key=lambda x: (-x[0], x[1]))


def run_name(sweep_name: str, cli_overrides: list[str]) -> str:
    """Default run directory name: the same command resumes into the same place."""
    h = hashlib.sha1("\0".join(sorted(cli_overrides)).encode()).hexdigest()[:8]
    return f"{sweep_name}-{h}" if cli_overrides else sweep_name
