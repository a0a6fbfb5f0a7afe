"""label_format.py, FIDELITY A2: OpenAI's label files (schema, validation, pad 50259 mapped to ours)."""

import json

import pytest
import torch

from lm_human_preference_details.label_format import OAI_PAD, load_best_of_n_labels, read_records
from lm_human_preference_details.utils.errors import UserError


def _write(tmp_path, records):
    p = tmp_path / "labels.json"
    p.write_text(json.dumps(records))
    return p


def _record(best=2):
    return {"query": [1, 2, OAI_PAD], **{f"sample{i}": [10 + i, OAI_PAD] for i in range(4)}, "best": best}


def test_label_file_maps_oai_pad_to_ours(tmp_path):
    path = _write(tmp_path, [_record(2), _record(0)])
    labels = load_best_of_n_labels(path, n=4, query_length=3, response_length=2, pad_id=50257)
    assert labels["queries"].tolist() == [[1, 2, 50257], [1, 2, 50257]]
    assert labels["samples"].shape == (2, 4, 2)
    assert labels["samples"][0, 3].tolist() == [13, 50257]
    assert labels["best"].tolist() == [2, 0]
    assert not (labels["samples"] == OAI_PAD).any() and not (labels["queries"] == OAI_PAD).any()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.pop("sample3"), r"record 1: missing field 'sample3'"),
        (lambda r: r.update(query=[1, 2]), r"record 1: field 'query' must hold 3 tokens, got 2"),
        (lambda r: r.update(best=4), r"record 1: field 'best' must be an int in 0..3, got 4"),
        (lambda r: r.update(best=-1), r"record 1: field 'best' must be an int in 0..3, got -1"),
        (lambda r: r.update(sample0=[50258, 1]), r"record 1: field 'sample0' holds a token outside"),
    ],
)
def test_label_file_schema_errors_name_file_record_and_field(tmp_path, mutate, message):
    bad = _record()
    mutate(bad)
    path = _write(tmp_path, [_record(), bad])
    with pytest.raises(UserError, match=message) as e:
        load_best_of_n_labels(path, n=4, query_length=3, response_length=2, pad_id=50257)
    assert str(path) in str(e.value)


def test_label_file_not_json_or_missing(tmp_path):
    p = tmp_path / "labels.json"
    p.write_text("[{")
    with pytest.raises(UserError, match="is not valid JSON"):
        load_best_of_n_labels(p, n=4, query_length=3, response_length=2, pad_id=50257)
    with pytest.raises(UserError, match="does not exist"):
        load_best_of_n_labels(tmp_path / "nope.json", n=4, query_length=3, response_length=2, pad_id=50257)


def test_label_file_too_few_labels(tmp_path):
    path = _write(tmp_path, [_record()])
    with pytest.raises(UserError, match="holds 1 labels but 2 are needed"):
        load_best_of_n_labels(path, n=4, query_length=3, response_length=2, pad_id=50257, num_labels=2)
    assert torch.equal(
        load_best_of_n_labels(path, n=4, query_length=3, response_length=2, pad_id=7, num_labels=1)["queries"],
        torch.tensor([[1, 2, 7]]),
    )


def test_bad_json_advice_depends_on_whose_file_it_is(tmp_path, monkeypatch):
    from lm_human_preference_details.utils import files

    mine = tmp_path / "mine.json"
    mine.write_text("[{")
    with pytest.raises(UserError, match="is not valid JSON .*; fix it or pass another --labels.source$"):
        read_records(mine)
    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache")
    downloaded = tmp_path / "cache" / "host" / "labels.json"
    downloaded.parent.mkdir(parents=True)
    downloaded.write_text("[{")
    with pytest.raises(UserError, match="delete it to download it again"):
        read_records(downloaded)
    with pytest.raises(UserError, match="is a directory"):
        read_records(tmp_path)
