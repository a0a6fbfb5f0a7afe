"""The non-finite guard: a NaN or an infinity in a loss, a statistic or a model's weights ends the run with one line
naming it, before anything of it is saved."""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from lm_human_preference_details.utils.errors import UserError


def _finite_flags(values: Iterable[Any]) -> list[bool]:
    """One bool per value: a tensor, a number, a list of numbers, or a module's parameters."""
    flags = []
    for v in values:
        if isinstance(v, nn.Module):
            params = [p.detach() for p in v.parameters()]
            flags.append(torch.stack([torch.isfinite(p).all() for p in params]).all() if params else torch.tensor(True))
        else:
            flags.append(torch.isfinite(torch.as_tensor(v, dtype=torch.float64) if not torch.is_tensor(v) else v).all())
    return [bool(f) for f in flags]


def check_finite(where: str, **values: Any) -> None:
    """Raise a one-line UserError naming the first non-finite quantity (in argument order) and ``where``."""
    for name, ok in zip(values, _finite_flags(values.values())):
        if not ok:
            raise UserError(f"non-finite {name} at {where}: the run stops here and saves nothing from it (earlier "
                            "checkpoints are kept); lower the learning rate or check the reward model and temperature")
