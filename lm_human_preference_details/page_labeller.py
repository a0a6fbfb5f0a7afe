"""The `page` labeller of the online collection (labellers.py's interface): the labelling page (label.py's server,
handler, Host/Origin checks and page; label_session.py's leases) served from the training run itself, on a thread,
over the requests as the run makes them.

A choice is recorded durably (the record the run was given, online_answers.AnswerLog: fsynced) before the page is told
it is saved; several tabs label at once, each shown a request no other live tab is shown, and a request answered by
one tab is refused to the others. A choice is final: the run may have trained on it, so the page offers no undo.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from lm_human_preference_details.label import LabelServer, who_can_reach
from lm_human_preference_details.label_session import Leases
from lm_human_preference_details.online_answers import Request
from lm_human_preference_details.tokenizer import decode

FLAGS = ("--online.host", "--online.port")
IDLE = ("No request is open now: the run is sampling new ones, training, or has ended. This page looks for new "
        "requests every few seconds.")


def check_can_serve(host: str, port: int) -> None:
    """A one-line UserError unless the page can be served on ``host``:``port`` (checked with the flags; the run binds
    it again when it starts)."""
    LabelServer(host, port, FLAGS).server_close()


class OnlineSession:
    """The requests the page shows and their answers, for label.py's handler (its session interface); thread-safe.

    ``record`` makes an answer durable; it is called, under the lock, before a choice counts or the page hears of it."""

    def __init__(self, tokenizer, task, record_path) -> None:
        self.tokenizer, self.task = tokenizer, task
        self.output = record_path  # where the answers go: the page names its directory when a disk is full
        self.items: list[dict] = []  # each request as the page shows it, with the request
        self.answers: dict[int, Optional[int]] = {}  # item -> best, None: skipped
        self.ready: list[tuple[Request, Optional[int]]] = []  # answered since the run last asked
        self.record: Callable[[Request, Optional[int]], None] = lambda request, best: None
        self.leases = Leases()
        self.lock = threading.Lock()
        self.answered = threading.Condition(self.lock)

    def add(self, requests: list[Request], record: Callable[[Request, Optional[int]], None]) -> None:
        texts = [(self.task.query_prefix + decode(self.tokenizer, r.query) + self.task.query_suffix,
                  [decode(self.tokenizer, s) for s in r.samples]) for r in requests]  # decoded outside the lock
        with self.lock:
            self.record = record
            self.items.extend({"request": r, "query_text": q, "sample_texts": s} for r, (q, s) in zip(requests, texts))

    def take(self, timeout: float) -> list[tuple[Request, Optional[int]]]:
        """The answers given since the last call, waiting up to ``timeout`` seconds for one."""
        with self.answered:
            if not self.ready and timeout > 0:
                self.answered.wait(timeout)
            ready, self.ready = self.ready, []
            return ready

    def counts(self) -> tuple[int, int]:
        """(labels, skips) given on the page."""
        with self.lock:
            skipped = sum(best is None for best in self.answers.values())
            return len(self.answers) - skipped, skipped

    # ------------------------------------------------------------------ what the page asks (label.PageHandler)
    def state(self, client: str) -> dict:
        with self.lock:
            return self._state(client)

    def alive(self, client: str) -> None:
        with self.lock:
            self.leases.renew(client)

    def release(self, client: str) -> None:
        with self.lock:
            self.leases.release(client)

    def label(self, client: str, item: int, best: int) -> tuple[bool, dict]:
        return self._answer(client, item, best)

    def skip(self, client: str, item: int) -> tuple[bool, dict]:
        return self._answer(client, item, None)

    def undo(self, client: str) -> tuple[bool, dict]:
        """Never: the run may have trained on the choice already."""
        with self.lock:
            return False, self._state(client)

    # ------------------------------------------------------------------ inside the lock
    def _answer(self, client: str, item: int, best: Optional[int]) -> tuple[bool, dict]:
        """Record ``client``'s answer to ``item`` -> (recorded, state); refused when the item is answered already."""
        with self.lock:
            if item >= len(self.items) or item in self.answers:
                return False, self._state(client)
            request = self.items[item]["request"]
            self.record(request, best)  # durable first: an OSError here answers "not kept", and nothing counts it
            self.answers[item] = best
            self.ready.append((request, best))
            self.leases.release(client)
            self.answered.notify_all()
            return True, self._state(client)

    def _is_open(self, item: int) -> bool:
        return item not in self.answers

    def _next_item(self, client: str) -> Optional[int]:
        """The item this client holds if still open, else the first open item no live tab holds."""
        mine = self.leases.mine(client)
        if mine is not None and self._is_open(mine):
            self.leases.renew(client)
            return mine
        taken = self.leases.others(client, self._is_open)
        for i in range(len(self.items)):
            if self._is_open(i) and i not in taken:
                self.leases.hold(client, i)
                return i
        self.leases.release(client)
        return None

    def _state(self, client: str) -> dict:
        i = self._next_item(client)
        item = None if i is None else {"index": i, "query": self.items[i]["query_text"],
                                       "samples": self.items[i]["sample_texts"]}
        skipped = sum(best is None for best in self.answers.values())
        return {"item": item, "labelled": len(self.answers) - skipped, "skipped": skipped,
                "leased": len(self.leases.others(client, self._is_open)), "total": len(self.items), "can_undo": False,
                "output": str(self.output), "message": None if item else IDLE}


class PageLabeller:
    """The page served on a thread of the run from its start to its end."""

    def __init__(self, host: str, port: int, tokenizer, task, record_path) -> None:
        self.session = OnlineSession(tokenizer, task, record_path)
        self.server = LabelServer(host, port, FLAGS)
        self.server.session = self.session
        self.host = host
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="labelling page", daemon=True)
        self.thread.start()

    def submit(self, requests: list[Request], record: Callable[[Request, Optional[int]], None]) -> None:
        self.session.add(requests, record)

    def poll(self, timeout: float = 0.0) -> list[tuple[Request, Optional[int]]]:
        return self.session.take(timeout)

    def waiting_for(self) -> str:
        return f"the labelling page: open {self.server.url()} ({who_can_reach(self.host)})"

    def close(self) -> None:
        """Stop serving: the page's next call finds no server."""
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()
