"""The offline task's model and labels: a tiny GPT-2 pretrained on the corpus, and the best-of-4 labels the gold
scorer gives its samples, as the original's offline labels came from the initial policy's samples."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from lm_human_preference_details.label_format import OAI_PAD
from lm_human_preference_details.language.lm_head import response_logprobs
from lm_human_preference_details.language.tokenizer import N_VOCAB
from lm_human_preference_details.offline.corpus import (
    QUERY_LENGTH,
    RESPONSE_LENGTH,
    TRUNCATE_AFTER,
    TRUNCATE_TOKEN,
    corpus,
    gold_scores,
)
from lm_human_preference_details.ppo import truncate_responses
from lm_human_preference_details.queries import format_queries, make_query_sampler
from lm_human_preference_details.tasks import TaskHParams
from lm_human_preference_details.utils.progress import progress


def tiny_gpt2(seed: int = 0, n_layer: int = 2, n_embd: int = 64, n_head: int = 2, n_positions: int = 256):
    """A randomly initialised GPT-2-architecture LM with the real 50257-token vocabulary."""
    from transformers import (  # transformers takes seconds to import: a flag's error line never waits for it
        GPT2Config,
        GPT2LMHeadModel,
    )

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=N_VOCAB, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head)
    return GPT2LMHeadModel(config)


def corpus_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """The passages run on as one token stream, [n_tokens] (no EOS between them): what `pretrain` reads."""
    return torch.tensor(tokenizer.encode(" ".join(texts)))


def corpus_vocab(tokenizer) -> torch.Tensor:
    """The tokens of the pretraining corpus (queries.txt's passages), sorted: [~150] ids."""
    return torch.unique(corpus_stream(tokenizer, corpus(500, seed=1)))


def pretrain(model, tokenizer, texts: list[str], steps: int = 1200, full_steps: int = 80, batch_size: int = 16,
             seq_len: int = 64, lr: float = 3e-3, seed: int = 0) -> None:
    """Brief next-token training of ``model`` on ``texts`` so that its samples read like the corpus.

    The first ``steps`` steps take the softmax over the corpus's own tokens only and train just their rows of
    the (tied) embedding, as a small matrix of their own (cheap: ~150 rows instead of 50257; Adam leaves rows
    without gradients untouched anyway); the last ``full_steps`` take it over all 50257 tokens, which pushes
    every other token down.
    """
    g = torch.Generator().manual_seed(seed)
    stream = corpus_stream(tokenizer, texts)  # [n_tokens]: passages run on, no EOS
    vocab, local = torch.unique(stream, return_inverse=True)  # the corpus's tokens; stream as indices into them
    wte = model.get_input_embeddings().weight  # tied with the LM head
    body = [p for p in model.parameters() if p is not wte]
    rows = torch.nn.Parameter(wte.detach()[vocab].clone())  # [len(vocab), d]: the corpus tokens' embeddings

    def batch(rows_: int, source: torch.Tensor) -> torch.Tensor:
        starts = torch.randint(0, len(stream) - seq_len - 1, (rows_,), generator=g)
        return torch.stack([source[s : s + seq_len + 1] for s in starts])  # [rows_, seq_len + 1]

    def cosine(optimizer, step: int) -> None:  # one cosine decay to 0 over both phases
        for group in optimizer.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / (steps + full_steps)))

    model.train()
    bar = progress(total=steps + full_steps, desc="pretraining the tiny GPT-2", unit="step")
    optimizer = torch.optim.Adam([rows, *body], lr=lr)
    for step in range(steps):  # phase 1: softmax over the corpus vocabulary
        x = batch(batch_size, local)  # [b, seq_len + 1] indices into vocab
        # F.embedding, not rows[x]: indexing's backward (index_put with accumulate) sums in a thread-dependent order
        # on a CPU, which made two builds of the assets differ
        h = model.base_model(inputs_embeds=F.embedding(x[:, :-1], rows)).last_hidden_state  # [b, seq_len, d]
        loss = torch.nn.functional.cross_entropy((h @ rows.t()).flatten(0, 1), x[:, 1:].flatten())
        cosine(optimizer, step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        bar.update()
    with torch.no_grad():
        wte[vocab] = rows
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps, steps + full_steps):  # phase 2: softmax over the full vocabulary
        x = batch(batch_size // 2, stream)  # the full softmax is the costly part
        h = model.base_model(input_ids=x[:, :-1]).last_hidden_state
        loss = -response_logprobs(h, wte, x[:, 1:], 1.0)[0].mean()
        cosine(optimizer, step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        bar.update()
    bar.close()
    model.eval()


@torch.no_grad()
def share_unused_rows(model, vocab: torch.Tensor) -> None:
    """Give every token outside ``vocab`` (the corpus's tokens) one shared embedding row: the mean of their rows.

    After pretraining those ~50,100 rows differ from each other only by their random start and all point away from
    the hidden states (the full-softmax steps pushed them down): one shared row keeps that, and keeps the shipped model
    small (docs/offline.md; the embedding is tied with the LM head, so the head is still all 50257 tokens wide).
    """
    wte = model.get_input_embeddings().weight  # [V, d]
    unused = torch.ones(len(wte), dtype=torch.bool)
    unused[vocab] = False
    wte[unused] = wte[unused].double().mean(0).float()


@torch.no_grad()
def make_labels(policy, tokenizer, queries_path: Path, n: int, seed: int, batch_size: int = 128) -> list[dict]:
    """Best-of-4 labels in OpenAI's schema from samples of ``policy``, the best picked by the gold scorer; ``batch_size``
    queries (4 samples each) at a time."""
    passages = TaskHParams(query_dataset=str(queries_path), query_length=QUERY_LENGTH, start_text=".", end_text=".")
    sampler = make_query_sampler(tokenizer, passages, batch_size=batch_size, seed=seed, num_ranks=1, shuffle_seed=seed)
    g = torch.Generator().manual_seed(seed)
    pad_id = tokenizer.pad_token_id
    records = []
    bar = progress(total=n, desc="best-of-4 labels", unit="label")
    while len(records) < n:
        queries = next(sampler)  # [batch_size, QUERY_LENGTH]
        contexts = format_queries(queries, [], []).repeat_interleave(4, dim=0)  # [4 * batch_size, QUERY_LENGTH]
        responses = policy.sample(contexts, RESPONSE_LENGTH, generator=g)["responses"]
        # as the original's labelers saw them: truncated after the first '.' at index >= 16, then padded
        samples = truncate_responses(responses, TRUNCATE_TOKEN, TRUNCATE_AFTER, pad_id).view(len(queries), 4, -1)
        gold = gold_scores(tokenizer, samples.reshape(-1, RESPONSE_LENGTH)).view(len(queries), 4)
        for q, s, gs in zip(queries.tolist(), samples.tolist(), gold.tolist()):
            best = max(range(4), key=lambda i: (gs[i], -i))  # ties (rare) go to the first
            to_oai = lambda tokens: [OAI_PAD if t == pad_id else t for t in tokens]  # noqa: E731
            records.append({"query": to_oai(q), **{f"sample{i}": to_oai(s[i]) for i in range(4)}, "best": best})
        bar.update(min(len(queries), n - bar.n))
    bar.close()
    return records[:n]
