"""FIDELITY A1: the GPT-2 tokenizer with a distinct pad."""

import pytest

from lm_human_preference_details.language.tokenizer import encode_plain, load_tokenizer, single_token
from lm_human_preference_details.utils.errors import UserError


def test_pad_is_distinct_from_eos_and_outside_the_vocab(tokenizer, tiny_model_dir):
    assert tokenizer.pad_token_id == 50257 and tokenizer.eos_token_id == 50256
    # load_tokenizer (the scripts' path) gives the same tokenizer back from a saved directory
    loaded = load_tokenizer(str(tiny_model_dir))
    assert loaded.pad_token_id == 50257
    # real GPT-2 ids: "Hello world." -> 15496, 995, 13
    assert loaded.encode("Hello world.") == [15496, 995, 13]


def test_single_token(tokenizer):
    assert single_token(tokenizer, ".", "start_text") == 13
    assert single_token(tokenizer, "\n", "end_text") == 198
    with pytest.raises(UserError, match=r"start_text 'hello world' encodes to 2 tokens"):
        single_token(tokenizer, "hello world", "start_text")


def test_encode_plain_reads_special_token_strings_as_text(tokenizer):
    # the original's encoder has no special tokens (FIDELITY A1): '<|endoftext|>' and '[PAD]' are characters
    (ids,) = encode_plain(tokenizer, ["a <|endoftext|> b [PAD]"])
    assert ids == [64, 1279, 91, 437, 1659, 5239, 91, 29, 275, 685, 47, 2885, 60]  # BPE pieces, by gpt-2's vocab
    assert 50256 not in ids and 50257 not in ids and tokenizer.decode(ids) == "a <|endoftext|> b [PAD]"
    assert tokenizer.encode("a <|endoftext|> b [PAD]") != ids  # the plain call would have made them special ids
    assert encode_plain(tokenizer, ["Hello world.", ""]) == [[15496, 995, 13], []]
    assert encode_plain(tokenizer, []) == []
    with pytest.raises(UserError, match="encodes to 13 tokens"):
        single_token(tokenizer, "a <|endoftext|> b [PAD]", "start_text")


@pytest.mark.parametrize("pad", ["none", "eos"])
def test_a_tokenizer_without_its_own_pad_gets_one_after_the_vocabulary(tmp_path, pad):
    """The Hub's gpt2 has no pad token, and a common recipe saves pad_token = eos_token (which would mask every
    <|endoftext|>): either way [PAD] is added, id 50257 (OAI encodings.py pads outside the vocabulary)."""
    from lm_human_preference_details.language.tokenizer import gpt2_tokenizer

    saved = gpt2_tokenizer.__wrapped__()  # one of its own: gpt2_tokenizer() is shared
    saved.pad_token = None if pad == "none" else saved.eos_token
    saved.save_pretrained(tmp_path / "tok")
    loaded = load_tokenizer(str(tmp_path / "tok"))
    assert (loaded.pad_token, loaded.pad_token_id, loaded.eos_token_id) == ("[PAD]", 50257, 50256)


def test_a_tokenizer_that_pads_with_a_real_token_is_refused(tmp_path):
    # OAI encodings.py pads outside the vocabulary: a saved tokenizer whose pad token is '!' (id 0) would mask real text
    from lm_human_preference_details.language.tokenizer import gpt2_tokenizer

    saved = gpt2_tokenizer.__wrapped__()  # one of its own: gpt2_tokenizer() is shared
    saved.pad_token = "!"
    saved.save_pretrained(tmp_path / "tok")
    with pytest.raises(UserError, match=r"pads with id 0, a real token"):
        load_tokenizer(str(tmp_path / "tok"))


def test_gpt2s_tokenizer_is_built_once_per_process_and_one_of_your_own_on_request(tokenizer):
    from lm_human_preference_details.language.tokenizer import gpt2_tokenizer

    assert gpt2_tokenizer() is gpt2_tokenizer() is tokenizer  # the session fixture's is the one object
    own = gpt2_tokenizer.__wrapped__()
    assert own is not tokenizer and own.get_vocab() == tokenizer.get_vocab() and own.pad_token_id == 50257


def test_a_directory_is_read_once_while_its_files_stay_as_they_are(tmp_path, monkeypatch):
    """A run reads its base model's tokenizer in its checks and again to train: the second is the first object, until a
    file of the directory changes; a Hub name is read each time (its files are the Hub cache's)."""
    from lm_human_preference_details.language import tokenizer as tokenizers

    tokenizers.gpt2_tokenizer().save_pretrained(tmp_path / "tok")
    reads = []
    monkeypatch.setattr(tokenizers, "read_tokenizer", lambda name: reads.append(name) or object())
    first = load_tokenizer(str(tmp_path / "tok"))
    assert load_tokenizer(str(tmp_path / "tok")) is first and load_tokenizer(tmp_path / ".." / tmp_path.name / "tok") is first
    assert len(reads) == 1
    config = tmp_path / "tok" / "tokenizer_config.json"
    config.write_text(config.read_text() + "\n")  # another size: read again
    assert load_tokenizer(str(tmp_path / "tok")) is not first and len(reads) == 2
    load_tokenizer("gpt2")
    load_tokenizer("gpt2")
    assert reads[2:] == ["gpt2", "gpt2"]
    again = load_tokenizer(str(tmp_path / "tok"))
    for i in range(tokenizers.READ_KEPT + 1):  # the least recently used are let go, not the base model's read again
        (tmp_path / f"tok{i}").mkdir()
        load_tokenizer(str(tmp_path / f"tok{i}"))
        assert load_tokenizer(str(tmp_path / "tok")) is again
    assert len(tokenizers._READ) == tokenizers.READ_KEPT and len(reads) == 2 + 2 + tokenizers.READ_KEPT + 1
