"""Sweep files (sweeps/*.yaml): a description and the overrides they expand, with a sweep
file's per-device sections, expanded with Hydra's override parser into the cartesian
product of the axes (docs/design.md, "Combinations and their identity")."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from moebench.config import paths
from moebench.config.compose import CHOICES
from moebench.config.device import resolve_device
from moebench.config.names import did_you_mean

DEVICE_SECTIONS = ("cpu", "cuda")  # a sweep file's per-device overrides


def load_sweep(name_or_path: str) -> dict:
    """A sweep file: {'description', 'overrides': {key: value-or-sweep-string}}, optionally
    'cpu:' / 'cuda:' sections merged over 'overrides' on that device."""
    p = Path(name_or_path)
    if not p.suffix:
        p = paths.sweeps_dir() / f"{name_or_path}.yaml"
    elif not p.exists() and p.name == name_or_path and p.suffix in (".yaml", ".yml"):
        p = paths.sweeps_dir() / name_or_path  # a named sweep's file name: default.yaml
    if not p.exists():
        valid = sorted(x.stem for x in paths.sweeps_dir().glob("*.yaml"))
        near = did_you_mean(Path(name_or_path).stem, valid)
        raise ValueError(
            f"no sweep {name_or_path!r}: give a sweep's name (default), its file name in sweeps/ (default.yaml) "
            f"or a path to a sweep file; named sweeps: {', '.join(valid)}{near}"
        )
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a mapping with 'description' and 'overrides: {{key: value(s)}}'")
    unknown = set(data) - {"description", "overrides", *DEVICE_SECTIONS}
    if unknown:
        raise ValueError(
            f"{p}: unknown sections {sorted(unknown)}; a sweep file has description, overrides "
            f"and optionally {' / '.join(DEVICE_SECTIONS)}"
        )
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


def parse_overrides(raw: list[str]):
    try:
        return OverridesParser.create().parse_overrides(list(raw))
    except HydraException as e:
        raise ValueError(f"cannot parse overrides {raw}: {e}") from None


def sweep_device(cli_overrides: list[str]) -> str:
    """The device a sweep runs on: runner.device from the command line, else auto."""
    device = "auto"
    for ov in parse_overrides(cli_overrides):
        if ov.key_or_group == "runner.device" and not ov.is_sweep_override():
            device = ov.get_value_element_as_str()
    return resolve_device(device) if device in CHOICES[("runner", "device")] else device


def expand(sweep_overrides: dict, cli_overrides: list[str]) -> list[list[str]]:
    """Cartesian product of sweep values; CLI overrides replace the sweep file's value for
    the same key."""
    merged: dict[str, str] = {k: f"{k}={_value_str(v)}" for k, v in sweep_overrides.items()}
    for raw, ov in zip(cli_overrides, parse_overrides(cli_overrides), strict=True):
        merged[ov.key_or_group] = raw
    axes: list[list[str]] = []
    for raw in merged.values():
        ov = parse_overrides([raw])[0]
        if ov.is_sweep_override():
            key = ov.get_key_element()
            axes.append([f"{key}={v}" for v in ov.sweep_string_iterator()])
        else:
            axes.append([raw])
    return [list(p) for p in itertools.product(*axes)]
