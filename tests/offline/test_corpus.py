"""offline/corpus.py: the gold scorer by hand, and the corpus it scores (deterministic, dense, its connectives)."""

import pytest

from lm_human_preference_details.offline import corpus as offline_corpus


def test_gold_score_by_hand():
    # happy +0.9, cold -0.7, lovely +0.95; case and punctuation do not matter; other words 0
    assert offline_corpus.gold_score("The baker felt happy. The cold road!") == pytest.approx(0.9 - 0.7)
    assert offline_corpus.gold_score("Lovely, LOVELY garden") == pytest.approx(1.9)
    assert offline_corpus.gold_score("The old man walked.") == 0.0
    assert len(set(offline_corpus.LEXICON.values())) == len(offline_corpus.LEXICON)  # distinct weights: ties are rare


def test_corpus_is_deterministic_and_dense():
    a, b = offline_corpus.corpus(50, seed=1), offline_corpus.corpus(50, seed=1)
    assert a == b and a != offline_corpus.corpus(50, seed=2)
    sentences = [s for p in a for s in p.split(". ")]
    with_mood = sum(offline_corpus.gold_score(s) != 0 for s in sentences)
    assert with_mood / len(sentences) > 0.6  # most sentences carry a lexicon word: the gold score is dense


def test_corpus_connectives_follow_the_previous_sentence():
    # "Happily," after a sentence with gold > 0, "Sadly," after < 0, "Then," after 0; never on the first sentence
    seen = set()
    for passage in offline_corpus.corpus(30, seed=4):
        sentences = [s + "." for s in passage[:-1].split(". ")]
        assert sentences[0].split()[0] not in ("Happily,", "Sadly,", "Then,")
        for previous, sentence in zip(sentences, sentences[1:]):
            g = offline_corpus.gold_score(previous)
            expected = "Happily," if g > 0 else "Sadly," if g < 0 else "Then,"
            assert sentence.split()[0] == expected, (previous, sentence)
            seen.add(expected)
    assert seen == {"Happily,", "Sadly,", "Then,"}
