"""A plugin whose import hangs (issue #52 item 3): it is disabled after MOEBENCH_PLUGIN_TIMEOUT_S
with one line naming it and the time, and the command goes on; `report` and `compare` import no
plugin at all; a rank whose plugin hangs says so in its row. The hanging plugins are entry points
of a temporary site (a *.dist-info with entry_points.txt beside the module), found by a
subprocess with that site on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from moebench.kernels import registry
from moebench.kernels.plugin import PLUGIN_TIMEOUT_VAR, TIMED_OUT_VAR, Plugin
from moebench.results.row import Status
from moebench.run.outcome import Observed, decide

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["backend=local", "experts=torch", "model=tiny", "quant=bf16", "reduction=experts,finalize", "overlap=none"]
DEADLINE_S = 2
RANK_DEADLINE_S = 20
# the module writes a marker (whether it was imported at all), blocks the signals a user would send
# (a thread may block them for itself) and sleeps forever
HANG = """
    import os, signal, time
    open(os.environ["HANG_MARKER"], "w").close()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    while True:
        time.sleep(1)
"""


@pytest.fixture
def site(tmp_path) -> Path:
    """A temporary site holding the distribution `hangdist` whose entry point `hang` never imports."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "hang_plugin.py").write_text(textwrap.dedent(HANG))
    info = site / "hangdist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hangdist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[moebench.kernels]\nhang = hang_plugin\n")
    return site


def _moebench(
    args: list[str], site: Path, tmp_path: Path, timeout: float, deadline_s: float = DEADLINE_S
) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k not in (registry.PLUGIN_MODULES_VAR, TIMED_OUT_VAR)}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    env[PLUGIN_TIMEOUT_VAR] = f"{deadline_s:g}"
    env["HANG_MARKER"] = str(tmp_path / "imported")
    env["MOEBENCH_RUNS"] = str(tmp_path / "runs")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "moebench.cli", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, time.monotonic() - t0


@pytest.mark.multiprocess
def test_list_goes_on_after_the_deadline_with_one_line_naming_the_plugin(site, tmp_path):
    started = time.monotonic()
    baseline, _ = _moebench(["list", "--help"], site, tmp_path, timeout=120)  # python and the parser alone
    assert baseline.returncode == 0
    start_s = time.monotonic() - started
    proc, took = _moebench(["list", *ARGS], site, tmp_path, timeout=DEADLINE_S + start_s + 90)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "imported").exists()  # it did start importing
    lines = [ln for ln in proc.stderr.splitlines() if "hang" in ln]
    assert len(lines) == 1, proc.stderr
    assert "plugin 'hang'" in lines[0] and f"within {DEADLINE_S} s" in lines[0] and PLUGIN_TIMEOUT_VAR in lines[0]
    assert "2 valid" in proc.stdout
    assert took < DEADLINE_S + start_s + 60, took


@pytest.mark.multiprocess
@pytest.mark.parametrize("command", [["list", *ARGS], ["env"]])
def test_ctrl_c_while_a_plugin_imports_is_one_line_and_exit_130(site, tmp_path, command):
    import signal

    env = {k: v for k, v in os.environ.items() if k not in (registry.PLUGIN_MODULES_VAR, TIMED_OUT_VAR)}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), HANG_MARKER=str(tmp_path / "imported"))
    env[PLUGIN_TIMEOUT_VAR] = "600"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moebench.cli", *command],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as a terminal starts it: a pytest-xdist worker ignores SIGINT, and a child inherits an
        # ignored signal (Python then installs no KeyboardInterrupt handler): the Ctrl-C would be lost
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "imported").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert (tmp_path / "imported").exists(), "the plugin never started importing"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:  # a process left hanging would fail every later test that counts this one's children
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [f"moebench {command[0]}: interrupted"], err
    if command == ["env"]:  # the machine and its libraries come before any plugin is imported
        assert "optional libraries:" in out and "plugins (contract" not in out, out


@pytest.mark.multiprocess
def test_report_and_compare_never_import_a_plugin(site, tmp_path):
    from moebench.results.synthetic import synthetic_run

    run = synthetic_run(tmp_path / "run")
    proc, _ = _moebench(["report", str(run), "--out", str(tmp_path / "rep")], site, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc, _ = _moebench(["compare", str(run), str(run), "--out", str(tmp_path / "cmp")], site, tmp_path, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "imported").exists()


# imports at once in the sweep (it plans with the entry), hangs in its ranks (spawned children)
RANK_HANG = """
    import multiprocessing, time
    from moebench.kernels.experts.torch import TorchExperts
    from moebench.kernels.registry import register_experts

    MOEBENCH_CONTRACT = 1
    while multiprocessing.parent_process() is not None:
        time.sleep(1)

    @register_experts("rankhang")
    class RankHang(TorchExperts):
        pass
"""


@pytest.mark.multiprocess
def test_a_rank_whose_plugin_hangs_gives_a_row_naming_the_plugin(tmp_path):
    from moebench.results.store import RunStore

    site = tmp_path / "site"
    site.mkdir()
    (site / "rank_hang_plugin.py").write_text(textwrap.dedent(RANK_HANG))
    info = site / "rankhang-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rankhang\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[moebench.kernels]\nrankhang = rank_hang_plugin\n")
    args = ["sweep", *ARGS[:1], "experts=rankhang", *ARGS[2:4], "reduction=experts", "overlap=none"]
    args += ["workload.tokens_per_rank=[16]", "runner.reps=3", "runner.warmup=0", "--out", str(tmp_path / "out")]
    # its import takes torch's (seconds, on a busy machine): a deadline it meets in the sweep
    proc, _ = _moebench(args, site, tmp_path, timeout=300, deadline_s=RANK_DEADLINE_S)
    assert proc.returncode == 1, proc.stderr  # a failed row
    (row,) = RunStore(tmp_path / "out").load().itertuples()
    assert row.status == "failed", row.reason
    assert "plugin 'rankhang'" in row.reason and f"did not finish within {RANK_DEADLINE_S} s" in row.reason, row.reason


def test_an_import_past_its_deadline_disables_the_plugin_and_is_not_waited_for_again(monkeypatch):
    monkeypatch.setattr(registry, "PLUGINS", [])
    monkeypatch.setattr(registry, "DISABLED", dict(registry.DISABLED))
    monkeypatch.delenv(TIMED_OUT_VAR, raising=False)
    release = threading.Event()
    try:
        p = Plugin(name="slow", module="scratch_slow_plugin", dist="slowdist", version="1")
        t0 = time.monotonic()
        registry._load(p, release.wait, seconds=0.3)
        assert 0.3 <= time.monotonic() - t0 < 5
        assert p.status == "disabled" and "did not finish within 0.3 s" in p.reason
        assert "scratch_slow_plugin" in os.environ[TIMED_OUT_VAR].split(os.pathsep)
        # a process this one starts (a rank) skips it at once, saying why
        again = Plugin(name="slow", module="scratch_slow_plugin")
        t0 = time.monotonic()
        registry._load(again, release.wait, seconds=30)
        assert time.monotonic() - t0 < 1
        assert again.status == "disabled" and "in the process that started this one" in again.reason
    finally:
        release.set()  # the abandoned thread ends


def test_a_bad_deadline_is_refused(monkeypatch):
    from moebench.kernels.plugin import timeout_s

    monkeypatch.setenv(PLUGIN_TIMEOUT_VAR, "soon")
    with pytest.raises(ValueError, match=PLUGIN_TIMEOUT_VAR):
        timeout_s()
    monkeypatch.setenv(PLUGIN_TIMEOUT_VAR, "0")
    with pytest.raises(ValueError, match=PLUGIN_TIMEOUT_VAR):
        timeout_s()
    monkeypatch.setenv(PLUGIN_TIMEOUT_VAR, "2.5")
    assert timeout_s() == 2.5


def test_a_group_that_never_started_names_its_start_up():
    failure = decide(Observed(tokens=16, timeout_s=30, startup_s=210))
    assert failure.status == Status.TIMEOUT
    assert failure.reason.startswith("start-up: no rank started within 210 s") and "plugins" in failure.reason
    assert PLUGIN_TIMEOUT_VAR in failure.reason
    assert decide(Observed(tokens=16, timeout_s=30)).reason.startswith("no result within 30 s")


@pytest.mark.multiprocess
def test_a_rank_that_hangs_at_start_up_gets_a_row_naming_start_up(tmp_path, monkeypatch):
    """A hang the plugin deadline does not end (here: a deadline longer than the start-up allowance)
    keeps every rank from beginning its first combination: the row says start-up, not a kernel's
    timeout."""
    from moebench.results.store import RunStore
    from moebench.run import launch
    from moebench.run.sweep import execute
    from tests.run.test_sweep_cpu import children

    (tmp_path / "startup_hang_plugin.py").write_text(
        "import multiprocessing, time\nwhile multiprocessing.parent_process() is not None:\n    time.sleep(1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned ranks start with this process's sys.path
    monkeypatch.setenv(registry.PLUGIN_MODULES_VAR, os.pathsep.join(["fault_experts", "startup_hang_plugin"]))
    monkeypatch.setenv(PLUGIN_TIMEOUT_VAR, "600")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(launch, "STARTUP_S", 4.0)
    ovs = ["backend=local", "experts=torch", "model=tiny", "quant=bf16", "reduction=experts", "overlap=none"]
    ovs += ["workload.tokens_per_rank=[4,8]", "runner.timeout_s=4", "runner.reps=3", "runner.warmup=0"]
    run_dir, counts = execute(ovs, None, str(tmp_path / "out"), quiet=True)
    rows = RunStore(run_dir).load()
    assert sorted(rows.tokens_per_rank) == [4, 8] and set(rows.status) == {Status.TIMEOUT.value}, rows.reason
    assert all(r.startswith("start-up: no rank started within 8 s") for r in rows.reason), rows.reason
    assert counts.exit_code() == 1 and children() == []  # the hung ranks were killed
