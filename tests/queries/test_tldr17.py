"""queries/tldr17.py: webis/tldr-17's corpus archive read as its loading script read it, its table built once."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import zipfile

import datasets
import numpy as np
import pytest
from helpers.queries import baseline_rank_texts, fake_hub_cache, make_sampler, write_tldr_zip

from lm_human_preference_details.queries import columns, registry, tldr17
from lm_human_preference_details.queries.samplers import HFQuerySampler
from lm_human_preference_details.utils.errors import UserError

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
