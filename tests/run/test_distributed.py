"""Beyond one machine, on the CPU: the worker entry point under two `torchrun --nnodes=2`
invocations on localhost writing one store, and `moebench sweep --slurm` through submitit's
LocalExecutor running two families' jobs at once under the sweep's lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from moebench import cli
from moebench.results.store import RunStore
from moebench.run.launch import _descendants, free_port

pytestmark = pytest.mark.multiprocess

QUICK = ["runner.reps=3", "runner.warmup=0", "runner.phase_reps=1", "runner.memory=false"]


def _env():
    return dict(os.environ, TRITON_INTERPRET="0")


def _finish(nodes: list, timeout: float = 240) -> list[str]:
    """Each node's stderr once all exit; past `timeout`, every node killed and the test failed
    with each one's stderr tail (a node that waits on a rendezvous that never completes says why)."""
    try:
        return [p.communicate(timeout=timeout)[1] for p in nodes]
    except subprocess.TimeoutExpired:
        for p in nodes:
            p.kill()
        tails = [f"node {i} (exit {p.wait()}): {p.communicate()[1][-1500:]}" for i, p in enumerate(nodes)]
        pytest.fail(f"the torchrun nodes did not finish in {timeout:.0f} s:\n" + "\n".join(tails))


def test_two_torchrun_nodes_write_one_store(tmp_path):
    run, port = tmp_path / "tr", free_port()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    nodes = [
        subprocess.Popen(
            [
                torchrun,
                "--nnodes=2",
                "--nproc-per-node=1",
                f"--node-rank={n}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "-m",
                "moebench.dist_worker",
                "--out",
                str(run),
                "backend=naive,allgather_rs",
                "experts=torch",
                "reduction=experts",
                "overlap=none",
                "quant=bf16",
                "model=tiny",
                "workload.tokens_per_rank=[4,8]",
                *QUICK,
            ],
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for n in (0, 1)
    ]
    errs = _finish(nodes)
    assert [p.returncode for p in nodes] == [0, 0], errs
    assert "2 to run on 2 ranks" in errs[0]
    df = RunStore(run).load()
    assert len(df) == 4 and set(df.status) == {"ok"} and set(df.world_size) == {2}
    assert df.latency_us_per_rank.map(len).eq(2).all()  # both nodes' ranks measured each row
    assert len(set(df.run_id)) == 1 and (run / "envs" / f"{df.run_id.iloc[0]}.json").is_file()
    # the same command again: everything is stored, nothing runs
    again = [subprocess.Popen(p.args, stderr=subprocess.PIPE, text=True, env=_env()) for p in nodes]
    errs = _finish(again)
    assert [p.returncode for p in again] == [0, 0] and "0 to run" in errs[0], errs


def test_slurm_jobs_of_one_sweep_write_under_its_lock(tmp_path, capsys):
    """Two families (local: 1 rank, naive: 2 ranks), one job each at once; in each the first
    combination fails, which ends its job, and the sweep submits the family's rest."""
    run = tmp_path / "sl"
    args = [
        "sweep",
        "--slurm",
        "--slurm-cluster",
        "local",
        "--slurm-time",
        "5",
        "backend=local,naive",
        "experts=fault",
        "experts.fault=raise,none",
        "reduction=experts",
        "overlap=none",
        "quant=bf16",
        "model=tiny",
        "workload.tokens_per_rank=[4]",
        *QUICK,
        "--out",
        str(run),
    ]
    p = subprocess.Popen([sys.executable, "-m", "moebench.cli", *args], stderr=subprocess.PIPE, text=True, env=_env())
    most, refused = 0, None
    while p.poll() is None:
        jobs = [d for d in _descendants(p.pid) if b"submitit.local._local" in _cmdline(d)]
        most = max(most, len(jobs))
        if jobs and refused is None:  # a foreign sweep into the folder while the jobs write
            refused = cli.main(["sweep", "backend=local", "experts=torch", "model=tiny", "--out", str(run)])
        time.sleep(0.2)
    err = p.stderr.read()
    assert p.returncode == 1, err  # the two raise rows
    assert refused == 2 and "is being written by another sweep" in capsys.readouterr().err
    assert most >= 2, "the families' jobs ran one after the other"
    df = RunStore(run).load()
    got = {(r.backend, r.overrides.split("experts.fault=")[1].split()[0]): r.status for r in df.itertuples()}
    assert got == {
        ("local", "raise"): "failed",
        ("local", "none"): "ok",
        ("naive", "raise"): "failed",
        ("naive", "none"): "ok",
    }, df[["label", "status", "reason"]]
    assert df[df.status == "failed"].reason.str.match(r"rank \d: RuntimeError: injected failure on rank \d").all()
    assert len(set(df.run_id)) == 1  # every job wrote under the sweep's invocation
    assert not _descendants(p.pid)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_the_worker_refuses_an_impossible_combination_before_its_group_forms(tmp_path, capsys, monkeypatch):
    """Every rank plans; a request no machine runs (every combination breaks a rule) exits 2 in
    one line before the group forms, and writes nothing."""
    from moebench.run import dist_worker

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    run = tmp_path / "run"
    assert dist_worker.main(["backend=local", "experts=torch_batched", "model=tiny", "--out", str(run)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "moebench worker: error: no machine can run this combination: layouts differ: backend=local produces the "
        "standard layout, experts=torch_batched reads batched"
    ]
    assert not run.exists()


def test_the_worker_refuses_its_command_line_in_one_line():
    """`python -m moebench.dist_worker` (what torchrun and SLURM start) given a bad command line: one
    line naming it and its help, exit 2, as moebench's commands; argparse printed its usage block
    (every option) first."""
    for argv, says in [(["--nope"], "the following arguments are required: --out"), (["--redo", "x"], "--redo")]:
        res = subprocess.run(
            [sys.executable, "-m", "moebench.dist_worker", *argv],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 2 and res.stdout == "", res
        prog = "python -m moebench.dist_worker"
        assert res.stderr.startswith(f"{prog}: error: ") and res.stderr.endswith(f" (see {prog} --help)\n"), res.stderr
        assert res.stderr.count("\n") == 1 and "usage:" not in res.stderr and says in res.stderr, res.stderr


def test_the_worker_refuses_an_out_holding_other_files(tmp_path, capsys, monkeypatch):
    """torchrun's entry takes --out as `moebench sweep` does: a folder that is neither empty nor a run
    (a checkout's root) is one line and exit 2, nothing written into it (no .lock, no rows/)."""
    from moebench.run import dist_worker

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}.items():
        monkeypatch.setenv(key, value)
    clone = tmp_path / "clone"
    (clone / ".git").mkdir(parents=True)
    (clone / "README.md").write_text("mine\n")
    before = sorted(p.name for p in clone.iterdir())
    assert dist_worker.main(["backend=local", "experts=torch", "model=tiny", "--out", str(clone)]) == 2
    err = capsys.readouterr().err
    assert "is neither empty nor a moebench run" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in clone.iterdir()) == before
