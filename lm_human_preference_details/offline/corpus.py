"""The offline task's data: its corpus of templated passages, the gold scorer that labels it, and the preset's sizes.

Gold scorer: the sum, over the words of the (truncated) response, of a fixed sentiment lexicon's weights (positive
words +0.55..+1.0, negative words -0.55..-1.0, every other word 0). Each weight is distinct, so four samples rarely
tie, and most sentences of the corpus carry a lexicon word, so the score varies from sample to sample.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import torch

POSITIVE = {"wonderful": 1.0, "lovely": 0.95, "happy": 0.9, "cheerful": 0.85, "bright": 0.8, "sunny": 0.75,
            "warm": 0.7, "kind": 0.65, "gentle": 0.6, "calm": 0.55}


NEGATIVE = {"terrible": -1.0, "cruel": -0.95, "sad": -0.9, "gloomy": -0.85, "dark": -0.8, "angry": -0.75,
            "cold": -0.7, "bitter": -0.65, "lonely": -0.6, "grim": -0.55}


LEXICON = {**POSITIVE, **NEGATIVE}


NEUTRAL = ["old", "small", "long", "wooden", "narrow", "busy", "green", "quiet", "empty", "distant"]


SUBJECTS = ["The old fisherman", "A young teacher", "The baker", "My neighbour", "The little girl", "Her brother",
            "The farmer", "A quiet student", "The doctor", "His mother", "The sailor", "An old woman"]


VERBS = ["walked along", "looked at", "sat beside", "painted", "remembered", "cleaned", "visited", "watched",
         "talked about", "left"]


NOUNS = ["river", "garden", "house", "road", "harbour", "kitchen", "forest", "market", "station", "field"]


TIMES = ["in the morning", "after dinner", "at night", "before the rain", "every day", "last winter"]


# the offline preset's sizes
QUERY_LENGTH, RESPONSE_LENGTH = 32, 24


NUM_LABELS, NUM_TRAIN = 2048, 1536


TRUNCATE_TOKEN, TRUNCATE_AFTER, TEMPERATURE = 13, 16, 0.7


TINY_GPT2 = {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 128}  # the offline task's model


def corpus(n: int, seed: int) -> list[str]:
    """``n`` passages of 4-8 templated sentences; each passage has a mood that most of its lexicon words follow.

    Every sentence after the first opens with a connective that follows the previous sentence's gold score
    ("Happily," above 0, "Sadly," below, "Then," at 0), so a language model trained on the corpus has to carry
    each sentence's sentiment to its final period: the feature a reward model reads there (GPT-2 learnt such
    features from its web text; a 2-layer model pretrained for a minute needs a corpus that asks for them).
    """
    rng = random.Random(seed)
    positive, negative = list(POSITIVE), list(NEGATIVE)

    def mood_word(mood: int) -> str:
        polarity = mood if mood and rng.random() < 0.85 else rng.choice([1, -1])
        return rng.choice(positive if polarity > 0 else negative)

    def sentence(mood: int, previous: float | None) -> str:
        subject = rng.choice(SUBJECTS)
        if previous is not None:
            connective = "Happily," if previous > 0 else "Sadly," if previous < 0 else "Then,"
            subject = f"{connective} {subject[0].lower()}{subject[1:]}"
        adjective = mood_word(mood) if rng.random() < 0.6 else rng.choice(NEUTRAL)
        s = f"{subject} {rng.choice(VERBS)} the {adjective} {rng.choice(NOUNS)} {rng.choice(TIMES)}"
        if rng.random() < 0.5:
            s += f" and felt {mood_word(mood)}"
        return s + "."

    passages = []
    for _ in range(n):
        mood = rng.choice([1, -1, 0])  # positive, negative or mixed
        sentences, previous = [], None
        for _ in range(rng.randint(4, 8)):
            sentences.append(sentence(mood, previous))
            previous = gold_score(sentences[-1])
        passages.append(" ".join(sentences))
    return passages


def gold_score(text: str) -> float:
    """The labeler: sum of lexicon weights over the words of ``text`` (see the module docstring)."""
    return sum(LEXICON.get(w, 0.0) for w in re.findall(r"[a-z]+", text.lower()))


def gold_scores(tokenizer, responses: torch.Tensor) -> torch.Tensor:
    """[b, r] (truncated, padded) responses -> [b] gold scores."""
    texts = tokenizer.batch_decode([[t for t in row if t != tokenizer.pad_token_id] for row in responses.tolist()])
    return torch.tensor([gold_score(t) for t in texts])


def write_queries(out: Path) -> None:
    """queries.txt (500 passages) and queries_test.txt (100 held-out ones) into ``out``."""
    (out / "queries.txt").write_text("\n\n".join(corpus(500, seed=1)) + "\n")
    (out / "queries_test.txt").write_text("\n\n".join(corpus(100, seed=2)) + "\n")
