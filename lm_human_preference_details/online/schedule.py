"""The paper's online schedule (section 2.2) and its flags: the labels wanted by episode n, when requests go out, when
the reward model trains again.

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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Optional, get_args

from lm_human_preference_details.labelling.journal import labeller_name as trimmed_name
from lm_human_preference_details.labelling.journal import labeller_problem
from lm_human_preference_details.online.labellers import program_name, split_command
from lm_human_preference_details.online.page import check_can_serve
from lm_human_preference_details.utils.checks import check_at_least
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.torchrun import torchrun_world

Labeller = Literal["gold", "command", "page"]  # who labels: --online.labeller
LABELLERS = get_args(Labeller)


MAX_TIMEOUT_S = 7 * 24 * 3600  # --online.timeout's bound


@dataclass
class OnlineHParams:
    """Online data collection (Ziegler et al. 2019, section 2.2); off unless --online.num-labels is set."""

    num_labels: int = 0
    """N_r, the labels at the end of the run; l(n) grows to it from N_r^0, --rewards.train-new-model.labels.num-train.
    0: online collection off, the reward model trains once on the label file (paper, section 2.2)"""
    retrainings: int = 19
    """times the reward model is trained again after its first training, at evenly spaced values of l(n) (paper: 19)"""
    margin: int = 1000
    """requests sent ahead of the labels PPO needs: new requests go out while requests < l(n) + margin.
    The paper's 1000; scale it with the task"""
    labeller: Labeller = "gold"
    """who labels the requests: gold, the offline task's gold scorer (its best-of-4 pick); command, a program of yours;
    page, the labelling page served by the run (docs/online.md)"""
    command: Optional[str] = None
    """the command labeller's program: one JSON request a line on its stdin, one answer `ID BEST` a line on its stdout;
    ID is the request's id, BEST is 0-3 or skip (docs/online.md)"""
    labeller_name: Optional[str] = None
    """the command labeller's name, 1..64 printable characters, recorded with each of its answers (labels.json).
    Default: the program's file name: judge.py for `python judge.py`, my_judge for `./my_judge --fast`."""
    timeout: float = 600.0
    """seconds the command labeller's program may take over one answer"""
    host: str = "127.0.0.1"
    """address the page labeller's page is served on (the label tool's --host); a non-loopback one lets others label"""
    port: int = 8765
    """TCP port of the page labeller's page (0: any free port; the label tool's --port)"""

    @property
    def enabled(self) -> bool:
        return self.num_labels > 0

    def command_name(self) -> str:
        """The command labeller's name: --online.labeller-name, else its program's file name."""
        name = self.labeller_name if self.labeller_name is not None else program_name(self.command)
        return trimmed_name(name) or name  # trimmed, as every route takes a name; a bad one is refused by `check`

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
        if self.labeller_name is not None and self.labeller != "command":
            raise UserError(f"--online.labeller-name names the command labeller; --online.labeller {self.labeller} "
                            "records its own name (gold: gold; page: the name each person gives the page): drop it")
        if self.labeller == "command" and labeller_problem(self.command_name()) is not None:
            raise UserError(f"--online.labeller-name {self.command_name()!r} is not a name of 1..64 printable "
                            "characters; pass another")
        if not 0 < self.timeout <= MAX_TIMEOUT_S:
            raise UserError(f"--online.timeout is {self.timeout:g}; pass a number of seconds, more than 0 and at most "
                            f"{MAX_TIMEOUT_S} (a week)")
        if self.labeller == "gold" and not hasattr(task, "gold_scores"):
            raise UserError("--online.labeller gold needs a task with a gold scorer (--task offline); pass another "
                            "--online.labeller")
        # a port in use or an address not of this machine: one line, before any model; under torchrun process 0 alone
        # serves the page, and the others, on its node or not, never bind it
        if self.labeller == "page" and torchrun_world()[1] == 0:
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
