"""offline/assets.py: the shipped copy of the recipe's assets, and the cache entry a first run unpacks."""

import torch

from lm_human_preference_details.label_format import load_best_of_n_labels
from lm_human_preference_details.language.model import load_lm
from lm_human_preference_details.offline import assets as offline_assets
from lm_human_preference_details.offline import corpus as offline_corpus
from lm_human_preference_details.offline import pretrain as offline_pretrain


def test_ship_then_unship_gives_back_the_built_assets(tokenizer, tmp_path):
    built, shipped, out = tmp_path / "built", tmp_path / "shipped", tmp_path / "out"
    for d in (built, out):
        d.mkdir()
    model = offline_pretrain.tiny_gpt2(seed=5, **offline_corpus.TINY_GPT2)
    offline_pretrain.share_unused_rows(model, offline_pretrain.corpus_vocab(tokenizer))
    model.save_pretrained(built / "tiny-gpt2")
    tokenizer.save_pretrained(built / "tiny-gpt2")
    (built / "labels.json").write_text('[{"query": [1, 50259], "sample0": [2], "sample1": [3], "sample2": [4], '
                                       '"sample3": [5], "best": 2}]')
    offline_assets.ship(built, shipped)
    assert sum(f.stat().st_size for f in shipped.iterdir()) < 1_000_000  # 13 MB as a Hugging Face directory
    offline_assets.unship(shipped, out)
    assert (out / "labels.json").read_bytes() == (built / "labels.json").read_bytes()
    a, b = load_lm(str(built / "tiny-gpt2")).state_dict(), load_lm(str(out / "tiny-gpt2")).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_shipped_assets_are_best_of_4_labels_of_the_gold_scorer(tokenizer, offline_cache):
    """What a first run unpacks: the passages, the tiny GPT-2 with the shared row, and 2,048 labels whose best sample
    is, every time, the gold scorer's pick among the four (its schema as OpenAI's files). Unpacked into the session's
    cache, as a run's first call does there (seconds), so that the offline task's end-to-end run (test_task.py, one
    xdist group with this file) finds them built."""
    out = offline_assets.ensure_offline_assets(offline_cache / offline_assets.VERSION)
    # compared into a bool first: pytest's diff of two 100 kB texts took over 15 minutes to report a failure
    same_queries = (out / "queries.txt").read_text() == "\n\n".join(offline_corpus.corpus(500, seed=1)) + "\n"
    assert same_queries, "queries.txt is not offline_corpus.corpus(500, seed=1)"
    lm = load_lm(str(out / "tiny-gpt2"))
    assert lm.config.vocab_size == 50257 and lm.config.n_layer == 2
    wte, vocab = lm.get_input_embeddings().weight, offline_pretrain.corpus_vocab(tokenizer)
    unused = torch.ones(len(wte), dtype=torch.bool)
    unused[vocab] = False
    assert torch.equal(wte[unused], wte[unused][:1].expand(int(unused.sum()), -1))  # one shared row
    assert not torch.equal(wte[vocab], wte[unused][: len(vocab)])
    labels = load_best_of_n_labels(out / "labels.json", n=4, query_length=offline_corpus.QUERY_LENGTH,
                                   response_length=offline_corpus.RESPONSE_LENGTH, pad_id=tokenizer.pad_token_id)
    assert len(labels["best"]) == offline_corpus.NUM_LABELS
    gold = offline_corpus.gold_scores(tokenizer, labels["samples"].reshape(-1, offline_corpus.RESPONSE_LENGTH)).view(-1, 4)
    assert torch.equal(labels["best"], gold.argmax(1))
    assert (gold.max(1).values > gold.min(1).values).float().mean() > 0.9  # the four samples' scores differ
