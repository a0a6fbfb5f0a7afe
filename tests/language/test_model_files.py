"""language/model_files.py: a model directory and its config checked before any weight loads."""

from __future__ import annotations

import pytest


def test_is_local_model_tells_paths_from_hub_names(tmp_path):
    from lm_human_preference_details.language.model_files import is_local_model

    assert not is_local_model("gpt2") and not is_local_model("openai-community/gpt2")
    for path in ("/nonexistent/model", "./gpt2", "~/models/gpt2", "a/b/c", "a/../b", str(tmp_path)):
        assert is_local_model(path), path


def test_model_files_are_checked_without_loading(tiny_model_dir, tmp_path):
    import shutil

    from lm_human_preference_details.language.model_files import check_model_files, context_length, safetensors_problem
    from lm_human_preference_details.utils.errors import UserError

    config = check_model_files(tiny_model_dir, "--base-model", "fix")
    assert context_length(config) == 256 and context_length({"max_position_embeddings": 2048}) == 2048
    assert context_length({}) is None
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    weights = copy / "model.safetensors"
    size = weights.stat().st_size
    assert safetensors_problem(weights) is None
    whole = weights.read_bytes()
    header = 8 + int.from_bytes(whole[:8], "little")
    for cut, words in ((header, "incomplete metadata, file not fully covered"), (header - 1, "invalid header length"),
                       (4, "header too small")):  # safetensors' own words: no tensor bytes, a cut header, no header
        weights.write_bytes(whole[:cut])
        assert safetensors_problem(weights) == f"{cut} bytes, {words}", cut
    weights.write_bytes(whole[:-1])  # one byte short: a truncated download
    assert safetensors_problem(weights) == f"{size - 1} bytes, incomplete metadata, file not fully covered"
    with pytest.raises(UserError, match="model.safetensors is damaged .* not fully covered\\); save it again"):
        check_model_files(copy, "--base-model", "save it again")
    weights.unlink()
    with pytest.raises(UserError, match="has a config.json but no weights"):
        check_model_files(copy, "--base-model", "fix")
    (copy / "config.json").unlink()
    with pytest.raises(UserError, match="is not a model directory \\(it holds tokenizer files only\\)"):
        check_model_files(copy, "--base-model", "fix")


def test_what_can_be_a_policy_is_judged_from_the_config():
    """check_lm_config without architectures in the config (a hub config, a hand-written one): by the model type."""
    from transformers import BertConfig, GPT2Config, T5Config

    from lm_human_preference_details.language.model_files import check_lm_config
    from lm_human_preference_details.utils.errors import UserError

    for config, what in [(BertConfig(vocab_size=50257), "a model of type 'bert'"), (T5Config(), "a model of type 't5'")]:
        with pytest.raises(UserError, match=f"^m is {what}, not a causal language model; pass a GPT-2"):
            check_lm_config(config.to_dict(), "m")
    check_lm_config(BertConfig(vocab_size=50257, is_decoder=True).to_dict(), "m")  # a BERT made causal attends back only
    check_lm_config(GPT2Config(n_positions=88).to_dict(), "m", 88, "q + r")
    with pytest.raises(UserError, match=r"^q \+ r = 89 positions, but m has room for 88; lower --task.query-length"):
        check_lm_config(GPT2Config(n_positions=88).to_dict(), "m", 89, "q + r")
