"""The online collection's labellers (labellers.py): the gold pick, and a user's program as the command labeller,
answering, skipping, dying, hanging and lying."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lm_human_preference_details.labelling.labellers import CommandLabeller, GoldLabeller
from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
from lm_human_preference_details.utils.errors import UserError


@pytest.fixture(scope="module")
def tokenizer():
    return gpt2_tokenizer()


def requests(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Two requests: [2, 4] queries, [2, 4, 3] samples, padded with the tokenizer's pad."""
    pad = tokenizer.pad_token_id
    ids = lambda text: tokenizer.encode(text)  # noqa: E731
    queries = torch.tensor([ids(" The old house") + [pad] * (4 - len(ids(" The old house"))), ids(" A day by the sea")[:4]])
    words = [[" sad", " happy", " calm", " dark"], [" cold", " warm", " bitter", " lovely"]]
    samples = torch.tensor([[ids(w) + [pad] * (3 - len(ids(w))) for w in four] for four in words])
    return queries, samples


def test_the_gold_labeller_picks_the_highest_gold_score_ties_to_the_first(tokenizer):
    queries, samples = requests(tokenizer)
    scores = {" sad": -0.9, " happy": 0.9, " calm": 0.9, " dark": -0.8, " cold": -0.7, " warm": 0.7, " bitter": -0.6,
              " lovely": 0.95}

    def gold(tok, responses):  # [8, 3] -> [8]
        texts = tok.batch_decode([[t for t in row if t != tok.pad_token_id] for row in responses.tolist()])
        return torch.tensor([scores[t] for t in texts])

    assert GoldLabeller(tokenizer, gold).label(queries, samples) == [1, 3]  # " happy" before the tied " calm"


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "labeller.py"
    path.write_text("import json, sys, time\n" + body)
    return f"{sys.executable} {path}"


def test_a_program_answers_an_index_or_skip_for_each_request(tmp_path, tokenizer):
    log = tmp_path / "requests.jsonl"
    command = script(tmp_path, f"""
for line in sys.stdin:
    request = json.loads(line)
    open({str(log)!r}, "a").write(line)
    # the longest response wins; the second request is skipped
    best = max(range(4), key=lambda i: len(request["responses"][i]))
    print("skip" if request["id"] == 1 else best, flush=True)
""")
    labeller = CommandLabeller(command, tokenizer, timeout=60)
    queries, samples = requests(tokenizer)
    assert labeller.label(queries, samples) == [1, None]  # " happy" is the longest of the first four
    import json

    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["id"] for r in sent] == [0, 1]
    assert sent[0]["query"] == " The old house" and sent[0]["responses"] == [" sad", " happy", " calm", " dark"]
    assert sent[1]["response_tokens"][3] == tokenizer.encode(" lovely")  # the ids without pads
    labeller.close()
    assert labeller.process.poll() is not None  # the program it started has ended


@pytest.mark.parametrize("body, message", [
    ("sys.stdin.readline()\nsys.exit(3)\n", "the program exited \\(status 3\\) without an answer"),
    ("sys.stdin.readline()\ntime.sleep(600)\n", "no answer within 1 s \\(--online.timeout\\)"),
    ("for line in sys.stdin:\n    print(7, flush=True)\n", "answered '7'; an answer is the best index 0-3 or skip"),
    ("for line in sys.stdin:\n    print('the second', flush=True)\n", "answered 'the second'"),
])
def test_a_program_that_dies_hangs_or_lies_is_one_line(tmp_path, tokenizer, body, message):
    labeller = CommandLabeller(script(tmp_path, body), tokenizer, timeout=1)
    with pytest.raises(UserError, match=message) as error:
        labeller.label(*requests(tokenizer))
    assert "\n" not in str(error.value) and "request 0" in str(error.value)
    labeller.close()
    assert labeller.process.poll() is not None


def test_a_program_that_cannot_start_is_one_line(tmp_path, tokenizer):
    with pytest.raises(UserError, match="cannot start"):
        CommandLabeller(str(tmp_path / "no-such-program"), tokenizer, timeout=1)
