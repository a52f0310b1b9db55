"""A sweep's plan: its overrides expanded (config/sweeps.py) into Combinations, each checked by
the validity rules (config/validity.py) and against this machine (its GPUs or cores), and the
run folder's name. A combination that cannot run is a skipped row with its reason."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from moebench.config.compose import check_values, compose_shared, rename, set_knobs, to_combo
from moebench.config.device import cuda_available, cuda_device_count
from moebench.config.paths import ADHOC
from moebench.config.spec import Combination, Combo
from moebench.config.sweeps import expand, load_sweep, parse_overrides, sweep_device
from moebench.config.validity import check_with_tokens
from moebench.util.words import agree, counted


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


# the keys that size a model's share (sweeps/default.yaml's cuda section runs DeepSeek-V3's EP-8
# share): a sweep file sets them for its own model
MODEL_SHARE_KEYS = ("backend.simulate_ep", "backend.simulate_tp", "backend.simulate_rank")


@dataclass(frozen=True)
class ModelShare:
    """A sweep file's model share: the MODEL_SHARE_KEYS it sets (its overrides and the device's
    section merged) for its one `model`, which a point of another model leaves out."""

    model: str = ""
    keys: dict = field(default_factory=dict)  # key -> the file's value

    def drop(self, ovs: list[str]) -> tuple[list[str], str]:
        """(the point's overrides, its model where the share was left out, else '')."""
        if not self.keys:
            return ovs, ""
        model = next((o.split("=", 1)[1] for o in ovs if o.split("=", 1)[0] == "model"), self.model)
        if model == self.model:
            return ovs, ""
        return [o for o in ovs if o.split("=", 1)[0] not in self.keys], model

    def note(self, sweep_name: str, models: list[str]) -> str:
        what = ", ".join(f"{k}={v}" for k, v in self.keys.items())
        keep = " ".join(f"{k}={v}" for k, v in self.keys.items())
        runs = ", ".join(f"model={m}" for m in models)
        return (
            f"the {sweep_name} sweep sets {what} for its model ({self.model}); {runs} "
            f"{agree(len(models), 'runs', 'run')} without it (pass {keep} to keep it)"
        )


def model_share(merged: dict, cli_overrides: list[str]) -> ModelShare:
    """The share a sweep file's points of another model leave out: its MODEL_SHARE_KEYS, where the
    file names one model and the command line names a model but not the key (the command line's
    own values always stand); `model=mixtral_8x7b` on a GPU is then the whole layer, not one eighth
    of its experts, and `model=deepseek_v3,mixtral_8x7b` keeps the share for deepseek_v3 alone."""
    model = merged.get("model")
    if not isinstance(model, str) or "," in model:  # none, or several: no one model owns the share
        return ModelShare()
    given = {ov.key_or_group for ov in parse_overrides(cli_overrides)}
    if "model" not in given:
        return ModelShare()
    keys = {k: merged[k] for k in MODEL_SHARE_KEYS if k in merged and k not in given}
    return ModelShare(model, keys) if keys else ModelShare()


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
    overrides = {**sweep_data["overrides"], **sweep_data.get(device, {})}
    share, unshared = model_share(overrides, cli_overrides), []
    explicit_ws = any(ov.key_or_group == "runner.world_size" for ov in parse_overrides(cli_overrides))
    combos, seen, knobs_set, knobs_taken = [], set(), set(), set()
    for ovs in expand(overrides, cli_overrides):
        ovs, other = share.drop(ovs)
        if other and other not in unshared:
            unshared.append(other)
        cfg = compose_shared(ovs)  # read only: its groups are shared with other combinations
        check_values(cfg)
        combo = to_combo(cfg)
        knobs_set |= set(set_knobs(cfg))
        knobs_taken |= {f"{g}.{k}" for g in ("backend", "experts") for k, _ in combo.knobs if k in cfg[g]}
        key = combo.key
        if key in seen:  # e.g. single-rank backends with different world sizes
            continue
        seen.add(key)
        tokens = tuple(cfg["workload"]["tokens_per_rank"])
        skip, token_skips = check_with_tokens(combo, tokens)
        reason, rule = (skip.reason, skip.rule) if skip else (None, False)
        if (
            not reason and not explicit_ws and this_machine and _ranks_available(combo.device)
        ):  # no GPU at all: refused below
            reason = machine_reason(combo, oversubscribe)
        combos.append(Combination(combo, tokens, tuple(ovs), reason, rule, token_skips))
    unused = sorted(knobs_set - knobs_taken)
    if unused:
        raise ValueError(
            f"{unused[0]} is set, but none of the chosen entries takes it "
            f"(`moebench list --knobs` shows which entry declares which knob)"
        )
    if this_machine:
        check_machine(combos, explicit_ws, oversubscribe)
    if unshared:
        sweep_data = {**sweep_data, "notes": [share.note(sweep_data["name"], unshared)]}
    return combos, sweep_data


def refuse_impossible(combos: list[Combination]) -> None:
    """Refuse, before any work (ValueError: one line, exit 2), a request no machine runs any of:
    every combination breaks a rule of the plan (Combination.rule), or each of its token counts
    does (token_rules: a cap the config sets). Where one (combination, token count) can run, or
    this machine is why one is skipped, the sweep goes on and each is a skipped row with its reason."""
    if not combos or not all(c.ruled_out for c in combos):
        return
    pairs = not all(c.rule for c in combos)  # a token count's rule: count (combination, token count) pairs
    if pairs:
        reasons = [(c.reason or "") if c.rule else c.token_skips[t].reason for c in combos for t in c.tokens]
    else:
        reasons = [c.reason or "" for c in combos]
    groups = reason_groups(reasons)
    if len(reasons) == 1:
        at = f" at workload.tokens_per_rank={combos[0].tokens[0]}" if pairs else ""
        raise ValueError(f"no machine can run this combination{at}: {groups[0][1]}")
    rules = "; ".join(f"{n} with {text}" for n, text in groups)
    what = f"{len(reasons)} (combination, token count) pairs" if pairs else f"{len(combos)} combinations"
    raise ValueError(f"no machine can run any of these {what}, each breaks a rule: {rules}")


def planned(combos: list[Combination], work: list, skipped_rows: int, already: int, where: str = "") -> str:
    """The plan against the store, combinations and rows each counted in their own parentheses:
    '1008 combinations (72 to run, 936 skipped), 2016 rows (144 to run, 1872 skipped)', 'already
    stored' beside them where a resume finds some. A combination is to run where one of its rows is
    (`work`: results/finished.py plan_work's), skipped where none of its token counts can run,
    already stored where every one that can is; `where` follows the combinations' 'to run'
    (' on 2 ranks')."""
    num_skipped = sum(1 for c in combos if not c.runnable_tokens)
    num_stored = len(combos) - len(work) - num_skipped
    rows_to_run = sum(len(tokens) for _, tokens in work)

    def parts(run: int, stored: int, skipped: int, at: str = "") -> str:
        said = [f"{run} to run{at}"]
        if stored:
            said.append(f"{stored} already stored")
        if skipped:
            said.append(f"{skipped} skipped")
        return ", ".join(said)

    rows = rows_to_run + already + skipped_rows
    return (
        f"{counted(len(combos), 'combination')} ({parts(len(work), num_stored, num_skipped, where)}), "
        f"{counted(rows, 'row')} ({parts(rows_to_run, already, skipped_rows)})"
    )


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
