"""What a reviewer reads of a comparison in seconds: signs, the verdict's first lines, the figure's rows."""

from __future__ import annotations

from moebench.report.effects import fmt_mib_delta
from moebench.report.fmt import fmt_change, fmt_pct


def test_a_change_that_rounds_to_zero_prints_no_minus_sign():
    """'−0.0 %' (a memory table's device change, a chart label, a workspace delta) read as a loss; a
    figure that rounds to zero prints '+0.0' (unsigned '0.0') wherever it stands."""
    assert fmt_pct(-0.04) == "+0.0" and fmt_pct(-0.04, signed=False) == "0.0"
    assert fmt_pct(-0.004, digits=2) == "+0.00" and fmt_pct(-0.06) == "\u22120.1"
    assert fmt_change(0.9996) == "+0.0 %"
    assert fmt_change(0.9996, 0.999, 1.0004) == "+0.0 % [\u22120.1, +0.0]"
    assert fmt_mib_delta(-0.02 * 2**20) == "+0.0 MiB" and fmt_mib_delta(-1.5 * 2**20) == "\u22121.5 MiB"


def test_an_interval_that_excludes_zero_never_prints_an_end_as_zero():
    """'−0.3 % [−0.4, −0.0]' beside '~ (significant)' reads as an interval touching zero: an end
    that would print as zero takes the decimals that tell it from zero (up to three)."""
    assert fmt_change(0.997, 0.996, 0.9996) == "\u22120.30 % [\u22120.40, \u22120.04]"
    assert fmt_change(1.0002, 1.00001, 1.0004) == "+0.020 % [+0.001, +0.040]"
    assert fmt_change(0.99, 0.98, 0.995) == "\u22121.0 % [\u22122.0, \u22120.5]"  # far from zero: one decimal
