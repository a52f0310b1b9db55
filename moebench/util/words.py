"""Wording every room shares: a count with its noun ('1 row', '3 rows') and a word that agrees
with a count ('1 row runs', '3 rows run'), so that no line writes 'row(s)' or picks the
form by hand. Imports nothing of moebench (util stands below every room)."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str = "") -> str:
    """'1 combination', '2 combinations': `n` and its noun, with an s unless `n` is 1 (`plural`
    where the noun takes another form: counted(n, 'entry', 'entries'))."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def agree(n: int, one: str, many: str) -> str:
    """The form of a word that agrees with the count `n`: `one` for 1, else `many`
    (f"{counted(n, 'row')} {agree(n, 'runs', 'run')}" gives '1 row runs', '2 rows run')."""
    return one if n == 1 else many
