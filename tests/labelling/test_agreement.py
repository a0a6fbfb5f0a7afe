"""labelling/agreement.py: pairwise agreement, Fleiss' kappa and agreement with a reference, against figures worked out
by hand for a small set of labels; label files of ours and OpenAI's read into items matched by their tokens."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from lm_human_preference_details.labelling.agreement import (
    category_counts,
    collect,
    fleiss_kappa,
    overall_agreement,
    pair_agreement,
    read_label_file,
    reference_agreement,
)
from lm_human_preference_details.utils.errors import UserError

# 3 labellers, 5 items (item -> [(labeller, best)])
LABELS = {
    "i0": [("ann", 0), ("bob", 0), ("cat", 0)],  # n_0j = [3, 0, 0, 0]
    "i1": [("ann", 1), ("bob", 1), ("cat", 2)],  # n_1j = [0, 2, 1, 0]
    "i2": [("ann", 3), ("bob", 2), ("cat", 1)],  # n_2j = [0, 1, 1, 1]
    "i3": [("ann", 2), ("bob", 2)],  # n_3j = [0, 0, 2, 0]
    "i4": [("ann", 0)],  # one label: in no pair, not in kappa
}


def test_fleiss_kappa_by_hand():
    counts = category_counts(LABELS)
    assert counts == [[3, 0, 0, 0], [0, 2, 1, 0], [0, 1, 1, 1], [0, 0, 2, 0]]
    # P_i = sum_j n_ij (n_ij - 1) / (n_i (n_i - 1)):
    #   P_0 = 3*2 / (3*2) = 1;  P_1 = 2*1 / 6 = 1/3;  P_2 = 0 / 6 = 0;  P_3 = 2*1 / (2*1) = 1
    # P_bar = (1 + 1/3 + 0 + 1) / 4 = 7/12
    # p_j = sum_i n_ij / sum_i n_i, sum_i n_i = 3 + 3 + 3 + 2 = 11: p = [3/11, 3/11, 4/11, 1/11]
    # P_e = (9 + 9 + 16 + 1) / 121 = 35/121
    # kappa = (7/12 - 35/121) / (1 - 35/121) = (427/1452) / (86/121) = 427/1032
    k = fleiss_kappa(counts)
    assert k.p_items == pytest.approx([1, 1 / 3, 0, 1])
    assert k.p_bar == pytest.approx(7 / 12)
    assert k.p_j == pytest.approx([3 / 11, 3 / 11, 4 / 11, 1 / 11])
    assert k.p_e == pytest.approx(35 / 121)
    assert k.kappa == pytest.approx(float(Fraction(427, 1032)))  # 0.4138


def test_kappa_is_undefined_when_every_label_chose_one_sample():
    # P_e = 1^2 = 1 and P_bar = 1: kappa = 0/0, said as None, never a division error
    k = fleiss_kappa([[2, 0, 0, 0], [3, 0, 0, 0]])
    assert (k.p_bar, k.p_e, k.kappa) == (1, 1, None)


def test_kappa_is_1_for_full_agreement_and_below_0_for_less_than_chance():
    assert fleiss_kappa([[2, 0, 0, 0], [0, 2, 0, 0]]).kappa == pytest.approx(1)
    # P_bar = 0, p = [1/2, 1/2, 0, 0], P_e = 1/2: kappa = (0 - 1/2) / (1/2) = -1
    assert fleiss_kappa([[1, 1, 0, 0], [1, 1, 0, 0]]).kappa == pytest.approx(-1)


def test_pairwise_overall_and_reference_shares_by_hand():
    # ann & bob: items 0-3, the same best on 0, 1, 3; ann & cat and bob & cat: items 0-2, the same best on 0 only
    assert pair_agreement(LABELS) == {("ann", "bob"): (4, 3), ("ann", "cat"): (3, 1), ("bob", "cat"): (3, 1)}
    # pairs of labels on one item: 3 + 3 + 3 + 1 = 10; agreeing: 3 (item 0) + 1 (item 1: ann, bob) + 0 + 1 = 5
    assert overall_agreement(LABELS) == (10, 5)
    # against bob: ann on items 0-3 (3 agree), cat on 0-2 (1 agrees); a reference is never compared with itself
    assert reference_agreement(LABELS, "bob") == {"ann": (4, 3), "cat": (3, 1)}


def record(i: int, best: int, **extra) -> dict:
    return {"query": [i, 50259], **{f"sample{j}": [10 * i + j] for j in range(4)}, "best": best, **extra}


def test_files_of_ours_and_openais_are_matched_by_tokens(tmp_path):
    ours = [record(0, 1, labeller="ann", labels=[{"labeller": "ann", "best": 1}, {"labeller": "bob", "best": 2}]),
            record(1, 3, labeller="bob")]  # a record with its labeller only
    (tmp_path / "ours.json").write_text(json.dumps(ours))
    (tmp_path / "gold.json").write_text(json.dumps([record(1, 3), record(0, 2), record(7, 0)]))  # OpenAI's: no names
    files = [(tmp_path / name, read_label_file(tmp_path / name)) for name in ("ours.json", "gold.json", "ours.json")]
    items = collect(files)  # a file read twice counts once per labeller
    assert sorted(items.values()) == [[("ann", 1), ("bob", 2), ("gold", 2)], [("bob", 3), ("gold", 3)], [("gold", 0)]]
    assert reference_agreement(items, "gold") == {"ann": (1, 0), "bob": (2, 2)}


@pytest.mark.parametrize("content, why", [
    ("{}", "is not a label file"),
    ("[1]", "record 0: not a best-of-4 label record (not a JSON object)"),
    (json.dumps([{"query": [1], "sample0": [1], "best": 0}]), "no token list 'sample1'"),
    (json.dumps([record(0, 4)]), "a best that is not an int in 0..3"),
    (json.dumps([record(0, 1, labels=[{"labeller": "", "best": 1}])]), "a labeller that is not a name"),
    ("[{", "is not JSON"),
])
def test_a_file_that_is_not_a_label_file_is_one_line_naming_it(tmp_path, content, why):
    (tmp_path / "x.json").write_text(content)
    with pytest.raises(UserError, match="x.json") as e:
        read_label_file(tmp_path / "x.json")
    assert why in str(e.value) and "\n" not in str(e.value)
