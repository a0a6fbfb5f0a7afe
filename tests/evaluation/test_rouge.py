"""evaluation/rouge.py against ROUGE worked out by hand (rouge-score's rules: lower case, words of letters and digits,
Porter stems; F1 = 2PR / (P + R))."""

from __future__ import annotations

import pytest

from lm_human_preference_details.evaluation.rouge import lead_3, rouge_f1, rouge_table


def test_rouge_1_2_l_of_one_pair_as_worked_by_hand():
    # reference: the cat sat on the mat (6 words); prediction: the cat is on the mat (6 words)
    # unigrams in common, counts clipped: the x2, cat, on, mat = 5 -> P = R = 5/6
    # bigrams: the-cat, on-the, the-mat of 5 each -> 3/5
    # longest common subsequence: the cat on the mat = 5 -> 5/6
    scores = rouge_f1(["The cat is on the mat."], ["the cat sat on the mat"])
    assert scores == pytest.approx({"rouge1": 5 / 6, "rouge2": 3 / 5, "rougeL": 5 / 6})


def test_stems_and_unequal_lengths_and_the_mean_over_pairs():
    # "running dogs" vs "dogs ran quickly": stems run/dog vs dog/ran/quickli; one unigram (dog): P 1/2, R 1/3 -> F1 0.4;
    # no bigram; LCS 1 -> 0.4. Second pair identical: 1, 1, 1. Means: 0.7, 0.5, 0.7
    scores = rouge_f1(["running dogs", "a b c"], ["dogs ran quickly", "a b c"])
    assert scores == pytest.approx({"rouge1": 0.7, "rouge2": 0.5, "rougeL": 0.7})


def test_lead_3_is_the_first_three_sentences():
    assert lead_3("One. Two!  Three? Four. Five.") == "One. Two! Three?"
    assert lead_3('He said "Go." Then (twice.) he went. Again. More.') == 'He said "Go." Then (twice.) he went.'
    assert lead_3("Only one sentence") == "Only one sentence"


def test_the_table_has_each_policy_lead_3_and_the_reference():
    rows = rouge_table({"policy": ["the cat is on the mat"]}, ["the cat sat on the mat. It slept. It woke. It ate."],
                       ["the cat sat on the mat"])
    assert list(rows) == ["policy", "lead-3", "reference"]
    assert rows["reference"] == pytest.approx({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0})
    # lead-3: "the cat sat on the mat. It slept. It woke." (10 words) vs the 6-word reference: 6 in common,
    # P 6/10, R 1 -> F1 0.75; bigrams 5 of 9 -> P 5/9, R 1 -> F1 10/14; LCS 6 -> 0.75
    assert rows["lead-3"] == pytest.approx({"rouge1": 0.75, "rouge2": 10 / 14, "rougeL": 0.75})


def test_words_are_stemmed():
    # Porter stems: cats -> cat, so "the cats" and "the cat" share both words and their bigram
    assert rouge_f1(["the cats"], ["the cat"]) == pytest.approx({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0})

