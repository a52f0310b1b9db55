"""`moebench list`: what a sweep would run, and why the rest is skipped."""

from __future__ import annotations

import json
import sys

from moebench.cli import options

EXIT_STATUS = options.exit_status(
    "0 the plan listed (--json and --knobs too), skipped combinations included, even when every one is skipped "
    "(each says why)",
    "2 bad input (an unknown option, group option or key, a bad value, a sweep file that is not there, a world "
    "size this machine lacks)",
    options.FAILED,
    "130 interrupted",
)


def register(sub) -> None:
    """`list` under the top level's subparsers."""
    ls = options.command(sub, "list", "list the combinations a sweep would run, with validity", EXIT_STATUS)
    options.overrides(
        ls, "group=option, key=value or comma lists, as `moebench sweep` takes them; none: the default sweep's plan"
    )
    ls.add_argument(
        "--sweep",
        default="default",
        help="the sweep whose plan to list: in sweeps/ by name (default) or file name (default.yaml), or a path "
        "to a sweep file; default: %(default)s",
    )
    ls.add_argument("--json", action="store_true", help="one record per combination, each field of its spec a key")
    ls.add_argument("--knobs", action="store_true", help="instead: every knob the registered entries declare")
    ls.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="every skipped combination with its reason (default: the count per reason); a skipped combination or "
        "token count that breaks a rule of the plan marked [rule], and of a combination this machine skips, the "
        "token counts a rule skips",
    )
    ls.add_argument(
        "--oversubscribe",
        action="store_true",
        help="CPU ranks only: plan more ranks than cores, as `sweep --oversubscribe` runs them",
    )


def list_command(args) -> int:
    from moebench.config import plugins
    from moebench.run.plan import plan, reason_groups
    from moebench.util.words import counted

    if args.knobs:
        print("\n".join(plugins.knob_lines()))
        return 0
    combos, sweep_data = plan(args.overrides, args.sweep, oversubscribe=args.oversubscribe)
    for line in (*sweep_data.get("notes", ()), *plugins.problems()):
        print(f"moebench list: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps([plugins.combo_record(c) for c in combos], indent=2))
        return 0
    for line in _model_lines(combos, args.verbose):
        print(line)
    valid = [c for c in combos if not c.reason]
    for c in valid:
        print(f"valid   {c.label}{plugins.origin_tag(c)}{_skipped_tokens(c, args.verbose)}")
    skipped = [c for c in combos if c.reason]
    if skipped and args.verbose:
        for c in skipped:
            mark = "[rule] " if c.rule else ""
            print(f"skipped {c.label}{plugins.origin_tag(c)}  {mark}({c.reason}){_skipped_tokens(c, True)}")
    elif skipped:
        print(f"\nskipped, by reason ({counted(len(skipped), 'combination')}; --verbose lists each):")
        for n, line in reason_groups([c.reason for c in skipped if c.reason]):
            print(f"  {n:4d}  {line}")
    print(f"\n{len(valid)} valid, {len(skipped)} skipped of {counted(len(combos), 'combination')}")
    lines = plugins.summary()
    if lines:
        print("\nplugins:\n" + "\n".join(f"  {line}" for line in lines))
    return 0


def _skipped_tokens(c, verbose: bool) -> str:
    """'  (skipped tokens: 16: why; ...)' of a valid combination, '' where none is skipped; with
    --verbose, each token count that breaks a rule of the plan (no machine runs it) is marked
    '[rule]', the rest are what this machine lacks. Of a combination this machine skips whole
    (--verbose only), the token counts a rule skips wherever it ran: where they are all of its
    token counts, no machine runs any of it (list --json's ruled_out)."""
    reasons = c.token_rules if c.reason else c.token_reasons
    if not reasons:
        return ""
    said = [f"{t}{' [rule]' if verbose and c.token_skips[t].rule else ''}: {r}" for t, r in reasons.items()]
    return "  (skipped tokens: " + "; ".join(said) + ")"


def _model_lines(combos, verbose: bool) -> list[str]:
    """The layer sizes, as plain integers, of each model=hf:... config the plan reads (its name does
    not tell them) and, with --verbose, of every model."""
    from moebench.config import hf

    out, seen = [], set()
    for c in combos:
        option = next((o.partition("=")[2] for o in c.overrides if o.partition("=")[0] == "model"), "")
        option = option.replace("\\:", ":")  # a sweep's expansion escapes the colon
        if hf.is_hf(option):
            line = hf.sizes_line(hf.resolve(option))
        elif verbose:
            m = c.combo
            line = (
                f"{m.model}: hidden {m.hidden}, intermediate {m.intermediate}, experts {m.num_experts}, "
                f"topk {m.topk}, shared {m.num_shared_experts} x {m.shared_intermediate}"
            )
        else:
            continue
        if c.combo.tp_size > 1:  # the shard one rank holds (backend.simulate_tp, or backend=tp's ranks)
            line += f"; TP-{c.combo.tp_size} rank: intermediate {c.combo.intermediate_per_rank}" + (
                f", shared {c.combo.num_shared_experts} x {c.combo.shared_intermediate_per_rank}"
                if c.combo.num_shared_experts
                else ""
            )
        if line not in seen:
            seen.add(line)
            out.append(f"model   {line}")
    return out + ([""] if out else [])
