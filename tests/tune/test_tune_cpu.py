"""A tune on the CPU (Triton's interpreter): its tiles are host time, so they are never installed
(`--install` refused before any work, `--install-from` of a folder that records the CPU or the
interpreter, or records nowhere, refused: one line, exit 2, nothing written; `--allow-cpu-tiles` is
the tests' own way through); and what a long interpreter tune shows while it runs: a bar over the layer calls of the
whole job that moves sample by sample off the GPU, and an interrupt that says which step it lost.
The end-to-end run (the plan, the finalists' stage, the bar's count) is test_tune.py's first test."""

from __future__ import annotations

import json

import pytest
import torch
from one_combination import TINY_TUNE

from moebench import cli
from moebench.kernels.triton import config as tconfig

ARGV = TINY_TUNE
ENTRY = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
H100 = {"device": "NVIDIA H100 80GB HBM3", "device_name": "NVIDIA_H100_80GB_HBM3", "triton_interpret": False}


@pytest.fixture(autouse=True)
def interpreter(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tconfig, "CONFIG_DIR", tmp_path / "configs")
    monkeypatch.setattr(tconfig, "PARTIAL_DIR", tmp_path / "configs" / "partial")
    yield
    tconfig._load_configs.cache_clear()


def _tune_folder(out, layer: dict, environment: dict, env_json: dict | None = None) -> str:
    """A finished tune's folder as the CLI writes it: the tiles, their provenance, tune.json."""
    name = tconfig.config_file_name(8, 128, None, None, device=environment["device"])
    (out / "configs").mkdir(parents=True)
    (out / "configs" / name).write_text(json.dumps({"4": ENTRY}))
    side = {"tuner": "moebench tune", "layer": layer, "environment": environment, "entries": {"4": {"us": 9.0}}}
    (out / "configs" / (name[: -len(".json")] + ".provenance.json")).write_text(json.dumps(side))
    result = {"tokens": 4, "rows": 4, "best": ENTRY, "best_us": 9.0, "baselines": {}}
    (out / "tune.json").write_text(json.dumps({"layer": layer, "environment": environment, "results": [result]}))
    if env_json is not None:
        (out / "env.json").write_text(json.dumps(env_json))
    return name


@pytest.mark.parametrize(
    "layer, environment, env_json, words",
    [
        (  # a tune on the CPU, as today's tune.json records it
            {"device": "cpu", "timing": "host clock"},
            {"device": "cpu", "device_name": "cpu", "triton_interpret": True},
            None,
            "these tiles were timed on the CPU, under Triton's interpreter (tune.json says so)",
        ),
        (  # the interpreter on a GPU machine, in a tune.json from before it named the interpreter
            {"device": "cuda", "timing": "graph replays up to 256 tokens, events above"},
            {"device": "NVIDIA H100 80GB HBM3", "device_name": "NVIDIA_H100_80GB_HBM3"},
            {"env": {"TRITON_INTERPRET": "1"}},
            "under Triton's interpreter (TRITON_INTERPRET=1) on NVIDIA H100 80GB HBM3's host",
        ),
    ],
)
def test_install_from_refuses_tiles_timed_on_the_host(tmp_path, capsys, layer, environment, env_json, words):
    out = tmp_path / "tune"
    name = _tune_folder(out, layer, environment, env_json)
    assert cli.main(["tune", "--install-from", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"moebench tune: error: --install-from {out}: ") and words in line, line
    assert "host time, not a GPU's, and are not installed" in line
    assert not (tmp_path / "configs").exists()  # nothing written
    # moebench's own tests may install them, saying so
    assert cli.main(["tune", "--install-from", str(out), "--allow-cpu-tiles"]) == 0
    assert json.loads((tmp_path / "configs" / "partial" / name).read_text()) == {"4": ENTRY}


def test_install_from_installs_a_gpus_tiles(tmp_path):
    out = tmp_path / "tune"
    name = _tune_folder(out, {"device": "cuda", "timing": "graph replays up to 256 tokens, events above"}, H100)
    assert cli.main(["tune", "--install-from", str(out)]) == 0
    assert (tmp_path / "configs" / "partial" / name).is_file()


@pytest.mark.parametrize(
    "keep",
    [
        "tiles",  # tuned files alone: nothing at all says where they were timed
        "decisions",  # a decisions sidecar beside them, which records no device either
        "entries",  # a provenance sidecar of entries only, and a tune.json of results only
    ],
)
def test_install_from_refuses_a_folder_that_does_not_say_where_its_tiles_were_timed(tmp_path, capsys, keep):
    """A folder of tuned files with no tune.json or provenance sidecar naming the device installed with
    no check at all, so host-timed tiles could be: refused now (one line, exit 2, nothing written) with
    what to give instead; --allow-cpu-tiles (tests only) lets it through as it lets host time."""
    from moebench.kernels.triton import decisions as kdec

    out = tmp_path / "tune"
    name = _tune_folder(out, {"device": "cuda"}, H100)
    side = out / "configs" / (name[: -len(".json")] + ".provenance.json")
    if keep == "entries":
        side.write_text(json.dumps({"entries": {"4": {"us": 9.0}}}))
        (out / "tune.json").write_text(json.dumps({"results": json.loads((out / "tune.json").read_text())["results"]}))
    else:
        side.unlink()
        (out / "tune.json").unlink()
    if keep == "decisions":
        decisions = {kdec.SCHEMA_KEY: 1, "deepgemm_min_tokens": None, "entries": {"4": {"row_layout": "gathered"}}}
        (out / "configs" / kdec.decisions_name(name)).write_text(json.dumps(decisions))
    assert cli.main(["tune", "--install-from", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"moebench tune: error: --install-from {out}: nothing in it says where these tiles were timed (no "
        "tune.json or configs/*.provenance.json that names the device), so they may be host time and are not "
        "installed: give the --out directory of a `moebench tune` run on a GPU, which writes both"
    )
    assert not (tmp_path / "configs").exists()  # nothing written
    assert cli.main(["tune", "--install-from", str(out), "--allow-cpu-tiles"]) == 0
    assert json.loads((tmp_path / "configs" / "partial" / name).read_text()) == {"4": ENTRY}


def test_install_from_takes_a_gpus_provenance_sidecar_without_tune_json(tmp_path):
    """The sidecar alone says where (its layer and environment): installed, no figures to check."""
    out = tmp_path / "tune"
    name = _tune_folder(out, {"device": "cuda", "timing": "graph replays up to 256 tokens, events above"}, H100)
    (out / "tune.json").unlink()
    assert cli.main(["tune", "--install-from", str(out)]) == 0
    assert (tmp_path / "configs" / "partial" / name).is_file()


@pytest.mark.parametrize("device, gpu", [("cpu", ""), ("cuda", "NVIDIA H100 80GB HBM3"), ("cuda", "")])
def test_a_tune_says_where_it_timed_the_host_in_the_words_its_install_is_refused_with(device, gpu):
    """One wording of where a tune timed the host: the line before its first trial, the note under its
    table and the refusal of --install / --install-from (tune/host_words.py). The first said "Triton's
    interpreter on the GPU's host" where the refusal said "under Triton's interpreter (TRITON_INTERPRET=1)
    on NVIDIA H100 80GB HBM3's host"."""
    from moebench.tune.host_words import host_line, host_note, host_timing, not_installed

    where = host_timing(device, True, gpu)
    assert where.startswith("on the CPU" if device == "cpu" else "under Triton's interpreter")
    assert (gpu or "a GPU") in where or device == "cpu"
    for line in (host_line(device, True, "vllm", gpu), host_note(where), not_installed(where)):
        assert f"timed {where}: " in line and "host time, not a GPU's" in line, line
    assert host_line(device, True, "vllm", gpu).endswith(
        "; for a try-out: --space small 'workload.tokens_per_rank=[16]'"
    )
    assert host_line("cuda", False, "vllm", gpu) == host_timing("cuda", False, gpu) == ""  # a GPU's time


def test_install_is_refused_on_the_cpu_before_any_work(tmp_path, monkeypatch, capsys):
    from moebench.measure import layer

    def build_layer(*args, **kwargs):
        raise AssertionError("built a layer for a tune whose tiles could never be installed")

    monkeypatch.setattr(layer, "build_layer", build_layer)
    out = tmp_path / "tune"
    assert cli.main(ARGV + ["--out", str(out), "--install"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "moebench tune: error: --install: these tiles were timed on the CPU, under Triton's interpreter: host time, "
        "not a GPU's, and are not installed (a tuned table never rests on host time: tune on a GPU without "
        "TRITON_INTERPRET); drop --install to try the tool"
    )
    assert not out.exists() and not (tmp_path / "configs").exists()


def test_the_host_clock_moves_the_bar_between_samples_outside_the_timed_call():
    """Off the GPU each sample ticks the bar before it starts (timing's barrier), the warm-up when the
    timing ends: the finalists' interleaved minutes in the interpreter show as they go."""
    from types import SimpleNamespace

    from moebench.tune.bench import TokenBench

    events: list[str] = []
    layer = SimpleNamespace(device=torch.device("cpu"), warmup=1, flush=None, tick=lambda n: events.append(f"+{n}"))
    tb = object.__new__(TokenBench)
    tb.layer, tb.graph, tb._warm = layer, False, True
    (a, b) = tb._time([lambda: events.append("a"), lambda: events.append("b")], 3)
    assert len(a.us) == len(b.us) == 3
    assert events == ["a", "b"] + ["+1", "a", "+1", "b"] * 3 + ["+2"]  # warm-up, samples, the warm-up's count


def test_the_bar_counts_what_each_step_made_and_drops_what_it_did_not():
    from moebench.tune.progress import Calls, Progress

    calls = Calls(warmup=1, reps=2, final_reps=1, finalists=3)
    assert (calls.screen(), calls.final(3), calls.final(1), calls.count(3)) == (4, 9, 0, 22)
    lines: list[str] = []
    bar = Progress(calls.count(3), "t", disable=True, log=lines.append)
    with bar.work(calls.count(3)):
        bar.drop(calls.screen())  # a trial read from the store
        for _ in range(2):
            with bar.work(calls.screen(), trial=True):
                bar.tick(calls.screen())
        with bar.work(calls.final(3)):
            bar.tick(5)  # a finalist failed its check: fewer calls than planned
        # the re-check never ran (no winner): the count's account drops it at its end
    assert bar.n == bar.total == 13
    bar.stage("T=4: 3 finalists again, 1 sample each, interleaved")
    assert bar.interrupted() == "during T=4: 3 finalists again, 1 sample each, interleaved (timed again on resume)"


def test_a_resume_takes_the_stored_trials_off_the_plan_up_front_and_keeps_the_account_true():
    """A resumed tune printed its whole plan ('about 25 layer calls in all') and then finished in
    seconds without a word: the plan now says how many stored trials it reads back, the calls they
    spare and what is left; the bar starts at what is left, and a step that reads back fewer than the
    store promised puts the rest back on the total."""
    from types import SimpleNamespace

    from moebench.tune.progress import Calls, Progress, plan_line

    calls = Calls(warmup=1, reps=2, final_reps=1, finalists=3)
    # 3 screened, 3 finals, 1 re-check stored: the whole count (22 calls); 2 screened alone: 8
    assert calls.reused(3, 3, 3, 1) == calls.count(3) == 22 and calls.reused(3, 2, 0, 0) == 8
    dims = SimpleNamespace(num_experts=8, intermediate=128, hidden=256, topk=2)
    line = plan_line("tiny", dims, [4, 16], "small", 2, {4: 3, 16: 3}, calls, reused=(9, 30))
    assert "about 44 layer calls in all, 30 of them read back from 9 stored trials" in line, line
    assert line.endswith("about 14 calls to make (the bar counts them)"), line
    whole = plan_line("tiny", dims, [4], "small", 2, {4: 3}, calls, reused=(7, 22))
    assert "22 of them read back from 7 stored trials (--out's trials.jsonl): nothing to time" in whole
    assert "read back" not in plan_line("tiny", dims, [4], "small", 2, {4: 3}, calls)
    bar = Progress(calls.count(3) - 8, "t", disable=True, log=lambda s: None)
    assert bar.total == 14
    with bar.work(calls.count(3), credit=8):
        bar.reuse(calls.screen())  # one stored trial read back: the plan had left it out already
        assert bar.total == 14
        for _ in range(2):  # the second stored trial was not (another path): timed
            with bar.work(calls.screen(), trial=True):
                bar.tick(calls.screen())
        with bar.work(calls.final(3)):
            bar.tick(calls.final(3))
        bar.tick(1)  # the re-check
    assert bar.n == bar.total == 18  # the unspent credit (4 calls) went back on the total


def test_an_interrupt_says_which_step_it_cut_short(tmp_path, monkeypatch, capsys):
    from moebench.tune import search

    def cut(m, *args, **kwargs):
        m.stage("3 finalists again, 1 sample each, interleaved")
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "_search_count", cut)
    out = tmp_path / "tune"
    assert cli.main(ARGV + ["--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert (
        "moebench tune: interrupted during T=4: 3 finalists again, 1 sample each, interleaved (timed again on "
        f"resume); the trials finished so far are kept in {out / 'trials.jsonl'}: the same command resumes"
    ) in err
    assert "tune: timed on the CPU, under Triton's interpreter: every figure is host time" in err


def test_sigterm_says_which_step_it_cut_short_and_exits_143(tmp_path, monkeypatch, capsys):
    """`timeout` or `kill` (SIGTERM) ended tune with no word at all, where Ctrl-C said what was kept:
    now the same line, as terminated, exit 143 (a real SIGTERM to this process, mid-count)."""
    import os
    import signal

    from moebench.tune import search

    def cut(m, *args, **kwargs):
        m.stage("3 finalists again, 1 sample each, interleaved")
        os.kill(os.getpid(), signal.SIGTERM)  # the handler main installs raises here, where Ctrl-C would
        raise AssertionError("SIGTERM did not stop the tune")

    monkeypatch.setattr(search, "_search_count", cut)
    out = tmp_path / "tune"
    assert cli.main(ARGV + ["--out", str(out)]) == 143
    err = capsys.readouterr().err
    assert (
        "moebench tune: terminated (SIGTERM) during T=4: 3 finalists again, 1 sample each, interleaved (timed "
        f"again on resume); the trials finished so far are kept in {out / 'trials.jsonl'}"
    ) in err
    assert signal.getsignal(signal.SIGTERM) is not None and "Terminated" not in repr(signal.getsignal(signal.SIGTERM))


def test_an_interrupt_while_the_gpus_processes_run_stops_them_and_goes_on():
    import multiprocessing
    import signal
    import time

    from torch.multiprocessing.spawn import ProcessContext

    from moebench.cli.options import Terminated
    from moebench.tune.search import join_or_stop

    procs = [multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,)) for _ in range(2)]
    for p in procs:
        p.start()
    ctx = ProcessContext(procs, [""] * 2)
    err = Terminated()

    def join(timeout=None):  # a SIGTERM's Terminated while the parent waits
        raise err

    ctx.join = join
    t0 = time.monotonic()
    with pytest.raises(Terminated) as got:
        join_or_stop(ctx)
    assert got.value is err
    assert [p.is_alive() for p in procs] == [False, False]
    assert [p.exitcode for p in procs] == [-signal.SIGTERM] * 2
    assert time.monotonic() - t0 < 5


def test_the_bar_off_a_terminal_is_a_line_now_and_then(monkeypatch):
    import io
    import sys

    from moebench.tune.progress import Progress

    err = io.StringIO()  # stderr to a file: no terminal
    monkeypatch.setattr(sys, "stderr", err)
    clock = [0.0]
    bar = Progress(50, "tune tiny", log=lambda s: None, clock=lambda: clock[0])
    bar.stage("T=4: screening")
    for _ in range(4):
        clock[0] += 4.0  # 10 calls every 4 s: a line at 12 s (after 10 s)
        bar.tick(10)
    clock[0] += 1.0
    bar.drop(10)  # the rest not needed: every call made, the last line
    bar.tick(0)  # nothing more: no second last line
    bar.close()
    text = err.getvalue()
    assert "\r" not in text
    assert text.splitlines() == [
        "tune tiny: 30 of 50 layer calls (60 %) in 12 s, about 8 s left; T=4: screening",
        "tune tiny: 40 of 40 layer calls (100 %) in 17 s; T=4: screening",
    ]
