"""run/finite.py: a NaN or an infinity in a loss, a statistic or a model's weights ends the run in one line."""

import pytest
import torch

from lm_human_preference_details.run.finite import check_finite
from lm_human_preference_details.utils.errors import UserError


def test_check_finite_names_the_first_bad_quantity():
    layer = torch.nn.Linear(2, 2)
    check_finite("update 3", scores=torch.ones(4), loss=[0.5, 1.0], gradients=layer)
    with pytest.raises(UserError, match=r"^non-finite kl at update 3: the run stops here"):
        check_finite("update 3", scores=torch.ones(4), kl=torch.tensor([1.0, float("nan")]), loss=[float("inf")])
    with pytest.raises(UserError, match="non-finite loss at"):
        check_finite("update 3", scores=torch.ones(4), loss=[0.5, float("inf")])
    with torch.no_grad():
        layer.weight[0, 0] = float("nan")
    with pytest.raises(UserError, match="non-finite gradients at update 3"):
        check_finite("update 3", loss=[0.5], gradients=layer)


def test_plain_numbers_and_a_module_without_weights_are_checked_too():
    check_finite("update 0", lr=1e-5, steps=3, activation=torch.nn.ReLU())  # no weights: nothing non-finite
    with pytest.raises(UserError) as e:
        check_finite("the end of reward model training", lr=1e-5, gain=float("-inf"))
    assert str(e.value).startswith("non-finite gain at the end of reward model training: the run stops here and saves "
                                   "nothing from it (earlier checkpoints are kept)") and "\n" not in str(e.value)
