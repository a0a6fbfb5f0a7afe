"""The items of an evaluation: every policy samples the same held-out queries with the same seed (as sample.py
compares two), and each pair of policies gives one item per query, its two responses in an order drawn at random
from the seed and recorded, so that a labeller never knows which policy wrote which."""

from __future__ import annotations

import itertools
import random
from typing import Optional

import torch

from lm_human_preference_details.label_format import OAI_PAD
from lm_human_preference_details.language.tokenizer import decode, encode_plain, load_tokenizer
from lm_human_preference_details.language.trained_models import load_policy, resolve_policy
from lm_human_preference_details.ppo import truncate_responses
from lm_human_preference_details.queries import format_queries, make_query_sampler
from lm_human_preference_details.tasks import TaskHParams
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.progress import progress

ZERO_SHOT = "zero-shot"  # the task's base model as PPO starts from it


def model_of(policy: str, base_model: str) -> str:
    """What --policies' name samples: zero-shot is the base model, anything else is itself (a saved run's policy,
    oai:NAME, a Hugging Face model)."""
    return base_model if policy == ZERO_SHOT else policy


@torch.no_grad()
def responses_of(policies: list[str], base_model: str, task: TaskHParams, *, num_queries: int, seed: int, mode: str,
                 device: torch.device) -> tuple[list[list[int]], list[Optional[str]], dict[str, list[list[int]]], object]:
    """-> (the queries, their source texts, each policy's truncated responses to them, the tokenizer): the same held-out
    queries and the same seeded draws for every policy (FIDELITY C1 plain sampling, E2 truncate and score: as PPO scores
    a response). A source text is a `queries.batches.Article` where the source gives its reference summary."""
    tokenizer = load_tokenizer(resolve_policy(model_of(policies[0], base_model)))
    # OAI sample.py: held-out queries (mode='test'), processed and formatted as in training
    sampler = make_query_sampler(tokenizer, task, batch_size=num_queries, seed=seed, num_ranks=1, mode=mode,
                                 shuffle_seed=seed)
    queries = next(sampler).to(device)  # [num_queries, query_length]
    texts = sampler.last_texts()
    one_pass = sampler.queries_per_pass()
    if one_pass is not None and num_queries > one_pass:  # the stream repeats: a query would be judged twice
        raise UserError(f"--num-queries {num_queries} is more than the {one_pass} queries of {task.query_dataset} "
                        f"({mode}); pass --num-queries {one_pass} or less")
    prefix, suffix = encode_plain(tokenizer, [task.query_prefix, task.query_suffix])
    contexts = format_queries(queries, prefix, suffix)  # [num_queries, p + q + s]
    responses = {}
    for name in progress(policies, desc="sampling each policy", unit="policy"):
        policy, _ = load_policy(model_of(name, base_model), tokenizer, task.temperature, device)
        # the same seed for every policy: the same uniforms drive their draws (OAI sample.py: set_mpi_seed(seed))
        generator = torch.Generator(device=device).manual_seed(seed)
        drawn = policy.sample(contexts, task.response_length, generator=generator)["responses"]  # [n, response_length]
        responses[name] = truncate_responses(drawn, task.truncate_token, task.truncate_after,
                                             tokenizer.pad_token_id).tolist()
    return queries.tolist(), texts, responses, tokenizer


def blind_items(policies: list[str], queries: list[list[int]], responses: dict[str, list[list[int]]], tokenizer,
                task: TaskHParams, seed: int, texts: Optional[list[Optional[str]]] = None) -> list[dict]:
    """One item per pair of policies and query, as the labelling session holds them (tokens with OpenAI's pads, and
    texts), with "policies": [left, right], the order drawn from ``seed``, and the query's index; with ``texts`` (the
    queries' source texts), "article" and "reference" (its reference summary, or None) for the ROUGE table."""
    order = random.Random(seed)
    pad = tokenizer.pad_token_id
    to_oai = lambda tokens: [OAI_PAD if t == pad else t for t in tokens]  # noqa: E731  (FIDELITY A2 OAI pad remap)
    items = []
    for a, b in itertools.combinations(policies, 2):
        for i, query in enumerate(queries):
            left, right = (a, b) if order.random() < 0.5 else (b, a)
            samples = [responses[left][i], responses[right][i]]
            items.append({"query": to_oai(query), "samples": [to_oai(s) for s in samples],
                          "query_text": task.query_prefix + decode(tokenizer, query) + task.query_suffix,
                          "sample_texts": [decode(tokenizer, s) for s in samples],
                          "policies": [left, right], "query_index": i,
                          **({} if texts is None else {"article": texts[i], "reference": getattr(texts[i], "reference",
                                                                                                   None)})})
    return items
