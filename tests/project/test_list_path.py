"""`moebench list` plans from the entries' cards (kernels/cards/) and the spec: its path imports
neither torch, Triton, pandas nor an implementation module (issue #33: importing torch alone
took 1.2-3.3 s of a 6 s `list`), and `benchmarks/list_time.py` times it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import list_time  # noqa: E402 (after sys.path takes benchmarks/)

HEAVY = ("torch", "triton", "numpy", "pandas", "pyarrow")
CODE = """
import json, sys
from moebench.cli import main
rc = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
impl = sorted(m for m in sys.modules
              if m.startswith(("moebench.kernels.prepare_finalize.", "moebench.kernels.experts."))
              and not m.rpartition(".")[2].startswith("_"))
others = sorted(m for m in sys.modules if m.startswith("moebench.kernels.") and m.rpartition(".")[2] in
                ("interfaces", "modular", "reference", "quant", "weight_and_reduce")
                or m.startswith("moebench.kernels.triton"))
print("@@" + json.dumps({{"rc": rc, "heavy": heavy, "impl": impl, "others": others}}))
"""


def _imports_of(*args: str) -> dict:
    # no plugin (a plugin's module may import torch); CUDA_VISIBLE_DEVICES="": the CPU's answer on a
    # GPU host too (there runner.device=auto asks torch: moebench/config/device.py)
    env = {k: v for k, v in os.environ.items() if k not in ("MOEBENCH_PLUGIN_MODULES", "PYTHONPATH")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run(
        [sys.executable, "-c", CODE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.rpartition("@@")[2])


def test_list_of_the_default_sweep_imports_no_torch_nor_an_implementation():
    got = _imports_of("list")
    assert got == {"rc": 0, "heavy": [], "impl": [], "others": []}


def test_list_verbose_json_and_knobs_stay_light_too():
    for args in (["list", "--verbose", "--sweep", "sweeps/ep_scaling.yaml"], ["list", "--json"], ["list", "--knobs"]):
        got = _imports_of(*args)
        assert (got["heavy"], got["impl"], got["others"]) == ([], [], []), (args, got)


def test_the_benchmark_times_fresh_processes():
    s = list_time.summary([1.0, 3.0, 2.0])
    assert (s["median_s"], s["min_s"], s["max_s"], s["runs"]) == (2.0, 1.0, 3.0, 3)
    (t,) = list_time.wall_times(1, ["backend=local", "experts=torch"])
    assert t > 0


def test_sweep_dry_run_plans_without_torch(tmp_path):
    """`sweep --dry-run` shares the plan; it reads the run folder's store (pandas), but starts
    no rank, so it imports neither torch nor an implementation (the launcher is imported where
    ranks start)."""
    got = _imports_of("sweep", "--dry-run", "--out", str(tmp_path / "run"))
    assert got["rc"] == 0 and got["impl"] == [] and got["others"] == []
    assert not {"torch", "triton"} & set(got["heavy"]), got["heavy"]
