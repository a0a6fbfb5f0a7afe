"""The offline task: gold scorer, corpus, labels in OpenAI's schema, and a CI-sized run end to end."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from helpers.processes import in_process

from lm_human_preference_details.labels import OAI_PAD, load_best_of_n_labels
from lm_human_preference_details.language.model import Policy, load_lm
from lm_human_preference_details.offline import assets as offline_assets
from lm_human_preference_details.offline import corpus as offline_corpus
from lm_human_preference_details.offline import pretrain as offline_pretrain
from lm_human_preference_details.offline import report as offline_report
from lm_human_preference_details.offline import task as offline


def test_gold_score_by_hand():
    # happy +0.9, cold -0.7, lovely +0.95; case and punctuation do not matter; other words 0
    assert offline_corpus.gold_score("The baker felt happy. The cold road!") == pytest.approx(0.9 - 0.7)
    assert offline_corpus.gold_score("Lovely, LOVELY garden") == pytest.approx(1.9)
    assert offline_corpus.gold_score("The old man walked.") == 0.0
    assert len(set(offline_corpus.LEXICON.values())) == len(offline_corpus.LEXICON)  # distinct weights: ties are rare


def test_the_gold_gain_is_in_initial_stds_and_undefined_without_spread():
    assert offline_report.gain_in_stds(0.5, -0.25, 0.25) == pytest.approx(3.0)
    # every initial sample scored the same (a small report of a tiny model): NaN, not a ZeroDivisionError at a run's end
    assert math.isnan(offline_report.gain_in_stds(0.5, 0.5, 0.0))


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


def test_pretraining_is_deterministic(tokenizer):
    # two builds of the assets must hold the same model: the same seeds give bit-identical weights
    from lm_human_preference_details.offline.pretrain import tiny_gpt2

    states = []
    for _ in range(2):
        model = tiny_gpt2(seed=0, n_layer=1, n_embd=64, n_head=2, n_positions=64)
        # both phases (corpus-vocabulary softmax, then full softmax), each as short as it can be
        offline_pretrain.pretrain(model, tokenizer, offline_corpus.corpus(40, seed=1), steps=3, full_steps=1, batch_size=16,
                                  seq_len=64)
        states.append(model.state_dict())
    start = tiny_gpt2(seed=0, n_layer=1, n_embd=64, n_head=2, n_positions=64).state_dict()
    assert not torch.equal(states[0]["transformer.h.0.mlp.c_fc.weight"], start["transformer.h.0.mlp.c_fc.weight"])
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key


def test_make_labels_in_oai_schema(tokenizer, tiny_model_dir, tmp_path):
    queries = tmp_path / "queries.txt"
    queries.write_text("\n\n".join(offline_corpus.corpus(20, seed=1)))
    torch.manual_seed(0)
    policy = Policy(load_lm(str(tiny_model_dir)), tokenizer.pad_token_id, offline_corpus.TEMPERATURE)
    # 4 queries at a time (the recipe's 128 would sample 512 responses for 6 labels): two batches, the second cut short
    records = offline_pretrain.make_labels(policy, tokenizer, queries, n=6, seed=3, batch_size=4)
    assert len(records) == 6
    assert set(records[0]) == {"query", "sample0", "sample1", "sample2", "sample3", "best"}
    path = tmp_path / "labels.json"
    path.write_text(json.dumps(records))
    labels = load_best_of_n_labels(path, n=4, query_length=offline_corpus.QUERY_LENGTH,
                                   response_length=offline_corpus.RESPONSE_LENGTH, pad_id=tokenizer.pad_token_id)
    assert all(OAI_PAD not in r["query"] or r["query"][-1] == OAI_PAD for r in records)  # right-padded, OAI pad
    gold = offline_corpus.gold_scores(tokenizer, labels["samples"].reshape(-1, offline_corpus.RESPONSE_LENGTH)).view(6, 4)
    assert torch.equal(labels["best"], gold.argmax(1))  # the best sample is the gold argmax


def test_share_unused_rows_gives_the_unused_tokens_their_mean_row():
    model = offline_pretrain.tiny_gpt2(seed=0, n_layer=1, n_embd=8, n_head=2, n_positions=16)
    wte = model.get_input_embeddings().weight.detach().clone()  # [V, 8]
    vocab = torch.tensor([3, 50, 13, 50256])
    offline_pretrain.share_unused_rows(model, vocab)
    after = model.get_input_embeddings().weight
    unused = [t for t in range(len(wte)) if t not in {3, 50, 13, 50256}]
    by_hand = wte[unused].double().sum(0) / len(unused)
    assert torch.allclose(after[unused], by_hand.float().expand(len(unused), 8), atol=1e-7, rtol=0)
    assert torch.equal(after[vocab], wte[vocab])  # the corpus's tokens keep their own rows
    assert model.lm_head.weight is after  # the head is tied: still all 50257 tokens wide


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
    cache, as a run's first call does there (seconds), so that the end-to-end run below finds them built."""
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


def test_the_report_evaluates_256_heldout_queries_unless_a_test_asks_fewer(monkeypatch):
    seen = []  # the count each preset's report hook hands the report
    monkeypatch.setattr(offline, "report", lambda *args: seen.append(args[-1]))
    run = SimpleNamespace(task=None, rewards=SimpleNamespace(target=6.0), output_dir="run")
    for hook in (None, "16"):  # unset in what users run; set by tests whose report numbers are only compared
        if hook is None:
            monkeypatch.delenv(offline_report.HELDOUT_QUERIES_HOOK, raising=False)
        else:
            monkeypatch.setenv(offline_report.HELDOUT_QUERIES_HOOK, hook)
        for preset in (offline.task(), offline.online_task()):
            preset.report(run, None, None, None, None, {})
    assert seen == [256, 256, 16, 16]


def test_offline_task_end_to_end(tmp_path, offline_cache):
    """CI-sized: the reward model beats chance on held-out gold labels and PPO raises the gold score, in the report on
    the preset's 256 held-out queries. Half the preset's labels (768 of 1536: the reward model's training on them, a
    third of the run, is the point, not its last few points of accuracy) and five PPO updates: a minute or more on a
    CPU. With them a run measured held-out accuracy 0.73 (bound 0.33), a gain of 0.33 initial stds (bound 0.2), KL
    6.97 (bound 12); with all 1536 labels 0.76, 0.46, 6.9. In this process (conftest.in_process, one thread: two spin
    at OpenMP's barriers whenever another process takes a core): the command line of `--task offline` runs for real
    in test_bench_offline's benchmark and test_online's runs, and a new interpreter here would only import torch."""
    env = {"LMHP_CACHE": offline_cache, "WANDB_MODE": "disabled"}
    result = in_process("train_policy.py", "--task", "offline", "--ppo.total-episodes", 320,
                        "--rewards.train-new-model.labels.num-train", 768, "--output-dir", tmp_path / "run",
                        env_extra=env, cwd=tmp_path)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reward_model/heldout_accuracy"] > 0.33  # chance is 0.25 over 512 held-out labels
    assert summary["trained/gold_mean"] > summary["initial/gold_mean"] + 0.2 * summary["initial/gold_std"]
    assert 0 < summary["trained/kl"] < 2 * summary["kl_target"]
    assert (tmp_path / "run" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all("ppo/objective/gold_score" in r for r in rows)
    assert "offline task summary" in result.stdout
    # the assets were built once (by this run or another test's), atomically, and are reused
    assert (offline_cache / offline_assets.VERSION / "labels.json").exists()
    assert not list(offline_cache.glob(".*tmp*"))
