"""evaluation/results.py against figures worked out by hand: majority, win rates and their intervals, single labels,
position bias and agreement."""

from __future__ import annotations

import pytest

from lm_human_preference_details.evaluation.results import figures, majority, pair_figures, wilson_interval

A, B = "A", "B"
# five items of the pair (A, B): [left, right] and (labeller, side chosen: 0 left, 1 right)
ITEMS = [
    {"policies": [A, B], "labels": [("x", 0), ("y", 0), ("z", 1)]},  # A by 2 to 1
    {"policies": [B, A], "labels": [("x", 0), ("y", 1), ("z", 1)]},  # A by 2 to 1 (A on the right)
    {"policies": [A, B], "labels": [("x", 1), ("y", 1), ("z", 1)]},  # B by 3 to 0
    {"policies": [B, A], "labels": [("x", 0), ("y", 1)]},  # z skipped: 1 to 1, a tie
    {"policies": [A, B], "labels": []},  # everyone skipped: counts nowhere
]


def test_majority_of_the_sides_chosen():
    assert majority([0, 0, 1]) == 0 and majority([1, 0, 1]) == 1 and majority([1]) == 1
    assert majority([0, 1]) is None and majority([]) is None


def test_wilson_interval_matches_published_values():
    # Wilson's score interval at 95%, as tabulated by Newcombe (Statistics in Medicine 1998, table II): 81 of 263,
    # 15 of 148, 0 of 20 and 1 of 29
    for (x, n), (low, high) in {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605), (0, 20): (0.0, 0.1611),
                                (1, 29): (0.0061, 0.1718)}.items():
        assert wilson_interval(x, n) == pytest.approx((low, high), abs=5e-5)


def test_win_rates_single_labels_position_bias_and_agreement_by_hand():
    f = pair_figures(A, B, ITEMS)
    assert f["items"] == 4 and f["unlabelled"] == 1
    assert f["wins"] == {A: 2, B: 1} and f["ties"] == 1 and f["labels"] == 11
    # a tie is half a win each: A (2 + 0.5) / 4, B (1 + 0.5) / 4; the interval is Wilson's over the 4 items
    assert f["win_rate"][A]["value"] == 0.625 and f["win_rate"][B]["value"] == 0.375
    assert (f["win_rate"][A]["low"], f["win_rate"][A]["high"]) == pytest.approx(wilson_interval(2.5, 4))
    # single labels for A: 2 + 2 + 0 + 1 of 11
    assert f["single_label_share"][A]["value"] == pytest.approx(5 / 11)
    # left chosen: 2 + 1 + 0 + 1 of 11 labels
    assert f["position_bias"]["left_share"]["value"] == pytest.approx(4 / 11)
    # pairs of labels on one item: 3 + 3 + 3 + 1 = 10, agreeing 1 + 1 + 3 + 0 = 5; x & y agree on items 1 and 3,
    # x & z on item 3, y & z on items 2 and 3
    agreement = f["agreement"]
    assert agreement["overall"] == {"pairs": 10, "agree": 5, "share": 0.5}
    # Fleiss over A/B: P_i = 1/3, 1/3, 1, 0 -> P_bar 5/12; p = 5/11, 6/11 -> P_e 61/121; kappa = -127/720
    assert agreement["kappa"] == pytest.approx(-127 / 720)
    assert {tuple(p["labellers"]): (p["items"], p["agree"]) for p in agreement["pairs"]} == {
        ("x", "y"): (4, 2), ("x", "z"): (3, 1), ("y", "z"): (3, 2)}


def test_wilson_interval_by_hand():
    # 2.5 of 4: p = 0.625, z^2 = 3.8415; centre = (p + z^2/8) / (1 + z^2/4), half = z / (1 + z^2/4) *
    # sqrt(p (1 - p) / 4 + z^2 / 64): 0.5638 -+ 0.3443
    assert wilson_interval(2.5, 4) == pytest.approx((0.2194, 0.9081), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_every_pair_of_three_policies_over_its_own_items():
    items = [{"policies": ["p", "q"], "labels": [("x", 0)]}, {"policies": ["r", "p"], "labels": [("x", 0)]},
             {"policies": ["q", "r"], "labels": [("x", 1)]}]
    pairs = figures(["p", "q", "r"], items)
    assert [f["policies"] for f in pairs] == [["p", "q"], ["p", "r"], ["q", "r"]]
    assert [f["win_rate"][f["policies"][0]]["value"] for f in pairs] == [1.0, 0.0, 0.0]
    assert pairs[0]["agreement"]["kappa"] is None  # no item with two labels
