"""Where the Hydra config groups and named sweeps live (the repository's conf/
and sweeps/; MOEBENCH_CONF_DIR / MOEBENCH_SWEEPS_DIR override)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # moebench/config/paths.py -> the repository
# the sweep name a run without a sweep file records (`moebench run`), and so its folder's:
# runs/adhoc-<hash of the overrides> (moebench/run/plan.py run_name)
ADHOC = "adhoc"


def conf_dir() -> Path:
    p = Path(os.environ.get("MOEBENCH_CONF_DIR", REPO_ROOT / "conf"))
    if not (p / "config.yaml").exists():
        raise ValueError(
            f"moebench's config groups are not at {p}: install moebench from its repository (pip install -e .)"
        )
    return p


def hf_configs_dir() -> Path:
    """The public models' config.json files (fields only) that the built-in model cards name by
    `hf_config:` and the tests check the mapping on (tests/fixtures/hf_configs/README.md)."""
    return REPO_ROOT / "tests" / "fixtures" / "hf_configs"


def sweeps_dir() -> Path:
    return Path(os.environ.get("MOEBENCH_SWEEPS_DIR", REPO_ROOT / "sweeps"))


def default_runs_dir() -> Path:
    return Path(os.environ.get("MOEBENCH_RUNS", "runs"))
