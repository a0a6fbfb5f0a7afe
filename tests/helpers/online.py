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
    import train_policy

    args = train_policy.build_args(task)
    return train_policy.tyro.cli(train_policy.Args, default=args, args=list(flags)).finalize(check_inputs=False)
