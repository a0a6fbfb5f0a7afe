"""The online collection's labellers (online/labellers.py): the gold pick, and a user's program as the command labeller,
answering, skipping, dying, hanging and lying."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
from lm_human_preference_details.online.labellers import CommandLabeller, GoldLabeller
from lm_human_preference_details.utils.errors import UserError


@pytest.fixture(scope="module")
def tokenizer():
    return gpt2_tokenizer()


def requests(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Two requests: [2, 4] queries, [2, 4, 3] samples, padded with the tokenizer's pad."""
    pad = tokenizer.pad_token_id
    ids = lambda text: tokenizer.encode(text)  # noqa: E731
    queries = torch.tensor([ids(" The old house") + [pad] * (4 - len(ids(" The old house"))), ids(" A day by the sea")[:4]])
    words = [[" sad", " happy", " calm", " dark"], [" cold", " warm", " bitter", " lovely"]]
    samples = torch.tensor([[ids(w) + [pad] * (3 - len(ids(w))) for w in four] for four in words])
    return queries, samples


def test_the_gold_labeller_picks_the_highest_gold_score_ties_to_the_first(tokenizer):
    queries, samples = requests(tokenizer)
    scores = {" sad": -0.9, " happy": 0.9, " calm": 0.9, " dark": -0.8, " cold": -0.7, " warm": 0.7, " bitter": -0.6,
              " lovely": 0.95}

    def gold(tok, responses):  # [8, 3] -> [8]
        texts = tok.batch_decode([[t for t in row if t != tok.pad_token_id] for row in responses.tolist()])
        return torch.tensor([scores[t] for t in texts])

    assert GoldLabeller(tokenizer, gold).label(queries, samples) == [1, 3]  # " happy" before the tied " calm"


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "labeller.py"
    path.write_text("import json, sys, time\n" + body)
    return f"{sys.executable} {path}"


def test_a_program_answers_an_index_or_skip_for_each_request(tmp_path, tokenizer):
    log = tmp_path / "requests.jsonl"
    command = script(tmp_path, f"""
for line in sys.stdin:
    request = json.loads(line)
    open({str(log)!r}, "a").write(line)
    # the longest response wins; the second request is skipped
    best = max(range(4), key=lambda i: len(request["responses"][i]))
    print(request["id"], "skip" if request["id"] == 1 else best, flush=True)
""")
    labeller = CommandLabeller(command, tokenizer, timeout=60)
    queries, samples = requests(tokenizer)
    assert labeller.label(queries, samples) == [1, None]  # " happy" is the longest of the first four
    import json

    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["id"] for r in sent] == [0, 1]
    assert sent[0]["query"] == " The old house" and sent[0]["responses"] == [" sad", " happy", " calm", " dark"]
    assert sent[1]["response_tokens"][3] == tokenizer.encode(" lovely")  # the ids without pads
    labeller.close()
    assert labeller.process.poll() is not None  # the program it started has ended


@pytest.mark.parametrize("body, message", [
    ("sys.stdin.readline()\nsys.exit(3)\n", "the program exited \\(status 3\\) without an answer"),
    ("sys.stdin.readline()\ntime.sleep(600)\n", "no answer within 1 s \\(--online.timeout\\)"),
    ("for line in sys.stdin:\n    print(0, 7, flush=True)\n", "answered '0 7'; the best index is 0-3 \\(or skip\\)"),
    ("for line in sys.stdin:\n    print('the second', flush=True)\n", "answered 'the second'; an answer is one line"),
    ("for line in sys.stdin:\n    print(2, flush=True)\n", "answered '2'; an answer is one line `ID BEST`"),  # no id
    ("for line in sys.stdin:\n    print(0, '\u00b2', flush=True)\n", "answered '0 \u00b2'; an answer is one line"),
    ("for line in sys.stdin:\n    print(0, '9' * 4301, flush=True)\n", "the best index is 0-3"),
])
def test_a_program_that_dies_hangs_or_lies_is_one_line(tmp_path, tokenizer, body, message):
    labeller = CommandLabeller(script(tmp_path, body), tokenizer, timeout=1)
    with pytest.raises(UserError, match=message) as error:
        labeller.label(*requests(tokenizer))
    assert "\n" not in str(error.value) and "request 0" in str(error.value)
    labeller.close()
    assert labeller.process.poll() is not None


def test_a_program_that_cannot_start_is_one_line(tmp_path, tokenizer):
    with pytest.raises(UserError, match="cannot start"):
        CommandLabeller(str(tmp_path / "no-such-program"), tokenizer, timeout=1)


def asked(tokenizer) -> list:
    """The two requests of `requests` as the collection submits them (online_answers.Request)."""
    from lm_human_preference_details.online.answers import Request

    queries, samples = requests(tokenizer)
    return [Request(0, i, 0, q, s) for i, (q, s) in enumerate(zip(queries.tolist(), samples.tolist()))]


@pytest.mark.parametrize("body, kept, message", [
    # answers before it reads: its first line is out before request 0 is sent (it says when, with the file `ready`)
    ("print(0, 3, flush=True)\nopen(sys.argv[1], 'w').close()\nfor i, line in enumerate(sys.stdin, 1):\n"
     "    print(i, 3, flush=True)\n", 0, "request 0: the program printed '0 3' before the request was sent"),
    # a line too many: two answers to each request
    ("for line in sys.stdin:\n    i = json.loads(line)['id']\n    print(i, 1)\n    print(i, 2, flush=True)\n", 1,
     "request 1: "),
    # another request's id
    ("for line in sys.stdin:\n    print(json.loads(line)['id'] + 1, 0, flush=True)\n", 0,
     "request 0: answered '1 0', an answer for request 1, which is not open"),
], ids=["before-reading", "a-line-too-many", "another-id"])
def test_an_answer_is_never_taken_for_another_requests(tmp_path, tokenizer, body, kept, message):
    """Each answer names its request: one that answers no open request, or a second one, is one line naming the
    program and the request, and only the program's own answer to a request is recorded for it."""
    ready = tmp_path / "ready"
    labeller = CommandLabeller(f"{script(tmp_path, body)} {ready}", tokenizer, timeout=60)
    if "sys.argv[1]" in body:
        while not ready.exists():  # its early line is out
            time.sleep(0.05)
    recorded = []
    with pytest.raises(UserError, match=re.escape(message)) as error:
        labeller.submit(asked(tokenizer), lambda request, best, labeller: recorded.append((request.position, best)))
    assert "\n" not in str(error.value) and f"--online.command {labeller.command!r}" in str(error.value)
    assert recorded == [(0, 1)][:kept]  # request 0's own answer, where it gave one; never another request's
    if kept:
        assert "a second answer to request 0" in str(error.value) or "printed '0 2' before" in str(error.value)
    labeller.close()


def ended(pid: int) -> bool:
    """Whether process ``pid`` is gone (or a zombie no one reaped yet: it runs no more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("body, timeout, message", [
    # 48 MB on one line: refused past MAX_LINE bytes, not read to its end
    ("sys.stdin.readline()\nsys.stdout.write('x' * (48 << 20))\nsys.stdout.flush()\ntime.sleep(600)\n", 60,
     "printed more than 65536 bytes without a newline"),
    # a byte every 0.1 s, never a newline: the timeout runs from the request to the newline
    ("sys.stdin.readline()\nwhile True:\n    sys.stdout.write('x')\n    sys.stdout.flush()\n    time.sleep(0.1)\n", 1,
     "no answer within 1 s"),
    # its output closed, and it stays
    ("import os\nsys.stdin.readline()\nos.close(1)\ntime.sleep(600)\n", 60,
     "the program closed its output and kept running; it was ended"),
    # its input closed after the request, and it stays
    ("import os\nsys.stdin.readline()\nos.close(0)\ntime.sleep(600)\n", 60,
     "the program closed its input and kept running; it was ended"),
], ids=["48MB-line", "no-newline", "stdout-closed", "stdin-closed"])
def test_a_program_that_floods_trickles_or_closes_a_pipe_is_one_line_at_once(tmp_path, tokenizer, body, timeout,
                                                                            message):
    """Bounded in size and in time (--online.timeout), a closed pipe said at once: the run never hangs on it."""
    labeller = CommandLabeller(script(tmp_path, body), tokenizer, timeout=timeout)
    started = time.monotonic()
    with pytest.raises(UserError, match=re.escape(message)) as error:
        labeller.label(*requests(tokenizer))
    assert time.monotonic() - started < min(timeout, 1) + 10  # at the timeout or at once, plus a loaded machine's slack
    assert "\n" not in str(error.value) and "request 0" in str(error.value)
    assert until(lambda: ended(labeller.process.pid))
    labeller.close()


def test_the_programs_whole_group_ends_with_the_run_and_is_not_the_terminals(tmp_path, tokenizer):
    """A program behind a wrapper that ignores the end of its input (and SIGTERM) and leaves a child: both end with the
    labeller; the program runs in a process group of its own, so a Ctrl-C at the terminal reaches the run alone."""
    pids = tmp_path / "pids"
    command = script(tmp_path, f"""import os, signal, subprocess
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open({str(pids)!r}, "w").write(str(child.pid))
for line in sys.stdin:
    print(json.loads(line)["id"], 2, flush=True)
time.sleep(600)  # the end of its input ignored
""")
    labeller = CommandLabeller(command, tokenizer, timeout=60)
    assert labeller.label(*requests(tokenizer)) == [2, 2]
    pid = labeller.process.pid
    assert os.getpgid(pid) == pid != os.getpgrp() and os.getsid(pid) == pid  # not the terminal's foreground group
    child = int(pids.read_text())
    labeller.close(grace=1)
    assert until(lambda: ended(pid) and ended(child))


def test_a_stop_ends_a_wait_for_the_program_within_a_second_or_two(tmp_path, tokenizer):
    from lm_human_preference_details.utils.errors import Stopped

    labeller = CommandLabeller(script(tmp_path, "sys.stdin.readline()\ntime.sleep(600)\n"), tokenizer, timeout=600)
    signalled = time.monotonic() + 0.5
    with pytest.raises(Stopped, match="stopped by SIGTERM while --online.command .*, request 0 was asked") as stopped:
        labeller.submit(asked(tokenizer), lambda request, best, labeller: None,
                        stop=lambda: signal.SIGTERM if time.monotonic() > signalled else None)
    assert time.monotonic() - signalled < 2 + 3 and stopped.value.exit_code == 128 + signal.SIGTERM  # 3 s of slack
    assert until(lambda: ended(labeller.process.pid))


def test_a_program_ended_by_the_runs_own_stop_is_said_as_a_stop(tmp_path, tokenizer):
    """scancel's SIGTERM reaches every process of the job, the program too: its death is the run's stop, not its
    failure (exit 128 + SIGTERM, not 2)."""
    from lm_human_preference_details.utils.errors import Stopped

    labeller = CommandLabeller(script(tmp_path, "import os, signal\nsys.stdin.readline()\nos.kill(os.getpid(), "
                                                "signal.SIGTERM)\n"), tokenizer, timeout=600)
    with pytest.raises(Stopped, match="stopped by SIGTERM") as stopped:
        labeller.submit(asked(tokenizer), lambda request, best, labeller: None,
                        stop=lambda: signal.SIGTERM if labeller.process.poll() is not None else None)
    assert stopped.value.exit_code == 128 + signal.SIGTERM
