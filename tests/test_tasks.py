"""tasks.py: a task's flags checked before anything loads (labels, positions, the truncate token's vocabulary)."""

import pytest

from lm_human_preference_details.tasks import LabelHParams, TaskHParams, check_labels, check_task_inputs, positions_needed
from lm_human_preference_details.utils.errors import UserError


def test_labels_and_positions_needed_by_hand():
    # best_of_N -> N; anything else, or N < 2, or no label to train on: one line naming the flag
    assert check_labels(LabelHParams(type="best_of_4", num_train=64)) == 4
    assert check_labels(LabelHParams(type="best_of_2", num_train=1)) == 2
    for bad in ("best_of_1", "best_of_x", "scalar_compare", "best_of_"):
        with pytest.raises(UserError, match=f"^labels.type '{bad}' is not supported; use best_of_N, N >= 2"):
            check_labels(LabelHParams(type=bad))
    with pytest.raises(UserError, match="--labels.num-train is 0"):
        check_labels(LabelHParams(num_train=0))
    # query + response, plus a byte per prefix/suffix byte (a BPE token holds at least one): 64 + 24 + 7 + 2
    assert positions_needed(TaskHParams(query_length=64, response_length=24)) == (
        88, "--task.query-length (64) + --task.response-length (24)")
    assert positions_needed(TaskHParams(query_length=64, response_length=24, query_prefix="TL;DR: ", query_suffix="é")) == (
        97, "--task.query-length (64) + --task.response-length (24) + up to 9 prefix/suffix tokens")


def test_truncate_token_outside_the_base_models_vocabulary(assets):
    task = TaskHParams(query_dataset=str(assets / "queries.txt"), truncate_token=50257)  # [PAD], no real token
    with pytest.raises(UserError, match=r"--task.truncate-token is 50257, but --base-model .* has 50257 tokens"):
        check_task_inputs(task, str(assets / "tiny-gpt2"))
    check_task_inputs(TaskHParams(query_dataset=str(assets / "queries.txt"), truncate_token=50256), str(assets / "tiny-gpt2"))
