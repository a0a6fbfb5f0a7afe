"""evaluation/items.py: every pair of policies gives one item per query, its order drawn from the seed and recorded."""

from __future__ import annotations

from lm_human_preference_details.evaluation.items import ZERO_SHOT, blind_items, model_of
from lm_human_preference_details.label_format import OAI_PAD
from lm_human_preference_details.tasks import TaskHParams

TASK = TaskHParams(query_prefix="Q: ", query_suffix=" A:")


def make(tokenizer, seed: int) -> list[dict]:
    pad = tokenizer.pad_token_id
    queries = [tokenizer.encode(f" query {i}") + [pad] for i in range(20)]
    responses = {name: [tokenizer.encode(f" {name} says {i}") + [pad] for i in range(20)] for name in ("p", "q", "r")}
    return blind_items(["p", "q", "r"], queries, responses, tokenizer, TASK, seed)


def test_each_pair_and_query_once_its_responses_in_the_recorded_order(tokenizer):
    items = make(tokenizer, seed=1)
    assert len(items) == 3 * 20
    assert [sorted(it["policies"]) for it in items[::20]] == [["p", "q"], ["p", "r"], ["q", "r"]]
    for item in items:
        left, right = item["policies"]
        i = item["query_index"]
        assert item["sample_texts"] == [f" {left} says {i}", f" {right} says {i}"]  # the text of the policy recorded
        assert item["query_text"] == f"Q:  query {i} A:"
        assert item["samples"][0][-1] == OAI_PAD and item["query"][-1] == OAI_PAD  # OpenAI's pads, as label files
    firsts = [it["policies"][0] == min(it["policies"]) for it in items]
    assert 15 <= sum(firsts) <= 45  # drawn: either policy on the left (a fair coin: 30 of 60 expected)


def test_the_seed_fixes_the_order(tokenizer):
    assert make(tokenizer, 1) == make(tokenizer, 1)
    assert [it["policies"] for it in make(tokenizer, 1)] != [it["policies"] for it in make(tokenizer, 2)]


def test_zero_shot_is_the_base_model():
    assert model_of(ZERO_SHOT, "gpt2") == "gpt2" and model_of("runs/x/policy", "gpt2") == "runs/x/policy"
