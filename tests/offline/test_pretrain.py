"""offline/pretrain.py: the tiny GPT-2's pretraining, its shared embedding row, its best-of-4 labels."""

import json

import torch

from lm_human_preference_details.label_format import OAI_PAD, load_best_of_n_labels
from lm_human_preference_details.language.model import Policy, load_lm
from lm_human_preference_details.offline import corpus as offline_corpus
from lm_human_preference_details.offline import pretrain as offline_pretrain


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
