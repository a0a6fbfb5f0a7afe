"""queries/hub.py: the Hub's parquet export checked before any download, local parquet folders, texts as queries."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.queries import fake_hub_cache, make_sampler, write_tldr_zip

from lm_human_preference_details.queries import registry
from lm_human_preference_details.queries.batches import encode_queries
from lm_human_preference_details.queries.streams import shuffled_order
from lm_human_preference_details.utils.errors import UserError


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
