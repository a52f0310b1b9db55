"""`moebench env`: this machine, its libraries and which entries are usable here."""

from __future__ import annotations

from moebench.cli import options

EXIT_STATUS = options.exit_status(
    "0 the machine described (a plugin that fails to import or hangs is said, not fatal)",
    "2 an unknown option",
    options.FAILED,
    "130 interrupted",
)


def register(sub) -> None:
    """`env` under the top level's subparsers."""
    ev = options.command(sub, "env", "this machine, its libraries and which entries are usable here", EXIT_STATUS)
    ev.add_argument(
        "--json",
        action="store_true",
        help="instead: one JSON object, this machine's fingerprint as a run's env.json holds it (env), its "
        "env_id and the entries usable here (entries)",
    )


def env_args(args) -> int:
    from moebench.run.env import env_command

    return env_command(args.json)
