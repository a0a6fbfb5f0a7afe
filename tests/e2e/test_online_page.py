"""The `page` labeller (labellers.PageLabeller): a small online run of the offline task labelled in headless Chromium to its
end, killed on the way with labels given past its last checkpoint: resumed, it keeps every one and asks none again; a
stop signal ends a wait for labels; a port in use or a bad address is one line before anything loads.

Sizes: 2 updates of 16 episodes, N_r^0 = 8, N_r = 16, margin 0: one batch of 16 requests before update 0; PPO waits
for l(0) = 8 labels, then for l(16) = 8 + 8 * (1 - (1/2)^2) = 14 before update 1.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from helpers.browser import browser, browser_paths, give_name, page_wait  # noqa: F401  (the fixture, and Chromium's paths)
from helpers.labelling import ROOT, label_env, tiny_offline_cache
from helpers.processes import ForkedProcess, differing

from lm_human_preference_details.language.tokenizer import decode, load_tokenizer
from lm_human_preference_details.utils.errors import UserError

WAIT_S = 600  # a bound on each wait for the run (a model load and a reward training on a loaded 2-core machine)
# the tests' tiny assets hold queries of 64 tokens
SMALL = ["--task", "offline", "--task.query-length", "64", "--ppo.total-episodes", "32", "--ppo.batch-size", "16",
         "--num-ranks", "2", "--save-interval", "1", "--sample-print-interval", "100", "--device", "cpu",
         "--rewards.train-new-model.labels.num-train", "8", "--rewards.train-new-model.normalize-samples", "16",
         "--rewards.train-new-model.rollout-batch-size", "16",
         "--online.num-labels", "16", "--online.retrainings", "1", "--online.margin", "0", "--online.labeller", "page",
         "--online.port", "0"]


class Run:
    """train_policy.py in a process of its own (a fork of this one, helpers.processes.ForkedProcess: a new interpreter
    would add only its imports) leading its own process group, its output read line by line on a thread."""

    def __init__(self, run_dir: Path, env: dict, *extra: str):
        self.process = ForkedProcess("train_policy.py", *SMALL, "--output-dir", run_dir, *extra, cwd=run_dir.parent,
                                     env_extra=differing(env))
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=lambda: [self.lines.put(line) for line in self.process.stdout],
                                       daemon=True)
        self.reader.start()

    def wait_for(self, pattern: str) -> re.Match:
        """The first line from now on that matches ``pattern``."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.process.poll() is None, "".join(self.seen)[-3000:]
                continue
            self.seen.append(line)
            if match := re.search(pattern, line):
                return match
        raise AssertionError(f"no line matching {pattern!r} within {WAIT_S} s:\n" + "".join(self.seen)[-3000:])

    def finish(self) -> str:
        """Everything the run printed, once it has exited."""
        self.process.wait(timeout=WAIT_S)
        self.reader.join(timeout=WAIT_S)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)

    def kill(self) -> None:
        """kill -9 of the run (if it still runs) and all it started."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def waits(run: Run, n: int) -> tuple[int, int, str]:
    """The run's next wait, which must be before episode ``n``: its one line -> (labels it waits for, labels so far,
    the page's URL)."""
    match = run.wait_for(r"PPO waits before episode (\d+) for (\d+) labels \((\d+) so far\) from the labelling page: "
                         r"open (http://\S+/)")
    assert int(match.group(1)) == n, match.group(0)
    return int(match.group(2)), int(match.group(3)), match.group(4)


def labelled_choices(run_dir: Path, tokenizer) -> Counter:
    """labels.json as (query text, four sample texts, best): what the page showed and what was chosen."""
    records = json.loads((run_dir / "online" / "labels.json").read_text())
    pad = lambda tokens: [tokenizer.pad_token_id if t == 50259 else t for t in tokens]  # noqa: E731  OpenAI's pad
    return Counter((decode(tokenizer, pad(r["query"])), tuple(decode(tokenizer, pad(r[f"sample{i}"])) for i in range(4)),
                    r["best"]) for r in records)


def call(url: str, path: str, body: dict | None = None) -> dict:
    """One of the page's calls, as its own page makes it (Origin and the custom header on a POST)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json", "X-Lmhp-Label": "1",
                                       "Origin": url.rstrip("/")}
    request = urllib.request.Request(url.rstrip("/") + path, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def give(url: str, count: int) -> list[tuple]:
    """``count`` labels posted from one tab -> the (query, samples, best) of each."""
    given = []
    for k in range(count):
        item = call(url, "/api/state?client=t")["item"]
        state = call(url, "/api/label", {"client": "t", "labeller": "ann", "item": item["index"],
                                         "request": item["request"], "best": k % 4})
        assert state["labelled"] >= k + 1  # saved: answered 200 (a refusal raises)
        given.append((item["query"], tuple(item["samples"]), k % 4))
    return given


def click(driver, count: int) -> list[tuple]:
    """``count`` labels given on the page the browser (``driver``) shows, each by a real click on the k % 4-th response, each
    waited for until the page hears "saved" -> the (query, samples, best) of each."""
    from selenium.webdriver.common.by import By

    clicked = []
    for k in range(count):
        page_wait(driver, WAIT_S).until(lambda d: d.execute_script("return state && state.item"))
        item = driver.execute_script("return state.item")
        labelled = driver.execute_script("return state.labelled")
        driver.find_element(By.ID, f"sample{k % 4}").click()
        page_wait(driver, WAIT_S).until(lambda d: d.execute_script("return state.labelled") > labelled)
        clicked.append((item["query"], tuple(item["samples"]), k % 4))
    return clicked


def test_a_small_online_run_labelled_in_the_browser_survives_a_kill_past_its_checkpoint(assets, tmp_path,
                                                                                       browser):  # noqa: F811
    """Labelled in headless Chromium to the run's end, killed (kill -9) on the way with labels given past its last
    checkpoint, then resumed: each label given kept, none asked again. One run serves both promises (they were two
    runs of this size); seconds: two launches, two reward trainings, two PPO updates, the closing evaluation."""
    run_dir = tmp_path / "run"
    env = label_env(tiny_offline_cache(tmp_path / "cache", assets))
    run = Run(run_dir, env)
    try:
        need, have, url = waits(run, 0)
        assert (need, have) == (8, 0)
        browser.get(url)
        give_name(browser, "ann")  # asked once per browser, for each address (the resumed run's port is another)
        given = click(browser, 8)
        run.wait_for(r"8 labels after \d+ s; PPO goes on")
        # update 0 done: PPO waits again, for l(16) labels (its checkpoint may still be on its way: either resumes)
        assert waits(run, 16)[:2] == (14, 8)
        late = click(browser, 4)  # past the last checkpoint, each fsynced before the page hears "saved"
    finally:
        run.kill()
    assert "".join(run.seen).count("PPO waits") == 2  # one line per wait, not a line per label
    assert not (run_dir / "summary.json").exists()

    resumed = Run(run_dir, env, "--resume")
    try:
        need, have, url = waits(resumed, 16)
        assert (need, have) == (14, 12)  # the 4 late labels came back
        assert call(url, "/api/state?client=u")["total"] == 4  # the 16 requests but the 12 answered: none asked again
        browser.get(url)
        give_name(browser, "bob")
        left = click(browser, 2)
        assert not {(q, s) for q, s, _ in left} & {(q, s) for q, s, _ in given + late}
        resumed.wait_for(r"14 labels after \d+ s; PPO goes on")
        output = resumed.finish()
    finally:
        resumed.kill()
    assert resumed.process.returncode == 0, output[-3000:]
    assert output.count("PPO waits") == 1
    tokenizer = load_tokenizer(str(assets / "tiny-gpt2"))
    assert labelled_choices(run_dir, tokenizer) == Counter(given + late + left)  # exactly the labels given, with tokens
    records = json.loads((run_dir / "online" / "labels.json").read_text())
    assert Counter(r["labeller"] for r in records) == {"ann": 12, "bob": 2}  # who gave each label
    with pytest.raises(OSError):  # the run has ended: so has its page
        urllib.request.urlopen(url, timeout=5)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["online/labels"] for m in metrics] == [8, 14] and metrics[1]["online/wait_time"] > 0


def test_a_port_in_use_is_one_line_before_anything_loads(assets, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = [*SMALL[:-1], str(port), "--output-dir", str(tmp_path / "run")]
        with pytest.raises(UserError, match=f"--online.port {port} is in use"):  # at flag time
            finalized(SMALL[2:-1] + [str(port)])
        result = subprocess.run([sys.executable, str(ROOT / "train_policy.py"), *flags], capture_output=True,
                                text=True, env=label_env(tiny_offline_cache(tmp_path / "cache", assets)), timeout=WAIT_S)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (f"error: --online.port {port} is in use on 127.0.0.1; stop what uses it or pass "
                                     "another --online.port (0: any free port)")
    assert not (tmp_path / "run").exists()  # nothing written, nothing loaded


@pytest.mark.parametrize("flags, message", [
    (["--online.host", "192.0.2.1"], "cannot serve on --online.host 192.0.2.1 --online.port 0"),  # not this machine's
    (["--online.host", "no-such-host.invalid"], "cannot serve on --online.host no-such-host.invalid"),
    (["--online.port", "70000"], "--online.port 70000 is not a TCP port"),
])
def test_a_bad_page_address_is_one_line_at_flag_time(flags, message):
    with pytest.raises(UserError, match=re.escape(message)):
        finalized([*SMALL[2:], *flags])


def finalized(argv: list[str]):
    """train_policy's flags on the offline preset (build_args("offline")), parsed and checked, nothing read."""
    import train_policy

    args = train_policy.tyro.cli(train_policy.Args, default=train_policy.build_args("offline"), args=argv)
    return args.finalize(check_inputs=False)


def test_a_stop_signal_while_ppo_waits_ends_the_run_at_once(assets, tmp_path):
    """SIGTERM (Slurm's, or a Ctrl-C) while nobody labels: the run does not wait for labels that may never come."""
    run = Run(tmp_path / "run", label_env(tiny_offline_cache(tmp_path / "cache", assets)))
    try:
        give(waits(run, 0)[2], 3)
        run.process.send_signal(signal.SIGTERM)
        run.process.wait(timeout=120)  # not WAIT_S: it must not wait for labels (a generous bound on a loaded machine)
        output = run.finish()
    finally:
        run.kill()
    assert run.process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "stopped by SIGTERM while PPO waited for labels before episode 0; every label given is kept" in output
    assert len((tmp_path / "run" / "online" / "answers.jsonl").read_text().splitlines()) == 3
