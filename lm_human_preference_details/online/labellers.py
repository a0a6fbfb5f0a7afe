"""Who labels the online collection's requests (collection.py): one interface, asynchronous where the labeller is.

    submit(requests, record, stop)
                               hand over requests (answers.Request); each answer is passed to ``record`` (which
                               makes it durable) with its labeller's name before it is handed back; a labeller that
                               answers at length looks at ``stop`` (the run's stop signal, or None)
    poll(timeout)              -> the [(request, answer, labeller)] given since the last poll, waiting up to ``timeout``
                               seconds for one; an answer is the index of the best of the four samples, or None
                               (skipped); labeller the name of who gave it (gold: "gold"; command: --online.labeller-name;
                               page: the name the person gave the page)
    waiting_for()              -> where PPO's labels come from, for the line the run prints while it waits
    close()                    stop what the labeller started

gold and command answer each request as it is submitted (`AnswersAtOnce`); the page (`PageLabeller`, page.py) answers as
people label.

    gold      a task's gold scorer (the offline task's: offline/task.py): the sample with the highest gold score, ties to
              the first, exactly as the offline task's label file was made (offline/pretrain.py make_labels)
    command   a program of the user's (a judge model, a script): one JSON request a line on its standard input, one
              answer a line on its standard output: the request's id, then the best index (0-3) or `skip`
              (docs/online.md)
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import selectors
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from lm_human_preference_details.online.answers import Request
from lm_human_preference_details.online.page import PageLabeller
from lm_human_preference_details.utils.errors import Stopped, UserError


class AnswersAtOnce:
    """A labeller that answers every request as it is submitted: its subclass's `label(queries, samples)`."""

    ready: tuple = ()  # [(request, answer, labeller)] answered since the last poll
    name: str  # the labeller's name, recorded with each of its answers

    def submit(self, requests: list[Request], record: Callable[[Request, Optional[int], str], None],
               stop: Callable[[], Optional[int]] = lambda: None) -> None:
        queries = torch.tensor([r.query for r in requests])  # [b, query_length]
        samples = torch.tensor([r.samples for r in requests])  # [b, 4, response_length]
        for request, best in zip(requests, self.label(queries, samples)):
            self.answered(request, best, record)

    def answered(self, request: Request, best: Optional[int],
                 record: Callable[[Request, Optional[int], str], None]) -> None:
        record(request, best, self.name)
        self.ready = (*self.ready, (request, best, self.name))

    def poll(self, timeout: float = 0.0) -> list[tuple[Request, Optional[int], str]]:
        ready, self.ready = self.ready, ()
        return list(ready)

    def close(self) -> None:
        pass


def split_command(command: str) -> list[str]:
    """--online.command as the program and its arguments (shell-like quoting), or a one-line UserError."""
    try:
        argv = shlex.split(command)
    except ValueError as e:  # an unterminated quote, a lone backslash at the end
        raise UserError(f"--online.command {command!r} cannot be split into a program and its arguments ({e}); quote "
                        "it as a shell would") from None
    if not argv:
        raise UserError("--online.labeller command needs --online.command, the program to run")
    return argv


def program_name(command: str) -> str:
    """The file name of a command's program: its first argument ending in .py (`python judge.py` -> judge.py), else
    the program itself (`./bin/my_judge --fast` -> my_judge); a command labeller's name by default."""
    argv = split_command(command)
    script = next((a for a in argv[1:] if a.endswith(".py")), argv[0])
    return os.path.basename(script) or script


class GoldLabeller(AnswersAtOnce):
    """A programmatic labeller: it answers every request at once."""

    name = "gold"

    def __init__(self, tokenizer, gold_scores: Callable[[object, torch.Tensor], torch.Tensor]):
        self.tokenizer, self.gold_scores = tokenizer, gold_scores

    def label(self, queries: torch.Tensor, samples: torch.Tensor) -> list[Optional[int]]:
        """[b, q] queries, [b, 4, r] truncated and padded samples -> b indices of the best sample."""
        b, n, r = samples.shape
        gold = self.gold_scores(self.tokenizer, samples.reshape(b * n, r)).view(b, n)  # [b, 4]
        return [max(range(n), key=lambda i: (scores[i], -i)) for scores in gold.tolist()]

    def waiting_for(self) -> str:
        return "the gold scorer"


LOOK_S = 0.5  # how often a wait for the program looks at the run's stop
MAX_LINE = 65536  # bytes of an answer line (`ID BEST` takes a few)
ANSWER = re.compile(r"([0-9]{1,18})[ \t]+([0-9]+|skip)", re.ASCII)  # `ID BEST`: ASCII digits only ('²' is no digit)


class CommandLabeller(AnswersAtOnce):
    """The user's program, started once and asked one request at a time; a program that dies, hangs past the
    timeout or answers anything but its request's id and an index or `skip` ends the run with one line (a checkpoint
    resumes it).

    Every answer names its request (``ID BEST``), so an answer is never taken for another request's: a program that
    answers before it reads, or prints a line too many, is refused in one line naming the request, never matched by
    position."""

    def __init__(self, command: str, tokenizer, timeout: float, name: Optional[str] = None):
        """``name``: the labeller's, recorded with each answer (default: the program's file name, `program_name`)."""
        self.command, self.tokenizer, self.timeout = command, tokenizer, timeout
        self.name = name if name is not None else program_name(command)
        self.asked = 0  # the id of the next request: the requests sent to this program so far
        self.buffer = b""  # output read past the last answer line
        self.stop_received: Callable[[], Optional[int]] = lambda: None  # the run's stop, while `submit` asks
        try:
            # a session of its own: its whole process group is ended with the run, and it is not in the terminal's
            # foreground group, so a Ctrl-C is the run's stop alone, never the program's death
            self.process = subprocess.Popen(split_command(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            start_new_session=True)
        except OSError as e:
            raise UserError(f"--online.command {command!r} cannot start ({e.strerror or e}); pass a program that "
                            "runs") from None
        atexit.register(self.close)

    def label(self, queries: torch.Tensor, samples: torch.Tensor) -> list[Optional[int]]:
        """[b, q] queries, [b, 4, r] truncated and padded samples -> b answers (an index, or None: skipped)."""
        return [self.answer(query, four) for query, four in zip(queries.tolist(), samples.tolist())]

    def submit(self, requests: list[Request], record: Callable[[Request, Optional[int], str], None],
               stop: Callable[[], Optional[int]] = lambda: None) -> None:
        """Each request asked in turn, its answer recorded as it comes (a kill loses none the program gave); a wait for
        the program ends at ``stop`` (the run's)."""
        self.stop_received = stop
        for request in requests:
            self.answered(request, self.answer(request.query, request.samples), record)

    def answer(self, query: list[int], four: list[list[int]]) -> Optional[int]:
        """One request asked: the query and its four samples as texts and tokens, without pads."""
        pad = self.tokenizer.pad_token_id
        query = [t for t in query if t != pad]
        responses = [[t for t in s if t != pad] for s in four]
        request = {"id": self.asked, "query": self.tokenizer.decode(query), "query_tokens": query,
                   "responses": [self.tokenizer.decode(s) for s in responses], "response_tokens": responses}
        return self.ask(request, len(four))

    def waiting_for(self) -> str:
        return f"--online.command {self.command!r}"

    def ask(self, request: dict, n: int) -> Optional[int]:
        """Send one request, read its answer line within the timeout."""
        where = f"--online.command {self.command!r}, request {request['id']}"
        if early := self.output_before_asked():
            raise UserError(f"{where}: the program printed {early[:60]!r} before the request was sent, an answer for no "
                            f"open request; answer each request once, after reading it, as `ID BEST`; fix the "
                            "program, then --resume the run")
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self.failed(where, "closed its input before the request was sent") from None
        line = self.read_line(where)
        self.asked += 1
        return parse_answer(line, request["id"], n, where)

    def output_before_asked(self) -> str:
        """A line the program printed before the next request was sent (no request is open then): '' if none."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while b"\n" not in self.buffer and selector.select(timeout=0):
                chunk = os.read(self.process.stdout.fileno(), 65536)
                if not chunk:
                    break
                self.buffer += chunk
        return self.buffer.split(b"\n", 1)[0].decode("utf-8", errors="replace") if b"\n" in self.buffer else ""

    def read_line(self, where: str) -> str:
        """The program's next line of output, or a UserError when it exits, closes its output, stays silent past the
        timeout (counted from the request to the newline) or prints more than MAX_LINE bytes without a newline;
        Stopped when the run receives a stop signal meanwhile (looked at every LOOK_S)."""
        deadline = time.monotonic() + self.timeout
        poll = select.poll()
        poll.register(self.process.stdout, select.POLLIN)
        poll.register(self.process.stdin, 0)  # no event asked: POLLERR alone, once the program closes its input
        while b"\n" not in self.buffer:
            self.check_stop(where)
            left = deadline - time.monotonic()
            if left <= 0:
                self.close(grace=0)  # a program that hangs is not waited for again
                raise UserError(f"{where}: no answer within {self.timeout:g} s (--online.timeout); fix the program or "
                                "raise --online.timeout, then --resume the run")
            events = dict(poll.poll(min(left, LOOK_S) * 1000))
            if not events.get(self.process.stdout.fileno(), 0) & (select.POLLIN | select.POLLHUP):
                if events.get(self.process.stdin.fileno()):
                    raise self.failed(where, "closed its input")
                continue
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                raise self.failed(where, "closed its output")
            self.buffer += chunk
            if b"\n" not in self.buffer and len(self.buffer) > MAX_LINE:
                self.close(grace=0)
                raise UserError(f"{where}: printed more than {MAX_LINE} bytes without a newline; an answer is one short "
                                "line `ID BEST`; fix the program, then --resume the run")
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8", errors="replace")

    def check_stop(self, where: str) -> None:
        """Stopped at once when the run has received a stop signal (the program is ended: --resume asks it again)."""
        if (signum := self.stop_received()) is not None:
            self.close(grace=0)
            raise Stopped(f"stopped by {signal.Signals(signum).name} while {where} was asked; every answer given is "
                          "kept (online/answers.jsonl): --resume continues", signum)

    def failed(self, where: str, what: str) -> UserError:
        """The program ``what`` ("closed its output", "closed its input"): it exited, or it stays and is ended now; a
        stop signal the run received meanwhile (a Ctrl-C, scancel's SIGTERM to the job) is the run's stop, said as a
        stop, not the program's failure."""
        try:
            how = f"exited (status {self.process.wait(timeout=LOOK_S)})"
        except subprocess.TimeoutExpired:
            how = f"{what} and kept running; it was ended"
        self.close(grace=0)
        self.check_stop(where)
        return UserError(f"{where}: the program {how} without an answer; fix it, then --resume the run")

    def close(self, grace: float = 5.0) -> None:
        """End the program this labeller started: its input closed, then its whole process group killed if it has not
        exited within ``grace`` seconds (and whatever it left in its group, after it exited)."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=grace)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its group: a wrapper's children too
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()


def parse_answer(line: str, open_id: int, n: int, where: str) -> Optional[int]:
    """The program's answer line to the open request ``open_id`` -> the best index (0..n-1), or None (skip); a
    UserError for anything else: another request's id (asked before: a second answer; not yet asked: an answer for no
    open request), no id, or an answer that is not an index or skip."""
    text = line.strip()
    match = ANSWER.fullmatch(text)
    if match is None:
        raise UserError(f"{where}: answered {text[:60]!r}; an answer is one line `ID BEST`: the request's id, then the "
                        f"best index 0-{n - 1} or skip; fix the program, then --resume the run")
    answer_id, best = int(match[1]), match[2]
    if answer_id != open_id:
        what = f"a second answer to request {answer_id}" if answer_id < open_id else \
            f"an answer for request {answer_id}, which is not open"
        raise UserError(f"{where}: answered {text[:60]!r}, {what}; answer each request once, after reading it, with "
                        "its own id; fix the program, then --resume the run")
    if best == "skip":
        return None
    if len(best) == 1 and int(best) < n:
        return int(best)
    raise UserError(f"{where}: answered {text[:60]!r}; the best index is 0-{n - 1} (or skip); fix the program, then "
                    "--resume the run")


# ---------------------------------------------------------------------------------------------------- the page
def make_labeller(online, tokenizer, task, task_hparams, directory: Path):
    """The labeller --online.labeller names (``online``: OnlineHParams, checked) for ``task`` (a tasks.Task; its
    hparams, ``task_hparams``, for the texts the page shows); ``directory``: RUN/online, where answers are recorded."""
    if online.labeller == "gold":
        return GoldLabeller(tokenizer, task.gold_scores)
    if online.labeller == "page":
        return PageLabeller(online.host, online.port, tokenizer, task_hparams, directory / "answers.jsonl")
    return CommandLabeller(online.command, tokenizer, online.timeout, online.labeller_name)
