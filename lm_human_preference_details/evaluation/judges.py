"""Who labels an evaluation's items, each label written to the session's journal as it is given (labelling/session.py),
so that a stopped evaluation continues where it stood: the task's gold scorer, the user's program (the online
collection's `ID BEST` protocol, labellers.CommandLabeller) or people on the labelling page (labelling/server.py).

Programs are asked for the labels each item still wants, K of them under the names NAME#1..NAME#K (one name when K is
1); people give the page their names, and an item is shown to K different people.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import torch

from lm_human_preference_details.label_format import OAI_PAD
from lm_human_preference_details.labelling.server import LabelServer, who_can_reach
from lm_human_preference_details.labelling.session import LabelSession
from lm_human_preference_details.online.labellers import CommandLabeller
from lm_human_preference_details.utils.errors import Interrupted
from lm_human_preference_details.utils.progress import progress

CLIENT = "evaluate"  # the journal's tab for labels a program gave
WAIT_S = 0.5  # how often the page's evaluation looks whether every item has its labels


def names(name: str, k: int) -> list[str]:
    """The K labellers a program stands for: NAME#1..NAME#K, or NAME alone when K is 1."""
    return [name] if k == 1 else [f"{name}#{i}" for i in range(1, k + 1)]


def untokens(tokens: list[int], pad_id: int) -> list[int]:
    """An item's tokens (OpenAI's pads 50259) with the tokenizer's pad, as the labellers read them."""
    return [pad_id if t == OAI_PAD else t for t in tokens]


def gold_answer(gold_scores: Callable, tokenizer) -> Callable[[dict], Optional[int]]:
    """The gold scorer as a labeller of two responses: the side with the higher gold score; None (a skip) when both
    score the same, so that a tie never favours the left one."""

    def answer(item: dict) -> Optional[int]:
        samples = torch.tensor([untokens(s, tokenizer.pad_token_id) for s in item["samples"]])  # [2, response_length]
        left, right = gold_scores(tokenizer, samples).tolist()
        return None if left == right else 0 if left > right else 1

    return answer


def command_answer(command: str, tokenizer, timeout: float, name: str) -> tuple[Callable[[dict], Optional[int]],
                                                                               CommandLabeller]:
    """The user's program as a labeller of two responses: one request a line, `ID BEST` (0 left, 1 right) or
    `ID skip` back."""
    labeller = CommandLabeller(command, tokenizer, timeout, name)

    def answer(item: dict) -> Optional[int]:
        pad = tokenizer.pad_token_id
        return labeller.answer(untokens(item["query"], pad), [untokens(s, pad) for s in item["samples"]])

    return answer, labeller


def label_by_program(session: LabelSession, labellers: list[str], answer: Callable[[dict], Optional[int]]) -> None:
    """Ask ``answer`` for every label the items still want, as each of ``labellers`` in turn; each is journaled before
    the next is asked, so a kill loses none that was given."""
    for i in progress(range(len(session.items)), desc="labelling", unit="item"):
        for who in labellers:
            if session.decisions.is_open(i, who):
                side = answer(session.items[i])
                if side is None:
                    session.skip(CLIENT, i, who)
                else:
                    session.label(CLIENT, i, side, who)


def label_on_page(session: LabelSession, server: LabelServer, host: str) -> bool:
    """Serve the labelling page (``server``, bound on ``host``) until every item has its labels (-> True) or a Ctrl-C /
    SIGTERM (-> False)."""
    server.show(session)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    print(f"{session.progress_line()}; labelling page: {server.url()} ({who_can_reach(host)}); Ctrl-C stops it, and "
          "the same command continues", flush=True)
    try:
        while True:
            labelled, _, wanted = session.decisions.counts()
            if labelled >= wanted:
                return True
            time.sleep(WAIT_S)
    except (KeyboardInterrupt, Interrupted):
        print(f"stopped: {session.progress_line()}; run the same command to continue", flush=True)
        return False
    finally:
        server.shutdown()
        server.server_close()
