"""Progress: bars that stay readable in a log file, prints that leave a live bar intact, and the points a run passes.

On a terminal, `progress` is a plain tqdm bar redrawn in place. When stderr is not a terminal (a Slurm log,
`docker logs`, `2> run.log`), tqdm's in-place redraws would pile up as one endless line of carriage returns;
there the bar is written as whole lines instead, one every ~5% of the work (or every minute when the total is
unknown). Bars never touch a random generator or the order of any computation: they only count.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Iterable, Optional

from tqdm import tqdm

PASSED = "lm_human_preference_details.passed"  # the audit event (PEP 578) of `passed`
LOG_STEP = 0.05  # the share of the work between two lines of a bar in a log file
LOG_INTERVAL = 60.0  # seconds between two lines of a bar of unknown total in a log file


class _Lines:
    """A file for tqdm that turns each redraw ('\\r' + the bar) into one whole line; blank clears and repeats are dropped."""

    def __init__(self, stream):
        self.stream, self.last = stream, None

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", None)

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        # without the bar's blocks (their width follows the rate's text), the times and rate: tqdm redraws the final
        # count on close
        count = re.sub(r"\|[^|]*\|", "|", line).rsplit(" [", 1)[0]
        if line and count != self.last:
            self.stream.write(line + "\n")
            self.last = count

    def flush(self) -> None:
        self.stream.flush()


def progress(iterable: Optional[Iterable] = None, total: Optional[float] = None, desc: Optional[str] = None,
             **kwargs) -> tqdm:
    """A tqdm bar on stderr: redrawn in place on a terminal, a line per ~5% of ``total`` in a log file.

    ``kwargs`` go to tqdm (unit, unit_scale, leave, disable, ...). Print beside a live bar with `write_above_progress`.
    """
    stream = kwargs.pop("file", sys.stderr)
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    if not stream.isatty():
        if total:
            kwargs.setdefault("miniters", max(1, math.ceil(total * LOG_STEP)))
            kwargs.setdefault("mininterval", 0)
        else:
            kwargs.setdefault("mininterval", LOG_INTERVAL)
        kwargs.setdefault("maxinterval", math.inf)  # else tqdm's monitor drops miniters to 1 after a 10 s step
        kwargs.setdefault("ncols", 100)
        stream = _Lines(stream)
    return tqdm(iterable, total=total, desc=desc, file=stream, **kwargs)


def write_above_progress(text: str, file=None) -> None:
    """Print ``text`` (stdout by default) without breaking a live bar: on a terminal the bar is cleared and redrawn
    below it; in a log file every bar line is whole already, so the text gets lines of its own."""
    tqdm.write(text, file=file)


def passed(point: str) -> None:
    """Announce that the run passed ``point`` ("update 3", "checkpoint-writing 3") as a `sys.audit` event: free when
    nothing listens, as in a run of ours; a test's audit hook stops the process there to kill or signal it at exactly
    that point, never after a guessed time."""
    sys.audit(PASSED, point)
