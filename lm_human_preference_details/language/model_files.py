"""A model checked before it loads: what a local model directory holds (config, whole weights, a tokenizer), a hub
model's config, and whether a config can be our policy or base model (a causal LM with GPT-2's tokens and room for a
query and its response). Each check reads files and configs only, so a wrong --base-model or --policy is one line
before any weight loads."""

from __future__ import annotations

import json
import re
from pathlib import Path

from huggingface_hub import constants
from safetensors import SafetensorError, safe_open

from lm_human_preference_details.language.tokenizer import N_VOCAB
from lm_human_preference_details.utils.downloads import require_hub
from lm_human_preference_details.utils.errors import UserError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json")


def is_local_model(name_or_path: str) -> bool:
    """A path on disk (existing or not) rather than a Hugging Face Hub name like gpt2 or org/name."""
    if Path(name_or_path).expanduser().exists() or name_or_path.startswith(("/", ".", "~")):
        return True
    return ".." in name_or_path or "--" in name_or_path or not re.fullmatch(r"\w[\w.-]*(/\w[\w.-]*)?", name_or_path)


def safetensors_problem(path: Path) -> str | None:
    """None if safetensors opens the file (its header whole and its tensors' bytes all there), else its size and
    safetensors' own words for what is wrong ("incomplete metadata, file not fully covered": truncated). Only the
    header is read (numpy, memory-mapped): nothing loads."""
    try:
        with safe_open(str(path), framework="numpy"):
            return None
    except SafetensorError as e:
        return f"{path.stat().st_size} bytes, {str(e).removeprefix('Error while deserializing header: ')}"


def check_model_files(path: str | Path, flag: str, fix: str) -> dict:
    """A local model directory holds config.json, whole weights and a tokenizer -> its config; else one line + ``fix``."""
    path = Path(path).expanduser()
    name = f"{flag} {path}".strip()
    if not path.exists():
        raise UserError(f"{name} does not exist; pass a model directory (save_pretrained's) or a Hugging Face model "
                        "name such as gpt2")
    if not path.is_dir():
        raise UserError(f"{name} is a file; pass the directory that holds config.json and the weights")
    has_tokenizer = any((path / f).is_file() for f in TOKENIZER_FILES)
    if not (path / "config.json").is_file():
        held = "it holds tokenizer files only" if has_tokenizer else "no config.json in it"
        raise UserError(f"{name} is not a model directory ({held}); pass a directory that a model's save_pretrained "
                        "wrote (config.json and weights)")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{name}: config.json is not readable JSON ({e}); {fix}") from None
    if not isinstance(config, dict):
        raise UserError(f"{name}: config.json holds a JSON {type(config).__name__}, not a model's config (an object); "
                        f"{fix}")
    weights = [path / f for f in WEIGHT_FILES if (path / f).is_file()]
    if not weights:
        raise UserError(f"{name} has a config.json but no weights ({' or '.join(WEIGHT_FILES[:2])}); {fix}")
    for index in [w for w in weights if w.name.endswith(".index.json")]:
        try:
            shards = {path / s for s in json.loads(index.read_text())["weight_map"].values()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"{name}: {index.name} is not a readable weight index ({e}); {fix}") from None
        missing = sorted(s.name for s in shards if not s.is_file())
        if missing:
            raise UserError(f"{name} lacks weight shards {', '.join(missing[:3])}; {fix}")
        weights += sorted(shards)
    for w in weights:
        problem = safetensors_problem(w) if w.suffix == ".safetensors" else None
        if problem:
            raise UserError(f"{name}: weights file {w.name} is damaged ({problem}); {fix}")
    if not has_tokenizer:
        raise UserError(f"{name} has no tokenizer files ({' or '.join(TOKENIZER_FILES)}); save the tokenizer into it "
                        "too (tokenizer.save_pretrained)")
    return config


def base_model_config(name_or_path: str, flag: str = "--base-model") -> dict:
    """The config of a local model directory (checked, see check_model_files) or of a hub model, before any load."""
    if is_local_model(name_or_path):
        return check_model_files(name_or_path, flag, "save or copy the model again")
    from transformers import AutoConfig  # transformers takes seconds to import: a flag's error line never waits for it

    require_hub(f"{flag} {name_or_path}", f"pass {flag} DIR, a local model directory")
    try:
        return AutoConfig.from_pretrained(name_or_path).to_dict()
    except Exception as e:  # OSError (not found, offline and not cached), ValueError (not a model)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        if constants.HF_HUB_OFFLINE:
            raise UserError(f"{flag} {name_or_path} is not in the Hugging Face cache and HF_HUB_OFFLINE=1 is set ({reason}); "
                            f"run once with network, or pass {flag} DIR, a local model directory") from None
        raise UserError(f"cannot get the config of {flag} {name_or_path} ({reason}); check the name, or pass {flag} DIR, "
                        "a local model directory") from None


def context_length(config: dict) -> int | None:
    """The most positions a model's config allows (GPT-2: n_positions; others: max_position_embeddings), if it says."""
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def check_lm_config(config: dict, name: str, needed: int = 0, sizes: str = "") -> None:
    """A policy or base model judged from its config alone, before any weight loads, else one line: a causal LM (no
    BERT), an embedding per GPT-2 token (A1 plain-text tokens), room for ``needed`` positions (``sizes``: which flags)."""
    # transformers takes seconds to import: a flag's error line never waits for it
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES as MASKED

    kind, classes = config.get("model_type"), config.get("architectures") or []
    causal = set(classes) & set(CAUSAL.values()) if classes else kind in CAUSAL  # the class it was saved as, else its type
    encoder = kind in MASKED and not config.get("is_decoder")  # BERT's kind: attends both ways unless is_decoder is set
    if config.get("is_encoder_decoder") or encoder or not causal:
        what = f"a {classes[0]}" if classes else f"a model of type {kind!r}"
        raise UserError(f"{name} is {what}, not a causal language model; pass a GPT-2 (a Hugging Face causal LM with "
                        f"GPT-2's {N_VOCAB} tokens)")
    n_vocab = config.get("vocab_size")
    if n_vocab is not None and (not isinstance(n_vocab, int) or isinstance(n_vocab, bool)):
        raise UserError(f"{name}: config.json's vocab_size is {n_vocab!r}, not an integer; pass a model whose "
                        "config.json a model's save_pretrained wrote (GPT-2's: 50257)")
    if isinstance(n_vocab, int) and n_vocab < N_VOCAB:
        raise UserError(f"{name} has {n_vocab} tokens, but the GPT-2 tokenizer gives ids up to {N_VOCAB - 1}, which it "
                        f"has no embedding for; pass a model with GPT-2's {N_VOCAB} tokens")
    n_positions = context_length(config)
    if n_positions is not None and needed > n_positions:
        raise UserError(f"{sizes} = {needed} positions, but {name} has room for {n_positions}; lower "
                        "--task.query-length or --task.response-length")
