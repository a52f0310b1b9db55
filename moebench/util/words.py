"""Wording every room shares: a count with its noun ('1 row', '3 rows'), so that no line writes
'row(s)' by hand. Imports nothing of moebench (util stands below every room)."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str = "") -> str:
    """'1 combination', '2 combinations': `n` and its noun, with an s unless `n` is 1 (`plural`
    where the noun takes another form: counted(n, 'entry', 'entries'))."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
