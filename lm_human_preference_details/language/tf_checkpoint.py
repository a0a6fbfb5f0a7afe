"""TensorFlow's V2 checkpoint format, read without TensorFlow: the SSTable index, the bundle entries, the tensors."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np

from lm_human_preference_details.utils.errors import UserError

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
