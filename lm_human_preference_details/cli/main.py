"""A script's entry, both scripts' main(): parse --task and the flags, check them all, train, and leave torchrun's
process group. The process's one line and exit status on a failure are errors.run_main's, which wraps it."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from lm_human_preference_details.cli.parsing import parse_args
from lm_human_preference_details.ranks.emulated import shutdown_distributed
from lm_human_preference_details.utils.errors import JobFailed, Stopped

T = TypeVar("T")


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
