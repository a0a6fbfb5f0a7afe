"""The command line -> a script's Args: `--task NAME` picks a preset (tasks.py), tyro parses the flags over it, and a
parse error becomes one UserError line naming the flag instead of tyro's box; `run_script`, both scripts' main(), parses,
checks, trains and leaves torchrun's process group. The process's one line and exit status on a failure are
errors.run_main's, which wraps it."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import sys
from typing import Any, Callable, TypeVar

import tyro

from lm_human_preference_details.ranks.emulated import shutdown_distributed
from lm_human_preference_details.tasks import TASK_NAMES, get_task
from lm_human_preference_details.utils.errors import JobFailed, Stopped, UserError

T = TypeVar("T")


def parse_args(build: Callable[[str], T], description: str, argv: list[str] | None = None) -> T:
    """Take `--task NAME` (a preset), build its defaults with ``build``, then let tyro parse the overrides."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = "sentiment"
    for i, a in enumerate(argv):
        if a == "--task" or a.startswith("--task="):
            if a == "--task" and i + 1 == len(argv):
                raise UserError(f"--task is missing its value; pass one of {', '.join(TASK_NAMES)}")
            value = a.split("=", 1)[1] if "=" in a else argv[i + 1]
            del argv[i : i + (1 if "=" in a else 2)]
            name = value
            break
    get_task(name)  # an unknown name ends here, in one line
    default = build(name)
    description = (f"{description}\n\n--task {{{','.join(TASK_NAMES)}}} picks a preset (default sentiment); "
                   "every field below overrides it.")
    args = tyro_cli(default, argv, description)
    return dataclasses.replace(args, task_name=name) if hasattr(args, "task_name") else args


def tyro_cli(default: T, argv: list[str], description: str) -> T:
    """tyro.cli on ``argv``; a parse error (an unknown flag, a value of the wrong type, a missing value) becomes one
    UserError line naming the flag instead of tyro's box. --help prints as tyro prints it."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = tyro.cli(type(default), default=default, args=argv, description=description, prog=program_name())
    except SystemExit as e:
        if e.code in (0, None):  # --help, on stdout
            sys.stderr.write(captured.getvalue())
            raise
        raise UserError(parse_error_line(wide_parse_error(default, argv, description), argv)) from None
    sys.stderr.write(captured.getvalue())  # tyro's warnings, if any
    return args


def program_name() -> str:
    """The program as its user started it, for the help's usage line: `python -m MODULE` for a module run with -m (whose
    sys.argv[0] is its file's absolute path), else sys.argv[0]'s file name (a script, or a console script: lmhp-label)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("lm_human_preference_details."):
        return f"python -m {spec.name.removesuffix('.__main__')}"
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "lmhp"


def wide_parse_error(default: object, argv: list[str], description: str) -> str:
    """tyro's parse error for ``argv`` as it prints it, its box drawn wide enough that no line wraps (rich takes the
    width from $COLUMNS): parsed again, since parsing is cheap and the help must keep the terminal's width."""
    out, columns = io.StringIO(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100000"
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
            tyro.cli(type(default), default=default, args=argv, description=description, prog=program_name())
    except SystemExit:
        pass
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return out.getvalue()


def parse_error_line(box: str, argv: list[str]) -> str:
    """tyro's boxed parse error -> one line: its message, the flags it suggests, and where --help is."""
    sections, current = [], []
    for line in box.splitlines():
        text = line.strip().strip("│╭╮╰╯").strip()
        if text and set(text) <= set("-─━═╌"):  # a rule between sections
            sections.append(current)
            current = []
        elif text:
            current.append(text)
    sections.append(current)
    sections = [s for s in sections if s]
    message = " ".join(sections[1] if len(sections) > 1 else sections[0] if sections else ["cannot parse the command line"])
    unknown = re.match(r"Unrecognized options: (.*)", message)
    if unknown:
        tokens = unknown.group(1).split(", ")
        message = f"unrecognized options: {', '.join(name_unknown(t, argv, tokens) for t in tokens)}"
    message = re.sub(r"^Error parsing (\S+): no type matching (\S+) could be instantiated from \[(.*?)\]\..*",
                     r"cannot parse \1: expected \2, got \3", message)
    message = re.sub(r"^Error parsing (\S+): ", r"cannot parse \1: ", message)
    message = re.sub(r"^Missing value for argument '(\S+)'\. Expected (\d+) values?\.", r"\1 is missing its value",
                     message)
    hints = []
    for section in sections[2:]:
        if section[0].startswith("Perhaps you meant"):
            hints = [line.split()[0] for line in section[1:] if line.startswith("-")]
    help_line = next((line for s in sections for line in s if line.startswith("For full helptext")), "")
    where = re.search(r"(?:run|see) (.*--help)", help_line)
    return (message + (f"; perhaps you meant {' or '.join(hints)}" if hints else "")
            + (f"; run {where.group(1)} for every flag" if where else ""))


def name_unknown(token: str, argv: list[str], unknown: list[str]) -> str:
    """An unrecognized token of ``argv``, with the flag it was given to when that flag takes no value (--track yes)."""
    for i, a in enumerate(argv):
        if a.startswith("--") and a.endswith(f"={token}"):
            return f"{a} ({a.split('=')[0]} takes no value)"
        if a == token and i > 0 and argv[i - 1].startswith("--") and argv[i - 1] not in unknown and token[0] != "-":
            return f"{token} (after {argv[i - 1]}, which takes no value)"
    return token


def run_script(build_args: Callable[[str], Any], train: Callable[[Any], T], doc: str, argv: list[str] | None) -> T:
    """Both scripts' main(): parse --task and the flags (the first line of ``doc`` is the help's title), check them all,
    train, and leave torchrun's process group at the end of a run that succeeded or whose failure all processes agreed."""
    try:
        result = train(parse_args(build_args, doc.split("\n")[0], argv).finalize())
    except (JobFailed, Stopped):  # agreed by every process: none waits in a collective any more
        shutdown_distributed()
        raise
    shutdown_distributed()  # not after another failure: a peer may still wait in a collective (docs/ranks.md)
    return result
