"""queries/samplers.py: QuerySampler, HFQuerySampler, make_query_sampler's rank blocks, resuming, the first query."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import torch
from helpers.queries import baseline_rank_texts, make_sampler

from lm_human_preference_details.label_format import OAI_PAD
from lm_human_preference_details.queries import QuerySampler, make_query_sampler, query_source, samplers
from lm_human_preference_details.queries.streams import seeded_shuffle
from lm_human_preference_details.tasks import TaskHParams
from lm_human_preference_details.utils.errors import UserError

PASSAGES = [
    "Intro. The cat sat. The dog ran far away from home today",  # -> " The cat sat."
    "No period here at all",  # no start token: skipped
    "Start. but no end within the first eight tokens of this passage. End.",  # no end in 8 tokens: skipped
    "A. B.",  # -> " B."
]


def _sampler(tokenizer, dataset, **kw):
    args = dict(source=query_source(str(dataset)), query_length=8, start_text=".", end_text=".", batch_size=3)
    return QuerySampler(tokenizer, **{**args, **kw})


def _texts(tokenizer, batch):
    return [tokenizer.decode([t for t in row if t != tokenizer.pad_token_id]) for row in batch.tolist()]


def test_query_sampler_processes_repeats_and_pads(tokenizer, tmp_path):
    path = tmp_path / "q.txt"
    path.write_text("\n\n".join(PASSAGES))
    sampler = _sampler(tokenizer, path)
    first, second = next(sampler), next(sampler)
    assert first.shape == (3, 8) and first.dtype == torch.long
    expected = {PASSAGES[0]: " The cat sat.", PASSAGES[3]: " B."}
    cycle = [expected[p] for p in seeded_shuffle(PASSAGES, 0) if p in expected]  # the dataset repeats in order
    assert _texts(tokenizer, torch.cat([first, second])) == (cycle * 3)[:6]
    row = first[_texts(tokenizer, first).index(" B.")].tolist()
    assert row == tokenizer.encode(" B.") + [50257] * 6  # right-padded with [PAD]


def test_query_sampler_shards_the_repeated_stream(tokenizer, tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(f"Hi. Passage {i} here. Tail") + "\n" for i in range(5)))
    whole = next(_sampler(tokenizer, path, batch_size=12))  # 5 texts: ranks cross epoch boundaries
    for rank in range(2):
        local = next(_sampler(tokenizer, path, batch_size=12, num_ranks=2, ranks=[rank]))
        assert torch.equal(local, whole[rank::2])


def test_query_sampler_errors(tokenizer, tmp_path):
    path = tmp_path / "q.txt"
    path.write_text("no start token\n\nnone here either")
    with pytest.raises(UserError, match="gave no usable query"):
        next(_sampler(tokenizer, path))
    with pytest.raises(UserError, match="unknown query dataset 'bookz'"):
        _sampler(tokenizer, "bookz")
    with pytest.raises(UserError, match="needs a label file"):
        _sampler(tokenizer, "oai-label-queries")
    with pytest.raises(UserError, match="--task.start-text 'two words' encodes to 2 tokens"):
        _sampler(tokenizer, path, start_text="two words")


def test_query_sampler_oai_label_queries(tokenizer, tmp_path):
    labels = tmp_path / "labels.json"
    records = [{"query": [i, 13, OAI_PAD, OAI_PAD], "sample0": [1], "best": 0} for i in range(3)]
    labels.write_text(json.dumps(records))
    sampler = _sampler(tokenizer, "oai-label-queries", query_length=4, labels_source=str(labels))
    batch = next(sampler)  # yielded as they are, only the pad mapped (FIDELITY A2)
    assert batch.tolist() == [[i, 13, 50257, 50257] for i in seeded_shuffle(range(3), 0)]
    with pytest.raises(UserError, match="record 0: query has 4 tokens but --task.query-length is 5"):
        next(_sampler(tokenizer, "oai-label-queries", query_length=5, labels_source=str(labels)))


def test_query_sampler_special_token_strings_are_plain_text(tokenizer, tmp_path):
    path = tmp_path / "q.jsonl"
    texts = ["He wrote <|endoftext|> on the wall.", "A [PAD] is not padding."]
    path.write_text("".join(json.dumps(t) + "\n" for t in texts))
    batch = next(_sampler(tokenizer, path, query_length=16, start_text=None, end_text=None, batch_size=2))
    pad = tokenizer.pad_token_id
    rows = {tokenizer.decode([t for t in row if t != pad]): row for row in batch.tolist()}
    assert set(rows) == set(texts)  # both texts come back whole: nothing was read as a special token
    for text, row in rows.items():
        real = [t for t in row if t != pad]
        assert max(real) < 50256 and row == real + [pad] * (16 - len(real))
    # by hand: '<|endoftext|>' is the BPE pieces '<', '|', 'end', 'of', 'text', '|', '>', never id 50256
    assert rows[texts[0]][2:9] == [1279, 91, 437, 1659, 5239, 91, 29]


def _rank_stream(texts, rank, num_ranks, count):
    """Rank ``rank``'s first ``count`` texts in the original: one seed-0 shuffle, repeat(), shard(num_ranks, rank)."""
    shuffled = seeded_shuffle(texts, 0)  # books.py: random.seed(0); random.shuffle(datas)
    repeated = [shuffled[i % len(shuffled)] for i in range(num_ranks * count)]
    return repeated[rank::num_ranks][:count]


def test_make_query_sampler_2019_source_rank_blocks(tokenizer, tmp_path):
    texts = [f"Passage number {i} here" for i in range(7)]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in texts))
    task = TaskHParams(query_dataset=str(path), query_length=6, start_text=None, end_text=None)
    num_ranks, batch_size, batches = 4, 8, 3  # 2 queries per rank per batch; 24 items: the 7 texts repeat
    sampler = make_query_sampler(tokenizer, task, batch_size=batch_size, seed=123, num_ranks=num_ranks)
    got = [_texts(tokenizer, next(sampler)) for _ in range(batches)]
    assert all(len(b) == batch_size for b in got)
    for rank in range(num_ranks):
        blocks = [b[2 * rank : 2 * rank + 2] for b in got]  # block r = rank r's next 2 queries
        expected = _rank_stream(texts, rank, num_ranks, 2 * batches)
        assert [t for block in blocks for t in block] == expected, rank
    # a subset of the ranks (another process's share) gives exactly those blocks, in the order asked
    part = make_query_sampler(tokenizer, task, batch_size=batch_size, seed=123, num_ranks=num_ranks, ranks=[3, 1])
    for b in got:
        assert _texts(tokenizer, next(part)) == b[6:8] + b[2:4]


def test_make_query_sampler_hf_source_rank_blocks(tokenizer, tmp_path, monkeypatch):
    """The baseline's source through the one constructor: rank r's block is rank r's stream of HFQuerySampler."""
    import datasets

    from lm_human_preference_details.utils import files

    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache")
    path = tmp_path / "books.parquet"
    datasets.Dataset.from_dict({"text": [f"sentence {i} ." for i in range(19)]}).to_parquet(str(path))
    task = TaskHParams(query_dataset=str(path), query_length=5).resolved()  # a parquet file: no start/end text
    assert (task.start_text, task.end_text) == (None, None)
    whole = make_query_sampler(tokenizer, task, batch_size=8, seed=4, num_ranks=4)
    part = make_query_sampler(tokenizer, task, batch_size=8, seed=4, num_ranks=4, ranks=[2])
    order = np.random.default_rng(4 + 2 * 100003).permutation(19)  # datasets' shuffle(seed + rank * 100003)
    for k in range(3):
        rows, part_rows = whole.next_rows(), part.next_rows()
        assert np.array_equal(part_rows, rows[4:6])  # rank 2's block of the full batch
        # shard(4, 2) of the repeated stream: items 2 + 4j, j = 2k, 2k + 1
        assert part_rows.tolist() == [order[(2 + 4 * j) % 19] for j in (2 * k, 2 * k + 1)]
    with pytest.raises(UserError, match="has only a train split"):
        make_query_sampler(tokenizer, task, batch_size=8, seed=4, num_ranks=4, mode="test")


def test_make_query_sampler_errors(tokenizer, tmp_path):
    path = tmp_path / "q.txt"
    path.write_text("Hi. There.")
    task = TaskHParams(query_dataset=str(path), query_length=4).resolved()
    with pytest.raises(UserError, match="does not split into 3 equal rank shares"):
        make_query_sampler(tokenizer, task, batch_size=8, seed=0, num_ranks=3)
    with pytest.raises(UserError, match=r"ranks \[4\] must be a non-empty list of ranks in 0..3"):
        make_query_sampler(tokenizer, task, batch_size=8, seed=0, num_ranks=4, ranks=[4])


def test_query_sampler_resumes_where_it_stood(tokenizer, tmp_path):
    # checkpoint.py: a resumed run fast-forwards a fresh sampler by the batches the saved one had drawn
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(f"Hi. Passage {i} here. Tail") + "\n" for i in range(5)))
    task = TaskHParams(query_dataset=str(path), query_length=8, start_text=".", end_text=".")
    sampler = lambda: make_query_sampler(tokenizer, task, batch_size=4, seed=0, num_ranks=2, ranks=[1])  # noqa: E731
    saved = sampler()
    drawn = [next(saved) for _ in range(4)]  # 8 of rank 1's queries: past the end of the 5-text dataset
    resumed = sampler()
    resumed.load_state_dict(saved.state_dict())
    assert saved.state_dict() == {"batches_drawn": 4} and resumed.batches_drawn == 4
    assert torch.equal(next(resumed), next(saved)) and torch.equal(next(resumed), next(saved))
    fresh = sampler()
    fresh.skip(2)
    assert torch.equal(next(fresh), drawn[2])
    with pytest.raises(ValueError, match="cannot rewind"):
        saved.load_state_dict({"batches_drawn": 1})


@pytest.fixture()
def tldr_parquet(tmp_path):
    """23 posts in webis/tldr-17's schema; the baseline reads `body`."""
    n = 23
    columns = ["author", "body", "normalizedBody", "subreddit", "subreddit_id", "id", "content", "summary"]
    rows = {c: [f"{c} of post {i}" for i in range(n)] for c in columns}
    rows["body"] = [f"post {i}: my landlord kept the deposit.\n\ntl;dr: no deposit {i}" for i in range(n)]
    path = tmp_path / "tldr.parquet"
    datasets.Dataset.from_dict(rows).to_parquet(str(path))
    return path


def test_tldr_body_stream_tokens(tokenizer, tldr_parquet, tmp_path):
    world, batch_size, q, seed = 4, 8, 12, 5
    sampler = make_sampler(tokenizer, tldr_parquet, tmp_path, column="body", batch_size=batch_size, seed=seed,
                           world_size=world, query_length=q)
    batches = [next(sampler) for _ in range(9)]  # 18 per rank, 72 items: the 23 posts repeat
    per_rank = batch_size // world
    pad = tokenizer.pad_token_id
    for rank in range(world):
        texts = baseline_rank_texts(tldr_parquet, "body", seed=seed, rank=rank, world_size=world,
                                    count=9 * per_rank, cache_dir=tmp_path / "ds-cache")
        got = np.concatenate([b[rank * per_rank : (rank + 1) * per_rank].numpy() for b in batches])
        for text, row in zip(texts, got):
            ids = tokenizer.encode(text, add_special_tokens=False)[:q]  # these texts hold no special-token string
            assert row.tolist() == ids + [pad] * (q - len(ids))


def test_bad_inputs(tokenizer, bookcorpus_parquet, tmp_path):
    with pytest.raises(UserError, match="no column 'body'.*columns: text"):
        make_sampler(tokenizer, bookcorpus_parquet, tmp_path, column="body", batch_size=8, seed=0)
    with pytest.raises(UserError, match="neither bookcorpus nor tldr-17"):
        make_sampler(tokenizer, tmp_path / "missing.parquet", tmp_path, batch_size=8, seed=0)
    with pytest.raises(UserError, match="does not split into 8 equal rank shares"):
        make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=12, seed=0)
    with pytest.raises(UserError, match="no start/end text"):
        make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=8, seed=0, start_text=".")


def test_print_first_query_is_rank_0s_first_shuffled_text(tokenizer, bookcorpus_parquet, tmp_path, capsys):
    from lm_human_preference_details.queries import make_query_sampler
    from lm_human_preference_details.tasks import TaskHParams

    seed = 7
    dataset = datasets.Dataset.from_parquet(str(bookcorpus_parquet), cache_dir=str(tmp_path / "ds"))
    expected = dataset.shuffle(seed=seed)[0]["text"]  # rank 0's seed is the run's: seed + 0 * 100003
    task = TaskHParams(query_dataset=str(bookcorpus_parquet), query_length=8).resolved()
    sampler = make_query_sampler(tokenizer, task, batch_size=16, seed=seed, num_ranks=8)
    next(sampler)  # what was drawn does not matter
    assert samplers.print_first_query(sampler) == expected
    assert capsys.readouterr().out == f"=========== {expected}\n"  # books.py: print("===========", data["text"])
    assert sampler.batches_drawn == 1  # printing draws nothing from the stream
    lines = []
    assert samplers.print_first_query(sampler, lambda *text: lines.append(" ".join(text))) == expected  # run.print
    assert lines == [f"=========== {expected}"]
    other = make_query_sampler(tokenizer, task, batch_size=16, seed=seed, num_ranks=8, ranks=[1, 2])
    assert samplers.print_first_query(other) is None and other.first_text() == expected  # rank 0 is another's
    books = TaskHParams(query_dataset=str(tmp_path / "q.txt"), query_length=8, start_text=None, end_text=None)
    (tmp_path / "q.txt").write_text("one passage.\n\nanother passage.\n")
    assert samplers.print_first_query(make_query_sampler(tokenizer, books, batch_size=2, seed=0, num_ranks=1)) is None
    assert capsys.readouterr().out == ""


def test_references_travel_with_their_queries_through_the_query_pipeline(tokenizer):
    from lm_human_preference_details.queries.batches import Article
    from lm_human_preference_details.queries.samplers import QuerySampler, TextSource

    # the second text has no '.', so the books rules (start and end text '.') skip it: the references must skip too
    texts = [Article("Intro. One two. Three.", "ref a"), Article("no period here", "ref b"),
             Article("Intro. Four five. Six.", "ref c"), Article("Intro. Seven. Eight.", None)]
    source = TextSource(items=lambda request: iter(texts), references=True).at("articles")
    sampler = QuerySampler(tokenizer, source=source, query_length=8, start_text=".", end_text=".", batch_size=3)
    queries = next(sampler)
    found = sampler.last_texts()
    assert [t.reference for t in found] == ["ref a", "ref c", None]
    assert [tokenizer.decode([t for t in q if t != tokenizer.pad_token_id]) for q in queries.tolist()] == [
        " One two. Three.", " Four five. Six.", " Seven. Eight."]
    assert next(sampler) is not None and [t.reference for t in sampler.last_texts()] == ["ref a", "ref c", None]
