"""Who labels the online collection's requests (online.py): one interface, asynchronous where the labeller is.

    submit(requests, record)   hand over requests (online_answers.Request); each answer is passed to ``record`` (which
                               makes it durable) before it is handed back
    poll(timeout)              -> the [(request, answer)] given since the last poll, waiting up to ``timeout`` seconds
                               for one; an answer is the index of the best of the four samples, or None (skipped)
    waiting_for()              -> where PPO's labels come from, for the line the run prints while it waits
    close()                    stop what the labeller started

gold and command answer each request as it is submitted (`AnswersAtOnce`); the page (page_labeller.py) answers as
people label.

    gold      a task's gold scorer (the offline task's: offline.py): the sample with the highest gold score, ties to
              the first, exactly as the offline task's label file was made (offline.make_labels)
    command   a program of the user's (a judge model, a script): one JSON request a line on its standard input, one
              answer a line on its standard output: the best index (0-3) or `skip` (docs/online.md)
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shlex
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from lm_human_preference_details.errors import UserError
from lm_human_preference_details.online_answers import Request
from lm_human_preference_details.page_labeller import PageLabeller


class AnswersAtOnce:
    """A labeller that answers every request as it is submitted: its subclass's `label(queries, samples)`."""

    ready: tuple = ()  # [(request, answer)] answered since the last poll

    def submit(self, requests: list[Request], record: Callable[[Request, Optional[int]], None]) -> None:
        queries = torch.tensor([r.query for r in requests])  # [b, query_length]
        samples = torch.tensor([r.samples for r in requests])  # [b, 4, response_length]
        for request, best in zip(requests, self.label(queries, samples)):
            self.answered(request, best, record)

    def answered(self, request: Request, best: Optional[int], record: Callable[[Request, Optional[int]], None]) -> None:
        record(request, best)
        self.ready = (*self.ready, (request, best))

    def poll(self, timeout: float = 0.0) -> list[tuple[Request, Optional[int]]]:
        ready, self.ready = self.ready, ()
        return list(ready)

    def close(self) -> None:
        pass


class GoldLabeller(AnswersAtOnce):
    """A programmatic labeller: it answers every request at once."""

    def __init__(self, tokenizer, gold_scores: Callable[[object, torch.Tensor], torch.Tensor]):
        self.tokenizer, self.gold_scores = tokenizer, gold_scores

    def label(self, queries: torch.Tensor, samples: torch.Tensor) -> list[Optional[int]]:
        """[b, q] queries, [b, 4, r] truncated and padded samples -> b indices of the best sample."""
        b, n, r = samples.shape
        gold = self.gold_scores(self.tokenizer, samples.reshape(b * n, r)).view(b, n)  # [b, 4]
        return [max(range(n), key=lambda i: (scores[i], -i)) for scores in gold.tolist()]

    def waiting_for(self) -> str:
        return "the gold scorer"


class CommandLabeller(AnswersAtOnce):
    """The user's program, started once and asked one request at a time; a program that dies, hangs past the
    timeout or answers anything but an index or `skip` ends the run with one line (a checkpoint resumes it)."""

    def __init__(self, command: str, tokenizer, timeout: float):
        self.command, self.tokenizer, self.timeout = command, tokenizer, timeout
        self.asked = 0
        self.buffer = b""  # output read past the last answer line
        try:
            self.process = subprocess.Popen(shlex.split(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as e:
            raise UserError(f"--online.command {command!r} cannot start ({e.strerror or e}); pass a program that "
                            "runs") from None
        atexit.register(self.close)

    def label(self, queries: torch.Tensor, samples: torch.Tensor) -> list[Optional[int]]:
        """[b, q] queries, [b, 4, r] truncated and padded samples -> b answers (an index, or None: skipped)."""
        return [self.answer(query, four) for query, four in zip(queries.tolist(), samples.tolist())]

    def submit(self, requests: list[Request], record: Callable[[Request, Optional[int]], None]) -> None:
        """Each request asked in turn, its answer recorded as it comes (a kill loses none the program gave)."""
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
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise UserError(f"{where}: the program has exited (status {self.process.wait()}); fix it, then --resume "
                            "the run") from None
        line = self.read_line(where)
        self.asked += 1
        answer = line.strip()
        if answer == "skip":
            return None
        if answer.isdigit() and int(answer) < n:
            return int(answer)
        raise UserError(f"{where}: answered {answer[:60]!r}; an answer is the best index 0-{n - 1} or skip, one a line; "
                        "fix the program, then --resume the run")

    def read_line(self, where: str) -> str:
        """The program's next line of output, or a UserError when it exits or stays silent past the timeout."""
        deadline = time.monotonic() + self.timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    self.close(grace=0)  # a program that hangs is not waited for again
                    raise UserError(f"{where}: no answer within {self.timeout:g} s (--online.timeout); fix the "
                                    "program or raise --online.timeout, then --resume the run")
                chunk = os.read(self.process.stdout.fileno(), 65536)
                if not chunk:
                    raise UserError(f"{where}: the program exited (status {self.process.wait()}) without an answer; "
                                    "fix it, then --resume the run")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8", errors="replace")

    def close(self, grace: float = 5.0) -> None:
        """End the program this labeller started: its input closed, then killed if it has not exited within
        ``grace`` seconds."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=grace)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


def make_labeller(online, tokenizer, task, task_hparams, directory: Path):
    """The labeller --online.labeller names (``online``: OnlineHParams, checked) for ``task`` (a tasks.Task; its
    hparams, ``task_hparams``, for the texts the page shows); ``directory``: RUN/online, where answers are recorded."""
    if online.labeller == "gold":
        return GoldLabeller(tokenizer, task.gold_scores)
    if online.labeller == "page":
        return PageLabeller(online.host, online.port, tokenizer, task_hparams, directory / "answers.jsonl")
    return CommandLabeller(online.command, tokenizer, online.timeout)
