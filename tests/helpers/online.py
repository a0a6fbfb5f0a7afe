"""Stand-ins for the online collection's policy and query sampler."""

from __future__ import annotations

import torch


class FakePolicy:
    """Samples token ids 1..99 from the generator it is given: [b, length]."""

    head = torch.nn.Linear(1, 1)

    def sample(self, contexts, length, generator):
        return {"responses": torch.randint(1, 100, (len(contexts), length), generator=generator)}


class FakeSampler:
    """Batches of 4 queries [4, 2]; counts its batches as a query sampler does (its state)."""

    def __init__(self):
        self.n = 0

    def __next__(self):
        self.n += 1
        return torch.full((4, 2), self.n)

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


def online_args(*flags: str, task: str = "offline"):
    """train_policy.py's Args for ``--task TASK FLAGS`` as the command line parses them (a parse error is one
    UserError line), checked without reading the task's inputs."""
    import train_policy
    from lm_human_preference_details.cli.parsing import parse_args

    return parse_args(train_policy.build_args, "train_policy", ["--task", task, *flags]).finalize(check_inputs=False)
