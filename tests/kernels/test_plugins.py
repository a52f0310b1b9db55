"""Plugins (docs/plugins.md): the example package (examples/moebench-example-plugin) is
installed into a temporary folder and moebench runs in subprocesses with that folder on
PYTHONPATH (entry points are found from its *.dist-info). Its entries appear in `moebench
list` and `moebench env`, run on 2 gloo ranks, their rows carry the plugin's version, and
the A/B axis comparison pairs mykernel_v1 with mykernel_v2. Broken plugins beside it (an
import error, a name clash, an old contract, a `supports` that raises) are reported and
disabled, and the rest of the sweep runs."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from moebench.config import spec
from moebench.kernels import CONTRACT_VERSION, registry
from moebench.results.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "moebench-example-plugin"
ORIGIN = "moebench-example-plugin 0.1.0"
QUICK = ["runner.reps=3", "runner.warmup=1", "runner.phase_reps=2", "runner.memory=false"]

# distribution -> (its module's source, the entries it would register); each is broken one way
BROKEN = {
    "broken-import": ("MOEBENCH_CONTRACT = 1\nimport moebench_no_such_module_anywhere\n", ()),
    "clash": (
        """
        MOEBENCH_CONTRACT = 1
        from moebench.kernels.experts.torch import TorchExperts
        from moebench.kernels.registry import register_experts

        @register_experts("clashy_only")
        class Mine(TorchExperts):
            pass

        @register_experts("torch")  # a built-in's name
        class Theirs(TorchExperts):
            pass
        """,
        ("clashy_only",),
    ),
    "old-contract": (
        """
        MOEBENCH_CONTRACT = 0
        from moebench.kernels.experts.torch import TorchExperts
        from moebench.kernels.registry import register_experts

        @register_experts("old_kernel")
        class Old(TorchExperts):
            pass
        """,
        ("old_kernel",),
    ),
    "raises-in-supports": (
        """
        MOEBENCH_CONTRACT = 1
        from moebench.kernels.experts.torch import TorchExperts
        from moebench.kernels.registry import register_experts

        @register_experts("raising_kernel")
        class Raising(TorchExperts):
            @classmethod
            def supports(cls, combo):
                raise RuntimeError("boom in supports")
        """,
        ("raising_kernel",),
    ),
}


def _write_dist(site: Path, dist: str, source: str) -> None:
    """A distribution as pip leaves it: its module and a *.dist-info with one entry point."""
    module = dist.replace("-", "_") + "_plugin"
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[moebench.kernels]\n{dist} = {module}\n")


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """(the example installed by pip, the broken distributions) in two temporary folders."""
    base = tmp_path_factory.mktemp("plugins")
    src = base / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    good = base / "good"
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(good),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pip.returncode == 0, f"pip install of the example plugin failed:\n{pip.stdout[-3000:]}{pip.stderr[-6000:]}"
    assert list(good.glob("moebench_example_plugin-0.1.0.dist-info/entry_points.txt"))
    bad = base / "bad"
    bad.mkdir()
    for dist, (source, _) in BROKEN.items():
        _write_dist(bad, dist, source)
    return good, bad


def moebench(args: list[str], paths: list[Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != registry.PLUGIN_MODULES_VAR}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT)])
    env["MOEBENCH_RUNS"] = str(cwd / "runs")
    return subprocess.run(
        [sys.executable, "-m", "moebench.cli", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.multiprocess
def test_list_shows_the_example_entries_with_each_field_of_their_combination(sites, tmp_path):
    good, _ = sites
    ovs = [
        "backend=example_a2a,naive",
        "experts=mykernel_v1,mykernel_v2,torch",
        "reduction=experts",
        "overlap=none",
        "quant=bf16,fp8_block",
        "model=tiny",
        "runner.device=cpu",
    ]
    p = moebench(["list", "--json", *ovs], [good], tmp_path)
    assert p.returncode == 0, p.stderr
    items = {(i["backend"], i["experts"], i["quant"]): i for i in json.loads(p.stdout)}
    assert len(items) == 12
    v1 = items[("example_a2a", "mykernel_v1", "bf16")]
    assert v1["status"] == "valid" and v1["world_size"] == 2 and v1["model"] == "tiny"
    assert (v1["reduction"], v1["overlap"], v1["hidden"]) == ("experts", "none", 256)
    assert v1["knobs"] == {"a2a_async": True}
    assert v1["backend_origin"] == v1["experts_origin"] == ORIGIN
    assert items[("naive", "torch", "bf16")]["experts_origin"] == "moebench"
    assert items[("naive", "torch", "bf16")]["knobs"] == {}
    skipped = items[("naive", "mykernel_v2", "fp8_block")]  # the plugin's own supports() rule
    assert skipped["status"] == "skipped" and "bf16 only" in skipped["reason"]
    assert items[("example_a2a", "torch", "fp8_block")]["status"] == "valid"
    # its supports() returns a Rule (docs/plugins.md): a run of nothing else is refused, no run folder
    one = ["backend=naive", "experts=mykernel_v2", "quant=fp8_block", "reduction=experts", "overlap=none", "model=tiny"]
    only = moebench(["run", *one, "runner.device=cpu"], [good], tmp_path)
    assert only.returncode == 2, only.stderr
    assert "error: no machine can run this combination: experts=mykernel_v2 computes in bf16 only" in only.stderr
    assert not (tmp_path / "runs").exists()

    text = moebench(["list", *ovs], [good], tmp_path)
    assert text.returncode == 0, text.stderr
    assert f"valid   example_a2a/mykernel_v2/experts/none/bf16/tiny/ws2  [from {ORIGIN}]" in text.stdout
    assert "plugin 'example' (distribution moebench-example-plugin 0.1.0" in text.stdout
    assert "backend=example_a2a experts=mykernel_v1 experts=mykernel_v2" in text.stdout
    knobs = moebench(["list", "--knobs"], [good], tmp_path)
    assert "backend.a2a_async" in knobs.stdout and "[example_a2a]" in knobs.stdout


@pytest.mark.multiprocess
def test_env_lists_the_plugins_loaded_and_disabled_with_their_reasons(sites, tmp_path):
    p = moebench(["env", "--json"], list(sites), tmp_path)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    plugins = {x["name"]: x for x in out["env"]["plugins"]}
    assert set(plugins) == {"example", *BROKEN}
    ex = plugins["example"]
    assert (ex["status"], ex["dist"], ex["version"], ex["contract"]) == (
        "loaded",
        "moebench-example-plugin",
        "0.1.0",
        CONTRACT_VERSION,
    )
    assert ex["entries"] == ["backend=example_a2a", "experts=mykernel_v1", "experts=mykernel_v2"]
    assert plugins["raises-in-supports"]["status"] == "loaded"
    reasons = {n: x["reason"] for n, x in plugins.items() if x["status"] == "disabled"}
    assert set(reasons) == {"broken-import", "clash", "old-contract"}
    assert "import failed: ModuleNotFoundError" in reasons["broken-import"]
    assert "experts 'torch'" in reasons["clash"] and "moebench registers already" in reasons["clash"]
    assert "plugin contract 0" in reasons["old-contract"] and f"contract {CONTRACT_VERSION}" in reasons["old-contract"]
    entries = {(e["kind"], e["name"]): e for e in out["entries"]}
    assert entries[("experts", "mykernel_v1")]["origin"] == ORIGIN
    assert entries[("experts", "torch")]["origin"] == "moebench"  # the clash replaced nothing
    assert "disabled" in entries[("experts", "clashy_only")]["reason"]
    assert ("experts", "old_kernel") in entries and ("experts", "raising_kernel") in entries
    text = moebench(["env"], list(sites), tmp_path)
    assert "plugins (contract 1" in text.stdout and "old-contract 0.0.1  contract 0  disabled" in text.stdout


@pytest.fixture(scope="module")
def sweep_run(sites, tmp_path_factory):
    """One sweep on 2 gloo ranks with every plugin on the path: the example's two experts
    versions and moebench's torch experts over its all-to-all, plus the broken plugins'
    entries named on the command line (no sweep file edited)."""
    cwd = tmp_path_factory.mktemp("sweep")
    run = cwd / "run"
    p = moebench(
        [
            "sweep",
            "backend=example_a2a",
            "experts=mykernel_v1,mykernel_v2,torch,raising_kernel,clashy_only",
            "reduction=experts,finalize",
            "overlap=none",
            "quant=bf16",
            "model=tiny",
            "runner.device=cpu",
            "runner.world_size=2",
            "workload.tokens_per_rank=[5]",
            *QUICK,
            "--out",
            str(run),
        ],
        list(sites),
        cwd,
        timeout=600,
    )
    return run, p


@pytest.mark.multiprocess
def test_a_sweep_runs_the_plugins_entries_on_two_gloo_ranks_and_records_their_version(sweep_run):
    run, p = sweep_run
    assert p.returncode == 0, p.stderr[-3000:]
    df = RunStore(run).load()
    ok = df[df.status == "ok"]
    assert sorted(set(ok.experts)) == ["mykernel_v1", "mykernel_v2", "torch"] and len(ok) == 6
    assert (ok.world_size == 2).all() and (ok.rel_err <= 2e-2).all()  # checked against the reference
    assert ok.latency_us_per_rank.map(len).eq(2).all() and ok.dispatch_us.notna().all()
    assert (ok.backend_origin == ORIGIN).all()
    assert set(ok[ok.experts != "torch"].experts_origin) == {ORIGIN}
    assert set(ok[ok.experts == "torch"].experts_origin) == {"moebench"}
    assert ok.a2a_async.astype(bool).all()  # the plugin's knob is a column of its rows


@pytest.mark.multiprocess
def test_broken_plugins_are_reported_and_the_rest_of_the_sweep_runs(sweep_run):
    run, p = sweep_run
    df = RunStore(run).load()
    assert set(df.status) == {"ok", "skipped"}
    raising = df[df.experts == "raising_kernel"]
    assert len(raising) == 2 and (raising.status == "skipped").all()
    assert raising.reason.str.contains("'raises-in-supports'").all()  # the plugin and its distribution
    assert raising.reason.str.contains("supports\\(\\) raised RuntimeError: boom in supports").all()
    clashy = df[df.experts == "clashy_only"]
    assert len(clashy) == 2 and (clashy.status == "skipped").all()
    assert clashy.reason.str.contains("distribution clash 0.0.1").all()
    assert clashy.reason.str.contains("disabled: it registers experts 'torch'").all()
    assert set(clashy.experts_origin) == {"clash 0.0.1"}
    for dist in ("broken-import", "clash", "old-contract"):  # the sweep's log names each disabled plugin
        assert f"plugin '{dist}' (distribution {dist} 0.0.1" in p.stderr, p.stderr[-3000:]
    assert "import failed: ModuleNotFoundError: No module named 'moebench_no_such_module_anywhere'" in p.stderr


def _axis_pairs(df, axis: str, a: str, b: str) -> list[tuple]:
    """Rows of `axis=a` and `axis=b` whose combinations are equal but for that axis, at one
    token count: what `moebench compare RUN --axis axis=a:b` pairs."""
    rows = [(spec.from_row(r), r) for r in df[df.status == "ok"].to_dict("records")]
    pairs = []
    for ca, ra in rows:
        if getattr(ca, axis) != a:
            continue
        for cb, rb in rows:
            same = cb.replace(**{axis: a}) == ca and rb["tokens_per_rank"] == ra["tokens_per_rank"]
            if getattr(cb, axis) == b and same:
                pairs.append((ra, rb))
    return pairs


@pytest.mark.multiprocess
def test_the_two_versions_pair_on_the_experts_axis(sweep_run):
    """What `moebench compare RUN --axis experts=mykernel_v1:mykernel_v2` must pair, through
    moebench.spec: rows whose Combos are equal once experts is replaced."""
    run, _ = sweep_run
    pairs = _axis_pairs(RunStore(run).load(), "experts", "mykernel_v1", "mykernel_v2")
    assert len(pairs) == 2  # reduction=experts and finalize, one token count
    for ra, rb in pairs:
        assert ra["reduction"] == rb["reduction"] and ra["combo_key"] != rb["combo_key"]
        assert math.isfinite(rb["latency_us_median"] / ra["latency_us_median"])


@pytest.mark.multiprocess
def test_moebench_compare_axis_gives_the_verdict(sweep_run, tmp_path):
    run, _ = sweep_run
    env = {k: v for k, v in os.environ.items() if k != registry.PLUGIN_MODULES_VAR}
    env["PYTHONPATH"] = str(ROOT)  # a report needs no plugin installed
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "moebench.cli",
            "compare",
            str(run),
            "--axis",
            "experts=mykernel_v1:mykernel_v2",
            "--out",
            str(tmp_path / "cmp"),
            "--cpu-verdict",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # CPU rows get a verdict only when asked (--cpu-verdict); 1: a regression verdict, a valid outcome
    assert p.returncode in (0, 1), p.stderr
    # the two pairs test_the_two_versions_pair_on_the_experts_axis finds, both ok
    head = p.stdout.splitlines()[0]
    assert head.startswith("**Verdict (experts=mykernel_v2 vs experts=mykernel_v1):"), p.stdout[:2000]
    assert "in 2 rows ok on both sides" in head and f"exit {p.returncode}" in head, head


# ---------------------------------------------------------------------------
# the registry's rules, in this process (the fault experts are a MOEBENCH_PLUGIN_MODULES plugin)


def test_origins_and_contract_messages():
    assert registry.origin("experts", "torch") == "moebench"
    assert registry.origin("experts", "fault") == "module fault_experts"
    assert registry.origin("experts", "no_such_entry") == ""
    assert registry.contract_problem(CONTRACT_VERSION) is None
    assert registry.contract_problem((CONTRACT_VERSION, CONTRACT_VERSION + 1)) is None
    assert "declares no MOEBENCH_CONTRACT" in registry.contract_problem(None)
    why = registry.contract_problem(CONTRACT_VERSION + 1)
    assert f"contract {CONTRACT_VERSION + 1}" in why and f"implements contract {CONTRACT_VERSION}" in why


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry's tables as they are; whatever a test loads is gone after it."""
    for name in ("BACKENDS", "EXPERTS", "DISABLED", "_OWNER"):
        monkeypatch.setattr(registry, name, dict(getattr(registry, name)))
    monkeypatch.setattr(registry, "PLUGINS", list(registry.PLUGINS))
    return registry


def _load_module(reg, name: str, body) -> "registry.Plugin":
    import types

    def load():
        mod = types.ModuleType(name)
        mod.MOEBENCH_CONTRACT = CONTRACT_VERSION
        sys.modules[name] = mod
        body(mod)

    p = reg.Plugin(name=name, module=name, dist="scratch", version="9")
    try:
        reg._load(p, load)
    finally:
        sys.modules.pop(name, None)
    return p


def test_unsound_entries_disable_their_plugin_and_only_it(scratch_registry):
    from moebench.kernels.experts.torch import TorchExperts
    from moebench.kernels.interfaces import Experts, Knob

    reg = scratch_registry

    def not_experts(mod):
        reg.register_experts("scratch_a")(type("A", (TorchExperts,), {"__module__": mod.__name__}))
        reg.register_experts("scratch_b")(type("B", (object,), {"__module__": mod.__name__}))

    p = _load_module(reg, "scratch_not_experts", not_experts)
    assert p.status == "disabled" and "'scratch_b' is not a subclass" in p.reason
    assert "scratch_a" not in reg.EXPERTS and "scratch_a" in reg.unavailable("experts", "scratch_a")

    def abstract(mod):
        reg.register_experts("scratch_c")(type("C", (Experts,), {"__module__": mod.__name__}))

    p = _load_module(reg, "scratch_abstract", abstract)
    assert p.status == "disabled" and "apply" in p.reason and "unimplemented" in p.reason

    def knob_type_clash(mod):  # the built-in triton experts declare row_layout as a str
        knobs = (Knob("row_layout", 3, "same name, another type"),)
        reg.register_experts("scratch_d")(type("D", (TorchExperts,), {"__module__": mod.__name__, "knobs": knobs}))

    p = _load_module(reg, "scratch_knob", knob_type_clash)
    assert p.status == "disabled" and "one knob, one type and default" in p.reason

    def reserved_knob(mod):  # loads, then the harness refuses a knob named like a Combo field
        knobs = (Knob("seed", 1, "a name of moebench's own fields"),)
        reg.register_experts("scratch_e")(type("E", (TorchExperts,), {"__module__": mod.__name__, "knobs": knobs}))

    p = _load_module(reg, "scratch_reserved", reserved_knob)
    assert p.status == "loaded" and "scratch_e" in reg.EXPERTS
    assert "seed" not in spec.knob_meta()
    assert p.status == "disabled" and "'seed'" in p.reason and "scratch_e" not in reg.EXPERTS
    assert "torch" in reg.EXPERTS and reg.origin("experts", "torch") == "moebench"


def test_a_plugin_imported_before_discovery_keeps_its_entries(scratch_registry):
    """A module imported (its decorators run) before moebench loads it as a plugin: the
    entries it registered are adopted by the plugin, contract check included."""
    import types

    from moebench.kernels.experts.torch import TorchExperts

    reg = scratch_registry
    mod = types.ModuleType("scratch_early")
    mod.MOEBENCH_CONTRACT = CONTRACT_VERSION
    sys.modules["scratch_early"] = mod
    try:
        reg.register_experts("scratch_early_kernel")(type("F", (TorchExperts,), {"__module__": "scratch_early"}))
        p = reg.Plugin(name="early", module="scratch_early", dist="early-dist", version="1.2")
        reg._load(p, lambda: None)
    finally:
        sys.modules.pop("scratch_early", None)
    assert p.status == "loaded" and p.entries == [("experts", "scratch_early_kernel")]
    assert reg.origin("experts", "scratch_early_kernel") == "early-dist 1.2"
    assert reg.origin("experts", "torch") == "moebench"
