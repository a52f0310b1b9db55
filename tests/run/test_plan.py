"""Planning: sweep expansion with Hydra's override parser, sweep files, the
validity rules of docs/design.md and refusals before any work starts."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from moebench.cli.parser import parse_args
from moebench.config import sweeps, validity
from moebench.config.compose import compose_config, to_combo
from moebench.run import plan

ISSUE_SWEEP = [
    "backend=local",
    "experts=torch",
    "reduction=experts,finalize",
    "overlap=none,combine",
    "workload.tokens_per_rank=[16,64]",
    "model=tiny",
    "quant=bf16",
]


def reasons(overrides):
    combos, _ = plan.plan(overrides, "default")
    return {c.label: c.reason for c in combos}


def test_issue_sweep_expands_to_four_combinations_of_two_tokens():
    combos, _ = plan.plan(ISSUE_SWEEP, "default")
    assert len(combos) == 4 and all(c.reason is None for c in combos)
    assert sorted((c.combo["reduction"], c.combo["overlap"]) for c in combos) == [
        ("experts", "combine"),
        ("experts", "none"),
        ("finalize", "combine"),
        ("finalize", "none"),
    ]
    assert all(c.tokens == (16, 64) for c in combos)
    assert len({c.key for c in combos}) == 4


def test_cli_overrides_replace_sweep_file_values():
    combos, sweep = plan.plan(["backend=local", "experts=torch", "quant=bf16"], "default")
    assert sweep["name"] == "default"
    # reduction x overlap still come from the sweep file
    assert len(combos) == 2 * 3
    assert {c.combo["model"] for c in combos} == {"tiny"}


def test_validity_rules_give_reasons(monkeypatch):
    r = validity.validate
    base = to_combo(compose_config(["backend=local", "experts=torch", "model=tiny"]))
    assert r(base) is None
    assert "layouts differ" in r(base.replace(experts="torch_batched"))
    assert "only reduction=finalize" in r(base.replace(backend="local_batched", experts="torch_batched"))
    assert "needs shared experts" in r(base.replace(num_shared_experts=0, overlap="dispatch"))
    assert "world_size >= 2" in r(base.replace(backend="naive", world_size=1))
    assert "does not divide" in r(base.replace(simulate_ep=3))
    assert "multiples of 128" in r(base.replace(quant="fp8_block", hidden=2880, intermediate=2880))
    assert "need quant=fp8_block" in r(base.replace(experts="deepgemm"))  # the entry's own rule
    g = base.replace(timing="graph", graph_max_tokens=256)
    assert "needs CUDA" in validity.check_tokens(g, 16).reason
    assert validity.check_tokens(g.replace(device="cuda"), 256) is None  # the torch experts capture
    from moebench.kernels import registry

    torch_experts = registry.get_experts("torch")
    monkeypatch.setattr(torch_experts, "graph_capturable", False)  # as an entry that reads counts back
    assert "syncs the host" in validity.check_tokens(g.replace(device="cuda"), 256).reason
    assert validity.check_tokens(g.replace(device="cuda"), 257) is None  # events above graph_max_tokens
    batched = g.replace(device="cuda", backend="local_batched", experts="triton_batched", reduction="finalize")
    assert validity.check_tokens(batched, 16) is None  # local_batched's scatter captures
    assert validity.check_tokens(batched.replace(backend="pplx", world_size=2), 16) is None  # pplx captures
    # auto never skips: graphs where the layer can be captured (at any size), events elsewhere
    auto = g.replace(timing="auto", device="cuda")
    assert validity.check_tokens(auto, 16) is None and validity.timing_mode(auto, 16) == "events"  # no capture
    assert validity.timing_mode(auto.replace(experts="triton"), 16) == "graph"
    assert validity.timing_mode(auto.replace(experts="triton"), 65536) == "graph"
    assert validity.timing_mode(auto.replace(experts="triton", device="cpu"), 16) == "cpu"
    # a batched buffer's cap is the backend's (deepep_ll, pplx), per token count
    pplx = base.replace(
        backend="pplx",
        experts="torch_batched",
        reduction="finalize",
        world_size=2,
        knobs=(("max_tokens_per_rank", 512), ("pplx_mode", "intranode")),
    )
    assert validity.check_tokens(pplx, 512) is None
    assert "max_tokens_per_rank=512" in validity.check_tokens(pplx, 513).reason
    assert validity.check_tokens(base.replace(backend="local_batched", experts="torch_batched"), 4096) is None


def test_check_tells_a_rule_of_the_plan_from_what_the_machine_lacks(monkeypatch):
    """config/validity.py's Skip.rule: layouts, splits and quant names no machine lifts; CUDA, an
    entry's library or GPU, too few ranks are the machine's. A rule comes first."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    base = to_combo(compose_config(["backend=local", "experts=torch", "model=tiny", "runner.device=cpu"]))
    assert validity.check(base) is None
    rules = [
        (base.replace(experts="torch_batched"), "layouts differ"),
        (base.replace(simulate_ep=3), "simulate_ep=3 does not divide"),
        (base.replace(backend="local_batched", experts="torch_batched"), "only reduction=finalize"),
        (base.replace(quant="mxfp4"), "quant=mxfp4 is MXFP4 weights"),
        (base.replace(experts="torch_batched", timing="profiler"), "layouts differ"),  # a rule before the machine's
    ]
    for c, says in rules:
        skip = validity.check(c)
        assert skip and skip.rule and says in skip.reason and skip.reason == validity.validate(c), c.label
    for c in (base.replace(timing="profiler"), base.replace(experts="triton")):
        skip = validity.check(c)
        assert skip and not skip.rule and "CUDA" in skip.reason, c.label
    combos, _ = plan.plan(["backend=local,naive", "experts=torch,torch_batched", "model=tiny", "quant=bf16"], None)
    assert all(bool(c.rule) == ("layouts differ" in (c.reason or "")) for c in combos)
    monkeypatch.setattr(plan.os, "cpu_count", lambda: 1)  # naive's two ranks: the machine's
    (c,) = plan.plan(["backend=naive", "experts=torch", "model=tiny", "quant=bf16", "runner.device=cpu"], None)[0]
    assert "this machine has 1 CPU core" in c.reason and not c.rule
    plan.refuse_impossible(combos)  # some run: a sweep with skipped rows
    with pytest.raises(
        ValueError, match=r"these 2 combinations, each breaks a rule: 2 with layouts differ: .* \(and 1 more like it\)$"
    ):
        plan.refuse_impossible([c for c in combos if c.rule])
    machine = [c for c in combos if not c.reason][0]
    plan.refuse_impossible([c for c in combos if c.rule] + [replace(machine, reason="too few GPUs")])


@pytest.mark.parametrize("marked", [True, False], ids=["Rule", "str"])
def test_an_entrys_own_rule_is_a_rule_of_the_plan_and_a_plain_reason_the_machines(marked, monkeypatch):
    """`supports` marks a reason no machine lifts with `Rule` (docs/plugins.md): check counts it as
    a rule of the plan, before what the machine lacks (CUDA, the other entry's library); a plain
    str, as every plugin written before the marker says it, stays the machine's."""
    from moebench.kernels import registry
    from moebench.kernels.interfaces import Rule

    said = "experts=fault never runs this hidden size"
    fault = registry.entry("experts", "fault")  # a plugin's entry (tests/support/fault_experts.py)
    monkeypatch.setattr(fault, "supports", classmethod(lambda cls, combo: Rule(said) if marked else said))
    base = to_combo(compose_config(["backend=local", "experts=fault", "model=tiny", "runner.device=cpu"]))
    skip = validity.check(base)
    assert skip == validity.Skip(said, rule=marked) and type(skip.reason) is str
    profiler = validity.check(base.replace(timing="profiler"))  # CUDA, which this machine lacks
    assert profiler.rule == marked and (said if marked else "needs CUDA") in profiler.reason
    (c,) = plan.plan(["backend=local", "experts=fault", "model=tiny", "quant=bf16", "reduction=experts"], None)[0]
    assert (c.reason, c.rule) == (said, marked)
    if marked:
        with pytest.raises(ValueError, match=f"^no machine can run this combination: {said}$"):
            plan.refuse_impossible([c])
    else:
        plan.refuse_impossible([c])  # a skipped row


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["backend=local", "experts=triton_or_deepgemm"], "DeepGEMM experts need quant=fp8_block"),
        (
            ["backend=deepep_ht", "backend.num_sms=23", "runner.world_size=2", "experts=triton"],
            "DeepEP needs a positive even SM count",
        ),
    ],
    ids=["triton_or_deepgemm", "backend"],
)
def test_a_rule_decides_before_either_entry_asks_the_machine(overrides, says, monkeypatch):
    """check (what plan, list and compare's never_runs ask) on a CUDA combination an entry's Rule
    rules out: no entry asks the machine (the Triton side's fp8 dot would start CUDA in the
    planning process for the GPU's compute capability), and the skip is the rule's."""
    from moebench.kernels.experts import _deep_gemm

    def asked(*args):
        raise AssertionError("the machine was asked")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", asked)
    monkeypatch.setattr(_deep_gemm, "load", asked)
    combo = to_combo(compose_config([*overrides, "quant=fp8_tensor", "model=tiny"]), device="cuda")
    skip = validity.check(combo)
    assert skip and skip.rule and says in skip.reason, skip


CAPPED = ["backend=pplx", "experts=torch_batched", "reduction=finalize", "quant=bf16", "model=tiny"]


def test_a_token_count_over_the_cap_is_a_rule_and_refused_where_every_one_is(monkeypatch):
    """config/validity.py's check_tokens: backend.max_tokens_per_rank is the config's cap, a rule of
    the plan (asked beside this machine's reason, pplx's library absent here); timing=graph's
    entry that cannot be captured is its card's (a rule), needing CUDA the machine's. A request
    every (combination, token count) of which is over the cap is refused naming the cap and what
    to change; one with a token count under it goes on (its rows skipped here, for the library)."""
    base = to_combo(compose_config(["backend=local", "experts=torch", "model=tiny", "runner.device=cpu"]))
    pplx = base.replace(backend="pplx", experts="torch_batched", reduction="finalize", world_size=2)
    assert validity.check_tokens(pplx, 512) is None
    over = validity.check_tokens(pplx, 513)
    assert over.rule and "max_tokens_per_rank=512" in over.reason and type(over.reason) is str
    assert validity.check_with_tokens(pplx, (512, 513)) == (validity.check(pplx), {513: over})
    # an entry not registered here: check's reason alone, no token count asked of entries it lacks
    gone, none = validity.check_with_tokens(pplx.replace(experts="not_here"), (513,))
    assert "experts=not_here has no implementation" in gone.reason and not gone.rule and none == {}
    g = base.replace(timing="graph", graph_max_tokens=256)
    assert not validity.check_tokens(g, 16).rule  # needs CUDA: the machine's
    from moebench.kernels import registry

    monkeypatch.setattr(registry.get_experts("torch"), "graph_capturable", False)
    assert validity.check_tokens(g.replace(device="cuda"), 16).rule  # the entry's declaration
    (c,) = plan.plan([*CAPPED, "workload.tokens_per_rank=[1024,2048]"], None)[0]
    assert "pplx_kernels" in c.reason and not c.rule and c.ruled_out and c.token_reasons == {}
    with pytest.raises(ValueError, match=r"^no machine can run any of these 2 \(combination, token count\) pairs") as e:
        plan.refuse_impossible([c])
    assert "raise backend.max_tokens_per_rank or lower workload.tokens_per_rank" in str(e.value)
    (c,) = plan.plan([*CAPPED, "workload.tokens_per_rank=[1024]", "backend.max_tokens_per_rank=1024"], None)[0]
    assert not c.ruled_out and c.token_rules == {}
    plan.refuse_impossible([c])  # raised the cap: the library is this machine's reason, a skipped row
    (c,) = plan.plan([*CAPPED, "workload.tokens_per_rank=[256,1024]"], None)[0]
    assert list(c.token_rules) == [1024] and not c.ruled_out
    plan.refuse_impossible([c])  # 256 tokens run where pplx is installed


def test_missing_library_entries_are_skipped_with_how_to_install():
    rs = reasons(["backend=deepep_ht", "experts=torch", "reduction=experts", "overlap=none", "quant=bf16"])
    (why,) = rs.values()
    assert why and ("deep_ep" in why or "CUDA" in why or "cuda" in why)


def test_default_sweep_on_cpu_counts():
    combos, _ = plan.plan([], "default")
    if torch.cuda.is_available():
        pytest.skip("counts are for a machine without a GPU")
    valid = [c for c in combos if not c.reason]
    assert len(combos) == 8 * 7 * 2 * 3 * 3
    by_backend = {}
    for c in valid:
        by_backend[c.combo["backend"]] = by_backend.get(c.combo["backend"], 0) + 1
    # torch experts on the CPU backends (README states these counts)
    triton_valid = sum(1 for c in valid if c.combo["experts"].startswith("triton"))
    assert (
        by_backend.get("local", 0)
        - sum(1 for c in valid if c.combo["backend"] == "local" and c.combo["experts"] != "torch")
        == 18
    )
    assert len(valid) - triton_valid == 72


def fake_gpu_machine(monkeypatch) -> None:
    """A machine with GPU device nodes (moebench/config/device.py asks torch then)."""
    from moebench.config import device

    monkeypatch.setattr(device, "no_gpu_for_certain", lambda: False)


def test_world_size_beyond_the_gpus_is_refused_with_the_numbers(monkeypatch):
    fake_gpu_machine(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"runner.world_size=4 needs 4 GPUs .* has 2"):
        plan.plan(
            [
                "backend=naive",
                "experts=torch",
                "reduction=experts",
                "overlap=none",
                "quant=bf16",
                "runner.device=cuda",
                "runner.world_size=4",
            ],
            "default",
        )


def test_an_explicit_world_size_beyond_the_cores_is_refused_even_where_its_combinations_skip(monkeypatch, capsys):
    """runner.world_size=64 on a 2-core machine: every 64-rank combination of the default sweep
    would also be skipped (64 does not divide the tiny model's experts); the request is still
    refused in one line, and `list --oversubscribe` plans it as `sweep --oversubscribe` would."""
    from moebench import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(plan.os, "cpu_count", lambda: 2)
    with pytest.raises(ValueError, match=r"runner.world_size=64 starts 64 CPU ranks but this machine has 2 cores"):
        plan.plan(["runner.world_size=64"], "default")
    assert cli.main(["list", "runner.world_size=4"]) == 2
    assert "pass --oversubscribe" in capsys.readouterr().err
    assert cli.main(["list", "--oversubscribe", "runner.world_size=4"]) == 0


def test_cuda_without_a_gpu_is_refused():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        plan.plan(["backend=local", "experts=torch", "runner.device=cuda"], None)


def test_unknown_sweep_names_the_valid_ones():
    with pytest.raises(ValueError, match="default"):
        sweeps.load_sweep("nope")


def test_sweep_axes_outside_identity_still_give_distinct_combinations():
    combos, _ = plan.plan(["backend=local", "experts=torch", "trace=none,torch", "runner.l2_flush=true,false"], None)
    assert len({c.key for c in combos}) == 4


@pytest.mark.parametrize(
    "text, words",
    [
        ("overrides: [1, 2", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping"),
        ("overrides:\n  backend: {a: 1}\n", "not a mapping"),
    ],
)
def test_malformed_sweep_files_are_clear(tmp_path, text, words):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=words):
        plan.plan([], str(p))


@pytest.mark.parametrize(
    "bad, words",
    [
        (["workload.routing=foo"], "valid: uniform"),
        (["model.topk=9"], "exceeds"),
        (["runner.timing=grpah"], "valid: auto, events"),
        (["runner.reps=0"], "must be > 0"),
        (["overlap.shared_sm_carveout=-1"], "must be >= 0"),
        (["backend.combine_nvl_chunk=-2"], "must be >= 0"),
        (["experts.row_layout=sorted"], "valid: auto, gathered, contiguous"),
        (["workload.tokens_per_rank=[]"], "holds no token count"),
        (["workload.tokens_per_rank=[16,16]"], "twice"),
        (["workload.tokens_per_rank=[0]"], "integers >= 1"),
        (["workload.tokens_per_rank=[-16]"], "integers >= 1"),
        (["runner.memory_budget=lots"], "not a size"),
    ],
)
def test_bad_values_are_refused_before_work(bad, words):
    with pytest.raises(ValueError, match=words):
        plan.plan(["backend=local", "experts=torch", *bad], None)


@pytest.mark.parametrize(
    "argv, overrides",
    [
        (["sweep", "backend=local", "--sweep", "deepep_ll", "experts=torch"], ["backend=local", "experts=torch"]),
        (
            ["sweep", "--sweep", "deepep_ll", "backend=local", "--dry-run", "experts=torch"],
            ["backend=local", "experts=torch"],
        ),
        # order kept (a key given twice is refused: tests/cli/test_help_and_errors.py)
        (["list", "--json", "b=1", "--sweep", "x", "a=2"], ["b=1", "a=2"]),
        (["tune", "experts=triton", "--space", "decode", "model=tiny"], ["experts=triton", "model=tiny"]),
    ],
)
def test_cli_overrides_may_follow_options(argv, overrides):
    args = parse_args(argv)
    assert args.overrides == overrides


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "backend=local", "--sweep", "x", "--nope"],  # an unknown option
        ["sweep", "backend=local", "--out", "d", "junk"],  # a word that is no override
        ["report", "run_a", "backend=local"],  # a command without overrides
    ],
)
def test_cli_refuses_what_is_neither_option_nor_override(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unrecognized arguments" in err
    # one line naming the command and its own help (not the top level's list of commands)
    assert err.startswith(f"moebench {argv[0]}: error:") and err.endswith(f"(see moebench {argv[0]} --help)\n")
    assert err.count("\n") == 1


V3_COMBINE = [
    "backend=naive",
    "experts=torch",
    "reduction=finalize",
    "overlap=combine",
    "quant=bf16",
    "model=deepseek_v3",
    "runner.device=cpu",
]


def test_fields_and_knobs_at_their_defaults_stay_out_of_the_key():
    """So that a field or knob added later (at its default) keeps every stored key."""
    from moebench.config.spec import key_of

    (base,), _ = plan.plan(V3_COMBINE, None)
    ident = base.combo.identity()
    assert base.key == key_of(ident)
    assert "shared_sm_carveout" not in ident and "skew" not in ident and "timing" not in ident
    assert {"backend", "model", "hidden", "device", "world_size"} <= set(ident)
    assert base.label == "naive/torch/finalize/combine/bf16/deepseek_v3/ws2"
    (carved,), _ = plan.plan(V3_COMBINE + ["overlap.shared_sm_carveout=8"], None)
    assert carved.key != base.key and carved.combo.identity()["shared_sm_carveout"] == 8


def test_settings_that_cannot_matter_do_not_split_a_combination():
    (a,), _ = plan.plan(V3_COMBINE + ["workload.skew=3.0"], None)  # uniform routing: skew unused
    (b,), _ = plan.plan(V3_COMBINE, None)
    assert a.key == b.key
    (z1,), _ = plan.plan(V3_COMBINE + ["workload.routing=zipf", "workload.skew=1.2"], None)
    (z3,), _ = plan.plan(V3_COMBINE + ["workload.routing=zipf", "workload.skew=3.0"], None)
    assert z1.key != z3.key and z3.label.endswith("/zipf/skew3.0")
    combos, _ = plan.plan(["backend=local", "experts=torch", "backend.simulate_ep=1", "runner.world_size=1,2"], None)
    assert len(combos) == 1  # a single-rank backend runs one rank whatever world_size says


def test_knob_sweeps_give_distinct_keys_labels_and_cpu_reasons():
    combos, _ = plan.plan(V3_COMBINE + ["overlap.shared_sm_carveout=0,24"], None)
    assert len({c.key for c in combos}) == 2 and len({c.label for c in combos}) == 2
    carved = next(c for c in combos if c.combo["shared_sm_carveout"])
    assert carved.label.endswith("/carve24")
    assert "needs CUDA" in carved.reason  # no SM to leave free on the CPU
    (noshared,), _ = plan.plan(
        V3_COMBINE[:3] + ["overlap=none", "model=mixtral_8x7b", "overlap.shared_sm_carveout=8"], None
    )
    assert "has none" in noshared.reason
    with pytest.raises(ValueError, match="backend.combine_nvl_chunk is set, but none of the chosen entries"):
        plan.plan(V3_COMBINE + ["backend.combine_nvl_chunk=4"], None)
    # in a sweep over backends, the knob splits the backend that takes it only
    combos, _ = plan.plan(V3_COMBINE[1:] + ["backend=naive,deepep_ht", "backend.num_sms=16,24"], None)
    assert sorted(c.label for c in combos) == [
        "deepep_ht/torch/finalize/combine/bf16/deepseek_v3/ws2",
        "deepep_ht/torch/finalize/combine/bf16/deepseek_v3/ws2/sms16",
        "naive/torch/finalize/combine/bf16/deepseek_v3/ws2",
    ]


def test_carveout_beyond_the_gpus_sms_is_refused(monkeypatch):
    class Props:
        multi_processor_count = 132

    fake_gpu_machine(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    ovs = [
        "backend=naive",
        "experts=torch",
        "reduction=finalize",
        "overlap=combine",
        "quant=bf16",
        "model=deepseek_v3",
        "runner.device=cuda",
    ]
    with pytest.raises(ValueError, match="this GPU has 132 SMs"):
        plan.plan(ovs + ["overlap.shared_sm_carveout=132"], None)
    combos, _ = plan.plan(ovs + ["overlap.shared_sm_carveout=131"], None)
    assert combos[0].combo["shared_sm_carveout"] == 131


def test_rows_carry_the_knobs_as_columns():
    from moebench.results import rows

    (c,), _ = plan.plan(
        V3_COMBINE[1:] + ["backend=deepep_ht", "overlap.shared_sm_carveout=24", "backend.num_sms=16"], None
    )
    row = rows.identity(c, 8)
    assert (row["num_sms"], row["shared_sm_carveout"], row["dispatch_nvl_chunk"], row["combine_nvl_chunk"]) == (
        16,
        24,
        0,
        0,
    )
    assert row["row_layout"] is None  # torch experts take no row layout
    assert row["knobs"] == "carve24 sms16" and row["combo_key"] == c.key


def test_row_layout_knob():
    ovs = [
        "backend=local",
        "experts=triton",
        "reduction=experts",
        "overlap=none",
        "quant=fp8_block",
        "model=deepseek_v3",
        "runner.device=cpu",
    ]
    (auto,), _ = plan.plan(ovs, None)
    combos, _ = plan.plan(ovs + ["experts.row_layout=gathered,contiguous"], None)
    assert {c.label.rsplit("/", 1)[1] for c in combos} == {"gathered", "contiguous"}
    assert len({c.key for c in combos} | {auto.key}) == 3 and "row_layout" not in auto.label
    (bf16,), _ = plan.plan(ovs[:4] + ["quant=bf16", "model=deepseek_v3", "experts.row_layout=contiguous"], None)
    assert bf16.reason is None and bf16.label.endswith("/contiguous")
    (tensor,), _ = plan.plan(ovs[:4] + ["quant=fp8_tensor", "model=deepseek_v3", "experts.row_layout=contiguous"], None)
    assert "quant=bf16 or fp8_block only" in tensor.reason
    with pytest.raises(ValueError, match="use experts.row_layout=gathered"):
        plan.plan(ovs + ["experts.fp8_layout=gathered"], None)
    with pytest.raises(ValueError, match="experts.row_layout is set, but none of the chosen entries"):
        plan.plan(["experts=torch"] + ovs[2:] + ["experts.row_layout=gathered"], None)


def test_contiguous_gemm_knob(monkeypatch):
    """experts.contiguous_gemm=gluon (issue #35's Gluon GEMM) is a knob of the triton experts: its
    own key and label tag; planned with the reason it cannot run where it cannot (another quant,
    the gathered rows, no GPU: Gluon has no interpreter), each before any work starts."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the CPU's Triton experts run (the Gluon one cannot)
    ovs = [
        "backend=local",
        "experts=triton",
        "reduction=experts",
        "overlap=none",
        "quant=fp8_block",
        "model=deepseek_v3",
        "runner.device=cpu",
    ]
    (triton,), _ = plan.plan(ovs, None)
    (gluon,), _ = plan.plan(ovs + ["experts.contiguous_gemm=gluon"], None)
    assert triton.reason is None and gluon.key != triton.key and "gemm=gluon" in gluon.label
    assert "gemm=" not in triton.label  # the default keeps stored rows' keys and labels
    assert "no interpreter" in gluon.reason
    (bf16,), _ = plan.plan(ovs[:4] + ["quant=bf16", "model=deepseek_v3", "experts.contiguous_gemm=gluon"], None)
    assert "fp8_block GEMM, not quant=bf16" in bf16.reason
    (gathered,), _ = plan.plan(ovs + ["experts.contiguous_gemm=gluon", "experts.row_layout=gathered"], None)
    assert "contiguous layout's rows" in gathered.reason
    (wide,), _ = plan.plan(ovs + ["experts.contiguous_gemm=gluon_wide"], None)  # refused as gluon is, by its name
    assert wide.reason.startswith("experts.contiguous_gemm=gluon_wide: ") and "no interpreter" in wide.reason
    assert "gemm=gluon_wide" in wide.label and wide.key not in (gluon.key, triton.key)
    (forced,), _ = plan.plan(ovs + ["experts.contiguous_gemm=triton"], None)  # auto, the default, is no tag
    assert forced.reason is None and "gemm=triton" in forced.label and forced.key != triton.key
    with pytest.raises(ValueError, match="valid: auto, triton, gluon"):
        plan.plan(ovs + ["experts.contiguous_gemm=cuda"], None)


@pytest.mark.parametrize(
    "mode,quant,cap,n,kernel",
    [
        ("auto", "fp8_block", (9, 0), 4096, "gluon"),  # DeepSeek-V3's EP-8 gate/up: measured faster on Gluon
        ("auto", "fp8_block", (9, 0), 7168, "gluon"),
        ("auto", "fp8_block", (9, 0), 1536, "gluon"),  # qwen3's gate/up: faster too since the TMA-store epilogue
        ("auto", "fp8_block", (10, 0), 7168, "triton"),  # Gluon's WGMMA is sm_90's
        ("auto", "fp8_block", None, 7168, "triton"),  # no GPU: the interpreter runs Triton only
        ("auto", "bf16", (9, 0), 7168, "triton"),  # the Gluon kernel is fp8_block's
        ("triton", "fp8_block", (9, 0), 7168, "triton"),
        ("gluon", "fp8_block", (9, 0), 1536, "gluon"),
        ("gluon", "fp8_block", None, 7168, ValueError),  # forced where Gluon cannot run: refused, not recorded as run
        ("gluon", "fp8_block", (10, 0), 7168, ValueError),
        ("gluon_wide", "fp8_block", (9, 0), 4096, "gluon_wide"),  # the 128 x 192 tile: opt-in only
        ("gluon_wide", "fp8_block", None, 4096, ValueError),
    ],
)
def test_contiguous_gemm_auto_picks_the_kernel_measured_faster(mode, quant, cap, n, kernel):
    """experts.contiguous_gemm=auto (the default): the Gluon kernel for the GEMMs it measured
    faster on (at least GLUON_MIN_N output columns — every N since its TMA-store epilogue —, an SM90
    GPU, fp8_block), else Triton."""
    from moebench.kernels.cards.experts import GLUON_MIN_N, contiguous_gemm_kernel

    assert GLUON_MIN_N == 0
    if kernel is ValueError:
        with pytest.raises(ValueError, match="needs an SM90 GPU"):
            contiguous_gemm_kernel(mode, quant, cap, n)
        return
    assert contiguous_gemm_kernel(mode, quant, cap, n) == kernel


def test_gluon_is_refused_where_this_process_cannot_run_it(monkeypatch):
    """experts.contiguous_gemm=gluon is planned as skipped under the interpreter and with a Triton
    older than the Gluon API the kernel is written against (3.6); auto then runs Triton."""
    from importlib import metadata

    from moebench.kernels.cards import experts as cards

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(metadata, "version", lambda name: "3.5.1")
    assert "Triton >= 3.6 (installed: 3.5.1)" in cards.gluon_runtime_unsupported()
    assert "Triton >= 3.6" in cards.gluon_unsupported("fp8_block", "auto", "cuda")
    monkeypatch.setattr(metadata, "version", lambda name: "3.6.0+git1234")
    assert cards.gluon_runtime_unsupported() is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "no interpreter" in cards.gluon_runtime_unsupported()


def test_the_default_sweeps_plan_is_pinned(monkeypatch):
    """The default sweep's whole plan on a 2-core machine without a GPU nor the Triton interpreter (every combination's
    `list --json` record: key, label, fields, reason, skipped tokens) is the one planned before
    planning read the entries' cards instead of their implementations (issue #33, at ddffc31):
    a change to it is deliberate, with the new digest."""
    import hashlib
    import json

    from moebench.config import plugins

    monkeypatch.setattr(plan.os, "cpu_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # conftest's: the Triton experts would run
    combos, _ = plan.plan([], "default")
    records = [plugins.combo_record(c) for c in combos]
    assert (len(records), sum(r["status"] == "valid" for r in records)) == (1008, 72)
    digest = hashlib.sha1(json.dumps(records, sort_keys=True).encode()).hexdigest()
    # (session 8: the triton records' knobs list experts.contiguous_gemm at its default; keys, labels,
    # statuses and reasons as before. Session 9: that default is auto, not triton — with "auto"
    # written back as "triton" the records hash to session 8's c83cd01b…. Issue #49: each record
    # gains the field model_config_sha256, "" for the built-in cards; without it the records hash
    # to 3e804377…, the pin before: keys, labels, statuses and reasons as before. Session 13: each
    # record gains simulate_tp, 1 everywhere; without it the records hash to 203bbda0…, the pin before.
    # Session 23: an entry's Rule comes before what the machine lacks: 57 reasons change, keys, labels
    # and statuses as before — deepep_ll on tiny's hidden size before "deep_ep is not installed", and
    # DeepGEMM's quant=fp8_block before deep_ep's or pplx_kernels' absence; the pin before b5af5369….
    # Session 24: each record gains reason_kind (753 rule, 183 machine, 72 null) and skipped_token_kinds
    # ({} everywhere); without them the records hash to ca54222b…, the pin before. Later in session 24:
    # each record gains ruled_out (true for the 753 a rule skips, false for the rest: no machine-skipped
    # combination's token counts are all over a cap here); without it the records hash to b1cc7831…,
    # the pin before)
    assert digest == "46bf33b96c203002148cedc96a6423687f34869c"


def test_a_model_named_on_a_gpu_runs_without_the_default_sweeps_ep8_share():
    """sweeps/default.yaml's cuda section runs DeepSeek-V3's EP-8 share (backend.simulate_ep=8):
    `model=mixtral_8x7b` runs mixtral's whole layer and says why in one note; naming the share
    too keeps it; deepseek_v3 named or swept beside another model keeps its own share."""

    def single_rank(overrides, sweep="default"):
        combos, data = plan.plan(["runner.device=cuda", *overrides], sweep, this_machine=False)
        shares = {(c.combo.model, c.combo.simulate_ep) for c in combos if c.combo.backend in ("local", "local_batched")}
        return shares, data.get("notes", [])

    assert single_rank([]) == ({("deepseek_v3", 8)}, [])
    assert single_rank(["model=mixtral_8x7b"]) == (
        {("mixtral_8x7b", 1)},
        [
            "the default sweep sets backend.simulate_ep=8 for its model (deepseek_v3); "
            "model=mixtral_8x7b runs without it (pass backend.simulate_ep=8 to keep it)"
        ],
    )
    assert single_rank(["model=deepseek_v3"]) == ({("deepseek_v3", 8)}, [])  # its own model: kept
    shares, notes = single_rank(["model=deepseek_v3,mixtral_8x7b,qwen3_30b_a3b"])
    assert shares == {("deepseek_v3", 8), ("mixtral_8x7b", 1), ("qwen3_30b_a3b", 1)}
    assert notes == [
        "the default sweep sets backend.simulate_ep=8 for its model (deepseek_v3); "
        "model=mixtral_8x7b, model=qwen3_30b_a3b run without it (pass backend.simulate_ep=8 to keep it)"
    ]
    assert single_rank(["model=mixtral_8x7b", "backend.simulate_ep=2"]) == ({("mixtral_8x7b", 2)}, [])
    # a sweep file whose overrides (not a device section) set the share for its model: the same rule
    shares, notes = single_rank(["model=mixtral_8x7b"], "gluon_gemm_v3")
    assert shares == {("mixtral_8x7b", 1)} and len(notes) == 1 and "gluon_gemm_v3 sweep" in notes[0]
    combos, data = plan.plan(["model=mixtral_8x7b", "runner.device=cpu"], "default")
    assert "notes" not in data  # the cpu section sets no share
