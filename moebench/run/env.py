"""Environment fingerprint (env.json) and `moebench env`: what this machine is,
which libraries it has, and which entries are usable here (and if not, why and
how to fix it)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess

from moebench import __version__
from moebench.config.device import cpu_threads
from moebench.config.paths import REPO_ROOT
from moebench.kernels import CONTRACT_VERSION
from moebench.run.treestate import tree_state

LIBRARIES = {
    # import name: (distribution names to ask for a version, how to install)
    "deep_ep": (
        ("deep_ep", "deep-ep"),
        "build DeepEP v1.2.1 (github.com/deepseek-ai/DeepEP) against NVSHMEM; "
        "see README 'GPU machines and the optional libraries'",
    ),
    "deep_gemm": (
        ("deep_gemm", "deep-gemm", "deepinfer-gemm"),
        "scripts/install_deep_gemm.sh on the GPU machine (PyPI deepinfer-gemm 2.8.2); see README",
    ),
    "pplx_kernels": (
        ("pplx_kernels", "pplx-kernels"),
        "build github.com/ppl-ai/pplx-kernels against NVSHMEM; see README",
    ),
    "nvtx": (("nvtx",), "pip install nvtx"),
}
ENV_PREFIXES = ("NCCL_", "NVSHMEM_", "CUDA_", "TORCH_", "TRITON_", "PYTORCH_", "OMP_", "MOEBENCH_")


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    # not installed, not runnable, past its 20 s, or output that is not text
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return ""


def library_version(name: str) -> str | None:
    """Installed version of an optional library, or None when it does not import."""
    dists, _ = LIBRARIES[name]
    try:
        mod = __import__(name)
    except Exception:  # noqa: BLE001 (a compiled optional library fails in its own ways: OSError, RuntimeError; absent then)
        return None
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            pass
    return getattr(mod, "__version__", "unknown")


def git_info() -> dict:
    """Which code runs (moebench/run/treestate.py): `git_sha` (the commit, bare hex, or "unknown"),
    `git_dirty` (True / False / None: not known), `git_diff_sha256` (the difference from the
    commit, None when clean), `git_tree` (what said so: git, stamp, MOEBENCH_GIT_SHA, git-unsafe or none),
    `git_tree_note` and `git_diff_paths`. From the checkout's .git, else from the
    .moebench-tree.json that scripts/copy_tree.sh writes (a tree copied without .git: its files
    are rehashed, once per call), else from MOEBENCH_GIT_SHA with the state unknown; `moebench
    ab` names each worktree's commit there and its worktree's .git gives the state."""
    return tree_state(REPO_ROOT, os.environ.get("MOEBENCH_GIT_SHA")).fields()


def fingerprint(with_plugins: bool = True) -> dict:
    """moebench's version, GPU, driver, CUDA, NCCL, torch, triton, library versions, clocks, env
    vars, git; and the plugins (imported here, each within MOEBENCH_PLUGIN_TIMEOUT_S) unless not
    `with_plugins`."""
    import torch

    info: dict = {
        "moebench": __version__,
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_threads": cpu_threads(),  # torch threads of each CPU rank (run/worker.py rank_device)
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        # bytes of GPU 0 (moebench report --capacity --budget free)
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 (the fingerprint records what imports; a broken Triton is None, not a failed run)
        info["triton"] = None
    for lib in LIBRARIES:
        info[lib] = library_version(lib)
    if info["gpu_count"]:
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(info["gpu_count"])]
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 (a torch built without NCCL, or one that fails to load it: None)
            info["nccl"] = None
        if shutil.which("nvidia-smi"):
            info["nvidia_smi"] = _run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu",
                    "--format=csv,noheader",
                ]
            ).splitlines()
            info["topology"] = _run(["nvidia-smi", "topo", "-m"])
    else:
        info["gpu"] = "cpu"
    info["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    info.update(git_info())
    info.update(profiler_info())
    if with_plugins:
        info["plugins"] = plugin_info()
    return info


def plugin_info() -> list[dict]:
    """Every plugin found (docs/plugins.md): name, module, distribution and version, the contract
    it declares, loaded or disabled with the reason, and its entries."""
    from moebench.kernels import registry

    return [p.as_dict() for p in registry.plugins()]


def profiler_info() -> dict:
    """`nsys`: which Nsight Systems trace=nsys would run (path, version, kind: full | target |
    ncu-bundled) and whether it can trace this driver (traces/nsys_import.py `nsys_info`);
    `nvtx_api`: which API emits moebench's NVTX ranges here (torch.cuda.nvtx with CUDA, the nvtx
    package without: traces/nvtx.py)."""
    from moebench.run.nsys_import import nsys_info
    from moebench.traces.nvtx import nvtx_api

    try:
        nsys = nsys_info()
    except Exception as e:  # noqa: BLE001 - the fingerprint never fails on a probe
        nsys = {"path": None, "version": None, "kind": None, "note": f"probe failed: {type(e).__name__}: {e}"}
    return {"nsys": nsys, "nvtx_api": nvtx_api()}


def env_id(info: dict) -> str:
    """Short id of what changes the numbers (not the hostname or the git sha)."""
    keys = ("gpu", "gpu_count", "torch", "cuda", "nccl", "triton", "deep_ep", "deep_gemm", "pplx_kernels", "python")
    return hashlib.sha1(json.dumps({k: info.get(k) for k in keys}, sort_keys=True).encode()).hexdigest()[:10]


def usable_entries(device: str, world_size: int) -> list[dict]:
    """Every registered backend / experts entry and why it is not usable here."""
    from moebench.kernels import registry

    registry.discover()
    probe = {
        "device": device,
        "world_size": world_size,
        "quant": "bf16",
        "hidden": 2048,
        "intermediate": 1408,
        "num_experts": 64,
        "topk": 6,
        "reduction": "finalize",
        "overlap": "none",
        "simulate_ep": 1,
        "max_tokens_per_rank": 512,
        "num_sms": 24,
        "deepgemm_min_tokens": 256,
        "tokens_per_rank": [64],
    }
    out = []
    for kind, table in (("backend", registry.BACKENDS), ("experts", registry.EXPERTS)):
        for name, cls in sorted(table.items()):
            combo = dict(
                probe, backend=name if kind == "backend" else "local", experts=name if kind == "experts" else "torch"
            )
            if "deepgemm" in name:  # deepgemm, deepgemm_masked, triton_or_deepgemm: fp8_block only
                combo["quant"] = "fp8_block"
            if kind == "backend" and name.startswith("local"):
                combo["world_size"] = 1
            out.append(
                {
                    "kind": kind,
                    "name": name,
                    "layout": cls.activation_format.value,
                    "origin": registry.origin(kind, name),
                    "reason": registry.ask(kind, name, "supports", combo),
                }
            )
    for (kind, name), p in sorted(registry.DISABLED.items()):
        if name not in (registry.BACKENDS if kind == "backend" else registry.EXPERTS):
            out.append(
                {
                    "kind": kind,
                    "name": name,
                    "layout": "?",
                    "origin": p.origin,
                    "reason": registry.unavailable(kind, name),
                }
            )
    for name in (p.stem for p in sorted((REPO_ROOT / "conf" / "backend").glob("*.yaml"))):
        if name not in registry.BACKENDS:
            out.append(
                {
                    "kind": "backend",
                    "name": name,
                    "layout": "?",
                    "origin": "",
                    "reason": "no implementation in this build yet",
                }
            )
    for name in (p.stem for p in sorted((REPO_ROOT / "conf" / "experts").glob("*.yaml"))):
        if name not in registry.EXPERTS:
            out.append(
                {
                    "kind": "experts",
                    "name": name,
                    "layout": "?",
                    "origin": "",
                    "reason": "no implementation in this build yet",
                }
            )
    return out


def env_command(as_json: bool) -> int:
    """`moebench env`: the machine and its libraries first (no plugin imported for them), then the
    plugins and which entries are usable here."""
    info = fingerprint(with_plugins=False)
    if as_json:
        info["plugins"] = plugin_info()
        entries = _entries(info)
        print(json.dumps({"env": info, "env_id": env_id(info), "entries": entries}, indent=2, default=str))
        return 0
    _print_machine(info)
    info["plugins"] = plugin_info()  # a hanging plugin: disabled after its deadline, said below
    _print_plugins(info, _entries(info))
    return 0


def _entries(info: dict) -> list[dict]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ws = max(2, info["gpu_count"]) if device == "cuda" else 2
    return usable_entries(device, min(ws, info["gpu_count"]) if device == "cuda" else 2)


def _print_machine(info: dict) -> None:
    print(f"moebench  {info['moebench']}")
    print(
        f"machine   {info['hostname']}  python {info['python']}  cpus {info['cpu_count']}  "
        f"torch threads per CPU rank {info['cpu_threads']}"
    )
    gpus = info["gpu_count"]
    where = f"{info['gpu']} x{gpus}  nccl {info.get('nccl')}" if gpus else "none (CPU ranks over gloo)"
    print(f"gpu       {where}")
    print(f"torch     {info['torch']}  cuda {info['cuda']}  triton {info['triton']}")
    state = {True: f"dirty, diff {str(info.get('git_diff_sha256'))[:12]}", False: "clean", None: "state unknown"}
    print(
        f"git       {info['git_sha'][:12]} ({state[info['git_dirty']]}; "
        f"from {info['git_tree']})   env_id {env_id(info)}"
    )
    if info.get("git_tree_note"):
        print(f"          {info['git_tree_note']}")
    print()
    print("optional libraries:")
    for lib, (_, how) in LIBRARIES.items():
        v = info.get(lib)
        print(f"  {lib:<13} {v if v else 'missing -> ' + how}")
    ns = info.get("nsys") or {}
    print()
    print("profilers:")
    where = f"{ns.get('path')}  {ns.get('version')}  ({ns.get('kind')})" if ns.get("path") else "missing"
    print(f"  nsys          {where}" + (f"\n                {ns['note']}" if ns.get("note") else ""))
    api = info.get("nvtx_api")
    recorded = {
        "torch.cuda.nvtx": "recorded by Nsight Systems 2024.2",
        "nvtx package": "not recorded by Nsight Systems 2024.2: no capture range opens (no CUDA here)",
    }
    # what nsys would make of them, said only where there is an nsys to ask
    why = recorded.get(api or "", "") if ns.get("path") else "no nsys to record them"
    print(f"  nvtx ranges   {api + ' (' + why + ')' if api else 'none: no CUDA and no nvtx package'}")
    print(flush=True)


def _print_plugins(info: dict, entries: list[dict]) -> None:
    print(f"plugins (contract {CONTRACT_VERSION}; docs/plugins.md):" + ("" if info["plugins"] else " none"))
    for p in info["plugins"]:
        where = f"{p['dist']} {p['version']}" if p["dist"] else f"module {p['module']}"
        status = "loaded: " + " ".join(p["entries"]) if p["status"] == "loaded" else f"disabled: {p['reason']}"
        contract = "?" if p["contract"] is None else p["contract"]  # unknown when the import failed
        print(f"  {p['name']:<13} {where}  contract {contract}  {status}")
    print()
    print(f"entries on this machine (device={'cuda' if info['gpu_count'] else 'cpu'}):")
    for e in entries:
        status = "usable" if not e["reason"] else f"not usable: {e['reason']}"
        where = f"  [{e['origin']}]" if e["origin"] not in ("moebench", "") else ""
        print(f"  {e['kind']:<8} {e['name']:<20} {e['layout']:<9} {status}{where}")
