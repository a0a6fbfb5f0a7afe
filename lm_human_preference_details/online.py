"""The paper's online data collection (Ziegler et al. 2019, section 2.2): labels gathered from the policy as it trains.

OpenAI's release trains only from fixed label files; the paper's summarisation runs gathered labels throughout PPO
from samples of the *current* policy and retrained the reward model as they arrived. In the paper's terms:

    N_pi    the run's PPO episodes (--ppo.total-episodes)
    N_r^0   the labels the reward model first trains on (--rewards.train-new-model.labels.num-train)
    N_r     the labels at the end (--online.num-labels; 0: online collection off, the offline method)

    l(n) = N_r^0 + (N_r - N_r^0) * (1 - (1 - n / N_pi)^2)     the labels wanted before PPO episode n

PPO waits before episode n while fewer than l(n) labels exist; requests go out while the requests so far are fewer
than l(n) + margin, so labellers always have work; the reward model trains before the first episode and again
--online.retrainings times, at evenly spaced values of l(n), each time from the initial language model with a new
random head, one epoch over the labels so far, normalised as the offline reward model is (train_reward.py).

This module holds the schedule (`Schedule`), the run's journal of labels in OpenAI's best-of-4 schema
(`LabelJournal`) and the collection's state through a run (`OnlineCollection`); the labellers are labellers.py's,
every answer's durable record online_answers.py's, the reward model's training train_reward.py's, called back by
train_policy.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from lm_human_preference_details.checkpoint import event, rng_state, set_rng_state
from lm_human_preference_details.cli import check_at_least
from lm_human_preference_details.errors import UserError
from lm_human_preference_details.files import atomic_path
from lm_human_preference_details.label_journal import is_int
from lm_human_preference_details.labellers import check_can_serve, split_command
from lm_human_preference_details.labels import OAI_PAD
from lm_human_preference_details.online_answers import UNKNOWN, AnswerLog, Request
from lm_human_preference_details.ppo import truncate_responses
from lm_human_preference_details.queries import format_queries
from lm_human_preference_details.signals import Stopped
from lm_human_preference_details.torchrun import torchrun_world

LABELLERS = ("gold", "command", "page")
BEST_OF = 4  # the paper's best-of-4 comparisons (labels.type best_of_4)
PROGRESS_S = 10.0  # while PPO waits for labels, a line of progress this often
MAX_TIMEOUT_S = 7 * 24 * 3600  # --online.timeout's bound


@dataclass
class OnlineHParams:
    """Online data collection (Ziegler et al. 2019, section 2.2); off unless --online.num-labels is set."""

    num_labels: int = 0
    """N_r, the labels at the end of the run (paper, section 2.2: l(n) grows from N_r^0 = --rewards.train-new-model.
    labels.num-train to N_r); 0: online collection off, the reward model trains once on the label file (offline)"""
    retrainings: int = 19
    """times the reward model is trained again after its first training, at evenly spaced values of l(n) (paper,
    section 2.2: 19)"""
    margin: int = 1000
    """requests sent ahead of the labels PPO needs: new requests go out while requests < l(n) + margin (paper,
    section 2.2: 1000; scale it with the task)"""
    labeller: str = "gold"
    """who labels the requests (paper, section 2.2: human labellers): gold (the offline task's gold scorer, its
    best-of-4 pick) | command (--online.command, a program of yours) | page (the labelling page, served by the run
    on --online.host and --online.port); docs/online.md"""
    command: Optional[str] = None
    """the command labeller's program: one JSON request a line on its stdin, one answer a line on its stdout, `ID BEST`:
    the request's id, then 0-3 or skip (docs/online.md)"""
    timeout: float = 600.0
    """seconds the command labeller's program may take over one answer"""
    host: str = "127.0.0.1"
    """address the page labeller's page is served on; anything but a loopback address lets other machines label (the
    label tool's --host)"""
    port: int = 8765
    """TCP port of the page labeller's page (0: any free port; the label tool's --port)"""

    @property
    def enabled(self) -> bool:
        return self.num_labels > 0

    def check(self, initial_labels: int, task) -> None:
        """The flags against each other and ``task`` (a tasks.Task), each failure one line naming the flag, before
        anything loads."""
        if self.num_labels < 0:
            raise UserError(f"--online.num-labels is {self.num_labels}; pass the labels at the end of the run (at least "
                            f"--rewards.train-new-model.labels.num-train, {initial_labels}), or 0 to collect none")
        if not self.enabled:
            off = OnlineHParams()
            given = [f"--online.{f.name.replace('_', '-')}" for f in dataclasses.fields(self)
                     if f.name != "num_labels" and getattr(self, f.name) != getattr(off, f.name)]
            if given:
                raise UserError(f"{', '.join(given)} without --online.num-labels: online collection is off, so "
                                f"{'they do' if len(given) > 1 else 'it does'} nothing; pass --online.num-labels N (the "
                                "labels at the end of the run) or drop them")
            return
        check_at_least("--online.num-labels", self.num_labels, initial_labels,
                       "the labels at the end, at least --rewards.train-new-model.labels.num-train (N_r^0)")
        check_at_least("--online.retrainings", self.retrainings, 0, "retrainings after the first training")
        if self.retrainings > self.num_labels - initial_labels:  # each retraining needs a label that came after the last
            raise UserError(f"--online.retrainings {self.retrainings} is more than the {self.num_labels - initial_labels} "
                            "labels that arrive after the first training (--online.num-labels minus --rewards.train-new-"
                            "model.labels.num-train); pass at most that many")
        check_at_least("--online.margin", self.margin, 0, "requests sent ahead of the labels PPO needs")
        if self.labeller not in LABELLERS:
            raise UserError(f"--online.labeller {self.labeller!r} is not one of {', '.join(LABELLERS)}; pass one of them")
        if self.labeller == "command" and not (self.command or "").strip():
            raise UserError("--online.labeller command needs --online.command, the program to run")
        if self.labeller == "command":
            split_command(self.command)  # an unterminated quote or a lone backslash: one line now
        if not 0 < self.timeout <= MAX_TIMEOUT_S:
            raise UserError(f"--online.timeout is {self.timeout:g}; pass a number of seconds, more than 0 and at most "
                            f"{MAX_TIMEOUT_S} (a week)")
        if self.labeller == "gold" and not hasattr(task, "gold_scores"):
            raise UserError("--online.labeller gold needs a task with a gold scorer (--task offline); pass another "
                            "--online.labeller")
        if torchrun_world()[0] > 1:
            raise UserError("online collection runs in one process for now; run without torchrun (--num-ranks "
                            "emulates the ranks in one process)")
        if self.labeller == "page":  # a port in use or an address not of this machine: one line, before any model
            check_can_serve(self.host, self.port)


@dataclass(frozen=True)
class Schedule:
    """When labels are wanted, requested and trained on (paper, section 2.2), as pure functions of episode n."""

    initial_labels: int  # N_r^0
    final_labels: int  # N_r
    total_episodes: int  # N_pi
    margin: int
    retrainings: int

    def labels_wanted(self, n: int) -> float:
        """l(n) = N_r^0 + (N_r - N_r^0) * (1 - (1 - n / N_pi)^2): PPO waits before episode n while fewer exist."""
        return self.initial_labels + (self.final_labels - self.initial_labels) * (1 - (1 - n / self.total_episodes) ** 2)

    def should_request(self, requests: int, n: int) -> bool:
        """The request rule: send more while the requests so far are fewer than l(n) + margin."""
        return requests < self.labels_wanted(n) + self.margin

    def training_points(self) -> list[float]:
        """The values of l(n) at which the reward model trains: N_r^0, then `retrainings` more evenly spaced up to N_r.

        l(n) reaches N_r only at n = N_pi, after the last episode, so the 1 + retrainings trainings divide
        [N_r^0, N_r] into equal steps and the last one falls a step short of N_r."""
        if self.final_labels == self.initial_labels:  # the offline limit: one training, on N_r^0 labels
            return [float(self.initial_labels)]
        steps = self.retrainings + 1
        return [self.initial_labels + (self.final_labels - self.initial_labels) * k / steps for k in range(steps)]

    def trainings_due(self, n: int) -> int:
        """How many trainings have happened before episode n: the points at or below l(n)."""
        wanted = self.labels_wanted(n)
        return sum(point <= wanted for point in self.training_points())

    def training_labels(self, k: int, batch_size: int) -> int:
        """The labels training k trains on: its point's count, down to a whole number of batches (train_reward.py's
        exact_div(num_train, batch_size)); the labels past them are its held-out labels."""
        return max(batch_size, int(self.training_points()[k]) // batch_size * batch_size)


class LabelJournal:
    """The run's labels, RUN/online/labels.json: a JSON list in OpenAI's best-of-4 schema (pads 50259) with the policy
    update that sampled each; rewritten whole and atomically after each batch, so a kill never leaves half a record,
    and read by train_reward.py's --labels.source as it is."""

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict] = read_journal(path)

    def __len__(self) -> int:
        return len(self.records)

    def digest(self, n: int) -> str:
        """A hash of the first ``n`` records: a checkpoint holds it, so a resume finds a journal cut or changed."""
        return hashlib.sha256(json.dumps(self.records[:n]).encode()).hexdigest()

    def check(self, labels: int, digest: Optional[str], answers: AnswerLog, pad_id: int) -> None:
        """On resume: the first ``labels`` records as the checkpoint saw them (``digest``: their hash), each an answer
        of the record ``answers`` (answers.jsonl); a file cut, emptied or changed since is one line naming it, never a
        run that differs or waits for labels that cannot come."""
        if len(self) < labels or (digest is not None and self.digest(labels) != digest):
            what = f"holds {len(self)} records, fewer than" if len(self) < labels else "differs from"
            raise UserError(f"{self.path} {what} the checkpoint's {labels}: it was cut or changed since the checkpoint; "
                            f"{RECOVER}")
        given = answers.labels()
        from_oai = lambda tokens: [pad_id if t == OAI_PAD else t for t in tokens]  # noqa: E731
        for i, record in enumerate(self.records[:labels]):
            request = Request(0, 0, 0, from_oai(record["query"]), [from_oai(record[f"sample{k}"]) for k in range(BEST_OF)])
            if (request.digest, record["best"]) not in given:
                raise UserError(f"{answers.path} has no answer for record {i} of {self.path.name}: it was cut or "
                                f"changed since the checkpoint; {RECOVER}")

    def keep(self, n: int) -> None:
        """Drop the records past the first ``n`` (a resumed run makes them again, the same ones)."""
        if len(self.records) > n:
            self.records = self.records[:n]
            self._write()

    def add(self, answered: list[tuple[Request, Optional[int]]], pad_id: int) -> None:
        """Requests and their answers (None: skipped, not kept), in the order given."""
        to_oai = lambda tokens: [OAI_PAD if t == pad_id else t for t in tokens]  # noqa: E731
        for request, best in answered:
            if best is None:
                continue
            self.records.append({"query": to_oai(request.query),
                                 **{f"sample{i}": to_oai(request.samples[i]) for i in range(BEST_OF)},
                                 "best": best, "update": request.update})
        self._write()

    def _write(self) -> None:
        with atomic_path(self.path) as tmp:
            tmp.write_text(json.dumps(self.records))
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())


RECOVER = "restore it from a copy, or start the run again with --overwrite (its labels are then lost)"


def read_journal(path: Path) -> list[dict]:
    """The journal's records (none when there is no journal), or a one-line UserError naming the file when it is not
    the journal this run wrote: not a file, not JSON (cut), or not a list of best-of-4 records."""
    if not os.path.lexists(path):
        return []
    if not path.is_file():
        raise UserError(f"{path} is not a file; it is the run's journal of labels: {RECOVER}")
    try:
        records = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{path} is not JSON: it was cut or changed (the run writes it whole); {RECOVER}") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) and is_int(r.get("best")) and 0 <= r["best"] < BEST_OF
                                                for r in records):
        raise UserError(f"{path} is not a list of best-of-{BEST_OF} records: it was changed; {RECOVER}")
    return records


def stop_if(signum: Optional[int], while_doing: str, n: int) -> None:
    """Stopped at once when the run received a stop signal (SIGTERM, SIGUSR1, Ctrl-C: ``signum``) meanwhile."""
    if signum is not None:
        raise Stopped(f"stopped by {signal.Signals(signum).name} while {while_doing} before episode {n}; every label "
                      "given is kept (online/answers.jsonl): --resume continues", signum)


def cannot_come(journal: LabelJournal, need: int) -> UserError:
    """No request open and none to send, fewer than ``need`` labels: they cannot come (the journal lost some)."""
    return UserError(f"{journal.path} holds {len(journal)} labels and no request is open: the {need} PPO waits for "
                     f"cannot come (the journal lost labels); {RECOVER}")


class OnlineCollection:
    """The collection through a run: requests from the task's query stream, the labeller's answers in the journal,
    the trainings as the schedule calls them. A checkpoint saves its `state_dict`; --resume loads it."""

    def __init__(self, schedule: Schedule, journal: LabelJournal, labeller, sampler, task, prefix: list[int],
                 suffix: list[int], pad_id: int, seed: int, sizes: tuple[int, int], train: Callable[[int, int], tuple]):
        self.schedule, self.journal, self.labeller, self.sampler, self.task = schedule, journal, labeller, sampler, task
        self.prefix, self.suffix, self.pad_id, self.seed = prefix, suffix, pad_id, seed
        self.episodes_per_update, self.reward_batch_size = sizes  # --ppo.batch-size, the reward model's batch size
        self.train = train  # (training k, its label count) -> (reward model, its hparams); a finished one's is reused
        # every answer, durable as it is given: a resumed run reuses the answers to the requests it makes again
        self.answers = AnswerLog(journal.path.with_name("answers.jsonl"))
        self.say: Callable[[str], None] = print  # the run's print (train_policy.py sets it)
        self.stop_received: Callable[[], Optional[int]] = lambda: None  # the run's (train_policy.py sets it)
        self.requests = 0  # requests answered with a label or still pending: a skipped one is not counted
        self.pending: dict[str, Request] = {}  # submitted, not answered yet: a checkpoint holds them
        self.unsent: list[Request] = []  # a resumed run's pending requests, submitted again before its first episode
        self.batches = 0  # batches of requests sampled, each with its own generator
        self.trainings, self.waited = 0, 0.0  # trainings done, seconds spent making requests and waiting for labels
        self.reload = False  # a resumed run loads its last training's model before its first episode
        self.fresh = True  # no checkpoint loaded: a journal left by a run killed before its first checkpoint is redone
        self.stats: dict[str, float] = {}  # the last before_episode's metrics

    def state_dict(self) -> dict:
        return {"requests": self.requests, "batches": self.batches, "labels": len(self.journal),
                "journal": self.journal.digest(len(self.journal)), "trainings": self.trainings,
                "sampler": self.sampler.state_dict(), "pending": [r.as_dict() for r in self.pending.values()]}

    def load_state_dict(self, state: dict) -> None:
        self.journal.check(state["labels"], state.get("journal"), self.answers, self.pad_id)
        self.requests, self.batches, self.trainings = state["requests"], state["batches"], state["trainings"]
        self.sampler.load_state_dict(state["sampler"])
        self.journal.keep(state["labels"])
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
        if self.fresh:  # its answers are in the record: the requests made again get them from there
            self.journal.keep(0)
            self.fresh = False
        start = time.time()
        self.submit(self.unsent)
        self.unsent = []
        self.send_requests(update, policy)
        wanted = self.schedule.labels_wanted(n)
        if len(self.journal) < wanted:  # PPO waits here while labels < l(n), and only here
            self.wait_for_labels(wanted, n, update, policy)
        labels = len(self.journal)
        self.waited += time.time() - start
        if n + self.episodes_per_update >= self.schedule.total_episodes:  # no label is asked after the last update's
            self.labeller.close()  # the page's server stops
        self.stats = {}
        while self.trainings < self.schedule.trainings_due(n):
            current = self.training(self.trainings)
            self.trainings += 1
            self.stats.update({"online/retraining/labels": self.schedule.training_labels(self.trainings - 1,
                                                                                        self.reward_batch_size),
                               "online/retraining/loss": current[1].get("last_loss", math.nan),
                               "online/retraining/heldout_accuracy": current[1].get("results", {}).get(
                                   "heldout_accuracy", math.nan)})
        self.stats.update({"online/labels": labels, "online/requests": self.requests,
                           "online/pending": self.requests - labels, "online/labels_wanted": self.schedule.labels_wanted(n),
                           "online/retrainings": self.trainings, "online/wait_time": self.waited})
        return current

    def send_requests(self, update: int, policy) -> None:
        """New requests while the request rule says so; the answers given meanwhile journaled, a skipped request
        replaced by another (it is not counted)."""
        n = update * self.episodes_per_update
        self.collect()
        while self.schedule.should_request(self.requests, n):
            stop_if(self.stop_received(), "requests went out", n)  # a labeller that skips all, a huge margin
            self.request(update, policy)
            self.collect()

    def wait_for_labels(self, wanted: float, n: int, update: int, policy) -> None:
        """Wait until the journal holds l(n) labels: one line saying for what and from whom, then a line of progress
        every PROGRESS_S seconds."""
        need = math.ceil(wanted)
        self.say(f"online: PPO waits before episode {n} for {need} labels ({len(self.journal)} so far) from "
                 f"{self.labeller.waiting_for()}")
        started = last = time.monotonic()
        while len(self.journal) < need:
            stop_if(self.stop_received(), "PPO waited for labels", n)  # they may never come: stop now
            self.collect(timeout=1.0)
            self.send_requests(update, policy)
            if not self.pending and len(self.journal) < need and not self.schedule.should_request(self.requests, n):
                raise cannot_come(self.journal, need)
            if time.monotonic() - last >= PROGRESS_S:
                last = time.monotonic()
                self.say(f"online: {len(self.journal)} of {need} labels, {len(self.pending)} requests open, waited "
                         f"{last - started:.0f} s")
        self.say(f"online: {len(self.journal)} labels after {time.monotonic() - started:.0f} s; PPO goes on")

    def collect(self, timeout: float = 0.0) -> None:
        """The labeller's answers given since the last look (waiting up to ``timeout`` seconds for one) into the
        journal; a skipped request no longer counts as a request."""
        answered = self.labeller.poll(timeout)
        for request, best in answered:
            self.pending.pop(request.key, None)
            self.requests -= best is None
        if answered:
            self.journal.add(answered, self.pad_id)

    def submit(self, requests: list[Request]) -> None:
        """Requests to the labeller, but those answered already (before a resume) answered from the record at once."""
        known = [(r, self.answers.get(r)) for r in requests]
        unknown = [r for r, best in known if best is UNKNOWN]
        if unknown:
            self.labeller.stop_received = self.stop_received  # a program asked at length looks at the run's stop
            self.labeller.submit(unknown, self.answers.record)
            self.pending.update({r.key: r for r in unknown})
        if any(best is not UNKNOWN for r, best in known):
            self.journal.add([(r, best) for r, best in known if best is not UNKNOWN], self.pad_id)
        self.requests -= sum(best is None for r, best in known)

    @torch.no_grad()
    def request(self, update: int, policy) -> None:
        """One batch of requests: a batch of the task's queries, four samples of the current policy each, drawn as
        OpenAI drew its label queries (the task's temperature and response length, truncated and padded)."""
        # OAI lm_human_preferences/label_types.py: best_of_4 over samples of one query; offline.make_labels
        task = self.task
        queries = next(self.sampler)  # [b, query_length]
        contexts = format_queries(queries, self.prefix, self.suffix).repeat_interleave(BEST_OF, dim=0)  # [4b, q]
        device = policy.head.weight.device
        g = torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + self.batches)  # a resume draws the same
        responses = policy.sample(contexts.to(device), task.response_length, generator=g)["responses"]
        samples = truncate_responses(responses, task.truncate_token, task.truncate_after, self.pad_id)
        samples = samples.view(len(queries), BEST_OF, -1).cpu().tolist()  # [b, 4, response_length]
        requests = [Request(self.batches, i, update, q, s) for i, (q, s) in enumerate(zip(queries.tolist(), samples))]
        self.batches += 1
        self.requests += len(requests)
        self.submit(requests)
        event(f"online-request {self.batches}")  # tests' hook (off in real runs): a kill between two journal writes

    def training(self, k: int) -> tuple:
        """Training k (or its saved model), from the initial model with a new head; the policy run's random state
        untouched, so that a resumed run that reuses the model goes on as the run that trained it."""
        state = rng_state()
        try:
            return self.train(k, self.schedule.training_labels(k, self.reward_batch_size))
        finally:
            set_rng_state(state)
