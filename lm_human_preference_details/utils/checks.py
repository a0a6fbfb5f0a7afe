"""The checks of a flag's value, each a one-line UserError, and the paths a flag names. The run options themselves
(RunArgs) are run_args.py's; parsing argv, parsing.py's; the device, devices.py's."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import cannot_write_in


def check_at_least(flag: str, value: float, minimum: float, what: str) -> None:
    """A one-line UserError naming ``flag`` unless ``value`` >= ``minimum`` (``what`` says what the flag counts)."""
    if not value >= minimum:  # also catches NaN
        raise UserError(f"{flag} is {value}, but it is {what} and must be at least {minimum}; pass {flag} {minimum} or more")


def check_positive(flag: str, value: float, what: str) -> None:
    """A one-line UserError naming ``flag`` unless ``value`` is a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{flag} is {value}, but it is {what} and must be a finite number > 0; pass a positive {flag}")


def check_in_range(flag: str, value: float, low: float, high: float, what: str, low_open: bool = False) -> None:
    """A one-line UserError naming ``flag`` unless ``low`` <= ``value`` <= ``high`` (``low`` < ``value`` if
    ``low_open``)."""
    if not ((value > low if low_open else value >= low) and value <= high):  # also catches NaN
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise UserError(f"{flag} is {value}, but it is {what} and must lie in {interval}; pass {flag} in {interval}")


def expand_home(path: Optional[str]) -> Optional[str]:
    """A path flag as the user meant it, resolved once when the flags are parsed: a leading ``~`` or ``~user`` is that
    home directory, also where the shell left it as typed (``--output-dir=~/runs``). Every check and every write then
    uses the returned value. Hub model names, oai:NAME and URLs never start with ``~``."""
    return os.path.expanduser(path) if path and path.startswith("~") else path


def check_output_dir(path: str, flag: str = "--output-dir") -> None:
    """``flag`` names a directory, or one that can be made: not a file, not under a file, not a link to nowhere,
    writable, named in UTF-8. ``path`` is the flag's value after `expand_home`. Writes nothing."""
    target = Path(path).absolute()
    check_utf8_path(flag, target)
    if target.exists() and not target.is_dir():
        raise UserError(f"{flag} {path} is a file; pass a directory (it is made if missing)")
    existing = target
    while not existing.exists():
        if existing.is_symlink():  # a link to nowhere: making the directory would fail, or write where it points
            raise UserError(f"{flag} {path}: {existing} is a symbolic link to {os.readlink(existing)}, which does not "
                            "exist; pass a directory path without a dangling link")
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {path} lies under the file {existing}; pass a directory path with no file in it")
    if (why := cannot_write_in(existing)) is not None:
        raise UserError(f"{flag} {path} cannot be written (making a directory in {existing} failed: {why}); pass a "
                        "writable directory")


def check_utf8_path(flag: str, path: Path, why: str = "config.json, TensorBoard and W&B store the path as text") -> None:
    """A one-line UserError unless ``path`` is UTF-8 text: a name made of other bytes (Python holds them as surrogates)
    cannot be written into files that hold it as text (``why``: which), such as a run's config.json, TensorBoard's
    event files and W&B."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")  # the bytes that are not UTF-8 as \xNN
        raise UserError(f"{flag} {shown} is not UTF-8 text ({why}); pass a path whose name is UTF-8") from None
