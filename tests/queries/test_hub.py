"""The baseline's Hugging Face query streams: each emulated rank's stream against `datasets`' own shuffle and a naive
transcription of tf.data's repeat() + shard(), on small parquet files in the bookcorpus and webis/tldr-17 schemas and a
small zip in the format of webis/tldr-17's corpus archive; the checks of the Hub's parquet export before any download
(a fake Hub API and a fake Hugging Face cache); local parquet folders; the first query line."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import zipfile
from types import SimpleNamespace

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.queries import write_tldr_zip

from lm_human_preference_details.queries import columns, registry, samplers, streams, tldr17
from lm_human_preference_details.queries.batches import encode_queries
from lm_human_preference_details.queries.samplers import HFQuerySampler
from lm_human_preference_details.queries.streams import shuffled_order
from lm_human_preference_details.utils.errors import UserError

BOOK_SENTENCES = [f"sentence number {i} , said the {['cat', 'dog', 'owl'][i % 3]} ." for i in range(37)]


@pytest.fixture()
def bookcorpus_parquet(tmp_path):
    """37 lower-cased, space-tokenised sentences in bookcorpus' schema (one string column `text`)."""
    path = tmp_path / "bookcorpus" / "train.parquet"
    path.parent.mkdir()
    datasets.Dataset.from_dict({"text": BOOK_SENTENCES}).to_parquet(str(path))
    return path


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


def baseline_rank_texts(path, column: str, *, seed: int, rank: int, world_size: int, count: int, cache_dir) -> list:
    """Rank ``rank``'s first ``count`` texts the fork's pipeline yields, built with `datasets` itself; ``path`` is a
    parquet file or a `datasets.Dataset`."""
    dataset = path if isinstance(path, datasets.Dataset) else datasets.Dataset.from_parquet(
        str(path), cache_dir=str(cache_dir))  # load_dataset(..., split=mode)
    shuffled = list(dataset.shuffle(seed=seed + rank * 100003)[column])  # books_generator: dataset.shuffle(seed)

    def repeated():  # tf_dataset.repeat(): the generator runs again, with the same seed, after each epoch
        while True:
            yield from shuffled

    return list(itertools.islice(repeated(), rank, rank + world_size * count, world_size))  # .shard(world, rank)


def make_sampler(tokenizer, path, tmp_path, **kwargs):
    kwargs.setdefault("query_length", 8)
    return HFQuerySampler(tokenizer, source=registry.query_source(str(path)), cache_dir=tmp_path / "cache",
                          datasets_cache_dir=tmp_path / "ds-cache", **kwargs)


@pytest.mark.parametrize("num_rows", [1, 2, 37, 10_007])
def test_shuffled_order_is_datasets_shuffle(num_rows):
    table = datasets.Dataset.from_dict({"i": list(range(num_rows))})
    for seed in (0, 1, 3 + 7 * 100003):
        expected = list(table.shuffle(seed=seed)["i"])
        assert shuffled_order(num_rows, seed).tolist() == expected


@pytest.mark.parametrize("window", [7, 1 << 17])
def test_each_rank_block_is_that_ranks_baseline_stream(tokenizer, bookcorpus_parquet, tmp_path, window):
    world, batch_size, batches, seed = 8, 16, 30, 2  # 60 queries per rank: the 37 rows repeat about 13 times
    sampler = make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=batch_size, seed=seed,
                           world_size=world, window=window)
    got = [sampler.next_texts() for _ in range(batches)]
    per_rank = batch_size // world
    for rank in range(world):
        expected = baseline_rank_texts(bookcorpus_parquet, "text", seed=seed, rank=rank, world_size=world,
                                       count=batches * per_rank, cache_dir=tmp_path / "ds-cache")
        blocks = [texts[rank * per_rank : (rank + 1) * per_rank] for texts in got]
        assert list(itertools.chain(*blocks)) == expected, f"rank {rank}"
    # the ranks really differ: distinct seeds give distinct orders
    streams = {tuple(t for texts in got for t in texts[r * per_rank : (r + 1) * per_rank]) for r in range(world)}
    assert len(streams) == world


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


def test_batch_size_does_not_change_a_ranks_stream(tokenizer, bookcorpus_parquet, tmp_path):
    """train_reward's normalisation sampler (rollout batch) and train_policy's (PPO batch) share the rank seeds."""
    small = make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=16, seed=1, world_size=8)
    large = make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=32, seed=1, world_size=8)
    first_two = [small.next_rows().reshape(8, 2), small.next_rows().reshape(8, 2)]
    assert np.array_equal(large.next_rows().reshape(8, 4), np.concatenate(first_two, axis=1))


def test_special_token_strings_stay_plain_text(tokenizer):
    texts = ["he wrote <|endoftext|> on the wall .", "[PAD] is not padding", "short"]
    queries = encode_queries(tokenizer, texts, query_length=24)  # [3, 24]
    pad = tokenizer.pad_token_id
    assert queries.shape == (3, 24)
    for text, row in zip(texts, queries.tolist()):
        real = [t for t in row if t != pad]
        assert row == real + [pad] * (24 - len(real))  # right-padded only
        assert max(real) < 50256  # neither <|endoftext|> (50256) nor [PAD] became a special token
        assert tokenizer.decode(real) == text
    assert queries[2].tolist()[:1] == tokenizer.encode("short") and queries[2].tolist()[1:] == [pad] * 23


def test_long_text_is_truncated_to_query_length(tokenizer):
    text = " ".join(f"word{i}" for i in range(40))
    (row,) = encode_queries(tokenizer, [text], query_length=10).tolist()
    assert row == tokenizer.encode(text)[:10]


def test_first_window_is_cached(tokenizer, bookcorpus_parquet, tmp_path, monkeypatch):
    first = make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=16, seed=3, world_size=8, window=20)
    rows = [first.next_rows() for _ in range(5)]
    assert len(list((tmp_path / "cache" / "hf_queries").glob("*.npy"))) == 8  # one file per rank

    def no_shuffle(*args):
        raise AssertionError("the cached window should have been used")

    monkeypatch.setattr(streams, "shuffled_order", no_shuffle)
    again = make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=16, seed=3, world_size=8, window=20)
    assert all(np.array_equal(r, again.next_rows()) for r in rows)  # 10 per rank, inside the cached 20


def test_bad_inputs(tokenizer, bookcorpus_parquet, tmp_path):
    with pytest.raises(UserError, match="no column 'body'.*columns: text"):
        make_sampler(tokenizer, bookcorpus_parquet, tmp_path, column="body", batch_size=8, seed=0)
    with pytest.raises(UserError, match="neither bookcorpus nor tldr-17"):
        make_sampler(tokenizer, tmp_path / "missing.parquet", tmp_path, batch_size=8, seed=0)
    with pytest.raises(UserError, match="does not split into 8 equal rank shares"):
        make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=12, seed=0)
    with pytest.raises(UserError, match="no start/end text"):
        make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=8, seed=0, start_text=".")


def test_download_failure_is_one_line(tmp_path):
    code = ("from lm_human_preference_details.utils.errors import run_main\n"
            "from lm_human_preference_details.queries.registry import parquet_files, query_source\n"
            f"run_main(lambda: parquet_files(query_source('bookcorpus'), hub_cache_dir={str(tmp_path / 'hub')!r}))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                            check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: cannot get the bookcorpus dataset (bookcorpus/bookcorpus, parquet export)")
    assert "HF_HUB_OFFLINE=1" in lines[0] and "local .parquet file or folder" in lines[0]
    assert not list((tmp_path / "hub").rglob("*.parquet"))


def test_empty_text_is_an_all_pad_query(tokenizer):
    """bookcorpus rows are stripped lines; an empty one becomes a query of pads only, as in the original."""
    queries = encode_queries(tokenizer, ["", "hi"], query_length=4)
    pad = tokenizer.pad_token_id
    assert queries.tolist() == [[pad] * 4, tokenizer.encode("hi") + [pad] * 3]


# ------------------------------------------------------------------------------ tldr-17: the corpus archive
TLDR_FIELDS = ["author", "body", "normalizedBody", "subreddit", "subreddit_id", "id", "content", "summary"]


def tldr_corpus_lines(null_body: bool = True) -> list[bytes]:
    """Lines in the format of corpus-webis-tldr-17.json, with the cases the loading script's rule decides; a null body
    (an error once sampled, as the fork's encoder failed on it) unless ``null_body`` is False."""
    def post(i, **fields):
        full = {"author": f"user{i}", "body": f"post {i} body.\n\ntl;dr: summary {i}", "normalizedBody": f"post {i}",
                "content": f"post {i} body.", "content_len": 3, "summary": f"summary {i}", "summary_len": 2,
                "id": f"c{i:05x}", "subreddit": "AskReddit", "subreddit_id": "t5_2qh1i"}
        full.update(fields)
        return {k: v for k, v in full.items() if v is not ...}  # `...`: the field is absent from the line

    posts = [post(i) for i in range(12)]
    posts += [post(20, summary=...), post(21, content=...), post(22, summary=..., content=...)]  # no row
    posts += [post(23, body=...), post(24, author=..., normalizedBody=...)]  # rows whose missing fields are ""
    posts += [post(25, summary=None), post(26, body=None if null_body else "", author=None)]  # a null: present, kept
    posts += [post(27, body="caf\u00e9 \u00fcber \u65e5\u672c \U0001F600 na\u00efve"), post(28, subreddit_id=7)]
    posts += [post(29, body="long " * 60_000 + "end"), post(30, title="a title the script never reads")]
    lines = [json.dumps(p).encode() for p in posts]
    non_ascii = next(i for i, p in enumerate(posts) if p["id"] == f"c{27:05x}")
    lines[non_ascii] = json.dumps(posts[non_ascii], ensure_ascii=False).encode("utf-8")  # raw UTF-8 beside \u escapes
    lines[3] += b"\r"  # a line that ends in CRLF
    return lines




@pytest.fixture()
def tldr_zip(tmp_path):
    """A small corpus-webis-tldr-17.zip: 20 posts that the loading script keeps and 3 it drops."""
    return write_tldr_zip(tmp_path / "corpus-webis-tldr-17.zip", tldr_corpus_lines())


def loading_script_dataset(archive, tmp_path) -> datasets.Dataset:
    """The dataset webis/tldr-17's loading script builds from ``archive``: a naive transcription of reddit.py's
    _generate_examples, run by `datasets` itself with the script's features (every field a string)."""
    extracted = tmp_path / "extracted"
    zipfile.ZipFile(archive).extractall(extracted)  # dl_manager.download_and_extract

    def generate_examples(path):
        with open(path, "rb") as f:
            for line in f:
                d = json.loads(line)
                if "summary" in d and "content" in d:
                    yield {k: d.get(k, "") for k in TLDR_FIELDS}

    features = datasets.Features({k: datasets.Value("string") for k in TLDR_FIELDS})
    return datasets.Dataset.from_generator(generate_examples, features=features, cache_dir=str(tmp_path / "gen"),
                                           gen_kwargs={"path": str(extracted / "corpus-webis-tldr-17.json")})


def test_tldr_archive_rows_are_the_loading_scripts(tldr_zip, tmp_path):
    expected = loading_script_dataset(tldr_zip, tmp_path)
    assert len(expected) == 20
    for field in TLDR_FIELDS:
        dest = tmp_path / "tables" / f"{field}.arrow"
        assert tldr17.build_archive_table(tldr_zip, dest, field) == 20
        assert columns.TextColumn.from_arrow(dest, field).table[field] == expected[field], field
    body = expected["body"]
    assert "" in body and None in body and any("\U0001F600" in b for b in body if b)
    assert max(map(len, filter(None, body))) > 300_000
    assert "7" in expected["subreddit_id"]  # a number becomes its string, as datasets stores it
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == sorted(f"{f}.arrow" for f in TLDR_FIELDS)


def test_tldr_archive_with_the_wrong_row_count_leaves_nothing(tldr_zip, tmp_path):
    dest = tmp_path / "tables" / "body.arrow"
    with pytest.raises(UserError, match=r"holds 20 rows, the baseline shuffled 3,848,330") as e:
        tldr17.build_archive_table(tldr_zip, dest, "body", expected_rows=3_848_330)
    assert "\n" not in str(e.value)
    assert not dest.exists() and not [p for p in dest.parent.iterdir() if not p.name.endswith(".lock")]


@pytest.mark.parametrize("lines, match", [([b'{"summary": "s", "content": "c"}', b"{not json"], "line 2 of .* is not JSON"),
                                          ([b'["summary", "content"]'], "line 1 of .* is not a JSON object")])
def test_tldr_archive_bad_lines_are_one_line(tmp_path, lines, match):
    archive = write_tldr_zip(tmp_path / "bad.zip", lines)
    with pytest.raises(UserError, match=match) as e:
        tldr17.build_archive_table(archive, tmp_path / "t" / "body.arrow", "body")
    assert "\n" not in str(e.value) and not (tmp_path / "t" / "body.arrow").exists()


def test_a_damaged_archive_is_one_line_and_leaves_no_table(tmp_path):
    archive = tmp_path / "damaged.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zf:  # stored: the bytes are the lines
        zf.writestr("corpus-webis-tldr-17.json", b"".join(json.dumps({"summary": "s", "content": "c", "body": f"b{i}"}
                                                                     ).encode() + b"\n" for i in range(100)))
    data = bytearray(archive.read_bytes())
    data[data.find(b'"b50"') + 2] = ord("X")  # a flipped byte inside the file: still JSON, but the CRC-32 fails
    archive.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"cannot read .*damaged.zip into .*body.arrow \(Bad CRC-32 .*\); a damaged "
                                        r"archive: delete it") as e:
        registry.open_query_data(registry.query_source(str(archive)), "body", cache_dir=tmp_path / "cache")
    assert "\n" not in str(e.value) and not list((tmp_path / "cache").rglob("*.arrow"))
    (tmp_path / "not.zip").write_text("not a zip")
    with pytest.raises(UserError, match=r"not.zip is not a readable .zip holding corpus-webis-tldr-17.json"):
        registry.open_query_data(registry.query_source(str(tmp_path / "not.zip")), "body", cache_dir=tmp_path / "cache")


def test_local_tldr_zip_gives_each_rank_the_baselines_stream(tokenizer, tldr_zip, tmp_path, capsys):
    world, batch_size, batches, seed = 4, 8, 12, 3  # 24 per rank, 96 items: the 20 rows repeat; one body is 300 KB
    sampler = make_sampler(tokenizer, tldr_zip, tmp_path, column="body", batch_size=batch_size, seed=seed,
                           world_size=world)
    note = "gives 20 rows, webis/tldr-17's loading script 3,848,330: this stream is not the baseline's"
    assert note in capsys.readouterr().out
    dataset = loading_script_dataset(tldr_zip, tmp_path)
    per_rank = batch_size // world
    got = [sampler.next_rows() for _ in range(batches)]
    for rank in range(world):
        expected = baseline_rank_texts(dataset, "body", seed=seed, rank=rank, world_size=world,
                                       count=batches * per_rank, cache_dir=None)
        rows = np.concatenate([b[rank * per_rank : (rank + 1) * per_rank] for b in got])
        assert sampler.data.table[[int(i) for i in rows]]["body"] == expected, f"rank {rank}"
    tables = list((tmp_path / "cache" / "hf_queries").glob("corpus-webis-tldr-17-*/body.arrow"))
    assert len(tables) == 1  # named by the JSON file's CRC-32 and size; the next run reads it, not the zip
    tldr_zip.unlink()
    write_tldr_zip(tldr_zip, tldr_corpus_lines())  # the same bytes again: the same table
    again = make_sampler(tokenizer, tldr_zip, tmp_path, column="body", batch_size=batch_size, seed=seed, world_size=world)
    assert list((tmp_path / "cache" / "hf_queries").glob("corpus-webis-tldr-17-*/body.arrow")) == tables
    assert np.array_equal(again.next_rows(), got[0])


def fake_hub_cache(root, repo_id: str, revision: str, files: dict) -> None:
    """A Hugging Face cache holding ``files`` (path in repo -> local path) of ``repo_id`` at ``revision``."""
    repo = root / f"datasets--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs" / revision).parent.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    for name, source in files.items():
        dest = repo / "snapshots" / commit / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(source.read_bytes())


def test_tldr_17_reads_the_hubs_archive_from_the_cache_once(tokenizer, tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 (conftest) with the archive in the Hugging Face cache: the table is built once, row count
    checked, and the next run needs neither the Hub nor the archive."""
    small = dataclasses.replace(tldr17.TLDR, num_rows=20)  # the test corpus's own count
    monkeypatch.setitem(registry.SOURCES, "tldr-17", dataclasses.replace(registry.SOURCES["tldr-17"], hub=small,
                                                                         num_rows=20))
    monkeypatch.setattr(tldr17, "TLDR", small)
    hub, tldr_zip = tmp_path / "hub", write_tldr_zip(tmp_path / "no-null.zip", tldr_corpus_lines(null_body=False))
    fake_hub_cache(hub, "webis/tldr-17", "main", {"data/corpus-webis-tldr-17.zip": tldr_zip})
    kwargs = dict(source=registry.query_source("tldr-17"), query_length=8, batch_size=8, seed=1, world_size=8,
                  cache_dir=tmp_path / "cache",
                  hub_cache_dir=hub, column="body")
    first = HFQuerySampler(tokenizer, **kwargs).next_texts()
    assert (tmp_path / "cache" / "hf_queries" / "tldr-17" / "body.arrow").is_file()
    dataset = loading_script_dataset(tldr_zip, tmp_path)
    assert first == [baseline_rank_texts(dataset, "body", seed=1, rank=r, world_size=8, count=1, cache_dir=None)[0]
                     for r in range(8)]
    import shutil

    shutil.rmtree(hub)
    assert HFQuerySampler(tokenizer, **kwargs).next_texts() == first


def test_tldr_17_cache_with_another_corpus_is_refused(tokenizer, tldr_zip, tmp_path):
    fake_hub_cache(tmp_path / "hub", "webis/tldr-17", "main", {"data/corpus-webis-tldr-17.zip": tldr_zip})
    with pytest.raises(UserError, match=r"holds 20 rows, the baseline shuffled 3,848,330.*`hf cache rm "
                                        r"dataset/webis/tldr-17`"):
        HFQuerySampler(tokenizer, source=registry.query_source("tldr-17"), query_length=8, batch_size=8, seed=1,
                       cache_dir=tmp_path / "cache",
                       hub_cache_dir=tmp_path / "hub")
    assert not list((tmp_path / "cache").rglob("*.arrow"))


def test_tldr_17_offline_without_the_archive_is_one_line_with_a_working_command(tmp_path):
    code = ("from lm_human_preference_details.utils.errors import run_main\n"
            "from lm_human_preference_details.queries.registry import open_query_data, query_source\n"
            f"run_main(lambda: open_query_data(query_source('tldr-17'), 'body', cache_dir={str(tmp_path / 'cache')!r}, "
            f"hub_cache_dir={str(tmp_path / 'hub')!r}))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: cannot get the tldr-17 corpus (webis/tldr-17, data/corpus-webis-tldr-17.zip)")
    assert "`hf download webis/tldr-17 data/corpus-webis-tldr-17.zip --repo-type dataset`" in line
    assert "HF_HUB_OFFLINE=1" in line and "--task.query-dataset PATH/corpus-webis-tldr-17.zip" in line
    assert not (tmp_path / "cache").exists()  # nothing written


# ------------------------------------------------------------------------------ the text column
def test_query_column_chooses_the_text_of_a_local_parquet(tokenizer, tmp_path):
    from lm_human_preference_details.queries import make_query_sampler
    from lm_human_preference_details.tasks import TaskHParams, get_task

    path = tmp_path / "posts.parquet"
    n = 11
    pq.write_table(pa.table({"text": [f"text {i}" for i in range(n)], "body": [f"body {i}" for i in range(n)],
                             "score": list(range(n))}), path)
    order = shuffled_order(n, 5)  # rank 0 of 1

    def first_texts(column):
        task = TaskHParams(query_dataset=str(path), query_column=column, query_length=4).resolved()
        sampler = make_query_sampler(tokenizer, task, batch_size=3, seed=5, num_ranks=1)
        return sampler.next_texts()

    assert first_texts("body") == [f"body {i}" for i in order[:3]]
    assert first_texts("text") == [f"text {i}" for i in order[:3]]
    with pytest.raises(UserError, match=r"no column 'title' \(columns: text, body, score\); pass its text column with "
                                        r"--task.query-column"):
        first_texts("title")
    with pytest.raises(UserError, match="column 'score' holds int64, not text"):
        first_texts("score")
    assert get_task("tldr").task.query_column == "body" and get_task("sentiment").task.query_column == "text"


def test_query_column_of_the_named_sources_is_checked_before_anything_loads(tmp_path, tiny_model_dir):
    from lm_human_preference_details.tasks import TaskHParams, check_task_inputs

    with pytest.raises(UserError, match=r"--task.query-column 'text' is not a field of tldr-17 \(its fields: author, body, "
                                        r".*\); the baseline read 'body': pass --task.query-column body"):
        check_task_inputs(TaskHParams(query_dataset="tldr-17"), str(tiny_model_dir))
    with pytest.raises(UserError, match="not a field of bookcorpus .*pass --task.query-column text"):
        check_task_inputs(TaskHParams(query_dataset="bookcorpus", query_column="body"), str(tiny_model_dir))
    check_task_inputs(TaskHParams(query_dataset="tldr-17", query_column="content", query_length=8), str(tiny_model_dir))
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["a"]}), folder / "train.parquet")
    check_task_inputs(TaskHParams(query_dataset=str(folder), query_length=8), str(tiny_model_dir))  # a folder is fine
    with pytest.raises(UserError, match="not a field of .*x.zip"):
        check_task_inputs(TaskHParams(query_dataset=str(write_tldr_zip(tmp_path / "x.zip", [])), query_length=8),
                          str(tiny_model_dir))


# ------------------------------------------------------------------------------ the Hub's parquet export, checked first
def write_parquet(path, rows: int, column: str = "text"):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({column: [f"{path.parent.name} {path.stem} row {i}" for i in range(rows)]}), path)
    return path


class FakeHub:
    """The Hub's API and file system for one parquet export: ``files`` maps a path in the export to a local file.
    Records every call, and what a download would fetch."""

    def __init__(self, files: dict, monkeypatch, *, missing: bool = False):
        import huggingface_hub
        from huggingface_hub import constants

        from lm_human_preference_details.utils import downloads

        self.files, self.missing, self.calls, self.downloads = files, missing, [], []
        hub = self

        class Api:
            def list_repo_tree(self, repo_id, path_in_repo=None, *, recursive=False, repo_type=None, revision=None):
                hub.calls.append(("list_repo_tree", repo_id, path_in_repo, recursive, repo_type, revision))
                if hub.missing:
                    from huggingface_hub.utils import EntryNotFoundError

                    raise EntryNotFoundError("404 Client Error: Entry Not Found for url: .../tree/refs%2Fconvert%2Fparquet")
                folders = {os.path.dirname(p) for p in hub.files}
                return [SimpleNamespace(path=p, tree_id="x") for p in sorted(folders)] + [
                    SimpleNamespace(path=p, size=f.stat().st_size) for p, f in hub.files.items()]

        class FileSystem:
            def open(self, path, mode="rb", revision=None):
                hub.calls.append(("open", path, revision))
                prefix = "datasets/bookcorpus/bookcorpus/"
                assert path.startswith(prefix) and mode == "rb"
                return open(hub.files[path[len(prefix):]], "rb")

        def snapshot_download(repo_id, *, repo_type=None, revision=None, allow_patterns=None, cache_dir=None,
                              local_files_only=False):
            hub.downloads.append(list(allow_patterns))
            root = cache_dir / "snapshot"
            for p in allow_patterns:
                (root / p).parent.mkdir(parents=True, exist_ok=True)
                (root / p).write_bytes(hub.files[p].read_bytes())
            return str(root)

        monkeypatch.setattr(huggingface_hub, "HfApi", Api)
        monkeypatch.setattr(huggingface_hub, "HfFileSystem", FileSystem)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(downloads, "hub_reachable", lambda: True)


def test_a_partial_export_is_refused_before_any_download(tmp_path, monkeypatch):
    files = {f"plain_text/partial-train/{i:04d}.parquet": write_parquet(tmp_path / "remote" / f"p{i}.parquet", 5)
             for i in range(3)}
    hub = FakeHub(files, monkeypatch)
    with pytest.raises(UserError, match=r"parquet export of bookcorpus/bookcorpus \(refs/convert/parquet\) holds only a "
                                        r"partial train split .* all 74,004,228 rows cannot be reproduced; pass "
                                        r"--task.query-dataset a local .parquet file or folder") as e:
        registry.parquet_files(registry.query_source("bookcorpus"), hub_cache_dir=tmp_path / "hub")
    assert "\n" not in str(e.value)
    assert hub.calls == [("list_repo_tree", "bookcorpus/bookcorpus", "plain_text", True, "dataset", "refs/convert/parquet")]
    assert hub.downloads == [] and not (tmp_path / "hub").exists()


def test_a_resized_export_is_refused_before_any_download(tmp_path, monkeypatch):
    files = {f"plain_text/train/{i:04d}.parquet": write_parquet(tmp_path / "remote" / f"t{i}.parquet", 4 + i)
             for i in range(3)}
    hub = FakeHub(files, monkeypatch)
    with pytest.raises(UserError, match=r"the Hub's parquet export of bookcorpus/bookcorpus holds 15 rows, the baseline "
                                        r"shuffled 74,004,228, so its stream would not be the baseline's; the export has "
                                        r"changed since the baseline ran"):
        registry.parquet_files(registry.query_source("bookcorpus"), hub_cache_dir=tmp_path / "hub")
    assert [c[1] for c in hub.calls if c[0] == "open"] == [f"datasets/bookcorpus/bookcorpus/{p}" for p in files]
    assert {c[2] for c in hub.calls if c[0] == "open"} == {"refs/convert/parquet"}  # footers read from the export
    assert hub.downloads == []


def test_a_missing_export_is_one_line(tmp_path, monkeypatch):
    hub = FakeHub({}, monkeypatch, missing=True)
    with pytest.raises(UserError, match=r"the Hub has no parquet export of bookcorpus/bookcorpus .*Entry Not Found.*"
                                        r"pass --task.query-dataset a local") as e:
        registry.parquet_files(registry.query_source("bookcorpus"), hub_cache_dir=tmp_path / "hub")
    assert "\n" not in str(e.value) and hub.downloads == []


def test_a_complete_export_downloads_exactly_its_checked_train_files(tmp_path, monkeypatch):
    files = {f"plain_text/train/{i:04d}.parquet": write_parquet(tmp_path / "remote" / f"t{i}.parquet", 4 + i)
             for i in range(3)}
    files["plain_text/test/0000.parquet"] = write_parquet(tmp_path / "remote" / "test.parquet", 2)
    bookcorpus = registry.SOURCES["bookcorpus"]
    monkeypatch.setitem(registry.SOURCES, "bookcorpus", dataclasses.replace(
        bookcorpus, hub=dataclasses.replace(bookcorpus.hub, num_rows=15), num_rows=15))
    hub = FakeHub(files, monkeypatch)
    got = registry.parquet_files(registry.query_source("bookcorpus"), hub_cache_dir=tmp_path / "hub")
    train = [f"plain_text/train/{i:04d}.parquet" for i in range(3)]
    assert hub.downloads == [train]
    assert got == [tmp_path / "hub" / "snapshot" / p for p in train]


def test_a_cached_partial_export_is_refused_offline(tmp_path):
    """HF_HUB_OFFLINE=1 (conftest): a Hugging Face cache holding the partial-train folder that the old advice's
    `--include '{config}/*train/*.parquet'` fetched is refused, not read."""
    part = write_parquet(tmp_path / "remote" / "p.parquet", 5)
    fake_hub_cache(tmp_path / "hub", "bookcorpus/bookcorpus", "refs/convert/parquet",
                   {"plain_text/partial-train/0000.parquet": part, "plain_text/partial-train/0001.parquet": part})
    with pytest.raises(UserError, match=r"holds only a partial train split") as e:
        registry.parquet_files(registry.query_source("bookcorpus"), hub_cache_dir=tmp_path / "hub")
    assert "\n" not in str(e.value)
    full = {f"plain_text/train/{i:04d}.parquet": part for i in range(2)}
    fake_hub_cache(tmp_path / "hub2", "bookcorpus/bookcorpus", "refs/convert/parquet", full)
    with pytest.raises(UserError, match=r"the cached parquet export of bookcorpus/bookcorpus .* holds 10 rows, the "
                                        r"baseline shuffled 74,004,228.*`hf cache rm dataset/bookcorpus/bookcorpus`"):
        registry.parquet_files(registry.query_source("bookcorpus"), hub_cache_dir=tmp_path / "hub2")


# ------------------------------------------------------------------------------ local folders: one split, one schema
@pytest.mark.parametrize("layout, expected", [
    (["default/train/0000.parquet", "default/train/0001.parquet", "default/test/0000.parquet"],
     ["default/train/0000.parquet", "default/train/0001.parquet"]),  # the parquet export's layout
    (["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet", "data/validation-00000-of-00001.parquet"],
     ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]),  # the Hub's data/ layout
    (["0001.parquet", "0000.parquet"], ["0000.parquet", "0001.parquet"]),  # no split named: the folder is the split
])
def test_a_folder_reads_the_split_the_run_asks_for(tmp_path, layout, expected):
    for name in layout:
        write_parquet(tmp_path / "data_dir" / name, 3)
    got = registry.parquet_files(registry.query_source(str(tmp_path / "data_dir")))
    assert got == [tmp_path / "data_dir" / p for p in expected]


@pytest.mark.parametrize("layout, match", [
    (["default/train/0000.parquet", "default/partial-train/0000.parquet"], "holds both a train and a partial-train split"),
    (["default/partial-train/0000.parquet", "default/test/0000.parquet"],
     r"holds the splits partial-train, test but no train split \(partial-train holds only the first rows of a split\)"),
    (["train/0000.parquet", "extra.parquet"], r"mixes files of the splits train with files of no split"),
    (["a/train/0000.parquet", "b/train/0000.parquet"], r"its train files lie in 2 folders"),
])
def test_a_folder_of_mixed_splits_is_one_line(tmp_path, layout, match):
    for name in layout:
        write_parquet(tmp_path / "data_dir" / name, 3)
    with pytest.raises(UserError, match=match) as e:
        registry.parquet_files(registry.query_source(str(tmp_path / "data_dir")))
    assert "\n" not in str(e.value)


def test_a_folder_of_different_schemas_is_one_line(tmp_path):
    write_parquet(tmp_path / "d" / "train" / "0000.parquet", 3)
    write_parquet(tmp_path / "d" / "train" / "0001.parquet", 3, column="body")
    with pytest.raises(UserError, match=r"holds files of different schemas \(0000.parquet: text string; 0001.parquet: "
                                        r"body string\); pass a folder of one dataset's split"):
        registry.parquet_files(registry.query_source(str(tmp_path / "d")))


def test_a_folder_sampler_reads_only_the_train_rows(tokenizer, tmp_path):
    write_parquet(tmp_path / "d" / "default" / "train" / "0000.parquet", 6)
    write_parquet(tmp_path / "d" / "default" / "train" / "0001.parquet", 7)
    write_parquet(tmp_path / "d" / "default" / "test" / "0000.parquet", 50)
    sampler = make_sampler(tokenizer, tmp_path / "d", tmp_path, batch_size=13, seed=0, world_size=1)
    assert len(sampler.data) == 13
    assert sorted(sampler.next_texts()) == sorted([f"train 0000 row {i}" for i in range(6)] +
                                                  [f"train 0001 row {i}" for i in range(7)])


# ------------------------------------------------------------------------------ the first query, as the fork printed it
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
