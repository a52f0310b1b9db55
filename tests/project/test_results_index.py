"""results/: small enough to travel to the GPU machine beside carried builds, and
results/README.md as moebench.report.results_index writes it, with every command in it
valid for today's code (`moebench list` on a sweep's overrides exits 0)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from moebench import cli
from moebench.cli.parser import parse_args
from moebench.report import results_index
from moebench.run.plan import plan

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
README = RESULTS / "README.md"
# the tracked tree travels whole to a device with a 64 MiB limit (with the carried wheels and DeepGEMM's
# source: ~27 + ~9 MB at session 18, when this rose from 20 to 21 MB for #51's H100 tune and sweeps)
MAX_BYTES = 21 * 10**6


def _commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    return [line for b in blocks for line in b.splitlines() if line.strip() and not line.startswith("#")]


def test_results_stay_under_the_size_limit():
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    biggest = sorted(files, key=lambda p: p.stat().st_size)[-3:]
    assert total <= MAX_BYTES, (
        f"results/ holds {total / 1e6:.1f} MB (limit {MAX_BYTES / 1e6:.0f} MB); largest: "
        + ", ".join(f"{p.relative_to(RESULTS)} {p.stat().st_size / 1e6:.1f} MB" for p in biggest)
        + ": archive or remove superseded generations, scripts/compact_rows.py for row files"
    )


def test_readme_is_what_the_generator_writes():
    assert README.read_text() == results_index.render(RESULTS), (
        "results/README.md is out of date: python -m moebench.report.results_index"
    )


def test_readme_lists_commands():
    cmds = _commands()
    assert len(cmds) > 40 and sum(c.startswith("moebench sweep") for c in cmds) > 30
    assert not any("fp8_layout" in c or "runner.device=cuda" in c for c in cmds)


@pytest.mark.parametrize("cmd", _commands())
def test_every_listed_command_plans_today(cmd, capsys):
    """On any machine: runner.device=cpu is added, so a GPU command's world size is not
    checked against this machine's GPUs (on CUDA it resolves the same combinations)."""
    argv = shlex.split(cmd)
    if argv[0] == "python":  # a benchmark script beside the sweeps
        assert (REPO / argv[1]).is_file(), cmd
        return
    assert argv[0] == "moebench" and argv[1] in ("sweep", "tune"), cmd
    args = argv[2:]
    if argv[1] == "sweep":
        assert cli.main(["list", *args, "runner.device=cpu"]) == 0, capsys.readouterr().err
        return
    flags = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    parsed = parse_args(["tune", *args])  # the flags are today's tune options, with their values
    for flag, value in flags.items():
        assert str(getattr(parsed, flag[2:].replace("-", "_"))) == value, (cmd, flag)
    overrides = [a for a in args if a not in flags and a not in flags.values()]
    combos, _ = plan([*overrides, "runner.device=cpu"], None)  # what `moebench tune` plans
    assert len(combos) == 1 and combos[0].combo["experts"] == "triton", cmd


def test_a_renamed_key_is_rendered_under_its_new_name(capsys):
    """The recorded fp8_layouts command used experts.fp8_layout, which plan() now refuses."""
    old = [
        "backend=local",
        "experts=triton",
        "quant=fp8_block",
        "model=qwen3_30b_a3b",
        "experts.fp8_layout=gathered,contiguous",
    ]
    assert cli.main(["list", *old, "runner.device=cpu"]) == 2
    assert "use experts.row_layout=gathered" in capsys.readouterr().err
    assert results_index.rename("experts.fp8_layout=gathered") == "experts.row_layout=gathered"
    assert results_index.rename("+extra.pplx_mode=internode") == "backend.pplx_mode=internode"  # a knob now
    assert cli.main(["list", "backend=pplx", "experts=triton_batched", "+extra.pplx_mode=internode"]) == 2
    cmd, note = results_index.sweep_command(
        {"name": "adhoc", "overrides": {}},
        old + ["reduction=experts", "overlap=none", "runner.device=cuda", "workload.tokens_per_rank=[16]"],
    )
    assert cmd.startswith("moebench sweep backend=local") and "experts.row_layout=gathered,contiguous" in cmd
    assert "runner.device" not in cmd and note == ""


def test_a_run_extended_at_newer_code_names_every_commit(tmp_path):
    """env.json is the first invocation's; envs/ holds one per invocation: the index names each."""
    d = tmp_path / "q" / "run"
    (d / "envs").mkdir(parents=True)
    first = {"git_sha": "a" * 40, "env": {"MOEBENCH_GIT_SHA": "b2b87a0c30f3"}}
    (d / "env.json").write_text(json.dumps(first))
    (d / "envs" / "1.json").write_text(json.dumps(first))
    (d / "envs" / "2.json").write_text(json.dumps({"git_sha": "unknown", "env": {"MOEBENCH_GIT_SHA": "6" * 40}}))
    (d / "envs" / "3.json").write_text(json.dumps({"git_sha": "unknown"}))  # names none: left out
    run = results_index.read_run(tmp_path, d, {}, "run")
    assert run.commit == "b2b87a0c30f3, 6666666"
    run = results_index.read_run(tmp_path, d, {"commit": "b2b87a0c30f3"}, "run")
    assert run.commit == "b2b87a0c30f3 (stored: b2b87a0c30f3, 6666666)"  # about.md names one of two


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)


def test_a_runs_machine_counts_the_hosts_gpus_and_its_tree_says_whether_it_was_clean(tmp_path):
    """nvidia-smi lists every GPU of the host where CUDA_VISIBLE_DEVICES hides one (gpu_count 1);
    a run's tree is dirty where one invocation's was, unknown where one's is not recorded."""
    smi = ["NVIDIA H200, 580.159.04, 345 MHz", "NVIDIA H200, 580.159.04, 345 MHz"]
    pinned = {
        "gpu": "NVIDIA H200",
        "gpu_count": 1,
        "nvidia_smi": smi,
        "env": {"CUDA_VISIBLE_DEVICES": "1"},
        "git_sha": "cb40768c241aea96a78e9b5aeb6dd19d3a2ea3f2",
        "git_dirty": True,
    }  # before the tree stamp
    clean = {
        "gpu": "NVIDIA H200",
        "gpu_count": 1,
        "nvidia_smi": smi[:1],
        "git_sha": "a" * 40,
        "git_dirty": False,
        "git_diff_sha256": None,
        "git_tree": "stamp",
    }
    dirty = dict(clean, git_dirty=True, git_diff_sha256="d" * 64, git_tree="git")
    _write(tmp_path / "q" / "old" / "env.json", pinned)
    old = results_index.read_run(tmp_path, tmp_path / "q" / "old", {}, "old")
    assert old.machine == "1 × NVIDIA H200 (of 2)" and old.tree == "dirty"  # a plain stored dirty flag stands
    _write(tmp_path / "q" / "named" / "env.json", dict(pinned, env={"MOEBENCH_GIT_SHA": "bd66478"}))
    assert results_index.read_run(tmp_path, tmp_path / "q" / "named", {}, "named").tree == "unknown"
    _write(tmp_path / "q" / "new" / "env.json", clean)
    _write(tmp_path / "q" / "new" / "envs" / "1.json", clean)
    new = results_index.read_run(tmp_path, tmp_path / "q" / "new", {}, "new")
    assert (new.machine, new.commit, new.tree) == ("1 × NVIDIA H200", "a" * 7, "clean")
    _write(tmp_path / "q" / "new" / "envs" / "2.json", dirty)  # resumed from a dirty tree
    assert results_index.read_run(tmp_path, tmp_path / "q" / "new", {}, "new").tree == "dirty"


def test_tune_folders_show_the_environment_they_recorded(tmp_path):
    layer = {"overrides": ["experts=triton", "backend=local", "model=tiny"], "space": "small", "reps": 2, "gpus": 1}
    env = {"device": "NVIDIA H200", "git_sha": "1fbca28f3e8b5a0e14271aa126f821c6da170293", "git_dirty": None}
    _write(tmp_path / "t" / "old" / "tune.json", {"layer": layer, "environment": env, "results": []})
    old = results_index.read_run(tmp_path, tmp_path / "t" / "old", {}, "old")
    assert (old.machine, old.commit, old.tree) == ("NVIDIA H200 (no environment recorded)", "1fbca28", "unknown")
    _write(tmp_path / "t" / "older" / "tune.json", {"layer": layer, "results": []})
    older = results_index.read_run(
        tmp_path, tmp_path / "t" / "older", {"machine": "1 × NVIDIA H200", "commit": "bd66478"}, "older"
    )
    assert (older.machine, older.commit) == ("1 × NVIDIA H200 (no environment recorded)", "bd66478")
    fingerprint = {"gpu": "NVIDIA H200", "gpu_count": 2, "git_sha": "b" * 40, "git_dirty": False, "git_tree": "git"}
    _write(tmp_path / "t" / "new" / "tune.json", {"layer": layer, "environment": env, "results": []})
    _write(tmp_path / "t" / "new" / "env.json", fingerprint)
    new = results_index.read_run(tmp_path, tmp_path / "t" / "new", {}, "new")
    assert (new.machine, new.commit, new.tree) == ("1 × NVIDIA H200 (of 2)", "b" * 7, "clean")


def test_a_runs_caveats_or_stamp_name_the_code_that_ran_over_a_stale_git(tmp_path):
    """A device's copy carried a stale .git at `stale` beside the stamp of `ran`: the fingerprints
    read from that .git describe nothing that ran. The index shows what the run's caveats state,
    else the commit of the stamp that a later invocation read beside that .git (tree unknown)."""
    stale, ran = "f9a235642dedda4c92fa8208db1b5526e3d99be1", "16c72ff6b9617fe5af282e9271ba2bb43f71daa5"
    from_git = {
        "gpu": "NVIDIA H200",
        "git_sha": stale,
        "git_dirty": True,
        "git_diff_sha256": "6" * 64,
        "git_tree": "git",
        "git_tree_note": "",
    }
    from_stamp = dict(
        from_git,
        git_sha=ran,
        git_dirty=False,
        git_diff_sha256=None,
        git_tree="stamp",
        git_tree_note=f"stamp of 2026-12-01T19:17:40+00:00; the .git here is at {stale[:12]}, not the stamp's commit",
    )
    d = tmp_path / "q" / "run"
    _write(d / "env.json", from_git)
    _write(d / "envs" / "1.json", from_git)
    stored = results_index.read_run(tmp_path, d, {}, "run")
    assert (stored.commit, stored.tree) == ("f9a2356", "dirty")  # nothing says otherwise: as stored
    _write(d / "envs" / "2.json", from_stamp)  # a resume read the stamp, naming the .git beside it
    stamped = results_index.read_run(tmp_path, d, {}, "run")
    assert (stamped.commit, stamped.tree) == ("16c72ff", "unknown")
    _write(
        d / "caveats.md",
        "- **Which code ran: commit `16c72ff`, clean.** The first invocations read a stale "
        "`.git` at f9a2356; the diff digest recomputed says so.\n- Another caveat.\n",
    )
    declared = results_index.read_run(tmp_path, d, {}, "run")
    assert (declared.commit, declared.tree) == ("16c72ff", "clean")
    _write(tmp_path / "q" / "about.md", "Q?\n")
    text, summary = results_index.section(tmp_path, tmp_path / "q")
    row = next(line for line in text.splitlines() if line.startswith("| `run` |"))
    assert row.startswith("| `run` | 1 × NVIDIA H200 | `16c72ff` | clean |") and summary["commits"] == ["16c72ff"]
    # a run with no stamp reading: its caveat alone (the ceilings' case), dirty as stated
    _write(tmp_path / "q" / "one" / "env.json", from_git)
    _write(tmp_path / "q" / "one" / "caveats.md", "- **Which code ran: commit `16c72ff`, dirty.** Why.\n")
    one = results_index.read_run(tmp_path, tmp_path / "q" / "one", {}, "one")
    assert (one.commit, one.tree) == ("16c72ff", "dirty")
    _write(
        tmp_path / "q" / "one" / "caveats.md",
        "Which code ran: commit `16c72ff`, clean. Which code ran: commit `abcdef0`, clean.\n",
    )
    with pytest.raises(ValueError, match="2 different commits"):
        results_index.read_run(tmp_path, tmp_path / "q" / "one", {}, "one")
