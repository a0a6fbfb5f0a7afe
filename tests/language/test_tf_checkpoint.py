"""language/tf_checkpoint.py: the TF checkpoint reader, by hand and against what TensorFlow lists of a run."""

from __future__ import annotations

import struct

import pytest
from helpers.oai_run import EXPECTED, FIXTURE

from lm_human_preference_details.language import tf_checkpoint as tfc
from lm_human_preference_details.utils.errors import UserError


def test_varint_and_protobuf_by_hand():
    assert tfc.read_varint(bytes([0xAC, 0x02]), 0) == (300, 2)
    # field 1 varint 150, field 2 bytes b"ab", field 6 fixed32 7
    message = bytes([0x08, 0x96, 0x01, 0x12, 0x02]) + b"ab" + bytes([0x35]) + struct.pack("<I", 7)
    assert tfc.proto_fields(message) == {1: [150], 2: [b"ab"], 6: [7]}


def test_block_entries_share_key_prefixes():
    # two entries: "abc" -> "1", then "abd" sharing 2 bytes -> "22"; one restart point at 0
    block = bytes([0, 3, 1]) + b"abc" + b"1" + bytes([2, 1, 2]) + b"d" + b"22" + struct.pack("<II", 0, 1)
    assert tfc.block_entries(block) == [(b"abc", b"1"), (b"abd", b"22")]


@pytest.mark.parametrize("kind", ["policy", "reward_model"])
def test_reader_lists_what_tensorflow_lists(kind):
    ckpt = tfc.TFCheckpoint(tfc.latest_checkpoint(FIXTURE / kind))
    assert ckpt.shapes() == {name: shape for name, shape in EXPECTED[kind]["variables"]}
    # train_reward.py's checkpoint holds the trained reward model; train_policy.py's the score model loaded from it
    assert ckpt.read("reward_model/reward_norm/gain") == pytest.approx(EXPECTED["reward_model"]["gain"])
    assert ckpt.read("reward_model/model/h1/attn/c_attn/w").shape == (1, 8, 24)


def test_a_big_endian_checkpoint_is_one_line(monkeypatch):
    """The index's header (BundleHeaderProto field 2, endianness: 0 little, 1 big) says how the data files are laid out;
    our reader decodes little-endian only, so a big-endian checkpoint is refused, never read as wrong numbers."""
    prefix = tfc.latest_checkpoint(FIXTURE / "policy")
    real = tfc.read_table

    def big_endian(data: bytes) -> dict:
        table = real(data)
        assert tfc.proto_fields(table[b""]).get(2, [0]) == [0]  # the fixture's, written on x86: little-endian
        return {**table, b"": bytes([0x08, 0x01, 0x10, 0x01])}  # num_shards 1, endianness 1

    monkeypatch.setattr(tfc, "read_table", big_endian)
    with pytest.raises(UserError, match=r"is big-endian; only little-endian checkpoints are supported"):
        tfc.TFCheckpoint(prefix)


def test_latest_checkpoint_follows_the_checkpoint_file():
    assert tfc.latest_checkpoint(FIXTURE / "policy") == FIXTURE / "policy" / "checkpoints" / EXPECTED["policy"]["checkpoint"]
    prefix = FIXTURE / "reward_model" / "checkpoints" / "model.ckpt"
    assert tfc.latest_checkpoint(prefix) == prefix
    with pytest.raises(UserError, match="holds no TensorFlow checkpoint"):
        tfc.latest_checkpoint(FIXTURE)
