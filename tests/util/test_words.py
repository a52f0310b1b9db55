"""The wording every room shares (moebench/util/words.py)."""

from __future__ import annotations

from moebench.util.words import agree, counted


def test_a_count_takes_its_noun_in_the_singular_only_for_one():
    assert [counted(n, "row") for n in (0, 1, 2)] == ["0 rows", "1 row", "2 rows"]
    assert counted(1, "skipped row") == "1 skipped row"
    assert [counted(n, "entry", "entries") for n in (1, 3)] == ["1 entry", "3 entries"]


def test_a_word_agrees_with_its_count_in_the_singular_only_for_one():
    assert [agree(n, "runs", "run") for n in (0, 1, 2)] == ["run", "runs", "run"]
    assert [f"{counted(n, 'row')} {agree(n, 'is', 'are')}" for n in (1, 3)] == ["1 row is", "3 rows are"]
