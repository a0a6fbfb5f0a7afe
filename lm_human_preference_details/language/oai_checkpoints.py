"""OpenAI's released TensorFlow runs -> our saved model directories (issue #18).

A run of the original (train_policy.py / train_reward.py, `--save_dir`) is laid out as

    RUN/train_policy_hparams.json              the task and PPO hparams (nested JSON)
    RUN/policy/hparams.json                    GPT-2 hparams (n_vocab, n_ctx, n_embd, n_head, n_layer)
    RUN/policy/encoding                        "main": the GPT-2 BPE
    RUN/policy/checkpoints/checkpoint          text; names the latest checkpoint, e.g. model.ckpt-1953
    RUN/policy/checkpoints/model.ckpt-N.index  + model.ckpt-N.data-00000-of-00001
    RUN/reward_model/...                       the same, saved by train_reward.py

OpenAI released RUN = `runs/descriptiveness` (README of openai/lm-human-preferences). `oai:NAME` names
`OAI_RUNS_URL/NAME`; a local RUN/policy or RUN/reward_model directory (or a checkpoint prefix) works too.
The checkpoint is read by `TFCheckpoint`, a small reader of TensorFlow's documented V2 format (no TensorFlow
needed), and converted once into CACHE_DIR/oai-converted/..., in the format `save_model_dir` writes.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path

import numpy as np
import torch

from lm_human_preference_details.language.model import Policy, RewardModel, save_model_dir
from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
from lm_human_preference_details.utils import files
from lm_human_preference_details.utils.downloads import OAI_URL, DownloadError, fetch
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import cache_lock

OAI_RUNS_URL = f"{OAI_URL}/runs"
SCOPES = {"policy": "policy", "reward": "reward_model"}  # the original's variable scopes (train_policy.py, rewards.py)


# ----------------------------------------------------------------------------- the TF checkpoint reader
# A TensorFlow V2 checkpoint is PREFIX.index, a LevelDB-format table (SSTable) mapping each variable name to a
# BundleEntryProto (dtype, shape, shard, offset, size), plus PREFIX.data-0000S-of-0000N, the raw little-endian
# bytes (tensorflow/core/util/tensor_bundle/tensor_bundle.proto; table_format.txt of LevelDB).
TABLE_MAGIC = 0xDB4775248B80FB57
DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 6: np.int8, 9: np.int64, 10: np.bool_,
          19: np.float16}  # tensorflow/core/framework/types.proto: DataType


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A base-128 varint at ``pos`` -> (value, position after it)."""
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def proto_fields(buf: bytes) -> dict[int, list]:
    """Decode a protobuf message into {field number: [values]}: ints for varint/fixed fields, bytes for the rest."""
    fields: dict[int, list] = {}
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        elif wire == 2:
            length, pos = read_varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        fields.setdefault(number, []).append(value)
    return fields


def block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, value) pairs of one SSTable block (keys share prefixes with the previous key)."""
    num_restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * num_restarts  # the restart array follows the entries
    entries, key, pos = [], b"", 0
    while pos < end:
        shared, pos = read_varint(block, pos)
        unshared, pos = read_varint(block, pos)
        value_length, pos = read_varint(block, pos)
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        entries.append((key, block[pos : pos + value_length]))
        pos += value_length
    return entries


def read_table(data: bytes) -> dict[bytes, bytes]:
    """Every (key, value) of an uncompressed SSTable file's bytes."""
    if len(data) < 48 or struct.unpack_from("<Q", data, len(data) - 8)[0] != TABLE_MAGIC:
        raise ValueError("not a TensorFlow checkpoint index (bad table magic)")
    footer = data[-48:]
    _, pos = read_varint(footer, 0)  # metaindex handle: offset, size (unused)
    _, pos = read_varint(footer, pos)
    index_offset, pos = read_varint(footer, pos)
    index_size, _ = read_varint(footer, pos)

    def block(offset: int, size: int) -> bytes:
        if data[offset + size] != 0:  # the 5-byte trailer: compression type, crc32c
            raise ValueError("compressed checkpoint index blocks are not supported")
        return data[offset : offset + size]

    table = {}
    for _, handle in block_entries(block(index_offset, index_size)):
        offset, pos = read_varint(handle, 0)
        size, _ = read_varint(handle, pos)
        table.update(block_entries(block(offset, size)))
    return table


class TFCheckpoint:
    """The variables of a TensorFlow V2 checkpoint PREFIX (PREFIX.index + PREFIX.data-*), read without TensorFlow."""

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        index = self.prefix.with_name(self.prefix.name + ".index")
        try:
            table = read_table(index.read_bytes())
        except (OSError, ValueError, IndexError, struct.error) as e:
            raise UserError(f"cannot read TensorFlow checkpoint index {index} ({e})") from None
        header = proto_fields(table.pop(b"", b""))  # BundleHeaderProto: num_shards 1, endianness 2
        if header.get(2, [0])[0] != 0:
            raise UserError(f"checkpoint {self.prefix} is big-endian; only little-endian checkpoints are supported")
        self.num_shards = header.get(1, [1])[0]
        self.entries = {}
        for key, value in table.items():
            entry = proto_fields(value)  # BundleEntryProto: dtype 1, shape 2, shard_id 3, offset 4, size 5, slices 7
            if 7 in entry:
                raise UserError(f"checkpoint {self.prefix}: variable {key.decode()} is partitioned; not supported")
            dims = proto_fields(entry[2][0]).get(2, []) if 2 in entry else []  # TensorShapeProto.dim
            shape = [proto_fields(d).get(1, [0])[0] for d in dims]  # Dim.size
            self.entries[key.decode()] = (entry.get(1, [0])[0], shape, entry.get(3, [0])[0],
                                          entry.get(4, [0])[0], entry.get(5, [0])[0])

    def shapes(self) -> dict[str, list[int]]:
        """{variable name: shape} of every variable, as tf.train.list_variables gives them."""
        return {name: shape for name, (_, shape, *_) in sorted(self.entries.items())}

    def read(self, name: str) -> np.ndarray:
        """The value of one variable."""
        dtype, shape, shard, offset, size = self.entries[name]
        if dtype not in DTYPES:
            raise UserError(f"checkpoint {self.prefix}: variable {name} has TF dtype {dtype}, not supported")
        data = self.prefix.with_name(f"{self.prefix.name}.data-{shard:05d}-of-{self.num_shards:05d}")
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype]).itemsize
        with open(data, "rb") as f:
            f.seek(offset)
            raw = f.read(size)
        if size != expected or len(raw) != size:
            raise UserError(f"checkpoint {self.prefix}: variable {name} holds {len(raw)} bytes, expected {expected}; "
                            f"is {data.name} truncated?")
        return np.frombuffer(raw, dtype=DTYPES[dtype]).reshape(shape).copy()


def latest_checkpoint(path: str | Path) -> Path:
    """A model directory (with checkpoints/checkpoint or checkpoint) or a checkpoint prefix -> the prefix."""
    # OAI lm_human_preferences/language/trained_models.py: TrainedModel.checkpoint (savedir, then savedir/checkpoints)
    path = Path(path)
    if path.with_name(path.name + ".index").is_file():
        return path
    for directory in (path, path / "checkpoints"):
        state = directory / "checkpoint"
        if state.is_file():
            match = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', state.read_text(), re.MULTILINE)
            if match:
                return directory / match.group(1)
    raise UserError(f"{path} holds no TensorFlow checkpoint (no checkpoint file in it or in its checkpoints/)")


def is_tf_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is an OpenAI TF model directory or checkpoint prefix (see latest_checkpoint)."""
    try:
        latest_checkpoint(path)
    except UserError:
        return False
    return True


# ----------------------------------------------------------------------------- names and conversion
def hf_gpt2_name(name: str) -> str | None:
    """An OAI GPT-2 variable name below SCOPE/model/ -> the Hugging Face GPT2LMHeadModel parameter, or None."""
    # OAI lm_human_preferences/language/model.py: Model.__call__ (wte, wpe, h%d/..., ln_f), norm (g, b), conv1x1 (w, b)
    if name in ("wte", "wpe"):
        return f"transformer.{name}.weight"
    match = re.fullmatch(r"(?:(h\d+)/)?(ln_1|ln_2|ln_f|attn/c_attn|attn/c_proj|mlp/c_fc|mlp/c_proj)/(g|b|w)", name)
    if not match or (match.group(1) is None) != (match.group(2) == "ln_f"):
        return None
    block, module, param = match.groups()
    prefix = "transformer." + (f"h.{block[1:]}." if block else "")
    return prefix + module.replace("/", ".") + "." + {"g": "weight", "b": "bias", "w": "weight"}[param]


def gpt2_config(hparams: dict):
    """OAI model hparams (language/model.py: HParams) -> a GPT2Config with dropout off (FIDELITY B4 no dropout)."""
    from transformers import GPT2Config  # transformers takes seconds to import: a flag's error line never waits for it

    missing = [k for k in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer") if k not in hparams]
    if missing:
        raise UserError(f"OAI model hparams lack {', '.join(missing)}")
    eot = 50256  # language/encodings.py: Main's eot_token; a tiny test vocabulary has none
    # the original: tanh GELU (gelu_new), layer norm epsilon 1e-5, scaled attention: GPT2Config's defaults
    return GPT2Config(vocab_size=hparams["n_vocab"], n_positions=hparams["n_ctx"], n_embd=hparams["n_embd"],
                      n_head=hparams["n_head"], n_layer=hparams["n_layer"], resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                      **({} if hparams["n_vocab"] > eot else {"bos_token_id": None, "eos_token_id": None}))


def convert_model_dir(model_dir: str | Path, kind: str, out: str | Path, task: dict | None = None,
                      prefix: str | Path | None = None, replace: bool = True) -> Path:
    """An OAI RUN/policy or RUN/reward_model directory -> our saved model directory ``out`` (FIDELITY B3 head init, D8 saved
    gain and bias); ``replace=False``: a cache entry, kept if another process published it first.

    The checkpoint is ``prefix``, by default the latest one of the directory.
    """
    from transformers import GPT2LMHeadModel  # transformers takes seconds to import: a flag's error line never waits for it

    model_dir = Path(model_dir)
    try:
        hparams = json.loads((model_dir / "hparams.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{model_dir} has no readable hparams.json of an OpenAI run ({e})") from None
    encoding = model_dir / "encoding"
    if encoding.is_file() and json.loads(encoding.read_text()) != "main":
        raise UserError(f"{model_dir} uses the encoding {encoding.read_text().strip()}; only 'main' (GPT-2) is supported")
    ckpt = TFCheckpoint(prefix or latest_checkpoint(model_dir))
    scope = SCOPES[kind]
    values = {name[len(scope) + 1 :]: name for name in ckpt.entries if name.startswith(scope + "/")}
    if not any(n.startswith("model/") for n in values):
        found = sorted({n.split("/")[0] for n in ckpt.entries})
        raise UserError(f"checkpoint {ckpt.prefix} has no {scope}/model/ variables (scopes: {', '.join(found)}); "
                        f"is it a {kind} model?")

    def tensor(name: str) -> torch.Tensor:
        if name not in values:
            raise UserError(f"checkpoint {ckpt.prefix} lacks {scope}/{name}")
        return torch.from_numpy(ckpt.read(values[name]))

    lm = GPT2LMHeadModel(gpt2_config(hparams))
    state = {}
    for name in values:
        hf = hf_gpt2_name(name[len("model/") :]) if name.startswith("model/") else None
        if hf is not None:  # optimizer slots (.../adam, .../adam_1) and heads map to None
            value = tensor(name)
            state[hf] = value[0] if name.endswith("/w") and value.dim() == 3 else value  # conv1x1: [1, nx, nf] -> [nx, nf]
    missing, unexpected = lm.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")]  # tied; a causal buffer
    if missing or unexpected:
        raise UserError(f"checkpoint {ckpt.prefix} does not match its hparams: missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}")
    lm.tie_weights()
    tokenizer = gpt2_tokenizer()
    model = RewardModel(lm, tokenizer.pad_token_id) if kind == "reward" else Policy(lm, tokenizer.pad_token_id, 1.0)
    head = "reward" if kind == "reward" else "value"
    with torch.no_grad():
        # OAI lm_human_preferences/language/model.py: fc_layer(h, ()) -> w [n_embd], b []
        model.head.weight.copy_(tensor(f"model/heads/{head}/w").reshape(1, -1))
        model.head.bias.copy_(tensor(f"model/heads/{head}/b").reshape(1))
        if kind == "reward":  # OAI lm_human_preferences/rewards.py: reward_norm/gain, reward_norm/bias
            model.gain.copy_(tensor("reward_norm/gain").reshape(()))
            model.bias.copy_(tensor("reward_norm/bias").reshape(()))
    saved = {"converted_from": str(ckpt.prefix), "oai_model_hparams": hparams}
    if task is not None:
        saved["task"] = task
    save_model_dir(out, model, tokenizer, saved, replace=replace)
    return Path(out)


# ----------------------------------------------------------------------------- resolving oai:NAME and local runs
def _run_task(run_dir: Path) -> dict | None:
    """The task hparams saved at the top of an OAI run directory, if there."""
    for name in ("train_policy_hparams.json", "train_reward_hparams.json"):
        path = run_dir / name
        if path.is_file():
            task = json.loads(path.read_text()).get("task")
            if isinstance(task, dict):
                return task
    return None


def download_oai_model(name: str, kind: str, cache_dir: str | Path | None = None) -> Path:
    """Download OAI_RUNS_URL/NAME/{policy,reward_model} (once, cached) -> the local model directory."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", name) or ".." in name.split("/"):
        raise UserError(f"oai:{name} is not a run name like oai:descriptiveness")
    base = f"{OAI_RUNS_URL}/{name}"
    url = f"{base}/{SCOPES[kind]}/hparams.json"
    try:
        local = fetch(url, cache_dir=cache_dir).parent
        for optional in ("train_policy_hparams.json", "train_reward_hparams.json", f"{SCOPES[kind]}/encoding"):
            try:  # the run's task and the encoding name, used when they are there
                fetch(f"{base}/{optional}", cache_dir=cache_dir)
            except DownloadError:
                pass
        url = f"{base}/{SCOPES[kind]}/checkpoints/checkpoint"
        fetch(url, cache_dir=cache_dir)
        prefix = latest_checkpoint(local)
        remote = f"{base}/{SCOPES[kind]}/{prefix.relative_to(local).as_posix()}"
        url = remote + ".index"
        fetch(url, cache_dir=cache_dir)
        num_shards = TFCheckpoint(prefix).num_shards
        for shard in range(num_shards):
            url = f"{remote}.data-{shard:05d}-of-{num_shards:05d}"
            fetch(url, cache_dir=cache_dir)
    except DownloadError as e:
        raise UserError(f"OpenAI's released run file {url} could not be downloaded ({e.reason}); it may no longer be "
                        f"hosted: download the run on a machine that can reach it and pass its local "
                        f"{SCOPES[kind]} directory") from None
    return local


def resolve_model(path: str | Path, kind: str, cache_dir: str | Path | None = None) -> str:
    """`oai:NAME` or a local OAI TF model directory -> our converted directory (once, cached); else ``path``."""
    path = str(path)  # train_reward.train returns a Path
    cache = Path(cache_dir or files.CACHE_DIR)
    if path.startswith("oai:"):
        model_dir = download_oai_model(path[len("oai:") :], kind, cache_dir)
        out = cache / "oai-converted" / path[len("oai:") :] / SCOPES[kind]
    else:
        try:
            prefix = latest_checkpoint(path)
        except UserError:
            return path  # not a TF checkpoint: one of our saved directories, or a Hugging Face model
        model_dir = prefix.parent.parent if prefix.parent.name == "checkpoints" else prefix.parent  # holds hparams.json
        index = prefix.with_name(prefix.name + ".index")
        stamp = f"{prefix.resolve()}:{index.stat().st_size}:{index.stat().st_mtime_ns}"
        out = cache / "oai-converted" / ("local-" + hashlib.sha256(stamp.encode()).hexdigest()[:16]) / SCOPES[kind]
    if (out / "config.json").is_file():
        return str(out)
    with cache_lock(out):  # one process converts, however many reach it; the others wait, then read it
        if not (out / "config.json").is_file():
            print(f"converting OpenAI's TensorFlow {kind} model {path} into {out} (once)")
            convert_model_dir(model_dir, kind, out, task=_run_task(model_dir.parent),
                              prefix=None if path.startswith("oai:") else prefix, replace=out.exists())
    return str(out)


def resolve_reward_model(path: str, cache_dir: str | Path | None = None) -> str:
    """--rewards.trained-model: `oai:NAME` or an OAI TF reward_model directory -> a directory load_model_dir reads."""
    return resolve_model(path, "reward", cache_dir)


def resolve_policy(path: str, cache_dir: str | Path | None = None) -> str:
    """`oai:NAME` or an OAI TF policy directory -> a directory load_model_dir reads; anything else unchanged."""
    return resolve_model(path, "policy", cache_dir)
