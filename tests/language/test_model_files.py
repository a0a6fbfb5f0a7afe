"""language/model_files.py: a model directory and its config checked before any weight loads."""

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
    weights.write_bytes(weights.read_bytes()[:-1])
    assert safetensors_problem(weights) == f"{size - 1} of {size} bytes: truncated"
    with pytest.raises(UserError, match="model.safetensors is damaged .* truncated\\); save it again"):
        check_model_files(copy, "--base-model", "save it again")
    weights.unlink()
    with pytest.raises(UserError, match="has a config.json but no weights"):
        check_model_files(copy, "--base-model", "fix")
    (copy / "config.json").unlink()
    with pytest.raises(UserError, match="is not a model directory \\(it holds tokenizer files only\\)"):
        check_model_files(copy, "--base-model", "fix")
