"""offline/report.py: the end-of-run report's numbers."""

import math

import pytest

from lm_human_preference_details.offline import report as offline_report


def test_the_gold_gain_is_in_initial_stds_and_undefined_without_spread():
    assert offline_report.gain_in_stds(0.5, -0.25, 0.25) == pytest.approx(3.0)
    # every initial sample scored the same (a small report of a tiny model): NaN, not a ZeroDivisionError at a run's end
    assert math.isnan(offline_report.gain_in_stds(0.5, 0.5, 0.0))
