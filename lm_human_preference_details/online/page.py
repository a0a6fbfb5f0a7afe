"""The page labeller: the labelling page (labelling/server.py's server and checks, labelling/session.py's leases)
served from the training run itself, on a thread, over the requests as the run makes them.

A choice is recorded durably (the ``record`` the run gave: answers.AnswerRecord, fsynced) before the page is told it is
saved; several tabs label at once, each shown a request no other live tab is shown, and a request answered by one tab
is refused to the others. A choice is final: the run may have trained on it, so the page offers no undo.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from lm_human_preference_details.labelling.journal import ANONYMOUS
from lm_human_preference_details.labelling.server import LabelServer, who_can_reach
from lm_human_preference_details.labelling.session import PageItems
from lm_human_preference_details.language.tokenizer import decode
from lm_human_preference_details.online.answers import Request

FLAGS = ("--online.host", "--online.port")
IDLE = ("No request is open now: the run is sampling new ones, training, or has ended. This page looks for new "
        "requests every 10 s.")


def check_can_serve(host: str, port: int) -> None:
    """A one-line UserError unless the page can be served on ``host``:``port`` (checked with the flags; the run binds
    it again when it starts)."""
    LabelServer(host, port, FLAGS).server_close()


class OnlineSession(PageItems):
    """The requests the page shows and their answers, for labelling/server.py's handler (its session interface); thread-safe.

    ``record`` makes an answer durable; it is called, under the lock, before a choice counts or the page hears of it."""

    requests_named = True  # a page from before a resume shows indices that may now name other requests

    def __init__(self, tokenizer, task, record_path) -> None:
        self.tokenizer, self.task = tokenizer, task
        self.output = record_path  # where the answers go: the page names its directory when a disk is full
        self.items: list[dict] = []  # each request as the page shows it, with the request
        self.answers: dict[int, Optional[int]] = {}  # item -> best, None: skipped
        self.ready: list[tuple[Request, Optional[int], str]] = []  # answered since the run last asked, and by whom
        self.record: Callable[[Request, Optional[int], str], None] = lambda request, best, labeller: None
        super().__init__()
        self.answered = threading.Condition(self.lock)

    def add(self, requests: list[Request], record: Callable[[Request, Optional[int], str], None]) -> None:
        texts = [(self.task.query_prefix + decode(self.tokenizer, r.query) + self.task.query_suffix,
                  [decode(self.tokenizer, s) for s in r.samples]) for r in requests]  # decoded outside the lock
        with self.lock:
            self.record = record
            self.items.extend({"request": r, "query_text": q, "sample_texts": s} for r, (q, s) in zip(requests, texts))

    def take(self, timeout: float) -> list[tuple[Request, Optional[int], str]]:
        """The answers given since the last call, waiting up to ``timeout`` seconds for one."""
        with self.answered:
            if not self.ready and timeout > 0:
                self.answered.wait(timeout)
            ready, self.ready = self.ready, []
            return ready

    # ------------------------------------------------------------------ what the page asks (server.PageHandler)
    def label(self, client: str, item: int, best: int, labeller: str = ANONYMOUS) -> tuple[bool, dict]:
        return self._answer(client, item, best, labeller)

    def skip(self, client: str, item: int, labeller: str = ANONYMOUS) -> tuple[bool, dict]:
        return self._answer(client, item, None, labeller)

    def undo(self, client: str, labeller: str = ANONYMOUS) -> tuple[bool, dict]:
        """Never: the run may have trained on the choice already."""
        with self.lock:
            return False, self._state(client, labeller)

    # ------------------------------------------------------------------ inside the lock
    def _answer(self, client: str, item: int, best: Optional[int], labeller: str) -> tuple[bool, dict]:
        """Record ``labeller``'s answer (in tab ``client``) to ``item`` -> (recorded, state); refused when the item is
        answered already (each request is asked once)."""
        with self.lock:
            if item >= len(self.items) or item in self.answers:
                return False, self._state(client, labeller)
            request = self.items[item]["request"]
            self.record(request, best, labeller)  # durable first: an OSError here answers "not kept", nothing counts it
            self.answers[item] = best
            self.ready.append((request, best, labeller))
            self.leases.release(client)
            self.answered.notify_all()
            return True, self._state(client, labeller)

    def _request_id(self, i: int) -> str:
        request = self.items[i]["request"]
        return f"{request.key}:{request.digest[:16]}"

    def _is_open(self, item: int, labeller: str) -> bool:
        return item not in self.answers

    def _still_wanted(self, item: int) -> int:
        return int(item not in self.answers)

    def _state(self, client: str, labeller: str) -> dict:
        skipped = sum(best is None for best in self.answers.values())
        item = self._next_item(client, labeller)
        return {"item": item, "labelled": len(self.answers) - skipped, "skipped": skipped,
                "leased": self._leased(client, labeller),
                "total": len(self.items), "can_undo": False, "output": str(self.output),
                "message": None if item else IDLE}


class PageLabeller:
    """The page served on a thread of the run from its start to its end."""

    def __init__(self, host: str, port: int, tokenizer, task, record_path) -> None:
        self.session = OnlineSession(tokenizer, task, record_path)
        self.server = LabelServer(host, port, FLAGS)
        self.server.show(self.session)
        self.host = host
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="labelling page", daemon=True)
        self.thread.start()

    def submit(self, requests: list[Request], record: Callable[[Request, Optional[int], str], None],
               stop: Callable[[], Optional[int]] = lambda: None) -> None:
        self.session.add(requests, record)  # people answer as they come: nothing here waits, so ``stop`` is not asked

    def poll(self, timeout: float = 0.0) -> list[tuple[Request, Optional[int], str]]:
        return self.session.take(timeout)

    def waiting_for(self) -> str:
        return f"the labelling page: open {self.server.url()} ({who_can_reach(self.host)})"

    def close(self) -> None:
        """Stop serving: the page's next call finds no server."""
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()
