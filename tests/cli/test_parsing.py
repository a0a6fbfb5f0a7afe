"""cli/parsing.py: `--task NAME` picks a preset, tyro parses the flags over it, and a parse error is one line."""

from __future__ import annotations

import pytest

import train_reward
from lm_human_preference_details.cli.parsing import parse_args
from lm_human_preference_details.utils.errors import UserError


def parse(*argv: str) -> train_reward.Args:
    return parse_args(train_reward.build_args, "title", list(argv))


def test_task_picks_a_preset_and_the_flags_override_it():
    default, offline = parse(), parse("--task", "offline")
    assert default.task_name == "sentiment" and default.batch_size == 32  # launch.py's books tasks: 32 labels a batch
    assert offline.task_name == "offline" and offline.batch_size == 8
    assert parse("--task=offline", "--batch-size", "16").batch_size == 16  # the flag over the preset, in either form
    assert parse("--lr", "1e-3", "--task", "offline").lr == 1e-3  # --task anywhere among the flags


@pytest.mark.parametrize("argv, message", [
    (["--task"], "--task is missing its value; pass one of sentiment, descriptiveness, tldr, cnndm, offline"),
    (["--bogus", "1"], "unrecognized options: --bogus, 1; run "),
    (["--lrr", "1"], "perhaps you meant --lr"),
    (["--lr", "abc"], "cannot parse --lr: could not convert string to float: 'abc'"),
    (["--lr"], "--lr is missing its value"),
    (["--track", "yes"], "yes (after --track, which takes no value)"),
])
def test_a_parse_error_is_one_line_naming_the_flag(argv, message):
    with pytest.raises(UserError) as e:
        parse(*argv)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_unknown_task_is_one_line_before_any_preset_is_built(monkeypatch):
    built = []
    monkeypatch.setattr(train_reward, "build_args", lambda name: built.append(name))
    with pytest.raises(UserError, match="sentimnt"):
        parse_args(train_reward.build_args, "title", ["--task", "sentimnt"])
    assert built == []
