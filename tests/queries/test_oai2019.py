"""queries/oai2019.py: FIDELITY A3, OpenAI's 2019 query sources and their cleaning; the books rebuild."""

from __future__ import annotations

import hashlib
import json

import pytest
from helpers.http_server import server_max_in_flight

from lm_human_preference_details.queries import oai2019 as query_datasets
from lm_human_preference_details.queries import registry
from lm_human_preference_details.queries.oai2019 import (
    clean_cnndm,
    clean_tldr,
    cnndm_clean_up_start,
    cnndm_story_path,
    detokenize_bookcorpus,
    iter_book_passages,
)
from lm_human_preference_details.queries.streams import seeded_shuffle
from lm_human_preference_details.queries.text_files import read_local_texts
from lm_human_preference_details.utils import files
from lm_human_preference_details.utils.downloads import OAI_URL, cache_path_of
from lm_human_preference_details.utils.errors import UserError


# ------------------------------------------------------------------------------ A3: cleaning
def test_clean_tldr():
    assert clean_tldr("  Hello\n\n\n\nworld\n\n\nagain\n\nend  \n") == "Hello\n\nworld\n\nagain\n\nend"
    assert clean_tldr("doesn\u00e2\u20ac\u2122t caf\u00c3\u00a9") == "doesn't caf\u00e9"  # ftfy fixes mojibake


def test_cnndm_clean_up_start():
    # a byline: the first two lines go; then everything up to '(CNN) --'; curly single quotes straightened
    story = "By Jane Roe\nPUBLISHED: 10:00 GMT\nLONDON (CNN) -- The mayor said \u2018hi\u2019 today."
    assert cnndm_clean_up_start(story) == "The mayor said 'hi' today."
    assert cnndm_clean_up_start("WASHINGTON (CNN)The president spoke.") == "The president spoke."
    late = "x" * 120 + " (CNN) y"  # '(CNN)' only counts within the first 100 characters
    assert cnndm_clean_up_start(late) == late
    assert cnndm_clean_up_start("and Smith\nText.") == "Text."
    assert cnndm_clean_up_start("Header\nUPDATED: 13:45 GMT, 2 May 2013\n\nReal text.") == "Real text."


def test_clean_cnndm_keeps_the_article_before_highlights():
    story = ("By Jane Roe\nPUBLISHED: 10:00 GMT\nLONDON (CNN) -- The mayor said \u2018hi\u2019 today.\n\n\n\n"
             "He left.\n\n@highlight\n\nMayor says hi\n\n@highlight\n\nHe left")
    assert clean_cnndm(story) == "The mayor said 'hi' today.\n\nHe left."


def test_cnndm_story_path():
    url = "http://www.dailymail.co.uk/news/article-1.html"
    assert cnndm_story_path(url) == "dailymail/stories/6a05bab4b1309310e23de07757be636f4754c9b3.story"
    assert cnndm_story_path("http://edition.cnn.com/a").startswith("cnn/stories/")
    with pytest.raises(UserError, match="neither a CNN nor a Daily Mail"):
        cnndm_story_path("http://example.com/a")


# ------------------------------------------------------------------------------ shuffle and shard


# ------------------------------------------------------------------------------ local sources
def test_local_jsonl_and_txt(tmp_path):
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text('"first text"\n\n{"text": "second text", "id": 3}\n')
    assert read_local_texts(jsonl) == ["first text", "second text"]
    txt = tmp_path / "q.txt"
    txt.write_text("Passage one\nstill one.\n\n  \nPassage two.\n\n\n")
    assert read_local_texts(txt) == ["Passage one\nstill one.", "Passage two."]


@pytest.mark.parametrize("line, match", [("{not json", "line 2: not valid JSON"),
                                         ('{"body": "x"}', "line 2: expected a JSON string"),
                                         ("3", "line 2: expected a JSON string")])
def test_local_jsonl_errors_name_file_and_line(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(f'"ok"\n{line}\n')
    with pytest.raises(UserError, match=match) as e:
        read_local_texts(path)
    assert str(path) in str(e.value)


def test_local_source_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_local_texts(tmp_path / "missing.txt")
    (tmp_path / "q.csv").write_text("a")
    with pytest.raises(UserError, match="unknown file type '.csv'"):
        read_local_texts(tmp_path / "q.csv")


# ------------------------------------------------------------------------------ books rebuild
def test_detokenize_bookcorpus():
    assert detokenize_bookcorpus("usually , he would be here .") == "Usually, he would be here."
    assert detokenize_bookcorpus("`` i do n't know , '' she said .") == '"I don\'t know," she said.'
    assert detokenize_bookcorpus("it cost $ 5 ( or so ) !") == "It cost $5 (or so)!"


def test_book_passages_join_sentences_to_min_chars():
    sentences = ["a b .", "c d .", "", "e f .", "g ."]
    # "A b." (4) + " C d." -> 9 >= 8: one passage; "E f. G." (7) never reaches 8 and is dropped
    assert list(iter_book_passages(sentences, min_chars=8)) == ["A b. C d."]
    assert list(iter_book_passages(sentences, min_chars=1)) == ["A b.", "C d.", "E f.", "G."]


def test_book_passages_are_cached_with_a_held_out_test_slice(tmp_path, monkeypatch):
    monkeypatch.setattr(query_datasets, "BOOKS_TEST_PASSAGES", 2)
    monkeypatch.setattr(query_datasets, "BOOKS_TRAIN_PASSAGES", 3)
    sentences = [f"sentence number {i} is here ." for i in range(40)]
    query_datasets.ensure_book_passages(4, tmp_path, sentences=sentences)  # 32 chars per passage
    test_path, train_path = (query_datasets.book_passages_path(m, 4, tmp_path) for m in ("test", "train"))
    test, train = ([json.loads(line) for line in p.read_text().splitlines()] for p in (test_path, train_path))
    assert test[0] == "Sentence number 0 is here. Sentence number 1 is here."
    assert len(test) == 2 and len(train) == 3 and not set(test) & set(train)
    assert list(query_datasets.books_texts("train", 0, query_length=4, cache_dir=tmp_path)) == seeded_shuffle(train, 0)
    assert sorted(p.name for p in train_path.parent.iterdir()) == ["test.jsonl", "train.jsonl"]  # no temp left


def test_books_2019_rebuild_reads_bookcorpus_parquet_in_order(tmp_path, monkeypatch):
    import datasets

    path = tmp_path / "bookcorpus" / "plain_text" / "train" / "0000.parquet"
    path.parent.mkdir(parents=True)
    sentences = [f"sentence {i} ." for i in range(70_000)]  # more than one parquet batch
    datasets.Dataset.from_dict({"text": sentences}).to_parquet(str(path))
    monkeypatch.setattr(query_datasets, "export_files", lambda export: [path] if export.repo_id == "bookcorpus/bookcorpus"
                        else None)
    assert list(query_datasets._bookcorpus_sentences()) == sentences


def test_books_2019_offline_error_is_one_line_with_advice(tmp_path, monkeypatch):
    from lm_human_preference_details.queries import hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    real = hub.export_files
    monkeypatch.setattr(query_datasets, "export_files", lambda export: real(export, hub_cache_dir=tmp_path / "hub"))
    with pytest.raises(UserError, match=r"cannot get the bookcorpus dataset .*hf download bookcorpus/bookcorpus") as e:
        query_datasets.ensure_book_passages(64, tmp_path)
    assert "\n" not in str(e.value)
    assert not any(tmp_path.rglob("*.jsonl"))


# ------------------------------------------------------------------------------ names and their processing
def dataset_start_end(dataset: str) -> tuple[str | None, str | None]:
    """The start and end text ``dataset``'s QuerySource processes queries with by default (FIDELITY A4)."""
    source = registry.query_source(dataset)
    return source.start_text, source.end_text


def is_hf_source(dataset: str) -> bool:
    """Whether ``dataset`` is read by the baseline's pipeline, a shuffle per rank."""
    return registry.query_source(dataset).shuffled_per_rank


def test_dataset_names_carry_their_start_and_end_text():
    # books-2019 (OpenAI's passages, launch.py) and local passage files: '.'; the baseline's sources: none (cbdfd00)
    assert dataset_start_end("books-2019") == (".", ".")
    assert dataset_start_end("/data/my_passages.jsonl") == (".", ".")
    assert dataset_start_end("/data/queries.txt") == (".", ".")
    for name in ("bookcorpus", "tldr-17", "tldr-2019", "cnndm", "oai-label-queries", "/data/books.parquet",
                 "/data/corpus-webis-tldr-17.zip"):
        assert dataset_start_end(name) == (None, None), name
    assert tuple(registry.SOURCES) == ("bookcorpus", "tldr-17", "books-2019", "tldr-2019", "cnndm",
                                       "oai-label-queries")
    assert is_hf_source("bookcorpus") and is_hf_source("x/y.parquet")
    assert is_hf_source("x/corpus-webis-tldr-17.zip")  # tldr-17's corpus, read as its loading script
    assert not is_hf_source("books-2019") and not is_hf_source("q.jsonl")


# ------------------------------------------------------------------------------ tldr / cnndm sources
def test_tldr_source_reads_the_cached_file_and_cleans(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "CACHE_DIR", tmp_path)
    posts = [{"content": f"Post {i}\n\n\n\nbody  "} for i in range(5)]
    dest = cache_path_of(f"{OAI_URL}/tldr/valid-subset.json")  # mode 'test' reads valid
    dest.parent.mkdir(parents=True)
    dest.write_text(json.dumps(posts))
    expected = [f"Post {i}\n\nbody" for i in range(5)]
    assert list(query_datasets.tldr_texts("test", seed=0)) == seeded_shuffle(expected, 0)


def test_cnndm_source_reads_stories_from_a_local_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache")
    urls = [f"http://www.cnn.com/story/{i}.html" for i in range(4)]
    url_list = cache_path_of(f"{OAI_URL}/datasets/cnndm/url_lists/all_val.txt")
    url_list.parent.mkdir(parents=True)
    url_list.write_text("\n".join(urls) + "\n")
    stories = tmp_path / "stories"
    for i, url in enumerate(urls):
        path = stories / cnndm_story_path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"CITY (CNN) -- Article {i}.\n\n\n\nMore.\n\n@highlight\n\nSummary {i}")
    texts = list(query_datasets.cnndm_texts("valid", seed=0, stories_dir=stories))
    assert texts == [f"Article {urls.index(u)}.\n\nMore." for u in seeded_shuffle(urls, 0)]
    (stories / cnndm_story_path(urls[0])).unlink()
    with pytest.raises(UserError, match="cnndm story .* is missing"):
        list(query_datasets.cnndm_texts("valid", seed=0, stories_dir=stories))


def test_cnndm_stories_come_from_openais_container_concurrently(server, tmp_path, monkeypatch):
    base, www, requests = server
    www = www / "slow"  # the server holds each request under /slow/ a while and counts those in flight
    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.delenv("LMHP_CNNDM_STORIES", raising=False)
    oai = f"{base}/slow/lm-human-preferences"
    monkeypatch.setattr(query_datasets, "OAI_URL", oai)
    urls = [f"http://www.cnn.com/story/{i}.html" for i in range(3)] + ["http://www.dailymail.co.uk/news/x.html"]
    (www / "lm-human-preferences/datasets/cnndm/url_lists").mkdir(parents=True)
    (www / "lm-human-preferences/datasets/cnndm/url_lists/all_val.txt").write_text("\n".join(urls) + "\n")
    for i, url in enumerate(urls):
        story = www / "lm-human-preferences/datasets/cnndm/cache_val" / cnndm_story_path(url)
        story.parent.mkdir(parents=True, exist_ok=True)
        story.write_text(f"Article {i}.\n\n@highlight\n\nSummary")
    # OAI cnndm.py: gs://lm-human-preferences/datasets/cnndm/cache_{split}/{site}/stories/{sha1(url)}.story
    assert query_datasets.cnndm_story_url("val", cnndm_story_path(urls[3])) == (
        f"{oai}/datasets/cnndm/cache_val/dailymail/stories/{hashlib.sha1(urls[3].encode()).hexdigest()}.story")
    texts = list(query_datasets.cnndm_texts("valid", seed=0))
    assert texts == [f"Article {urls.index(u)}." for u in seeded_shuffle(urls, 0)]
    story_requests = sorted(r for r in requests if "/cache_val/" in r)
    assert story_requests == sorted(f"/slow/lm-human-preferences/datasets/cnndm/cache_val/{cnndm_story_path(u)}" for u in urls)
    assert server_max_in_flight() >= 2  # the stories were downloaded several at a time
    assert list(query_datasets.cnndm_texts("valid", seed=0)) == texts
    assert len(requests) == 5  # the url list and four stories, each once: the second pass read the cache
    (www / "lm-human-preferences/datasets/cnndm/cache_val" / cnndm_story_path(urls[0])).unlink()
    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache2")
    with pytest.raises(UserError, match=r"cannot download .*/cache_val/cnn/stories/.*HTTP 404"):
        list(query_datasets.cnndm_texts("valid", seed=0))


def test_a_cnndm_storys_reference_is_its_highlights():
    from lm_human_preference_details.queries.oai2019 import clean_cnndm, cnndm_highlights

    story = "The article.\n\nMore of it.\n\n@highlight\n\nFirst point\n\n@highlight\n\nSecond point\n"
    assert cnndm_highlights(story) == "First point\nSecond point"
    assert clean_cnndm(story) == "The article.\n\nMore of it."
