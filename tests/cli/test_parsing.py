"""cli/parsing.py: `--task NAME` picks a preset, tyro parses the flags over it, and a parse error is one line; both
scripts' main(): the help, and leaving torchrun's process group only when no peer may still wait."""

from __future__ import annotations

import os
import sys

import pytest

import train_reward
from lm_human_preference_details.cli.parsing import parse_args, program_name
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


# Every entry point's Args
def entry_points() -> dict:
    import train_policy
    from lm_human_preference_details import label, sample

    return {"train_policy.py": train_policy, "train_reward.py": train_reward, "python -m lm_human_preference_details.label":
            label, "python -m lm_human_preference_details.sample": sample}


PENDING: set[str] = set()


def help_texts(cls: type, seen: set | None = None) -> dict[str, str]:
    """Class.field -> the help text tyro shows for it (its docstring, single line breaks joined by tyro's own rule),
    for every field of ``cls`` and of the dataclasses nested in it."""
    import dataclasses
    import typing

    from tyro import _docstrings

    seen = set() if seen is None else seen
    texts = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        text = _docstrings.get_field_docstring(cls, f.name, ())
        if text:
            texts[f"{cls.__name__}.{f.name}"] = text
        nested = [t for t in (hints[f.name], *typing.get_args(hints[f.name])) if dataclasses.is_dataclass(t)]
        for t in nested:
            if t not in seen:
                seen.add(t)
                texts.update(help_texts(t, seen))
    return texts


def mid_sentence_breaks(text: str) -> list[str]:
    """The line breaks of a field's help text that do not end a sentence or clause: a line (not the last) ending
    without '.', ';', ':', '!' or '?' (a closing bracket or quote after it allowed). tyro keeps a docstring's line
    breaks in --help, so such a break splits a sentence wherever the source was wrapped ("so 1,\\n2, 4 or 8")."""
    import re

    lines = text.split("\n")
    return [f"{a.strip()[-30:]!r} / {b.strip()[:20]!r}" for a, b in zip(lines, lines[1:])
            if not re.search(r"[.;:!?][)\"'`]*$", a.strip())]


def test_no_help_text_breaks_mid_sentence():
    assert mid_sentence_breaks("one, so 1,\n2, 4") and mid_sentence_breaks("the\nquery dataset's")  # the rule itself
    assert not mid_sentence_breaks("a clause;\nthen another (launch.py: 8).\nAnd one.")
    found, pending = [], set()
    for name, module in entry_points().items():
        for field, text in help_texts(module.Args).items():
            if mid_sentence_breaks(text):
                if field.split(".")[0] in PENDING:
                    pending.add(field.split(".")[0])
                else:
                    found.append(f"{name} {field}: {mid_sentence_breaks(text)}")
    assert not found
    assert pending == PENDING, "a pending class's help is rewrapped: drop it from PENDING"


def test_help_names_the_program_as_started_never_by_an_absolute_path(monkeypatch, capsys):
    """Each entry point's --help: `python -m MODULE` for the -m tools (whose sys.argv[0] is the file's absolute path),
    the script's or console script's file name otherwise; a default with an apostrophe is not shown shell-quoted, and
    a closed choice lists its values."""
    monkeypatch.setenv("COLUMNS", "100")  # one column of boxes
    import types

    for name, module in entry_points().items():
        main_module = types.ModuleType("__main__")
        if name.startswith("python -m"):
            main_module.__spec__ = types.SimpleNamespace(name=name.split()[-1])
            monkeypatch.setattr("sys.argv", [module.__file__, "--help"])
        else:
            main_module.__spec__ = None
            monkeypatch.setattr("sys.argv", [name, "--help"])
        monkeypatch.setitem(sys.modules, "__main__", main_module)
        with pytest.raises(SystemExit):
            parse_args(module.build_args, "title", ["--help"])
        out = capsys.readouterr().out
        assert out.startswith(f"usage: {name} [-h]"), out[:120]
        assert os.path.dirname(module.__file__) not in out  # no absolute path anywhere in the help
        words = " ".join(out.replace("│", " ").split())  # the help's words, as rich wrapped them into one column
        assert "(default: the query dataset's)" in words and "'\"'\"'" not in out  # --task.start-text's default
        if name.endswith(".sample"):
            assert "--query-mode {auto,test,train}" in words
    monkeypatch.setattr("sys.argv", ["/usr/local/bin/lmhp-label"])
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)  # a console script's __main__ is its launcher
    assert program_name() == "lmhp-label"  # pyproject.toml's console script


# ------------------------------------------------------------------------------------ run_script, both scripts' main()
def test_help_is_tyros(capsys):
    import train_policy

    with pytest.raises(SystemExit) as e:
        train_policy.main(["--help"])
    out = capsys.readouterr()
    assert e.value.code == 0 and out.out.startswith("usage: ") and "--ppo.lr FLOAT" in out.out and not out.err
    title = train_policy.__doc__.split("\n")[0]  # the help's title: the docstring's first line (parsing.run_script)
    assert " ".join(title.split()) in " ".join(out.out.split())


@pytest.mark.parametrize("ending, leaves", [(None, True), ("JobFailed", True), ("Stopped", True), ("UserError", False),
                                            ("RuntimeError", False)])
def test_the_process_group_is_left_only_when_no_peer_may_still_wait(monkeypatch, ending, leaves):
    """After a run that succeeded, or a failure or stop every process agreed on, the process leaves torchrun's group;
    after any other failure a peer may still wait in a collective, so it does not (docs/ranks.md)."""
    import signal

    import train_reward
    from lm_human_preference_details.cli import parsing
    from lm_human_preference_details.utils import errors

    raised = {"JobFailed": errors.JobFailed("error: x", 2), "Stopped": errors.Stopped("stopped", signal.SIGTERM),
              "UserError": errors.UserError("x"), "RuntimeError": RuntimeError("a bug")}
    left = []
    monkeypatch.setattr(parsing, "shutdown_distributed", lambda: left.append(True))

    def train(args):
        if ending:
            raise raised[ending]
        return "trained"

    if ending is None:
        assert parsing.run_script(train_reward.build_args, train, "title", ["--task", "offline"]) == "trained"
    else:
        with pytest.raises(type(raised[ending])):
            parsing.run_script(train_reward.build_args, train, "title", ["--task", "offline"])
    assert left == ([True] if leaves else [])
