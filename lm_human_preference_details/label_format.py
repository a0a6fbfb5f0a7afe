"""OpenAI's human-label files (FIDELITY A2 OAI pad remap): read once, checked against the schema, pad 50259 mapped to ours.

A best_of_N file is a JSON list of records {query, sample0..sample{N-1}, best}, each token list already padded with
50259, gzipped when its name ends in .gz (the package's own labels.json.gz). Both the labels (train_reward.py) and the
queries alone (`--task.query-dataset oai-label-queries`, queries/oai2019.py) are read here; any mismatch is a one-line
UserError naming the file, record and field.
"""

from __future__ import annotations

import functools
import gzip
import json
import zlib
from pathlib import Path

import torch

from lm_human_preference_details.language.tokenizer import N_VOCAB
from lm_human_preference_details.utils.downloads import cache_path_of, is_downloaded, is_url
from lm_human_preference_details.utils.errors import UserError

OAI_PAD = 50259  # OAI lm_human_preferences/language/encodings.py: padding_token = len(encoder) + 2


def read_records(path: str | Path, flag: str = "--labels.source") -> list:
    """The parsed JSON list of a label file, read from disk once per process; ``flag``: the command's flag that names
    it, in its messages."""
    path = Path(path)
    return _read_records(path, path.stat().st_mtime_ns if path.is_file() else None, flag)


def check_label_source(source: str, *, n: int, query_length: int, response_length: int, num_train: int) -> None:
    """--labels.source is a URL, or an existing label file (not a directory); its records, read as the run will read
    them (best_of_N, query and response lengths, at least num_train labels), checked before anything is written.
    A URL's file is checked here when the cache holds it already, else as it is loaded."""
    path = local_label_file(source, "--labels.source")
    if path is None:
        return
    labels = load_best_of_n_labels(path, n=n, query_length=query_length, response_length=response_length, pad_id=OAI_PAD)
    check_enough_labels(path, len(labels["best"]), num_train)


def check_enough_labels(path: str | Path, n_labels: int, num_train: int) -> None:
    """A one-line UserError when the label file ``path`` holds fewer than --labels.num-train labels."""
    if n_labels < num_train:
        raise UserError(f"label file {path} holds {n_labels} labels but --labels.num-train is {num_train}; "
                        "lower --labels.num-train")


def local_label_file(source: str, flag: str) -> Path | None:
    """The label file ``source`` names on disk: the path itself, or a URL's copy in the cache (None if not there yet)."""
    if is_url(source):
        path = cache_path_of(source)
        return path if path.is_file() else None
    path = Path(source).expanduser()
    if path.is_dir():
        raise UserError(f"{flag} {source} is a directory; pass the label file (JSON) itself")
    if not path.is_file():
        raise UserError(f"{flag} {source} does not exist; pass an existing label file or an http(s) URL")
    return path


@functools.lru_cache(maxsize=4)
def _read_records(path: Path, mtime_ns: int | None, flag: str) -> list:
    if mtime_ns is None:
        what = "is a directory; pass the label file (JSON) itself" if path.is_dir() else "does not exist"
        raise UserError(f"label file {path} {what}; pass {flag} a label file or URL")
    # a copy we downloaded can be fetched again; the user's own file can only be fixed by the user
    fix = "delete it to download it again" if is_downloaded(path) else f"fix it or pass another {flag}"
    try:
        data = path.read_bytes()
        records = json.loads((gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"label file {path} is not valid JSON ({e}); {fix}") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # a .gz name: the package's own labels.json.gz, gzipped JSON
        raise UserError(f"label file {path} is not a whole gzip file ({e}); {fix}") from None
    except OSError as e:
        raise UserError(f"cannot read label file {path} ({e.strerror or e}); {fix}") from None
    if not isinstance(records, list):
        raise UserError(f"label file {path}: expected a JSON list of records, got {type(records).__name__}")
    return records


def record_tokens(path: Path, i: int, record: object, key: str, length: int, pad_id: int) -> list[int]:
    """Field ``key`` of record ``i``: exactly ``length`` real tokens or 50259 pads, the pads mapped to ``pad_id``."""
    if not isinstance(record, dict):
        raise UserError(f"label file {path}, record {i}: expected an object, got {type(record).__name__}")
    if key not in record:
        raise UserError(f"label file {path}, record {i}: missing field '{key}'")
    value = record[key]
    if not isinstance(value, list) or len(value) != length:
        got = len(value) if isinstance(value, list) else type(value).__name__
        raise UserError(f"label file {path}, record {i}: field '{key}' must hold {length} tokens, got {got}")
    # a JSON true or false is no token (Python reads it as the int 1 or 0)
    if not all(type(t) is int and (0 <= t < N_VOCAB or t == OAI_PAD) for t in value):
        raise UserError(f"label file {path}, record {i}: field '{key}' holds a token outside 0..{N_VOCAB - 1} "
                        f"and pad {OAI_PAD} (or a value that is not an integer)")
    if key == "query" and value and value[0] == OAI_PAD:
        # OAI lm_human_preferences/language/model.py: the model asserts a sequence's first token is real
        raise UserError(f"label file {path}, record {i}: field 'query' starts with the pad {OAI_PAD}; a query's first "
                        "token must be real (the original's model asserts it): fix the record or drop it")
    # OAI pad 50259 -> our pad; 50259 never reaches a model (FIDELITY A2 OAI pad remap)
    return [pad_id if t == OAI_PAD else t for t in value]


def load_best_of_n_labels(
    path: str | Path, *, n: int, query_length: int, response_length: int, pad_id: int, num_labels: int | None = None
) -> dict[str, torch.Tensor]:
    """Read OpenAI's best_of_N label file and map its pad 50259 to ``pad_id`` (FIDELITY A2 OAI pad remap).

    Returns queries [num, query_length], samples [num, n, response_length], best [num].
    """
    path = Path(path)
    records = read_records(path)
    if num_labels is not None:
        if len(records) < num_labels:
            raise UserError(f"label file {path} holds {len(records)} labels but {num_labels} are needed; "
                            "lower --labels.num-train")
        records = records[:num_labels]
    queries, samples, best = [], [], []
    for i, record in enumerate(records):
        queries.append(record_tokens(path, i, record, "query", query_length, pad_id))
        samples.append([record_tokens(path, i, record, f"sample{j}", response_length, pad_id) for j in range(n)])
        if "best" not in record:
            raise UserError(f"label file {path}, record {i}: missing field 'best'")
        b = record["best"]
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < n:
            raise UserError(f"label file {path}, record {i}: field 'best' must be an int in 0..{n - 1}, got {b!r}")
        best.append(b)
    return {
        "queries": torch.tensor(queries, dtype=torch.long).reshape(len(records), query_length),
        "samples": torch.tensor(samples, dtype=torch.long).reshape(len(records), n, response_length),
        "best": torch.tensor(best, dtype=torch.long),
    }
