"""The wording every room shares (moebench/util/words.py)."""

from __future__ import annotations

from moebench.util.words import agree, counted, duration, latency


def test_a_count_takes_its_noun_in_the_singular_only_for_one():
    assert [counted(n, "row") for n in (0, 1, 2)] == ["0 rows", "1 row", "2 rows"]
    assert counted(1, "skipped row") == "1 skipped row"
    assert [counted(n, "entry", "entries") for n in (1, 3)] == ["1 entry", "3 entries"]


def test_a_word_agrees_with_its_count_in_the_singular_only_for_one():
    assert [agree(n, "runs", "run") for n in (0, 1, 2)] == ["run", "runs", "run"]
    assert [f"{counted(n, 'row')} {agree(n, 'is', 'are')}" for n in (1, 3)] == ["1 row is", "3 rows are"]


def test_a_duration_reads_to_the_second_below_100_s_then_in_minutes_and_hours():
    """The one duration a sweep's progress lines and a tune's estimate both print (they each had their
    own: the tune's said '3 min' where the sweep's said '3 min 20 s')."""
    spans = (0.4, 8, 99.4, 100, 200, 3599, 3600, 7505)
    assert [duration(s) for s in spans] == [
        "0 s",
        "8 s",
        "99 s",
        "1 min 40 s",
        "3 min 20 s",
        "59 min 59 s",
        "1 h 00 min",
        "2 h 05 min",
    ]


def test_a_latency_reads_in_its_unit_to_three_significant_figures():
    """A CPU tune's table read 'heuristic µs 1395315.0' (host time under Triton's interpreter, seconds
    a call); a GPU's '45.7' in a µs column. Each now in the unit that reads best."""
    figures = (0.01234, 4.567, 45.67, 412.3, 999.4, 999.6, 1234.5, 1395315.0, 45e6, float("nan"))
    assert [latency(us) for us in figures] == [
        "0.01 µs",
        "4.57 µs",
        "45.7 µs",
        "412 µs",
        "999 µs",
        "1.00 ms",
        "1.23 ms",
        "1.40 s",
        "45.0 s",
        "–",
    ]
