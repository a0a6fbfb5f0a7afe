"""OpenAI's 2019 query sources (FIDELITY A3 query sources): books-2019, tldr-2019, cnndm and the queries inside label
files.

Each is a generator of texts (or, for the label files, of ready token lists) for one mode ('train' or 'test'),
shuffled once with a seeded `random.Random` exactly as the original's `random.seed(seed); random.shuffle(...)`;
`samplers.QuerySampler` processes them (A4 query processing), repeats the stream and shards it across the ranks.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from pathlib import Path
from typing import Iterable, Iterator

import ftfy

from lm_human_preference_details.label_format import OAI_PAD, local_label_file, read_records, record_tokens
from lm_human_preference_details.queries.batches import Article
from lm_human_preference_details.queries.hub import BOOKCORPUS, export_files
from lm_human_preference_details.queries.source import Request
from lm_human_preference_details.queries.streams import seeded_shuffle
from lm_human_preference_details.queries.text_files import local_texts
from lm_human_preference_details.utils import files
from lm_human_preference_details.utils.downloads import OAI_URL, fetch, fetch_many, fetch_oai
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import atomic_path
from lm_human_preference_details.utils.progress import progress


# ------------------------------------------------------------------------------------------ text cleaning
def clean_tldr(content: str) -> str:
    """A Reddit post's text as the original feeds it: ftfy-fixed, 3+ newlines -> 2, stripped."""
    # OAI lm_human_preferences/datasets/tldr.py: tldr_generator
    return re.sub(r"\n{3,}", "\n\n", ftfy.fix_text(content)).strip()


def cnndm_clean_up_start(text: str) -> str:
    """Drop CNN/DailyMail bylines, '(CNN) --' datelines and 'UPDATED: hh:mm ...' headers; straighten quotes."""
    # OAI lm_human_preferences/datasets/cnndm.py: clean_up_start
    if text.startswith("By"):
        text = "\n".join(text.split("\n")[2:])
    text = re.split(r"\(CNN\) +--", text)[-1]
    text = re.split(r"\(CNN\)", text[:100])[-1] + text[100:]  # only a '(CNN)' within the first 100 chars
    text = re.sub(r"^and \w+\n", "", text)
    # the original's `[2011|2012|...]` is a character class (one of 0-5 or '|'), kept as is
    text = re.split(r".*UPDATED:\s+[0-9]{2}:[0-9]{2}.*[2011|2012|2013|2014|2015]", text)[-1]
    return text.replace("\u2019", "'").replace("\u2018", "'").strip()


def cnndm_highlights(story: str) -> str:
    """A .story file's reference summary: its highlights (the paragraphs after each @highlight), one a line."""
    return "\n".join(h.strip() for h in story.split("@highlight")[1:] if h.strip())


def clean_cnndm(story: str) -> str:
    """A .story file's article as the original feeds it: clean start, ftfy, 3+ newlines -> 2, text before @highlight."""
    # OAI lm_human_preferences/datasets/cnndm.py: cnndm_generator
    text = ftfy.fix_text(cnndm_clean_up_start(story))
    return re.sub(r"\n{3,}", "\n\n", text).split("@highlight")[0].strip()


def cnndm_story_path(url: str) -> str:
    """'{cnn|dailymail}/stories/{sha1(url)}.story', the layout of the CNN/DailyMail story archives."""
    # OAI lm_human_preferences/datasets/cnndm.py: get_path_of_url
    if any(site in url for site in ("dailymail.co.uk", "mailonsunday.ie", "lib.store.yahoo.net")):
        site = "dailymail"
    elif "cnn.com" in url or "cnn.hk" in url:
        site = "cnn"
    else:
        raise UserError(f"cnndm url {url!r} is neither a CNN nor a Daily Mail article; check the url list")
    return f"{site}/stories/{hashlib.sha1(url.encode('utf-8')).hexdigest()}.story"


# ------------------------------------------------------------------------------------------ text sources
def tldr_texts(mode: str, seed: int = 0) -> Iterator[str]:
    """OpenAI's TL;DR subset; mode 'test' reads the validation file, as the original does."""
    # OAI lm_human_preferences/datasets/tldr.py: tldr_generator ('test' -> 'valid')
    split = {"test": "valid"}.get(mode, mode)
    path = fetch_oai(f"{OAI_URL}/tldr/{split}-subset.json")
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
        posts = [(r["content"], r.get("summary")) for r in records]
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise UserError(f"tldr file {path} is not a JSON list of objects with 'content' ({e}); "
                        "delete it to download it again") from None
    for content, summary in seeded_shuffle(posts, seed):
        # the post's own TL;DR, where the file has it, for the evaluation's ROUGE table
        yield Article(clean_tldr(content), summary if isinstance(summary, str) else None)


CNNDM_WORKERS = 16  # concurrent story downloads


def cnndm_story_url(split: str, rel: str) -> str:
    """OpenAI's copy of a CNN/DailyMail story: the original's gs://.../cnndm/cache_{split} over public HTTPS."""
    # OAI lm_human_preferences/datasets/cnndm.py: download_directory_cached(gs://lm-human-preferences/datasets/cnndm/
    # cache_{mode}); the same files are served from OpenAI's Azure container (github.com/openai/lm-human-preferences/issues/17)
    return f"{OAI_URL}/datasets/cnndm/cache_{split}/{rel}"


def cnndm_texts(mode: str, seed: int = 0, stories_dir: str | os.PathLike | None = None) -> Iterator[str]:
    """CNN/DailyMail articles listed in OpenAI's url list; stories from ``stories_dir``, else from OpenAI's container.

    ``stories_dir`` (default: env LMHP_CNNDM_STORIES) holds cnn/stories/*.story and dailymail/stories/*.story,
    i.e. the CNN and Daily Mail story archives extracted side by side. Downloaded stories are fetched
    CNNDM_WORKERS at a time, ahead of the stream, and cached.
    """
    # OAI lm_human_preferences/datasets/cnndm.py: cnndm_generator ('valid' -> 'val')
    split = {"valid": "val"}.get(mode, mode)
    urls = fetch(f"{OAI_URL}/datasets/cnndm/url_lists/all_{split}.txt").read_text(encoding="utf-8").splitlines()
    rels = [cnndm_story_path(u) for u in seeded_shuffle([u.strip() for u in urls if u.strip()], seed)]
    stories_dir = stories_dir or os.environ.get("LMHP_CNNDM_STORIES")
    if stories_dir:
        paths: Iterable[Path] = (Path(stories_dir, rel) for rel in rels)
    else:
        paths = fetch_many((cnndm_story_url(split, rel) for rel in rels), workers=CNNDM_WORKERS)
    for rel, path in zip(rels, paths):
        if not path.is_file():
            raise UserError(f"cnndm story {path} is missing; LMHP_CNNDM_STORIES must hold cnn/stories/ and "
                            "dailymail/stories/ from the CNN/DailyMail story archives")
        story = path.read_text(encoding="utf-8")
        yield Article(clean_cnndm(story), cnndm_highlights(story) or None)  # the highlights: ROUGE's reference


# ---------------------------------------------------------------------------------------------- books
# DEVIATION: OpenAI's book_passages/{train,test}.jsonl are lost (github.com/openai/lm-human-preferences/issues/17);
# passages are rebuilt from the Hugging Face `bookcorpus` sentences by the rule below.
BOOKS_URL = f"{OAI_URL}/datasets/book_passages"  # the lost originals, for reference
BOOKS_TEST_PASSAGES = 2_000  # the first passages of the stream are held out for mode 'test'
BOOKS_TRAIN_PASSAGES = 100_000  # the next ones are mode 'train'


def book_passage_chars(query_length: int) -> int:
    """Minimum characters per rebuilt passage: 8 per query token (~2x query_length tokens of English)."""
    return 8 * query_length


def detokenize_bookcorpus(sentence: str) -> str:
    """Undo bookcorpus' tokenisation so GPT-2 sees '.' (13) rather than ' .' (764): quotes, spacing, casing."""
    s = " " + sentence.strip() + " "
    s = s.replace(" `` ", ' "').replace(" '' ", '" ')  # `` opens, '' closes a quote
    s = re.sub(r" (n't|'s|'re|'ve|'ll|'m|'d)\b", r"\1", s)  # contractions: "do n't" -> "don't"
    s = re.sub(r" ([.,!?;:%)\]}])", r"\1", s)  # no space before closing punctuation
    s = re.sub(r"([(\[{$]) ", r"\1", s)  # nor after opening punctuation
    s = re.sub(r"\bi\b", "I", s.strip())  # bookcorpus is lower-cased: restore 'I' and sentence starts
    return re.sub(r"^(\W*)([a-z])", lambda m: m.group(1) + m.group(2).upper(), s)


def iter_book_passages(sentences: Iterable[str], *, min_chars: int) -> Iterator[str]:
    """Join consecutive detokenized sentences with spaces; a passage ends once it has ``min_chars`` characters."""
    current: list[str] = []
    length = 0  # == len(" ".join(current))
    for sentence in sentences:
        text = detokenize_bookcorpus(sentence)
        if text:
            length += len(text) + (1 if current else 0)
            current.append(text)
        if length >= min_chars:
            yield " ".join(current)
            current, length = [], 0


def _bookcorpus_sentences() -> Iterator[str]:
    """The `bookcorpus` sentences in the dataset's order, from the Hub's parquet export (the baseline's download)."""
    # pyarrow takes about a second to import: only a run that reads parquet pays it
    import pyarrow.parquet as pq

    # the old loading script no longer runs with current `datasets`; hub.export_files says what to do offline
    for path in export_files(BOOKCORPUS):
        for batch in pq.ParquetFile(path).iter_batches(columns=["text"], batch_size=65536):
            yield from batch.column(0).to_pylist()


def book_passages_path(mode: str, query_length: int, cache_dir: str | os.PathLike | None = None) -> Path:
    """Cached JSONL of rebuilt passages (one JSON string per line, the format of OpenAI's book_passages)."""
    return Path(cache_dir or files.CACHE_DIR, "books", f"bookcorpus-{book_passage_chars(query_length)}chars", f"{mode}.jsonl")


def ensure_book_passages(query_length: int, cache_dir: str | os.PathLike | None = None,
                         sentences: Iterable[str] | None = None) -> None:
    """Rebuild the test and train passages once from bookcorpus (or ``sentences``) and cache them atomically."""
    paths = {mode: book_passages_path(mode, query_length, cache_dir) for mode in ("test", "train")}
    if all(p.is_file() for p in paths.values()):
        return
    total = BOOKS_TEST_PASSAGES + BOOKS_TRAIN_PASSAGES
    stream = iter_book_passages(_bookcorpus_sentences() if sentences is None else sentences,
                                min_chars=book_passage_chars(query_length))
    passages = list(progress(itertools.islice(stream, total), total=total, unit="passage",
                         desc="rebuilding book passages from bookcorpus"))
    if len(passages) < total:
        raise UserError(f"bookcorpus gave only {len(passages)} passages, {total} are needed")
    splits = {"test": passages[:BOOKS_TEST_PASSAGES], "train": passages[BOOKS_TEST_PASSAGES:]}
    for mode, path in paths.items():
        with atomic_path(path) as tmp:
            tmp.write_text("".join(json.dumps(p) + "\n" for p in splits[mode]), encoding="utf-8")


def books_texts(mode: str, seed: int = 0, *, query_length: int = 64,
                cache_dir: str | os.PathLike | None = None) -> Iterator[str]:
    """Book passages for ``mode`` ('train' or 'test'), rebuilt from bookcorpus once and cached as JSONL."""
    # OAI lm_human_preferences/datasets/books.py: books_generator (its book_passages files are lost)
    ensure_book_passages(query_length, cache_dir)
    yield from local_texts(book_passages_path(mode, query_length, cache_dir), mode, seed)


# ------------------------------------------------------------------------------------ label-file queries
def label_queries(source: str, *, query_length: int, pad_id: int, seed: int = 0) -> Iterator[list[int]]:
    """The ready queries of an OpenAI label file (field `query`), pad 50259 mapped to ``pad_id``."""
    path = fetch_oai(source)
    records = read_records(path)
    for i, record in enumerate(records):
        query = record.get("query") if isinstance(record, dict) else None
        if isinstance(query, list) and len(query) != query_length:
            raise UserError(f"label file {path}, record {i}: query has {len(query)} tokens but --task.query-length "
                            f"is {query_length}")
    queries = [record_tokens(path, i, r, "query", query_length, pad_id) for i, r in enumerate(records)]
    yield from seeded_shuffle(queries, seed)  # FIDELITY A2 OAI pad remap: 50259 never reaches a model


def check_label_queries(request: Request) -> None:
    """oai-label-queries, before the run: the label file's queries, when the file is on disk (a local file, or a URL's
    copy in the cache); each problem one line naming the record."""
    path = local_label_file(request.labels_source, "--labels.source") if request.labels_source else None
    if path is not None:
        list(label_queries(str(path), query_length=request.query_length, pad_id=OAI_PAD))
