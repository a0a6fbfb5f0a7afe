"""The paper's online data collection (Ziegler et al. 2019, section 2.2): labels gathered from the policy as it trains.

`OnlineCollection` holds the collection's state through a run: the requests it sends the labeller, the waits before
PPO's episodes, the reward model's trainings as the schedule (schedule.py) calls them; its labels go to the run's label
file (label_file.py), every answer first to its durable record (answers.py). Under torchrun process 0 alone makes
the requests, talks to the labeller and writes both files while the others wait for it; every process trains.
"""

from __future__ import annotations

import math
import signal
import time
from typing import Callable, Optional

import torch

from lm_human_preference_details.online.answers import UNKNOWN, AnswerRecord, Request
from lm_human_preference_details.online.label_file import BEST_OF, RECOVER, OnlineLabelFile
from lm_human_preference_details.online.schedule import Schedule
from lm_human_preference_details.ppo import truncate_responses
from lm_human_preference_details.queries import format_queries
from lm_human_preference_details.utils.errors import Stopped, UserError
from lm_human_preference_details.utils.files import SHARED_DIR_WAIT_S
from lm_human_preference_details.utils.progress import passed
from lm_human_preference_details.utils.random_state import rng_state, set_rng_state

PROGRESS_S = 10.0  # while PPO waits for labels, a line of progress this often


def stop_if_received(signum: Optional[int], while_doing: str, n: int) -> None:
    """Stopped at once when the run received a stop signal (SIGTERM, SIGUSR1, Ctrl-C) meanwhile (``signum``)."""
    if signum is not None:
        raise Stopped(f"stopped by {signal.Signals(signum).name} while {while_doing} before episode {n}; every "
                      "label given is kept (online/answers.jsonl): --resume continues", signum)


@torch.no_grad()
def sample_requests(policy, queries: torch.Tensor, task, prefix: list[int], suffix: list[int], pad_id: int,
                    generator: torch.Generator) -> list[list[list[int]]]:
    """[b, query_length] queries -> four samples of the current policy each, [b][4][response_length], drawn as OpenAI
    drew its label queries (the task's temperature and response length, truncated and padded)."""
    # OAI lm_human_preferences/label_types.py: best_of_4 over samples of one query; offline/pretrain.py make_labels
    contexts = format_queries(queries, prefix, suffix).repeat_interleave(BEST_OF, dim=0)  # [4b, q]
    device = policy.head.weight.device
    responses = policy.sample(contexts.to(device), task.response_length, generator=generator)["responses"]
    samples = truncate_responses(responses, task.truncate_token, task.truncate_after, pad_id)
    return samples.view(len(queries), BEST_OF, -1).cpu().tolist()  # [b, 4, response_length]


class OnlineCollection:
    """The collection through a run: requests from the task's query stream, the labeller's answers in the label file,
    the trainings as the schedule calls them. A checkpoint saves its `state_dict`; --resume loads it."""

    def __init__(self, schedule: Schedule, label_file: OnlineLabelFile, labeller, sampler, task, prefix: list[int],
                 suffix: list[int], pad_id: int, seed: int, sizes: tuple[int, int], train: Callable[[int, int], tuple],
                 ranks=None, say: Callable[[str], None] = print,
                 stop_received: Callable[[], Optional[int]] = lambda: None):
        """``say``: the run's print (the lines PPO prints while it waits); ``stop_received``: the run's stop signal, asked
        inside an update only (a stop ends a wait for labels)."""
        self.schedule, self.label_file, self.labeller, self.sampler, self.task = schedule, label_file, labeller, sampler, task
        # torchrun's ranks: process 0 alone has the labeller, the answers, the label file's writes (docs/online.md)
        self.ranks, self.is_main = ranks, ranks is None or ranks.is_main
        self.prefix, self.suffix, self.pad_id, self.seed = prefix, suffix, pad_id, seed
        self.episodes_per_update, self.reward_batch_size = sizes  # --ppo.batch-size, the reward model's batch size
        self.train = train  # (training k, its label count) -> (reward model, hparams); a finished training's is reused
        # every answer, durable as it is given: a resumed run reuses the answers to the requests it makes again
        self.answers = AnswerRecord(label_file.path.with_name("answers.jsonl")) if self.is_main else None
        self.say, self.stop_received = say, stop_received
        self.stop: Callable[[], Optional[int]] = stop_received  # any process's, while process 0 collects (collect_labels)
        self.requests = 0  # requests answered with a label or still pending: a skipped one is not counted
        self.pending: dict[str, Request] = {}  # submitted, not answered yet: a checkpoint holds them
        self.unsent: list[Request] = []  # a resumed run's pending requests, submitted again before its first episode
        self.batches = 0  # batches of requests sampled, each with its own generator
        self.trainings, self.waited = 0, 0.0  # trainings done; seconds PPO waited for labels
        # reload: a resumed run loads its last training's model before its first episode; fresh: no checkpoint loaded,
        self.reload, self.fresh = False, True  # so a label file left by a run killed before its first checkpoint is redone
        self.stats: dict[str, float] = {}  # the last before_episode's metrics

    def state_dict(self) -> dict:
        # process 0's is the one saved (Run.save); the others never write the label file, so they hash none of it
        digest = self.label_file.digest(len(self.label_file)) if self.is_main else None
        return {"requests": self.requests, "batches": self.batches, "labels": len(self.label_file),
                "labels_digest": digest, "trainings": self.trainings,
                "sampler": self.sampler.state_dict(),
                "pending": [r.as_dict() for r in self.pending.values()]}

    def load_state_dict(self, state: dict) -> None:
        if self.is_main:  # the others never read or write the label file: process 0's failure here is every process's
            self.label_file.check_resumed(state["labels"], state.get("labels_digest"), self.answers, self.pad_id)
            self.label_file.keep(state["labels"])
        self.requests, self.batches, self.trainings = state["requests"], state["batches"], state["trainings"]
        self.sampler.load_state_dict(state["sampler"])
        self.unsent = [Request(**r) for r in state.get("pending", [])]
        self.reload = self.trainings > 0
        self.fresh = False

    def before_episode(self, update: int, policy, current: tuple) -> tuple:
        """Requests, labels and trainings due before the first episode of ``update``: ``current`` (the reward model
        and its hparams) -> the reward model PPO scores with now (a new one after a training); metrics in `stats`."""
        n = update * self.episodes_per_update
        if self.reload:  # the model of the last training before the checkpoint, saved in its own run directory
            current = self.training(self.trainings - 1)
            self.reload = False
        # process 0 collects (the others wait for it: Ranks.main_alone); its counts are every process's
        counts = main_alone(self.ranks, lambda stop: self.collect_labels(update, policy, stop), self.stop_received)
        self.stats = {}
        while self.trainings < self.schedule.trainings_due(n):
            current = self.training(self.trainings)
            self.trainings += 1
            self.stats.update(training_stats(self.schedule.training_labels(self.trainings - 1, self.reward_batch_size),
                                             current[1]))
        self.stats.update({**counts, "online/retrainings": self.trainings})
        return current

    def collect_labels(self, update: int, policy, stop: Callable[[], Optional[int]]) -> dict:
        """Process 0's part: the requests due, the wait for l(n) labels (``stop``: any process's) -> the counts."""
        n = update * self.episodes_per_update
        self.stop = stop  # asked as requests go out, in the wait, and by a program's labeller
        if self.fresh:  # its answers are in the record: the requests made again get them from there
            self.label_file.keep(0)
            self.fresh = False
        start = time.time()
        self.submit(self.unsent)
        self.unsent = []
        self.send_requests(update, policy)
        wanted = self.schedule.labels_wanted(n)
        if len(self.label_file) < wanted:  # PPO waits here while labels < l(n), and only here
            self.wait_for_labels(wanted, n, update, policy)
        labels = len(self.label_file)
        self.waited += time.time() - start
        if n + self.episodes_per_update >= self.schedule.total_episodes:  # no label is asked after the last update's
            self.labeller.close()  # the page's server stops
        return {"online/labels": labels, "online/requests": self.requests, "online/pending": self.requests - labels,
                "online/labels_wanted": wanted, "online/retrainings": self.trainings,  # the trainings due: after them
                "online/wait_time": self.waited}

    def send_requests(self, update: int, policy) -> None:
        """New requests while the request rule says so; the answers given meanwhile go to the label file, a skipped
        request is replaced by another (it is not counted)."""
        n = update * self.episodes_per_update
        self.collect()
        while self.schedule.should_request(self.requests, n):
            stop_if_received(self.stop(), "requests went out", n)  # a labeller that skips them all: not forever
            self.request(update, policy)
            self.collect()

    def wait_for_labels(self, wanted: float, n: int, update: int, policy) -> None:
        """Wait until the label file holds l(n) labels: one line saying for what and from whom, then a line of progress
        every PROGRESS_S seconds."""
        need = math.ceil(wanted)
        self.say(f"online: PPO waits before episode {n} for {need} labels ({len(self.label_file)} so far) from "
                 f"{self.labeller.waiting_for()}")
        started = last = time.monotonic()
        while len(self.label_file) < need:
            stop_if_received(self.stop(), "PPO waited for labels", n)  # the labels may never come
            self.collect(timeout=1.0)
            self.send_requests(update, policy)
            if not self.pending and len(self.label_file) < need and not self.schedule.should_request(self.requests, n):
                raise UserError(f"{self.label_file.path} holds {len(self.label_file)} labels and no request is open: the "
                                f"{need} PPO waits for cannot come (the label file lost labels); {RECOVER}")
            if time.monotonic() - last >= PROGRESS_S:
                last = time.monotonic()
                self.say(f"online: {len(self.label_file)} of {need} labels, {len(self.pending)} requests open, waited "
                         f"{last - started:.0f} s")
        self.say(f"online: {len(self.label_file)} labels after {time.monotonic() - started:.0f} s; PPO goes on")

    def collect(self, timeout: float = 0.0) -> None:
        """The labeller's answers given since the last look (waiting up to ``timeout`` seconds for one) into the
        label file; a skipped request no longer counts as a request."""
        answered = self.labeller.poll(timeout)
        for request, best, _ in answered:
            self.pending.pop(request.key, None)
            self.requests -= best is None
        if answered:
            self.label_file.add(answered, self.pad_id)

    def submit(self, requests: list[Request]) -> None:
        """Requests to the labeller, but those answered already (before a resume) answered from the record at once."""
        known = [(r, self.answers.get(r)) for r in requests]
        unknown = [r for r, best in known if best is UNKNOWN]
        if unknown:
            self.labeller.submit(unknown, self.answers.record, self.stop)  # a program asked at length looks at the stop
            self.pending.update({r.key: r for r in unknown})
        if any(best is not UNKNOWN for r, best in known):
            self.label_file.add([(r, b, self.answers.labeller(r)) for r, b in known if b is not UNKNOWN], self.pad_id)
        self.requests -= sum(best is None for r, best in known)

    def request(self, update: int, policy) -> None:
        """One batch of requests: a batch of the task's queries, four samples of the current policy each."""
        queries = next(self.sampler)  # [b, query_length]
        device = policy.head.weight.device
        g = torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + self.batches)  # a resume draws the same
        samples = sample_requests(policy, queries, self.task, self.prefix, self.suffix, self.pad_id, g)
        requests = [Request(self.batches, i, update, q, s) for i, (q, s) in enumerate(zip(queries.tolist(), samples))]
        self.batches += 1
        self.requests += len(requests)
        self.submit(requests)
        passed(f"online-request {self.batches}")  # an audit event: where a test kills between two writes of the label file

    def last_model(self) -> tuple:
        """The last training's reward model and hparams (its saved model), or (None, {}) before the first."""
        return self.training(self.trainings - 1) if self.trainings else (None, {})

    def training(self, k: int) -> tuple:
        """Training k (or its saved model), from the initial model with a new head; the policy run's random state
        untouched, so that a resumed run that reuses the model goes on as the run that trained it."""
        state = rng_state()
        try:
            return self.train(k, self.schedule.training_labels(k, self.reward_batch_size))
        finally:
            set_rng_state(state)


def training_stats(labels: int, hparams: dict) -> dict[str, float]:
    """The metrics of a training on ``labels`` labels that saved ``hparams``: its last batch's loss, its held-out accuracy."""
    return {"online/retraining/labels": labels, "online/retraining/loss": hparams.get("last_loss", math.nan),
            "online/retraining/heldout_accuracy": hparams.get("results", {}).get("heldout_accuracy", math.nan)}


def main_alone(ranks, work: Callable[[Callable[[], Optional[int]]], dict], stop_here: Callable[[], Optional[int]]) -> dict:
    """``work(stop)`` on process 0 alone, its result on every process (Ranks.main_alone); one process: ``work``."""
    return work(stop_here) if ranks is None else ranks.main_alone(work, stop_here)


def check_shared_labels(ranks, label_file: OnlineLabelFile) -> None:
    """Under torchrun, before every process trains on the label file: each reads the records process 0 wrote (their count
    and hash, from process 0), looking again every 0.5 s for up to SHARED_DIR_WAIT_S where a shared file system shows
    them late (docs/checkpoints.md); else one line, on every process, before anything trains."""
    if ranks is None or ranks.world_size == 1:
        return
    count, digest = ranks.from_main((len(label_file), label_file.digest(len(label_file))) if ranks.is_main else None)
    with ranks.agree():
        if not ranks.is_main:
            wait_for_shared_labels(label_file.path, count, digest)


def wait_for_shared_labels(path, count: int, digest: str) -> None:
    """Until the label file at ``path`` holds the ``count`` records hashed ``digest`` (process 0's), for up to
    SHARED_DIR_WAIT_S; then a one-line UserError naming the file."""
    deadline = time.monotonic() + SHARED_DIR_WAIT_S
    while True:
        try:
            seen = OnlineLabelFile(path, owner=False)  # process 0 may be appending to it: never written here
            if len(seen) == count and seen.digest(count) == digest:
                return
            what = f"{len(seen)} records"
        except UserError as e:  # not there yet, or not whole yet: looked at again
            what = str(e)
        if time.monotonic() >= deadline:
            raise UserError(f"{path} is not here as process 0 wrote it ({count} records; here {what[:120]}) after "
                            f"{SHARED_DIR_WAIT_S:g} s: the run directory must be one directory every node shares: pass an "
                            "absolute --output-dir on a file system all nodes mount (docs/checkpoints.md)")
        time.sleep(0.5)
