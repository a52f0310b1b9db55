"""The CPU pipeline end to end: 1-rank and 2-rank (gloo) sweeps, isolation
(timeout, crash), resume, clean stop, and bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moebench import cli
from moebench.kernels.reference import TOLERANCE
from moebench.results.store import RunStore
from moebench.run.sweep import execute
from moebench.util.words import counted

QUICK = ["runner.reps=3", "runner.warmup=1", "runner.phase_reps=2"]


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    # these tests cover the harness; Triton entries are covered by test_triton_kernels.py
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def children() -> list[int]:
    """Live child processes of this one (zombies and multiprocessing's own
    resource tracker, which lives as long as the parent, excluded)."""
    me, kids = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and fields[0] != "Z":
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
            if b"resource_tracker" not in cmd:
                kids.append(int(d.name))
    return kids


@pytest.mark.multiprocess
def test_issue_sweep_writes_exactly_eight_rows(tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli.main(
        [
            "sweep",
            "backend=local",
            "experts=torch",
            "reduction=experts,finalize",
            "overlap=none,combine",
            "workload.tokens_per_rank=[16,64]",
            "model=tiny",
            "quant=bf16",
            *QUICK,
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    df = RunStore(out).load()
    assert len(df) == 8 and set(df["status"]) == {"ok"}
    assert (df["rel_err"] <= TOLERANCE["bf16"]).all()
    assert (df["latency_us_p20"] <= df["latency_us_median"]).all() and (
        df["latency_us_median"] <= df["latency_us_p80"]
    ).all()
    assert df["samples_us"].map(len).eq(3).all()
    assert df["experts_us"].notna().all() and df["shared_us"].gt(0).all()
    # reduction=finalize has a separate weight-and-reduce step, reduction=experts does not
    assert df[df.reduction == "finalize"]["weight_reduce_us"].notna().all()
    assert df[df.reduction == "experts"]["weight_reduce_us"].isna().all()
    assert (out / "env.json").exists()
    assert children() == []
    rc = cli.main(["report", str(out)])
    assert rc == 0
    assert "local" in capsys.readouterr().out


@pytest.mark.multiprocess
def test_two_gloo_ranks_every_ep_backend_matches_the_reference(tmp_path):
    run_dir, counts = execute(
        [
            "backend=naive,allgather_rs,naive_batched",
            "experts=torch,torch_batched",
            "reduction=experts,finalize",
            "overlap=none,dispatch,combine",
            "quant=bf16,fp8_block,fp8_tensor",
            "model=tiny",
            "workload.tokens_per_rank=[1,9]",
            *QUICK,
            "runner.memory=false",
        ],
        "default",
        str(tmp_path / "ep"),
        quiet=True,
    )
    df = RunStore(run_dir).load()
    ok = df[df.status == "ok"]
    assert len(ok) == 2 * (6 + 6 + 3) * 3, df[df.status != "skipped"][["label", "status", "reason"]]
    assert set(df.status) == {"ok", "skipped"}
    assert (ok.world_size == 2).all()
    for q, tol in TOLERANCE.items():
        assert (ok[ok.quant == q].rel_err <= tol).all()
    # communication phases were measured on the EP backends
    assert ok.dispatch_us.notna().all() and ok.combine_us.notna().all()
    assert ok.latency_us_per_rank.map(len).eq(2).all()
    assert children() == []


@pytest.mark.multiprocess
def test_routings_and_seeds_across_ranks(tmp_path):
    run_dir, _ = execute(
        [
            "backend=allgather_rs,naive_batched",
            "experts=torch,torch_batched",
            "reduction=finalize",
            "overlap=none",
            "quant=bf16",
            "model=tiny",
            "workload.routing=uniform,balanced,zipf",
            "workload.seed=0,7",
            "workload.tokens_per_rank=[3]",
            "runner.reps=1",
            "runner.warmup=0",
            "runner.phase_reps=1",
            "runner.memory=false",
        ],
        "default",
        str(tmp_path / "rs"),
        quiet=True,
    )
    ok = RunStore(run_dir).load().query("status == 'ok'")
    assert len(ok) == 2 * 3 * 2 and (ok.rel_err <= 2e-2).all()


@pytest.mark.multiprocess
def test_sweep_exit_status_says_whether_every_row_is_ok_or_skipped(tmp_path):
    """0: every row ok or skipped with a reason; 1: a failed (or incorrect, timeout, oom) row."""
    base = [
        "backend=local",
        "experts=fault",
        "reduction=experts",
        "overlap=none",
        "quant=bf16",
        "model=tiny",
        "workload.tokens_per_rank=[4]",
        *QUICK,
    ]
    assert cli.main(["sweep", *base, "experts.fault=none", "--out", str(tmp_path / "ok")]) == 0
    assert cli.main(["sweep", *base, "experts.fault=none,raise", "--out", str(tmp_path / "bad")]) == 1
    assert cli.main(["sweep", *base, "experts.fault=wrong", "--out", str(tmp_path / "wrong")]) == 1
    wrong = RunStore(tmp_path / "wrong").load()
    assert list(wrong.status) == ["incorrect"] and "rel_err" in wrong.reason.iloc[0]
    assert children() == []


@pytest.mark.multiprocess
def test_timeout_and_crash_become_rows_and_the_sweep_goes_on(tmp_path):
    run_dir, counts = execute(
        [
            "backend=naive",
            "experts=fault",
            "reduction=experts",
            "overlap=none",
            "quant=bf16",
            "model=tiny",
            "workload.tokens_per_rank=[4]",
            "experts.fault=none,sleep",
            "experts.fault_s=60",
            "runner.timeout_s=5",
            *QUICK,
        ],
        None,
        str(tmp_path / "t"),
        quiet=True,
    )
    df = RunStore(run_dir).load().set_index("overrides")
    assert sorted(df.status) == ["ok", "timeout"]
    assert "no result within 5 s" in df[df.status == "timeout"].reason.iloc[0]
    assert children() == []
    run_dir, _ = execute(
        [
            "backend=naive",
            "experts=fault",
            "reduction=experts",
            "overlap=none",
            "quant=bf16",
            "model=tiny",
            "workload.tokens_per_rank=[4,8]",
            "experts.fault=raise,none",
            "experts.fault_rank=1",
            *QUICK,
        ],
        None,
        str(tmp_path / "f"),
        quiet=True,
    )
    df = RunStore(run_dir).load()
    failed = df[df.status == "failed"]
    assert len(failed) == 2 and len(df[df.status == "ok"]) == 2
    assert failed.reason.str.contains("rank 1: RuntimeError: injected failure on rank 1").all()
    assert children() == []


@pytest.mark.multiprocess
def test_interrupted_sweep_resumes_without_redoing_anything(tmp_path):
    out = tmp_path / "resume"
    args = [
        sys.executable,
        "-m",
        "moebench.cli",
        "sweep",
        "backend=local,naive",
        "experts=torch",
        "reduction=experts,finalize",
        "overlap=none,combine",
        "quant=bf16",
        "model=tiny",
        "workload.tokens_per_rank=[4]",
        *QUICK,
        "--out",
        str(out),
    ]
    env = dict(os.environ, TRITON_INTERPRET="0")
    p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    rows = out / "rows"
    deadline = time.time() + 240
    while time.time() < deadline and not (rows.exists() and len([f for f in rows.glob("*-T*.parquet")]) >= 1):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=240)
    assert p.returncode == 130, err  # interrupted: a scheduler can tell it from a finished sweep
    assert "stopping after the current combination" in err and "Re-run the same command to resume" in err
    first = {f.name: f.stat().st_mtime_ns for f in rows.glob("*-T*.parquet")}
    assert 1 <= len(first) < 8
    r2 = subprocess.run(args, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert r2.returncode == 0, r2.stderr
    assert f"{8 - len(first)} to run" in r2.stderr and f"{len(first)} already stored" in r2.stderr
    assert f"{counted(len(first), 'row')} {'was' if len(first) == 1 else 'were'} stored before it" in r2.stderr
    after = {f.name: f.stat().st_mtime_ns for f in rows.glob("*-T*.parquet")}
    assert len(after) == 8
    assert all(after[k] == v for k, v in first.items()), "a stored combination was redone"
    r3 = subprocess.run(args, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    assert "0 to run" in r3.stderr


@pytest.mark.parametrize(
    "argv, words",
    [
        (["sweep", "backend=nope"], ["unknown backend='nope'", "allgather_rs"]),
        (["run", "experts=torch", "model.hidden=abc"], ["abc"]),
        (["run", "reduction=experts,finalize"], ["one combination"]),
        (["list", "--sweep", "nope"], ["no sweep 'nope'"]),
        (["report", "/nonexistent/run"], ["/nonexistent/run"]),
    ],
)
def test_bad_input_exits_2_before_any_work(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err
    assert not (tmp_path / "runs").exists()


LAYOUTS = "layouts differ: backend=local produces the standard layout, experts=torch_batched reads batched"
CAP = "backend.max_tokens_per_rank=512 caps the batched buffers:"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "backend=local", "experts=torch_batched"], f"no machine can run this combination: {LAYOUTS}"),
        (["run", "backend.simulate_ep=3"], "no machine can run this combination: simulate_ep=3 does not divide"),
        (["sweep", "backend=local", "experts=torch_batched"], "no machine can run any of these 18 combinations"),
        (["sweep", "--dry-run", "backend=local", "experts=torch_batched"], f"each breaks a rule: 18 with {LAYOUTS}"),
        (["run", "experts=deepgemm", "quant=bf16"], "no machine can run this combination: DeepGEMM experts need quant"),
        (
            ["run", "backend=deepep_ll", "experts=torch_batched", "reduction=finalize"],
            "no machine can run this combination: DeepEP low-latency kernels exist for hidden in",
        ),
        (
            ["run", "backend=pplx", "experts=torch_batched", "reduction=finalize", "workload.tokens_per_rank=[1024]"],
            f"no machine can run this combination at workload.tokens_per_rank=1024: {CAP} 1024 tokens per rank",
        ),
        (
            ["sweep", "backend=pplx", "experts=triton_batched", "workload.tokens_per_rank=[1024,2048]"],
            f"no machine can run any of these 36 (combination, token count) pairs, each breaks a rule: 18 with {CAP}",
        ),
    ],
    ids=[
        "run-layouts",
        "run-simulate_ep",
        "sweep",
        "sweep-dry-run",
        "run-experts-rule",
        "run-backend-rule",
        "run-over-the-cap",
        "sweep-over-the-cap",
    ],
)
def test_an_impossible_combination_is_refused_in_one_line_and_writes_nothing(
    argv, words, capsys, tmp_path, monkeypatch
):
    """Every combination asked for breaks a rule of the plan (config/validity.py's Skip.rule: the
    contract's, or an entry's own `Rule`, here on a machine without DeepGEMM nor DeepEP), or each
    of its token counts does (over pplx's cap, here on a machine without pplx), so no machine runs
    any: exit 2, one line, no run folder (--out or the default)."""
    monkeypatch.chdir(tmp_path)
    assert cli.main([*argv, "model=tiny", "--out", str(tmp_path / "r")]) == 2
    assert cli.main([*argv, "model=tiny"]) == 2
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 2 and err[0] == err[1] and err[0].startswith(f"moebench {argv[0]}: error: ") and words in err[0]
    assert captured.out == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("marked", [True, False], ids=["Rule", "str"])
def test_a_plugins_own_rule_is_refused_and_its_plain_reason_skipped(marked, capsys, tmp_path, monkeypatch):
    """A plugin's `supports` that marks its reason a `Rule` (docs/plugins.md): a run of only that
    combination is refused as a rule of the plan's (exit 2, one line, no run folder). The same
    reason as a plain str is what this machine lacks: a skipped row, exit 0."""
    from moebench.kernels import registry
    from moebench.kernels.interfaces import Rule

    said = "experts=fault never runs this hidden size"
    fault = registry.entry("experts", "fault")  # a plugin's entry (tests/support/fault_experts.py)
    monkeypatch.setattr(fault, "supports", classmethod(lambda cls, combo: Rule(said) if marked else said))
    monkeypatch.chdir(tmp_path)
    one = ["backend=local", "experts=fault", "reduction=experts", "overlap=none", "quant=bf16", "model=tiny"]
    code = cli.main(["run", *one, "runner.device=cpu", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    if marked:
        assert code == 2 and err.splitlines() == [f"moebench run: error: no machine can run this combination: {said}"]
        assert list(tmp_path.iterdir()) == []
        return
    assert code == 0 and "nothing ran: every combination was skipped on this machine; combinations by reason:" in err
    assert f"     1  {said}" in err.splitlines()
    df = RunStore(tmp_path / "r").load()
    assert set(df.status) == {"skipped"} and set(df.reason) == {said}


@pytest.mark.multiprocess
def test_a_sweep_with_an_impossible_combination_runs_the_others(tmp_path, capsys):
    """Some combinations run: the impossible ones are skipped rows with their rule (docs/design.md,
    "Validity"), and the sweep exits 0."""
    one = ["backend=local", "reduction=experts", "overlap=none", "quant=bf16", "model=tiny", *QUICK]
    argv = ["sweep", *one, "experts=torch,torch_batched", "workload.tokens_per_rank=[4]", "--out", str(tmp_path / "s")]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "moebench: 2 combinations (1 to run, 1 skipped), 2 rows (1 to run, 1 skipped) -> " in err
    run = tmp_path / "s"
    assert err.splitlines()[-1] == f"moebench: next: moebench report {run}  (or moebench compare {run} OTHER_RUN)"
    df = RunStore(tmp_path / "s").load()
    assert dict(zip(df.experts, df.status, strict=True)) == {"torch": "ok", "torch_batched": "skipped"}
    assert df[df.status == "skipped"].reason.tolist() == [LAYOUTS]


def test_nothing_ran_names_the_rule_apart_from_the_machine(tmp_path, capsys):
    """Every combination skipped, one by the machine (Triton on a CPU without its interpreter):
    exit 0 and the skipped rows stored; the line says which were this machine's."""
    one = ["backend=local", "reduction=experts", "overlap=none", "quant=bf16", "model=tiny", "runner.device=cpu"]
    assert cli.main(["sweep", *one, "experts=triton,torch_batched", "--out", str(tmp_path / "s")]) == 0
    err = capsys.readouterr().err
    assert (
        "moebench: nothing ran: every combination was skipped: 1 on this machine, 1 by a rule of the plan "
        "that no machine lifts; combinations by reason:"
    ) in err
    assert "     1  [rule] layouts differ: " in err and "     1  Triton experts need a CUDA GPU" in err
    assert "no machine runs the [rule] ones: change or drop those options" in err
    assert set(RunStore(tmp_path / "s").load().status) == {"skipped"}
    assert "moebench: next:" not in err  # nothing measured: nothing to report
    assert cli.main(["run", *one, "experts=triton", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "moebench: 1 combination (0 to run, 1 skipped), 2 rows (0 to run, 2 skipped) -> " in err
    assert "nothing ran: every combination was skipped on this machine; combinations by reason:" in err


def test_list_json(capsys):
    import json

    assert cli.main(["list", "--json", "backend=local", "experts=torch,torch_batched", "quant=bf16"]) == 0
    items = json.loads(capsys.readouterr().out)
    assert {i["status"] for i in items} == {"valid", "skipped"}
    assert all(i["reason"] for i in items if i["status"] == "skipped")


@pytest.mark.multiprocess
def test_moebench_run_prints_its_rows(capsys, tmp_path):
    rc = cli.main(
        [
            "run",
            "backend=naive",
            "experts=torch",
            "reduction=finalize",
            "overlap=combine",
            "quant=bf16",
            "workload.tokens_per_rank=[8]",
            *QUICK,
            "--out",
            str(tmp_path / "one"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and out.splitlines()[0].split() == [
        "tokens",
        "status",
        "median",
        "µs",
        "p20",
        "µs",
        "p80",
        "µs",
        "rel",
        "err",
    ]
    assert out.splitlines()[1].split()[:2] == ["8", "ok"]


def test_stored_keeps_the_newest_row(tmp_path):
    import pandas as pd

    store = RunStore(tmp_path)
    old = {"combo_key": "k", "tokens_per_rank": 128, "status": "timeout", "timestamp": "2026-01-01T00:00:00"}
    new = dict(old, status="ok", timestamp="2026-01-02T00:00:00")
    store.write_rows("k", [dict(old, tokens_per_rank=64, status="ok"), old])  # k-T64_128.parquet
    store.write_rows("k", [new])  # k-T128.parquet sorts before it by name
    assert store.stored() == {"k": {64: "ok", 128: "ok"}}
    assert store.todo_tokens("k", [64, 128], "failed") == []
    assert set(pd.read_parquet(store.row_files()[0]).columns) >= {"combo_key", "status"}


def test_group_state_takes_messages_out_of_order():
    from moebench.results.rank_result import RankResult
    from moebench.run.launch import _GroupState
    from moebench.run.messages import Done, Error, Result
    from moebench.run.plan import plan

    combos, _ = plan(
        ["backend=naive", "experts=torch", "reduction=experts,finalize", "overlap=none", "quant=bf16"], None
    )
    st = _GroupState([(c, [8]) for c in combos], world_size=2)
    st.take(Done(0, 0))
    st.take(Result(1, 0, 8, RankResult(rank=0, reason="rank0-combo1")))  # rank 0 is ahead
    st.take(Result(0, 1, 8, RankResult(rank=1, reason="rank1-combo0")))
    assert st.pop_finished() == []
    st.take(Done(0, 1))
    (fin,) = st.pop_finished()
    assert fin.combo is combos[0] and fin.results[8][1].reason == "rank1-combo0" and 0 not in fin.results.get(8, {})
    assert st.fins[1].results[8][0].reason == "rank0-combo1" and st.current == 1
    st.take(Error(1, 0, "oom", "CUDA out of memory", 8))
    assert st.failure_idx == 1 and st.failure.reason == "rank 0: CUDA out of memory" and st.failure.tokens == 8


def test_interleaved_timing_keeps_order_and_counts():
    import torch

    from moebench.measure import timing

    calls = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b")]
    a, b = timing.time_interleaved(fns, torch.device("cpu"), reps=4, warmup=1)
    assert len(a.us) == len(b.us) == 4 and all(t > 0 for t in a.us + b.us)
    assert calls == ["a", "b"] * 5  # warm-up, then A B A B ...
    slow = timing.time_samples(lambda: sum(range(20000)), torch.device("cpu"), reps=5, warmup=0)
    fast = timing.time_samples(lambda: None, torch.device("cpu"), reps=5, warmup=0)
    assert slow.median > fast.median and slow.p20 <= slow.median <= slow.p80


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


@pytest.mark.multiprocess
def test_trace_nsys_starts_each_rank_under_nsys(tmp_path, monkeypatch):
    """With `nsys` on PATH the ranks are spawned through `nsys profile ... python`, with an
    NVTX capture range that repeats (one capture per row and rank); each rank records the
    captures it opened, and each row names the report that exists or says why there is none.
    A stand-in `nsys` (this machine has none) logs its arguments and execs the rank, writing
    no report: so the rows say so; the parser is tested on an export."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --version ] && { echo "NVIDIA Nsight Systems version 0.0 (stand-in)"; exit 0; }  # moebench env\n'
        'printf "%s\\n" "$@" > "$FAKE_NSYS_ARGV.$$"\n'
        "shift  # profile\n"
        'out=""\n'
        'while [ "$#" -gt 0 ]; do case "$1" in -o) out="$2"; shift 2; break;; *) shift;; esac; done\n'
        'out=$(echo "$out" | sed "s/%p/$$/")  # nsys expands %p to the process id\n'
        'echo "$$" > "$out.ran"\n'
        'exec "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NSYS_ARGV", str(tmp_path / "argv"))
    run_dir, _ = execute(
        [
            "backend=naive",
            "experts=torch",
            "reduction=experts",
            "overlap=combine",
            "quant=bf16",
            "trace=nsys",
            "workload.tokens_per_rank=[4,8]",
            "runner.memory=false",
            *QUICK,
        ],
        None,
        str(tmp_path / "n"),
        quiet=True,
    )
    df = RunStore(run_dir).load().sort_values("tokens_per_rank")
    assert list(df.status) == ["ok", "ok"]
    nsys_dir = run_dir / "traces" / "nsys"
    pids = sorted(int(p.read_text()) for p in nsys_dir.glob("ranks_*.ran"))
    assert len(pids) == 2, "both ranks started under nsys"
    assert not list((run_dir / "traces").rglob("*.json")), "no torch-trace fallback when nsys exists"
    for pid in pids:
        argv = (tmp_path / f"argv.{pid}").read_text().splitlines()
        assert argv[0] == "profile" and "--trace=cuda,nvtx" in argv
        assert "--sample=none" in argv and "--cpuctxsw=none" in argv  # small captures
        # capture only inside the worker's NVTX range around the timed work, once per row
        assert "--capture-range=nvtx" in argv and "--capture-range-end=repeat" in argv
        assert "--nvtx-capture=moebench/timed" in argv  # default domain, by message
        assert argv[argv.index("-o") + 1] == str(nsys_dir / "ranks_%p")
        assert argv[argv.index("-o") + 2] == sys.executable
    # each rank recorded its two captures (rows 1 and 2), numbered as nsys numbers them
    from moebench.run.nsys_import import read_captures

    caps = read_captures(run_dir)
    stems = {(k[1], k[2]): v["stem"] for k, v in caps.items()}
    assert set(stems) == {(4, 0), (8, 0), (4, 1), (8, 1)}
    if _importable("nvtx"):  # CPU ranks push their ranges through the nvtx package
        pid0 = int(stems[(4, 0)].split("ranks_")[1].split(".")[0])
        assert pid0 in pids
        assert [stems[(4, 0)], stems[(8, 0)]] == [f"traces/nsys/ranks_{pid0}.1", f"traces/nsys/ranks_{pid0}.2"]
        reasons = ("nsys wrote no file for capture", "the capture range went through the nvtx package")
    else:  # no NVTX API: no range was pushed, and the rows say so
        assert set(stems.values()) == {None}
        reasons = ("no NVTX capture range was opened for this row",)
    # the stand-in wrote no report: no row names a file, each says why
    assert list(df.trace_path) == ["", ""]
    assert all(why.startswith(reasons) for why in df.trace_error), list(df.trace_error)
    assert children() == []


@pytest.mark.multiprocess
def test_trace_nsys_without_nsys_says_so_and_writes_the_torch_trace(tmp_path, monkeypatch, capsys):
    from moebench.traces.nsys import NSYS_MISSING

    path = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "nsys").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    run_dir, _ = execute(
        [
            "backend=local",
            "runner.world_size=1",
            "experts=torch",
            "reduction=experts",
            "overlap=none",
            "quant=bf16",
            "trace=nsys",
            "trace.samples=2",
            "workload.tokens_per_rank=[4]",
            "runner.memory=false",
            *QUICK,
        ],
        None,
        str(tmp_path / "n"),
    )
    assert NSYS_MISSING in capsys.readouterr().err
    (row,) = RunStore(run_dir).load().itertuples()
    assert row.status == "ok" and row.trace_path.endswith("rank0_T4.json") and (run_dir / row.trace_path).is_file()
    assert not (run_dir / "traces" / "nsys").exists()
    assert children() == []


@pytest.mark.multiprocess
def test_a_sweep_where_nothing_can_run_says_so_and_a_resumed_one_counts_what_was_stored(tmp_path, capsys):
    none = ["backend=local", "experts=deepgemm", "quant=fp8_block", "model=tiny", "runner.device=cpu"]
    _, counts = execute(none, None, str(tmp_path / "none"))
    err = capsys.readouterr().err
    assert set(counts) == {"skipped"} and "nothing ran: every combination was skipped" in err
    quick = [
        "backend=local",
        "experts=torch",
        "reduction=experts",
        "overlap=none",
        "quant=bf16",
        "model=tiny",
        "workload.tokens_per_rank=[4]",
        "runner.reps=1",
        "runner.warmup=0",
        "runner.phase_reps=1",
    ]
    execute(quick, None, str(tmp_path / "once"))
    capsys.readouterr()
    execute(quick, None, str(tmp_path / "once"))  # resumed: nothing left to run
    err = capsys.readouterr().err
    assert "moebench: nothing to do: the 1 row that can run is already stored" in err and "nothing ran" not in err
